// core/huge_pages: buffers are distinct, aligned, writable memory; slots are
// reused and chunks given back; big buffers start on a 2 MiB boundary; and
// every buffer lies in memory the kernel was asked to back with huge pages
// (its VMA carries the `hg` flag in /proc/self/smaps, set by MADV_HUGEPAGE
// whatever the machine's transparent-huge-page mode).
#include "kvasir/core/huge_pages.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kvasir {
namespace {

std::uintptr_t address(const std::shared_ptr<std::byte[]>& p) { return reinterpret_cast<std::uintptr_t>(p.get()); }

// The VmFlags line of the mapping of /proc/self/smaps that holds `addr`.
std::string vm_flags_at(std::uintptr_t addr) {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
            inside = lo <= addr && addr < hi;
            continue;
        }
        if (inside && line.rfind("VmFlags:", 0) == 0) return line;
    }
    return {};
}

TEST(HugePages, BuffersAreDistinctAlignedAndWritable) {
    const HugePageUsage before = huge_page_usage();
    std::vector<std::shared_ptr<std::byte[]>> bufs;
    const std::size_t sizes[] = {1, 4096, 100000, 1 << 20, (1 << 20) + 1, kHugePage, 3 * kHugePage + 12345};
    for (std::size_t n : sizes) bufs.push_back(huge_page_buffer(n));
    for (std::size_t i = 0; i < bufs.size(); ++i) {
        EXPECT_EQ(address(bufs[i]) % 64, 0u) << sizes[i];
        std::memset(bufs[i].get(), static_cast<int>(i + 1), sizes[i]);
    }
    for (std::size_t i = 0; i < bufs.size(); ++i) {  // nothing overlapped: every byte kept its fill
        for (std::size_t j = 0; j < sizes[i]; j += 997) ASSERT_EQ(static_cast<int>(bufs[i][j]), static_cast<int>(i + 1));
        EXPECT_EQ(static_cast<int>(bufs[i][sizes[i] - 1]), static_cast<int>(i + 1));
    }
    EXPECT_GT(huge_page_usage().mapped_bytes, before.mapped_bytes);
    bufs.clear();
    EXPECT_EQ(huge_page_usage().mapped_bytes, before.mapped_bytes);  // every mapping given back
    EXPECT_EQ(huge_page_usage().slab_chunks, before.slab_chunks);
}

TEST(HugePages, BigBuffersStartOnAHugePageAndSmallOnesShareOne) {
    const auto big = huge_page_buffer(5 * kHugePage + 4096);
    EXPECT_EQ(address(big) % kHugePage, 0u);
    // 16 slots of 1 MiB: a 16 MiB chunk of huge pages, the slots side by side in it.
    const HugePageUsage before = huge_page_usage();
    std::vector<std::shared_ptr<std::byte[]>> slots;
    for (int i = 0; i < 16; ++i) slots.push_back(huge_page_buffer(1 << 20));
    EXPECT_EQ(huge_page_usage().slab_chunks, before.slab_chunks + 1);
    EXPECT_EQ(huge_page_usage().mapped_bytes, before.mapped_bytes + 16 * (std::size_t{1} << 20));
    std::uintptr_t lo = address(slots[0]);
    for (const auto& s : slots) lo = std::min(lo, address(s));
    EXPECT_EQ(lo % kHugePage, 0u);
    for (const auto& s : slots) EXPECT_EQ((address(s) - lo) % (1 << 20), 0u);
    // A released slot is the next one handed out; the 17th buffer needs a second chunk.
    const std::uintptr_t freed = address(slots[5]);
    slots[5].reset();
    slots[5] = huge_page_buffer(1000 * 1000);  // 977 KiB rounded to 4 KiB: a class (and chunk) of its own
    EXPECT_NE(address(slots[5]), freed);
    slots[5] = huge_page_buffer((1 << 20) - 100);  // rounds up to 1 MiB: the freed slot
    EXPECT_EQ(address(slots[5]), freed);
    slots.push_back(huge_page_buffer(1 << 20));
    EXPECT_EQ(huge_page_usage().slab_chunks, before.slab_chunks + 2);
    slots.pop_back();
    EXPECT_EQ(huge_page_usage().slab_chunks, before.slab_chunks + 1);  // the second chunk went back at once
}

TEST(HugePages, EveryBufferIsAdvisedForHugePages) {
    for (std::size_t n : {std::size_t{8192}, std::size_t{1} << 20, 4 * kHugePage}) {
        const auto b = huge_page_buffer(n);
        std::memset(b.get(), 1, n);
        const std::string flags = vm_flags_at(address(b));
        ASSERT_FALSE(flags.empty()) << "no mapping of /proc/self/smaps holds the buffer of " << n << " bytes";
        EXPECT_NE(flags.find(" hg"), std::string::npos) << n << " bytes: " << flags;
    }
}

}  // namespace
}  // namespace kvasir
