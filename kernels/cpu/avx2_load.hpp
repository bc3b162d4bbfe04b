// AVX2 + F16C helpers shared by the *_avx2.cpp kernels (include only from
// files compiled with -mavx2 -mfma -mf16c): reading weights as f32 from their
// stored format, rounding to a narrower storage format, and in-register
// transposes of 8-row blocks.
//
// It is also the AVX2 side of the vocabulary the fused-f32 kernels
// (fma_kernels_impl.hpp, attention_impl.hpp) are written in — vf8 (8 f32
// lanes), vzero, vset1, vload, vstore, vbroadcast, vfma, vadd, vmul, vdiv,
// vmax, vfirst, store6, round_w, load8, load1, load_transposed4_f32,
// load_transposed8, store_panel8, store_panel1, fma1, wide_tile — which
// neon_load.hpp gives for AArch64 AdvSIMD with the same meaning lane for lane.
#pragma once

#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvasir::kernels::avx2 {

using i64 = std::int64_t;

// ---------------------------------------------------------------------------
// Eight f32 lanes and the operations the kernels use on them.
// ---------------------------------------------------------------------------

using vf8 = __m256;
[[gnu::always_inline]] inline vf8 vzero() { return _mm256_setzero_ps(); }
[[gnu::always_inline]] inline vf8 vload(const float* p) { return _mm256_loadu_ps(p); }
[[gnu::always_inline]] inline void vstore(float* p, vf8 v) { _mm256_storeu_ps(p, v); }
[[gnu::always_inline]] inline vf8 vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
// a·b + c, rounded once (the contract's chain step).
[[gnu::always_inline]] inline vf8 vfma(vf8 a, vf8 b, vf8 c) { return _mm256_fmadd_ps(a, b, c); }
[[gnu::always_inline]] inline vf8 vadd(vf8 a, vf8 b) { return _mm256_add_ps(a, b); }
[[gnu::always_inline]] inline vf8 vmul(vf8 a, vf8 b) { return _mm256_mul_ps(a, b); }
[[gnu::always_inline]] inline vf8 vdiv(vf8 a, vf8 b) { return _mm256_div_ps(a, b); }
// a > b ? a : b per lane (MAXPS: b where either is NaN).
[[gnu::always_inline]] inline vf8 vmax(vf8 a, vf8 b) { return _mm256_max_ps(a, b); }
[[gnu::always_inline]] inline vf8 vset1(float v) { return _mm256_set1_ps(v); }
[[gnu::always_inline]] inline float vfirst(vf8 v) { return _mm256_cvtss_f32(v); }  // lane 0
// Lanes 0 … 5 of v to p[0 … 5].
[[gnu::always_inline]] inline void store6(float* p, vf8 v) {
    _mm_storeu_ps(p, _mm256_castps256_ps128(v));
    _mm_storel_pi(reinterpret_cast<__m64*>(p + 4), _mm256_extractf128_ps(v, 1));
}
// Four f64 lanes (the f64 oracle's matmul, matmul_f64_impl.hpp): separate
// multiply and add, never fused.
using vd4 = __m256d;
[[gnu::always_inline]] inline vd4 vdzero() { return _mm256_setzero_pd(); }
[[gnu::always_inline]] inline vd4 vdload(const double* p) { return _mm256_loadu_pd(p); }
[[gnu::always_inline]] inline void vdstore(double* p, vd4 v) { _mm256_storeu_pd(p, v); }
[[gnu::always_inline]] inline vd4 vdbroadcast(const double* p) { return _mm256_broadcast_sd(p); }
[[gnu::always_inline]] inline vd4 vdadd(vd4 a, vd4 b) { return _mm256_add_pd(a, b); }
[[gnu::always_inline]] inline vd4 vdmul(vd4 a, vd4 b) { return _mm256_mul_pd(a, b); }
// Lanes 0-3 / 4-7 of an f32 vector widened to double (exact).
[[gnu::always_inline]] inline vd4 widen_lo(vf8 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
[[gnu::always_inline]] inline vd4 widen_hi(vf8 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

inline float fma1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// ---------------------------------------------------------------------------
// Reading weights as f32: conversion from the stored format, then optional
// rounding to a narrower storage format. Vector (8 consecutive k of one row)
// and scalar forms produce the same bits.
// ---------------------------------------------------------------------------

inline __m256 bf16x8_to_f32(__m128i h) {
    // A bf16 is the top half of an f32: widen each 16-bit lane, shift it up.
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Round 8 f32 to bf16 precision (RNE on the dropped 16 bits, overflow carries
// into inf); NaN stays NaN with the quiet bit set, as f32_to_bf16_bits does.
inline __m256 round_bf16x8(__m256 v) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), hi_mask);
    const __m256i quiet = _mm256_or_si256(_mm256_and_si256(b, hi_mask), _mm256_set1_epi32(0x00400000));
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), is_nan);
}

inline __m256 round_f16x8(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <WeightRounding R>
inline __m256 round_w(__m256 v) {
    if constexpr (R == WeightRounding::f16) return round_f16x8(v);
    else if constexpr (R == WeightRounding::bf16) return round_bf16x8(v);
    else return v;
}

// Eight consecutive weights w[i … i+7] as f32.
template <WeightFormat F, WeightRounding R>
inline __m256 load8(const void* w, i64 i) {
    __m256 v;
    if constexpr (F == WeightFormat::f32) {
        v = _mm256_loadu_ps(static_cast<const float*>(w) + i);
    } else {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(w) + i));
        v = F == WeightFormat::f16 ? _mm256_cvtph_ps(h) : bf16x8_to_f32(h);
    }
    return round_w<R>(v);
}

// One weight w[i] as f32, through the same vector instructions as load8.
template <WeightFormat F, WeightRounding R>
inline float load1(const void* w, i64 i) {
    __m256 v;
    if constexpr (F == WeightFormat::f32) {
        v = _mm256_set1_ps(static_cast<const float*>(w)[i]);
    } else {
        const __m128i h = _mm_set1_epi16(static_cast<short>(static_cast<const std::uint16_t*>(w)[i]));
        v = F == WeightFormat::f16 ? _mm256_cvtph_ps(h) : bf16x8_to_f32(h);
    }
    return _mm256_cvtss_f32(round_w<R>(v));
}

template <WeightFormat F>
constexpr i64 sizeof_w() { return F == WeightFormat::f32 ? 4 : 2; }

// In-register 8×8 transpose: on return r[j] holds column j (lane i = old r[i][j]).
[[gnu::always_inline]] inline void transpose8(__m256 r[8]) {
    // Interleave pairs of rows: t0 = r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5] …
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    // Gather quadruples: s0 = column 0 of rows 0-3 | column 4 of rows 0-3, etc.
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    // Join 128-bit halves: rows 0-3 from s0…s3, rows 4-7 from s4…s7.
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// The 8×8 block w[row … row+7, k … k+7] transposed into r[0..7] (r[j] =
// column k+j, lane i = row+i), converted and rounded. For f32 weights the
// 128-bit halves are placed by the loads themselves (broadcast of 4 floats,
// then a blend, which does not use the shuffle unit), leaving two 4×4
// in-lane transposes: 16 shuffles instead of 24 for the generic transpose8.
// f32 only: the 8×4 block w[row … row+7, k … k+3] transposed into r[0..3].
template <WeightRounding R>
[[gnu::always_inline]] inline void load_transposed4_f32(const float* w, i64 row, i64 k_count, i64 k, __m256 r[4]) {
    const float* base = w + row * k_count + k;
    __m256 a[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        const __m256 lo = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(base + i * k_count));
        const __m256 hi = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(base + (i + 4) * k_count));
        a[i] = round_w<R>(_mm256_blend_ps(lo, hi, 0xf0));  // row i | row i+4
    }
    const __m256 t0 = _mm256_unpacklo_ps(a[0], a[1]), t1 = _mm256_unpackhi_ps(a[0], a[1]);
    const __m256 t2 = _mm256_unpacklo_ps(a[2], a[3]), t3 = _mm256_unpackhi_ps(a[2], a[3]);
    r[0] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    r[1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    r[2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    r[3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}

// ---------------------------------------------------------------------------
// Panels of the packed decode GEMV: values the panel format P holds exactly
// (f32, f16 or bf16), stored in P.
// ---------------------------------------------------------------------------

template <WeightFormat P>
inline void store_panel8(void* dst, vf8 c) {
    if constexpr (P == WeightFormat::f32) {
        _mm256_storeu_ps(static_cast<float*>(dst), c);
    } else if constexpr (P == WeightFormat::f16) {
        _mm_storeu_si128(static_cast<__m128i*>(dst), _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {  // the upper halves: the value is a bf16 value, the lower half is zero
        const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(c), 16);
        _mm_storeu_si128(static_cast<__m128i*>(dst),
                         _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
    }
}
template <WeightFormat P>
inline void store_panel1(void* dst, float v) {
    if constexpr (P == WeightFormat::f32) {
        *static_cast<float*>(dst) = v;
    } else if constexpr (P == WeightFormat::f16) {
        const __m128i h = _mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        *static_cast<std::uint16_t*>(dst) = static_cast<std::uint16_t>(_mm_extract_epi16(h, 0));
    } else {
        std::uint32_t u;
        std::memcpy(&u, &v, 4);
        *static_cast<std::uint16_t*>(dst) = static_cast<std::uint16_t>(u >> 16);
    }
}

// The GEMM tile of a wider ISA with the same bits, where the CPU has one:
// AVX-512's one zmm a row (matmul_tile_avx512). Returns false where it has none.
inline bool wide_tile(int m, i64 kc, const float* a, const float* b, float* c, i64 ldc, bool add) {
    static const bool avx512 = cpu_has_avx512();
    if (!avx512) return false;
    matmul_tile_avx512(m, kc, a, b, c, ldc, add);
    return true;
}

// The packed decode GEMV's group of a wider ISA with the same bits, where the
// CPU has one: AVX-512's two zmm a k (gemv_packed_group_avx512).
inline bool wide_gemv_group(int tt, WeightFormat panel, const float* x, const void* pg, float* y, i64 n0, i64 valid, i64 n_count,
                            i64 k_count) {
    static const bool avx512 = cpu_has_avx512();
    if (!avx512) return false;
    gemv_packed_group_avx512(tt, panel, x, pg, y, n0, valid, n_count, k_count);
    return true;
}

// The fused attention's P·V row of a wider ISA with the same bits, where the
// CPU has one: AVX-512's 16-lane columns (attention_pv_row_avx512). Returns
// the dims it did (a multiple of 16; 0 where the CPU has no wider ISA).
inline i64 wide_pv_row(WeightRounding r, const float* p, i64 n, const float* v, i64 dim, float* o, bool prefetch) {
    static const bool avx512 = cpu_has_avx512();
    return avx512 ? attention_pv_row_avx512(r, p, n, v, dim, o, prefetch) : 0;
}

// The f64 matmul's 8-row tile of a wider ISA: AVX-512 (matmul_f64_tile_avx512),
// which the f64 driver runs where the dispatch says the CPU has it.
constexpr bool kHasWideF64Tile = true;
inline void wide_f64_tile(int rows, const double* x, i64 ldx, const double* bp, i64 kc, double* y, i64 ldy, i64 valid,
                          bool first) {
    matmul_f64_tile_avx512(rows, x, ldx, bp, kc, y, ldy, valid, first);
}

}  // namespace kvasir::kernels::avx2

// What the kernels derive from the vocabulary, in this ISA's namespace.
#define KVASIR_FMA_ISA avx2
#include "kernels/cpu/simd_derived.hpp"
