// The arithmetic of kvasir-rng/1 (rng.hpp has the definition), written once:
// the scalar SeededStream path (rng.cpp) and the tensor fill's block kernel,
// which rng.cpp, rng_avx2.cpp and rng_avx512.cpp each compile for their ISA.
// Everything here has internal linkage: an
// inline function compiled with -mavx512f must not become the one copy the
// linker keeps for every CPU (tests/layout/check_isa_objects.py).
//
// Only +, -, *, /, sqrt, exact conversions and bit manipulation, in the
// definition's order, under -ffp-contract=off: every ISA, lane by lane, gives
// the bits of the scalar path (test_rng: the fill against SeededStream, and
// the lane-wise Philox against Random123's).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace kvasir::rng_detail {
namespace {

// det_log reduces x to m*2^k with m in [kSqrtHalf, 2*kSqrtHalf). The boundary
// only picks between two equally accurate reductions; it must merely be the
// same constant in every implementation.
constexpr double kSqrtHalf = 0x1.6a09e667f3bcdp-1;
// ln 2 truncated to 32 significant bits: k*kLn2Hi is exact for |k| < 2^21.
constexpr double kLn2Hi = 0x1.62e42feep-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
// 2/(2j+1), j = 1..11, each the nearest double: the atanh series of
// log((1+s)/(1-s)) = 2s + sum 2 s^(2j+1)/(2j+1). With |s| <= 0.1716 the first
// dropped term is < 1e-18 relative, far below half an ulp.
constexpr double kL[11] = {
    0x1.5555555555555p-1, 0x1.999999999999ap-2, 0x1.2492492492492p-2, 0x1.c71c71c71c71cp-3,
    0x1.745d1745d1746p-3, 0x1.3b13b13b13b14p-3, 0x1.1111111111111p-3, 0x1.e1e1e1e1e1e1ep-4,
    0x1.af286bca1af28p-4, 0x1.8618618618618p-4, 0x1.642c8590b2164p-4,
};

// Taylor coefficients of sin(2 pi f) and cos(2 pi f) in powers of f, i.e.
// (-1)^j (2 pi)^n / n!, each the nearest double. |2 pi f| <= pi/4, so the
// first dropped terms (n = 21, 22) are < 1e-20 relative. The leading product
// f*2pi would dominate the error, so 2 pi is split into a 20-bit head, whose
// product with any f on the 2^-33 grid of uniform() is exact, and a tail.
constexpr double kTwoPiHead = 0x1.921fap+2;
constexpr double kTwoPiTail = 0x1.54442d184698ap-18;
constexpr double kS[9] = {
    -0x1.4abbce625be53p+5, 0x1.466bc6775aae2p+6,  -0x1.32d2cce62bd86p+6,
    0x1.50783487ee782p+5,  -0x1.e3074fde8871fp+3, 0x1.e8f434d018d63p+1,
    -0x1.6fadb9f155744p-1, 0x1.aaec32af93359p-4,  -0x1.8a404211f9547p-7,
};  // n = 3, 5, ..., 19
constexpr double kC[10] = {
    -0x1.3bd3cc9be45dep+4, 0x1.03c1f081b5ac4p+6, -0x1.55d3c7e3cbffap+6, 0x1.e1f506891babbp+5,
    -0x1.a6d1f2a204a8cp+4, 0x1.f9d38a3763cc3p+2, -0x1.b6e24f44b128fp+0, 0x1.20c62c2f2d7f5p-2,
    -0x1.2a0c591af8314p-5, 0x1.ef6e308d6d1c4p-9,
};  // n = 2, 4, ..., 20

// Philox4x32-10's constants (rng.cpp checks them against Random123's).
constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

inline double uniform_of(std::uint32_t bits) noexcept { return (static_cast<double>(bits) + 0.5) * 0x1p-32; }

// log(m * 2^k) for m in [kSqrtHalf, 2*kSqrtHalf); shared by the scalar and the
// batched paths so the two cannot drift apart.
inline double log_reduced(double m, double dk) noexcept {
    const double f = m - 1.0;  // exact (Sterbenz)
    const double s = f / (2.0 + f);
    const double z = s * s;
    const double hfsq = 0.5 * f * f;
    // Horner, innermost coefficient first (written out: the order of the
    // operations is part of the definition, and it lets the batch vectorise).
    const double p = kL[0] + z * (kL[1] + z * (kL[2] + z * (kL[3] + z * (kL[4] + z * (kL[5] + z * (kL[6] +
                     z * (kL[7] + z * (kL[8] + z * (kL[9] + z * kL[10])))))))));
    const double R = z * p;
    // log(1+f) = f - hfsq + s*(hfsq + R): f is exact and carries the bulk, the
    // small corrections are rounded at their own (smaller) magnitude.
    return dk * kLn2Hi + (f - (hfsq - (s * (hfsq + R) + dk * kLn2Lo)));
}

// log of a positive normal x times 2^k_offset: the frexp-style reduction
// (exact) by bit manipulation, then log_reduced. The biased exponent becomes a
// double by the 2^52 trick, which vectorises where int64->double would not.
inline double log_positive_normal(double x, double k_offset) noexcept {
    const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
    const double biased = std::bit_cast<double>(0x4330000000000000ull | (bits >> 52)) - 0x1p52;
    const double mf = std::bit_cast<double>((bits & 0x000fffffffffffffull) | (std::uint64_t{1022} << 52));
    // mf in [0.5, 1): x = mf * 2^(biased - 1022). Below kSqrtHalf the
    // mantissa is doubled: m = mf * 2 and k - 1, else m = mf * 1 (exact). The
    // test compares bit patterns (positive doubles order as integers) and the
    // factor is built from it, not selected: AVX2 vectorises neither a
    // floating-point compare feeding a select nor a guarded product (the
    // values are those of the plain "mf < kSqrtHalf ? 2 mf : mf").
    const std::int64_t below = std::bit_cast<std::int64_t>(mf) < std::bit_cast<std::int64_t>(kSqrtHalf);
    const double factor = std::bit_cast<double>(std::bit_cast<std::uint64_t>(1.0) + (static_cast<std::uint64_t>(below) << 52));
    const double m = mf * factor;
    const double dk = ((biased - 1022.0) + k_offset) - (factor - 1.0);  // small integers: exact
    return log_reduced(m, dk);
}

// sin and cos of 2 pi f for |f| <= 1/8, then rotated by quadrant q (mod 4).
// The rotation is written with selects and exact sign flips so that the
// batched loop stays branch-free.
inline void sincos_reduced(double f, std::int64_t q, double& sin_out, double& cos_out) noexcept {
    const double z = f * f;
    const double ps = kS[0] + z * (kS[1] + z * (kS[2] + z * (kS[3] + z * (kS[4] + z * (kS[5] + z * (kS[6] +
                      z * (kS[7] + z * kS[8])))))));
    const double sn = f * kTwoPiHead + f * (kTwoPiTail + z * ps);
    const double pc = kC[0] + z * (kC[1] + z * (kC[2] + z * (kC[3] + z * (kC[4] + z * (kC[5] + z * (kC[6] +
                      z * (kC[7] + z * (kC[8] + z * kC[9]))))))));
    const double cs = 1.0 + z * pc;
    const bool swap = (q & 1) != 0;
    const double s = swap ? cs : sn;
    const double c = swap ? sn : cs;
    sin_out = (q & 2) != 0 ? -s : s;
    cos_out = ((q + 1) & 2) != 0 ? -c : c;
}

// The fill's kernel: blocks [b0, b0 + count) of stream `stream` under `seed`,
// as doubles, out[4·(b − b0) + lane] = a + scale·draw (draw: the normal or
// the uniform of that element). kLanes blocks at a time, structure of
// arrays so each step below is one vector operation across blocks.
constexpr int kLanes = 16;

// a + scale·(the pair's two normals) of kLanes blocks, from their words wa, wb.
inline void box_muller(const std::uint32_t (&wa)[kLanes], const std::uint32_t (&wb)[kLanes], double a, double scale,
                       double (&first)[kLanes], double (&second)[kLanes]) noexcept {
    for (int j = 0; j < kLanes; ++j) {
        const double ua = uniform_of(wa[j]), ub = uniform_of(wb[j]);
        const double r = std::sqrt(-2.0 * log_positive_normal(ua, 0.0));  // ua >= 2^-33: normal, positive
        const auto q = static_cast<std::int32_t>(4.0 * ub + 0.5);          // positive: truncation is floor
        const double f = ub - static_cast<double>(q) * 0.25;
        double sn = 0, cs = 0;
        sincos_reduced(f, q, sn, cs);
        first[j] = a + scale * (r * cs);
        second[j] = a + scale * (r * sn);
    }
}

inline void draw_blocks_kernel(std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                    std::uint64_t count, double* out) noexcept {
    const auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
    const auto s0 = static_cast<std::uint32_t>(stream), s1 = static_cast<std::uint32_t>(stream >> 32);
    for (std::uint64_t done = 0; done < count; done += kLanes) {
        // Philox4x32-10 on kLanes counters (b, b >> 32, s0, s1).
        std::uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
        for (int j = 0; j < kLanes; ++j) {
            const std::uint64_t b = b0 + done + static_cast<std::uint64_t>(j);
            c0[j] = static_cast<std::uint32_t>(b);
            c1[j] = static_cast<std::uint32_t>(b >> 32);
            c2[j] = s0;
            c3[j] = s1;
        }
        std::uint32_t key0 = k0, key1 = k1;
        for (int round = 0; round < 10; ++round) {
            std::uint32_t n0[kLanes], n1[kLanes], n2[kLanes], n3[kLanes];
            for (int j = 0; j < kLanes; ++j) {
                const std::uint64_t p0 = std::uint64_t{kPhiloxM0} * c0[j], p1 = std::uint64_t{kPhiloxM1} * c2[j];
                n0[j] = static_cast<std::uint32_t>(p1 >> 32) ^ c1[j] ^ key0;
                n1[j] = static_cast<std::uint32_t>(p1);
                n2[j] = static_cast<std::uint32_t>(p0 >> 32) ^ c3[j] ^ key1;
                n3[j] = static_cast<std::uint32_t>(p0);
            }
            for (int j = 0; j < kLanes; ++j) {
                c0[j] = n0[j];
                c1[j] = n1[j];
                c2[j] = n2[j];
                c3[j] = n3[j];
            }
            key0 += kPhiloxW0;
            key1 += kPhiloxW1;
        }
        double v[4][kLanes];
        if (normal) {
            // Box–Muller on lane pairs (0,1) and (2,3) of each block.
            box_muller(c0, c1, a, scale, v[0], v[1]);
            box_muller(c2, c3, a, scale, v[2], v[3]);
        } else {
            for (int j = 0; j < kLanes; ++j) v[0][j] = a + scale * uniform_of(c0[j]);
            for (int j = 0; j < kLanes; ++j) v[1][j] = a + scale * uniform_of(c1[j]);
            for (int j = 0; j < kLanes; ++j) v[2][j] = a + scale * uniform_of(c2[j]);
            for (int j = 0; j < kLanes; ++j) v[3][j] = a + scale * uniform_of(c3[j]);
        }
        const std::uint64_t n = count - done < kLanes ? count - done : kLanes;
        double* o = out + 4 * done;
        for (std::uint64_t j = 0; j < n; ++j)
            for (int l = 0; l < 4; ++l) o[4 * j + static_cast<std::uint64_t>(l)] = v[l][j];
    }
}

}  // namespace

// draw_blocks_kernel compiled for AVX2 (rng_avx2.cpp) and AVX-512
// (rng_avx512.cpp); rng.cpp calls the one cpu_isa() picks.
using DrawBlocks = void (*)(std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                            std::uint64_t count, double* out) noexcept;
void draw_blocks_avx2(std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                      std::uint64_t count, double* out) noexcept;
void draw_blocks_avx512(std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                        std::uint64_t count, double* out) noexcept;

}  // namespace kvasir::rng_detail
