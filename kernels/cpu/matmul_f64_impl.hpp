// The f64 oracle's matmul (cpu-ref): y[T, N] = x[T, K] · w[N, K]ᵀ in double,
// bit-identical to the textbook loop of matmul.hpp. Written once in the
// kernels' SIMD vocabulary (avx2_load.hpp, neon_load.hpp: vd4 = 4 double
// lanes) and compiled per ISA like fma_kernels_impl.hpp: matmul_f64_avx2.cpp
// (with AVX-512's 8-row tiles where the CPU has them) and matmul_f64_neon.cpp
// each define KVASIR_FMA_ISA and include this file, which defines
// ISA::matmul_f64.
//
// Why it is still the textbook loop: vector lanes always run over different
// outputs n, never over k; each lane does s = s + x·w with a separate
// multiply and add (the project compiles with -ffp-contract=off, so the
// compiler cannot fuse them either), starting from +0 and walking k upwards.
// Cutting K into blocks only parks the running sum in y between blocks — a
// double stored and reloaded unchanged.
//
// Blocking (after Goto & van de Geijn / BLIS, own code):
//   jobs = chunks of kNC = 32 columns of w (schedule(dynamic));
//   per job, for each K block of kKC = 256:
//     pack w[chunk, block] into 4 panels Bp[k][8] of doubles (widened from
//       f32/f16/bf16 while packing: 8×8 f32 register transposes, then
//       exact widening to double; 64 KB, stays in L2);
//     for each tile of 4 rows of x (4×256 doubles = 8 KB, L1):
//       for each panel: 4×8 micro-kernel over the block — 8 vd4 accumulators,
//       per k two panel loads, four broadcasts, 8 mul + 8 add.
// The weights are read once per call whatever T is; nothing of size N×K is
// ever allocated (the previous version widened all of w to f64 first: 2.5 GB
// for a 151936×2048 lm_head, per call).
#ifndef KVASIR_FMA_ISA
#error "include the ISA's vocabulary (avx2_load.hpp, neon_load.hpp) first: it defines KVASIR_FMA_ISA"
#endif

#include "kernels/cpu/matmul.hpp"

#include <algorithm>
#include <cstring>

namespace kvasir::kernels::KVASIR_FMA_ISA {
namespace {

constexpr int kMR = 4;     // rows of x per micro-tile
constexpr int kNR = 8;     // columns per panel (two ymm of doubles)
constexpr i64 kKC = 256;   // K block
constexpr i64 kPanels = 4; // panels per job
constexpr i64 kNC = kNR * kPanels;

// Packs w[n0 … n0+valid-1, k0 … k0+kc-1] into dst[k][8] (rows ≥ valid are 0).
template <WeightFormat F>
void pack_panel(const void* w, i64 k_count, i64 n0, i64 valid, i64 k0, i64 kc, double* dst) {
    i64 k = 0;
    if (valid == kNR) {
        for (; k + 8 <= kc; k += 8) {
            vf8 r[8];
            load_transposed8<F, WeightRounding::none>(w, n0, k_count, k0 + k, r);  // r[j] = column k+j: lane i = row n0+i
            for (int j = 0; j < 8; ++j) {
                vdstore(dst + (k + j) * kNR, widen_lo(r[j]));
                vdstore(dst + (k + j) * kNR + 4, widen_hi(r[j]));
            }
        }
    }
    for (; k < kc; ++k)
        for (i64 i = 0; i < kNR; ++i)
            dst[k * kNR + i] = i < valid ? static_cast<double>(load1<F, WeightRounding::none>(w, (n0 + i) * k_count + k0 + k)) : 0.0;
}

void pack_panel_f64(const double* w, i64 k_count, i64 n0, i64 valid, i64 k0, i64 kc, double* dst) {
    for (i64 k = 0; k < kc; ++k)
        for (i64 i = 0; i < kNR; ++i) dst[k * kNR + i] = i < valid ? w[(n0 + i) * k_count + k0 + k] : 0.0;
}

// y[0 … MR-1][0 … valid-1] (row stride ldy) = (first ? +0 : y) + Σ over the
// block, k ascending. x: row stride ldx, already offset to the block.
template <int MR>
void micro_kernel(const double* x, i64 ldx, const double* bp, i64 kc, double* y, i64 ldy, i64 valid, bool first) {
    vd4 acc[MR][2];
    alignas(32) double tmp[MR][kNR];
    if (first) {
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vdzero();
    } else if (valid == kNR) {
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            acc[r][0] = vdload(y + r * ldy);
            acc[r][1] = vdload(y + r * ldy + 4);
        }
    } else {
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            for (i64 j = 0; j < kNR; ++j) tmp[r][j] = j < valid ? y[r * ldy + j] : 0.0;
            acc[r][0] = vdload(tmp[r]);
            acc[r][1] = vdload(tmp[r] + 4);
        }
    }
    for (i64 k = 0; k < kc; ++k) {
        const vd4 b0 = vdload(bp + k * kNR), b1 = vdload(bp + k * kNR + 4);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            const vd4 a = vdbroadcast(x + r * ldx + k);
            acc[r][0] = vdadd(acc[r][0], vdmul(a, b0));
            acc[r][1] = vdadd(acc[r][1], vdmul(a, b1));
        }
    }
    if (valid == kNR) {
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            vdstore(y + r * ldy, acc[r][0]);
            vdstore(y + r * ldy + 4, acc[r][1]);
        }
    } else {
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            vdstore(tmp[r], acc[r][0]);
            vdstore(tmp[r] + 4, acc[r][1]);
            for (i64 j = 0; j < valid; ++j) y[r * ldy + j] = tmp[r][j];
        }
    }
}

using MicroKernel = void (*)(const double*, i64, const double*, i64, double*, i64, i64, bool);
constexpr MicroKernel kEdgeKernels[kMR] = {nullptr, micro_kernel<1>, micro_kernel<2>, micro_kernel<3>};

void job(const double* x, const void* w, DType w_dtype, double* y, i64 t_count, i64 n_count, i64 k_count, i64 n0,
         double* bp, bool wide) {
    const i64 nc = std::min(kNC, n_count - n0);
    const i64 panels = (nc + kNR - 1) / kNR;
    for (i64 k0 = 0; k0 < k_count; k0 += kKC) {
        const i64 kc = std::min(kKC, k_count - k0);
        for (i64 p = 0; p < panels; ++p) {
            const i64 valid = std::min<i64>(kNR, nc - p * kNR);
            double* dst = bp + p * kKC * kNR;
            switch (w_dtype) {
                case DType::f32: pack_panel<WeightFormat::f32>(w, k_count, n0 + p * kNR, valid, k0, kc, dst); break;
                case DType::f16: pack_panel<WeightFormat::f16>(w, k_count, n0 + p * kNR, valid, k0, kc, dst); break;
                case DType::bf16: pack_panel<WeightFormat::bf16>(w, k_count, n0 + p * kNR, valid, k0, kc, dst); break;
                default: pack_panel_f64(static_cast<const double*>(w), k_count, n0 + p * kNR, valid, k0, kc, dst); break;
            }
        }
        const bool first = k0 == 0;
        if (wide) {  // tiles of 8 rows, one wider register each (AVX-512: matmul_f64_avx512.cpp)
            for (i64 t = 0; t < t_count; t += 8)
                for (i64 p = 0; p < panels; ++p)
                    wide_f64_tile(static_cast<int>(std::min<i64>(8, t_count - t)), x + t * k_count + k0, k_count,
                                           bp + p * kKC * kNR, kc, y + t * n_count + n0 + p * kNR, n_count,
                                           std::min<i64>(kNR, nc - p * kNR), first);
            continue;
        }
        i64 t = 0;
        for (; t + kMR <= t_count; t += kMR)
            for (i64 p = 0; p < panels; ++p)
                micro_kernel<kMR>(x + t * k_count + k0, k_count, bp + p * kKC * kNR, kc, y + t * n_count + n0 + p * kNR,
                                  n_count, std::min<i64>(kNR, nc - p * kNR), first);
        if (t < t_count)
            for (i64 p = 0; p < panels; ++p)
                kEdgeKernels[t_count - t](x + t * k_count + k0, k_count, bp + p * kKC * kNR, kc,
                                          y + t * n_count + n0 + p * kNR, n_count, std::min<i64>(kNR, nc - p * kNR), first);
    }
}

void run(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count, std::int64_t n_count,
         std::int64_t k_count, int threads, bool wide) {
    if (t_count <= 0 || n_count <= 0) return;
    if (k_count <= 0) {
        std::fill(y, y + t_count * n_count, 0.0);
        return;
    }
    const i64 jobs = (n_count + kNC - 1) / kNC;
    threads = threads_for_work(threads, 2.0 * static_cast<double>(t_count) * static_cast<double>(n_count) * static_cast<double>(k_count));
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        alignas(64) static thread_local double bp[kPanels * kKC * kNR];  // 64 KB per thread
#pragma omp for schedule(dynamic, 4)
        for (i64 j = 0; j < jobs; ++j) job(x, w, w_dtype, y, t_count, n_count, k_count, j * kNC, bp, wide);
    }
}

}  // namespace

void matmul_f64(const double* x, const void* w, DType w_dtype, double* y, std::int64_t t_count, std::int64_t n_count,
                std::int64_t k_count, int threads, bool wide_tiles) {
    run(x, w, w_dtype, y, t_count, n_count, k_count, threads, wide_tiles && kHasWideF64Tile);
}

}  // namespace kvasir::kernels::KVASIR_FMA_ISA
