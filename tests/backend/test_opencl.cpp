// What only the OpenCL backend has: device probing and selection, its
// options and their errors, acc=f16 needing cl_khr_fp16, kernels embedded in
// the binary, build logs on a failed program build, the widened upload path,
// a reduction order of its own, and the Gated DeltaNet kernels (the two ops
// the conformance suite does not cover, since not every node has them). The backend contract (error bounds from
// the OpenCL spec, storage variants, shape errors, NaN/Inf, determinism,
// router and MoE) is tests/backend/test_conformance.cpp, run on opencl:0
// like on every other node.
//
// Every test skips, visibly and with the reason, when this build has no
// OpenCL or the machine has no OpenCL device (CI installs PoCL).
#include "kvasir/backend/registry.hpp"
#include "tests/backend/device_experts_check.hpp"
#include "tests/backend/device_residency_check.hpp"
#include "tests/backend/matmul_bound.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"

#if defined(KVASIR_HAVE_OPENCL)
#include "kvasir/backend/opencl/opencl_backend.hpp"
#endif

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../common/ci_skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <string>

using namespace kvasir;

namespace {

using test::gamma;

// Empty when opencl:0 exists; otherwise why not (not compiled, no platform, no device).
std::string opencl_absent_reason() {
    for (const BackendStatus& s : list_backends())
        if (s.name == "opencl") return s.available ? std::string() : s.reason;
    return "opencl is not registered";
}

std::unique_ptr<Backend> ref() { return create_backend("cpu-ref"); }

class Opencl : public ::testing::Test {
protected:
    void SetUp() override {
        const std::string why = opencl_absent_reason();
        if (!why.empty()) KVASIR_SKIP_OR_FAIL_IN_CI("no OpenCL device (setup installs PoCL): " << why);
    }
    static std::unique_ptr<Backend> node(const char* spec = "opencl:0") { return create_backend(spec); }
};

ErrorCode code_of(const std::function<void()>& f, std::string* message = nullptr) {
    try {
        f();
    } catch (const Error& e) {
        if (message != nullptr) *message = e.what();
        return e.code();
    }
    ADD_FAILURE() << "no kvasir::Error thrown";
    return ErrorCode::internal;
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

}  // namespace

// ---- device, spec, capabilities ----------------------------------------------------

TEST_F(Opencl, ProbeListsDevicesAndCapabilitiesDescribeThem) {
    std::vector<BackendDevice> devices;
    for (const BackendStatus& s : list_backends())
        if (s.name == "opencl") devices = s.devices;
    ASSERT_FALSE(devices.empty());
    EXPECT_EQ(devices[0].index, 0);
    EXPECT_FALSE(devices[0].name.empty());

    const Capabilities c = node("opencl")->capabilities();
    EXPECT_EQ(c.node, "opencl:0");  // the device index is always spelled out
    EXPECT_EQ(c.backend, "opencl");
    EXPECT_FALSE(c.device.empty());
    EXPECT_TRUE(contains(c.runtime, "OpenCL C")) << c.runtime;
    EXPECT_EQ(c.storage, DType::f32);
    EXPECT_EQ(c.accumulation, DType::f32);
    EXPECT_EQ(c.output, DType::f32);
    EXPECT_TRUE(c.fma);
    EXPECT_TRUE(c.deterministic);
    EXPECT_GE(c.threads, 1);
    std::map<std::string, std::string> extra(c.extra.begin(), c.extra.end());
    for (const char* key : {"platform", "vendor", "driver", "opencl_c", "cl_khr_fp16", "cl_khr_fp64"})
        EXPECT_TRUE(extra.count(key) != 0) << key;
    // Report what the device offers, so the test log says it.
    std::cout << "[ info     ] " << c.device << " | " << c.runtime << " | cl_khr_fp16 " << extra["cl_khr_fp16"]
              << ", cl_khr_fp64 " << extra["cl_khr_fp64"] << '\n';

    EXPECT_EQ(node("opencl:0:storage=bf16")->capabilities().node, "opencl:0:storage=bf16");
    EXPECT_EQ(node("opencl:0:storage=f16")->capabilities().storage, DType::f16);
}

TEST_F(Opencl, BadDeviceIndexIsBadInputNamingTheDevices) {
    std::string msg;
    EXPECT_EQ(code_of([] { create_backend("opencl:99"); }, &msg), ErrorCode::bad_input);
    EXPECT_TRUE(contains(msg, "available: opencl:0 = ")) << msg;
}

TEST_F(Opencl, BadOptionsAreBadInput) {
    for (const char* spec : {"opencl:0:speed=fast", "opencl:0:storage=f64", "opencl:0:acc=bf16", "opencl:0:threads=2"})
        EXPECT_EQ(code_of([&] { create_backend(spec); }), ErrorCode::bad_input) << spec;
}

TEST_F(Opencl, F16AccumulationIsUnsupportedWithoutFp16OrRuns) {
    const Capabilities c = node()->capabilities();
    const bool fp16 = std::find(c.extra.begin(), c.extra.end(), std::make_pair(std::string("cl_khr_fp16"), std::string("yes"))) !=
                      c.extra.end();
    if (!fp16) {
        std::string msg;
        EXPECT_EQ(code_of([] { create_backend("opencl:0:acc=f16"); }, &msg), ErrorCode::unsupported);
        EXPECT_TRUE(contains(msg, "cl_khr_fp16")) << msg;
        std::cout << "[ info     ] acc=f16 refused as it should be: " << msg << '\n';
        return;
    }
    // With half arithmetic: runs, and its error is the f16 accumulator's.
    const Tensor x = seeded_normal(29, "o/x", {8, 2048}, 0, 1);
    const Tensor w = seeded_normal(29, "o/w", {64, 2048}, 0, 1 / std::sqrt(2048.0));
    const Tensor yr = ref()->matmul(x, w);
    const CompareStats f32 = compare(yr, node()->matmul(x, w));
    const CompareStats f16 = compare(yr, node("opencl:0:acc=f16")->matmul(x, w));
    EXPECT_GT(f16.max_abs, 100 * f32.max_abs);
    // Every add of a 2048-term half-precision running sum rounds (u = 2⁻¹¹):
    // |error| ≤ ((1 + u)^K − 1) · Σ|x·w| per output (γ_K itself is infinite
    // at K·u = 1, so the product form is used), plus the final rounding.
    const double u = 1.0 / 2048;
    double sum_abs = 0, y_max = 0;
    for (std::int64_t t = 0; t < 8; ++t)
        for (std::int64_t n = 0; n < 64; ++n) {
            double sa = 0;
            for (std::int64_t k = 0; k < 2048; ++k) sa += std::abs(x.at(t * 2048 + k) * w.at(n * 2048 + k));
            sum_abs = std::max(sum_abs, sa);
            y_max = std::max(y_max, std::abs(yr.at(t * 64 + n)));
        }
    const double bound = (std::pow(1 + u, 2048.0) - 1) * sum_abs + u * y_max;
    EXPECT_TRUE(std::isfinite(bound));
    EXPECT_LE(f16.max_abs, bound) << f16.max_abs;
}

#if defined(KVASIR_HAVE_OPENCL)
TEST_F(Opencl, EveryKernelFileIsEmbedded) {
    for (const char* f : {"common.cl", "matmul.cl", "rows.cl", "elementwise.cl", "linear_attention.cl", "attention.cl"})
        EXPECT_FALSE(opencl_embedded::kernel_source(f).empty()) << f;
    EXPECT_TRUE(opencl_embedded::kernel_source("nope.cl").empty());
    EXPECT_TRUE(contains(std::string(opencl_embedded::kernel_source("common.cl")), "FP_CONTRACT OFF"));
}

TEST_F(Opencl, BuildFailureCarriesTheBuildLog) {
    EXPECT_NO_THROW(opencl_build_program_for_test(0, "__kernel void fine(__global float* y) { y[0] = 1.0f; }"));
    std::string msg;
    const ErrorCode code = code_of(
        [] { opencl_build_program_for_test(0, "__kernel void broken(__global float* y) {\n  y[0] = undeclared_thing;\n}\n"); },
        &msg);
    EXPECT_EQ(code, ErrorCode::backend_failure);
    EXPECT_TRUE(contains(msg, "CL_BUILD_PROGRAM_FAILURE")) << msg;
    EXPECT_TRUE(contains(msg, "build log")) << msg;
    // The compiler's own words about our source, not just "it failed".
    EXPECT_TRUE(contains(msg, "undeclared_thing")) << msg;
    std::cout << "[ info     ] " << msg << '\n';
    EXPECT_EQ(code_of([] { opencl_build_program_for_test(7, "__kernel void k() {}"); }), ErrorCode::bad_input);
}
#endif

// ---- upload ---------------------------------------------------------------------------------

TEST_F(Opencl, WidenedUploadGivesTheStagedPathsBits) {
    // f32/f16/bf16 operands are widened (and rounded for storage=bf16) by the
    // vector converter straight into a mapped buffer; f64 operands still take
    // the staged Tensor::convert path. The same values as f32/f16/bf16 and as
    // f64 (exact) must give the same device data, hence the same bits.
    const Tensor x = seeded_normal(19, "u/x", {5, 300}, 0, 1);
    const Tensor w32 = seeded_normal(19, "u/w", {40, 300}, 0, 0.06);
    for (DType wd : {DType::f32, DType::f16, DType::bf16})
        for (const char* spec : {"opencl:0", "opencl:0:storage=bf16"}) {
            const Tensor w = Tensor::convert(w32.view(), wd);
            const Tensor w64 = Tensor::convert(w.view(), DType::f64);  // exact
            auto ocl = node(spec);
            const Tensor fast = ocl->matmul(x, w), staged = ocl->matmul(x, w64);
            ASSERT_EQ(fast.nbytes(), staged.nbytes());
            EXPECT_EQ(std::memcmp(fast.raw(), staged.raw(), fast.nbytes()), 0) << spec << " weights " << dtype_name(wd);
            const Tensor xf = ocl->rmsnorm(x, Tensor::convert(w.view().row(0), wd), 1e-6);
            const Tensor xs = ocl->rmsnorm(x, Tensor::convert(w64.view().row(0), DType::f64), 1e-6);
            EXPECT_EQ(std::memcmp(xf.raw(), xs.raw(), xf.nbytes()), 0) << spec << " rmsnorm weight " << dtype_name(wd);
        }
}

TEST_F(Opencl, TransferCountersCountWhatCrossesToTheDevice) {
    // Hand-counted (device_residency_check.hpp); the read is a blocking one,
    // so at least one host wait a call. A host node counts nothing.
    EXPECT_FALSE(create_backend("cpu")->transfer_stats().has_value());
    test::expect_two_matmuls_counted(*node(), 4, 0);
    // Half storage moves half the bytes: x as half bits, the result read back as half.
    test::expect_two_matmuls_counted(*node("opencl:0:storage=f16"), 2, 0);
}

TEST_F(Opencl, AChainOfOpsInAResidencyScopeStaysOnTheDeviceUntilTheHostReadsIt) {
    test::expect_resident_chain_reads_back_once(
        {"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"},
        [](const std::string& spec) -> std::uint64_t { return spec == "opencl:0:storage=f16" ? 2 : 4; });
}

TEST_F(Opencl, AsyncUploadsZeroMakesAForwardPassUploadWait) {
    // Inside a DeviceResidency scope x goes up without a wait (the default)
    // or with one (async_uploads=0, the behaviour before stop 48); the bits
    // are the same, the name keeps the option, a bad value is bad input.
    const Tensor x = seeded_normal(24, "async/x", {3, 50}, 0, 1);
    auto on = node(), off = node("opencl:0:async_uploads=0");
    EXPECT_EQ(off->capabilities().node, "opencl:0:async_uploads=0");
    EXPECT_EQ(on->capabilities().node, "opencl:0");
    std::vector<Tensor> out;
    for (Backend* b : {on.get(), off.get()}) {
        const TransferStats before = *b->transfer_stats();
        const DeviceResidency scope;
        out.push_back(b->scale(x, 0.5));
        const TransferStats moved = *b->transfer_stats() - before;
        EXPECT_EQ(moved.uploads, 1u) << b->capabilities().node;
        EXPECT_EQ(moved.syncs, b == on.get() ? 0u : 1u) << b->capabilities().node;
    }
    EXPECT_TRUE(test::same_tensor_bits(out[0], out[1]));
    EXPECT_EQ(code_of([] { create_backend("opencl:0:async_uploads=2"); }), ErrorCode::bad_input);
}

TEST_F(Opencl, APartOfAResultIsReadWhereItIsAndGivesTheBitsOfItsUpload) {
    // A sub-buffer where the offset is aligned for one, else a device-to-device copy.
    test::expect_resident_parts_read_in_place("opencl:0");
}

TEST_F(Opencl, AMoeBlockOnTheDeviceGivesTheHostCombinesBitsAndReadsNothingBack) {
    test::expect_resident_moe_block_matches_host({"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"});
}

TEST_F(Opencl, AResultOutlivesItsNodeAndAnotherNodeReadsItThroughTheHost) {
    test::expect_results_outlive_their_node("opencl:0", "opencl:0:storage=f16");
}

TEST_F(Opencl, AddMulAndScaleGiveTheDefaultsBitsOnEveryStorage) {
    test::expect_combine_ops_match_the_defaults({"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"});
}

TEST_F(Opencl, DataMovementGivesTheDefaultsBitsWhereTheResultsAre) {
    // kv_copy_block (elementwise.cl): copy_columns, last_rows, join_columns, repeat_columns.
    test::expect_data_movement_matches_the_defaults({"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"});
}

TEST_F(Opencl, ExpertsOnTheDeviceGiveEachExpertsOpsBitsInOneRoundTrip) {
    // OpenclBackend::expert_ffns; half storage moves half bits both ways.
    test::expect_device_experts_match_their_ops(
        {"opencl:0", "opencl:0:storage=bf16", "opencl:0:storage=f16"},
        [](const std::string& spec) -> std::uint64_t { return spec == "opencl:0:storage=f16" ? 2 : 4; });
}

TEST_F(Opencl, MatmulIsOneFmaChainPerOutputInAscendingK) {
    // The acc=f32 nodes multiply on weights packed in 16-output panels
    // (kv_matmul_packed_R, R = 1, 2, 4 or 8 rows per work-item): every output
    // must still be fma(x[t][k], w[n][k], acc) for k = 0 … K−1 from +0 in
    // f32, over the operands as stored, the result rounded to storage — the
    // host's std::fma chain, bit for bit. Shapes cover every R, partial
    // panels (N not a multiple of 16) and partial row blocks; the weights
    // are a heap tensor (packed for the call) and an immutable one (packed
    // once, then resident: the cache's counters), in f32, bf16 and f16 — the
    // panels keep a bf16 or f16 weight's own bits where the node's storage
    // holds them exactly, and every panel format is read by its own kernel.
    const auto stored = [](const Tensor& t, DType storage) {
        return storage == DType::f32 ? Tensor::convert(t.view(), DType::f32)
                                     : Tensor::convert(Tensor::convert(t.view(), storage).view(), DType::f32);
    };
    struct Case { std::int64_t t, n, k; };
    for (const char* spec : {"opencl:0", "opencl:0:storage=bf16", "opencl:0:storage=f16"}) {
        auto ocl = node(spec);
        const DType storage = ocl->capabilities().storage;
        for (const Case c : {Case{1, 1, 1}, Case{1, 17, 300}, Case{2, 16, 64}, Case{3, 33, 7}, Case{5, 40, 129},
                             Case{8, 15, 300}, Case{9, 70, 65}, Case{17, 31, 256}})
          for (const DType wd : {DType::f32, DType::bf16, DType::f16}) {
            const Tensor x = seeded_normal(23, "fc/x", {c.t, c.k}, 0, 1);
            const Tensor w = Tensor::convert(seeded_normal(23, "fc/w", {c.n, c.k}, 0, 0.1).view(), wd);
            const Tensor xs = stored(x, storage), ws = stored(w, storage);
            Tensor want(DType::f32, {c.t, c.n});
            for (std::int64_t t = 0; t < c.t; ++t)
                for (std::int64_t n = 0; n < c.n; ++n) {
                    float acc = 0.0f;
                    for (std::int64_t k = 0; k < c.k; ++k)
                        acc = std::fma(xs.as<float>()[t * c.k + k], ws.as<float>()[n * c.k + k], acc);
                    want.as<float>()[t * c.n + n] = acc;
                }
            want = stored(want, storage);
            const Tensor heap = ocl->matmul(x, w);
            ASSERT_EQ(std::memcmp(heap.raw(), want.raw(), want.nbytes()), 0)
                << spec << " " << dtype_name(wd) << " T " << c.t << " N " << c.n << " K " << c.k << ": "
                << compare(want, heap).max_abs;
            const auto* bytes = static_cast<const std::byte*>(w.raw());
            const std::vector<std::byte> kept(bytes, bytes + w.nbytes());
            const ImmutableRegistration reg(kept.data(), kept.size());
            const TensorView wi{wd, kept.data(), {c.n, c.k}};
            const WeightCacheStats before = *ocl->weight_cache_stats();
            for (int round = 0; round < 2; ++round) {
                const Tensor resident = ocl->matmul(x, wi);
                ASSERT_EQ(std::memcmp(resident.raw(), want.raw(), want.nbytes()), 0)
                    << spec << " " << dtype_name(wd) << " resident, T " << c.t << " N " << c.n << " K " << c.k;
            }
            const WeightCacheStats after = *ocl->weight_cache_stats();
            EXPECT_EQ(after.misses - before.misses, 1u) << spec;  // packed and uploaded once …
            EXPECT_EQ(after.hits - before.hits, 1u) << spec;      // … then resident
            // … in the narrowest exact format: 2 bytes a weight but for f32 weights on an f32 node.
            const std::uint64_t elem = storage == DType::f32 && wd == DType::f32 ? 4 : 2;
            EXPECT_EQ(after.bytes_uploaded - before.bytes_uploaded,
                      static_cast<std::uint64_t>((c.n + 15) / 16 * 16 * c.k) * elem) << spec << " " << dtype_name(wd);
          }
    }
}

// ---- what makes this backend different -------------------------------------------------------

TEST_F(Opencl, ReductionOrderDiffersFromTheCpuBackend) {
    // The point of running OpenCL at all: a different reduction order gives
    // different bits (while staying within the matmul bound, which
    // Conformance.MatmulWithinGammaKBound checks).
    const Tensor x = seeded_normal(7, "o/x", {16, 2048}, 0, 1);
    const Tensor w = seeded_normal(7, "o/w", {768, 2048}, 0, 1 / std::sqrt(2048.0));
    const CompareStats s = compare(create_backend("cpu")->matmul(x, w), node()->matmul(x, w));
    EXPECT_FALSE(s.bit_identical);
    EXPECT_GT(s.max_abs, 0.0);
    EXPECT_TRUE(within(s.max_rel, 1e-3)) << s.max_rel;
    std::cout << "[ info     ] cpu vs opencl matmul 16x768x2048: max|d| " << s.max_abs << ", cosine " << s.cosine << '\n';
}

// ---- Gated DeltaNet: causal conv1d + SiLU, the gated delta rule ---------------------------
//
// Both ops run as kernels of kernels/opencl/linear_attention.cl; cpu-ref (the
// f64 textbook loops of linear_attention.cpp) is the oracle, given the values
// the node holds (inputs rounded to its storage format).
//
// Conv bound, per element: the K-tap dot product summed in f32 (fma chain,
// any order) is within γ_K(u)·Σ_j|w_j·x_j| of the exact sum s (Higham §3.1);
// silu moves that by at most max|silu'| = 1.0998 < 1.1 times; evaluating
// silu(ŝ) = ŝ / (1 + e^-ŝ) on the device adds ≤ 12u relative (OpenCL 1.2
// full profile: exp ≤ 3 ulp = 6u, the add u, the division 2.5 ulp = 5u), 13u
// with the second-order terms. Narrow storage rounds the result once more:
// 1.01·u_s·|y| plus half a subnormal step.
//
// Delta-rule bound: no closed form is tight (a T-token recurrence), so the
// figure is measured and bounded with a stated margin. Each token's update is
// a contraction (decay ≤ 1; S(I − βkkᵀ) with ‖k‖ ≤ 1, β ∈ (0, 1)), so the
// rounding errors of earlier tokens are not amplified; every token adds O(dk)
// f32 roundings per state column (two dk-term fma chains, the l2norm's
// sqrt/division, exp/log1p of the gates: a few ulp each). Measured on PoCL
// (the "[ measured ]" lines): ≤ 4e-7 normwise on the output and ≤ 1.3e-7 on
// the state over T = 16..64, dk = 16..300 — the same as the cpu node's
// textbook f32 loop on the same inputs (printed alongside). The bound, 1e-5
// normwise (max|Δ| / max|ref|), is ~170 u: 25x above the measured figure,
// room for other sum orders and the spec's ulp allowances on other devices,
// yet three decades below what a wrong key head, a dropped decay or a lost
// initial state gives (O(1) errors, 0.9–1.8 measured, checked below). With
// narrow storage the output is rounded once more (u_s·|y| per element); the
// state is f32 in every variant and keeps the f32 bound.

namespace {

double unit_roundoff(DType t) { return t == DType::f16 ? 0x1p-11 : t == DType::bf16 ? 0x1p-8 : test::kU32; }
double subnormal_half_step(DType t) { return t == DType::f16 ? 0x1p-25 : t == DType::bf16 ? 0x1p-134 : 0.0; }

// x as a node of storage `s` holds it, in f32 (the oracle is given these values).
Tensor held(const Tensor& x, DType s) {
    if (s == DType::f32) return Tensor::convert(x.view(), DType::f32);
    return Tensor::convert(Tensor::convert(x.view(), s).view(), DType::f32);
}

// Every value of `y` is a value of format `s`.
bool representable(const Tensor& y, DType s) {
    const Tensor r = held(y, s);
    return std::memcmp(r.raw(), y.raw(), y.nbytes()) == 0;
}

// max|Δ| / max|ref| (normwise); NaN in either makes it NaN.
double normwise(const Tensor& ref, const Tensor& got) {
    const CompareStats s = compare(ref, got);
    if (s.nonfinite_mismatch > 0) return NAN;
    double m = 0;
    for (std::int64_t i = 0; i < ref.numel(); ++i) m = std::max(m, std::fabs(ref.at(i)));
    return s.max_abs / m;
}

std::vector<bool> nan_mask(const Tensor& t) {
    std::vector<bool> m(static_cast<std::size_t>(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i) m[static_cast<std::size_t>(i)] = std::isnan(t.at(i));
    return m;
}
std::int64_t count(const std::vector<bool>& m) { return std::count(m.begin(), m.end(), true); }

// Σ_j |w[c, j]·xx[t + j, c]| for every (t, c): the scale of the conv bound.
std::vector<double> conv_abs_products(const Tensor& x, const Tensor& w, const Tensor* history) {
    const std::int64_t T = x.dim(0), C = x.dim(1), K = w.shape().back(), pad = K - 1;
    std::vector<double> out(static_cast<std::size_t>(T * C));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t c = 0; c < C; ++c) {
            double s = 0;
            for (std::int64_t j = 0; j < K; ++j) {
                const std::int64_t tp = t + j - pad;
                const double xv = tp >= 0 ? x.at(tp * C + c) : history != nullptr ? history->at((pad + tp) * C + c) : 0.0;
                s += std::fabs(w.at(c * K + j) * xv);
            }
            out[static_cast<std::size_t>(t * C + c)] = s;
        }
    return out;
}

struct DeltaCase {
    std::int64_t t, nk, nv, dk, dv;
    bool with_state;
};

// Seeded inputs of the gated delta rule, f32. `a` includes values past the
// softplus threshold (20) so both branches run.
struct DeltaData {
    Tensor q, k, v, a, b, a_log, dt_bias, state;
    GatedDeltaInputs inputs(bool with_state) const {
        GatedDeltaInputs in{q, k, v, a, b, a_log, dt_bias, nullptr};
        if (with_state) in.state = &state_view;
        return in;
    }
    TensorView state_view;
};

DeltaData delta_data(std::uint64_t seed, const DeltaCase& c) {
    DeltaData d;
    d.q = seeded_normal(seed, "gdn/q", {c.t, c.nk, c.dk}, 0, 1);
    d.k = seeded_normal(seed, "gdn/k", {c.t, c.nk, c.dk}, 0, 1);
    d.v = seeded_normal(seed, "gdn/v", {c.t, c.nv, c.dv}, 0, 1);
    d.a = seeded_normal(seed, "gdn/a", {c.t, c.nv}, 0, 2);
    d.a.set(1, 30.0);  // softplus(x) = x past the threshold
    d.b = seeded_normal(seed, "gdn/b", {c.t, c.nv}, 0, 2);
    // Qwen3-Next: A_log = log(U(0, 16)), dt_bias = 1; decays exp(g) from ~1 down to ~0.
    d.a_log = seeded_uniform(seed, "gdn/A_log", {c.nv}, -2, 1.5);
    d.dt_bias = seeded_uniform(seed, "gdn/dt_bias", {c.nv}, 0.5, 1.5);
    d.state = seeded_normal(seed, "gdn/state", {c.nv, c.dk, c.dv}, 0, 0.5);
    d.state_view = d.state.view();
    return d;
}

// The same data as a node of storage `s` holds it.
DeltaData held(const DeltaData& d, DType s) {
    DeltaData h{held(d.q, s), held(d.k, s), held(d.v, s), held(d.a, s), held(d.b, s), held(d.a_log, s),
                held(d.dt_bias, s), d.state, {}};  // the state is f32 in every variant
    h.state_view = h.state.view();
    return h;
}

}  // namespace

TEST_F(Opencl, CausalConv1dSiluWithinTheDotProductBound) {
    const std::int64_t T = 37, C = 70, K = 4;
    const Tensor x = seeded_normal(41, "conv/x", {T, C}, 0, 1);
    const Tensor w = seeded_normal(41, "conv/w", {C, K}, 0, 0.5);
    const Tensor hist = seeded_normal(41, "conv/h", {K - 1, C}, 0, 1);
    auto oracle = ref();
    for (const char* spec : {"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"}) {
        auto ocl = node(spec);
        const DType s = ocl->capabilities().storage;
        const double us = unit_roundoff(s), narrow = s == DType::f32 ? 0.0 : 1.0;
        const Tensor xh = held(x, s), wh = held(w, s), hh = held(hist, s);
        for (const bool with_history : {false, true}) {
            for (const bool rank3 : {false, true}) {  // weight [C, K] or [C, 1, K]
                SCOPED_TRACE(fmt::format("{} history {} weight rank {}", spec, with_history, rank3 ? 3 : 2));
                Tensor w_in = w;
                if (rank3) w_in = std::move(w_in).reshaped({C, 1, K});
                const TensorView hv = hist.view(), hhv = hh.view();
                const Tensor y = ocl->causal_conv1d_silu(x, w_in, with_history ? &hv : nullptr);
                const Tensor yr = oracle->causal_conv1d_silu(xh, wh, with_history ? &hhv : nullptr);
                ASSERT_EQ(y.shape(), (Shape{T, C}));
                ASSERT_EQ(y.dtype(), DType::f32);
                const std::vector<double> abs_sum = conv_abs_products(xh, wh, with_history ? &hh : nullptr);
                double worst = 0;  // |Δ| / bound
                for (std::int64_t i = 0; i < y.numel(); ++i) {
                    const double want = yr.at(i), got = y.at(i);
                    const double bound = 1.1 * gamma(K, test::kU32) * abs_sum[static_cast<std::size_t>(i)] +
                                         13 * test::kU32 * std::fabs(want) +
                                         narrow * (1.01 * us * std::fabs(want) + subnormal_half_step(s));
                    ASSERT_TRUE(std::fabs(got - want) <= bound)
                        << "t=" << i / C << " c=" << i % C << ": " << got << " vs " << want << " bound " << bound;
                    if (bound > 0) worst = std::max(worst, std::fabs(got - want) / bound);
                }
                if (s != DType::f32) {
                    EXPECT_TRUE(representable(y, s));
                }
                // The history really is read: the first K−1 rows differ from zero padding.
                if (with_history) {
                    const Tensor y0 = ocl->causal_conv1d_silu(x, w_in, nullptr);
                    EXPECT_NE(std::memcmp(y.raw(), y0.raw(), static_cast<std::size_t>(C) * 4), 0);
                    EXPECT_EQ(std::memcmp(y.as<float>() + (K - 1) * C, y0.as<float>() + (K - 1) * C,
                                          static_cast<std::size_t>((T - K + 1) * C) * 4),
                              0)
                        << "rows from K−1 on never see the history";
                }
                std::cout << "[ measured ] conv1d " << spec << " history " << with_history << " weight rank "
                          << (rank3 ? 3 : 2) << ": normwise "
                          << normwise(yr, y) << ", worst |Δ|/bound " << worst << '\n';
            }
        }
    }
}

TEST_F(Opencl, CausalConv1dSiluShapeErrorsAndNaN) {
    auto ocl = node();
    const Tensor x = seeded_normal(43, "conv/x", {12, 9}, 0, 1);
    const Tensor w = seeded_normal(43, "conv/w", {9, 4}, 0, 0.5);
    const Tensor h = seeded_normal(43, "conv/h", {3, 9}, 0, 1);
    const Tensor x3(DType::f32, {2, 12, 9}), w_wrong(DType::f32, {8, 4}), w_mid(DType::f32, {9, 2, 4}),
        h_rows(DType::f32, {4, 9}), h_cols(DType::f32, {3, 8});
    const TensorView h_rows_v = h_rows.view(), h_cols_v = h_cols.view();
    std::string msg;
    EXPECT_EQ(code_of([&] { ocl->causal_conv1d_silu(x3, w, nullptr); }, &msg), ErrorCode::bad_input);
    EXPECT_TRUE(contains(msg, "causal_conv1d")) << msg;
    EXPECT_EQ(code_of([&] { ocl->causal_conv1d_silu(x, w_wrong, nullptr); }), ErrorCode::bad_input);
    EXPECT_EQ(code_of([&] { ocl->causal_conv1d_silu(x, w_mid, nullptr); }), ErrorCode::bad_input);
    EXPECT_EQ(code_of([&] { ocl->causal_conv1d_silu(x, w, &h_rows_v); }), ErrorCode::bad_input);
    EXPECT_EQ(code_of([&] { ocl->causal_conv1d_silu(x, w, &h_cols_v); }), ErrorCode::bad_input);

    // A NaN input at (t=5, c=3) reaches exactly the outputs (5..8, 3); a NaN
    // in the last history row (the input just before x) at c=7 reaches
    // (0..2, 7) — as on the oracle.
    Tensor xn = x, hn = h;
    xn.set(5 * 9 + 3, NAN);
    hn.set(2 * 9 + 7, NAN);
    const TensorView hnv = hn.view();
    const Tensor y = ocl->causal_conv1d_silu(xn, w, &hnv);
    const Tensor yr = ref()->causal_conv1d_silu(xn, w, &hnv);
    const std::vector<bool> m = nan_mask(y);
    EXPECT_EQ(m, nan_mask(yr));
    EXPECT_EQ(count(m), 7);
    for (std::int64_t t = 5; t < 9; ++t) EXPECT_TRUE(m[static_cast<std::size_t>(t * 9 + 3)]) << t;
    for (std::int64_t t = 0; t < 3; ++t) EXPECT_TRUE(m[static_cast<std::size_t>(t * 9 + 7)]) << t;
    EXPECT_FALSE(m[static_cast<std::size_t>(9 * 9 + 3)]);
    const CompareStats s = compare(yr, y);
    EXPECT_EQ(s.nonfinite_mismatch, 0);
    EXPECT_TRUE(within(s.max_rel, 1e-5)) << s.max_rel;
}

TEST_F(Opencl, GatedDeltaRuleMatchesTheOracle) {
    // T = 16..64 tokens; GQA rep 2 and 3; dk/dv below, at and above the
    // work-group width (columns per work-item > 1, strided l2norm folds).
    const std::vector<DeltaCase> cases = {
        {16, 2, 4, 32, 24, true}, {64, 1, 3, 16, 16, false}, {40, 2, 4, 64, 48, true}, {24, 2, 4, 300, 260, true}};
    auto oracle = ref();
    auto cpu = create_backend("cpu");
    for (const DeltaCase& c : cases)
        for (const char* spec : {"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"}) {
            SCOPED_TRACE(fmt::format("{} T={} nk={} nv={} dk={} dv={} state {}", spec, c.t, c.nk, c.nv, c.dk, c.dv,
                                     c.with_state));
            auto ocl = node(spec);
            const DType s = ocl->capabilities().storage;
            const DeltaData d = delta_data(47 + static_cast<std::uint64_t>(c.dk), c);
            const DeltaData dh = held(d, s);
            const GatedDeltaResult r = ocl->gated_delta_rule(d.inputs(c.with_state));
            const GatedDeltaResult rr = oracle->gated_delta_rule(dh.inputs(c.with_state));
            ASSERT_EQ(r.out.shape(), (Shape{c.t, c.nv, c.dv}));
            ASSERT_EQ(r.state.shape(), (Shape{c.nv, c.dk, c.dv}));
            ASSERT_EQ(r.out.dtype(), DType::f32);
            ASSERT_EQ(r.state.dtype(), DType::f32);
            const double out_rel = normwise(rr.out, r.out), state_rel = normwise(rr.state, r.state);
            std::cout << "[ measured ] gated_delta_rule " << spec << " T=" << c.t << " dk=" << c.dk << " dv=" << c.dv
                      << ": normwise out " << out_rel << ", state " << state_rel;
            if (s == DType::f32) {
                EXPECT_TRUE(within(out_rel, 1e-5)) << out_rel;
                EXPECT_TRUE(within(state_rel, 1e-5)) << state_rel;
                // For scale: the textbook f32 loop (the cpu node) on the same inputs.
                const GatedDeltaResult rc = cpu->gated_delta_rule(d.inputs(c.with_state));
                std::cout << " (cpu: out " << normwise(rr.out, rc.out) << ", state " << normwise(rr.state, rc.state)
                          << ")";
            } else {
                // The state stays f32: the f32 figure. The output is rounded
                // once to storage: u_s·|y| more, per element.
                EXPECT_TRUE(within(state_rel, 1e-5)) << state_rel;
                EXPECT_TRUE(representable(r.out, s));
                double ymax = 0;
                for (std::int64_t i = 0; i < rr.out.numel(); ++i) ymax = std::max(ymax, std::fabs(rr.out.at(i)));
                for (std::int64_t i = 0; i < r.out.numel(); ++i) {
                    const double want = rr.out.at(i), got = r.out.at(i);
                    const double bound = 1e-5 * ymax + 1.01 * unit_roundoff(s) * std::fabs(want) + subnormal_half_step(s);
                    ASSERT_TRUE(std::fabs(got - want) <= bound) << "element " << i << ": " << got << " vs " << want;
                }
            }
            std::cout << '\n';
        }
}

TEST_F(Opencl, GatedDeltaRuleBoundCatchesWrongHeadsDecayAndState) {
    // The bound is meaningful: a wrong key head, a dropped decay or a lost
    // initial state are O(1) errors, far above 1e-5.
    const DeltaCase c{16, 2, 4, 32, 24, true};
    const DeltaData d = delta_data(53, c);
    const GatedDeltaResult ok = node()->gated_delta_rule(d.inputs(true));
    const GatedDeltaResult want = ref()->gated_delta_rule(d.inputs(true));
    EXPECT_TRUE(within(normwise(want.out, ok.out), 1e-5));
    DeltaData swapped = d;  // the two key heads exchanged: value head h would read the wrong one
    for (std::int64_t t = 0; t < c.t; ++t)
        for (std::int64_t i = 0; i < c.dk; ++i) {
            const std::int64_t a = (t * 2) * c.dk + i, b = (t * 2 + 1) * c.dk + i;
            for (Tensor* x : {&swapped.q, &swapped.k}) {
                const double va = x->at(a);
                x->set(a, x->at(b));
                x->set(b, va);
            }
        }
    swapped.state_view = swapped.state.view();
    const double heads = normwise(want.out, node()->gated_delta_rule(swapped.inputs(true)).out);
    DeltaData no_decay = d;
    for (std::int64_t h = 0; h < c.nv; ++h) no_decay.a_log.set(h, -100.0);  // g ≈ 0
    no_decay.state_view = no_decay.state.view();
    const double decay = normwise(want.out, node()->gated_delta_rule(no_decay.inputs(true)).out);
    const double state = normwise(want.out, node()->gated_delta_rule(d.inputs(false)).out);
    std::cout << "[ measured ] gated_delta_rule wrong key heads " << heads << ", no decay " << decay
              << ", zero initial state " << state << " (normwise)\n";
    EXPECT_GT(heads, 1e-2);
    EXPECT_GT(decay, 1e-2);
    EXPECT_GT(state, 1e-2) << "the initial state counts";
}

TEST_F(Opencl, GatedDeltaRuleStateCarriesAcrossCallsBitForBit) {
    // Decoding: the state returned by one call, handed back to the next, is
    // the f32 state the kernel holds between tokens — in every storage
    // variant, so 25 + 1 + 14 tokens in three calls give the bits of one
    // 40-token call. Also run-to-run deterministic.
    const DeltaCase c{40, 2, 4, 64, 48, true};
    const DeltaData d = delta_data(59, c);
    for (const char* spec : {"opencl:0", "opencl:0:storage=f16", "opencl:0:storage=bf16"}) {
        SCOPED_TRACE(spec);
        auto ocl = node(spec);
        const GatedDeltaResult whole = ocl->gated_delta_rule(d.inputs(true));
        const GatedDeltaResult again = ocl->gated_delta_rule(d.inputs(true));
        EXPECT_EQ(std::memcmp(whole.out.raw(), again.out.raw(), whole.out.nbytes()), 0);
        EXPECT_EQ(std::memcmp(whole.state.raw(), again.state.raw(), whole.state.nbytes()), 0);
        const auto rows = [](const Tensor& x, std::int64_t from, std::int64_t n) {
            Shape sh = x.shape();
            sh[0] = n;
            const std::int64_t row = x.numel() / x.dim(0);
            Tensor out(x.dtype(), sh);
            std::memcpy(out.raw(), static_cast<const std::byte*>(x.raw()) + from * row * 4, out.nbytes());
            return out;
        };
        Tensor state = d.state;
        std::int64_t t0 = 0;
        for (const std::int64_t n : {25, 1, 14}) {
            const Tensor q = rows(d.q, t0, n), k = rows(d.k, t0, n), v = rows(d.v, t0, n), a = rows(d.a, t0, n),
                         b = rows(d.b, t0, n);
            const TensorView sv = state.view();
            GatedDeltaResult part = ocl->gated_delta_rule(GatedDeltaInputs{q, k, v, a, b, d.a_log, d.dt_bias, &sv});
            const std::size_t bytes = part.out.nbytes();
            EXPECT_EQ(std::memcmp(part.out.raw(), static_cast<const std::byte*>(whole.out.raw()) + t0 * c.nv * c.dv * 4, bytes), 0)
                << "tokens from " << t0;
            state = std::move(part.state);
            t0 += n;
        }
        EXPECT_EQ(std::memcmp(state.raw(), whole.state.raw(), state.nbytes()), 0);
        // No tokens: the state passes through unchanged.
        const Tensor q0(DType::f32, {0, c.nk, c.dk}), v0(DType::f32, {0, c.nv, c.dv}), a0(DType::f32, {0, c.nv});
        const TensorView sv = d.state.view();
        const GatedDeltaResult none = ocl->gated_delta_rule(GatedDeltaInputs{q0, q0, v0, a0, a0, d.a_log, d.dt_bias, &sv});
        EXPECT_EQ(none.out.numel(), 0);
        EXPECT_EQ(std::memcmp(none.state.raw(), d.state.raw(), d.state.nbytes()), 0);
    }
}

TEST_F(Opencl, GatedDeltaRuleShapeErrorsAndNaN) {
    auto ocl = node();
    const DeltaCase c{12, 2, 4, 16, 8, true};
    const DeltaData d = delta_data(61, c);
    const auto refused = [&](const GatedDeltaInputs& in, const char* what) {
        std::string msg;
        EXPECT_EQ(code_of([&] { ocl->gated_delta_rule(in); }, &msg), ErrorCode::bad_input) << what;
        EXPECT_TRUE(contains(msg, "gated_delta_rule")) << msg;
    };
    const Tensor k_short(DType::f32, {12, 2, 15}), v_odd(DType::f32, {12, 3, 8}), v_short(DType::f32, {11, 4, 8}),
        a_wrong(DType::f32, {12, 3}), alog_wrong(DType::f32, {3}), state_wrong(DType::f32, {4, 8, 16});
    const TensorView state_wrong_v = state_wrong.view();
    const auto with = [&](auto change) {
        GatedDeltaInputs in = d.inputs(true);
        change(in);
        return in;
    };
    refused(with([&](GatedDeltaInputs& in) { in.k = k_short; }), "k shape");
    refused(with([&](GatedDeltaInputs& in) { in.v = v_odd; }), "nv not a multiple of nk");
    refused(with([&](GatedDeltaInputs& in) { in.v = v_short; }), "v tokens");
    refused(with([&](GatedDeltaInputs& in) { in.b = a_wrong; }), "b shape");
    refused(with([&](GatedDeltaInputs& in) { in.a_log = alog_wrong; }), "A_log size");
    refused(with([&](GatedDeltaInputs& in) { in.state = &state_wrong_v; }), "state shape (dk and dv swapped)");

    // NaN propagation, against the oracle's pattern:
    //  * v at (t=3, head 1, column 0): δ_0 is NaN, so column 0 of head 1's
    //    state and its output from t=3 on; the columns are independent.
    //  * q at (t=5, key head 0): the l2norm of that q, so every output of the
    //    value heads reading key head 0 (0 and 1) at t=5, and nothing else (q
    //    never enters the state).
    //  * a at (t=8, head 3): the decay, so all of head 3 from t=8 on.
    DeltaData n = d;
    n.v.set((3 * c.nv + 1) * c.dv + 0, NAN);
    n.q.set((5 * c.nk + 0) * c.dk + 7, NAN);
    n.a.set(8 * c.nv + 3, NAN);
    n.state_view = n.state.view();
    const GatedDeltaResult r = ocl->gated_delta_rule(n.inputs(true));
    const GatedDeltaResult rr = ref()->gated_delta_rule(n.inputs(true));
    const std::vector<bool> mo = nan_mask(r.out), ms = nan_mask(r.state);
    EXPECT_EQ(mo, nan_mask(rr.out));
    EXPECT_EQ(ms, nan_mask(rr.state));
    const std::int64_t expect_out = (12 - 3) * 1           // head 1 column 0, t = 3..11
                                    + 2 * c.dv - 1         // heads 0, 1 at t = 5 (column 0 of head 1 counted)
                                    + (12 - 8) * c.dv;     // head 3, t = 8..11
    EXPECT_EQ(count(mo), expect_out);
    EXPECT_EQ(count(ms), c.dk * 1 + c.dk * c.dv);  // head 1 column 0, all of head 3
    const CompareStats so = compare(rr.out, r.out), ss = compare(rr.state, r.state);
    EXPECT_EQ(so.nonfinite_mismatch, 0);
    EXPECT_EQ(ss.nonfinite_mismatch, 0);
    EXPECT_GT(so.count, 0);
    EXPECT_TRUE(within(so.max_abs, 1e-5 * 10)) << so.max_abs;
}
