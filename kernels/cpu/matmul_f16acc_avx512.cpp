// matmul_f16acc on AVX-512 (F, DQ): f16acc_tile.hpp with 8 lanes in one zmm.
#include "kernels/cpu/f16acc_tile.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

struct V8 {
    using type = __m512d;
    static type zero() { return _mm512_setzero_pd(); }
    static type load(const double* p) { return _mm512_load_pd(p); }
    static type broadcast(double v) { return _mm512_set1_pd(v); }
    static type fma(type a, type b, type c) { return _mm512_fmadd_pd(a, b, c); }
    static constexpr int kAll = 0xff;
    static type round_normal(type x) {
        const __m512i low = _mm512_set1_epi64((std::int64_t{1} << 42) - 1);
        const __m512i half = _mm512_set1_epi64((std::int64_t{1} << 41) - 1);
        const __m512i bits = _mm512_castpd_si512(x);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi64(bits, 42), _mm512_set1_epi64(1));
        return _mm512_castsi512_pd(_mm512_andnot_si512(low, _mm512_add_epi64(bits, _mm512_add_epi64(half, odd))));
    }
    static int normal_mask(type x) {
        const __m512d a = _mm512_abs_pd(x);
        return _mm512_mask_cmp_pd_mask(_mm512_cmp_pd_mask(a, _mm512_set1_pd(0x1p-14), _CMP_GE_OQ), a,
                                       _mm512_set1_pd(65520.0), _CMP_LT_OQ);
    }
    static type round_f16(type x) {
        const __m512i bits = _mm512_castpd_si512(x);
        __m512d r = round_normal(x);
        const __m512d a = _mm512_abs_pd(x);
        const __m512d tiny = _mm512_mul_pd(
            _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(0x1p24)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
            _mm512_set1_pd(0x1p-24));
        r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, _mm512_set1_pd(0x1p-14), _CMP_LT_OQ), r, tiny);
        const __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi64(static_cast<std::int64_t>(0x8000000000000000ull)));
        const __m512d inf = _mm512_castsi512_pd(_mm512_or_si512(sign, _mm512_set1_epi64(0x7ff0000000000000ll)));
        r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, _mm512_set1_pd(65520.0), _CMP_GE_OQ), r, inf);
        return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), r, x);
    }
    static void store_f32(float* p, type v) { _mm256_storeu_ps(p, _mm512_cvtpd_ps(v)); }
};

}  // namespace

void matmul_f16acc_avx512(const float* x, const float* w, float* y, std::int64_t t_count, std::int64_t n_count,
                          std::int64_t k_count, int threads) {
    f16acc::matmul<V8>(x, w, y, t_count, n_count, k_count, threads);
}

}  // namespace kvasir::kernels
