#include "kvasir/core/rng.hpp"

#include "kvasir/core/cpu_isa.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng_math.hpp"

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

static_assert(rng_detail::kPhiloxM0 == PHILOX_M4x32_0 && rng_detail::kPhiloxM1 == PHILOX_M4x32_1 &&
                  rng_detail::kPhiloxW0 == PHILOX_W32_0 && rng_detail::kPhiloxW1 == PHILOX_W32_1,
              "the block kernel's Philox constants are Random123's");

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

using rng_detail::log_positive_normal;
using rng_detail::sincos_reduced;

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

double uniform_from_bits(std::uint32_t bits) noexcept { return rng_detail::uniform_of(bits); }

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

// The block kernel (rng_math.hpp) for this CPU: its ISA's copy, each giving
// the scalar path's bits (test_rng, on every ISA via KVASIR_CPU_ISA).
void draw_blocks_generic(std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                         std::uint64_t count, double* out) noexcept {
    rng_detail::draw_blocks_kernel(seed, stream, normal, a, scale, b0, count, out);
}

rng_detail::DrawBlocks draw_blocks_for_this_cpu() noexcept {
    switch (cpu_isa()) {
#if defined(__x86_64__)
        case CpuIsa::avx512: return rng_detail::draw_blocks_avx512;
        case CpuIsa::avx2: return rng_detail::draw_blocks_avx2;
#endif
        default: return draw_blocks_generic;
    }
}

// Fill elements [4*b0, min(4*b1, n)) of `out`. Each element depends only on
// its own index, so how the range is cut between threads cannot matter.
template <typename Store>
void fill_blocks(const SeededStream& st, Draw draw, double a, double scale, std::uint64_t b0, std::uint64_t b1,
                 std::uint64_t n, Store store) {
    static const rng_detail::DrawBlocks kernel = draw_blocks_for_this_cpu();
    constexpr std::uint64_t kChunk = 512;  // blocks: 16 KiB of doubles, L1-resident
    double v[4 * kChunk];
    for (std::uint64_t b = b0; b < b1; b += kChunk) {
        const std::uint64_t count = std::min(kChunk, b1 - b);
        kernel(st.seed(), st.stream(), draw == Draw::normal, a, scale, b, count, v);
        const std::uint64_t base = 4 * b;
        const std::uint64_t elems = std::min(4 * count, n - base);
        for (std::uint64_t e = 0; e < elems; ++e) store(base + e, v[e]);
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
