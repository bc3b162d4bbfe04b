// Memory for large, long-lived buffers that are streamed again and again —
// the cpu node's packed decode weights — on 2 MiB transparent huge pages
// where the kernel gives them.
//
// Why: a decode step reads every weight it uses once, from DRAM, and on 4 KiB
// pages each 4 KiB of that stream costs a TLB miss and a page walk. On this
// project's 2-vCPU Zen 4 VM a read of 512 MiB of packed weights runs at
// 18–20 GB/s on 4 KiB pages and 32–34 GB/s on huge pages (one thread; two:
// 30 vs 56–59 GB/s), and a whole decode step follows (BENCHMARKS.md, stop 55).
//
// How: a buffer of at least kHugePage bytes gets a mapping of its own whose
// start is 2 MiB-aligned, advised MADV_HUGEPAGE (its last partial 2 MiB, if
// any, stays on small pages: no byte is wasted). Smaller buffers are slots
// of a slab: one size class per size rounded up to 4 KiB, each chunk of the
// class a 2 MiB-aligned huge-page mapping of ≥ 16 slots (so a chunk wastes
// less than 1/16 of itself), a chunk returned to the system when its last
// slot is released. Where the kernel has no transparent huge pages
// (`never`), the same memory on small pages: only speed differs.
//
// Memory held beyond the live buffers: the free slots of partly used chunks
// (a freed slot is reused by the next buffer of its class first).
// Thread-safe. Every buffer is zero-filled (fresh pages) on first allocation
// of its slot, not when a slot is reused: callers write before they read.
#pragma once

#include <cstddef>
#include <memory>

namespace kvasir {

inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

// `bytes` (> 0) of memory, 64-byte aligned, on huge pages where possible;
// given back when the last owner lets go. Throws std::bad_alloc when the
// system has no memory left.
std::shared_ptr<std::byte[]> huge_page_buffer(std::size_t bytes);

// What the pool holds now (tests, --timings): bytes mapped for buffers (own
// mappings and slab chunks) and the slab chunks among them.
struct HugePageUsage {
    std::size_t mapped_bytes = 0;
    std::size_t slab_chunks = 0;
};
HugePageUsage huge_page_usage();

}  // namespace kvasir
