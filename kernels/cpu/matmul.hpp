// CPU matmul kernels: y[T, N] = x[T, K] · w[N, K]ᵀ with f32 accumulation.
//
// Both operands are K-contiguous (activations row-major, weights in the
// nn.Linear [out, in] layout).
//
// The fused kernels (fma_kernels_impl.hpp, compiled for AVX2 + FMA by
// matmul_avx2.cpp and for AArch64 AdvSIMD by matmul_neon.cpp): a packed,
// cache-blocked GEMM in the manner described by Goto & van de Geijn
// ("Anatomy of high-performance matrix multiplication") and the BLIS papers,
// plus an in-register-transpose GEMV for very few rows and a GEMV on weights
// packed for decoding. In every path and on every ISA each output element is summed in the
// same order: K is cut into blocks of kMatmulKBlock; each block is ONE
// sequential chain of fused multiply-adds in ascending k started from +0,
// and the block sums are added in ascending order:
//     for block b:  s_b = 0;  for k in b:  s_b = fma(x[t,k], w[n,k], s_b)
//     y[t,n] = ((s_0 + s_1) + s_2) + …
// (the rounding error grows with the block length, 64, more than with K).
// The result of an element depends neither on the thread count, nor on T
// or N (a token gives the same bits alone or inside a batch), nor on the
// path.
//
// Generic (matmul_generic.cpp): CPUs with neither (no AVX2/FMA on x86-64, or
// another architecture); products rounded before they are added, 8
// interleaved partial sums folded pairwise at the end.
#pragma once

#include "kvasir/core/cpu_isa.hpp"
#include "kvasir/core/dtype.hpp"

#include <cstdint>
#include <span>

namespace kvasir::kernels {

// The instruction set the kernels are dispatched on (core/cpu_isa.hpp).
using ::kvasir::CpuIsa;
using ::kvasir::cpu_isa;
using ::kvasir::cpu_isa_name;
bool cpu_has_avx2_fma() noexcept;  // avx2 or avx512
bool cpu_has_avx512() noexcept;    // avx512
// The fused kernels below run on this CPU (avx2, avx512 or neon); false: the
// generic kernels only.
bool cpu_has_fma_kernels() noexcept;

// Cores the rest of the machine leaves us: the machine's cores minus what
// other processes used over the last sampling window (≥ 100 ms; /proc/stat's
// busy time minus this process's own CPU time, so our spinning threads never
// count against us), at least 1. Sampled lazily by the callers of
// threads_for_work (a clock read per call, the files once a window); the
// machine's cores until the first window ends or where /proc is missing.
int free_cores() noexcept;
// The pure part: `cores` on the machine, `others` cores' worth of CPU time
// used by other processes in the window → the cores left (≥ 1).
int free_cores_of(int cores, double others) noexcept;

// The team for a parallel region of `flops` floating-point operations:
// waking a thread, handing it work and meeting it at the barrier costs a few
// microseconds, more when there are many threads or the machine is busy, so
// each thread must get enough work to pay for it — at least
// kFlopsPerThread (~10-20 µs of one core's work). Tiny matrices run on the
// calling thread alone. And no more threads than free_cores(): on a machine
// another process keeps busy, a thread that shares its core gets a time
// slice now and then, and the whole region waits at its barrier for the
// chunk that thread holds. Never changes a result: no kernel's arithmetic
// depends on its thread count.
// team_for is the pure arithmetic with the free cores given; threads_for_work
// asks free_cores() only when the work could use more than one thread.
constexpr double kFlopsPerThread = 1e6;
inline int team_for(int threads, double flops, int free) noexcept {
    if (threads <= 1 || !(flops >= 2 * kFlopsPerThread)) return 1;
    const double most = flops / kFlopsPerThread;
    const int team = most < threads ? static_cast<int>(most) : threads;
    return team < free ? team : (free > 1 ? free : 1);
}
inline int threads_for_work(int threads, double flops) noexcept {
    if (threads <= 1 || !(flops >= 2 * kFlopsPerThread)) return 1;  // tiny work: no clock read either
    return team_for(threads, flops, free_cores());
}

// K block of the AVX2 kernels' summation order (see above).
constexpr std::int64_t kMatmulKBlock = 64;
// The GEMM's packed panels: x in panels of kGemmMR rows, w in panels of
// kGemmNR columns, both k-major (fma_kernels_impl.hpp).
constexpr std::int64_t kGemmMR = 6, kGemmNR = 16;
// The GEMM's micro-tile on AVX-512 (matmul_avx512.cpp): rows 1 … kGemmMR of
// a packed x panel `a` against one packed w panel `b` over kc k — per K
// summation block one FMA chain per element from +0 — then
// c[m × 16] (row stride ldc) = add ? c + s : s, block sums in order. One zmm
// a row where the AVX2 tile takes two ymm: the same bits.
void matmul_tile_avx512(int m, std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add);

// How the weight matrix is stored in memory.
enum class WeightFormat : std::uint8_t { f32, f16, bf16 };
// Rounding applied to each weight, after it is read as f32 and before it is
// used (a storage=f16|bf16 node holding f32 weights). none: use as read.
enum class WeightRounding : std::uint8_t { none, f16, bf16 };

// The format a tensor of dtype `d` is read in; false for dtypes the kernels
// cannot read (f64, i32): convert those to f32 first.
inline bool kernel_readable(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }
inline WeightFormat weight_format_of(DType d) {
    return d == DType::f16 ? WeightFormat::f16 : d == DType::bf16 ? WeightFormat::bf16 : WeightFormat::f32;
}
// The rounding of a node whose storage format is `storage` (none for f32).
inline WeightRounding rounding_to(DType storage) {
    return storage == DType::f16 ? WeightRounding::f16 : storage == DType::bf16 ? WeightRounding::bf16 : WeightRounding::none;
}

// Rounding a format to itself is the identity (the kernels skip the work).
inline WeightRounding effective_rounding(WeightFormat format, WeightRounding rounding) {
    const bool same = (format == WeightFormat::f16 && rounding == WeightRounding::f16) ||
                      (format == WeightFormat::bf16 && rounding == WeightRounding::bf16);
    return same ? WeightRounding::none : rounding;
}

// ---------------------------------------------------------------------------
// The fused kernels, dispatched on cpu_isa() (only where cpu_has_fma_kernels()).
// ---------------------------------------------------------------------------

// The weights are converted (f16 exactly, bf16 by a 16-bit shift) and
// rounded with `rounding` while they are packed, never in a separate pass
// over the matrix. With io_rounding (a storage=f16|bf16 node) x is rounded
// while it is packed and every result when its job ends. The result equals
// "round x, convert/round w, matmul_f32_fma, round y" bit for bit.
void matmul_fma(const float* x, const void* w, WeightFormat format, WeightRounding rounding, float* y,
                std::int64_t t_count, std::int64_t n_count, std::int64_t k_count, int threads,
                WeightRounding io_rounding = WeightRounding::none);

// The GEMV (t_count ≤ 3) on weights packed once for decoding: groups of
// kGemvPackRows rows, k-major, converted and rounded as above —
//   packed[(g·K + k)·kGemvPackRows + i] = R(w[g·kGemvPackRows + i, k]), 0 past N
// — so that a decode step streams one contiguous run of memory instead of
// 8·G row streams through register transposes. Same arithmetic as
// matmul_fma's GEMV (each output's K blocks of 64 as FMA chains from +0,
// block sums added in order, x and y rounded with io_rounding): the same
// bits. The panels hold R(w) in the narrowest format that holds every value
// exactly (gemv_panel_format): a bf16 checkpoint's weights stay bf16 (on an
// f32 or bf16 node), f16 ones f16, and a storage=f16|bf16 node's rounded
// weights take 2 bytes; the GEMV widens them exactly, so the format changes
// the bytes streamed, never a bit. gemv_packed_bytes: the packed size.
constexpr std::int64_t kGemvPackRows = 32;
constexpr std::int64_t kGemvPackMaxRows = 3;
WeightFormat gemv_panel_format(WeightFormat format, WeightRounding rounding);
std::int64_t gemv_packed_bytes(std::int64_t n_count, std::int64_t k_count, WeightFormat panel);
constexpr std::int64_t gemv_panel_bytes(WeightFormat panel) { return panel == WeightFormat::f32 ? 4 : 2; }
// Writes gemv_packed_bytes(n, k, gemv_panel_format(format, rounding)) bytes,
// the row groups shared among `threads` (each group written by one thread,
// in write order: the packing is a first touch of fresh memory).
void pack_gemv(const void* w, WeightFormat format, WeightRounding rounding, std::int64_t n_count, std::int64_t k_count,
               void* packed, int threads = 1);
void gemv_packed(const float* x, const void* packed, WeightFormat panel, float* y, std::int64_t t_count,
                 std::int64_t n_count, std::int64_t k_count, int threads, WeightRounding io_rounding = WeightRounding::none);

// Several packed GEMVs in ONE parallel region (a decode step's MoE experts:
// every chosen expert's gate and up projections, then every down
// projection): the (job, row group) pairs are handed out together, so the
// threads meet once instead of once per matmul. Each job's y has the bits
// gemv_packed gives it alone (a group's arithmetic never depends on
// the thread or on the other jobs). x is read as given: a node that rounds
// its activations rounds each job's x first.
struct PackedGemvJob {
    const float* x = nullptr;      // [t_count, k_count]
    const void* packed = nullptr;  // pack_gemv of the [n_count, k_count] weight
    float* y = nullptr;            // [t_count, n_count]
    std::int64_t t_count = 0, n_count = 0, k_count = 0;  // t_count ≤ kGemvPackMaxRows
    WeightFormat panel = WeightFormat::f32;               // the panels' format (gemv_panel_format)
};
void gemv_packed_batch(std::span<const PackedGemvJob> jobs, int threads, WeightRounding io_rounding = WeightRounding::none);

// dst[i] = src[i] read as f32 and rounded as above; the element-wise
// counterpart of what matmul_fma does to its weights, used for the
// activations and results of storage=f16|bf16 nodes. dst may equal src when
// the format is f32.
void convert_rounded(const void* src, WeightFormat format, WeightRounding rounding, float* dst, std::int64_t n);

// One ISA's fused kernels (fma_kernels_impl.hpp): avx2::kFmaKernels in
// x86-64 builds, neon::kFmaKernels in AArch64 builds; the functions above
// call the one cpu_isa() picks.
struct FmaKernels {
    void (*matmul)(const float*, const void*, WeightFormat, WeightRounding, float*, std::int64_t, std::int64_t,
                   std::int64_t, int, WeightRounding);
    void (*pack_gemv)(const void*, WeightFormat, WeightRounding, std::int64_t, std::int64_t, void*, int);
    void (*gemv_packed)(const float*, const void*, WeightFormat, float*, std::int64_t, std::int64_t, std::int64_t, int,
                        WeightRounding);
    void (*gemv_packed_batch)(std::span<const PackedGemvJob>, int, WeightRounding);
    void (*convert)(const void*, WeightFormat, WeightRounding, float*, std::int64_t);
};
namespace avx2 {
extern const FmaKernels kFmaKernels;
}
namespace neon {
extern const FmaKernels kFmaKernels;
}

// The f32-operand matmuls below: y[T, N] = x[T, K] · w[N, K]ᵀ on `threads`.
using MatmulF32 = void(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                       std::int64_t k_count, int threads);

// matmul_fma on f32 operands, no rounding.
MatmulF32 matmul_f32_fma, matmul_f32_generic;

// f16 accumulation, emulated exactly: every product is exact in double
// (24+24 bits) and the running sum is rounded to half after every add, the
// way an F16-accumulating FMA unit behaves. matmul_f16acc is dispatched on
// cpu_isa(); the three versions give the same bits (f16acc_tile.hpp: lanes
// over outputs, the chain of each output unchanged).
MatmulF32 matmul_f16acc, matmul_f16acc_generic, matmul_f16acc_avx2, matmul_f16acc_avx512;

// The f64 oracle's matmul (cpu-ref): the textbook loop, bit for bit —
//     s = +0;  for k ascending:  s = s + x[t,k]·w[n,k];  y[t,n] = s
// with every product and every sum rounded to double, never fused. w is f64,
// f32, f16 or bf16 (widened exactly). The blocked versions
// (matmul_f64_impl.hpp, compiled for AVX2 and for NEON) pack w into panels
// of 8 columns per K block (converting while they pack, never a separate
// pass or a full-size f64 copy) and run 4×8 register tiles whose lanes are
// different outputs: blocking moves operands, never the order of a sum, so
// every version gives the same bits as the loop above for any thread count.
// wide_tiles: AVX-512's tiles of 8 rows × 8 columns (one zmm a row; only
// where cpu_has_avx512()), the same bits.
namespace avx2 {
void matmul_f64(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count, std::int64_t n_count,
                std::int64_t k_count, int threads, bool wide_tiles);
}
namespace neon {
void matmul_f64(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count, std::int64_t n_count,
                std::int64_t k_count, int threads, bool wide_tiles);
}
// The AVX-512 tile (matmul_f64_avx512.cpp): rows 1 … 8 of x (row
// stride ldx, offset to the K block) against one packed panel bp[kc][8];
// y (row stride ldy) = (first ? +0 : y) + the block's sum, `valid` columns.
void matmul_f64_tile_avx512(int rows, const double* x, std::int64_t ldx, const double* bp, std::int64_t kc, double* y,
                            std::int64_t ldy, std::int64_t valid, bool first);
// One group of the packed decode GEMV on AVX-512 (matmul_avx512.cpp): tt
// (1 … kGemvPackMaxRows) rows of x against the kGemvPackRows outputs of one
// packed group `pg` (panel format `panel`), y[t·n_count + n0 …] = its
// `valid` outputs. Two zmm a k where the AVX2 group takes four ymm: per
// output the same FMA chain per summation block and the block sums in
// order, so the same bits.
void gemv_packed_group_avx512(int tt, WeightFormat panel, const float* x, const void* pg, float* y, std::int64_t n0,
                              std::int64_t valid, std::int64_t n_count, std::int64_t k_count);
// The fused attention's P·V row on AVX-512 (attention_avx512.cpp): o[i] =
// R(Σ_{s<n} p[s]·V[s, i]) (V rows of `dim` floats, read through R) for the
// dims i < ⌊dim/16⌋·16, in 16-lane columns up to 128 dims a pass, the AVX2
// chunk's chain per output, so the same bits; returns the dims it did.
std::int64_t attention_pv_row_avx512(WeightRounding rounding, const float* p, std::int64_t n, const float* v, std::int64_t dim,
                                     float* o, bool prefetch);
// The blocked version of cpu_isa() (the loop itself where it is generic).
void matmul_f64(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count, std::int64_t n_count,
                std::int64_t k_count, int threads);
void matmul_f64_generic(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count,
                        std::int64_t n_count, std::int64_t k_count, int threads);

}  // namespace kvasir::kernels
