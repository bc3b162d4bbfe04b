// The fused attention's P·V row on AVX-512 (attention_impl.hpp runs every
// other part, and this part on other CPUs): o[i] = R(Σ_{s<n} p[s]·V[s, i])
// for the dims of a head in 16-lane columns, up to 128 dims (a whole head of
// most models) a pass, so each V row is read once, contiguous, where the AVX2
// chunk takes 64 dims a pass and reads it twice. Lanes run over output dims,
// never along a sum: each output is the AVX2 path's chain lane for lane —
// fma(p[s], R(V[s, i]), acc) over s in blocks of kMatmulKBlock from +0, the
// block sums added in order, the total rounded with R — so the same bits
// (AttentionBits.* hold it against the composition, on this path and, in
// ctest's attention_isa_avx2, on the capped AVX2 one).
// Everything here is inlined or local: no weak symbol the linker could keep
// for CPUs without AVX-512 (tests/layout/check_isa_objects.py).
#include "kernels/cpu/attention.hpp"

#include <immintrin.h>

namespace kvasir::kernels {
namespace {

using i64 = std::int64_t;

// avx2_load.hpp's round_bf16x8 / round_f16x8, 16 lanes: the same integer
// steps per lane (RNE on the dropped bits; NaN quiet, sign kept).
template <WeightRounding R>
[[gnu::always_inline]] inline __m512 round16(__m512 v) {
    if constexpr (R == WeightRounding::f16) {
        return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if constexpr (R == WeightRounding::bf16) {
        const __m512i b = _mm512_castps_si512(v);
        const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), hi_mask);
        const __m512i quiet = _mm512_or_si512(_mm512_and_si512(b, hi_mask), _mm512_set1_epi32(0x00400000));
        const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
    } else {
        return v;
    }
}

template <WeightRounding R, int NV>
[[gnu::always_inline]] inline void pv_chunk(const float* p, i64 n, const float* v, i64 dim, i64 i0, float* o, bool prefetch) {
    __m512 tot[NV], acc[NV];
    for (i64 s0 = 0; s0 < n; s0 += kMatmulKBlock) {
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[j] = _mm512_setzero_ps();
        const i64 s1 = n < s0 + kMatmulKBlock ? n : s0 + kMatmulKBlock;
        for (i64 s = s0; s < s1; ++s) {
            const float* row = v + s * dim + i0;
            if (prefetch && s + 4 < n)  // decoding: the value row 4 keys ahead, a line a column (as the AVX2 chunk)
#pragma GCC unroll 8
                for (int j = 0; j < NV; ++j) __builtin_prefetch(reinterpret_cast<const char*>(row + 4 * dim + 16 * j), 0, 3);
            const __m512 pv = _mm512_set1_ps(p[s]);
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) acc[j] = _mm512_fmadd_ps(pv, round16<R>(_mm512_loadu_ps(row + 16 * j)), acc[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) tot[j] = s0 == 0 ? acc[j] : _mm512_add_ps(tot[j], acc[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + i0 + 16 * j, round16<R>(tot[j]));
}

template <WeightRounding R>
i64 pv_row(const float* p, i64 n, const float* v, i64 dim, float* o, bool prefetch) {
    i64 i0 = 0;
    for (; i0 + 128 <= dim; i0 += 128) pv_chunk<R, 8>(p, n, v, dim, i0, o, prefetch);
    switch ((dim - i0) / 16) {  // the rest of the head in one pass
        case 7: pv_chunk<R, 7>(p, n, v, dim, i0, o, prefetch); break;
        case 6: pv_chunk<R, 6>(p, n, v, dim, i0, o, prefetch); break;
        case 5: pv_chunk<R, 5>(p, n, v, dim, i0, o, prefetch); break;
        case 4: pv_chunk<R, 4>(p, n, v, dim, i0, o, prefetch); break;
        case 3: pv_chunk<R, 3>(p, n, v, dim, i0, o, prefetch); break;
        case 2: pv_chunk<R, 2>(p, n, v, dim, i0, o, prefetch); break;
        case 1: pv_chunk<R, 1>(p, n, v, dim, i0, o, prefetch); break;
        default: break;
    }
    return dim / 16 * 16;
}

}  // namespace

std::int64_t attention_pv_row_avx512(WeightRounding rounding, const float* p, std::int64_t n, const float* v, std::int64_t dim,
                                     float* o, bool prefetch) {
    switch (rounding) {
        case WeightRounding::f16: return pv_row<WeightRounding::f16>(p, n, v, dim, o, prefetch);
        case WeightRounding::bf16: return pv_row<WeightRounding::bf16>(p, n, v, dim, o, prefetch);
        default: return pv_row<WeightRounding::none>(p, n, v, dim, o, prefetch);
    }
}

}  // namespace kvasir::kernels
