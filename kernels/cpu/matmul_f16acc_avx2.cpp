// matmul_f16acc on AVX2 + FMA: f16acc_tile.hpp with 8 lanes as two ymm.
#include "kernels/cpu/f16acc_tile.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

// The rounding of 4 lanes (f16acc_tile.hpp gives the definition).
__m256d round_normal4(__m256d x) {
    const __m256i low = _mm256_set1_epi64x((std::int64_t{1} << 42) - 1);
    const __m256i half = _mm256_set1_epi64x((std::int64_t{1} << 41) - 1);
    const __m256i bits = _mm256_castpd_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi64(bits, 42), _mm256_set1_epi64x(1));
    return _mm256_castsi256_pd(_mm256_andnot_si256(low, _mm256_add_epi64(bits, _mm256_add_epi64(half, odd))));
}

__m256d magnitude4(__m256d x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }

int normal_mask4(__m256d x) {
    const __m256d a = magnitude4(x);
    return _mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(a, _mm256_set1_pd(0x1p-14), _CMP_GE_OQ),
                                            _mm256_cmp_pd(a, _mm256_set1_pd(65520.0), _CMP_LT_OQ)));
}

__m256d round_f16_4(__m256d x) {
    __m256d r = round_normal4(x);
    const __m256d a = magnitude4(x);
    const __m256d tiny = _mm256_mul_pd(
        _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(0x1p24)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        _mm256_set1_pd(0x1p-24));
    r = _mm256_blendv_pd(r, tiny, _mm256_cmp_pd(a, _mm256_set1_pd(0x1p-14), _CMP_LT_OQ));
    const __m256d inf = _mm256_or_pd(_mm256_and_pd(_mm256_set1_pd(-0.0), x), _mm256_set1_pd(__builtin_inf()));
    r = _mm256_blendv_pd(r, inf, _mm256_cmp_pd(a, _mm256_set1_pd(65520.0), _CMP_GE_OQ));
    return _mm256_blendv_pd(r, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

struct V8 {
    struct type {
        __m256d lo, hi;
    };
    static constexpr int kAll = 0xff;
    static type zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
    static type load(const double* p) { return {_mm256_load_pd(p), _mm256_load_pd(p + 4)}; }
    static type broadcast(double v) { return {_mm256_set1_pd(v), _mm256_set1_pd(v)}; }
    static type fma(type a, type b, type c) { return {_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)}; }
    static type round_normal(type v) { return {round_normal4(v.lo), round_normal4(v.hi)}; }
    static int normal_mask(type v) { return normal_mask4(v.lo) | (normal_mask4(v.hi) << 4); }
    static type round_f16(type v) { return {round_f16_4(v.lo), round_f16_4(v.hi)}; }
    static void store_f32(float* p, type v) {
        _mm_storeu_ps(p, _mm256_cvtpd_ps(v.lo));
        _mm_storeu_ps(p + 4, _mm256_cvtpd_ps(v.hi));
    }
};

}  // namespace

void matmul_f16acc_avx2(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                        std::int64_t k_count, int threads) {
    f16acc::matmul<V8>(x, w, y, t_count, n_count, k_count, threads);
}

}  // namespace kvasir::kernels
