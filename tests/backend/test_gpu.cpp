// The GPU backends (cuda, hip): what only they have, one test body run for
// each vendor. The backend contract — error bounds against cpu-ref, storage
// and f16 accumulation, shape errors, NaN/Inf, determinism, router and MoE —
// is tests/backend/test_conformance.cpp, run there on gpu-emu (the GPU node's
// own host code and kernels on the CPU emulation of a GPU:
// gpu_emulated_node.hpp) and on cuda:0 / hip:0 with their variants where a
// device exists.
//
// Four layers, from "runs anywhere" to "needs the device":
//  1. GpuMath.*  — the device scalar math (kernels/gpu/math.cuh) compiled for
//     the host: storage rounding bit-identical to kvasir::round_to, the
//     f16-accumulation step identical to the cpu emulation, sqrt correctly
//     rounded, exp ≤ 1 ulp, log1p and sin/cos ≤ 0.5 ulp (+ε) from the true values.
//     The kernels use these very functions with the same IEEE operations (no
//     contraction, no FTZ), so this pins the device numerics without a GPU.
//  1b. EmulatedKernels.* — what the kernels promise beyond the contract
//     (kernels launched one by one on the thread model, gpu_emulation.hpp,
//     or the gpu-emu node): every matmul output is one fmaf chain in
//     ascending k whatever the tiling, a grouped launch gives each job its
//     own launch's bits, split-K is nondeterministic at the audit's widths
//     and the determinism step sees it, Gated DeltaNet decoding (conv
//     history, f32 state carried between calls) gives the bits of one call
//     under every variant, acc=f16 sums in half, and the whole forward pass
//     of ten fixtures on gpu-emu meets the cpu node's f32 tolerance against
//     cpu-ref (its decoder bit-identical to its full forward).
//  2. Vendors/GpuVendor.* — for each vendor compiled in: a malformed variant
//     is Error(bad_input) on every machine, a valid one without a device is
//     Error(unsupported) carrying the probe's reason, coherent with the
//     registry listing. A vendor not compiled in skips, saying so.
//  3. Vendors/GpuOps.*, Vendors/GpuDevice.*, Cublas.* — the node on its
//     device: capabilities, split-K atomics, experts and a MoE block on the
//     device, residency, data movement, five launches a MoE block, cuBLAS
//     TF32; GpuOps runs on gpu-emu too (always), GpuDevice (the device
//     gives gpu-emu's bits, which is what lets gpu-emu stand for it) and
//     Cublas need the device. Without one they SKIP with the probe's reason
//     (GTEST_SKIP, visible in the output), e.g. "no CUDA device:
//     cudaGetDeviceCount returned ...".
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
#include "kvasir/audit/capture.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/backend/registry.hpp"
#include "tests/backend/device_experts_check.hpp"
#include "tests/backend/device_residency_check.hpp"
#include "tests/backend/matmul_bound.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/steps/forward.hpp"

#include <gtest/gtest.h>

#include "../common/ci_skip.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
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
        /* hipcc is installed by the setup: HIP not compiled under CI is a setup bug */    \
        if (!st_->compiled && std::string(name) == "hip") KVASIR_SKIP_OR_FAIL_IN_CI((name) << " not compiled: " << st_->reason); \
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

std::string vendor_name(const ::testing::TestParamInfo<std::string>& p) {
    std::string name = p.param;
    std::replace(name.begin(), name.end(), '-', '_');  // a test name takes no '-'
    return name;
}

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

TEST(GpuMath, Log1pWithinHalfUlp) {
    // softplus's log(1 + e^x): arguments from just above -1 to e^20 ≈ 4.9e8,
    // and tiny ones (where 1 + y is not exact in double) down to subnormals.
    Bits bits{6};
    double worst = 0;
    for (int i = 0; i < 2'000'000; ++i) {
        const double r = static_cast<double>(bits.next() >> 11) * 0x1p-53;
        float y;
        if (i % 4 == 0)
            y = static_cast<float>(r * 2.0 - 1.0);  // (-1, 1)
        else if (i % 4 == 1)
            y = static_cast<float>(std::exp(r * 20.0));  // [1, e^20]
        else if (i % 4 == 2)
            y = static_cast<float>((bits.next() & 1 ? 1 : -1) * std::ldexp(1.0 + r, -static_cast<int>(bits.next() % 140)));
        else
            y = gm::kg_expf(static_cast<float>(r * 60.0 - 40.0));  // what softplus hands it
        if (!(y > -1.0f)) continue;
        const double want = std::log1p(static_cast<double>(y));
        const float got = gm::kg_log1pf(y);
        worst = std::max(worst, ulp_error(got, want));
        ASSERT_LE(ulp_error(got, want), 0.501) << std::hexfloat << y;
    }
    RecordProperty("log1p_max_ulp", std::to_string(worst));
    EXPECT_EQ(gm::kg_log1pf(0.0f), 0.0f);
    EXPECT_TRUE(std::signbit(gm::kg_log1pf(-0.0f)));
    EXPECT_EQ(gm::kg_log1pf(-1.0f), -INFINITY);
    EXPECT_TRUE(std::isnan(gm::kg_log1pf(-2.0f)));
    EXPECT_TRUE(std::isnan(gm::kg_log1pf(-INFINITY)));
    EXPECT_TRUE(std::isnan(gm::kg_log1pf(NAN)));
    EXPECT_EQ(gm::kg_log1pf(INFINITY), INFINITY);
    EXPECT_EQ(gm::kg_log1pf(std::numeric_limits<float>::max()), std::log1p(std::numeric_limits<float>::max()));
    EXPECT_EQ(gm::kg_log1pf(std::numeric_limits<float>::denorm_min()), std::numeric_limits<float>::denorm_min());
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

namespace {
// y = x·wᵀ by the kernel with tiling Tl, launched on the emulation over the
// whole shape (one K slice).
template <class Tl, bool kF16Acc>
std::vector<float> tiled_matmul(const Tensor& x, const Tensor& w) {
    const int t = static_cast<int>(x.dim(0)), n = static_cast<int>(w.dim(0)), k = static_cast<int>(w.dim(1));
    std::vector<float> y(static_cast<std::size_t>(t) * static_cast<std::size_t>(n), -1.0f);
    emu::launch({static_cast<unsigned>((n + Tl::tn - 1) / Tl::tn), static_cast<unsigned>((t + Tl::tm - 1) / Tl::tm), 1},
                gm::kMatmulThreads, gm::matmul_kernel<Tl, kF16Acc, false>, x.as<float>(), w.as<float>(), y.data(), t, n, k,
                std::max(k, 1), gm::kStoreF32);
    return y;
}
// The chain every output must be: acc = 0, acc = fmaf(x_k, w_k, acc) in ascending k.
std::vector<float> fma_chains(const Tensor& x, const Tensor& w) {
    const std::int64_t T = x.dim(0), N = w.dim(0), K = w.dim(1);
    std::vector<float> want(static_cast<std::size_t>(T * N));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t n = 0; n < N; ++n) {
            float acc = 0.0f;
            for (std::int64_t k = 0; k < K; ++k) acc = std::fmaf(x.as<float>()[t * K + k], w.as<float>()[n * K + k], acc);
            want[static_cast<std::size_t>(t * N + n)] = acc;
        }
    return want;
}
}  // namespace

TEST(EmulatedKernels, MatmulIsOneFmaChainPerOutputInAscendingK) {
    // The order the kernel promises (ops.cuh), whatever the tiling: acc = 0,
    // then acc = fmaf(x_k, w_k, acc) for k = 0, 1, ... — every output, every
    // edge of the 64×64 tile and of the 16-deep K stage.
    const auto emu = test::make_emulated_gpu_node("gpu-emu");
    for (const auto& [T, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 1, 1}, {5, 7, 13}, {70, 130, 100}, {3, 65, 33}, {64, 70, 1000}}) {
        const Tensor x = seeded_normal(7, "emu/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(7, "emu/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const Tensor y = emu->matmul(x, w);
        const std::vector<float> want = fma_chains(x, w);
        EXPECT_EQ(std::memcmp(y.raw(), want.data(), y.nbytes()), 0) << T << "x" << N << "x" << K;
    }
}


TEST(EmulatedKernels, EveryTilingIsTheSameChainPerOutput) {
    // The tiling is speed, never bits (ops.cuh): wide (128×128, 8×8 per
    // thread, K stages of 8), square (64×64, 4×4, 16) and skinny (16×64,
    // 1×4, 16) give every output the ascending fmaf chain — at ragged edges
    // of every tile and stage — and, under acc=f16, each other's bits.
    for (const auto& [T, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 1, 1}, {1, 130, 37}, {16, 64, 16}, {17, 65, 9}, {131, 129, 25}, {3, 200, 130}}) {
        const std::string what = fmt::format("{}x{}x{}", T, N, K);
        const Tensor x = seeded_normal(9, "tiles/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(9, "tiles/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const std::vector<float> want = fma_chains(x, w);
        EXPECT_EQ((tiled_matmul<gm::WideTiling, false>(x, w)), want) << "wide " << what;
        EXPECT_EQ((tiled_matmul<gm::SquareTiling, false>(x, w)), want) << "square " << what;
        EXPECT_EQ((tiled_matmul<gm::SkinnyTiling, false>(x, w)), want) << "skinny " << what;
        const std::vector<float> half = tiled_matmul<gm::SquareTiling, true>(x, w);
        EXPECT_NE(half, want) << "acc=f16 sums in half: " << what;
        EXPECT_EQ((tiled_matmul<gm::WideTiling, true>(x, w)), half) << "wide acc=f16 " << what;
        EXPECT_EQ((tiled_matmul<gm::SkinnyTiling, true>(x, w)), half) << "skinny acc=f16 " << what;
    }
}

TEST(EmulatedKernels, MatmulTilingByShape) {
    // Hand-computed: T ≤ 16 skinny; wide where its 128×128 tiles number at
    // least 512 (4096×4096: 32·32 = 1024; 2048×4096: 16·32 = 512), square
    // otherwise (512×4096: 4·32 = 128; 17×4096: 1·32).
    EXPECT_EQ(gm::matmul_tiling(1, 4096), gm::Tiling::skinny);
    EXPECT_EQ(gm::matmul_tiling(16, 151936), gm::Tiling::skinny);
    EXPECT_EQ(gm::matmul_tiling(17, 4096), gm::Tiling::square);
    EXPECT_EQ(gm::matmul_tiling(512, 4096), gm::Tiling::square);
    EXPECT_EQ(gm::matmul_tiling(2048, 4096), gm::Tiling::wide);
    EXPECT_EQ(gm::matmul_tiling(2047, 4096), gm::Tiling::wide);  // 16 row tiles still
    EXPECT_EQ(gm::matmul_tiling(1920, 4096), gm::Tiling::square);  // 15·32 = 480
    EXPECT_EQ(gm::matmul_tiling(4096, 4096), gm::Tiling::wide);
    EXPECT_EQ(gm::grouped_tiling(1), gm::Tiling::skinny);
    EXPECT_EQ(gm::grouped_tiling(16), gm::Tiling::skinny);
    EXPECT_EQ(gm::grouped_tiling(17), gm::Tiling::square);
}

TEST(EmulatedKernels, AGroupedLaunchGivesEachJobTheBitsOfItsOwnLaunch) {
    // grouped_matmul_kernel (a MoE layer's experts in one launch): jobs of
    // different T, N and K — empty ones dropped by number_tiles — under the
    // skinny and the square tiling, f32 and acc=f16, each job's output the
    // bits of matmul_kernel launched on it alone; nothing written outside
    // the jobs' outputs.
    const std::vector<std::tuple<int, int, int>> shapes{{1, 24, 64}, {5, 64, 24}, {0, 24, 64}, {16, 70, 33},
                                                       {3, 0, 8},   {1, 1, 1},   {7, 130, 64}};
    std::vector<Tensor> xs, ws;
    std::vector<std::vector<float>> ys;
    for (std::size_t j = 0; j < shapes.size(); ++j) {
        const auto [T, N, K] = shapes[j];
        xs.push_back(seeded_normal(10, "grp/x" + std::to_string(j), {T, K}, 0, 1));
        ws.push_back(seeded_normal(10, "grp/w" + std::to_string(j), {N, K}, 0, 0.2));
    }
    // number_tiles, by hand for skinny (16×64): 1·1, 1·1, (dropped), 1·2, (dropped), 1·1, 1·3.
    {
        std::vector<gm::MatmulJob> jobs;
        for (const auto& [T, N, K] : shapes) jobs.push_back({nullptr, nullptr, nullptr, T, N, K, -1});
        int count = static_cast<int>(jobs.size());
        EXPECT_EQ(gm::number_tiles(jobs.data(), count, gm::Tiling::skinny), 8);
        ASSERT_EQ(count, 5);
        const std::vector<int> first{0, 1, 2, 4, 5};
        for (int j = 0; j < count; ++j) EXPECT_EQ(jobs[static_cast<std::size_t>(j)].first_tile, first[static_cast<std::size_t>(j)]) << j;
    }
    for (const gm::Tiling tiling : {gm::Tiling::skinny, gm::Tiling::square}) {
        for (const bool half : {false, true}) {
            std::vector<gm::MatmulJob> jobs;
            ys.clear();
            for (std::size_t j = 0; j < shapes.size(); ++j) {
                const auto [T, N, K] = shapes[j];
                ys.emplace_back(static_cast<std::size_t>(T * N) + 1, -7.0f);  // one guard element past the output
            }
            for (std::size_t j = 0; j < shapes.size(); ++j) {
                const auto [T, N, K] = shapes[j];
                jobs.push_back({xs[j].as<float>(), ws[j].as<float>(), ys[j].data(), T, N, K, 0});
            }
            int count = static_cast<int>(jobs.size());
            const long long tiles = gm::number_tiles(jobs.data(), count, tiling);
            gm::with_tiling(tiling, [&]<class Tl>(Tl) {
                if (half)
                    emu::launch({static_cast<unsigned>(tiles), 1, 1}, gm::kMatmulThreads, gm::grouped_matmul_kernel<Tl, true>,
                                static_cast<const gm::MatmulJob*>(jobs.data()), count, gm::kStoreF32);
                else
                    emu::launch({static_cast<unsigned>(tiles), 1, 1}, gm::kMatmulThreads, gm::grouped_matmul_kernel<Tl, false>,
                                static_cast<const gm::MatmulJob*>(jobs.data()), count, gm::kStoreF32);
            });
            for (std::size_t j = 0; j < shapes.size(); ++j) {
                const std::string what = fmt::format("job {} tiling {} acc {}", j, static_cast<int>(tiling), half ? "f16" : "f32");
                std::vector<float> own = half ? tiled_matmul<gm::SquareTiling, true>(xs[j], ws[j])
                                              : tiled_matmul<gm::SquareTiling, false>(xs[j], ws[j]);
                own.push_back(-7.0f);
                EXPECT_EQ(ys[j], own) << what;
            }
        }
    }
}

TEST(EmulatedKernels, SplitKCutsEveryKOfThreeOrMoreIntoAtLeastThreeSlices) {
    // Hand-computed: K = 4 → 1 (4 slices), 32 → 10 (4: 10, 10, 10, 2),
    // 64 → 16 (4 whole tiles), 192 → 64 (3), 2048 → 256 (8), 2049 → 256
    // (9), 4096 → 512 (8).
    EXPECT_EQ(gm::split_k_chunk(4), 1);
    EXPECT_EQ(gm::split_k_chunk(32), 10);
    EXPECT_EQ(gm::split_k_chunk(64), 16);
    EXPECT_EQ(gm::split_k_chunk(192), 64);
    EXPECT_EQ(gm::split_k_chunk(2048), 256);
    EXPECT_EQ(gm::split_k_chunk(2049), 256);
    EXPECT_EQ(gm::split_k_chunk(4096), 512);
    for (int k = 1; k <= 20000; ++k) {
        const int chunk = gm::split_k_chunk(k), slices = (k + chunk - 1) / chunk;
        ASSERT_GE(chunk, 1) << k;
        if (k >= 3) ASSERT_GE(slices, 3) << "K " << k << " chunk " << chunk;
        ASSERT_LE(slices, 9) << "K " << k << " chunk " << chunk;
        if (k >= 3 * gm::kTileK) ASSERT_EQ(chunk % gm::kTileK, 0) << k;
    }
}

TEST(EmulatedKernels, SplitKIsNondeterministicAtTheAuditsWidths) {
    // The blocks of a split-K launch run in a new order each time (as a GPU
    // may run them): at every K of the shipped fixtures (head dim 32, hidden
    // 64/96, intermediate 192) reruns differ in their bits and every run
    // stays within the f32 matmul bound. With one or two K slices (the
    // issue-#38 finding: K < 256 had one) nothing could differ.
    const auto nd = test::make_emulated_gpu_node("gpu-emu:nondeterministic=1");
    ASSERT_FALSE(nd->capabilities().deterministic);
    for (const std::int64_t K : {32, 64, 96, 192}) {
        const Tensor x = seeded_normal(8, "emu/nd/x", {16, K}, 0, 1);
        const Tensor w = seeded_normal(8, "emu/nd/w", {96, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const Tensor yr = create_backend("cpu-ref")->matmul(x, w);
        const Tensor first = nd->matmul(x, w);
        int differing = 0;
        for (int run = 0; run < 8; ++run) {
            const Tensor again = nd->matmul(x, w);
            EXPECT_TRUE(matmul_within_bound(x, w, again, yr, 0.0, kU32)) << "K " << K;
            differing += std::memcmp(first.raw(), again.raw(), first.nbytes()) != 0;
        }
        EXPECT_GT(differing, 0) << "K " << K << ": 8 reruns in 8 block orders, all bit-identical";
    }
}

namespace {
const Protocol& ci_protocol() {
    static const Protocol p = load_protocol("protocols/ci.json");
    return p;
}
// The largest value of a tensor the audit's `step` captures on an emulated GPU
// node over the ci fixture (protocols/ci.json, qwen3_moe_tiny).
double ci_capture_max(const std::string& spec, const char* step, const char* tensor) {
    static const Model model = Model::open("fixtures/models/qwen3_moe_tiny");
    AuditConfig cfg;
    cfg.protocol = &ci_protocol();
    cfg.model = &model;
    cfg.load_first = false;
    const auto node = test::make_emulated_gpu_node(spec);
    const CaptureData d = capture_node(cfg, *node, *node, {step});
    const TensorView v = d.tensors.at(tensor).view();
    double m = 0;
    for (std::int64_t i = 0; i < v.numel(); ++i) m = std::max(m, v.at(i));
    return m;
}
}  // namespace

TEST(EmulatedKernels, TheBlasPathDeclaresItselfBatchVariantAndTheInvarianceStepSeesIt) {
    // The host code's blas= path (issue #38 item 5: cuBLAS told truthfully),
    // on gpu-emu's stand-in BLAS — a split-K chosen by the shape, as cuBLAS
    // chooses its kernel (gpu_emulated_runtime.hpp): the node declares
    // itself batch-variant and its attention the composition of its own
    // matmuls; a row alone is not its bits among 63 others, each within the
    // f32 bound; and the audit's invariance step measures it (ops and batch
    // max_rel over the protocol's sensitive 0) where the kernel node gives 0.
    const auto blas = test::make_emulated_gpu_node("gpu-emu:blas=emulated");
    const Capabilities& caps = blas->capabilities();
    EXPECT_EQ(caps.node, "gpu-emu:0:blas=emulated,tf32=0");
    EXPECT_TRUE(caps.deterministic);
    const auto extra = [&](const std::string& key) {
        for (const auto& [k, v] : caps.extra)
            if (k == key) return v;
        return std::string();
    };
    EXPECT_EQ(extra("batch_invariant").rfind("no:", 0), 0u) << extra("batch_invariant");
    EXPECT_EQ(extra("attention").rfind("the composition", 0), 0u) << extra("attention");
    const Tensor all = seeded_normal(9, "emu/blas/x", {64, 96}, 0, 1);
    const Tensor w = seeded_normal(9, "emu/blas/w", {70, 96}, 0, 1 / std::sqrt(96.0));
    const Tensor one = Tensor::convert(TensorView{DType::f32, all.raw(), {1, 96}}, DType::f32);
    const Tensor y_all = blas->matmul(all, w), y_one = blas->matmul(one, w);
    EXPECT_NE(std::memcmp(y_one.raw(), y_all.raw(), y_one.nbytes()), 0) << "a row alone gave its bits among 64";
    EXPECT_TRUE(matmul_within_bound(one, w, y_one, create_backend("cpu-ref")->matmul(one, w), 0.0, kU32));
    EXPECT_TRUE(matmul_within_bound(all, w, y_all, create_backend("cpu-ref")->matmul(all, w), 0.0, kU32));

    const Protocol& protocol = ci_protocol();
    const auto worst = [](const std::string& spec, const char* tensor) { return ci_capture_max(spec, "invariance", tensor); };
    for (const char* figure : {"invariance.ops_max_rel", "invariance.batch_max_rel"}) {
        EXPECT_EQ(worst("gpu-emu", figure), 0.0) << figure;
        const double b = worst("gpu-emu:blas=emulated", figure);
        EXPECT_GT(b, protocol.sensitive.at(figure).value) << figure << ": the audit would pass the blas node as batch-invariant";
        std::printf("[ info ] gpu-emu:blas=emulated: %s %.3g (gpu-emu 0)\n", figure, b);
    }
}

TEST(EmulatedKernels, TheKernelMatmulIsBatchInvariantAsItsCapabilitiesSay) {
    // What the cuda/hip kvasir-kernel nodes declare (batch_invariant: yes):
    // a row's bits alone are its bits among 1, 63 or 299 others, at every
    // K edge of the 16-deep stage. (cuBLAS declares no — a shape-chosen
    // algorithm — and the invariance step measures it: device-check.sh.)
    const auto emu = test::make_emulated_gpu_node("gpu-emu");
    for (const std::int64_t K : {13, 64, 100, 1000}) {
        const Tensor all = seeded_normal(9, "emu/bi/x", {300, K}, 0, 1);
        const Tensor w = seeded_normal(9, "emu/bi/w", {70, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const Tensor y_all = emu->matmul(all, w);
        for (const std::int64_t rows : {1, 2, 64}) {
            const Tensor part = Tensor::convert(TensorView{DType::f32, all.raw(), {rows, K}}, DType::f32);
            const Tensor y = emu->matmul(part, w);
            EXPECT_EQ(std::memcmp(y.raw(), y_all.raw(), y.nbytes()), 0) << rows << " rows of 300, K " << K;
        }
    }
}

TEST(EmulatedKernels, TheDeterminismStepSeesTheSplitKVariant) {
    // The audit's own determinism step (protocols/ci.json: the logits
    // stream's full forward, twice, own router) on the emulated node: the
    // split-K variant is caught (run-to-run max_rel > 0, over the protocol's
    // sensitive tolerance), the deterministic kernels are bit-identical.
    const Protocol& protocol = ci_protocol();
    const auto run_to_run = [](const std::string& spec) {
        return ci_capture_max(spec, "determinism", "determinism.run_to_run_max_rel");  // one value
    };
    EXPECT_EQ(run_to_run("gpu-emu"), 0.0);
    const double nd = run_to_run("gpu-emu:nondeterministic=1");
    EXPECT_GT(nd, protocol.sensitive.at("determinism").value) << "the audit would pass the split-K node as deterministic";
    std::printf("[ info ] gpu-emu:nondeterministic=1: determinism step run_to_run_max_rel %.3g\n", nd);
}


// Gated DeltaNet inputs for the tests below: conv input [T, C] and its
// weights [C, K], the delta rule's operands for T tokens (nk 2 key heads,
// nv 4 value heads of 16, as qwen3_5_moe_tiny).
struct DeltaNetInputs {
    static constexpr std::int64_t kC = 96, kK = 4, kNk = 2, kNv = 4, kD = 16;
    Tensor x, w, q, k, v, a, b, a_log, dt_bias;
    explicit DeltaNetInputs(std::int64_t T)
        : x(seeded_normal(53, "emu/la/x", {T, kC}, 0, 1)),
          w(seeded_normal(53, "emu/la/w", {kC, kK}, 0, 0.5)),
          q(seeded_normal(53, "emu/la/q", {T, kNk, kD}, 0, 1)),
          k(seeded_normal(53, "emu/la/k", {T, kNk, kD}, 0, 1)),
          v(seeded_normal(53, "emu/la/v", {T, kNv, kD}, 0, 1)),
          a(seeded_normal(53, "emu/la/a", {T, kNv}, 0, 2)),
          b(seeded_normal(53, "emu/la/b", {T, kNv}, 0, 1.5)),
          a_log(seeded_uniform(53, "emu/la/alog", {kNv}, -3, 1)),
          dt_bias(seeded_normal(53, "emu/la/dt", {kNv}, 0, 0.5)) {}
    // Rows [t0, t1) of a [T, ...] tensor.
    static Tensor rows(const Tensor& t, std::int64_t t0, std::int64_t t1) {
        Shape s = t.shape();
        const std::int64_t per = t.numel() / s[0];
        s[0] = t1 - t0;
        Tensor out(t.dtype(), s);
        std::memcpy(out.raw(), static_cast<const std::byte*>(t.raw()) + t0 * per * dtype_size(t.dtype()), out.nbytes());
        return out;
    }
    GatedDeltaInputs delta(const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& aa, const Tensor& bb) const {
        return GatedDeltaInputs{qq, kk, vv, aa, bb, a_log, dt_bias};
    }
};

bool same_bits(const Tensor& p, const Tensor& q) {
    return p.shape() == q.shape() && std::memcmp(p.raw(), q.raw(), p.nbytes()) == 0;
}

TEST(EmulatedKernels, GatedDeltaNetDecodingEqualsPrefillBitForBit) {
    // Every output of either kernel depends on its token's inputs and the
    // carried history/state only, in the same order of operations; and the
    // state crosses calls as f32, unrounded, whatever the storage. So a
    // prefill of 10 tokens and then one token at a time (the decoder's
    // calls, the conv history being the last K−1 inputs, the state the
    // previous call's) give the bits of one call over all 16 tokens.
    const std::int64_t T = 16, split = 10, K = DeltaNetInputs::kK;
    const DeltaNetInputs in(T);
    for (const char* spec : {"gpu-emu", "gpu-emu:storage=f16", "gpu-emu:storage=bf16", "gpu-emu:acc=f16"}) {
        const auto emu = test::make_emulated_gpu_node(spec);
        const Tensor conv_all = emu->causal_conv1d_silu(in.x, in.w, nullptr);
        const GatedDeltaResult all = emu->gated_delta_rule(in.delta(in.q, in.k, in.v, in.a, in.b));
        Tensor state;
        for (std::int64_t t0 = 0; t0 < T; t0 = t0 == 0 ? split : t0 + 1) {
            const std::int64_t t1 = t0 == 0 ? split : t0 + 1;
            const Tensor hist = DeltaNetInputs::rows(in.x, t0 - (K - 1), t0);  // t0 ≥ split > K − 1
            const TensorView hv = hist;
            const Tensor conv = emu->causal_conv1d_silu(DeltaNetInputs::rows(in.x, t0, t1), in.w, t0 == 0 ? nullptr : &hv);
            EXPECT_TRUE(same_bits(conv, DeltaNetInputs::rows(conv_all, t0, t1))) << spec << " conv tokens " << t0;
            const Tensor q = DeltaNetInputs::rows(in.q, t0, t1), k = DeltaNetInputs::rows(in.k, t0, t1),
                         v = DeltaNetInputs::rows(in.v, t0, t1), a = DeltaNetInputs::rows(in.a, t0, t1),
                         b = DeltaNetInputs::rows(in.b, t0, t1);
            GatedDeltaInputs d = in.delta(q, k, v, a, b);
            const TensorView sv = state;
            d.state = t0 == 0 ? nullptr : &sv;
            GatedDeltaResult r = emu->gated_delta_rule(d);
            EXPECT_TRUE(same_bits(r.out, DeltaNetInputs::rows(all.out, t0, t1))) << spec << " delta tokens " << t0;
            state = std::move(r.state);
        }
        EXPECT_TRUE(same_bits(state, all.state)) << spec << " final state";
        EXPECT_EQ(state.dtype(), DType::f32);
    }
}

TEST(EmulatedKernels, GatedDeltaNetSumsInF16UnderAccF16) {
    // acc=f16 reaches inside both ops (ops.cuh's Accum<true> chains): every
    // conv output whose taps do not sum exactly in half, and the delta rule's
    // outputs and state, leave the f32 node's bits; the conv's K-tap chain is
    // the cpu:acc=f16 node's (same order, same round-after-add), so the sums
    // agree with it to silu's last bits. The state stays an f32 tensor.
    const DeltaNetInputs in(12);
    const auto f32 = test::make_emulated_gpu_node("gpu-emu"), f16acc = test::make_emulated_gpu_node("gpu-emu:acc=f16");
    const auto cpu16 = create_backend("cpu:acc=f16");
    const Tensor c32 = f32->causal_conv1d_silu(in.x, in.w, nullptr), c16 = f16acc->causal_conv1d_silu(in.x, in.w, nullptr);
    const Tensor ccpu = cpu16->causal_conv1d_silu(in.x, in.w, nullptr);
    std::int64_t moved = 0;
    double worst_vs_cpu = 0;
    for (std::int64_t i = 0; i < c16.numel(); ++i) {
        moved += c16.at(i) != c32.at(i);
        worst_vs_cpu = std::max(worst_vs_cpu, std::fabs(c16.at(i) - ccpu.at(i)) / std::max(std::fabs(ccpu.at(i)), 1e-30));
    }
    EXPECT_GT(moved, c16.numel() / 2) << "the f16 taps sum must change most outputs";
    EXPECT_LE(worst_vs_cpu, 8 * 0x1p-24) << "same f16 chain as cpu:acc=f16; only silu's f32 ulps differ";
    const GatedDeltaResult p = f32->gated_delta_rule(in.delta(in.q, in.k, in.v, in.a, in.b));
    const GatedDeltaResult r = f16acc->gated_delta_rule(in.delta(in.q, in.k, in.v, in.a, in.b));
    EXPECT_FALSE(same_bits(p.out, r.out));
    EXPECT_FALSE(same_bits(p.state, r.state));
    EXPECT_EQ(r.state.dtype(), DType::f32);
}

// The whole forward pass of qwen3_5_moe_tiny (2 Gated DeltaNet + 2 gated
// attention layers, MoE) with every op — the two new ones included — run by
// the kernel source on the emulation, against cpu-ref; routing pinned to
// cpu-ref's (router authority), as tests/steps/test_forward.cpp checks the
// cpu node. Held to the f32 tolerance the cpu node meets there: 2e-5
// normwise on every hidden state and the logits. The cpu node's figures are
// printed next to gpu-emu's.
// The same for the dense fixtures: a llama3-scaled rope (the host's f32
// table), sliding windows (per-row views of the cache) on some layers (qwen2)
// or all (mistral).
class EmulatedForward : public ::testing::TestWithParam<const char*> {};

TEST_P(EmulatedForward, WithinTheCpuNodesF32Tolerance) {
    constexpr double kF32Tolerance = 2e-5;  // test_forward.cpp, CpuWithinFloat32ToleranceAndRouterAuthority
    const std::filesystem::path dir = std::filesystem::path(KVASIR_SOURCE_DIR) / "fixtures" / "models" / GetParam();
    const Model model = Model::open(dir.string());
    const SafetensorsFile ref_file = SafetensorsFile::open((dir / "reference.safetensors").string());
    const TensorView ids = ref_file.view("input_ids");
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(ids.numel()));
    for (std::int64_t i = 0; i < ids.numel(); ++i) prompt[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(ids.at(i));
    auto oracle_node = ref();
    const ForwardResult oracle = forward(*oracle_node, model, prompt);
    ForwardOptions pinned;
    pinned.routing = &oracle.routing;
    const auto emu = test::make_emulated_gpu_node("gpu-emu");
    auto cpu = create_backend("cpu");
    const ForwardResult g = forward(*emu, model, prompt, pinned), c = forward(*cpu, model, prompt, pinned);
    const auto normwise = [](const Tensor& want, const Tensor& got) {
        const CompareStats s = compare(want, got);
        EXPECT_TRUE(finite_parity(s));
        double m = 0;
        for (std::int64_t i = 0; i < want.numel(); ++i) m = std::max(m, std::fabs(want.at(i)));
        return s.max_abs / m;
    };
    ASSERT_EQ(g.hidden.size(), oracle.hidden.size());
    const ModelConfig& cfg = model.config();
    std::string line;
    for (std::size_t l = 1; l < oracle.hidden.size(); ++l) {
        const double eg = normwise(oracle.hidden[l], g.hidden[l]), ec = normwise(oracle.hidden[l], c.hidden[l]);
        line += fmt::format(" L{} ({}): gpu-emu {:.2e} / cpu {:.2e};", l - 1,
                            cfg.is_linear_attention(static_cast<std::int64_t>(l - 1)) ? "DeltaNet" : "attention", eg, ec);
        EXPECT_LE(eg, kF32Tolerance) << "hidden after layer " << l - 1;
    }
    const double lg = normwise(oracle.logits, g.logits), lc = normwise(oracle.logits, c.logits);
    std::printf("[ measured ] %s vs cpu-ref (normwise, routing pinned):%s logits: gpu-emu %.2e / cpu %.2e\n", GetParam(),
                line.c_str(), lg, lc);
    EXPECT_LE(lg, kF32Tolerance);
    // Top-1 of every prompt position agrees with the oracle's.
    const std::int64_t T = g.logits.dim(0), V = g.logits.dim(1);
    for (std::int64_t t = 0; t < T; ++t) {
        std::int64_t a = 0, b = 0;
        for (std::int64_t v = 1; v < V; ++v) {
            if (oracle.logits.at(t * V + v) > oracle.logits.at(t * V + a)) a = v;
            if (g.logits.at(t * V + v) > g.logits.at(t * V + b)) b = v;
        }
        EXPECT_EQ(a, b) << "position " << t;
    }
    // The decoder on the emulation (a prefill of 10, then one token at a
    // time: conv history and recurrent state carried between calls, routing
    // pinned per step) gives the full forward's bits (with attention sinks: within the f32 tolerance, below).
    Decoder dec(*emu, model);
    const auto step_plan = [&](std::size_t t0, std::size_t n) {
        std::vector<RoutingPlan> plans(oracle.routing.size());
        for (std::size_t l = 0; l < plans.size(); ++l) {
            const RoutingPlan& p = oracle.routing[l];
            if (p.ids.empty()) continue;
            const auto slice = [&](const Tensor& x) {
                Tensor out(x.dtype(), {static_cast<std::int64_t>(n), x.dim(1)});
                const std::size_t row = static_cast<std::size_t>(x.dim(1)) * dtype_size(x.dtype());
                std::memcpy(out.raw(), static_cast<const std::byte*>(x.raw()) + t0 * row, n * row);
                return out;
            };
            plans[l] = RoutingPlan{slice(p.ids), slice(p.weights)};
        }
        return plans;
    };
    std::size_t t0 = 0;
    while (t0 < prompt.size()) {
        const std::size_t n = t0 == 0 ? 10 : 1;
        const std::vector<RoutingPlan> plans = step_plan(t0, n);
        const Tensor step = dec.step(std::span(prompt).subspan(t0, n), &plans);
        const std::size_t row = static_cast<std::size_t>(V) * sizeof(float);
        ASSERT_EQ(step.nbytes(), n * row);
        if (!cfg.attention_sinks) {
            EXPECT_EQ(std::memcmp(step.raw(), static_cast<const std::byte*>(g.logits.raw()) + t0 * row, step.nbytes()), 0)
                << "decoder step at token " << t0;
        } else {
            // Sinks run the composition on this node (its GPU kernel takes none yet): its softmax reduces a row of the
            // call's key count, masked zeros included, so a shorter decode row rounds differently —
            // close, not the same bits (the invariance step measures exactly this on every node).
            const TensorView full{DType::f32, static_cast<const std::byte*>(g.logits.raw()) + t0 * row,
                                  {static_cast<std::int64_t>(n), V}};
            double m = 0, d = 0;
            for (std::int64_t i = 0; i < full.numel(); ++i) {
                m = std::max(m, std::fabs(full.at(i)));
                d = std::max(d, std::fabs(full.at(i) - step.at(i)));
            }
            EXPECT_LE(d / m, kF32Tolerance) << "decoder step at token " << t0;
        }
        t0 += n;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EmulatedForward,
                         ::testing::Values("qwen3_5_moe_tiny", "llama_tiny", "mistral_tiny", "qwen2_tiny", "qwen3_tiny",
                                           "olmoe_tiny", "gpt_oss_tiny", "deepseek_v3_tiny", "kimi_k2_tiny",
                                           "glm4_moe_tiny"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

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

// Every test here runs on each vendor's device where there is one, and
// always on gpu-emu: the same host code (gpu_backend_impl.inc) and kernels on
// the CPU emulation of a GPU (gpu_emulated_node.hpp) — its staging, pool,
// residency, grouped launches and counters, which a device check can only
// run where a GPU is lent.
class GpuOps : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        if (GetParam() != "gpu-emu") REQUIRE_DEVICE(GetParam());
    }
    std::unique_ptr<Backend> node(const std::string& opts = "") const {
        return test::create_node(opts.empty() ? GetParam() : GetParam() + ":" + opts);
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

TEST_P(GpuOps, TransferCountersCountWhatCrossesToTheDevice) {
    // Device buffers hold f32 whatever the storage (4 bytes an element), and
    // uploads never wait: one host wait a call, its read. On gpu-emu the
    // emulated device counts the same 3 cudaMalloc calls.
    for (const std::string opts : {"", "storage=bf16"}) {
        SCOPED_TRACE(opts);
        auto gpu = node(opts);
        const std::uint64_t mallocs0 = test::emulated_device_counts().mallocs;
        test::expect_two_matmuls_counted(*gpu, 4, 1);
        if (GetParam() == "gpu-emu") EXPECT_EQ(test::emulated_device_counts().mallocs - mallocs0, 3u);
    }
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

TEST_P(GpuOps, ExpertsOnTheDeviceGiveEachExpertsOpsBitsInOneRoundTrip) {
    // GpuBackend::expert_ffns (gpu_backend_impl.inc): every buffer f32, so
    // every variant moves 4 bytes an element; cuBLAS slices aligned as
    // cudaMalloc's buffers, so it picks the per-op call's kernel.
    std::vector<std::string> specs{GetParam(), GetParam() + ":storage=bf16", GetParam() + ":storage=f16", GetParam() + ":acc=f16"};
    if (GetParam() == "cuda") specs.push_back("cuda:blas=cublas,tf32=0");
    test::expect_device_experts_match_their_ops(specs, [](const std::string&) -> std::uint64_t { return 4; });
}

TEST_P(GpuOps, AChainOfOpsInAResidencyScopeStaysOnTheDeviceUntilTheHostReadsIt) {
    // Every buffer f32: 4 bytes an element read back on every variant.
    std::vector<std::string> specs{GetParam(), GetParam() + ":storage=bf16", GetParam() + ":storage=f16", GetParam() + ":acc=f16"};
    if (GetParam() == "cuda") specs.push_back("cuda:blas=cublas,tf32=0");
    test::expect_resident_chain_reads_back_once(specs, [](const std::string&) -> std::uint64_t { return 4; });
}

TEST_P(GpuOps, APartOfAResultIsReadWhereItIsAndGivesTheBitsOfItsUpload) {
    // In place where the part starts 256-byte aligned, else copied on the device to a buffer that does.
    test::expect_resident_parts_read_in_place(GetParam());
}

TEST_P(GpuOps, AMoeBlockOnTheDeviceGivesTheHostCombinesBitsAndReadsNothingBack) {
    test::expect_resident_moe_block_matches_host(
        {GetParam(), GetParam() + ":storage=f16", GetParam() + ":storage=bf16", GetParam() + ":acc=f16"});
}

TEST_P(GpuOps, DataMovementGivesTheDefaultsBitsWhereTheResultsAre) {
    test::expect_data_movement_matches_the_defaults({GetParam(), GetParam() + ":storage=f16", GetParam() + ":storage=bf16"});
}

// Issue #38 item 2, as the GPU node runs a MoE block in a DeviceResidency
// scope: gather, every expert's gate and up (one grouped launch), the
// activation, every down (one grouped launch), combine — 5 launches for 2
// experts or 8, SwiGLU or the clamped one, with gpt-oss's biases or without
// (added in the grouped jobs' epilogue), each block the bits of the
// default's per-op experts. The node counts its launches; on gpu-emu the
// emulated device counts the kernels it ran too.
TEST_P(GpuOps, AMoeBlockIsFiveLaunchesWhateverItsExpertCount) {
    const std::int64_t E = 8, H = 64, I = 24, T = 12;
    const test::SeededExperts seeded(44, "launch/", E, H, I, DType::f32);
    for (const auto [clamped, biased] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
        const std::vector<ExpertWeights> experts = seeded.experts(clamped, biased);
        for (const std::int64_t used : {2, 8}) {
            const auto be = node();
            const Tensor x = seeded_normal(44, "launch/x", {T, H}, 0, 1);
            RoutingPlan plan{Tensor(DType::i32, {T, 2}), seeded_normal(44, "launch/w", {T, 2}, 0.5, 0.2)};
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t j = 0; j < 2; ++j)
                    plan.ids.as<std::int32_t>()[t * 2 + j] = static_cast<std::int32_t>((t + j * (used / 2)) % used);
            const Tensor host = be->moe_block(x, experts, plan);  // also makes the weights resident
            const DeviceResidency scope;
            const std::uint64_t before = be->transfer_stats()->launches;
            const std::uint64_t device_before = test::emulated_device_counts().launches;
            const Tensor here = be->moe_block(x, experts, plan);
            const std::string what = fmt::format("{} experts{}{}", used, clamped ? " clamped" : "", biased ? " biased" : "");
            EXPECT_EQ(be->transfer_stats()->launches - before, 5u) << what;
            EXPECT_TRUE(test::same_tensor_bits(here, host)) << what;  // reads `here`: its kernels have run
            if (GetParam() == "gpu-emu") EXPECT_EQ(test::emulated_device_counts().launches - device_before, 5u) << what;
        }
    }
}

TEST_P(GpuOps, AResultOutlivesItsNodeAndAnotherNodeReadsItThroughTheHost) {
    test::expect_results_outlive_their_node(GetParam(), GetParam() + ":storage=f16");
}

TEST_P(GpuOps, AddMulAndScaleGiveTheDefaultsBitsOnEveryStorage) {
    test::expect_combine_ops_match_the_defaults(
        {GetParam(), GetParam() + ":storage=bf16", GetParam() + ":storage=f16", GetParam() + ":acc=f16"});
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

// On a device only (gpu-emu would be compared with itself).
class GpuDevice : public GpuOps {};

TEST_P(GpuDevice, DeviceGivesTheEmulationsBits) {
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
    const DeltaNetInputs la(40);
    const Tensor la_hist = seeded_normal(37, "gpu/b/hist", {DeltaNetInputs::kK - 1, DeltaNetInputs::kC}, 0, 1);
    const Tensor la_state = seeded_normal(37, "gpu/b/state", {DeltaNetInputs::kNv, DeltaNetInputs::kD, DeltaNetInputs::kD}, 0, 0.3);
    const TensorView la_hv = la_hist, la_sv = la_state;
    GatedDeltaInputs la_in = la.delta(la.q, la.k, la.v, la.a, la.b);
    la_in.state = &la_sv;
    // Attention rows of 2047, 2048 and 2049 keys: probabilities held in
    // shared memory, and recomputed scores past kAttnChunk.
    const Tensor aq = seeded_normal(37, "gpu/b/aq", {3, 8, 128}, 0, 1);
    const std::vector<Tensor> ak = {seeded_normal(37, "gpu/b/ak0", {2049, 128}, 0, 1),
                                    seeded_normal(37, "gpu/b/ak1", {2049, 128}, 0, 1)};
    const std::vector<Tensor> av = {seeded_normal(37, "gpu/b/av0", {2049, 128}, 0, 1),
                                    seeded_normal(37, "gpu/b/av1", {2049, 128}, 0, 1)};
    const std::vector<TensorView> akv(ak.begin(), ak.end()), avv(av.begin(), av.end());
    for (const char* opts : {"", "storage=f16", "storage=bf16", "acc=f16"}) {
        const std::string suffix = *opts ? std::string(":") + opts : "";
        auto dev = test::create_node(GetParam() + suffix);
        const auto emu = test::make_emulated_gpu_node("gpu-emu" + suffix);
        const auto same = [&](const Tensor& a, const Tensor& b, const char* op) {
            ASSERT_EQ(a.nbytes(), b.nbytes()) << op;
            EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << op << " " << dev->capabilities().node;
        };
        same(dev->matmul(x, w), emu->matmul(x, w), "matmul");
        same(dev->matmul(wide, wn), emu->matmul(wide, wn), "matmul 4x2048x768");
        same(dev->softmax(s), emu->softmax(s), "softmax");
        same(dev->rmsnorm(s, sw, 1e-6), emu->rmsnorm(s, sw, 1e-6), "rmsnorm");
        same(dev->swiglu(s, s), emu->swiglu(s, s), "swiglu");
        same(dev->sigmoid(s), emu->sigmoid(s), "sigmoid");
        same(dev->add(s, s), emu->add(s, s), "add");
        same(dev->mul(s, s), emu->mul(s, s), "mul");
        same(dev->scale(s, 0.3), emu->scale(s, 0.3), "scale");
        for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal})
            same(dev->rope(r, pos, {1e6, layout}), emu->rope(r, pos, {1e6, layout}), "rope");
        same(dev->causal_conv1d_silu(la.x, la.w, &la_hv), emu->causal_conv1d_silu(la.x, la.w, &la_hv), "causal_conv1d_silu");
        const GatedDeltaResult dr = dev->gated_delta_rule(la_in), er = emu->gated_delta_rule(la_in);
        same(dr.out, er.out, "gated_delta_rule out");
        same(dr.state, er.state, "gated_delta_rule state");
        same(dev->causal_attention(aq, akv, avv, 1 / std::sqrt(128.0)), emu->causal_attention(aq, akv, avv, 1 / std::sqrt(128.0)),
             "causal_attention");
    }
}

INSTANTIATE_TEST_SUITE_P(Vendors, GpuOps, ::testing::Values("cuda", "hip", "gpu-emu"), vendor_name);
INSTANTIATE_TEST_SUITE_P(Vendors, GpuDevice, ::testing::Values("cuda", "hip"), vendor_name);

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
