// AArch64 AdvSIMD (NEON) side of the vocabulary the fused-f32 kernels
// (fma_kernels_impl.hpp) are written in; avx2_load.hpp is the AVX2 side and
// says what each name means. Include only from *_neon.cpp files.
//
// vf8 is a pair of 128-bit registers: lanes 0-3 in lo, 4-7 in hi, so that
// every loop of the kernels runs over the same 8 outputs per vector as on
// AVX2. Every operation is the same IEEE operation lane for lane: FMLA and
// VFMADD are both fused (one rounding), FCVTL/FCVTN convert f16 exactly /
// round to nearest even as F16C does (FPCR.RMode = RN, the Linux default;
// flush-to-zero off on both), the bf16 rounding is the same integer
// arithmetic. So a NEON kernel gives the AVX2 kernel's bits on finite inputs
// (NaN payloads may differ; a NaN stays a NaN).
#pragma once

#include "kernels/cpu/matmul.hpp"

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace kvasir::kernels::neon {

using i64 = std::int64_t;

struct vf8 {
    float32x4_t lo, hi;
};
[[gnu::always_inline]] inline vf8 vzero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
[[gnu::always_inline]] inline vf8 vload(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
[[gnu::always_inline]] inline void vstore(float* p, vf8 v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
}
[[gnu::always_inline]] inline vf8 vbroadcast(const float* p) {
    const float32x4_t b = vld1q_dup_f32(p);
    return {b, b};
}
// a·b + c, rounded once (FMLA: c + a·b).
[[gnu::always_inline]] inline vf8 vfma(vf8 a, vf8 b, vf8 c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
[[gnu::always_inline]] inline vf8 vadd(vf8 a, vf8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
[[gnu::always_inline]] inline vf8 vmul(vf8 a, vf8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
[[gnu::always_inline]] inline vf8 vdiv(vf8 a, vf8 b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
// a > b ? a : b per lane, as MAXPS (b where either is NaN) — not FMAX, which
// returns the NaN.
[[gnu::always_inline]] inline float32x4_t max4(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
[[gnu::always_inline]] inline vf8 vmax(vf8 a, vf8 b) { return {max4(a.lo, b.lo), max4(a.hi, b.hi)}; }
[[gnu::always_inline]] inline vf8 vset1(float v) { return {vdupq_n_f32(v), vdupq_n_f32(v)}; }
[[gnu::always_inline]] inline float vfirst(vf8 v) { return vgetq_lane_f32(v.lo, 0); }
[[gnu::always_inline]] inline void store6(float* p, vf8 v) {
    vst1q_f32(p, v.lo);
    vst1_f32(p + 4, vget_low_f32(v.hi));
}
struct vd4 {
    float64x2_t lo, hi;
};
[[gnu::always_inline]] inline vd4 vdzero() { return {vdupq_n_f64(0.0), vdupq_n_f64(0.0)}; }
[[gnu::always_inline]] inline vd4 vdload(const double* p) { return {vld1q_f64(p), vld1q_f64(p + 2)}; }
[[gnu::always_inline]] inline void vdstore(double* p, vd4 v) {
    vst1q_f64(p, v.lo);
    vst1q_f64(p + 2, v.hi);
}
[[gnu::always_inline]] inline vd4 vdbroadcast(const double* p) {
    const float64x2_t b = vld1q_dup_f64(p);
    return {b, b};
}
[[gnu::always_inline]] inline vd4 vdadd(vd4 a, vd4 b) { return {vaddq_f64(a.lo, b.lo), vaddq_f64(a.hi, b.hi)}; }
[[gnu::always_inline]] inline vd4 vdmul(vd4 a, vd4 b) { return {vmulq_f64(a.lo, b.lo), vmulq_f64(a.hi, b.hi)}; }
[[gnu::always_inline]] inline vd4 widen_lo(vf8 v) { return {vcvt_f64_f32(vget_low_f32(v.lo)), vcvt_high_f64_f32(v.lo)}; }
[[gnu::always_inline]] inline vd4 widen_hi(vf8 v) { return {vcvt_f64_f32(vget_low_f32(v.hi)), vcvt_high_f64_f32(v.hi)}; }

inline float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }  // FMADD: AArch64 has it always

// ---------------------------------------------------------------------------
// Reading weights as f32 (f16 widened by FCVTL, bf16 by a 16-bit shift) and
// rounding them to a narrower storage format.
// ---------------------------------------------------------------------------

[[gnu::always_inline]] inline float32x4_t f16x4_to_f32(const std::uint16_t* p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
[[gnu::always_inline]] inline float32x4_t bf16x4_to_f32(uint16x4_t h) {
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

// RNE on the dropped 16 bits (overflow carries into inf); NaN stays NaN with
// the quiet bit set — avx2::round_bf16x8's arithmetic.
[[gnu::always_inline]] inline float32x4_t round_bf16x4(float32x4_t v) {
    const uint32x4_t b = vreinterpretq_u32_f32(v);
    const uint32x4_t hi_mask = vdupq_n_u32(0xffff0000u);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(b, 16), vdupq_n_u32(1));
    const uint32x4_t rounded = vandq_u32(vaddq_u32(b, vaddq_u32(vdupq_n_u32(0x7fff), lsb)), hi_mask);
    const uint32x4_t quiet = vorrq_u32(vandq_u32(b, hi_mask), vdupq_n_u32(0x00400000));
    const uint32x4_t is_num = vceqq_f32(v, v);
    return vreinterpretq_f32_u32(vbslq_u32(is_num, rounded, quiet));
}
[[gnu::always_inline]] inline float32x4_t round_f16x4(float32x4_t v) { return vcvt_f32_f16(vcvt_f16_f32(v)); }

template <WeightRounding R>
[[gnu::always_inline]] inline vf8 round_w(vf8 v) {
    if constexpr (R == WeightRounding::f16) return {round_f16x4(v.lo), round_f16x4(v.hi)};
    else if constexpr (R == WeightRounding::bf16) return {round_bf16x4(v.lo), round_bf16x4(v.hi)};
    else return v;
}

// Eight consecutive weights w[i … i+7] as f32.
template <WeightFormat F, WeightRounding R>
[[gnu::always_inline]] inline vf8 load8(const void* w, i64 i) {
    vf8 v;
    if constexpr (F == WeightFormat::f32) {
        v = vload(static_cast<const float*>(w) + i);
    } else {
        const std::uint16_t* p = static_cast<const std::uint16_t*>(w) + i;
        if constexpr (F == WeightFormat::f16) {
            v = {f16x4_to_f32(p), f16x4_to_f32(p + 4)};
        } else {
            const uint16x8_t h = vld1q_u16(p);
            v = {bf16x4_to_f32(vget_low_u16(h)), bf16x4_to_f32(vget_high_u16(h))};
        }
    }
    return round_w<R>(v);
}

// One weight w[i] as f32, through the same instructions as load8.
template <WeightFormat F, WeightRounding R>
inline float load1(const void* w, i64 i) {
    float32x4_t v;
    if constexpr (F == WeightFormat::f32) {
        v = vdupq_n_f32(static_cast<const float*>(w)[i]);
    } else {
        const uint16x4_t h = vdup_n_u16(static_cast<const std::uint16_t*>(w)[i]);
        v = F == WeightFormat::f16 ? vcvt_f32_f16(vreinterpret_f16_u16(h)) : bf16x4_to_f32(h);
    }
    const vf8 r = round_w<R>(vf8{v, v});
    return vgetq_lane_f32(r.lo, 0);
}

// 4×4 transpose: on return a[j] holds column j of the four rows.
[[gnu::always_inline]] inline void transpose4(float32x4_t& a0, float32x4_t& a1, float32x4_t& a2, float32x4_t& a3) {
    const float32x4_t t0 = vtrn1q_f32(a0, a1), t1 = vtrn2q_f32(a0, a1);  // r0[0] r1[0] r0[2] r1[2] | r0[1] r1[1] …
    const float32x4_t t2 = vtrn1q_f32(a2, a3), t3 = vtrn2q_f32(a2, a3);
    a0 = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    a1 = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    a2 = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    a3 = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

// In-register 8×8 transpose: on return r[j] holds column j (lane i = old r[i][j]).
[[gnu::always_inline]] inline void transpose8(vf8 r[8]) {
    // Four 4×4 blocks: [A B; C D] → [Aᵀ Cᵀ; Bᵀ Dᵀ].
    transpose4(r[0].lo, r[1].lo, r[2].lo, r[3].lo);  // A: rows 0-3, columns 0-3
    transpose4(r[0].hi, r[1].hi, r[2].hi, r[3].hi);  // B: rows 0-3, columns 4-7
    transpose4(r[4].lo, r[5].lo, r[6].lo, r[7].lo);  // C: rows 4-7, columns 0-3
    transpose4(r[4].hi, r[5].hi, r[6].hi, r[7].hi);  // D: rows 4-7, columns 4-7
    for (int j = 0; j < 4; ++j) {
        const float32x4_t b = r[j].hi;  // column j of rows 4-7 is Cᵀ's row j; column 4+j of rows 0-3 is Bᵀ's row j
        r[j].hi = r[4 + j].lo;
        r[4 + j].lo = b;
    }
}

// f32 only: the 8×4 block w[row … row+7, k … k+3] transposed into r[0..3].
template <WeightRounding R>
[[gnu::always_inline]] inline void load_transposed4_f32(const float* w, i64 row, i64 k_count, i64 k, vf8 r[4]) {
    const float* base = w + row * k_count + k;
    float32x4_t a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = vld1q_f32(base + i * k_count);
    transpose4(a[0], a[1], a[2], a[3]);
    transpose4(a[4], a[5], a[6], a[7]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) r[j] = round_w<R>(vf8{a[j], a[4 + j]});
}

// Panels of the packed decode GEMV (avx2_load.hpp's store_panel8/1).
template <WeightFormat P>
inline void store_panel8(void* dst, vf8 c) {
    if constexpr (P == WeightFormat::f32) {
        vstore(static_cast<float*>(dst), c);
    } else if constexpr (P == WeightFormat::f16) {
        vst1q_u16(static_cast<std::uint16_t*>(dst),
                  vreinterpretq_u16_f16(vcombine_f16(vcvt_f16_f32(c.lo), vcvt_f16_f32(c.hi))));
    } else {  // the upper halves: the value is a bf16 value, the lower half is zero
        vst1q_u16(static_cast<std::uint16_t*>(dst), vcombine_u16(vshrn_n_u32(vreinterpretq_u32_f32(c.lo), 16),
                                                                vshrn_n_u32(vreinterpretq_u32_f32(c.hi), 16)));
    }
}
template <WeightFormat P>
inline void store_panel1(void* dst, float v) {
    if constexpr (P == WeightFormat::f32) {
        *static_cast<float*>(dst) = v;
    } else if constexpr (P == WeightFormat::f16) {
        const uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(v)));
        *static_cast<std::uint16_t*>(dst) = vget_lane_u16(h, 0);
    } else {
        std::uint32_t u;
        std::memcpy(&u, &v, 4);
        *static_cast<std::uint16_t*>(dst) = static_cast<std::uint16_t>(u >> 16);
    }
}

// No wider tile on AArch64 AdvSIMD (SVE would be its own file).
inline bool wide_tile(int, i64, const float*, const float*, float*, i64, bool) { return false; }
inline bool wide_gemv_group(int, WeightFormat, const float*, const void*, float*, i64, i64, i64, i64) { return false; }
inline i64 wide_pv_row(WeightRounding, const float*, i64, const float*, i64, float*, bool) { return 0; }
constexpr bool kHasWideF64Tile = false;
inline void wide_f64_tile(int, const double*, i64, const double*, i64, double*, i64, i64, bool) {}

}  // namespace kvasir::kernels::neon

// What the kernels derive from the vocabulary, in this ISA's namespace.
#define KVASIR_FMA_ISA neon
#include "kernels/cpu/simd_derived.hpp"
