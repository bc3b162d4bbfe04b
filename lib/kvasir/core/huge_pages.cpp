#include "kvasir/core/huge_pages.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace kvasir {
namespace {

constexpr std::size_t kSmallPage = 4096;
constexpr std::size_t kMinSlots = 16;  // a chunk wastes < 1/kMinSlots of itself

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// `bytes` (a multiple of 4 KiB) mapped at a 2 MiB-aligned address and advised
// MADV_HUGEPAGE. Maps 2 MiB more than asked and hands the unaligned head and
// the tail back, so nothing but the buffer stays mapped.
std::byte* map_aligned(std::size_t bytes) {
    const std::size_t len = bytes + kHugePage;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t start = round_up(raw, kHugePage);
    if (start > raw) ::munmap(p, start - raw);
    if (const std::size_t tail = raw + len - (start + bytes); tail > 0) ::munmap(reinterpret_cast<void*>(start + bytes), tail);
    // Advice only: a kernel without transparent huge pages says EINVAL and the
    // buffer stays on small pages.
    ::madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);
    return reinterpret_cast<std::byte*>(start);
}

class Pool {
public:
    std::shared_ptr<std::byte[]> take(std::size_t bytes) {
        if (bytes == 0) throw std::bad_alloc();
        const std::size_t size = round_up(bytes, kSmallPage);
        if (size >= kHugePage) {
            std::byte* p = map_aligned(size);
            count_own(size, true);
            return std::shared_ptr<std::byte[]>(p, [this, size](std::byte* q) {
                ::munmap(q, size);
                count_own(size, false);
            });
        }
        std::lock_guard lock(mutex_);
        std::vector<Chunk*>& chunks = classes_[size];
        auto it = std::find_if(chunks.begin(), chunks.end(), [](const Chunk* c) { return !c->free.empty(); });
        if (it == chunks.end()) {
            const std::size_t chunk_bytes = round_up(kMinSlots * size, kHugePage);
            auto* c = new Chunk{map_aligned(chunk_bytes), chunk_bytes, size, {}, 0};
            for (std::size_t i = chunk_bytes / size; i-- > 0;) c->free.push_back(static_cast<std::uint32_t>(i));
            chunks.push_back(c);
            usage_.mapped_bytes += chunk_bytes;
            ++usage_.slab_chunks;
            it = chunks.end() - 1;
        }
        Chunk* c = *it;
        const std::uint32_t slot = c->free.back();
        c->free.pop_back();
        ++c->used;
        return std::shared_ptr<std::byte[]>(c->base + slot * size, [this, c, slot](std::byte*) { give_back(c, slot); });
    }

    HugePageUsage usage() {
        std::lock_guard lock(mutex_);
        return usage_;
    }

private:
    struct Chunk {
        std::byte* base;
        std::size_t bytes, slot_bytes;
        std::vector<std::uint32_t> free;  // slots to hand out, the next one last
        std::size_t used;
    };

    void count_own(std::size_t bytes, bool mapped) {  // a buffer's own mapping, made or gone
        std::lock_guard lock(mutex_);
        if (mapped) usage_.mapped_bytes += bytes;
        else usage_.mapped_bytes -= bytes;
    }

    void give_back(Chunk* c, std::uint32_t slot) {
        std::lock_guard lock(mutex_);
        c->free.push_back(slot);
        if (--c->used > 0) return;
        std::vector<Chunk*>& chunks = classes_[c->slot_bytes];
        chunks.erase(std::find(chunks.begin(), chunks.end(), c));
        if (chunks.empty()) classes_.erase(c->slot_bytes);
        ::munmap(c->base, c->bytes);
        usage_.mapped_bytes -= c->bytes;
        --usage_.slab_chunks;
        delete c;
    }

    std::mutex mutex_;
    std::map<std::size_t, std::vector<Chunk*>> classes_;  // slot bytes → its chunks, oldest first
    HugePageUsage usage_;
};

// Never destroyed: buffers may outlive every static object (a backend held
// by a static cache).
Pool& pool() {
    static Pool* p = new Pool;
    return *p;
}

}  // namespace

std::shared_ptr<std::byte[]> huge_page_buffer(std::size_t bytes) { return pool().take(bytes); }

HugePageUsage huge_page_usage() { return pool().usage(); }

}  // namespace kvasir
