// A read-only memory-mapped file. Model checkpoints are mapped, never read
// whole: touching a tensor faults in only that tensor's pages, which is what
// lets a 240 GB checkpoint be audited one layer at a time. The mapping is
// registered as immutable memory (core/immutable_memory.hpp) for its life,
// which is what lets a device node keep its weights resident.
#pragma once

#include "kvasir/core/immutable_memory.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace kvasir {

class MappedFile {
public:
    // Throws Error(bad_input) naming the path if it cannot be opened or mapped.
    explicit MappedFile(std::string path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;

    const std::string& path() const { return path_; }
    std::size_t size() const { return size_; }
    const std::byte* data() const { return data_; }
    std::span<const std::byte> bytes() const { return {data_, size_}; }

    // Bytes of [offset, offset+length) currently resident in the page cache
    // *for this mapping* (mincore), rounded out to whole pages. Used by tests
    // to prove that loading one layer does not touch the others.
    std::size_t resident_bytes(std::size_t offset, std::size_t length) const;
    // Ask the kernel to drop this mapping's pages (MADV_DONTNEED) and the
    // file's page cache (POSIX_FADV_DONTNEED) so residency starts from zero.
    void drop_pages() const;

private:
    std::string path_;
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    ImmutableRegistration registration_;  // reset before every munmap
};

}  // namespace kvasir
