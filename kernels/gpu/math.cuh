// Scalar math shared by the GPU kernels AND compiled on the host by the tests.
// What makes it different: exp, log1p, sin/cos, sqrt and the f16/bf16 rounding are
// kvasir's own sequences of IEEE +, ×, fma, rint and bit operations (sqrtf only
// seeds an exact correction), so nvcc, hipcc and g++ get the same bits from them.
//
// Why own transcendentals: CUDA's expf (libdevice) and ROCm's expf (ocml) are
// different polynomials; with them the cuda and hip backends would disagree
// in the last bit of every softmax and swiglu. With these they agree, and
// tests/backend/test_gpu.cpp checks every function here on the CPU, bit for
// bit against kvasir::round_to and within ulp bounds against libm, which is
// what lets the device numerics be verified on a machine without a GPU.
//
// Requirements on the compiler (set by cmake/KvasirGpu.cmake): no FMA
// contraction (nvcc --fmad=false, hipcc/g++ -ffp-contract=off) so that the
// only fused operations are the explicit fmaf/fma calls below; no flush to
// zero; IEEE division and square root.
//
// Reading guide: kg_expf ↔ std::exp, kg_log1pf ↔ std::log1p, kg_sincosf ↔ std::sin/std::cos, kg_sqrtf ↔ std::sqrt,
// kg_round_f16/kg_round_bf16 ↔ kvasir::round_to (lib/kvasir/core/dtype.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KG_HD __host__ __device__ inline
#else
#define KG_HD inline
#endif

// The namespace of everything compiled for one vendor: kvasir::gpu_cuda,
// kvasir::gpu_hip (set by vendor.hpp), kvasir::gpu_host for host-only users.
// Distinct names let both vendors' objects link into one binary.
#ifndef KG_NS
#define KG_NS gpu_host
#endif

namespace kvasir::KG_NS {

// Storage formats as kernels see them (an int kernel argument).
enum StorageCode : int { kStoreF32 = 0, kStoreF16 = 1, kStoreBF16 = 2 };

// Bit reinterpretation. A union is used rather than memcpy/bit_cast because it
// is the one spelling that gcc, clang (HIP) and nvcc all accept in host and
// device code alike; gcc and clang document union punning as supported.
KG_HD std::uint32_t kg_bits(float x) {
    union { float f; std::uint32_t u; } v;
    v.f = x;
    return v.u;
}
KG_HD float kg_float(std::uint32_t u) {
    union { float f; std::uint32_t u; } v;
    v.u = u;
    return v.f;
}
KG_HD std::uint64_t kg_bits64(double x) {
    union { double f; std::uint64_t u; } v;
    v.f = x;
    return v.u;
}
KG_HD double kg_double(std::uint64_t u) {
    union { double f; std::uint64_t u; } v;
    v.u = u;
    return v.f;
}

// --- storage rounding ----------------------------------------------------------

// Nearest f16 value (RNE, overflow to ±inf, gradual underflow), as a float.
// Normal range: drop 13 fraction bits with round-half-even on the bit pattern
// (a carry correctly bumps the exponent). Below 2^-14 the f16 grid is the
// fixed quantum 2^-24, where scaling by 2^24 is exact and rintf rounds RNE.
KG_HD float kg_round_f16(float x) {
    const std::uint32_t u = kg_bits(x);
    const std::uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
    if (mag >= 0x7f800000u) return x;                        // ±inf, NaN
    if (mag >= 0x477ff000u) return kg_float(sign | 0x7f800000u);  // ≥ 65520 = 65504 + half an ulp (tie goes up to 2^16)
    if (mag < 0x38800000u) return rintf(x * 0x1p24f) * 0x1p-24f;  // below 2^-14: f16 subnormal grid
    const std::uint32_t r = (mag + 0x0fffu + ((mag >> 13) & 1u)) & ~0x1fffu;
    return kg_float(sign | r);
}

// Nearest bf16 value as a float: drop 16 fraction bits, RNE. bf16 has the f32
// exponent range, so subnormals and overflow to inf fall out of the carry.
KG_HD float kg_round_bf16(float x) {
    const std::uint32_t u = kg_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return kg_float(u | 0x00400000u);  // NaN stays NaN (quiet)
    return kg_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

// Nearest f16 value of a double, as a double: the f16-accumulation step
// acc = round_f16(acc + x·w), evaluated exactly as the CPU emulation does
// (kernels/cpu/f16_round.hpp) so that cuda:acc=f16 equals cpu:acc=f16 bit for bit.
KG_HD double kg_round_f16(double x) {
    const std::uint64_t u = kg_bits64(x);
    const std::uint64_t sign = u & 0x8000000000000000ull, mag = u & 0x7fffffffffffffffull;
    if (mag >= 0x7ff0000000000000ull) return x;                              // ±inf, NaN
    if (mag >= 0x40effe0000000000ull) return kg_double(sign | 0x7ff0000000000000ull);  // ≥ 65520
    if (mag < 0x3f10000000000000ull) return rint(x * 0x1p24) * 0x1p-24;     // below 2^-14
    const std::uint64_t r = (mag + 0x1ffffffffffull + ((mag >> 42) & 1u)) & ~0x3ffffffffffull;
    return kg_double(sign | r);
}

// A value as a device of this storage format holds it.
KG_HD float kg_store(float x, int storage) {
    return storage == kStoreF16 ? kg_round_f16(x) : storage == kStoreBF16 ? kg_round_bf16(x) : x;
}

// --- sqrt ----------------------------------------------------------------------

// The correctly rounded √x from an approximation within 1 ulp. Why: CUDA's
// sqrtf is correctly rounded (-prec-sqrt=true), but clang 15 lowers HIP's
// sqrtf to v_sqrt_f32 (1 ulp) whatever the flags; this makes both exact.
// The test is exact in double: a float's neighbours' midpoint m has 25
// significant bits, so m² (≤ 50 bits) is exact, and √x of a float is never
// a midpoint itself, so no tie can arise.
KG_HD float kg_sqrt_fixup(float x, float approx) {
    if (!(x > 0.0f) || !(x < INFINITY)) return approx;  // 0, -0, negative, inf, NaN: the approximation is exact
    const double xd = x;
    float y = approx;
    for (int step = 0; step < 2; ++step) {
        const double yd = y;
        const double up = (yd + static_cast<double>(kg_float(kg_bits(y) + 1u))) * 0.5;
        const double down = (yd + static_cast<double>(kg_float(kg_bits(y) - 1u))) * 0.5;
        if (up * up < xd)
            y = kg_float(kg_bits(y) + 1u);
        else if (down * down > xd)
            y = kg_float(kg_bits(y) - 1u);
        else
            break;
    }
    return y;
}

KG_HD float kg_sqrtf(float x) { return kg_sqrt_fixup(x, sqrtf(x)); }

// --- exp -----------------------------------------------------------------------

// e^x in f32, within 1 ulp (test: GpuMath.ExpWithinOneUlp).
//   x = k·ln2 + r, |r| ≤ ln2/2: k = rint(x·log2 e); r = x - k·LN2_HI is exact
//   (both are multiples of 2^-24 and |r| < 1/2), the second fma adds the
//   low part of ln 2 with one rounding.
//   e^r = 1 + r + r²·p(r), p the Taylor polynomial to r^6/8! (truncation
//   < 0.01 ulp on |r| ≤ 0.35), evaluated by Horner with fma.
//   2^k is applied as two exact power-of-two factors so that overflow gives
//   inf and underflow is rounded once into the subnormals.
KG_HD float kg_expf(float x) {
    if (!(x == x)) return x + x;  // NaN
    x = fminf(fmaxf(x, -104.0f), 89.0f);  // e^-104 < half the least subnormal; e^89 > FLT_MAX
    const float k = rintf(x * 1.44269502162933349609375f);
    float r = fmaf(-k, 0.693145751953125f, x);   // ln 2 high part (16 significant bits)
    r = fmaf(-k, 1.42860682030941723212e-06f, r);  // ln 2 - high part
    float p = 1.0f / 40320.0f;
    p = fmaf(p, r, 1.0f / 5040.0f);
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    const float e = 1.0f + fmaf(p, r * r, r);
    const int ki = static_cast<int>(k);
    const int k1 = ki / 2, k2 = ki - k1;  // each in [-75, 65]: both factors are normal floats
    return e * kg_float(static_cast<std::uint32_t>(k1 + 127) << 23) * kg_float(static_cast<std::uint32_t>(k2 + 127) << 23);
}

// --- log1p -----------------------------------------------------------------------

// log(1 + y) of an f32 y (softplus of the Gated DeltaNet decay), rounded from
// a double evaluation like kg_sincosf: the same bits on every vendor and
// within 0.5 ulp (+ε) of the true value (test: GpuMath.Log1pWithinHalfUlp).
//   u = 1 + y in double, exact for 2^-29 ≤ |y| (a float has 24 significant
//   bits); below that, c = y - (u - 1) is the exact remainder (|y| ≤ 1, so
//   u - 1 is exact) and log(u + c) = log u + c/u to far below an f32 ulp.
//   u = m·2^k with m in [√½, √2): f = m - 1 is exact (Sterbenz),
//   log m = 2·atanh(s), s = f/(2 + f), |s| ≤ 0.1716, by its odd series to
//   s^23/23 (the first term left out, 2s·s^24/25, is below 2^-60 of 2s),
//   Horner in fma.
//   k·ln 2 + log m never cancels by more than a factor 2 (|log m| ≤ ln2/2).
KG_HD float kg_log1pf(float y) {
    if (!(y > -1.0f)) return y == -1.0f ? -INFINITY : (y == y ? NAN : y + y);  // -1, below -1, NaN
    if (y == 0.0f || y == INFINITY) return y;  // ±0 keeps its sign, as libm's
    const double yd = y;
    const double u = 1.0 + yd;
    const double c = yd <= 1.0 ? yd - (u - 1.0) : 0.0;  // exact remainder; 0 whenever 1 + y is exact
    const std::uint64_t bits = kg_bits64(u);            // u ≥ 2^-24: a normal double
    int k = static_cast<int>((bits >> 52) & 0x7ffu) - 1023;
    double m = kg_double((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
    if (m > 1.4142135623730951) {
        m *= 0.5;
        k += 1;
    }
    const double f = m - 1.0;
    const double s = f / (2.0 + f);
    const double z = s * s;
    double p = 1.0 / 23.0;
    p = fma(p, z, 1.0 / 21.0);
    p = fma(p, z, 1.0 / 19.0);
    p = fma(p, z, 1.0 / 17.0);
    p = fma(p, z, 1.0 / 15.0);
    p = fma(p, z, 1.0 / 13.0);
    p = fma(p, z, 1.0 / 11.0);
    p = fma(p, z, 1.0 / 9.0);
    p = fma(p, z, 1.0 / 7.0);
    p = fma(p, z, 1.0 / 5.0);
    p = fma(p, z, 1.0 / 3.0);
    const double log_m = fma(2.0 * s * z, p, 2.0 * s);
    const double r = fma(static_cast<double>(k), 0.69314718055994530942, log_m) + c / u;
    return static_cast<float>(r);
}

// --- sin / cos -------------------------------------------------------------------

// sin and cos of an f32 angle (rope), rounded from a double evaluation: the
// reduction by π/2 and both Taylor polynomials run in f64, which every GPU
// executes in IEEE arithmetic, so the result is the nearly correctly rounded
// f32 value on every vendor. Exact reduction for |angle| < 2^30 (positions ×
// inverse frequency stay far below); beyond that the error grows with |angle|.
KG_HD void kg_sincosf(float angle, float* s_out, float* c_out) {
    const double x = angle;
    if (!(x - x == 0.0)) {  // inf or NaN
        *s_out = *c_out = angle - angle;
        return;
    }
    const double k = rint(x * 0.63661977236758134308);  // x · 2/π
    double r = fma(-k, 1.5707963267948965580, x);        // π/2 rounded to double: exact step
    r = fma(-k, 6.123233995736766036e-17, r);            // π/2 - the above
    const double z = r * r;
    // Taylor coefficients (-1)^n / (2n+1)! and (-1)^n / (2n)!, to r^17 and r^18.
    double ps = -1.0 / 355687428096000.0;                // -1/17!
    ps = fma(ps, z, 1.0 / 1307674368000.0);
    ps = fma(ps, z, -1.0 / 6227020800.0);
    ps = fma(ps, z, 1.0 / 39916800.0);
    ps = fma(ps, z, -1.0 / 362880.0);
    ps = fma(ps, z, 1.0 / 5040.0);
    ps = fma(ps, z, -1.0 / 120.0);
    ps = fma(ps, z, 1.0 / 6.0);
    const double sn = r - r * z * ps;
    double pc = 1.0 / 6402373705728000.0;                // 1/18!
    pc = fma(pc, z, -1.0 / 20922789888000.0);
    pc = fma(pc, z, 1.0 / 87178291200.0);
    pc = fma(pc, z, -1.0 / 479001600.0);
    pc = fma(pc, z, 1.0 / 3628800.0);
    pc = fma(pc, z, -1.0 / 40320.0);
    pc = fma(pc, z, 1.0 / 720.0);
    pc = fma(pc, z, -1.0 / 24.0);
    pc = fma(pc, z, 0.5);
    const double cs = 1.0 - z * pc;
    const long long q = static_cast<long long>(k) & 3;
    const double s = q == 0 ? sn : q == 1 ? cs : q == 2 ? -sn : -cs;
    const double c = q == 0 ? cs : q == 1 ? -sn : q == 2 ? -cs : sn;
    *s_out = static_cast<float>(s);
    *c_out = static_cast<float>(c);
}

}  // namespace kvasir::KG_NS
