// The fused-f32 kernels (matmul, packed decode GEMV, conversion): y[T, N] =
// x[T, K] · w[N, K]ᵀ, f32 accumulation, written once in a small SIMD
// vocabulary of 8-lane f32 vectors (vf8, vfma, load8, load_transposed8, …:
// avx2_load.hpp says what each means) and compiled once per instruction set:
// matmul_avx2.cpp (AVX2 + FMA + F16C, with AVX-512's wider tile where the CPU
// has it) and matmul_neon.cpp (AArch64 AdvSIMD). Each includes its
// vocabulary, defines KVASIR_FMA_ISA as that vocabulary's namespace (avx2 or
// neon) and then this file, which defines ISA::kFmaKernels. The vocabularies
// are the same IEEE operations lane for lane, so every ISA gives the same bits.
//
// Arithmetic (the contract, see matmul.hpp): for every output element, each
// summation block of 64 k is one sequential FMA chain starting from +0, and
// the block sums are added in order. Vector lanes always run over *different
// outputs* (columns n), never over k, so no path reorders a sum; threads
// split the outputs, never K. A storage=f16|bf16 node's rounding of x and w
// happens while they are packed (or, for the GEMV, read), of y when a job
// ends: no separate pass over any operand.
//
// Two paths share that contract:
//
//  * GEMM (T > 3): packed and cache-blocked, after Goto & van de Geijn and
//    the BLIS papers (own code).
//      pack all of x, once, into row panels of MR = 6, per K block:
//          Ap[pc][panel][k][6]                           (shared by the team)
//      jobs = column chunks of NC (64 for T ≤ 48, 128 above; for few chunks
//             also row blocks), handed out dynamically; per job:
//        for pc over K, step KC = 256
//          pack w[chunk, pc:pc+KC] into column panels of NR = 16:
//            Bp[panel][k][16]  (k-major; converted/rounded here, transposed
//            from w's [N, K] rows with 8×8 register transposes)  (L2)
//          for ic over the job's rows, step MC = 72       (A block, L2)
//            for each B panel (16 KB, stays in L1)
//              for each A panel: micro-kernel 6×16 over KC
//    The micro-kernel holds a 6×16 tile of y in 12 ymm accumulators; per k it
//    loads two vectors of Bp, broadcasts six values of Ap and issues 12 FMAs
//    (2 FMA pipes → 6 cycles for 8 loads: never load bound). The chains
//    start at 0 for each summation block of 64 k; at its end the tile is
//    stored (first block) or added to y: the block sums of the contract.
//
//  * GEMV (T ≤ 3: decoding, the few tokens an expert gets): streaming w once
//    is the whole cost, so nothing is packed to memory: eight rows of w are
//    loaded 4 or 8 k at a time, transposed in registers (lanes = 8 outputs)
//    and fed to the same broadcast-FMA chains, one per row of x. Same
//    per-element order as GEMM, so a token gives the same bits alone as
//    inside a batch.
//
// Threads: jobs (GEMM) and 64-output chunks (GEMV) are handed out with
// schedule(dynamic): a thread that the OS preempts simply takes fewer. Every
// element is computed start to finish by one job with the arithmetic above,
// so neither the thread count nor the schedule shows in the result.
#ifndef KVASIR_FMA_ISA
#error "include the ISA's vocabulary (avx2_load.hpp, neon_load.hpp) first: it defines KVASIR_FMA_ISA"
#endif

#include "kernels/cpu/matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvasir::kernels::KVASIR_FMA_ISA {
namespace {

// Defined below; the GEMM and the GEMV round with it.
void convert(const void* src, WeightFormat format, WeightRounding rounding, float* dst, std::int64_t n);

constexpr int kMR = kGemmMR;    // rows of the micro-tile (broadcast operand, x)
constexpr int kNR = kGemmNR;    // columns of the micro-tile (two ymm, operand w)
constexpr i64 kKC = 256;        // K block: a 16×KC B panel is 16 KB (half of L1d)
constexpr i64 kSumBlock = kMatmulKBlock;  // summation block (divides KC, multiple of 16)
static_assert(kKC % kSumBlock == 0 && kSumBlock % 16 == 0);
constexpr i64 kMC = 72;         // rows per A block: 72×256×4 = 72 KB in L2
constexpr i64 kNcSmallT = 64;   // columns per job, T ≤ 48 (B block 64 KB)
constexpr i64 kNcLargeT = 128;  // columns per job, T > 48 (B block 128 KB)
constexpr i64 kGemvChunk = 64;  // outputs per GEMV job
constexpr i64 kGemvMaxRows = 3;  // T up to this: GEMV path, no packing
static_assert(kGemvMaxRows == kGemvPackMaxRows);
constexpr i64 kGemvPrefetch = 6;  // software prefetch distance of the f32 GEMV, in 64-byte lines (6–12 best)

// ---------------------------------------------------------------------------
// GEMV path (T ≤ kGemvMaxRows rows of x): 8 rows of w per chain group,
// transposed in registers so that lane i follows output n+i through its
// k-ordered chain; each of the TT rows of x has its own chain.
// ---------------------------------------------------------------------------

template <int TT>
struct Chains {
    vf8 v[TT];
};

// acc[t] = fma(x[t, k+j], r[j], acc[t]) for j = 0 … J-1 in that order (the
// contract's ascending k), r[j] = the 8 rows' weights at k+j.
template <int J, int TT>
[[gnu::always_inline]] inline Chains<TT> fma_columns(const float* x, i64 k_count, i64 k, const vf8* r, Chains<TT> acc) {
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t)
            acc.v[t] = vfma(vbroadcast(x + t * k_count + k + j), r[j], acc.v[t]);
    return acc;
}

// k … k+7 of rows [row, row + 8) of w into the TT chains.
template <WeightFormat F, WeightRounding R, int TT>
[[gnu::always_inline]] inline Chains<TT> gemv_step8(const float* x, const void* w, i64 row, i64 k_count, i64 k, Chains<TT> acc) {
    vf8 r[8];
    load_transposed8<F, R>(w, row, k_count, k, r);  // r[j] = w[row … row+7, k+j]
    return fma_columns<8, TT>(x, k_count, k, r, acc);
}

// The smallest step: 4 k for f32 weights (4 FMAs per chain), 8 otherwise.
template <WeightFormat F>
constexpr i64 kGemvSub = F == WeightFormat::f32 ? 4 : 8;

template <WeightFormat F, WeightRounding R, int TT>
[[gnu::always_inline]] inline Chains<TT> gemv_sub(const float* x, const void* w, i64 row, i64 k_count, i64 k,
                                                  Chains<TT> acc) {
    if constexpr (F == WeightFormat::f32) {
        vf8 r[4];
        load_transposed4_f32<R>(static_cast<const float*>(w), row, k_count, k, r);
        return fma_columns<4, TT>(x, k_count, k, r, acc);
    } else {
        return gemv_step8<F, R, TT>(x, w, row, k_count, k, acc);
    }
}

// 16 k: one whole 64-byte line of each f32 row, its two halves back to back.
template <WeightFormat F, WeightRounding R, int TT>
[[gnu::always_inline]] inline Chains<TT> gemv_step16(const float* x, const void* w, i64 row, i64 k_count, i64 k, Chains<TT> acc) {
    return gemv_step8<F, R, TT>(x, w, row, k_count, k + 8, gemv_step8<F, R, TT>(x, w, row, k_count, k, acc));
}

// k from `k` to the end (fewer than 16), one k at a time for the last < 8.
template <WeightFormat F, WeightRounding R, int TT>
[[gnu::always_inline]] inline Chains<TT> gemv_finish(const float* x, const void* w, i64 row, i64 k_count, i64 k, Chains<TT> acc) {
    if (k + 8 <= k_count) {
        acc = gemv_step8<F, R, TT>(x, w, row, k_count, k, acc);
        k += 8;
    }
    for (; k < k_count; ++k) {
        alignas(32) float col[8];
        for (int i = 0; i < 8; ++i) col[i] = load1<F, R>(w, (row + i) * k_count + k);
        const vf8 c = vload(col);
        for (int t = 0; t < TT; ++t) acc.v[t] = vfma(vbroadcast(x + t * k_count + k), c, acc.v[t]);
    }
    return acc;
}

// End of a K block: y = (first ? 0 : y) + chain, and the chain restarts at 0.
template <int TT>
[[gnu::always_inline]] inline void flush_chains(float* y, i64 n_count, Chains<TT>& acc, bool first) {
    for (int t = 0; t < TT; ++t) {
        float* p = y + t * n_count;
        vstore(p, first ? acc.v[t] : vadd(vload(p), acc.v[t]));
        acc.v[t] = vzero();
    }
}

// The f32 GEMV streams w from DRAM (decode): each of the 8·G rows of the
// block in flight asks for its line kGemvPrefetch 16-k steps ahead — past a
// row's end, the first lines of the next block's rows, so short rows (an
// expert's down projection, K = 256: 16 lines) do not start cold. Hardware
// prefetchers alone follow 16 interleaved row streams badly: one thread's
// decode of the 1 GB bench GGUF went from ~39 to ~62 tok/s on a 2-vCPU Zen 4
// (BENCHMARKS.md, "Whole model"). No effect on the bits.
template <int G, i64 lag>
[[gnu::always_inline]] inline void gemv_prefetch(const void* w, i64 n, i64 s, i64 steps, i64 n_count, i64 k_count) {
    if constexpr (kGemvPrefetch > 0) {
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g) {
            i64 sp = s - g * lag + kGemvPrefetch, row = n + 8 * g;
            if (sp >= steps) {
                sp -= steps;
                row += 8 * G;
            }
            if (sp >= 0 && sp < steps && row + 8 <= n_count)
#pragma GCC unroll 8
                for (int i = 0; i < 8; ++i)
                    __builtin_prefetch(static_cast<const char*>(w) + 4 * ((row + i) * k_count + 16 * sp), 0, 3);
        }
    }
}

// Outputs [n0, n1) of the TT rows.
template <WeightFormat F, WeightRounding R, int TT>
void gemv_rows(const float* x, const void* w, float* y, i64 n0, i64 n1, i64 n_count, i64 k_count) {
    // Each FMA chain issues only once per FMA latency (4 cycles), so two
    // groups of 8 rows (2·TT chains) run side by side. (Four groups are a
    // little faster when w sits in L3, but slower when it streams from DRAM,
    // the MoE case: 32 row streams are too many for the prefetchers.) Their
    // rows are K floats apart; when K·4 is a multiple of 4 KB, rows at the
    // same k share an L1 set, so group g runs g·lag 16-k steps behind.
    constexpr int G = 2;
    constexpr i64 lag = 4;
    constexpr i64 block_steps = kSumBlock / 16;  // a summation block in steps of 16 k
    const i64 steps = k_count / 16;
    // A block ends before the step that starts at a multiple of KC: flush.
    const auto boundary = [&](float* yg, Chains<TT>& acc, i64 step) {
        if (step > 0 && step % block_steps == 0) flush_chains(yg, n_count, acc, step == block_steps);
    };
    // The last k (fewer than 16) lie in the last block; then the last flush.
    const auto finish = [&](float* yg, i64 row, Chains<TT>& acc) {
        if (16 * steps < k_count) boundary(yg, acc, steps);
        acc = gemv_finish<F, R, TT>(x, w, row, k_count, 16 * steps, acc);
        flush_chains(yg, n_count, acc, k_count <= kSumBlock);
    };
    i64 n = n0;
    for (; n + 8 * G <= n1; n += 8 * G) {
        Chains<TT> a[G] = {};
        for (i64 s = 0; s < steps + (G - 1) * lag; ++s) {
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                const i64 sg = s - g * lag;
                if (sg >= 0 && sg < steps) boundary(y + n + 8 * g, a[g], sg);
            }
            if constexpr (F == WeightFormat::f32) gemv_prefetch<G, lag>(w, n, s, steps, n_count, k_count);
            if constexpr (TT == 1) {
                // One chain per group: interleave the groups every 4 (f32) or
                // 8 k, so that both chains are in the out-of-order window.
#pragma GCC unroll 4
                for (i64 q = 0; q < 16; q += kGemvSub<F>)
#pragma GCC unroll 4
                    for (int g = 0; g < G; ++g) {
                        const i64 sg = s - g * lag;
                        if (sg >= 0 && sg < steps) a[g] = gemv_sub<F, R, TT>(x, w, n + 8 * g, k_count, 16 * sg + q, a[g]);
                    }
            } else {
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g) {
                    const i64 sg = s - g * lag;
                    if (sg >= 0 && sg < steps) a[g] = gemv_step16<F, R, TT>(x, w, n + 8 * g, k_count, 16 * sg, a[g]);
                }
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) finish(y + n + 8 * g, n + 8 * g, a[g]);
    }
    for (; n + 8 <= n1; n += 8) {
        Chains<TT> a{};
        for (i64 s = 0; s < steps; ++s) {
            boundary(y + n, a, s);
            a = gemv_step16<F, R, TT>(x, w, n, k_count, 16 * s, a);
        }
        finish(y + n, n, a);
    }
    for (; n < n1; ++n)
        for (int t = 0; t < TT; ++t) {
            float total = 0.0f, s = 0.0f;
            for (i64 k = 0; k < k_count; ++k) {
                if (k > 0 && k % kSumBlock == 0) {
                    total = k == kSumBlock ? s : total + s;
                    s = 0.0f;
                }
                s = fma1(x[t * k_count + k], load1<F, R>(w, n * k_count + k), s);
            }
            y[t * n_count + n] = k_count <= kSumBlock ? s : total + s;
        }
}

// ---------------------------------------------------------------------------
// GEMM path.
// ---------------------------------------------------------------------------

// Pack rows [n, n + valid) of w, columns [k0, k0 + kc), into one NR panel:
// dst[k·16 + i] = w[n + i, k0 + k], zero for i ≥ valid (those columns of the
// micro-tile are computed and thrown away).
template <WeightFormat F, WeightRounding R>
void pack_b_panel(const void* w, i64 k_count, i64 n, i64 valid, i64 k0, i64 kc, float* dst) {
    for (int h = 0; h < 2; ++h) {
        const i64 rows = n + 8 * h;
        const i64 v = std::clamp<i64>(valid - 8 * h, 0, 8);
        float* d = dst + 8 * h;
        i64 k = 0;
        if (v == 8) {
            for (; k + 8 <= kc; k += 8) {
                vf8 r[8];
                load_transposed8<F, R>(w, rows, k_count, k0 + k, r);
                for (int j = 0; j < 8; ++j) vstore(d + (k + j) * kNR, r[j]);
            }
        }
        for (; k < kc; ++k)
            for (int i = 0; i < 8; ++i) d[k * kNR + i] = i < v ? load1<F, R>(w, (rows + i) * k_count + k0 + k) : 0.0f;
    }
}

// Pack rows [t, t + valid) of x, columns [k0, k0 + kc), into one MR panel:
// dst[k·6 + i] = x[t + i, k0 + k] (rounded as RX), zero for i ≥ valid. Exactly kc·6 floats
// are written (panels of different threads are adjacent).
template <WeightRounding RX>
void pack_a_panel(const float* x, i64 k_count, i64 t, i64 valid, i64 k0, i64 kc, float* dst) {
    i64 k = 0;
    if (valid == kMR) {
        for (; k + 8 <= kc; k += 8) {
            vf8 r[8];
#pragma GCC unroll 6
            for (int i = 0; i < kMR; ++i) r[i] = load8<WeightFormat::f32, RX>(x, (t + i) * k_count + k0 + k);
            r[6] = r[7] = vzero();
            transpose8(r);  // lanes 0-5 of r[j]: x[t … t+5, k0+k+j]
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) store6(dst + (k + j) * kMR, r[j]);
        }
    }
    for (; k < kc; ++k)
        for (int i = 0; i < kMR; ++i)
            dst[k * kMR + i] = i < valid ? load1<WeightFormat::f32, RX>(x, (t + i) * k_count + k0 + k) : 0.0f;
}

void pack_a_panel(WeightRounding rx, const float* x, i64 k_count, i64 t, i64 valid, i64 k0, i64 kc, float* dst) {
    switch (rx) {
        case WeightRounding::none: pack_a_panel<WeightRounding::none>(x, k_count, t, valid, k0, kc, dst); break;
        case WeightRounding::f16: pack_a_panel<WeightRounding::f16>(x, k_count, t, valid, k0, kc, dst); break;
        case WeightRounding::bf16: pack_a_panel<WeightRounding::bf16>(x, k_count, t, valid, k0, kc, dst); break;
    }
}

// The micro-kernel: the chain s = Ap·Bp over this K block (one FMA per
// element per k, in k order, from +0), then c[M×16] (row stride ldc) =
// add ? c + s : s. The accumulators are named
// variables, not an array: GCC keeps those in registers (an array of vectors
// indexed in loops ends up spilled to the stack on every iteration).
template <int M>
void micro_block(i64 kc, const float* a, const float* b, float* c, i64 ldc, bool add) {
    vf8 c00 = vzero(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    vf8 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define KVASIR_ROW_FMA(i)                                   \
    if constexpr (M > i) {                                  \
        const vf8 av = vbroadcast(a + (i));                 \
        c##i##0 = vfma(av, b0, c##i##0);                    \
        c##i##1 = vfma(av, b1, c##i##1);                    \
    }
#pragma GCC unroll 4
    for (i64 k = 0; k < kc; ++k) {
        const vf8 b0 = vload(b), b1 = vload(b + 8);
        KVASIR_ROW_FMA(0) KVASIR_ROW_FMA(1) KVASIR_ROW_FMA(2) KVASIR_ROW_FMA(3) KVASIR_ROW_FMA(4) KVASIR_ROW_FMA(5)
        a += kMR;
        b += kNR;
    }
#undef KVASIR_ROW_FMA
#define KVASIR_ROW_ADD(i)                                                          \
    if constexpr (M > i) {                                                         \
        c##i##0 = vadd(vload(c + (i) * ldc), c##i##0);                             \
        c##i##1 = vadd(vload(c + (i) * ldc + 8), c##i##1);                         \
    }
    if (add) {
        KVASIR_ROW_ADD(0) KVASIR_ROW_ADD(1) KVASIR_ROW_ADD(2) KVASIR_ROW_ADD(3) KVASIR_ROW_ADD(4) KVASIR_ROW_ADD(5)
    }
#undef KVASIR_ROW_ADD
#define KVASIR_ROW_STORE(i)                                 \
    if constexpr (M > i) {                                  \
        vstore(c + (i) * ldc, c##i##0);                     \
        vstore(c + (i) * ldc + 8, c##i##1);                 \
    }
    KVASIR_ROW_STORE(0) KVASIR_ROW_STORE(1) KVASIR_ROW_STORE(2) KVASIR_ROW_STORE(3) KVASIR_ROW_STORE(4) KVASIR_ROW_STORE(5)
#undef KVASIR_ROW_STORE
}

// The micro-kernel over a whole KC block: one summation block at a time.
template <int M>
void micro_kernel(i64 kc, const float* a, const float* b, float* c, i64 ldc, bool add) {
    for (i64 k = 0; k < kc; k += kSumBlock) {
        micro_block<M>(std::min(kSumBlock, kc - k), a + k * kMR, b + k * kNR, c, ldc, add || k > 0);
    }
}

using MicroKernel = void (*)(i64, const float*, const float*, float*, i64, bool);
constexpr MicroKernel kMicro[kMR + 1] = {nullptr,         micro_kernel<1>, micro_kernel<2>, micro_kernel<3>,
                                         micro_kernel<4>, micro_kernel<5>, micro_kernel<6>};

// The tile on this CPU: a wider ISA's tile where it has one (the same bits:
// AVX-512's matmul_tile_avx512), else this one.
void tile(int m, i64 kc, const float* a, const float* b, float* c, i64 ldc, bool add) {
    if (!wide_tile(m, kc, a, b, c, ldc, add)) kMicro[m](kc, a, b, c, ldc, add);
}

// Round y[0 … n) in place (the result of a storage=f16|bf16 node).
void round_run(WeightRounding r, float* y, i64 n) {
    if (r != WeightRounding::none) convert(y, WeightFormat::f32, r, y, n);
}

// Packing buffers, kept between calls. A thread_local buffer of the calling
// thread holds the packed x, which the whole team reads; each team thread
// packs its blocks of w into its own thread_local buffer (OpenMP reuses its
// threads, so these are allocated once).
class Buffer {
public:
    float* get(i64 floats) {
        if (size_ < floats) {
            const auto bytes = static_cast<std::size_t>((floats * 4 + 63) / 64 * 64);
            data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
            if (!data_) throw std::bad_alloc();
            size_ = floats;
        }
        return data_.get();
    }

private:
    struct Free {
        void operator()(float* p) const { std::free(p); }
    };
    std::unique_ptr<float, Free> data_;
    i64 size_ = 0;
};

Buffer& a_buffer() {
    thread_local Buffer b;
    return b;
}
Buffer& b_buffer() {
    thread_local Buffer b;
    return b;
}

// The packed x: for each K block pc (of width kc = min(KC, K - pc)), all row
// panels of T, each panel kc·6 floats: panel r of block pc at
// (pc·row_panels + r·kc)·6 — i.e. blocks are KC·6·row_panels floats apart.
struct PackedA {
    const float* data;
    i64 row_panels;
    const float* panel(i64 pc, i64 kc, i64 r) const { return data + (pc * row_panels + r * kc) * kMR; }
};

// One job of the GEMM: rows [t0, t1) × columns [n0, n1) of y, all of K.
template <WeightFormat F, WeightRounding R>
void gemm_job(const PackedA& a, const void* w, float* y, WeightRounding ry, i64 n_count, i64 k_count, i64 t0, i64 t1,
              i64 n0, i64 n1) {
    const i64 nc = n1 - n0;
    const i64 panels = (nc + kNR - 1) / kNR;
    float* bp = b_buffer().get(kKC * panels * kNR);
    alignas(32) float edge[kMR * kNR];
    for (i64 pc = 0; pc < k_count; pc += kKC) {
        const i64 kc = std::min(kKC, k_count - pc);
        const bool add = pc > 0;
        for (i64 p = 0; p < panels; ++p)
            pack_b_panel<F, R>(w, k_count, n0 + p * kNR, std::min<i64>(kNR, nc - p * kNR), pc, kc, bp + p * kc * kNR);
        for (i64 ic = t0; ic < t1; ic += kMC) {
            const i64 mc = std::min(kMC, t1 - ic);
            const i64 r0 = ic / kMR, r1 = (ic + mc + kMR - 1) / kMR;
            for (i64 p = 0; p < panels; ++p) {
                const i64 cols = std::min<i64>(kNR, nc - p * kNR);
                const float* bpp = bp + p * kc * kNR;
                for (i64 r = r0; r < r1; ++r) {
                    const int m = static_cast<int>(std::min<i64>(kMR, t1 - r * kMR));
                    const float* app = a.panel(pc, kc, r);
                    float* c = y + r * kMR * n_count + n0 + p * kNR;
                    if (cols == kNR) {
                        tile(m, kc, app, bpp, c, n_count, add);
                    } else {
                        // Partial panel: run the full tile on a scratch copy.
                        if (add)
                            for (int i = 0; i < m; ++i) std::memcpy(edge + i * kNR, c + i * n_count, sizeof(float) * cols);
                        tile(m, kc, app, bpp, edge, kNR, add);
                        for (int i = 0; i < m; ++i) std::memcpy(c + i * n_count, edge + i * kNR, sizeof(float) * cols);
                    }
                }
            }
        }
    }
    for (i64 t = t0; t < t1; ++t) round_run(ry, y + t * n_count + n0, n1 - n0);
}

template <WeightFormat F, WeightRounding R>
void gemm(const float* x, WeightRounding rx, const void* w, float* y, i64 t_count, i64 n_count, i64 k_count, int threads) {
    const i64 row_panels = (t_count + kMR - 1) / kMR;
    const i64 k_blocks = (k_count + kKC - 1) / kKC;
    const PackedA a{a_buffer().get(k_blocks * kKC * row_panels * kMR), row_panels};
    // Jobs: column chunks of nc (whole panels), and for few chunks row blocks
    // too. They are handed out dynamically: a thread the OS preempts does
    // fewer of them, and since every element is computed by one job with the
    // same arithmetic, who does which job never shows in the result.
    const i64 nc = t_count <= 48 ? kNcSmallT : kNcLargeT;
    const i64 col_jobs = (n_count + nc - 1) / nc;
    // Row blocks repack the same B block once each, so only when the column
    // chunks alone cannot keep every thread busy.
    i64 row_jobs = 1;
    if (threads > 1 && col_jobs < threads)
        row_jobs = std::min((row_panels * kMR + kMC - 1) / kMC, (threads + col_jobs - 1) / col_jobs);
    const i64 rows_per_job = (row_panels + row_jobs - 1) / row_jobs * kMR;
    row_jobs = (t_count + rows_per_job - 1) / rows_per_job;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        // 1. pack x, once for all jobs (static split of the panels).
#pragma omp for schedule(static)
        for (i64 job = 0; job < k_blocks * row_panels; ++job) {
            const i64 pc = job / row_panels * kKC, r = job % row_panels;
            const i64 kc = std::min(kKC, k_count - pc);
            pack_a_panel(rx, x, k_count, r * kMR, std::min<i64>(kMR, t_count - r * kMR), pc, kc,
                         const_cast<float*>(a.panel(pc, kc, r)));
        }
        // (implicit barrier: every panel of x is packed)
        // 2. the jobs.
#pragma omp for schedule(dynamic, 1)
        for (i64 job = 0; job < col_jobs * row_jobs; ++job) {
            const i64 cj = job % col_jobs, rj = job / col_jobs;
            const i64 n0 = cj * nc, n1 = std::min(n_count, n0 + nc);
            const i64 t0 = rj * rows_per_job, t1 = std::min(t_count, t0 + rows_per_job);
            gemm_job<F, R>(a, w, y, rx, n_count, k_count, t0, t1, n0, n1);
        }
    }
}

// Threads only where the work pays for them (the result is the same).
int threads_for(int threads, i64 t_count, i64 n_count, i64 k_count) {
    return threads_for_work(threads, 2.0 * static_cast<double>(t_count) * static_cast<double>(n_count) * static_cast<double>(k_count));
}

// The GEMV reads x in place: a node that rounds its activations rounds x's ≤ 3 rows into a copy.
const float* gemv_x(const float* x, WeightRounding rx, i64 t_count, i64 k_count) {
    if (rx == WeightRounding::none) return x;
    float* xr = a_buffer().get(t_count * k_count);
    convert(x, WeightFormat::f32, rx, xr, t_count * k_count);
    return xr;
}

template <WeightFormat F, WeightRounding R>
void run(const float* x, WeightRounding rx, const void* w, float* y, i64 t_count, i64 n_count, i64 k_count, int threads) {
    threads = threads_for(threads, t_count, n_count, k_count);
    if (t_count <= kGemvMaxRows) {
        x = gemv_x(x, rx, t_count, k_count);
        // GEMV: chunks of 64 outputs, handed out dynamically.
        const i64 chunks = (n_count + kGemvChunk - 1) / kGemvChunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
        for (i64 c = 0; c < chunks; ++c) {
            const i64 n0 = c * kGemvChunk, n1 = std::min(n_count, n0 + kGemvChunk);
            switch (t_count) {
                case 1: gemv_rows<F, R, 1>(x, w, y, n0, n1, n_count, k_count); break;
                case 2: gemv_rows<F, R, 2>(x, w, y, n0, n1, n_count, k_count); break;
                default: gemv_rows<F, R, 3>(x, w, y, n0, n1, n_count, k_count); break;
            }
            for (i64 t = 0; t < t_count; ++t) round_run(rx, y + t * n_count + n0, n1 - n0);
        }
        return;
    }
    gemm<F, R>(x, rx, w, y, t_count, n_count, k_count, threads);
}

template <WeightFormat F>
void run_rounded(WeightRounding r, const float* x, WeightRounding rx, const void* w, float* y, i64 t, i64 n, i64 k,
                 int threads) {
    switch (r) {
        case WeightRounding::none: run<F, WeightRounding::none>(x, rx, w, y, t, n, k, threads); break;
        case WeightRounding::f16: run<F, WeightRounding::f16>(x, rx, w, y, t, n, k, threads); break;
        case WeightRounding::bf16: run<F, WeightRounding::bf16>(x, rx, w, y, t, n, k, threads); break;
    }
}

void matmul(const float* x, const void* w, WeightFormat format, WeightRounding rounding, float* y,
            std::int64_t t_count, std::int64_t n_count, std::int64_t k_count, int threads, WeightRounding io_rounding) {
    if (t_count <= 0 || n_count <= 0) return;
    if (k_count <= 0) {
        std::fill(y, y + t_count * n_count, 0.0f);
        return;
    }
    rounding = effective_rounding(format, rounding);
    switch (format) {
        case WeightFormat::f32: run_rounded<WeightFormat::f32>(rounding, x, io_rounding, w, y, t_count, n_count, k_count, threads); break;
        case WeightFormat::f16: run_rounded<WeightFormat::f16>(rounding, x, io_rounding, w, y, t_count, n_count, k_count, threads); break;
        case WeightFormat::bf16: run_rounded<WeightFormat::bf16>(rounding, x, io_rounding, w, y, t_count, n_count, k_count, threads); break;
    }
}

constexpr i64 kPV = kGemvPackRows / 8;  // vectors per packed row group


// One group of the packed GEMV: TT rows of x against kGemvPackRows outputs,
// the group's panels `pg` in format P.
template <int TT, WeightFormat P>
void gemv_packed_group(const float* x, const void* pg, float* y, i64 n0, i64 valid, i64 n_count, i64 k_count) {
    vf8 acc[TT][kPV];
    alignas(32) float tile[TT][kGemvPackRows];  // the group's running y (block sums added in order)
    const auto flush = [&](bool first) {
        for (int t = 0; t < TT; ++t)
            for (int v = 0; v < kPV; ++v) {
                float* p = tile[t] + 8 * v;
                vstore(p, first ? acc[t][v] : vadd(vload(p), acc[t][v]));
                acc[t][v] = vzero();
            }
    };
    for (int t = 0; t < TT; ++t)
        for (int v = 0; v < kPV; ++v) acc[t][v] = vzero();
    const char* base = static_cast<const char*>(pg);
    for (i64 k = 0; k < k_count; ++k) {
        if (k > 0 && k % kSumBlock == 0) flush(k == kSumBlock);
        const char* wk = base + k * kGemvPackRows * gemv_panel_bytes(P);
        // 32 k-steps ahead: 4 KB of f32 panels (8–64 swept: 32 best, BENCHMARKS.md), 2 KB of 2-byte ones.
        __builtin_prefetch(wk + 32 * kGemvPackRows * gemv_panel_bytes(P), 0, 3);
        vf8 wv[kPV];
#pragma GCC unroll 4
        for (int v = 0; v < kPV; ++v) wv[v] = load8<P, WeightRounding::none>(wk, 8 * v);  // widened exactly
#pragma GCC unroll 4
        for (int t = 0; t < TT; ++t) {
            const vf8 xb = vbroadcast(x + t * k_count + k);
#pragma GCC unroll 4
            for (int v = 0; v < kPV; ++v) acc[t][v] = vfma(xb, wv[v], acc[t][v]);
        }
    }
    flush(k_count <= kSumBlock);
    for (int t = 0; t < TT; ++t) std::memcpy(y + t * n_count + n0, tile[t], static_cast<std::size_t>(valid) * sizeof(float));
}

void pack_gemv(const void* w, WeightFormat format, WeightRounding rounding, std::int64_t n_count, std::int64_t k_count,
               void* packed, int threads) {
    const WeightFormat panel = gemv_panel_format(format, rounding);
    rounding = effective_rounding(format, rounding);
    const auto run_one = [&](auto f, auto r) {
        constexpr WeightFormat F = decltype(f)::value;
        constexpr WeightRounding R = decltype(r)::value;
        const auto with_panel = [&](auto pf) {
            constexpr WeightFormat P = decltype(pf)::value;
            char* out = static_cast<char*>(packed);
            const auto at = [&](i64 g, i64 k, i64 i) { return out + ((g * k_count + k) * kGemvPackRows + i) * gemv_panel_bytes(P); };
            const i64 groups = (n_count + kGemvPackRows - 1) / kGemvPackRows;
            const int team = n_count * k_count < (i64{1} << 16) ? 1 : std::max(threads, 1);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
            for (i64 g = 0; g < groups; ++g)
                for (i64 r8 = 0; r8 < kGemvPackRows; r8 += 8) {
                    const i64 row = g * kGemvPackRows + r8;
                    i64 k = 0;
                    if (row + 8 <= n_count)
                        for (; k + 8 <= k_count; k += 8) {
                            vf8 c[8];
                            load_transposed8<F, R>(w, row, k_count, k, c);  // c[j] = w[row … row+7, k+j]
                            for (int j = 0; j < 8; ++j) store_panel8<P>(at(g, k + j, r8), c[j]);
                        }
                    for (; k < k_count; ++k)
                        for (i64 i = 0; i < 8; ++i)
                            store_panel1<P>(at(g, k, r8 + i), row + i < n_count ? load1<F, R>(w, (row + i) * k_count + k) : 0.0f);
                }
        };
        switch (panel) {
            case WeightFormat::f32: with_panel(std::integral_constant<WeightFormat, WeightFormat::f32>{}); break;
            case WeightFormat::f16: with_panel(std::integral_constant<WeightFormat, WeightFormat::f16>{}); break;
            case WeightFormat::bf16: with_panel(std::integral_constant<WeightFormat, WeightFormat::bf16>{}); break;
        }
    };
    using FC = std::integral_constant<WeightFormat, WeightFormat::f32>;
    using FH = std::integral_constant<WeightFormat, WeightFormat::f16>;
    using FB = std::integral_constant<WeightFormat, WeightFormat::bf16>;
    using RN = std::integral_constant<WeightRounding, WeightRounding::none>;
    using RH = std::integral_constant<WeightRounding, WeightRounding::f16>;
    using RB = std::integral_constant<WeightRounding, WeightRounding::bf16>;
    const auto with_r = [&](auto f) {
        switch (rounding) {
            case WeightRounding::none: run_one(f, RN{}); break;
            case WeightRounding::f16: run_one(f, RH{}); break;
            case WeightRounding::bf16: run_one(f, RB{}); break;
        }
    };
    switch (format) {
        case WeightFormat::f32: with_r(FC{}); break;
        case WeightFormat::f16: with_r(FH{}); break;
        case WeightFormat::bf16: with_r(FB{}); break;
    }
}

void gemv_packed_batch(std::span<const PackedGemvJob> jobs, int threads, WeightRounding io_rounding) {
    // Every (job, group) pair, in job order; the weight bytes streamed decide
    // whether waking threads pays. A GEMV is bound by its read of the weights,
    // not by its multiply-adds: streaming one byte takes about as long as two
    // of the GEMM's flops (~30 GB/s against ~60 GFLOP/s a core), so the work
    // handed to threads_for_work is twice the bytes (or the flops, where rows
    // make those more) — a 512 × 1024 f32 k or v projection (2 MiB, ~70 µs on
    // one core) splits over two threads, where its 1 MFLOP alone would keep
    // it on one.
    std::vector<std::pair<std::size_t, i64>> work;
    double bytes = 0, flops = 0;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
        const PackedGemvJob& job = jobs[j];
        if (job.t_count <= 0 || job.n_count <= 0) continue;
        if (job.k_count <= 0) {
            std::fill(job.y, job.y + job.t_count * job.n_count, 0.0f);
            continue;
        }
        if (job.t_count > kGemvPackMaxRows) std::abort();  // a caller's bug: the packed GEMV takes decode rows only
        const i64 groups = (job.n_count + kGemvPackRows - 1) / kGemvPackRows;
        for (i64 g = 0; g < groups; ++g) work.emplace_back(j, g);
        bytes += static_cast<double>(job.n_count * job.k_count * gemv_panel_bytes(job.panel));
        flops += 2.0 * static_cast<double>(job.t_count * job.n_count * job.k_count);
    }
    if (work.empty()) return;
    threads = threads_for_work(threads, std::max(flops, 2 * bytes));  // over the whole batch
    const i64 items = static_cast<i64>(work.size());
#pragma omp parallel for schedule(dynamic, 2) num_threads(threads) if (threads > 1)
    for (i64 i = 0; i < items; ++i) {
        const PackedGemvJob& job = jobs[work[static_cast<std::size_t>(i)].first];
        const i64 g = work[static_cast<std::size_t>(i)].second;
        const i64 n0 = g * kGemvPackRows, valid = std::min(kGemvPackRows, job.n_count - n0);
        const void* pg = static_cast<const char*>(job.packed) + g * job.k_count * kGemvPackRows * gemv_panel_bytes(job.panel);
        if (wide_gemv_group(static_cast<int>(job.t_count), job.panel, job.x, pg, job.y, n0, valid, job.n_count, job.k_count)) {
            for (i64 t = 0; t < job.t_count; ++t) round_run(io_rounding, job.y + t * job.n_count + n0, valid);
            continue;
        }
        const auto rows = [&](auto pf) {
            constexpr WeightFormat P = decltype(pf)::value;
            switch (job.t_count) {
                case 1: gemv_packed_group<1, P>(job.x, pg, job.y, n0, valid, job.n_count, job.k_count); break;
                case 2: gemv_packed_group<2, P>(job.x, pg, job.y, n0, valid, job.n_count, job.k_count); break;
                default: gemv_packed_group<3, P>(job.x, pg, job.y, n0, valid, job.n_count, job.k_count); break;
            }
        };
        switch (job.panel) {
            case WeightFormat::f32: rows(std::integral_constant<WeightFormat, WeightFormat::f32>{}); break;
            case WeightFormat::f16: rows(std::integral_constant<WeightFormat, WeightFormat::f16>{}); break;
            case WeightFormat::bf16: rows(std::integral_constant<WeightFormat, WeightFormat::bf16>{}); break;
        }
        for (i64 t = 0; t < job.t_count; ++t) round_run(io_rounding, job.y + t * job.n_count + n0, valid);
    }
}

void gemv_packed(const float* x, const void* packed, WeightFormat panel, float* y, std::int64_t t_count,
                 std::int64_t n_count, std::int64_t k_count, int threads, WeightRounding io_rounding) {
    if (t_count > 0 && k_count > 0) x = gemv_x(x, io_rounding, t_count, k_count);
    const PackedGemvJob job{x, packed, y, t_count, n_count, k_count, panel};
    KVASIR_FMA_ISA::gemv_packed_batch(std::span<const PackedGemvJob>(&job, 1), threads, io_rounding);
}

void convert(const void* src, WeightFormat format, WeightRounding rounding, float* dst, std::int64_t n) {
    rounding = effective_rounding(format, rounding);
    // Element-wise, so dst may be src (f32 in place).
    const auto run_one = [&](auto f, auto r) {
        constexpr WeightFormat F = decltype(f)::value;
        constexpr WeightRounding R = decltype(r)::value;
        i64 i = 0;
        for (; i + 8 <= n; i += 8) vstore(dst + i, load8<F, R>(src, i));
        for (; i < n; ++i) dst[i] = load1<F, R>(src, i);
    };
    const auto with_rounding = [&](auto f) {
        switch (rounding) {
            case WeightRounding::none: run_one(f, std::integral_constant<WeightRounding, WeightRounding::none>{}); break;
            case WeightRounding::f16: run_one(f, std::integral_constant<WeightRounding, WeightRounding::f16>{}); break;
            case WeightRounding::bf16: run_one(f, std::integral_constant<WeightRounding, WeightRounding::bf16>{}); break;
        }
    };
    switch (format) {
        case WeightFormat::f32: with_rounding(std::integral_constant<WeightFormat, WeightFormat::f32>{}); break;
        case WeightFormat::f16: with_rounding(std::integral_constant<WeightFormat, WeightFormat::f16>{}); break;
        case WeightFormat::bf16: with_rounding(std::integral_constant<WeightFormat, WeightFormat::bf16>{}); break;
    }
}

}  // namespace

const FmaKernels kFmaKernels{matmul, pack_gemv, gemv_packed, gemv_packed_batch, convert};

}  // namespace kvasir::kernels::KVASIR_FMA_ISA
