// dtype conversions against hand-computed bit patterns, exhaustive sweeps over
// every f16/bf16 pattern and every rounding boundary, and an independent
// integer-arithmetic rounding reference (plus the compiler's _Float16 where it
// exists) on millions of random values.
#include "kvasir/core/dtype.hpp"

#include <gtest/gtest.h>

#include <vector>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

namespace {

using kvasir::DType;
using kvasir::round_to_fp8_e4m3;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::uint16_t h(float x) { return kvasir::f32_to_f16_bits(x); }
std::uint16_t b(float x) { return kvasir::f32_to_bf16_bits(x); }
float f32(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits32(float x) { return std::bit_cast<std::uint32_t>(x); }
bool f16_is_nan(std::uint16_t v) { return (v & 0x7c00u) == 0x7c00u && (v & 0x3ffu) != 0; }
bool bf16_is_nan(std::uint16_t v) { return (v & 0x7f80u) == 0x7f80u && (v & 0x7fu) != 0; }
bool same_double(double a, double c) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(c); }

// Independent reference: round a double to `precision` significand bits with
// minimum normal exponent emin (gradual underflow below) and overflow at
// 2^(emax+1), by shifting the integer significand — no nearbyint, no division.
double ref_round(double x, int precision, int emin, int emax) {
    if (!std::isfinite(x) || x == 0.0) return x;
    int e = 0;
    const double m = std::frexp(std::fabs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
    const auto M = static_cast<std::uint64_t>(std::ldexp(m, 53));  // |x| = M 2^(e-53), exact
    const int qe = std::max(e - 1, emin) - (precision - 1);        // exponent of the target quantum
    const int shift = qe - (e - 53);
    double r = 0.0;
    if (shift <= 0) {
        r = std::fabs(x);
    } else if (shift <= 60) {
        std::uint64_t q = M >> shift;
        const std::uint64_t rem = M & ((std::uint64_t{1} << shift) - 1);
        const std::uint64_t half = std::uint64_t{1} << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) ++q;
        r = std::ldexp(static_cast<double>(q), qe);
    }  // else: below a quarter quantum, rounds to zero
    if (r >= std::ldexp(1.0, emax + 1)) r = kInf;
    return std::copysign(r, x);
}
double ref_f16(double x) { return ref_round(x, 11, -14, 15); }
double ref_bf16(double x) { return ref_round(x, 8, -126, 127); }

// --- names and sizes ---------------------------------------------------------------

TEST(DType, NamesSizesParse) {
    EXPECT_EQ(kvasir::dtype_size(DType::f64), 8u);
    EXPECT_EQ(kvasir::dtype_size(DType::f32), 4u);
    EXPECT_EQ(kvasir::dtype_size(DType::f16), 2u);
    EXPECT_EQ(kvasir::dtype_size(DType::bf16), 2u);
    EXPECT_EQ(kvasir::dtype_size(DType::i32), 4u);
    for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i32})
        EXPECT_EQ(kvasir::parse_dtype(kvasir::dtype_name(t)), t);
    EXPECT_EQ(kvasir::parse_dtype("BF16"), DType::bf16);
    EXPECT_FALSE(kvasir::parse_dtype("f8").has_value());
    EXPECT_FALSE(kvasir::parse_dtype("").has_value());
    EXPECT_FALSE(kvasir::dtype_is_float(DType::i32));
    EXPECT_TRUE(kvasir::dtype_is_float(DType::bf16));
}

// --- f16 --------------------------------------------------------------------------

TEST(F16, HandComputedValues) {
    EXPECT_EQ(h(1.0f), 0x3c00);
    EXPECT_EQ(h(-2.0f), 0xc000);
    EXPECT_EQ(h(0.5f), 0x3800);
    EXPECT_EQ(h(65504.0f), 0x7bff);              // largest finite
    EXPECT_EQ(h(0x1p-14f), 0x0400);              // smallest normal
    EXPECT_EQ(h(0x1p-14f - 0x1p-24f), 0x03ff);   // largest subnormal
    EXPECT_EQ(h(0x1p-24f), 0x0001);              // smallest subnormal
    EXPECT_EQ(h(-0x1p-24f), 0x8001);
    EXPECT_EQ(h(0.1f), 0x2e66);                  // 0.0999755859375
    EXPECT_EQ(h(3.14159265f), 0x4248);           // 3.140625
    EXPECT_EQ(h(1.0f / 3.0f), 0x3555);           // 0.333251953125
    EXPECT_EQ(h(0.0f), 0x0000);
    EXPECT_EQ(h(-0.0f), 0x8000);
}

TEST(F16, RoundToNearestEvenTies) {
    EXPECT_EQ(h(1.0f + 0x1p-11f), 0x3c00);               // tie, 1.0 is even
    EXPECT_EQ(h(1.0f + 3 * 0x1p-11f), 0x3c02);           // tie, 1+2^-9 is even
    EXPECT_EQ(h(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);    // just above the tie
    EXPECT_EQ(h(1.0f + 3 * 0x1p-11f - 0x1p-20f), 0x3c01);  // just below the tie
    EXPECT_EQ(h(2049.0f), 0x6800);                       // tie between 2048 and 2050
    EXPECT_EQ(h(2051.0f), 0x6802);                       // tie between 2050 and 2052
    EXPECT_EQ(h(0x1p-25f), 0x0000);                      // half the smallest subnormal: to even (zero)
    EXPECT_EQ(h(-0x1p-25f), 0x8000);                     // ... keeping the sign
    EXPECT_EQ(h(0x1.000002p-25f), 0x0001);               // a hair above it
    EXPECT_EQ(h(3 * 0x1p-25f), 0x0002);                  // 1.5 quanta: to even (2)
    EXPECT_EQ(h(5 * 0x1p-25f), 0x0002);                  // 2.5 quanta: to even (2)
}

TEST(F16, OverflowInfinityNaN) {
    EXPECT_EQ(h(65519.0f), 0x7bff);  // below the midpoint to 2^16
    EXPECT_EQ(h(65520.0f), 0x7c00);  // the midpoint: ties to "even" 2^16, which is inf
    EXPECT_EQ(h(-65520.0f), 0xfc00);
    EXPECT_EQ(h(1e6f), 0x7c00);
    EXPECT_EQ(h(FLT_MAX), 0x7c00);
    EXPECT_EQ(h(INFINITY), 0x7c00);
    EXPECT_EQ(h(-INFINITY), 0xfc00);
    EXPECT_TRUE(f16_is_nan(h(NAN)));
    EXPECT_TRUE(f16_is_nan(h(f32(0x7f800001u))));  // signalling NaN with a payload only in low bits
    EXPECT_TRUE(f16_is_nan(h(f32(0xffc00000u))));
    EXPECT_EQ(h(f32(0xffc00000u)) & 0x8000, 0x8000);  // sign kept
    EXPECT_EQ(h(f32(0x7f800001u)) & 0x0200, 0x0200);  // comes out quiet
}

TEST(F16, ToF32HandComputed) {
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0xc000), -2.0f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x7bff), 65504.0f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x0001), 0x1p-24f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x03ff), 1023 * 0x1p-24f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x0400), 0x1p-14f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x3555), 0.333251953125f);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0x7c00), INFINITY);
    EXPECT_EQ(kvasir::f16_bits_to_f32(0xfc00), -INFINITY);
    EXPECT_TRUE(std::isnan(kvasir::f16_bits_to_f32(0x7e00)));
    EXPECT_TRUE(std::isnan(kvasir::f16_bits_to_f32(0x7c01)));
    EXPECT_EQ(bits32(kvasir::f16_bits_to_f32(0x8000)), 0x80000000u);
}

TEST(F16, ExhaustiveRoundTripAndOrder) {
    float prev = -1.0f;
    for (std::uint32_t v = 0; v <= 0xffff; ++v) {
        const auto hv = static_cast<std::uint16_t>(v);
        const float x = kvasir::f16_bits_to_f32(hv);
        if (f16_is_nan(hv)) {
            ASSERT_TRUE(std::isnan(x)) << std::hex << v;
            ASSERT_TRUE(f16_is_nan(h(x))) << std::hex << v;
            continue;
        }
        ASSERT_EQ(h(x), hv) << std::hex << v;
        ASSERT_EQ(kvasir::round_to_f16(x), static_cast<double>(x)) << std::hex << v;  // representable: unchanged
        if (v <= 0x7c00) {  // positive patterns are ordered like their values
            ASSERT_GT(x, prev) << std::hex << v;
            prev = x;
        }
    }
}

TEST(F16, ExhaustiveRoundingBoundaries) {
    // For every pair of neighbouring positive f16 values, the f32 midpoint (exact:
    // 12 significant bits) goes to the even one, and one f32 step either side
    // goes to the nearer one.
    for (std::uint16_t lo = 0; lo < 0x7bff; ++lo) {
        const auto hi = static_cast<std::uint16_t>(lo + 1);
        const float a = kvasir::f16_bits_to_f32(lo), c = kvasir::f16_bits_to_f32(hi);
        const float mid = (a + c) / 2;
        ASSERT_EQ(mid - a, c - mid);
        ASSERT_EQ(h(mid), (lo & 1) ? hi : lo) << std::hex << lo;
        ASSERT_EQ(h(std::nextafter(mid, 0.0f)), lo) << std::hex << lo;
        ASSERT_EQ(h(std::nextafter(mid, INFINITY)), hi) << std::hex << lo;
        ASSERT_EQ(h(-mid), 0x8000 | ((lo & 1) ? hi : lo)) << std::hex << lo;
    }
    ASSERT_EQ(h(std::nextafter(65520.0f, 0.0f)), 0x7bff);
}

TEST(F16, RoundToF16OnDoubles) {
    EXPECT_EQ(kvasir::round_to_f16(1.0 + 0x1p-11), 1.0);
    EXPECT_EQ(kvasir::round_to_f16(1.0 + 3 * 0x1p-11), 1.0 + 0x1p-9);
    // Just above a tie by less than an f32 ulp: a detour through f32 would round
    // twice and land on 1.0; a single rounding gives 1 + 2^-10.
    EXPECT_EQ(kvasir::round_to_f16(1.0 + 0x1p-11 + 0x1p-40), 1.0 + 0x1p-10);
    EXPECT_EQ(kvasir::round_to_f16(0.1), 0.0999755859375);
    EXPECT_EQ(kvasir::round_to_f16(65504.0), 65504.0);
    EXPECT_EQ(kvasir::round_to_f16(65519.99999), 65504.0);
    EXPECT_EQ(kvasir::round_to_f16(65520.0), kInf);
    EXPECT_EQ(kvasir::round_to_f16(-65520.0), -kInf);
    EXPECT_EQ(kvasir::round_to_f16(1e300), kInf);
    EXPECT_EQ(kvasir::round_to_f16(DBL_MAX), kInf);
    EXPECT_EQ(kvasir::round_to_f16(-kInf), -kInf);
    EXPECT_EQ(kvasir::round_to_f16(0x1p-24), 0x1p-24);
    EXPECT_EQ(kvasir::round_to_f16(0x1p-25), 0.0);
    EXPECT_EQ(kvasir::round_to_f16(0x1p-25 + 0x1p-60), 0x1p-24);
    EXPECT_EQ(kvasir::round_to_f16(3 * 0x1p-25), 0x1p-23);
    EXPECT_EQ(kvasir::round_to_f16(1000.5 * 0x1p-24), 1000 * 0x1p-24);  // subnormal tie to even
    EXPECT_EQ(kvasir::round_to_f16(1001.5 * 0x1p-24), 1002 * 0x1p-24);
    EXPECT_EQ(kvasir::round_to_f16(1e-300), 0.0);
    EXPECT_EQ(kvasir::round_to_f16(0x1p-1074), 0.0);
    EXPECT_TRUE(same_double(kvasir::round_to_f16(-0x1p-26), -0.0));  // underflow keeps the sign
    EXPECT_TRUE(same_double(kvasir::round_to_f16(-0.0), -0.0));
    EXPECT_TRUE(std::isnan(kvasir::round_to_f16(std::nan(""))));
    EXPECT_EQ(kvasir::round_to(DType::f16, 1.0 + 0x1p-11 + 0x1p-40), 1.0 + 0x1p-10);
}

// --- bf16 ---------------------------------------------------------------------------

TEST(BF16, HandComputedValues) {
    EXPECT_EQ(b(1.0f), 0x3f80);
    EXPECT_EQ(b(-1.0f), 0xbf80);
    EXPECT_EQ(b(2.0f), 0x4000);
    EXPECT_EQ(b(3.14159265f), 0x4049);         // 0x40490fdb: dropped half below the tie
    EXPECT_EQ(b(1.0f / 3.0f), 0x3eab);         // 0x3eaaaaab: dropped half above the tie
    EXPECT_EQ(b(-0.0f), 0x8000);
    EXPECT_EQ(b(f32(0x3f808000u)), 0x3f80);    // tie: 1.0 is even
    EXPECT_EQ(b(f32(0x3f818000u)), 0x3f82);    // tie: 0x3f82 is even
    EXPECT_EQ(b(f32(0x3f808001u)), 0x3f81);    // above the tie
    EXPECT_EQ(b(f32(0x3f817fffu)), 0x3f81);    // below the tie
    EXPECT_EQ(b(f32(0x00008000u)), 0x0000);    // subnormal tie to zero
    EXPECT_EQ(b(f32(0x00018000u)), 0x0002);
    EXPECT_EQ(b(f32(0x007fffffu)), 0x0080);    // largest f32 subnormal rounds up to the smallest normal
    EXPECT_EQ(b(f32(0x7f7f7fffu)), 0x7f7f);
    EXPECT_EQ(b(FLT_MAX), 0x7f80);             // 0x7f7fffff rounds past the largest bf16: inf
    EXPECT_EQ(b(INFINITY), 0x7f80);
    EXPECT_EQ(b(-INFINITY), 0xff80);
    EXPECT_TRUE(bf16_is_nan(b(NAN)));
    EXPECT_TRUE(bf16_is_nan(b(f32(0x7f800001u))));  // payload only in the dropped bits: must not become inf
    EXPECT_EQ(b(f32(0xffc00000u)), 0xffc0);
    EXPECT_EQ(kvasir::bf16_bits_to_f32(0x3f80), 1.0f);
    EXPECT_EQ(kvasir::bf16_bits_to_f32(0xc2f7), -123.5f);
    EXPECT_EQ(kvasir::bf16_bits_to_f32(0x0001), 0x1p-133f);
    EXPECT_EQ(kvasir::bf16_bits_to_f32(0x7f80), INFINITY);
    EXPECT_TRUE(std::isnan(kvasir::bf16_bits_to_f32(0x7fc0)));
}

TEST(BF16, ExhaustiveRoundTripAndBoundaries) {
    for (std::uint32_t v = 0; v <= 0xffff; ++v) {
        const auto hv = static_cast<std::uint16_t>(v);
        const float x = kvasir::bf16_bits_to_f32(hv);
        if (bf16_is_nan(hv)) {
            ASSERT_TRUE(std::isnan(x));
            ASSERT_TRUE(bf16_is_nan(b(x))) << std::hex << v;
            continue;
        }
        ASSERT_EQ(b(x), hv) << std::hex << v;
        ASSERT_EQ(kvasir::round_to_bf16(x), static_cast<double>(x)) << std::hex << v;
        // Midpoint to the next pattern (same sign, one step away from zero) and its neighbours.
        if ((v & 0x7fffu) >= 0x7f7fu) continue;
        const std::uint32_t mid = (v << 16) | 0x8000u;
        ASSERT_EQ(b(f32(mid)), (v & 1) ? v + 1 : v) << std::hex << v;
        ASSERT_EQ(b(f32(mid - 1)), v) << std::hex << v;
        ASSERT_EQ(b(f32(mid + 1)), v + 1) << std::hex << v;
    }
}

TEST(BF16, RoundToBF16OnDoubles) {
    EXPECT_EQ(kvasir::round_to_bf16(1.0 + 0x1p-8), 1.0);
    EXPECT_EQ(kvasir::round_to_bf16(1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);
    EXPECT_EQ(kvasir::round_to_bf16(1.0 + 0x1p-8 + 0x1p-40), 1.0 + 0x1p-7);  // single rounding
    EXPECT_EQ(kvasir::round_to_bf16(0.1), 0.10009765625);
    const double max_bf16 = (2.0 - 0x1p-7) * 0x1p127;
    EXPECT_EQ(kvasir::round_to_bf16(max_bf16), max_bf16);
    EXPECT_EQ(kvasir::round_to_bf16((2.0 - 0x1p-8) * 0x1p127), kInf);  // tie; the odd max loses to 2^128
    EXPECT_EQ(kvasir::round_to_bf16((2.0 - 0x1p-8 - 0x1p-30) * 0x1p127), max_bf16);
    EXPECT_EQ(kvasir::round_to_bf16(-1e39), -kInf);
    EXPECT_EQ(kvasir::round_to_bf16(DBL_MAX), kInf);
    EXPECT_EQ(kvasir::round_to_bf16(0x1p-133), 0x1p-133);  // smallest subnormal
    EXPECT_EQ(kvasir::round_to_bf16(0x1p-134), 0.0);       // tie to even zero
    EXPECT_EQ(kvasir::round_to_bf16(3 * 0x1p-134), 0x1p-132);
    EXPECT_EQ(kvasir::round_to_bf16(0x1p-134 + 0x1p-160), 0x1p-133);
    EXPECT_EQ(kvasir::round_to_bf16(1e-300), 0.0);
    EXPECT_TRUE(same_double(kvasir::round_to_bf16(-1e-300), -0.0));
    EXPECT_TRUE(std::isnan(kvasir::round_to_bf16(std::nan(""))));
}

// --- against an independent reference on random values --------------------------------

TEST(Rounding, MatchesIntegerReferenceOnRandomDoubles) {
    std::mt19937_64 gen(20240611);
    std::uniform_int_distribution<int> exp16(-30, 17), exp_bf(-140, 130);
    for (int i = 0; i < 2'000'000; ++i) {
        const std::uint64_t mant = gen() & 0x000fffffffffffffull;
        const double m = std::bit_cast<double>(mant | 0x3ff0000000000000ull);  // [1, 2)
        const double sign = (i & 1) ? -1.0 : 1.0;
        const double x16 = sign * std::ldexp(m, exp16(gen));
        const double xbf = sign * std::ldexp(m, exp_bf(gen));
        ASSERT_TRUE(same_double(kvasir::round_to_f16(x16), ref_f16(x16))) << std::hexfloat << x16;
        ASSERT_TRUE(same_double(kvasir::round_to_bf16(xbf), ref_bf16(xbf))) << std::hexfloat << xbf;
        ASSERT_TRUE(same_double(kvasir::round_to(DType::f32, xbf), ref_round(xbf, 24, -126, 127)))
            << std::hexfloat << xbf;
    }
    // Values built to sit on or next to a tie: representable + half a quantum ± tiny.
    for (int i = 0; i < 200'000; ++i) {
        const auto v16 = static_cast<std::uint16_t>(gen() % 0x7bff);
        const double q16 = kvasir::f16_bits_to_f32(static_cast<std::uint16_t>(v16 + 1)) -
                           static_cast<double>(kvasir::f16_bits_to_f32(v16));
        const double base16 = kvasir::f16_bits_to_f32(v16);
        for (double d : {0.0, 0x1p-40, -0x1p-40}) {
            const double x = base16 + q16 / 2 + d * q16;
            ASSERT_TRUE(same_double(kvasir::round_to_f16(x), ref_f16(x))) << std::hexfloat << x;
        }
        const auto vbf = static_cast<std::uint16_t>(gen() % 0x7f7f);
        const double basebf = kvasir::bf16_bits_to_f32(vbf);
        const double qbf = kvasir::bf16_bits_to_f32(static_cast<std::uint16_t>(vbf + 1)) - basebf;
        for (double d : {0.0, 0x1p-40, -0x1p-40}) {
            const double x = basebf + qbf / 2 + d * qbf;
            ASSERT_TRUE(same_double(kvasir::round_to_bf16(x), ref_bf16(x))) << std::hexfloat << x;
        }
    }
}

#if defined(__FLT16_MANT_DIG__)
TEST(Rounding, MatchesCompilerFloat16) {
    // The compiler's _Float16 conversions (libgcc/compiler-rt soft-float or F16C)
    // are a second, unrelated implementation of the same IEEE rounding.
    for (std::uint64_t v = 0; v <= 0xffffffffull; v += 4099) {
        const float x = f32(static_cast<std::uint32_t>(v));
        const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
        if (std::isnan(x)) {
            ASSERT_TRUE(f16_is_nan(h(x)));
            continue;
        }
        ASSERT_EQ(h(x), want) << std::hex << v;
    }
    std::mt19937_64 gen(7);
    for (int i = 0; i < 500'000; ++i) {
        const double x = std::ldexp(std::bit_cast<double>((gen() & 0x000fffffffffffffull) | 0x3ff0000000000000ull),
                                    static_cast<int>(gen() % 50) - 30);
        ASSERT_EQ(kvasir::round_to_f16(x), static_cast<double>(static_cast<_Float16>(x))) << std::hexfloat << x;
    }
}
#endif

// --- storing and loading ------------------------------------------------------------------

TEST(StoreLoad, SingleRoundingAndIntegers) {
    std::uint16_t hv[2] = {};
    kvasir::store_from_f64(DType::f16, hv, 0, 1.0 + 0x1p-11 + 0x1p-40);  // no detour through f32
    kvasir::store_from_f64(DType::f16, hv, 1, -70000.0);
    EXPECT_EQ(hv[0], 0x3c01);
    EXPECT_EQ(hv[1], 0xfc00);
    EXPECT_EQ(kvasir::load_as_f64(DType::f16, hv, 0), 1.0 + 0x1p-10);

    std::uint16_t bv[2] = {};
    kvasir::store_from_f64(DType::bf16, bv, 0, 1.0 + 0x1p-8 + 0x1p-40);
    kvasir::store_from_f64(DType::bf16, bv, 1, std::nan(""));
    EXPECT_EQ(bv[0], 0x3f81);
    EXPECT_TRUE(bf16_is_nan(bv[1]));
    EXPECT_EQ(kvasir::load_as_f64(DType::bf16, bv, 0), 1.0 + 0x1p-7);

    float fv[1] = {};
    kvasir::store_from_f64(DType::f32, fv, 0, 1.0 + 0x1p-24 + 0x1p-40);
    EXPECT_EQ(fv[0], 1.0f + 0x1p-23f);
    double dv[1] = {};
    kvasir::store_from_f64(DType::f64, dv, 0, 0.1);
    EXPECT_EQ(kvasir::load_as_f64(DType::f64, dv, 0), 0.1);

    std::int32_t iv[6] = {};
    const double in[6] = {2.5, 3.5, -2.5, std::nan(""), 1e10, -1e10};
    for (int i = 0; i < 6; ++i) kvasir::store_from_f64(DType::i32, iv, static_cast<std::size_t>(i), in[i]);
    EXPECT_EQ(iv[0], 2);
    EXPECT_EQ(iv[1], 4);
    EXPECT_EQ(iv[2], -2);
    EXPECT_EQ(iv[3], 0);
    EXPECT_EQ(iv[4], std::numeric_limits<std::int32_t>::max());
    EXPECT_EQ(iv[5], std::numeric_limits<std::int32_t>::min());
    EXPECT_EQ(kvasir::load_as_f64(DType::i32, iv, 5), -2147483648.0);

    EXPECT_EQ(kvasir::round_to(DType::f64, 0.1), 0.1);
    EXPECT_EQ(kvasir::round_to(DType::f32, 0.1), static_cast<double>(0.1f));
    EXPECT_EQ(kvasir::round_to(DType::i32, -0.5), 0.0);
}

TEST(StoreLoad, StoredBitsAgreeWithRoundTo) {
    std::mt19937_64 gen(99);
    for (int i = 0; i < 200'000; ++i) {
        const double x = std::ldexp(std::bit_cast<double>((gen() & 0x000fffffffffffffull) | 0x3ff0000000000000ull),
                                    static_cast<int>(gen() % 300) - 150) * ((i & 1) ? -1 : 1);
        for (DType t : {DType::f16, DType::bf16, DType::f32}) {
            unsigned char buf[8] = {};
            kvasir::store_from_f64(t, buf, 0, x);
            ASSERT_TRUE(same_double(kvasir::load_as_f64(t, buf, 0), kvasir::round_to(t, x)))
                << kvasir::dtype_name(t) << " " << std::hexfloat << x;
        }
    }
}

// FP8 E4M3 (OCP "e4m3fn"): every one of the 254 finite codes decoded by
// hand from its fields; rounding must land on the nearest of them (ties to
// the even code), saturate at ±448 and keep NaN.
std::vector<double> e4m3_values() {
    std::vector<double> v;
    for (int code = 0; code < 128; ++code) {
        const int e = code >> 3, m = code & 7;
        if (e == 15 && m == 7) continue;  // NaN
        v.push_back(e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7));
    }
    return v;  // ascending, 0 … 448
}

TEST(Fp8E4m3, HandValues) {
    EXPECT_EQ(round_to_fp8_e4m3(1.0), 1.0);
    EXPECT_EQ(round_to_fp8_e4m3(1.0625), 1.0);     // tie between 1 (even) and 1.125
    EXPECT_EQ(round_to_fp8_e4m3(1.1875), 1.25);    // tie between 1.125 and 1.25 (even)
    EXPECT_EQ(round_to_fp8_e4m3(-3.3), -3.25);
    EXPECT_EQ(round_to_fp8_e4m3(448.0), 448.0);
    EXPECT_EQ(round_to_fp8_e4m3(1e6), 448.0);      // saturating
    EXPECT_EQ(round_to_fp8_e4m3(-500.0), -448.0);
    EXPECT_EQ(round_to_fp8_e4m3(std::ldexp(1.0, -9)), std::ldexp(1.0, -9));  // smallest subnormal
    EXPECT_EQ(round_to_fp8_e4m3(std::ldexp(1.0, -10)), 0.0);                 // tie to 0 (even)
    EXPECT_EQ(round_to_fp8_e4m3(std::ldexp(1.5, -10)), std::ldexp(1.0, -9));
    EXPECT_TRUE(std::signbit(round_to_fp8_e4m3(-0.0)));
    EXPECT_TRUE(std::isnan(round_to_fp8_e4m3(std::nan(""))));
}

TEST(Fp8E4m3, NearestOfTheCodesBruteForce) {
    const std::vector<double> v = e4m3_values();
    ASSERT_EQ(v.size(), 127u);
    for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(round_to_fp8_e4m3(v[i]), v[i]) << v[i];
    std::uint64_t state = 88172645463325252ull;
    for (int n = 0; n < 20000; ++n) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        const double x = std::ldexp(static_cast<double>(state >> 11) / 9007199254740992.0, -12 + static_cast<int>(state % 22));
        std::size_t best = 0;
        for (std::size_t i = 1; i < v.size(); ++i) {
            const double d = std::fabs(v[i] - x), db = std::fabs(v[best] - x);
            if (d < db || (d == db && i % 2 == 0)) best = i;  // index parity = mantissa parity
        }
        const double want = x >= 448 ? 448 : v[best];
        ASSERT_EQ(round_to_fp8_e4m3(x), want) << x;
        ASSERT_EQ(round_to_fp8_e4m3(-x), -want) << x;
    }
}

}  // namespace
