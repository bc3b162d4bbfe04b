// The f32 GEMM's micro-tile and the packed decode GEMV's group on AVX-512
// (fma_kernels_impl.hpp runs the drivers, the packing and every other path).
// The tile: rows 1 … 6 of a packed x panel against
// one packed 16-column w panel, one zmm a row. Per K summation block each
// element is one FMA chain in k order from +0, then stored or added to c —
// the AVX2 tile's arithmetic lane for lane, so the same bits. Everything
// here is inlined or local: no weak symbol the linker could keep for CPUs
// without AVX-512 (tests/layout/check_isa_objects.py).
#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

template <int M>
void block(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add) {
    __m512 acc[M];
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (std::int64_t k = 0; k < kc; ++k) {
        const __m512 bv = _mm512_load_ps(b + k * kGemmNR);
#pragma GCC unroll 6
        for (int i = 0; i < M; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * kGemmMR + i]), bv, acc[i]);
    }
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i)
        _mm512_storeu_ps(c + i * ldc, add ? _mm512_add_ps(_mm512_loadu_ps(c + i * ldc), acc[i]) : acc[i]);
}

template <int M>
void tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add) {
    for (std::int64_t k = 0; k < kc; k += kMatmulKBlock) {
        const std::int64_t n = kc - k < kMatmulKBlock ? kc - k : kMatmulKBlock;
        block<M>(n, a + k * kGemmMR, b + k * kGemmNR, c, ldc, add || k > 0);
    }
}

// kGemvPackRows weights of one k of a packed group, widened exactly to f32.
template <WeightFormat P>
[[gnu::always_inline]] inline __m512 load16(const void* p, std::int64_t i) {
    if constexpr (P == WeightFormat::f32) {
        return _mm512_loadu_ps(static_cast<const float*>(p) + i);
    } else if constexpr (P == WeightFormat::f16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i)));
    } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

template <int TT, WeightFormat P>
void gemv_group(const float* x, const void* pg, float* y, std::int64_t n0, std::int64_t valid, std::int64_t n_count,
                std::int64_t k_count) {
    static_assert(kGemvPackRows == 32, "two zmm a k");
    constexpr std::int64_t bytes = P == WeightFormat::f32 ? 4 : 2;
    __m512 acc[TT][2];
    alignas(64) float tile[TT][kGemvPackRows];  // the group's running y (block sums added in order)
    const auto flush = [&](bool first) {
        for (int t = 0; t < TT; ++t)
            for (int v = 0; v < 2; ++v) {
                float* p = tile[t] + 16 * v;
                _mm512_store_ps(p, first ? acc[t][v] : _mm512_add_ps(_mm512_load_ps(p), acc[t][v]));
                acc[t][v] = _mm512_setzero_ps();
            }
    };
    for (int t = 0; t < TT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    const char* base = static_cast<const char*>(pg);
    for (std::int64_t k = 0; k < k_count; ++k) {
        if (k > 0 && k % kMatmulKBlock == 0) flush(k == kMatmulKBlock);
        const char* wk = base + k * kGemvPackRows * bytes;
        // No software prefetch (the AVX2 group has one, 32 k ahead): on the 2-vCPU
        // Zen 4 VM, packed weights on huge pages stream at 55-57 GB/s on two
        // threads without it and 33-45 GB/s with it (one thread 32-34 vs 29-31;
        // BENCHMARKS.md, stop 55). The hardware prefetchers follow one
        // contiguous panel stream alone.
        const __m512 w0 = load16<P>(wk, 0), w1 = load16<P>(wk, 16);
#pragma GCC unroll 3
        for (int t = 0; t < TT; ++t) {
            const __m512 xb = _mm512_set1_ps(x[t * k_count + k]);
            acc[t][0] = _mm512_fmadd_ps(xb, w0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(xb, w1, acc[t][1]);
        }
    }
    flush(k_count <= kMatmulKBlock);
    for (int t = 0; t < TT; ++t)
        for (std::int64_t i = 0; i < valid; ++i) y[t * n_count + n0 + i] = tile[t][i];
}

template <WeightFormat P>
void gemv_group_rows(int tt, const float* x, const void* pg, float* y, std::int64_t n0, std::int64_t valid, std::int64_t n_count,
                     std::int64_t k_count) {
    switch (tt) {
        case 1: return gemv_group<1, P>(x, pg, y, n0, valid, n_count, k_count);
        case 2: return gemv_group<2, P>(x, pg, y, n0, valid, n_count, k_count);
        default: return gemv_group<3, P>(x, pg, y, n0, valid, n_count, k_count);
    }
}

}  // namespace

void gemv_packed_group_avx512(int tt, WeightFormat panel, const float* x, const void* pg, float* y, std::int64_t n0,
                              std::int64_t valid, std::int64_t n_count, std::int64_t k_count) {
    switch (panel) {
        case WeightFormat::f32: return gemv_group_rows<WeightFormat::f32>(tt, x, pg, y, n0, valid, n_count, k_count);
        case WeightFormat::f16: return gemv_group_rows<WeightFormat::f16>(tt, x, pg, y, n0, valid, n_count, k_count);
        case WeightFormat::bf16: return gemv_group_rows<WeightFormat::bf16>(tt, x, pg, y, n0, valid, n_count, k_count);
    }
}

void matmul_tile_avx512(int m, std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool add) {
    static_assert(kGemmMR == 6 && kGemmNR == 16, "one zmm a row of the 16-column panel, up to 6 rows");
    switch (m) {
        case 6: return tile<6>(kc, a, b, c, ldc, add);
        case 5: return tile<5>(kc, a, b, c, ldc, add);
        case 4: return tile<4>(kc, a, b, c, ldc, add);
        case 3: return tile<3>(kc, a, b, c, ldc, add);
        case 2: return tile<2>(kc, a, b, c, ldc, add);
        default: return tile<1>(kc, a, b, c, ldc, add);
    }
}

}  // namespace kvasir::kernels
