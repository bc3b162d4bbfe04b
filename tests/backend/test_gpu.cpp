// The GPU backends (cuda, hip): one test body, run for each vendor.
//
// Four layers, from "runs anywhere" to "needs the device":
//  1. GpuMath.*  — the device scalar math (kernels/gpu/math.cuh) compiled for
//     the host: storage rounding bit-identical to kvasir::round_to, the
//     f16-accumulation step identical to the cpu emulation, sqrt correctly
//     rounded, exp ≤ 1 ulp and sin/cos ≤ 0.5 ulp (+ε) from the true values.
//     The kernels use these very functions with the same IEEE operations (no
//     contraction, no FTZ), so this pins the device numerics without a GPU.
//  1b. EmulatedKernels.* — the kernel source itself (kernels/gpu/ops.cuh),
//     compiled for a CPU emulation of the CUDA execution model below and run
//     against the oracle: tile edges, reduction trees, split-K atomics, and
//     acc=f16 bit-identical to cpu:acc=f16. Only the host glue
//     (gpu_backend_impl.inc) and the real compilers remain for layer 3.
//  2. Vendors/GpuVendor.* — for each vendor compiled in: a malformed variant
//     is Error(bad_input) on every machine, a valid one without a device is
//     Error(unsupported) carrying the probe's reason, coherent with the
//     registry listing. A vendor not compiled in skips, saying so.
//  3. Vendors/GpuOps.*, Cublas.* — every op against cpu-ref within the bounds below;
//     without a device these SKIP with the probe's reason (GTEST_SKIP, visible
//     in the output), e.g. "no CUDA device: cudaGetDeviceCount returned ...".
//
// Bounds (u = 2^-24, f32 unit roundoff; Higham §3.1 for γ_K = K·u/(1-K·u)):
//  * matmul f32: |ŷ - y| ≤ γ_K·Σ|x_k w_k| + u·|y| for any summation order —
//    the kernels' fmaf chain and cuBLAS alike.
//  * cuBLAS TF32: inputs rounded to a 10-bit fraction (u_tf32 = 2^-11 with
//    round-to-nearest; 2^-10 allowed here in case of truncation):
//    |ŷ - y| ≤ (2·u_tf32 + γ_K)·Σ|x w| + u·|y|; measured error must be ≥ 10×
//    the f32 path's on K = 2048.
//  * swiglu/sigmoid ≤ 4/3 ulp; softmax/rmsnorm relative 1e-5 for rows ≤ 4096;
//    rope within the f32-angle error the cpu node is held to.
//  * acc=f16 matmul: bit-identical to cpu:acc=f16 (same exact emulation).
#include "kvasir/backend/registry.hpp"
#include "tests/backend/matmul_bound.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

// ---- a CPU "vendor" for the kernels ------------------------------------------------
// kernels/gpu/ops.cuh has no vendor #ifdef, so it compiles for a third target
// too: this emulation of the CUDA execution model (one std::thread per GPU
// thread, a std::barrier for __syncthreads, blocks one after another so a
// function-static array is exactly one block's shared memory). It runs the
// real kernel source — tiling, bounds, reduction trees, split-K atomics — on
// a machine without a GPU (EmulatedKernels.*).
namespace emu {
struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local Dim3 thread_idx, block_idx;
inline Dim3 block_dim, grid_dim;
inline std::barrier<>* block_barrier = nullptr;

template <typename Kernel, typename... Args>
void launch(Dim3 grid, unsigned threads, Kernel kernel, Args... args) {
    grid_dim = grid;
    block_dim = {threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                std::barrier<> barrier(threads);
                block_barrier = &barrier;
                std::vector<std::jthread> block;
                for (unsigned t = 0; t < threads; ++t)
                    block.emplace_back([=] {
                        thread_idx = {t, 0, 0};
                        block_idx = {x, y, z};
                        kernel(args...);
                    });
            }
}
}  // namespace emu

#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(n)
#define threadIdx ::emu::thread_idx
#define blockIdx ::emu::block_idx
#define blockDim ::emu::block_dim
#define gridDim ::emu::grid_dim
inline void __syncthreads() { ::emu::block_barrier->arrive_and_wait(); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
using std::min;

#include "kernels/gpu/ops.cuh"  // and math.cuh, in namespace kvasir::gpu_host

using namespace kvasir;
namespace gm = kvasir::gpu_host;

namespace {

using test::gamma;
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

namespace {

// The same launch geometry as gpu_backend_impl.inc, on f32 buffers holding storage values.
std::vector<float> emu_matmul(const Tensor& x, const Tensor& w, bool f16_acc, int splits = 1) {
    const int T = static_cast<int>(x.dim(0)), K = static_cast<int>(x.dim(1)), N = static_cast<int>(w.dim(0));
    std::vector<float> y(static_cast<std::size_t>(T) * N, 0.0f);
    const emu::Dim3 grid{static_cast<unsigned>((N + gm::kTile - 1) / gm::kTile),
                         static_cast<unsigned>((T + gm::kTile - 1) / gm::kTile), static_cast<unsigned>(splits)};
    if (splits == 1) {
        if (f16_acc)
            emu::launch(grid, gm::kMatmulThreads, gm::matmul_kernel<true, false>, x.as<float>(), w.as<float>(), y.data(), T,
                        N, K, std::max(K, 1), 0);
        else
            emu::launch(grid, gm::kMatmulThreads, gm::matmul_kernel<false, false>, x.as<float>(), w.as<float>(), y.data(),
                        T, N, K, std::max(K, 1), 0);
    } else {
        const int chunk = ((K + splits - 1) / splits + gm::kTileK - 1) / gm::kTileK * gm::kTileK;
        emu::launch(emu::Dim3{grid.x, grid.y, static_cast<unsigned>((K + chunk - 1) / chunk)}, gm::kMatmulThreads,
                    gm::matmul_kernel<false, true>, x.as<float>(), w.as<float>(), y.data(), T, N, K, chunk, 0);
        emu::launch(emu::Dim3{4, 1, 1}, 256, gm::store_kernel, y.data(), y.size(), 0);
    }
    return y;
}

Tensor as_tensor(const std::vector<float>& v, Shape shape) { return Tensor::from_f32(v, std::move(shape)); }

}  // namespace

TEST(EmulatedKernels, MatmulTilesWithinGammaKAndF16AccIsTheCpuEmulation) {
    for (const auto& [T, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 1, 1}, {5, 7, 13}, {70, 130, 100}, {3, 65, 33}, {64, 70, 1000}}) {
        const Tensor x = seeded_normal(7, "emu/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(7, "emu/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const Tensor y = as_tensor(emu_matmul(x, w, false), {T, N});
        expect_matmul_bound(x, w, y, ref()->matmul(x, w), 0.0, "emulated matmul");
        // The fmaf chain in ascending k, exactly: one output by hand.
        float acc = 0.0f;
        for (std::int64_t k = 0; k < K; ++k) acc = std::fmaf(x.as<float>()[(T - 1) * K + k], w.as<float>()[(N - 1) * K + k], acc);
        EXPECT_EQ(y.at(T * N - 1), acc);
        const Tensor h = as_tensor(emu_matmul(x, w, true), {T, N});
        EXPECT_EQ(h.to_f64(), create_backend("cpu:acc=f16")->matmul(x, w).to_f64()) << T << "x" << N << "x" << K;
        const Tensor sk = as_tensor(emu_matmul(x, w, false, 8), {T, N});
        expect_matmul_bound(x, w, sk, ref()->matmul(x, w), 0.0, "emulated split-K");
    }
}

TEST(EmulatedKernels, RowReductionsAndElementwiseMatchTheOracle) {
    const std::int64_t rows = 3, cols = 4099;  // not a multiple of the block
    const Tensor x = seeded_normal(11, "emu/r/x", {rows, cols}, 0, 3);
    const Tensor w = seeded_normal(11, "emu/r/w", {cols}, 1, 0.1);
    std::vector<float> y(static_cast<std::size_t>(rows * cols));
    emu::launch(emu::Dim3{static_cast<unsigned>(rows), 1, 1}, gm::kReduceThreads, gm::softmax_kernel<false>, x.as<float>(),
                y.data(), static_cast<int>(cols), 0);
    EXPECT_TRUE(within(compare(ref()->softmax(x), as_tensor(y, {rows, cols})).max_rel, 1e-5));
    emu::launch(emu::Dim3{static_cast<unsigned>(rows), 1, 1}, gm::kReduceThreads, gm::rmsnorm_kernel<false>, x.as<float>(),
                w.as<float>(), y.data(), static_cast<int>(cols), 1e-6f, 0);
    EXPECT_TRUE(within(compare(ref()->rmsnorm(x, w, 1e-6), as_tensor(y, {rows, cols})).max_rel, 1e-5));
    emu::launch(emu::Dim3{static_cast<unsigned>(rows), 1, 1}, gm::kReduceThreads, gm::softmax_kernel<false>, x.as<float>(),
                y.data(), static_cast<int>(cols), static_cast<int>(gm::kStoreBF16));
    for (const float v : y) ASSERT_EQ(static_cast<double>(v), round_to_bf16(v));
    const Tensor u = seeded_normal(11, "emu/r/u", {rows, cols}, 0, 1);
    emu::launch(emu::Dim3{5, 1, 1}, 256, gm::swiglu_kernel, x.as<float>(), u.as<float>(), y.data(), y.size(), 0);
    EXPECT_TRUE(within(compare(ref()->swiglu(x, u), as_tensor(y, {rows, cols})).max_ulp, 4.0));
    emu::launch(emu::Dim3{5, 1, 1}, 256, gm::sigmoid_kernel, x.as<float>(), y.data(), y.size(), 0);
    EXPECT_TRUE(within(compare(ref()->sigmoid(x), as_tensor(y, {rows, cols})).max_ulp, 3.0));
}

TEST(EmulatedKernels, RopeBothLayoutsMatchTheCpuNode) {
    const std::int64_t T = 6, H = 3, D = 64;
    const Tensor x = seeded_normal(13, "emu/p/x", {T, H, D}, 0, 1);
    std::vector<std::int64_t> pos(T);
    std::vector<float> posf(T), inv_freq(D / 2), y(static_cast<std::size_t>(T * H * D));
    for (std::int64_t t = 0; t < T; ++t) pos[std::size_t(t)] = 777 * t, posf[std::size_t(t)] = static_cast<float>(777 * t);
    for (std::int64_t i = 0; i < D / 2; ++i)
        inv_freq[std::size_t(i)] = std::pow(1e6f, -2.0f * static_cast<float>(i) / static_cast<float>(D));
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        emu::launch(emu::Dim3{2, 1, 1}, 256, gm::rope_kernel, x.as<float>(), posf.data(), inv_freq.data(), y.data(),
                    static_cast<int>(T), static_cast<int>(H), static_cast<int>(D), layout == RopeLayout::neox ? 1 : 0, 0);
        const Tensor yc = create_backend("cpu")->rope(x, pos, {1e6, layout});
        EXPECT_TRUE(within(compare(yc, as_tensor(y, {T, H, D})).max_abs, 1e-5));
        EXPECT_TRUE(within(compare(ref()->rope(x, pos, {1e6, layout}), as_tensor(y, {T, H, D})).max_abs, 5000 * 4 * kU32 * 8));
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

TEST_P(GpuOps, MatmulWithinGammaKBound) {
    auto gpu = node();
    for (const auto& [T, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 1, 1}, {3, 4, 8}, {5, 7, 13}, {70, 130, 100}, {16, 33, 2048}, {4, 2048, 768}, {64, 768, 2048}}) {
        const Tensor x = seeded_normal(7, "gpu/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(7, "gpu/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        expect_matmul_bound(x, w, gpu->matmul(x, w), ref()->matmul(x, w), 0.0, GetParam());
    }
    // Leading dims flatten; an empty K gives zeros.
    const Tensor x3 = seeded_normal(7, "gpu/x3", {2, 3, 40}, 0, 1);
    const Tensor w3 = seeded_normal(7, "gpu/w3", {5, 40}, 0, 1);
    EXPECT_EQ(gpu->matmul(x3, w3).shape(), (Shape{2, 3, 5}));
    const Tensor y0 = gpu->matmul(Tensor(DType::f32, {2, 0}), Tensor(DType::f32, {3, 0}));
    EXPECT_EQ(y0.to_f64(), std::vector<double>(6, 0.0));
}

TEST_P(GpuOps, DefaultVariantIsBitReproducible) {
    const Tensor x = seeded_normal(5, "gpu/d/x", {33, 1000}, 0, 1);
    const Tensor w = seeded_normal(5, "gpu/d/w", {257, 1000}, 0, 1);
    const Tensor s = seeded_normal(5, "gpu/d/s", {8, 5000}, 0, 3);
    const Tensor sw = seeded_normal(5, "gpu/d/sw", {5000}, 1, 0.1);
    auto a = node(), b = node();
    const Tensor ya = a->matmul(x, w), yb = b->matmul(x, w), yc = a->matmul(x, w);
    EXPECT_EQ(std::memcmp(ya.raw(), yb.raw(), ya.nbytes()), 0);
    EXPECT_EQ(std::memcmp(ya.raw(), yc.raw(), ya.nbytes()), 0);
    const Tensor sa = a->softmax(s), sb = b->softmax(s);
    EXPECT_EQ(std::memcmp(sa.raw(), sb.raw(), sa.nbytes()), 0);
    const Tensor ra = a->rmsnorm(s, sw, 1e-6), rb = b->rmsnorm(s, sw, 1e-6);
    EXPECT_EQ(std::memcmp(ra.raw(), rb.raw(), ra.nbytes()), 0);
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

TEST_P(GpuOps, ElementwiseWithinFewUlp) {
    const Tensor g = seeded_normal(9, "gpu/e/g", {4, 1000}, 0, 3);
    const Tensor u = seeded_normal(9, "gpu/e/u", {4, 1000}, 0, 1);
    auto gpu = node();
    const CompareStats sw = compare(ref()->swiglu(g, u), gpu->swiglu(g, u));
    EXPECT_TRUE(within(sw.max_ulp, 4.0)) << sw.max_ulp;
    const CompareStats sg = compare(ref()->sigmoid(g), gpu->sigmoid(g));
    EXPECT_TRUE(within(sg.max_ulp, 3.0)) << sg.max_ulp;
}

TEST_P(GpuOps, ReductionsWithinRelativeBound) {
    const Tensor x = seeded_normal(11, "gpu/r/x", {8, 4096}, 0, 3);
    const Tensor w = seeded_normal(11, "gpu/r/w", {4096}, 1, 0.1);
    auto gpu = node();
    const CompareStats sm = compare(ref()->softmax(x), gpu->softmax(x));
    EXPECT_TRUE(within(sm.max_rel, 1e-5)) << sm.max_rel;
    const CompareStats rn = compare(ref()->rmsnorm(x, w, 1e-6), gpu->rmsnorm(x, w, 1e-6));
    EXPECT_TRUE(within(rn.max_rel, 1e-5)) << rn.max_rel;
    // A vocabulary-wide row (600 terms per thread before the tree).
    const Tensor v = seeded_normal(11, "gpu/r/v", {2, 151936}, 0, 3);
    EXPECT_TRUE(within(compare(ref()->softmax(v), gpu->softmax(v)).max_rel, 1e-4));
}

TEST_P(GpuOps, SoftmaxNaNPoisonsOnlyItsRow) {
    const Tensor x = Tensor::from_f64(std::vector<double>{1, NAN, 2, 1, 2, 3}, {2, 3}, DType::f32);
    const Tensor y = node()->softmax(x);
    for (int c = 0; c < 3; ++c) EXPECT_TRUE(std::isnan(y.at(c)));
    for (int c = 3; c < 6; ++c) EXPECT_FALSE(std::isnan(y.at(c)));
}

TEST_P(GpuOps, RopeWithinF32AngleError) {
    const Tensor x = seeded_normal(13, "gpu/p/x", {8, 2, 64}, 0, 1);
    std::vector<std::int64_t> pos(8);
    for (int i = 0; i < 8; ++i) pos[static_cast<std::size_t>(i)] = 1000 * i;
    auto gpu = node();
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        const Tensor yr = ref()->rope(x, pos, {1e6, layout});
        const CompareStats s = compare(yr, gpu->rope(x, pos, {1e6, layout}));
        EXPECT_TRUE(within(s.max_abs, 7000 * 4 * kU32 * 8)) << s.max_abs;
        // Same f32 angles as the cpu node: only the sin/cos rounding (≤ 1 ulp)
        // and the fma (one rounding fewer) differ, a few ulp of |x| ≲ 5.
        const CompareStats c = compare(create_backend("cpu")->rope(x, pos, {1e6, layout}), gpu->rope(x, pos, {1e6, layout}));
        EXPECT_TRUE(within(c.max_abs, 1e-5)) << c.max_abs;
    }
}

TEST_P(GpuOps, StorageVariantsRoundToTheirFormat) {
    const Tensor x = seeded_normal(17, "gpu/s/x", {4, 256}, 0, 1);
    const Tensor w = seeded_normal(17, "gpu/s/w", {32, 256}, 0, 0.0625);
    const Tensor yr = ref()->matmul(x, w);
    for (DType storage : {DType::bf16, DType::f16}) {
        auto gpu = node(std::string("storage=") + dtype_name(storage));
        const Tensor y = gpu->matmul(x, w);
        for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.at(i), round_to(storage, y.at(i)));
        const Tensor s = gpu->softmax(x);
        for (std::int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(s.at(i), round_to(storage, s.at(i)));
        const double us = storage == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
        EXPECT_TRUE(matmul_within_bound(x, w, y, yr, 2 * us + us * us, 1.01 * us)) << dtype_name(storage);
    }
}

TEST_P(GpuOps, F16AccumulationIsTheCpuEmulationBitForBit) {
    const Tensor x = seeded_normal(23, "gpu/h/x", {9, 300}, 0, 1);
    const Tensor w = seeded_normal(23, "gpu/h/w", {70, 300}, 0, 1);
    const Tensor a = node("acc=f16")->matmul(x, w);
    const Tensor b = create_backend("cpu:acc=f16")->matmul(x, w);
    EXPECT_EQ(a.to_f64(), b.to_f64());
    const Tensor s = seeded_normal(23, "gpu/h/s", {4, 4096}, 0, 1);
    const Tensor sw = seeded_normal(23, "gpu/h/sw", {4096}, 1, 0.1);
    EXPECT_GT(compare(ref()->rmsnorm(s, sw, 1e-6), node("acc=f16")->rmsnorm(s, sw, 1e-6)).max_abs,
              100 * compare(ref()->rmsnorm(s, sw, 1e-6), node()->rmsnorm(s, sw, 1e-6)).max_abs);
}

TEST_P(GpuOps, MoeRouterAndShardCheckThroughTheDefaults) {
    const std::int64_t T = 12, H = 256, I = 96, E = 16;
    const Tensor x = seeded_normal(31, "gpu/m/x", {T, H}, 0, 1);
    std::vector<Tensor> store;
    std::vector<ExpertWeights> experts;
    for (std::int64_t e = 0; e < E; ++e) {
        store.push_back(seeded_normal(31, "gpu/m/g" + std::to_string(e), {I, H}, 0, 1 / std::sqrt(double(H))));
        store.push_back(seeded_normal(31, "gpu/m/u" + std::to_string(e), {I, H}, 0, 1 / std::sqrt(double(H))));
        store.push_back(seeded_normal(31, "gpu/m/d" + std::to_string(e), {H, I}, 0, 1 / std::sqrt(double(I))));
    }
    for (std::int64_t e = 0; e < E; ++e)
        experts.push_back({store[std::size_t(3 * e)], store[std::size_t(3 * e + 1)], store[std::size_t(3 * e + 2)]});
    const Tensor logits = seeded_normal(31, "gpu/m/logits", {T, E}, 0, 1);
    RouterParams p;
    p.top_k = 4;
    const RouterOutput r = ref()->route(logits, p);
    const RoutingPlan plan{r.ids, r.weights};
    auto gpu = node();
    const Tensor mono = gpu->moe_block(x, experts, plan);
    const CompareStats s = compare(ref()->moe_block(x, experts, plan), mono);
    EXPECT_TRUE(at_least(s.cosine, 0.999999)) << s.cosine;
    EXPECT_TRUE(within(s.max_rel, 1e-3)) << s.max_rel;
    Tensor combined;
    for (int shard = 0; shard < 4; ++shard) {
        std::vector<bool> mine(static_cast<std::size_t>(E));
        for (std::int64_t e = 0; e < E; ++e) mine[static_cast<std::size_t>(e)] = e * 4 / E == shard;
        Tensor part = gpu->moe_block(x, experts, plan, &mine);
        combined = shard == 0 ? std::move(part) : gpu->add(combined, part);
    }
    EXPECT_TRUE(within(compare(mono, combined).max_rel, 1e-4));
    const RouterOutput gr = gpu->route(logits, p);
    EXPECT_TRUE(at_least(compare(r.scores, gr.scores).cosine, 0.9999999));
}

TEST_P(GpuOps, ShapeErrorsAreBadInput) {
    auto gpu = node();
    const Tensor a = seeded_normal(1, "gpu/bad/a", {2, 3}, 0, 1);
    const Tensor b = seeded_normal(1, "gpu/bad/b", {4, 5}, 0, 1);
    for (auto op : std::vector<std::function<void()>>{
             [&] { gpu->matmul(a, b); }, [&] { gpu->swiglu(a, b); }, [&] { gpu->rmsnorm(a, b, 1e-6); },
             [&] { gpu->rope(a, std::vector<std::int64_t>{0, 1}, {}); }}) {
        try {
            op();
            ADD_FAILURE() << "accepted a shape error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
        }
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
