// What only the OpenCL backend has: device probing and selection, its
// options and their errors, acc=f16 needing cl_khr_fp16, kernels embedded in
// the binary, build logs on a failed program build, the widened upload path,
// and a reduction order of its own. The backend contract (error bounds from
// the OpenCL spec, storage variants, shape errors, NaN/Inf, determinism,
// router and MoE) is tests/backend/test_conformance.cpp, run on opencl:0
// like on every other node.
//
// Every test skips, visibly and with the reason, when this build has no
// OpenCL or the machine has no OpenCL device (CI installs PoCL).
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
