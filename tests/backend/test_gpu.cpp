// The GPU backends (cuda, hip): what only they have, one test body run for
// each vendor. The backend contract — error bounds against cpu-ref, storage
// and f16 accumulation, shape errors, NaN/Inf, determinism, router and MoE —
// is tests/backend/test_conformance.cpp, run there on the kernel source
// compiled for the CPU emulation (gpu-emu, tests/backend/gpu_emulation.hpp)
// and on cuda:0 / hip:0 with their variants where a device exists.
//
// Four layers, from "runs anywhere" to "needs the device":
//  1. GpuMath.*  — the device scalar math (kernels/gpu/math.cuh) compiled for
//     the host: storage rounding bit-identical to kvasir::round_to, the
//     f16-accumulation step identical to the cpu emulation, sqrt correctly
//     rounded, exp ≤ 1 ulp and sin/cos ≤ 0.5 ulp (+ε) from the true values.
//     The kernels use these very functions with the same IEEE operations (no
//     contraction, no FTZ), so this pins the device numerics without a GPU.
//  1b. EmulatedKernels.* — what the kernels promise beyond the contract, on
//     the CPU emulation: every matmul output is one fmaf chain in ascending
//     k, and rope takes the cpu node's f32 angles.
//  2. Vendors/GpuVendor.* — for each vendor compiled in: a malformed variant
//     is Error(bad_input) on every machine, a valid one without a device is
//     Error(unsupported) carrying the probe's reason, coherent with the
//     registry listing. A vendor not compiled in skips, saying so.
//  3. Vendors/GpuOps.*, Cublas.* — the device itself: its capabilities, the
//     emulation's bits from the device (which is what lets layer 1b and the
//     gpu-emu conformance nodes stand for it), split-K atomics, cuBLAS TF32;
//     without a device these SKIP with the probe's reason (GTEST_SKIP,
//     visible in the output), e.g. "no CUDA device: cudaGetDeviceCount returned ...".
//
// Bounds (u = 2^-24, f32 unit roundoff; Higham §3.1 for γ_K = K·u/(1-K·u)):
//  * matmul f32: |ŷ - y| ≤ γ_K·Σ|x_k w_k| + u·|y| for any summation order —
//    the kernels' fmaf chain and cuBLAS alike.
//  * cuBLAS TF32: inputs rounded to a 10-bit fraction (u_tf32 = 2^-11 with
//    round-to-nearest; 2^-10 allowed here in case of truncation):
//    |ŷ - y| ≤ (2·u_tf32 + γ_K)·Σ|x w| + u·|y|; measured error must be ≥ 10×
//    the f32 path's on K = 2048.
//  * rope: the same f32 angles as the cpu node; only the sin/cos rounding
//    (≤ 1 ulp) and the fma (one rounding fewer) differ: 1e-5 for |x| ≲ 5.
#include "kvasir/backend/registry.hpp"
#include "tests/backend/matmul_bound.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tests/backend/gpu_emulation.hpp"  // last: it #defines the CUDA keywords

using namespace kvasir;
namespace gm = kvasir::gpu_host;

namespace {

using test::kU32;
using test::matmul_within_bound;

// Distance in units of the f32 ulp at the reference value.
double ulp_error(double got, double want) {
    const double a = std::fabs(want);
    const double ulp = a < std::numeric_limits<float>::min() ? std::ldexp(1.0, -149)
                                                             : std::ldexp(1.0, std::ilogb(static_cast<float>(a)) - 23);
    return std::fabs(got - want) / ulp;
}

// splitmix64: a deterministic stream of bit patterns for the exhaustive-ish sweeps.
struct Bits {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
};

const BackendStatus* status_of(const std::string& name) {
    static const std::vector<BackendStatus> all = list_backends();
    for (const BackendStatus& s : all)
        if (s.name == name) return &s;
    return nullptr;
}

std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

// Skip (visibly) unless `name` is compiled in / has a device.
#define REQUIRE_COMPILED(name)                                                          \
    do {                                                                                \
        const BackendStatus* st_ = status_of(name);                                     \
        ASSERT_NE(st_, nullptr) << name;                                                \
        if (!st_->compiled) GTEST_SKIP() << (name) << " not compiled: " << st_->reason; \
    } while (0)
#define REQUIRE_DEVICE(name)                                                         \
    do {                                                                             \
        REQUIRE_COMPILED(name);                                                      \
        const BackendStatus* st2_ = status_of(name);                                 \
        if (!st2_->available) GTEST_SKIP() << (name) << " absent: " << st2_->reason; \
    } while (0)

ErrorCode code_of(const std::string& spec) {
    try {
        create_backend(spec);
    } catch (const Error& e) {
        return e.code();
    }
    return ErrorCode::internal;  // "created": callers compare against error codes only
}

std::unique_ptr<Backend> ref() { return create_backend("cpu-ref"); }

std::string vendor_name(const ::testing::TestParamInfo<std::string>& p) { return p.param; }

// Asserts the γ_K bound element by element.
void expect_matmul_bound(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& yr, double extra_u,
                         const std::string& what) {
    ASSERT_TRUE(matmul_within_bound(x, w, y, yr, 2 * extra_u, kU32)) << what;
}

}  // namespace

// ---- 1. device math on the host ----------------------------------------------------------

TEST(GpuMath, StorageRoundingIsRoundToBitForBit) {
    Bits bits{1};
    for (int i = 0; i < 4'000'000; ++i) {
        const float x = gm::kg_float(static_cast<std::uint32_t>(bits.next()));
        if (std::isnan(x)) {
            EXPECT_TRUE(std::isnan(gm::kg_round_f16(x)));
            EXPECT_TRUE(std::isnan(gm::kg_round_bf16(x)));
            continue;
        }
        ASSERT_EQ(static_cast<double>(gm::kg_round_f16(x)), round_to_f16(x)) << std::hexfloat << x;
        ASSERT_EQ(static_cast<double>(gm::kg_round_bf16(x)), round_to_bf16(x)) << std::hexfloat << x;
    }
    for (const float x : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-05f, 5.9604645e-08f,
                          2.9802322e-08f, 2.98023259e-08f, 1e-9f, 2049.0f, 2051.0f, 3.3895314e38f, 3.4028235e38f,
                          std::numeric_limits<float>::denorm_min(), INFINITY, -INFINITY}) {
        EXPECT_EQ(static_cast<double>(gm::kg_round_f16(x)), round_to_f16(x)) << x;
        EXPECT_EQ(static_cast<double>(gm::kg_round_bf16(x)), round_to_bf16(x)) << x;
        EXPECT_EQ(std::signbit(gm::kg_round_f16(x)), std::signbit(x)) << x;
    }
    EXPECT_EQ(gm::kg_store(1.0f + 1.0f / 4096, gm::kStoreF32), 1.0f + 1.0f / 4096);
    EXPECT_EQ(gm::kg_store(1.0f + 1.0f / 4096, gm::kStoreF16), 1.0f);
    EXPECT_EQ(gm::kg_store(1.0f + 1.0f / 128, gm::kStoreBF16), 1.0f + 1.0f / 128);
}

TEST(GpuMath, F16AccumulationStepMatchesCpuEmulation) {
    // The f16 step of the kernels, acc = round_f16(acc + x·w) in double.
    Bits bits{2};
    for (int i = 0; i < 2'000'000; ++i) {
        const double scale = std::ldexp(1.0, static_cast<int>(bits.next() % 48) - 30);
        const double x = (static_cast<double>(bits.next() >> 11) * 0x1p-53 - 0.5) * scale;
        ASSERT_EQ(gm::kg_round_f16(x), round_to_f16(x)) << std::hexfloat << x;
    }
    for (const double x : {0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 6.1e-5, 5.96e-8, 2.9802322387695312e-08,
                           1e-9, 2049.0, 2051.0, 1e300, -std::numeric_limits<double>::infinity()})
        EXPECT_EQ(gm::kg_round_f16(x), round_to_f16(x)) << x;
}

TEST(GpuMath, SqrtIsCorrectlyRoundedFromAnyOneUlpSeed) {
    // HIP's sqrtf (clang 15: v_sqrt_f32) may be 1 ulp off; the fix-up must
    // land on the correctly rounded value from either neighbour.
    Bits bits{5};
    for (int i = 0; i < 2'000'000; ++i) {
        const float x = gm::kg_float(static_cast<std::uint32_t>(bits.next()) & 0x7fffffffu);
        if (!(x > 0.0f) || std::isinf(x)) continue;
        const float want = std::sqrt(x);
        ASSERT_EQ(gm::kg_sqrtf(x), want) << std::hexfloat << x;
        ASSERT_EQ(gm::kg_sqrt_fixup(x, gm::kg_float(gm::kg_bits(want) + 1)), want) << std::hexfloat << x;
        ASSERT_EQ(gm::kg_sqrt_fixup(x, gm::kg_float(gm::kg_bits(want) - 1)), want) << std::hexfloat << x;
    }
    EXPECT_EQ(gm::kg_sqrtf(0.0f), 0.0f);
    EXPECT_TRUE(std::signbit(gm::kg_sqrtf(-0.0f)));
    EXPECT_TRUE(std::isnan(gm::kg_sqrtf(-1.0f)));
    EXPECT_TRUE(std::isinf(gm::kg_sqrtf(INFINITY)));
    EXPECT_EQ(gm::kg_sqrtf(std::numeric_limits<float>::denorm_min()), std::sqrt(std::numeric_limits<float>::denorm_min()));
}

TEST(GpuMath, ExpWithinOneUlp) {
    Bits bits{3};
    double worst = 0;
    for (int i = 0; i < 4'000'000; ++i) {
        const float x = static_cast<float>(static_cast<double>(bits.next() >> 11) * 0x1p-53 * 193.0 - 104.0);
        const double want = std::exp(static_cast<double>(x));
        const float got = gm::kg_expf(x);
        if (want > std::numeric_limits<float>::max()) {
            ASSERT_TRUE(std::isinf(got)) << x;
            continue;
        }
        worst = std::max(worst, ulp_error(got, want));
        ASSERT_LE(ulp_error(got, want), 1.0) << std::hexfloat << x;
    }
    RecordProperty("exp_max_ulp", std::to_string(worst));
    EXPECT_EQ(gm::kg_expf(0.0f), 1.0f);
    EXPECT_EQ(gm::kg_expf(-INFINITY), 0.0f);
    EXPECT_TRUE(std::isinf(gm::kg_expf(INFINITY)));
    EXPECT_TRUE(std::isnan(gm::kg_expf(NAN)));
    EXPECT_EQ(gm::kg_expf(-200.0f), 0.0f);
    EXPECT_GT(gm::kg_expf(-100.0f), 0.0f);  // a subnormal, not flushed
}

TEST(GpuMath, SinCosWithinHalfUlpOfTheF32Angle) {
    // Rope angles: positions up to 2^17 times inverse frequencies ≤ 1.
    Bits bits{4};
    for (int i = 0; i < 2'000'000; ++i) {
        const float a = static_cast<float>((static_cast<double>(bits.next() >> 11) * 0x1p-53 - 0.5) * 262144.0);
        float s = 0, c = 0;
        gm::kg_sincosf(a, &s, &c);
        ASSERT_LE(ulp_error(s, std::sin(static_cast<double>(a))), 0.501) << std::hexfloat << a;
        ASSERT_LE(ulp_error(c, std::cos(static_cast<double>(a))), 0.501) << std::hexfloat << a;
    }
    float s = 1, c = 0;
    gm::kg_sincosf(0.0f, &s, &c);
    EXPECT_EQ(s, 0.0f);
    EXPECT_EQ(c, 1.0f);
    gm::kg_sincosf(NAN, &s, &c);
    EXPECT_TRUE(std::isnan(s) && std::isnan(c));
    gm::kg_sincosf(INFINITY, &s, &c);
    EXPECT_TRUE(std::isnan(s) && std::isnan(c));
}

// ---- 1b. the kernels themselves, on the CPU emulation ---------------------------------

TEST(EmulatedKernels, MatmulIsOneFmaChainPerOutputInAscendingK) {
    // The order the kernel promises (ops.cuh), whatever the tiling: acc = 0,
    // then acc = fmaf(x_k, w_k, acc) for k = 0, 1, ... — every output, every
    // edge of the 64×64 tile and of the 16-deep K stage.
    test::EmulatedGpuBackend emu("gpu-emu");
    for (const auto& [T, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 1, 1}, {5, 7, 13}, {70, 130, 100}, {3, 65, 33}, {64, 70, 1000}}) {
        const Tensor x = seeded_normal(7, "emu/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(7, "emu/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const Tensor y = emu.matmul(x, w);
        std::vector<float> want(static_cast<std::size_t>(T * N));
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t n = 0; n < N; ++n) {
                float acc = 0.0f;
                for (std::int64_t k = 0; k < K; ++k) acc = std::fmaf(x.as<float>()[t * K + k], w.as<float>()[n * K + k], acc);
                want[static_cast<std::size_t>(t * N + n)] = acc;
            }
        EXPECT_EQ(std::memcmp(y.raw(), want.data(), y.nbytes()), 0) << T << "x" << N << "x" << K;
    }
}

TEST(EmulatedKernels, RopeBothLayoutsTakeTheCpuNodesAngles) {
    const std::int64_t T = 6, H = 3, D = 64;
    const Tensor x = seeded_normal(13, "emu/p/x", {T, H, D}, 0, 1);
    std::vector<std::int64_t> pos(T);
    for (std::int64_t t = 0; t < T; ++t) pos[std::size_t(t)] = 777 * t;
    test::EmulatedGpuBackend emu("gpu-emu");
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        const Tensor yc = create_backend("cpu")->rope(x, pos, {1e6, layout});
        EXPECT_TRUE(within(compare(yc, emu.rope(x, pos, {1e6, layout})).max_abs, 1e-5));
    }
}

// ---- 2. specs and absence, per vendor ----------------------------------------------------

class GpuVendor : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuVendor, ProbeAndCreateAgreeWithTheRegistry) {
    const std::string name = GetParam();
    REQUIRE_COMPILED(name);
    const BackendStatus* st = status_of(name);
    if (!st->available) {
        EXPECT_EQ(st->reason.rfind("no " + upper(name) + " device", 0), 0u) << st->reason;
        try {
            create_backend(name);
            FAIL() << "created " << name << " without a device";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::unsupported);
            EXPECT_NE(std::string(e.what()).find(st->reason), std::string::npos) << e.what();
        }
        // Absent, never an error: the default node list simply leaves it out.
        for (const std::string& node : default_nodes()) EXPECT_NE(node.rfind(name, 0), 0u) << node;
    } else {
        ASSERT_FALSE(st->devices.empty());
        const auto node = create_backend(name);
        EXPECT_EQ(node->capabilities().backend, name);
        EXPECT_EQ(node->capabilities().node, name + ":0");
        EXPECT_EQ(code_of(name + ":" + std::to_string(st->devices.size())), ErrorCode::unsupported);
    }
}

TEST_P(GpuVendor, MalformedVariantsAreBadInputOnEveryMachine) {
    const std::string name = GetParam();
    REQUIRE_COMPILED(name);
    for (const char* opts : {"storage=i32", "storage=f64", "acc=f64", "acc=bf16", "nondeterministic=2",
                             "nondeterministic=yes", "tf32=1", "blas=mkl", "speed=fast", "acc=f16,nondeterministic=1"}) {
        const std::string spec = name + ":" + opts;
        EXPECT_EQ(code_of(spec), ErrorCode::bad_input) << spec;
    }
    if (name == "cuda") {
        for (const char* opts : {"blas=cublas,tf32=2", "blas=cublas,acc=f16", "blas=cublas,nondeterministic=1"})
            EXPECT_EQ(code_of(name + ":" + opts), ErrorCode::bad_input) << opts;
    } else {
        EXPECT_EQ(code_of("hip:blas=cublas"), ErrorCode::bad_input);
        // hipBLAS is a real thing this build lacks: unsupported, with the reason.
        EXPECT_EQ(code_of("hip:blas=hipblas"), ErrorCode::unsupported);
    }
}

TEST_P(GpuVendor, ValidVariantsNeedOnlyADevice) {
    const std::string name = GetParam();
    REQUIRE_COMPILED(name);
    const bool device = status_of(name)->available;
    struct Case {
        std::string spec, node;
    };
    std::vector<Case> cases = {{name, name + ":0"},
                               {name + ":0:storage=bf16,acc=f16", name + ":0:acc=f16,storage=bf16"},
                               {name + ":storage=f16", name + ":0:storage=f16"},
                               {name + ":nondeterministic=1", name + ":0:nondeterministic=1"},
                               {name + ":nondeterministic=0,acc=f32,storage=f32", name + ":0"},
                               {name + ":blas=none", name + ":0"}};
    if (name == "cuda") {
        cases.push_back({"cuda:0:blas=cublas", "cuda:0:blas=cublas,tf32=0"});
        cases.push_back({"cuda:0:blas=cublas:tf32=1", "cuda:0:blas=cublas,tf32=1"});
        cases.push_back({"cuda:blas=cublas,tf32=0,storage=bf16", "cuda:0:blas=cublas,storage=bf16,tf32=0"});
    }
    for (const Case& c : cases) {
        if (!device) {
            EXPECT_EQ(code_of(c.spec), ErrorCode::unsupported) << c.spec;
            continue;
        }
        const auto node = create_backend(c.spec);
        EXPECT_EQ(node->capabilities().node, c.node) << c.spec;
        EXPECT_EQ(create_backend(node->capabilities().node)->capabilities().node, c.node) << "canonical re-parses";
    }
}

INSTANTIATE_TEST_SUITE_P(Vendors, GpuVendor, ::testing::Values("cuda", "hip"),
                         vendor_name);

// ---- 3. ops on the device ----------------------------------------------------------------

class GpuOps : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override { REQUIRE_DEVICE(GetParam()); }
    std::unique_ptr<Backend> node(const std::string& opts = "") const {
        return create_backend(opts.empty() ? GetParam() : GetParam() + ":" + opts);
    }
};

TEST_P(GpuOps, CapabilitiesDescribeTheDevice) {
    const Capabilities c = node()->capabilities();
    EXPECT_EQ(c.backend, GetParam());
    EXPECT_FALSE(c.device.empty());
    EXPECT_NE(c.runtime.find("runtime"), std::string::npos) << c.runtime;
    EXPECT_EQ(c.output, DType::f32);
    EXPECT_EQ(c.storage, DType::f32);
    EXPECT_EQ(c.accumulation, DType::f32);
    EXPECT_TRUE(c.fma);
    EXPECT_GT(c.threads, 1000);
    EXPECT_TRUE(c.deterministic);
    EXPECT_FALSE(node("nondeterministic=1")->capabilities().deterministic);
    bool has_arch = false;
    for (const auto& [k, v] : c.extra) has_arch = has_arch || (k == "arch" && !v.empty());
    EXPECT_TRUE(has_arch);
}

TEST_P(GpuOps, NondeterministicVariantStaysWithinTheBound) {
    // Split-K with atomics: the claim is deterministic=false and the same
    // error bound; whether two runs differ depends on the scheduler.
    auto nd = node("nondeterministic=1");
    EXPECT_FALSE(nd->capabilities().deterministic);
    const Tensor x = seeded_normal(6, "gpu/n/x", {16, 2048}, 0, 1);
    const Tensor w = seeded_normal(6, "gpu/n/w", {512, 2048}, 0, 1 / std::sqrt(2048.0));
    const Tensor yr = ref()->matmul(x, w);
    int differing_runs = 0;
    const Tensor first = nd->matmul(x, w);
    expect_matmul_bound(x, w, first, yr, 0.0, "nondeterministic");
    for (int run = 0; run < 20; ++run) {
        const Tensor again = nd->matmul(x, w);
        differing_runs += std::memcmp(first.raw(), again.raw(), first.nbytes()) != 0;
    }
    RecordProperty("runs_differing_from_the_first_of_20", differing_runs);
    std::printf("[ info ] %s:nondeterministic=1: %d of 20 reruns differ from the first\n", GetParam().c_str(),
                differing_runs);
}

TEST_P(GpuOps, RopeTakesTheCpuNodesAngles) {
    const Tensor x = seeded_normal(13, "gpu/p/x", {8, 2, 64}, 0, 1);
    std::vector<std::int64_t> pos(8);
    for (int i = 0; i < 8; ++i) pos[static_cast<std::size_t>(i)] = 1000 * i;
    auto gpu = node();
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        const CompareStats c = compare(create_backend("cpu")->rope(x, pos, {1e6, layout}), gpu->rope(x, pos, {1e6, layout}));
        EXPECT_TRUE(within(c.max_abs, 1e-5)) << c.max_abs;
    }
}

TEST_P(GpuOps, DeviceGivesTheEmulationsBits) {
    // The kernels are one source with one order per reduction, kvasir's own
    // exp/sin/cos/sqrt and no contraction: the device must produce, bit for
    // bit, what the same source computes on the CPU emulation. This is what
    // lets the gpu-emu conformance nodes and EmulatedKernels.* speak for the
    // device. (Not split-K, whose atomics reorder on purpose, nor cuBLAS.)
    const Tensor x = seeded_normal(37, "gpu/b/x", {70, 300}, 0, 1);
    const Tensor w = seeded_normal(37, "gpu/b/w", {130, 300}, 0, 0.06);
    const Tensor wide = seeded_normal(37, "gpu/b/wide", {4, 768}, 0, 1);
    const Tensor wn = seeded_normal(37, "gpu/b/wn", {2048, 768}, 0, 0.04);
    const Tensor s = seeded_normal(37, "gpu/b/s", {3, 5000}, 0, 3);
    const Tensor sw = seeded_normal(37, "gpu/b/sw", {5000}, 1, 0.1);
    const Tensor r = seeded_normal(37, "gpu/b/r", {5, 4, 64}, 0, 1);
    const std::vector<std::int64_t> pos{0, 1, 100, 4096, 65535};
    for (const char* opts : {"", "storage=f16", "storage=bf16", "acc=f16"}) {
        const std::string suffix = *opts ? std::string(":") + opts : "";
        auto dev = create_backend(GetParam() + suffix);
        test::EmulatedGpuBackend emu("gpu-emu" + suffix);
        const auto same = [&](const Tensor& a, const Tensor& b, const char* op) {
            ASSERT_EQ(a.nbytes(), b.nbytes()) << op;
            EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << op << " " << dev->capabilities().node;
        };
        same(dev->matmul(x, w), emu.matmul(x, w), "matmul");
        same(dev->matmul(wide, wn), emu.matmul(wide, wn), "matmul 4x2048x768");
        same(dev->softmax(s), emu.softmax(s), "softmax");
        same(dev->rmsnorm(s, sw, 1e-6), emu.rmsnorm(s, sw, 1e-6), "rmsnorm");
        same(dev->swiglu(s, s), emu.swiglu(s, s), "swiglu");
        same(dev->sigmoid(s), emu.sigmoid(s), "sigmoid");
        for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal})
            same(dev->rope(r, pos, {1e6, layout}), emu.rope(r, pos, {1e6, layout}), "rope");
    }
}

INSTANTIATE_TEST_SUITE_P(Vendors, GpuOps, ::testing::Values("cuda", "hip"), vendor_name);

// ---- cuBLAS, the vendor fast path ------------------------------------------------------

TEST(Cublas, Tf32OffMeetsTheF32BoundTf32OnIsVisiblyCoarser) {
    REQUIRE_DEVICE("cuda");
    const Tensor x = seeded_normal(41, "cublas/x", {64, 2048}, 0, 1);
    const Tensor w = seeded_normal(41, "cublas/w", {768, 2048}, 0, 1 / std::sqrt(2048.0));
    const Tensor yr = ref()->matmul(x, w);
    auto off = create_backend("cuda:blas=cublas,tf32=0");
    auto on = create_backend("cuda:blas=cublas,tf32=1");
    EXPECT_EQ(on->capabilities().node, "cuda:0:blas=cublas,tf32=1");
    const Tensor y_off = off->matmul(x, w), y_on = on->matmul(x, w);
    expect_matmul_bound(x, w, y_off, yr, 0.0, "cublas tf32=0");
    expect_matmul_bound(x, w, y_on, yr, 1.0 / 1024, "cublas tf32=1");
    const CompareStats s_off = compare(yr, y_off), s_on = compare(yr, y_on);
    const CompareStats s_kernel = compare(yr, create_backend("cuda")->matmul(x, w));
    std::printf("[ info ] max|Δ| vs cpu-ref: cuda %.3g, cublas tf32=0 %.3g, cublas tf32=1 %.3g; cosine tf32=1 %.10f\n",
                s_kernel.max_abs, s_off.max_abs, s_on.max_abs, s_on.cosine);
    EXPECT_GT(s_on.max_abs, 10 * s_off.max_abs);
    EXPECT_TRUE(within(s_off.max_abs, 10 * s_kernel.max_abs + 1e-6));
    const Tensor y_again = off->matmul(x, w);
    EXPECT_EQ(std::memcmp(y_off.raw(), y_again.raw(), y_off.nbytes()), 0) << "cuBLAS run-to-run";
}
