#include "kvasir/core/rng.hpp"

#include "kvasir/core/error.hpp"

#include <Random123/philox.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <system_error>
#include <utility>
#include <thread>
#include <vector>

// The normal transform is only reproducible when every double operation is
// rounded to binary64 as written: x87 excess precision would change bits.
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "kvasir rng needs FLT_EVAL_METHOD == 0 (binary64 arithmetic without excess precision)"
#endif
static_assert(std::numeric_limits<double>::is_iec559, "kvasir rng needs IEEE-754 binary64 doubles");

namespace kvasir {

namespace {

// The block function is Random123's own Philox4x32-10 (the reference
// implementation of the SC'11 paper). rng.hpp still writes the definition out
// in full because scripts/rng_reference.py must be able to reimplement it;
// these asserts pin the library to that definition, so a Random123 release
// that changed its constants or round count would fail to build rather than
// silently change every seeded input.
using Philox = r123::Philox4x32_R<10>;
static_assert(PHILOX_M4x32_0 == 0xD2511F53u && PHILOX_M4x32_1 == 0xCD9E8D57u, "Philox round multipliers changed");
static_assert(PHILOX_W32_0 == 0x9E3779B9u && PHILOX_W32_1 == 0xBB67AE85u, "Philox Weyl key increments changed");
static_assert(Philox::rounds == 10, "Philox4x32-10 must run 10 rounds");

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

}  // namespace

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key) noexcept {
    const Philox::ctr_type out =
        Philox()(Philox::ctr_type{{counter[0], counter[1], counter[2], counter[3]}}, Philox::key_type{{key[0], key[1]}});
    return {out.v[0], out.v[1], out.v[2], out.v[3]};
}

std::uint64_t tensor_stream_id(std::string_view name) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char ch : name) {
        h ^= static_cast<unsigned char>(ch);
        h *= 0x100000001b3ull;
    }
    return h;
}

namespace {

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
    const bool below = mf < kSqrtHalf;  // mf in [0.5, 1): x = mf * 2^(biased - 1022)
    const double m = below ? mf * 2.0 : mf;
    const double dk = ((biased - 1022.0) + k_offset) - (below ? 1.0 : 0.0);  // small integers: exact
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

}  // namespace

double det_log(double x) noexcept {
    if (std::isnan(x)) return x;
    if (x < 0.0) return std::numeric_limits<double>::quiet_NaN();
    if (x == 0.0) return -std::numeric_limits<double>::infinity();
    if (x == std::numeric_limits<double>::infinity()) return x;

    if (x < 0x1p-1022) return log_positive_normal(x * 0x1p54, -54.0);  // subnormal: scale up exactly
    return log_positive_normal(x, 0.0);
}

void det_sincos_2pi(double u, double& sin_out, double& cos_out) noexcept {
    // Reduction in turns is exact: u has at most 53 bits and q/4 is a short
    // dyadic, so f = u - q/4 needs no extended-precision pi (for u in [0,1]).
    const double qf = std::floor(4.0 * u + 0.5);
    const double f = u - qf * 0.25;
    sincos_reduced(f, static_cast<std::int64_t>(qf), sin_out, cos_out);
}

double uniform_from_bits(std::uint32_t bits) noexcept { return (static_cast<double>(bits) + 0.5) * 0x1p-32; }

SeededStream::SeededStream(std::uint64_t seed, std::string_view tensor_name) noexcept
    : seed_(seed), stream_(tensor_stream_id(tensor_name)) {}

std::array<std::uint32_t, 4> SeededStream::block(std::uint64_t b) const noexcept {
    return philox4x32_10({static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32),
                          static_cast<std::uint32_t>(stream_), static_cast<std::uint32_t>(stream_ >> 32)},
                         {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)});
}

std::uint32_t SeededStream::bits(std::uint64_t i) const noexcept { return block(i / 4)[i % 4]; }

double SeededStream::uniform(std::uint64_t i) const noexcept { return uniform_from_bits(bits(i)); }

std::array<double, 4> SeededStream::normals_of_block(const std::array<std::uint32_t, 4>& bits) noexcept {
    std::array<double, 4> out{};
    for (int pair = 0; pair < 2; ++pair) {
        const double ua = uniform_from_bits(bits[2 * pair]);
        const double ub = uniform_from_bits(bits[2 * pair + 1]);
        const double r = std::sqrt(-2.0 * det_log(ua));
        double s = 0.0, c = 0.0;
        det_sincos_2pi(ub, s, c);
        out[2 * pair] = r * c;
        out[2 * pair + 1] = r * s;
    }
    return out;
}

double SeededStream::normal(std::uint64_t i) const noexcept { return normals_of_block(block(i / 4))[i % 4]; }

namespace {

// Round a double once (RNE) to a 16-bit float with `mant` fraction bits and
// exponent bias `bias`, returning its bit pattern: store_from_f64's result
// (round_to, then the exact encoding) in integer arithmetic, because the
// generic path costs ~100 ns per element. Infinity in, infinity out; NaN is
// not handled (the generator cannot produce one).
template <int mant, int bias>
std::uint16_t to_half_bits(double x) noexcept {
    constexpr std::uint64_t inf = std::uint64_t{2 * bias + 1} << mant;
    const std::uint64_t b = std::bit_cast<std::uint64_t>(x);
    const auto sign = static_cast<std::uint16_t>((b >> 48) & 0x8000u);
    const int e = static_cast<int>((b >> 52) & 0x7ff) - 1023;
    if (e > bias) return static_cast<std::uint16_t>(sign | inf);  // |x| >= 2^(bias+1), infinity included
    // Normal results keep `mant` bits below the leading one; below 2^(1-bias)
    // the quantum is fixed (gradual underflow), so more bits are dropped.
    // Double subnormals (and zero) take the early return, so the implicit bit
    // can always be set.
    const int shift = (52 - mant) + std::max(0, (1 - bias) - e);
    if (shift > 53) return sign;  // below half the smallest subnormal
    const std::uint64_t sig = (b & 0x000fffffffffffffull) | 0x0010000000000000ull;
    std::uint64_t q = sig >> shift;
    const std::uint64_t rem = sig & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    q += (rem > half || (rem == half && (q & 1))) ? 1 : 0;
    // For a normal result q still holds the leading one, which adds 1 to the
    // exponent field; a carry out of the fraction bumps the exponent, and out
    // of the largest binade it lands exactly on the infinity pattern.
    const std::uint64_t mag = e >= 1 - bias ? (static_cast<std::uint64_t>(e + bias - 1) << mant) + q : q;
    return static_cast<std::uint16_t>(sign | mag);
}

}  // namespace

namespace rng_detail {
std::uint16_t f16_bits(double x) noexcept { return to_half_bits<10, 15>(x); }
std::uint16_t bf16_bits(double x) noexcept { return to_half_bits<7, 127>(x); }
}  // namespace rng_detail

namespace {

enum class Draw { normal, uniform };

// The tensor fill works on batches of blocks laid out structure-of-arrays, so
// the compiler can vectorise across blocks. Every element still goes through
// exactly the operations of the scalar SeededStream path (IEEE operations give
// the same bits in SIMD lanes; contraction is off), which test_rng checks.
constexpr int kBatchBlocks = 8;
constexpr int kBatchPairs = 2 * kBatchBlocks;
constexpr int kBatchElems = 4 * kBatchBlocks;

// w[l][j] = lane l of block b0 + j.
void philox_batch(const SeededStream& st, std::uint64_t b0, std::uint32_t (&w)[4][kBatchBlocks]) noexcept {
    const Philox philox;
    const Philox::key_type key = {{static_cast<std::uint32_t>(st.seed()), static_cast<std::uint32_t>(st.seed() >> 32)}};
    const auto s0 = static_cast<std::uint32_t>(st.stream());
    const auto s1 = static_cast<std::uint32_t>(st.stream() >> 32);
    for (int j = 0; j < kBatchBlocks; ++j) {
        const std::uint64_t b = b0 + static_cast<std::uint64_t>(j);
        const Philox::ctr_type out =
            philox(Philox::ctr_type{{static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32), s0, s1}}, key);
        for (int l = 0; l < 4; ++l) w[l][j] = out.v[l];
    }
}

void normals_batch(const SeededStream& st, std::uint64_t b0, double (&out)[kBatchElems]) noexcept {
    std::uint32_t w[4][kBatchBlocks];
    philox_batch(st, b0, w);
    double ua[kBatchPairs], ub[kBatchPairs];
    for (int j = 0; j < kBatchBlocks; ++j)
        for (int pair = 0; pair < 2; ++pair) {
            ua[2 * j + pair] = uniform_from_bits(w[2 * pair][j]);
            ub[2 * j + pair] = uniform_from_bits(w[2 * pair + 1][j]);
        }
    double lr[kBatchPairs];
    for (int p = 0; p < kBatchPairs; ++p) lr[p] = log_positive_normal(ua[p], 0.0);  // ua >= 2^-33
    double sn[kBatchPairs], cs[kBatchPairs];
    for (int p = 0; p < kBatchPairs; ++p) {
        const auto q = static_cast<std::int32_t>(4.0 * ub[p] + 0.5);  // positive: truncation is floor
        const double f = ub[p] - static_cast<double>(q) * 0.25;
        sincos_reduced(f, q, sn[p], cs[p]);
    }
    for (int p = 0; p < kBatchPairs; ++p) {
        const double r = std::sqrt(-2.0 * lr[p]);
        out[2 * p] = r * cs[p];
        out[2 * p + 1] = r * sn[p];
    }
}

// Fill elements [4*b0, min(4*b1, n)) of `out`. Each element depends only on
// its own index, so how the range is cut between threads cannot matter.
template <typename Store>
void fill_blocks(const SeededStream& st, Draw draw, double a, double scale, std::uint64_t b0, std::uint64_t b1,
                 std::uint64_t n, Store store) {
    std::uint64_t b = b0;
    double v[kBatchElems];
    for (; b1 - b >= kBatchBlocks; b += kBatchBlocks) {
        if (draw == Draw::normal) {
            normals_batch(st, b, v);
            for (int e = 0; e < kBatchElems; ++e) v[e] = a + scale * v[e];
        } else {
            std::uint32_t w[4][kBatchBlocks];
            philox_batch(st, b, w);
            for (int j = 0; j < kBatchBlocks; ++j)
                for (int l = 0; l < 4; ++l) v[4 * j + l] = a + scale * uniform_from_bits(w[l][j]);
        }
        const std::uint64_t base = 4 * b;
        const int count = static_cast<int>(std::min<std::uint64_t>(kBatchElems, n - base));
        for (int e = 0; e < count; ++e) store(base + static_cast<std::uint64_t>(e), v[e]);
    }
    for (; b < b1; ++b) {
        const auto bits = st.block(b);
        std::array<double, 4> z{};
        if (draw == Draw::normal) {
            z = SeededStream::normals_of_block(bits);
            for (int l = 0; l < 4; ++l) z[l] = a + scale * z[l];
        } else {
            for (int l = 0; l < 4; ++l) z[l] = a + scale * uniform_from_bits(bits[l]);
        }
        const std::uint64_t base = 4 * b;
        const int lanes = static_cast<int>(std::min<std::uint64_t>(4, n - base));
        for (int l = 0; l < lanes; ++l) store(base + static_cast<std::uint64_t>(l), z[l]);
    }
}

void fill_range(Tensor& t, const SeededStream& st, Draw draw, double a, double scale, std::uint64_t b0,
                std::uint64_t b1) {
    const auto n = static_cast<std::uint64_t>(t.numel());
    void* data = t.raw();
    switch (t.dtype()) {
        case DType::f64: {
            auto* p = static_cast<double*>(data);
            fill_blocks(st, draw, a, scale, b0, b1, n, [p](std::uint64_t i, double x) { p[i] = x; });
            break;
        }
        case DType::f32: {
            auto* p = static_cast<float*>(data);
            fill_blocks(st, draw, a, scale, b0, b1, n,
                        [p](std::uint64_t i, double x) { p[i] = static_cast<float>(x); });
            break;
        }
        case DType::f16: {
            auto* p = static_cast<std::uint16_t*>(data);
            fill_blocks(st, draw, a, scale, b0, b1, n,
                        [p](std::uint64_t i, double x) { p[i] = rng_detail::f16_bits(x); });
            break;
        }
        case DType::bf16: {
            auto* p = static_cast<std::uint16_t*>(data);
            fill_blocks(st, draw, a, scale, b0, b1, n,
                        [p](std::uint64_t i, double x) { p[i] = rng_detail::bf16_bits(x); });
            break;
        }
        case DType::i32: break;  // refused by generate() before any thread starts
    }
}

Tensor generate(const char* what, std::uint64_t seed, std::string_view name, Shape shape, Draw draw, double a,
                double scale, DType dtype, unsigned threads) {
    KVASIR_CHECK(dtype_is_float(dtype), ErrorCode::bad_input, "{} for tensor '{}': dtype {} is not a float type",
                 what, name, dtype_name(dtype));
    Tensor t(dtype, std::move(shape));
    const SeededStream st(seed, name);
    const auto n = static_cast<std::uint64_t>(t.numel());
    const std::uint64_t nblocks = (n + 3) / 4;

    // Below ~64K elements a thread costs more to start than it saves.
    constexpr std::uint64_t kMinBlocksPerThread = 16384;
    std::uint64_t workers = threads;
    if (workers == 0)
        workers = std::min<std::uint64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                          nblocks / kMinBlocksPerThread);
    workers = std::clamp<std::uint64_t>(workers, 1, std::max<std::uint64_t>(nblocks, 1));

    if (workers <= 1) {
        fill_range(t, st, draw, a, scale, 0, nblocks);
        return t;
    }
    const std::uint64_t per = (nblocks + workers - 1) / workers;
    auto range = [&](std::uint64_t w) {
        const std::uint64_t b0 = std::min(nblocks, w * per);
        return std::pair{b0, std::min(nblocks, b0 + per)};
    };
    std::vector<std::thread> pool;
    pool.reserve(static_cast<std::size_t>(workers - 1));
    std::uint64_t started = 1;  // range 0 is this thread's
    try {
        for (; started < workers; ++started) {
            // Plain copies: clang 14 cannot capture structured bindings.
            const auto r = range(started);
            const std::uint64_t b0 = r.first, b1 = r.second;
            pool.emplace_back([&t, &st, draw, a, scale, b0, b1] { fill_range(t, st, draw, a, scale, b0, b1); });
        }
    } catch (const std::system_error&) {
        // Out of threads: the ranges not handed out are done here instead; the
        // result does not depend on who computes a range.
    }
    for (std::uint64_t w = started; w < workers; ++w) {
        const auto [b0, b1] = range(w);
        fill_range(t, st, draw, a, scale, b0, b1);
    }
    const auto [b0, b1] = range(0);
    fill_range(t, st, draw, a, scale, b0, b1);
    for (auto& th : pool) th.join();
    return t;
}

}  // namespace

Tensor seeded_normal(std::uint64_t seed, std::string_view name, Shape shape, double mean, double stddev, DType dtype,
                     unsigned threads) {
    KVASIR_CHECK(std::isfinite(mean) && std::isfinite(stddev), ErrorCode::bad_input,
                 "seeded_normal for tensor '{}': mean {} and stddev {} must be finite", name, mean, stddev);
    return generate("seeded_normal", seed, name, std::move(shape), Draw::normal, mean, stddev, dtype, threads);
}

Tensor seeded_uniform(std::uint64_t seed, std::string_view name, Shape shape, double lo, double hi, DType dtype,
                      unsigned threads) {
    KVASIR_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, ErrorCode::bad_input,
                 "seeded_uniform for tensor '{}': bounds [{}, {}] must be finite with lo <= hi", name, lo, hi);
    const double width = hi - lo;
    KVASIR_CHECK(std::isfinite(width), ErrorCode::bad_input,
                 "seeded_uniform for tensor '{}': width of [{}, {}] overflows", name, lo, hi);
    return generate("seeded_uniform", seed, name, std::move(shape), Draw::uniform, lo, width, dtype, threads);
}

}  // namespace kvasir
