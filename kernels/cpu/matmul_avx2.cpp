// AVX2 + FMA matmul: a 3×4 tile of 8-lane FMA accumulators (12 of the 16 ymm
// registers) swept along K; the lanes are folded pairwise at the end, which is
// a different reduction order from the oracle's sequential sum on purpose —
// that is the arithmetic a SIMD CPU node really does.
#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

inline float hsum(__m256 v) {
    const __m128 lo = _mm256_castps256_ps128(v);
    const __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);              // lanes (0+4, 1+5, 2+6, 3+7)
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));     // (0+4+2+6, 1+5+3+7)
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

template <int MT, int NT>
inline void tile(const float* x, const float* w, float* y, std::int64_t n_count, std::int64_t k_count) {
    __m256 acc[MT][NT];
    for (int i = 0; i < MT; ++i)
        for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_setzero_ps();
    const std::int64_t k_vec = k_count & ~std::int64_t{7};
    for (std::int64_t k = 0; k < k_vec; k += 8) {
        __m256 xv[MT];
        for (int i = 0; i < MT; ++i) xv[i] = _mm256_loadu_ps(x + i * k_count + k);
        for (int j = 0; j < NT; ++j) {
            const __m256 wv = _mm256_loadu_ps(w + j * k_count + k);
            for (int i = 0; i < MT; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    for (int i = 0; i < MT; ++i)
        for (int j = 0; j < NT; ++j) {
            float s = hsum(acc[i][j]);
            for (std::int64_t k = k_vec; k < k_count; ++k) s = __builtin_fmaf(x[i * k_count + k], w[j * k_count + k], s);
            y[i * n_count + j] = s;
        }
}

template <int MT>
inline void row_block(const float* x, const float* w, float* y, std::int64_t n0, std::int64_t n1, std::int64_t n_count,
                      std::int64_t k_count) {
    std::int64_t n = n0;
    for (; n + 4 <= n1; n += 4) tile<MT, 4>(x, w + n * k_count, y + n, n_count, k_count);
    for (; n < n1; ++n) tile<MT, 1>(x, w + n * k_count, y + n, n_count, k_count);
}

}  // namespace

void matmul_f32_avx2(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                     std::int64_t k_count, int threads) {
    // Parallel over blocks of 4 weight rows: every thread sweeps all tokens
    // for its slice of N, so a weight row is loaded from memory once.
    const std::int64_t n_blocks = (n_count + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t b = 0; b < n_blocks; ++b) {
        const std::int64_t n0 = b * 4;
        const std::int64_t n1 = n0 + 4 < n_count ? n0 + 4 : n_count;
        std::int64_t t = 0;
        for (; t + 3 <= t_count; t += 3) row_block<3>(x + t * k_count, w, y + t * n_count, n0, n1, n_count, k_count);
        for (; t < t_count; ++t) row_block<1>(x + t * k_count, w, y + t * n_count, n0, n1, n_count, k_count);
    }
}

}  // namespace kvasir::kernels
