// Seeded inputs: Philox known answers, bit-exact agreement with the
// independent Python reference (fixtures/rng_vectors.json), determinism across
// calls and thread counts, stream separation, statistics, and the accuracy of
// the libm-free log/sincos against long-double libm.
#include "kvasir/core/error.hpp"
#include "kvasir/core/cpu_isa.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/core/rng_math.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

namespace {

using kvasir::DType;
using kvasir::SeededStream;
using kvasir::Tensor;

std::uint64_t parse_hex(const std::string& s) { return std::stoull(s, nullptr, 16); }

double parse_hexfloat(const std::string& s) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    EXPECT_EQ(*end, '\0') << "not a hex float: " << s;
    return v;
}

std::uint64_t bits_of(double x) { return std::bit_cast<std::uint64_t>(x); }

nlohmann::json load_vectors() {
    const std::string path = std::string(KVASIR_SOURCE_DIR) + "/fixtures/rng_vectors.json";
    std::ifstream in(path);
    if (!in) ADD_FAILURE() << "cannot open " << path << " (run scripts/rng_reference.py)";
    return nlohmann::json::parse(in);
}

// Raw element i of a tensor as its stored bit pattern.
std::uint64_t raw_bits(const Tensor& t, std::int64_t i) {
    const auto* p = static_cast<const unsigned char*>(t.raw());
    const std::size_t w = kvasir::dtype_size(t.dtype());
    std::uint64_t v = 0;
    std::memcpy(&v, p + static_cast<std::size_t>(i) * w, w);  // little-endian host
    return v;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Error of `got` in units of the last place of the double nearest `want`.
long double ulp_error(double got, long double want) {
    const double w = static_cast<double>(want);
    if (w == 0.0) return got == 0.0 ? 0.0L : INFINITY;
    const long double ulp = std::ldexp(1.0L, std::max(std::ilogb(w), DBL_MIN_EXP - 1) - (DBL_MANT_DIG - 1));
    return std::fabs(static_cast<long double>(got) - want) / ulp;
}

// --- Philox and the stream id ------------------------------------------------

TEST(Philox, Random123KnownAnswers) {
    using A4 = std::array<std::uint32_t, 4>;
    EXPECT_EQ(kvasir::philox4x32_10({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    EXPECT_EQ(kvasir::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
              (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    EXPECT_EQ(kvasir::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
              (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, StreamIdIsFnv1a64) {
    EXPECT_EQ(kvasir::tensor_stream_id(""), 0xcbf29ce484222325ull);
    EXPECT_EQ(kvasir::tensor_stream_id("a"), 0xaf63dc4c8601ec8cull);
    EXPECT_EQ(kvasir::tensor_stream_id("foobar"), 0x85944171f73967e8ull);
}

TEST(Philox, ElementMappingMatchesDefinition) {
    // Element i = lane i%4 of the block with counter (b lo, b hi, stream lo, stream hi)
    // under key (seed lo, seed hi) — spelled out here independently of SeededStream.
    const std::uint64_t seed = 0x1122334455667788ull;
    const std::uint64_t stream = kvasir::tensor_stream_id("w");
    const SeededStream st(seed, "w");
    for (std::uint64_t i : {0ull, 1ull, 2ull, 3ull, 4ull, 4ull * 0x100000000ull + 3, 0xffffffffffffffffull}) {
        const std::uint64_t b = i / 4;
        const auto blk = kvasir::philox4x32_10(
            {static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32), static_cast<std::uint32_t>(stream),
             static_cast<std::uint32_t>(stream >> 32)},
            {0x55667788u, 0x11223344u});
        EXPECT_EQ(st.bits(i), blk[i % 4]) << "i=" << i;
        EXPECT_EQ(st.uniform(i), (static_cast<double>(blk[i % 4]) + 0.5) / 4294967296.0) << "i=" << i;
    }
}

// The tensor fill's block kernel (core/rng_math.hpp), each ISA's copy this CPU
// can run, against the scalar stream (Random123's Philox, the scalar
// log/sincos) block by block: across the 2^32 carry of the block counter,
// odd counts (a partial last group of lanes) and both draws.
TEST(BlockKernel, EveryIsaGivesTheScalarStreamsBits) {
    struct Isa {
        const char* name;
        kvasir::CpuIsa needs;
        kvasir::rng_detail::DrawBlocks fn;
    };
    std::vector<Isa> isas = {{"generic", kvasir::CpuIsa::generic,
                              [](std::uint64_t seed, std::uint64_t stream, bool normal, double a, double scale, std::uint64_t b0,
                                 std::uint64_t count, double* out) noexcept {
                                  kvasir::rng_detail::draw_blocks_kernel(seed, stream, normal, a, scale, b0, count, out);
                              }}};
#if defined(__x86_64__)
    isas.push_back({"avx2", kvasir::CpuIsa::avx2, kvasir::rng_detail::draw_blocks_avx2});
    isas.push_back({"avx512", kvasir::CpuIsa::avx512, kvasir::rng_detail::draw_blocks_avx512});
#endif
    const auto runs = [](kvasir::CpuIsa need) {
        const kvasir::CpuIsa have = kvasir::cpu_isa();
        return need == kvasir::CpuIsa::generic || have == need ||
               (need == kvasir::CpuIsa::avx2 && have == kvasir::CpuIsa::avx512);
    };
    const SeededStream st(0xfeedface12345678ull, "blocks");
    std::string ran;
    for (const Isa& isa : isas) {
        if (!runs(isa.needs)) continue;
        ran += std::string(ran.empty() ? "" : " ") + isa.name;
        for (const std::uint64_t b0 : {std::uint64_t{0}, std::uint64_t{0xffffffffu} - 20, std::uint64_t{1} << 40}) {
            for (const std::uint64_t count : {std::uint64_t{1}, std::uint64_t{17}, std::uint64_t{77}}) {
                std::vector<double> nrm(4 * count), uni(4 * count);
                isa.fn(st.seed(), st.stream(), true, 0.25, 3.0, b0, count, nrm.data());
                isa.fn(st.seed(), st.stream(), false, -1.0, 2.0, b0, count, uni.data());
                for (std::uint64_t e = 0; e < 4 * count; ++e) {
                    const std::uint64_t i = 4 * b0 + e;
                    ASSERT_EQ(bits_of(nrm[e]), bits_of(0.25 + 3.0 * st.normal(i))) << isa.name << " element " << i;
                    ASSERT_EQ(bits_of(uni[e]), bits_of(-1.0 + 2.0 * st.uniform(i))) << isa.name << " element " << i;
                }
            }
        }
    }
    RecordProperty("isas", ran);
    std::printf("[ isas     ] %s (this CPU: %s)\n", ran.c_str(), kvasir::cpu_isa_name(kvasir::cpu_isa()));
}

// --- the Python reference -----------------------------------------------------

TEST(RngVectors, PhiloxBlocks) {
    const auto doc = load_vectors();
    ASSERT_EQ(doc.at("format"), "kvasir-rng/1");
    ASSERT_EQ(doc.at("philox4x32_10").size(), 3u);
    for (const auto& v : doc.at("philox4x32_10")) {
        std::array<std::uint32_t, 4> ctr{}, want{};
        std::array<std::uint32_t, 2> key{};
        for (int j = 0; j < 4; ++j) ctr[j] = static_cast<std::uint32_t>(parse_hex(v.at("counter")[j]));
        for (int j = 0; j < 2; ++j) key[j] = static_cast<std::uint32_t>(parse_hex(v.at("key")[j]));
        for (int j = 0; j < 4; ++j) want[j] = static_cast<std::uint32_t>(parse_hex(v.at("output")[j]));
        EXPECT_EQ(kvasir::philox4x32_10(ctr, key), want);
    }
}

TEST(RngVectors, TranscendentalsBitExact) {
    // Pins the libm-free functions directly, including the points where their
    // reductions switch branch, independently of Philox.
    const auto doc = load_vectors();
    ASSERT_GE(doc.at("det_log").size(), 100u);
    for (const auto& v : doc.at("det_log")) {
        const double x = parse_hexfloat(v[0]);
        EXPECT_EQ(bits_of(kvasir::det_log(x)), bits_of(parse_hexfloat(v[1]))) << "det_log(" << v[0] << ")";
    }
    ASSERT_GE(doc.at("det_sincos_2pi").size(), 60u);
    for (const auto& v : doc.at("det_sincos_2pi")) {
        double s = 0, c = 0;
        kvasir::det_sincos_2pi(parse_hexfloat(v[0]), s, c);
        EXPECT_EQ(bits_of(s), bits_of(parse_hexfloat(v[1]))) << "sin(2 pi " << v[0] << ")";
        EXPECT_EQ(bits_of(c), bits_of(parse_hexfloat(v[2]))) << "cos(2 pi " << v[0] << ")";
    }
}

TEST(RngVectors, StreamsBitExact) {
    const auto doc = load_vectors();
    ASSERT_GE(doc.at("streams").size(), 4u);
    for (const auto& s : doc.at("streams")) {
        const std::uint64_t seed = parse_hex(s.at("seed"));
        const std::string name = s.at("name");
        SCOPED_TRACE("seed " + s.at("seed").get<std::string>() + " name '" + name + "'");
        const SeededStream st(seed, name);
        EXPECT_EQ(st.stream(), parse_hex(s.at("stream_id")));
        const auto& bits = s.at("bits");
        const auto& uni = s.at("uniform");
        const auto& nrm = s.at("normal");
        ASSERT_EQ(bits.size(), 64u);
        ASSERT_EQ(uni.size(), 64u);
        ASSERT_EQ(nrm.size(), 64u);
        for (std::uint64_t i = 0; i < 64; ++i) {
            EXPECT_EQ(st.bits(i), parse_hex(bits[i])) << "bits " << i;
            EXPECT_EQ(bits_of(st.uniform(i)), bits_of(parse_hexfloat(uni[i]))) << "uniform " << i;
            EXPECT_EQ(bits_of(st.normal(i)), bits_of(parse_hexfloat(nrm[i])))
                << "normal " << i << ": got " << st.normal(i) << " want " << nrm[i];
        }
        for (const auto& at : s.at("at")) {
            const std::uint64_t i = parse_hex(at.at("index"));
            EXPECT_EQ(st.bits(i), parse_hex(at.at("bits"))) << "index " << i;
            EXPECT_EQ(bits_of(st.uniform(i)), bits_of(parse_hexfloat(at.at("uniform")))) << "index " << i;
            EXPECT_EQ(bits_of(st.normal(i)), bits_of(parse_hexfloat(at.at("normal")))) << "index " << i;
        }
    }
}

TEST(RngVectors, TensorsBitExact) {
    const auto doc = load_vectors();
    ASSERT_GE(doc.at("tensors").size(), 5u);
    for (const auto& v : doc.at("tensors")) {
        const std::uint64_t seed = parse_hex(v.at("seed"));
        const std::string name = v.at("name");
        const auto dtype = kvasir::parse_dtype(v.at("dtype").get<std::string>());
        ASSERT_TRUE(dtype.has_value());
        const kvasir::Shape shape = v.at("shape").get<kvasir::Shape>();
        SCOPED_TRACE(v.at("kind").get<std::string>() + " '" + name + "' " + kvasir::dtype_name(*dtype));
        for (unsigned threads : {1u, 3u}) {
            const Tensor t = v.at("kind") == "normal"
                                 ? kvasir::seeded_normal(seed, name, shape, parse_hexfloat(v.at("mean")),
                                                         parse_hexfloat(v.at("stddev")), *dtype, threads)
                                 : kvasir::seeded_uniform(seed, name, shape, parse_hexfloat(v.at("lo")),
                                                          parse_hexfloat(v.at("hi")), *dtype, threads);
            ASSERT_EQ(t.shape(), shape);
            ASSERT_EQ(t.dtype(), *dtype);
            const auto& want = v.at("bits");
            ASSERT_EQ(static_cast<std::int64_t>(want.size()), t.numel());
            for (std::int64_t i = 0; i < t.numel(); ++i)
                EXPECT_EQ(raw_bits(t, i), parse_hex(want[static_cast<std::size_t>(i)])) << "element " << i;
        }
    }
}

// --- determinism ---------------------------------------------------------------

TEST(SeededTensor, SameSeedSameBitsAcrossCallsAndThreadCounts) {
    const kvasir::Shape shape{1000, 1003};  // not a multiple of 4: the last block is partial
    const Tensor ref = kvasir::seeded_normal(5, "layers.3.attn.q_proj.weight", shape, 0.0, 0.02, DType::f32, 1);
    EXPECT_TRUE(same_bytes(ref, kvasir::seeded_normal(5, "layers.3.attn.q_proj.weight", shape, 0.0, 0.02)));
    for (unsigned threads : {2u, 3u, 7u, 64u})
        EXPECT_TRUE(same_bytes(ref, kvasir::seeded_normal(5, "layers.3.attn.q_proj.weight", shape, 0.0, 0.02,
                                                          DType::f32, threads)))
            << threads << " threads";
    const Tensor u1 = kvasir::seeded_uniform(5, "u", shape, -1.0, 1.0, DType::bf16, 1);
    EXPECT_TRUE(same_bytes(u1, kvasir::seeded_uniform(5, "u", shape, -1.0, 1.0, DType::bf16, 5)));
}

TEST(SeededTensor, ElementsAreTheStreamRoundedOnce) {
    const SeededStream st(77, "t");
    const std::int64_t n = 4099;
    for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
        const Tensor t = kvasir::seeded_normal(77, "t", {n}, 0.5, 2.5, dt);
        const Tensor u = kvasir::seeded_uniform(77, "t", {n}, -3.0, 5.0, dt);
        for (std::int64_t i = 0; i < n; ++i) {
            const auto k = static_cast<std::uint64_t>(i);
            ASSERT_EQ(t.at(i), kvasir::round_to(dt, 0.5 + 2.5 * st.normal(k))) << kvasir::dtype_name(dt) << " " << i;
            ASSERT_EQ(u.at(i), kvasir::round_to(dt, -3.0 + 8.0 * st.uniform(k))) << kvasir::dtype_name(dt) << " " << i;
        }
    }
}

TEST(SeededTensor, HalfStorageBitsMatchStoreFromF64AtTheExtremes) {
    // The fill encodes f16/bf16 itself (the generic store is slow); it must give
    // exactly store_from_f64's bits, also for subnormal results, overflow to
    // inf and negative values that underflow to -0.
    struct Case {
        DType dt;
        double mean, stddev;
    };
    const Case cases[] = {
        {DType::f16, 0.0, 0x1p-20},  {DType::f16, 0.0, 3e4},       {DType::f16, 1.0, 1e-3},
        {DType::f16, 0.0, 0x1p-26},  {DType::bf16, 0.0, 1e-39},    {DType::bf16, 0.0, 1e38},
        {DType::bf16, -3.0, 0.7},    {DType::bf16, 0.0, 0x1p-134}, {DType::f16, -60000.0, 3000.0},
    };
    const std::int64_t n = 200'003;
    for (const Case& c : cases) {
        const SeededStream st(11, "half");
        const Tensor t = kvasir::seeded_normal(11, "half", {n}, c.mean, c.stddev, c.dt);
        std::uint16_t want = 0;
        int mismatches = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            kvasir::store_from_f64(c.dt, &want, 0, c.mean + c.stddev * st.normal(static_cast<std::uint64_t>(i)));
            if (raw_bits(t, i) != want && ++mismatches <= 3)
                ADD_FAILURE() << kvasir::dtype_name(c.dt) << " mean " << c.mean << " stddev " << c.stddev
                              << " element " << i << ": got " << std::hex << raw_bits(t, i) << " want " << want;
        }
        EXPECT_EQ(mismatches, 0);
    }
    // Uniform draws through the same encoder.
    const SeededStream st(12, "half-u");
    const Tensor u = kvasir::seeded_uniform(12, "half-u", {n}, -70000.0, 70000.0, DType::f16);
    std::uint16_t want = 0;
    for (std::int64_t i = 0; i < n; i += 7) {
        kvasir::store_from_f64(DType::f16, &want, 0, -70000.0 + 140000.0 * st.uniform(static_cast<std::uint64_t>(i)));
        ASSERT_EQ(raw_bits(u, i), want) << "element " << i;
    }
}

TEST(SeededTensor, HalfEncodersAgreeWithStoreFromF64OnEveryBoundary) {
    auto check = [](DType dt, double x) {
        std::uint16_t want = 0;
        kvasir::store_from_f64(dt, &want, 0, x);
        const std::uint16_t got = dt == DType::f16 ? kvasir::rng_detail::f16_bits(x) : kvasir::rng_detail::bf16_bits(x);
        return got == want;
    };
    // Every pair of neighbouring finite values: the exact midpoint (a tie), one
    // hair either side, and the same for negative values; then past the top.
    for (DType dt : {DType::f16, DType::bf16}) {
        const std::uint16_t top = dt == DType::f16 ? 0x7c00 : 0x7f80;  // infinity
        auto value = [dt](std::uint32_t bits) {
            const auto h = static_cast<std::uint16_t>(bits);
            return kvasir::load_as_f64(dt, &h, 0);
        };
        for (std::uint32_t v = 0; v < top; ++v) {
            const double lo = value(v);
            // Above the largest finite value the midpoint is where overflow starts.
            const double step = v + 1 == top ? lo - value(v - 1) : value(v + 1) - lo;
            const double mid = lo + step / 2;
            for (double x : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY)}) {
                ASSERT_TRUE(check(dt, x)) << kvasir::dtype_name(dt) << " " << std::hexfloat << x;
                ASSERT_TRUE(check(dt, -x)) << kvasir::dtype_name(dt) << " " << std::hexfloat << -x;
            }
        }
        for (double x : {0.0, -0.0, 0x1p-1074, -0x1p-1074, DBL_MIN, DBL_MAX, -DBL_MAX, 1e300, 65536.0, 0x1p128,
                         static_cast<double>(INFINITY), static_cast<double>(-INFINITY)})
            EXPECT_TRUE(check(dt, x)) << kvasir::dtype_name(dt) << " " << std::hexfloat << x;
    }
    const SeededStream st(3, "enc");
    for (std::uint64_t i = 0; i < 300'000; ++i) {
        const double m = 1.0 + st.uniform(2 * i);
        const int e = static_cast<int>(st.bits(2 * i + 1) % 340) - 170;
        const double x = (i & 1 ? -1 : 1) * std::ldexp(m, e);
        ASSERT_TRUE(check(DType::f16, x)) << std::hexfloat << x;
        ASSERT_TRUE(check(DType::bf16, x)) << std::hexfloat << x;
    }
}

TEST(SeededTensor, ElementIndexIsTheFlatIndexWhateverTheShape) {
    const Tensor a = kvasir::seeded_normal(9, "w", {6, 10}, 0.0, 1.0);
    const Tensor b = kvasir::seeded_normal(9, "w", {60}, 0.0, 1.0);
    const Tensor c = kvasir::seeded_normal(9, "w", {2, 3, 10}, 0.0, 1.0);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    EXPECT_EQ(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
    // A shorter tensor is a prefix of a longer one.
    const Tensor d = kvasir::seeded_normal(9, "w", {7}, 0.0, 1.0);
    EXPECT_EQ(std::memcmp(a.raw(), d.raw(), d.nbytes()), 0);
}

TEST(SeededTensor, DifferentNamesAndSeedsGiveDifferentStreams) {
    auto differing = [](const SeededStream& x, const SeededStream& y) {
        int n = 0;
        for (std::uint64_t i = 0; i < 256; ++i) n += x.bits(i) != y.bits(i);
        return n;
    };
    const SeededStream base(1, "x");
    EXPECT_GE(differing(base, SeededStream(1, "y")), 250);
    EXPECT_GE(differing(base, SeededStream(1, "x ")), 250);
    EXPECT_GE(differing(base, SeededStream(1, "")), 250);
    EXPECT_GE(differing(base, SeededStream(2, "x")), 250);
    EXPECT_GE(differing(base, SeededStream(1 + (1ull << 32), "x")), 250);  // the key's high word counts
    EXPECT_GE(differing(SeededStream(0, "a.weight"), SeededStream(0, "b.weight")), 250);
    // Neighbouring blocks of one stream are unrelated too.
    int same = 0;
    for (std::uint64_t i = 0; i < 256; ++i) same += base.bits(i) == base.bits(i + 4);
    EXPECT_LE(same, 2);

    const Tensor a = kvasir::seeded_normal(1, "x", {64}, 0.0, 1.0);
    const Tensor b = kvasir::seeded_normal(1, "y", {64}, 0.0, 1.0);
    EXPECT_NE(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

// --- statistics -------------------------------------------------------------------

TEST(SeededStats, NormalMomentsWithinFiveSigma) {
    const int n = 1'000'000;
    const Tensor t = kvasir::seeded_normal(2024, "stats", {n}, 0.0, 1.0, DType::f64);
    const double* z = t.as<double>();
    double s1 = 0, s2 = 0, s4 = 0, lag = 0, maxabs = 0;
    for (int i = 0; i < n; ++i) {
        s1 += z[i];
        s2 += z[i] * z[i];
        s4 += z[i] * z[i] * z[i] * z[i];
        if (i + 1 < n) lag += z[i] * z[i + 1];
        maxabs = std::max(maxabs, std::fabs(z[i]));
    }
    const double mean = s1 / n, var = s2 / n - mean * mean, m4 = s4 / n, corr = lag / (n - 1);
    EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt(n));
    EXPECT_LT(std::fabs(var - 1.0), 5.0 * std::sqrt(2.0 / n));
    EXPECT_LT(std::fabs(m4 - 3.0), 5.0 * std::sqrt(96.0 / n));
    EXPECT_LT(std::fabs(corr), 5.0 / std::sqrt(n));  // includes the cos/sin pairs of one Box–Muller draw
    EXPECT_GT(maxabs, 4.0);                          // tails are there...
    EXPECT_LT(maxabs, 6.8);                          // ...and bounded by sqrt(-2 ln 2^-33)

    // Shifted and scaled as documented.
    const Tensor w = kvasir::seeded_normal(2024, "stats", {n}, 3.0, 0.5, DType::f64);
    for (int i = 0; i < n; i += 9973) EXPECT_EQ(w.as<double>()[i], 3.0 + 0.5 * z[i]);
}

TEST(SeededStats, UniformStrictlyInsideAndFlat) {
    const int n = 1'000'000;
    const SeededStream st(31337, "uniform");
    double lo = 1, hi = 0, s1 = 0;
    std::vector<int> hist(100, 0);
    for (int i = 0; i < n; ++i) {
        const double u = st.uniform(static_cast<std::uint64_t>(i));
        ASSERT_GT(u, 0.0);
        ASSERT_LT(u, 1.0);
        lo = std::min(lo, u);
        hi = std::max(hi, u);
        s1 += u;
        ++hist[static_cast<std::size_t>(u * 100)];
    }
    EXPECT_LT(std::fabs(s1 / n - 0.5), 5.0 * std::sqrt(1.0 / 12.0 / n));
    double chi2 = 0;
    for (int h : hist) chi2 += (h - n / 100.0) * (h - n / 100.0) / (n / 100.0);
    EXPECT_LT(chi2, 99.0 + 5.0 * std::sqrt(2.0 * 99.0));
    EXPECT_LT(lo, 1e-4);
    EXPECT_GT(hi, 1.0 - 1e-4);
    // The extreme bit patterns stay strictly inside.
    EXPECT_EQ(kvasir::uniform_from_bits(0), 0x1p-33);
    EXPECT_EQ(kvasir::uniform_from_bits(0xffffffffu), 1.0 - 0x1p-33);
}

// --- libm-free log and sincos ---------------------------------------------------------

TEST(DetMath, SpecialValues) {
    EXPECT_EQ(kvasir::det_log(1.0), 0.0);
    EXPECT_EQ(kvasir::det_log(0.0), -INFINITY);
    EXPECT_EQ(kvasir::det_log(INFINITY), INFINITY);
    EXPECT_TRUE(std::isnan(kvasir::det_log(-1.0)));
    EXPECT_TRUE(std::isnan(kvasir::det_log(NAN)));
    EXPECT_NEAR(kvasir::det_log(2.0), 0.693147180559945309, 1e-16);
    EXPECT_NEAR(kvasir::det_log(0x1p-1074), -744.440071921381262, 1e-13);

    double s = 0, c = 0;
    kvasir::det_sincos_2pi(0.0, s, c);
    EXPECT_EQ(s, 0.0);
    EXPECT_EQ(c, 1.0);
    kvasir::det_sincos_2pi(0.25, s, c);
    EXPECT_EQ(s, 1.0);
    EXPECT_EQ(c, 0.0);
    kvasir::det_sincos_2pi(0.5, s, c);
    EXPECT_EQ(s, 0.0);
    EXPECT_EQ(c, -1.0);
    kvasir::det_sincos_2pi(0.75, s, c);
    EXPECT_EQ(s, -1.0);
    EXPECT_EQ(c, 0.0);
    kvasir::det_sincos_2pi(1.0 / 8.0, s, c);
    EXPECT_NEAR(s, 0.70710678118654752, 2e-16);
    EXPECT_NEAR(c, 0.70710678118654752, 2e-16);
}

TEST(DetMath, DetLogAccuracy) {
    static_assert(LDBL_MANT_DIG >= 64, "the reference needs extended long double");
    long double worst = 0;
    double worst_x = 0;
    auto probe = [&](double x) {
        if (x == 0.0) return;  // an underflowed sample; log(0) is in SpecialValues
        const long double e = ulp_error(kvasir::det_log(x), std::log(static_cast<long double>(x)));
        if (e > worst) worst = e, worst_x = x;
    };
    // Every uniform the normal transform can see, sampled; then the whole double range.
    const SeededStream st(1, "det_log");
    for (std::uint64_t i = 0; i < 400'000; ++i) probe(st.uniform(i));
    for (std::uint64_t i = 0; i < 400'000; ++i) {
        const double m = 0.5 + 0.5 * st.uniform(2 * i + 1'000'000);
        const int e = static_cast<int>(st.bits(2 * i + 1'000'001) % 2100) - 1075;
        probe(std::ldexp(m, e));
    }
    for (int k = -1074; k <= 1023; ++k) probe(std::ldexp(1.0, k));
    for (double x : {0x1p-33, 1.0 - 0x1p-33, 1.0 + 0x1p-52, 1.0 - 0x1p-53, 0x1.6a09e667f3bcdp-1,
                     0x1.6a09e667f3bccp-1, DBL_MAX, DBL_MIN, 0x1.fffffffffffffp-1023})
        probe(x);
    RecordProperty("det_log_max_ulp", std::to_string(static_cast<double>(worst)));
    std::printf("det_log: max error %.3f ulp (at %a) vs long-double log\n", static_cast<double>(worst), worst_x);
    EXPECT_LT(worst, 1.0L);
}

TEST(DetMath, DetSinCosAccuracy) {
    static_assert(LDBL_MANT_DIG >= 64, "the reference needs extended long double");
    const long double two_pi = 6.283185307179586476925286766559005768L;
    long double worst_s = 0, worst_c = 0;
    double worst_su = 0, worst_cu = 0;
    long double worst_libm = 0;
    auto probe = [&](double u) {
        double s = 0, c = 0;
        kvasir::det_sincos_2pi(u, s, c);
        // Reference: exact reduction to f in [-1/8, 1/8] (u - q/4 is exact),
        // then long-double sin/cos, then the quadrant identities.
        const double q = std::floor(4.0 * u + 0.5);
        const long double f = static_cast<long double>(u) - static_cast<long double>(q) / 4;
        const long double rs = std::sin(two_pi * f), rc = std::cos(two_pi * f);
        long double ws = 0, wc = 0;
        switch (static_cast<int>(q) & 3) {
            case 0: ws = rs; wc = rc; break;
            case 1: ws = rc; wc = -rs; break;
            case 2: ws = -rs; wc = -rc; break;
            default: ws = -rc; wc = rs; break;
        }
        const long double es = ulp_error(s, ws), ec = ulp_error(c, wc);
        if (es > worst_s) worst_s = es, worst_su = u;
        if (ec > worst_c) worst_c = ec, worst_cu = u;
        // And against plain double libm where its own argument rounding is harmless.
        const double ls = std::sin(2.0 * std::numbers::pi * u), lc = std::cos(2.0 * std::numbers::pi * u);
        if (std::fabs(ls) > 0.5) worst_libm = std::max(worst_libm, std::fabs(static_cast<long double>(s) - ls));
        if (std::fabs(lc) > 0.5) worst_libm = std::max(worst_libm, std::fabs(static_cast<long double>(c) - lc));
    };
    const SeededStream st(2, "det_sincos");
    for (std::uint64_t i = 0; i < 600'000; ++i) probe(st.uniform(i));
    // Around the quadrant seams and the zeros, where the reduction matters most.
    for (int k = 0; k <= 8; ++k)
        for (int j = 1; j <= 64; ++j) {
            probe(k / 8.0 + j * 0x1p-33);
            probe(std::max(0.0, k / 8.0 - j * 0x1p-33));
        }
    std::printf("det_sincos_2pi: max error sin %.3f ulp (u=%a), cos %.3f ulp (u=%a); max |diff| vs double libm %.3g\n",
                static_cast<double>(worst_s), worst_su, static_cast<double>(worst_c), worst_cu,
                static_cast<double>(worst_libm));
    RecordProperty("det_sin_max_ulp", std::to_string(static_cast<double>(worst_s)));
    RecordProperty("det_cos_max_ulp", std::to_string(static_cast<double>(worst_c)));
    EXPECT_LT(worst_s, 1.5L);
    EXPECT_LT(worst_c, 1.5L);
    EXPECT_LT(worst_libm, 4.0L * DBL_EPSILON);
}

// --- arguments and speed ---------------------------------------------------------------

TEST(SeededTensor, BadArgumentsAreBadInput) {
    auto code_of = [](auto&& fn) {
        try {
            fn();
        } catch (const kvasir::Error& e) {
            return e.code();
        }
        return kvasir::ErrorCode::internal;
    };
    EXPECT_EQ(code_of([] { kvasir::seeded_normal(1, "t", {4}, 0.0, 1.0, DType::i32); }),
              kvasir::ErrorCode::bad_input);
    EXPECT_EQ(code_of([] { kvasir::seeded_normal(1, "t", {4}, 0.0, INFINITY); }), kvasir::ErrorCode::bad_input);
    EXPECT_EQ(code_of([] { kvasir::seeded_normal(1, "t", {4}, NAN, 1.0); }), kvasir::ErrorCode::bad_input);
    EXPECT_EQ(code_of([] { kvasir::seeded_uniform(1, "t", {4}, 1.0, 0.0); }), kvasir::ErrorCode::bad_input);
    EXPECT_EQ(code_of([] { kvasir::seeded_uniform(1, "t", {4}, -DBL_MAX, DBL_MAX); }), kvasir::ErrorCode::bad_input);
    EXPECT_EQ(code_of([] { kvasir::seeded_normal(1, "t", {-1, 4}, 0.0, 1.0); }), kvasir::ErrorCode::bad_input);
    EXPECT_EQ(kvasir::seeded_normal(1, "t", {0, 4}, 0.0, 1.0).numel(), 0);
    const Tensor same = kvasir::seeded_uniform(1, "t", {5}, 2.0, 2.0);
    for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(same.at(i), 2.0);
}


}  // namespace
