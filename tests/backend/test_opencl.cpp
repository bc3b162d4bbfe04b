// opencl against cpu-ref within error bounds derived from the OpenCL spec,
// plus what makes this backend different: its own reduction order, build
// logs on failure, device selection and precision variants.
//
// Every test skips, visibly and with the reason, when this build has no
// OpenCL or the machine has no OpenCL device (CI installs PoCL).
//
// Tolerances (u = 2^-24, the unit roundoff of f32; "ulp" as in metrics.hpp):
//  * matmul: |ŷ - y| ≤ γ_K · Σ_k |x_k w_k| + u·|y|, γ_K = K·u / (1 - K·u):
//    Higham's bound for ANY summation order (fma only removes roundings).
//  * softmax/rmsnorm: relative 1e-5 for rows ≤ 5000 — the tree reduction's
//    error is far smaller; exp ≤ 3 ulp, x/y ≤ 2.5 ulp, sqrt ≤ 3 ulp (OpenCL
//    1.2 §7.4, full profile) add ~1e-6 at most.
//  * swiglu / sigmoid: the OpenCL spec, not glibc, bounds the built-ins:
//    exp ≤ 3 ulp and x/y ≤ 2.5 ulp; + and * are correctly rounded (0.5 ulp).
//    Relative errors add along the formula; an error of r ulp of an
//    intermediate is at most 2r ulp of the final value (the final value may
//    sit just below a power of two, where its ulp is half as large). So
//      sigmoid = 1/(1+e^-x):      2·(3 + 0.5 + 2.5)       = 12 ulp
//      swiglu  = g/(1+e^-g)·u:    2·(3 + 0.5 + 2.5 + 0.5) = 13 ulp
//    (PoCL measures far below; the bound is what any conformant device owes.)
//  * rope: per element, from pow ≤ 16 ulp, x/y ≤ 2.5 ulp (in the exponent
//    -2i/d, amplified by ln θ), sin/cos ≤ 4 ulp — see RopeWithinSpecBound.
#include "kvasir/backend/registry.hpp"
#include "tests/backend/matmul_bound.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"

#if defined(KVASIR_HAVE_OPENCL)
#include "kvasir/backend/opencl/opencl_backend.hpp"
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>

using namespace kvasir;

namespace {

using test::gamma;
using test::kU32;
using test::matmul_within_bound;

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
        if (!why.empty()) GTEST_SKIP() << "no OpenCL device: " << why;
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
    EXPECT_TRUE(within(f16.max_abs, gamma(2048, 1.0 / 2048) * 2048 * 4)) << f16.max_abs;
}

#if defined(KVASIR_HAVE_OPENCL)
TEST_F(Opencl, EveryKernelFileIsEmbedded) {
    for (const char* f : {"common.cl", "matmul.cl", "rows.cl", "elementwise.cl"})
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

// ---- ops against the oracle -----------------------------------------------------------

class OpenclMatmul : public ::testing::TestWithParam<std::tuple<std::int64_t, std::int64_t, std::int64_t>> {
protected:
    void SetUp() override {
        const std::string why = opencl_absent_reason();
        if (!why.empty()) GTEST_SKIP() << "no OpenCL device: " << why;
    }
};

TEST_P(OpenclMatmul, WithinGammaKBound) {
    const auto [T, N, K] = GetParam();
    const Tensor x = seeded_normal(41, "ocl/x", {T, K}, 0, 1);
    const Tensor w = seeded_normal(41, "ocl/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
    const Tensor yr = ref()->matmul(x, w);
    const Tensor yc = create_backend("opencl:0")->matmul(x, w);
    ASSERT_EQ(yc.dtype(), DType::f32);
    EXPECT_TRUE(matmul_within_bound(x, w, yc, yr, 0, kU32));
}

// Edges: T and N not multiples of the 16×16 tile, K not a multiple of TILE_K.
INSTANTIATE_TEST_SUITE_P(Shapes, OpenclMatmul,
                         ::testing::Combine(::testing::Values(1, 5, 16, 33), ::testing::Values(7, 768),
                                            ::testing::Values(13, 2048)));

TEST_F(Opencl, MatmulKeepsLeadingDimsAndHandlesEmpty) {
    const Tensor x = seeded_normal(43, "l/x", {2, 3, 40}, 0, 1);
    const Tensor w = seeded_normal(43, "l/w", {5, 40}, 0, 1);
    const Tensor y = node()->matmul(x, w);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
    EXPECT_TRUE(within(compare(ref()->matmul(x, w), y).max_rel, 1e-5));
    const Tensor none = node()->matmul(Tensor(DType::f32, {0, 40}), w);
    EXPECT_EQ(none.shape(), (Shape{0, 5}));
}

TEST_F(Opencl, ReductionsWithinRelativeBound) {
    auto ocl = node();
    // Widths below, at and above the 256-wide work-group, and not multiples of it.
    for (std::int64_t cols : {1, 7, 256, 300, 4096, 5000}) {
        const Tensor x = seeded_normal(11, "r/x", {8, cols}, 0, 3);
        const Tensor w = seeded_normal(11, "r/w", {cols}, 1, 0.1);
        const CompareStats sm = compare(ref()->softmax(x), ocl->softmax(x));
        EXPECT_TRUE(within(sm.max_rel, 1e-5)) << "softmax cols=" << cols << " " << sm.max_rel;
        const CompareStats rn = compare(ref()->rmsnorm(x, w, 1e-6), ocl->rmsnorm(x, w, 1e-6));
        EXPECT_TRUE(within(rn.max_rel, 1e-5)) << "rmsnorm cols=" << cols << " " << rn.max_rel;
    }
}

TEST_F(Opencl, SoftmaxNaNPoisonsTheRowAsOnTheOracle) {
    const Tensor x = Tensor::from_f64(std::vector<double>{1, NAN, 2, 1, 2, 3}, {2, 3}, DType::f32);
    const Tensor y = node()->softmax(x);
    for (int c = 0; c < 3; ++c) EXPECT_TRUE(std::isnan(y.at(c)));
    for (int c = 3; c < 6; ++c) EXPECT_FALSE(std::isnan(y.at(c)));
    EXPECT_TRUE(finite_parity(compare(ref()->softmax(x), y)));
}

TEST_F(Opencl, ElementwiseOpsWithinSpecUlp) {
    const Tensor g = seeded_normal(9, "e/g", {4, 1000}, 0, 3);
    const Tensor u = seeded_normal(9, "e/u", {4, 1000}, 0, 1);
    auto ocl = node();
    const CompareStats sw = compare(ref()->swiglu(g, u), ocl->swiglu(g, u));
    EXPECT_TRUE(within(sw.max_ulp, 13.0)) << sw.max_ulp;
    const CompareStats sg = compare(ref()->sigmoid(g), ocl->sigmoid(g));
    EXPECT_TRUE(within(sg.max_ulp, 12.0)) << sg.max_ulp;
    std::cout << "[ info     ] measured max ulp: swiglu " << sw.max_ulp << ", sigmoid " << sg.max_ulp << '\n';
}

TEST_F(Opencl, RopeWithinSpecBound) {
    // Per element: the device's angle pos·θ^(-2i/d) carries a relative error
    // δ ≤ (2.5·ln θ + 16 + 0.5)·2^-23 (division in the exponent, pow, the
    // product); sin/cos add ≤ 4 ulp ≤ 4·2^-23; a·c − b·s rounds 3 times.
    // |Δy| ≤ (|a| + |b|)·(angle·δ + 4·2^-23 + 3·2^-24), with 1% slack.
    const std::int64_t T = 8, H = 2, D = 64;
    const Tensor x = seeded_normal(13, "p/x", {T, H, D}, 0, 1);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) pos[static_cast<std::size_t>(i)] = 1000 * i;
    const double theta = 1e6;
    const double delta = (2.5 * std::log(theta) + 16.5) * 2 * kU32;
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        const Tensor yr = ref()->rope(x, pos, {theta, layout});
        const Tensor yc = node()->rope(x, pos, {theta, layout});
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t i = 0; i < D / 2; ++i) {
                    const std::int64_t base = (t * H + h) * D;
                    const std::int64_t i0 = layout == RopeLayout::neox ? i : 2 * i;
                    const std::int64_t i1 = layout == RopeLayout::neox ? i + D / 2 : 2 * i + 1;
                    const double angle = static_cast<double>(pos[static_cast<std::size_t>(t)]) *
                                         std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
                    const double ab = std::fabs(x.at(base + i0)) + std::fabs(x.at(base + i1));
                    const double bound = 1.01 * ab * (angle * delta + 8 * kU32 + 3 * kU32);
                    for (std::int64_t j : {i0, i1})
                        ASSERT_LE(std::fabs(yc.at(base + j) - yr.at(base + j)), bound)
                            << (layout == RopeLayout::neox ? "neox" : "normal") << " t=" << t << " i=" << i;
                }
        // Position 0 is the identity on the device too (cos 0 = 1, sin 0 = 0 exactly).
        const std::vector<std::int64_t> zero(static_cast<std::size_t>(T), 0);
        EXPECT_EQ(node()->rope(x, zero, {theta, layout}).to_f64(), x.to_f64());
    }
}

TEST_F(Opencl, ShapeErrorsAreBadInput) {
    auto ocl = node();
    const Tensor a = seeded_normal(1, "s/a", {2, 3}, 0, 1);
    const Tensor b = seeded_normal(1, "s/b", {4, 5}, 0, 1);
    EXPECT_EQ(code_of([&] { ocl->matmul(a, b); }), ErrorCode::bad_input);
    EXPECT_EQ(code_of([&] { ocl->swiglu(a, b); }), ErrorCode::bad_input);
    EXPECT_EQ(code_of([&] { ocl->rmsnorm(a, b, 1e-6); }), ErrorCode::bad_input);
    const std::vector<std::int64_t> pos{0};
    EXPECT_EQ(code_of([&] { ocl->rope(seeded_normal(1, "s/r", {1, 1, 3}, 0, 1), pos, {}); }), ErrorCode::bad_input);
}

// ---- storage variants ----------------------------------------------------------------------

TEST_F(Opencl, StorageVariantsRoundToTheirFormat) {
    // storage=f16 needs no cl_khr_fp16 (vload_half/vstore_half are core), so it runs everywhere.
    const Tensor x = seeded_normal(17, "s/x", {4, 256}, 0, 1);
    const Tensor w = seeded_normal(17, "s/w", {32, 256}, 0, 0.0625);
    const Tensor yr = ref()->matmul(x, w);
    for (DType storage : {DType::bf16, DType::f16}) {
        auto ocl = create_backend(std::string("opencl:0:storage=") + dtype_name(storage));
        const Tensor y = ocl->matmul(x, w);
        for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.at(i), round_to(storage, y.at(i))) << dtype_name(storage);
        // The same bound as the cpu storage test: inputs rounded with relative
        // error ≤ u_s, f32 sums, the result rounded to storage.
        const double us = storage == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
        EXPECT_TRUE(matmul_within_bound(x, w, y, yr, 2 * us + us * us, 1.01 * us)) << dtype_name(storage);
        // Every op writes storage-representable values.
        const Tensor s = seeded_normal(17, "s/s", {3, 300}, 0, 2);
        for (const Tensor& out : {ocl->softmax(s), ocl->sigmoid(s), ocl->swiglu(s, s), ocl->rmsnorm(s, Tensor::convert(s.view().row(0), DType::f32), 1e-6)})
            for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.at(i), round_to(storage, out.at(i)));
        // Same storage on the cpu backend: equivalent, same error scale.
        const CompareStats c = compare(create_backend(std::string("cpu:storage=") + dtype_name(storage))->softmax(s), ocl->softmax(s));
        EXPECT_TRUE(within(c.max_rel, storage == DType::bf16 ? 1.0 / 64 : 1.0 / 512)) << c.max_rel;
    }
}

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

// ---- router, MoE, shard check ---------------------------------------------------------------

TEST_F(Opencl, RouterIdsAgreeWithOracleOnSeparatedLogits) {
    // Each row is a permutation of 0, 0.05, ..., 3.15: neighbouring scores
    // differ by ≥ 5%, far above any backend's error, so the top-k must agree.
    const std::int64_t T = 32, E = 64;
    std::vector<double> v(static_cast<std::size_t>(T * E));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t e = 0; e < E; ++e) v[static_cast<std::size_t>(t * E + e)] = 0.05 * static_cast<double>((e * 37 + t * 11) % E);
    const Tensor logits = Tensor::from_f64(v, {T, E}, DType::f32);
    for (RouterScoring scoring : {RouterScoring::softmax, RouterScoring::sigmoid}) {
        RouterParams p;
        p.top_k = 8;
        p.scoring = scoring;
        const RouterOutput r = ref()->route(logits, p);
        const RouterOutput o = node()->route(logits, p);
        const IndexAgreement a = compare_indices(r.ids, o.ids);
        EXPECT_EQ(a.exact_match_rate, 1.0);
        EXPECT_EQ(std::memcmp(r.ids.raw(), o.ids.raw(), r.ids.nbytes()), 0);  // same order too
        EXPECT_TRUE(within(compare(r.weights, o.weights).max_rel, 1e-5));
        EXPECT_TRUE(within(compare(r.scores, o.scores).max_rel, 1e-5));
    }
}

namespace {
struct SmallMoe {
    Tensor x;
    std::vector<Tensor> storage;
    std::vector<ExpertWeights> experts;
    RoutingPlan plan;
    SmallMoe(std::int64_t T, std::int64_t H, std::int64_t I, std::int64_t E, int k) {
        x = seeded_normal(31, "m/x", {T, H}, 0, 1);
        for (std::int64_t e = 0; e < E; ++e) {
            storage.push_back(seeded_normal(31, "m/g" + std::to_string(e), {I, H}, 0, 1 / std::sqrt(double(H))));
            storage.push_back(seeded_normal(31, "m/u" + std::to_string(e), {I, H}, 0, 1 / std::sqrt(double(H))));
            storage.push_back(seeded_normal(31, "m/d" + std::to_string(e), {H, I}, 0, 1 / std::sqrt(double(I))));
        }
        for (std::int64_t e = 0; e < E; ++e)
            experts.push_back({storage[std::size_t(3 * e)], storage[std::size_t(3 * e + 1)], storage[std::size_t(3 * e + 2)]});
        RouterParams p;
        p.top_k = k;
        // Router authority: the oracle decides, every node obeys.
        RouterOutput r = create_backend("cpu-ref")->route(seeded_normal(31, "m/logits", {T, E}, 0, 1), p);
        plan = {r.ids, r.weights};
    }
};
}  // namespace

TEST_F(Opencl, MoeBlockMatchesOracleWithPinnedRouting) {
    const SmallMoe m(12, 256, 96, 16, 8);
    const CompareStats s = compare(ref()->moe_block(m.x, m.experts, m.plan), node()->moe_block(m.x, m.experts, m.plan));
    EXPECT_TRUE(at_least(s.cosine, 0.999999)) << s.cosine;
    EXPECT_TRUE(within(s.max_rel, 1e-3)) << s.max_rel;
}

TEST_F(Opencl, ShardCheckIsEquivalentOnOpencl) {
    const SmallMoe m(12, 256, 96, 16, 8);
    auto ocl = node();
    const Tensor mono = ocl->moe_block(m.x, m.experts, m.plan);
    Tensor combined;
    const int shards = 4;
    const auto E = static_cast<std::int64_t>(m.experts.size());
    for (int s = 0; s < shards; ++s) {
        std::vector<bool> mine(static_cast<std::size_t>(E));
        for (std::int64_t e = 0; e < E; ++e) mine[static_cast<std::size_t>(e)] = e * shards / E == s;
        Tensor part = ocl->moe_block(m.x, m.experts, m.plan, &mine);
        combined = s == 0 ? std::move(part) : ocl->add(combined, part);
    }
    const CompareStats c = compare(mono, combined);
    EXPECT_TRUE(within(c.max_rel, 1e-4)) << c.max_rel;
}

// ---- determinism and what makes this backend different --------------------------------------

TEST_F(Opencl, RunsAreBitIdentical) {
    const Tensor x = seeded_normal(5, "d/x", {33, 2048}, 0, 1);
    const Tensor w = seeded_normal(5, "d/w", {77, 2048}, 0, 1);
    const Tensor nw = seeded_normal(5, "d/n", {2048}, 1, 0.1);
    auto a = node();
    auto b = node();  // a second node on the same device shares the program cache, not the kernels
    const auto same = [](const Tensor& p, const Tensor& q) { return std::memcmp(p.raw(), q.raw(), p.nbytes()) == 0; };
    EXPECT_TRUE(same(a->matmul(x, w), a->matmul(x, w)));
    EXPECT_TRUE(same(a->matmul(x, w), b->matmul(x, w)));
    EXPECT_TRUE(same(a->softmax(x), b->softmax(x)));
    EXPECT_TRUE(same(a->rmsnorm(x, nw, 1e-6), b->rmsnorm(x, nw, 1e-6)));
}

TEST_F(Opencl, ReductionOrderDiffersFromTheCpuBackend) {
    // The point of running OpenCL at all: a different reduction order gives
    // different bits (while staying within the bound above).
    const Tensor x = seeded_normal(7, "o/x", {16, 2048}, 0, 1);
    const Tensor w = seeded_normal(7, "o/w", {768, 2048}, 0, 1 / std::sqrt(2048.0));
    const CompareStats s = compare(create_backend("cpu")->matmul(x, w), node()->matmul(x, w));
    EXPECT_FALSE(s.bit_identical);
    EXPECT_GT(s.max_abs, 0.0);
    EXPECT_TRUE(within(s.max_rel, 1e-3)) << s.max_rel;
    std::cout << "[ info     ] cpu vs opencl matmul 16x768x2048: max|d| " << s.max_abs << ", cosine " << s.cosine << '\n';
}
