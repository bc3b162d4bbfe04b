// The backend contract, written once and run on every node: cpu-ref, the cpu
// variants, OpenCL (PoCL gives a real OpenCL device on the CPU), the CUDA/HIP
// node — its host code and kernels — on the CPU emulation of a GPU (gpu-emu:
// tests/backend/gpu_emulated_node.hpp), and cuda:0 / hip:0 with their
// variants where such a device exists. Only
// those last skip, visibly and with the reason, when the device is absent; an
// OpenCL build without an OpenCL device fails (CI installs PoCL).
//
// What stays in test_cpu_backends.cpp, test_opencl.cpp and test_gpu.cpp is
// what only that backend has: kernel orders and thread-count independence,
// AVX2 vs portable kernels, OpenCL program builds and device selection, the
// GPU's device math, launch geometry and device-vs-emulation bits.
//
// Suites:
//   Conformance           every node: the properties below
//   StorageConformance    nodes with storage=f16|bf16: outputs are values of
//                         the format, and its error is the format's
//   F16AccConformance     nodes with acc=f16: the exact emulation of a half
//                         accumulator, bit for bit
//   LinearAttentionConformance  every node: Gated DeltaNet's causal conv +
//                         SiLU and gated delta rule (bounds at the suite)
//
// Tolerances come from what the node says it is (its capabilities): u_s, the
// unit roundoff of its storage format (f32 2⁻²⁴, f16 2⁻¹¹, bf16 2⁻⁸), u_a of
// its accumulation, and from its family's f32 arithmetic (Family below).
// Against the oracle, a narrow-storage node and the oracle get the same
// inputs, already rounded to storage, so the bound is what the node's own
// arithmetic adds; matmul alone is held to the bound that includes rounding
// the inputs.
//  * matmul: |ŷ − y| ≤ (i + γ_K(u_a))·Σ_k|x_k w_k| + o·|y| for any summation
//    order (Higham, Accuracy and Stability of Numerical Algorithms, §3.1;
//    matmul_bound.hpp), i = 2u_s + u_s² and o = 1.01u_s for narrow storage,
//    i = 0 and o = u for f32; a half accumulator adds K·2⁻²⁵ for its
//    subnormal steps, and γ_K(u_a) exists only for K·u_a < 1.
//  * softmax, rmsnorm: relative 1e-5 per element for rows ≤ 5000, 1e-4 for a
//    vocabulary-wide row (f32, any reduction order, exp/sqrt/division within
//    a few ulp); narrow storage adds 3u_s to softmax (the exponentials, hence
//    the sum's terms, and the result are rounded to storage) and u_s to
//    rmsnorm (the result), plus half a subnormal step per rounding; a half
//    accumulator adds γ_cols(2⁻¹¹), the error of any order of summing
//    positive terms.
//  * swiglu / sigmoid, in f32 ulp of the oracle's value: cpu and gpu 4 / 3
//    (exp ≤ 1 ulp, 2–4 rounded operations); OpenCL 13 / 12, what the OpenCL
//    1.2 spec (§7.4, full profile) lets a conformant device return: exp ≤ 3
//    ulp, x/y ≤ 2.5 ulp, + and * correctly rounded; relative errors add along
//    the formula and r ulp of an intermediate is at most 2r ulp of the result
//    (which may sit just below a power of two), so sigmoid = 1/(1+e^-x):
//    2·(3 + 0.5 + 2.5) = 12 and swiglu = g/(1+e^-g)·u: 2·(3 + 0.5 + 2.5 +
//    0.5) = 13. Narrow storage: r·2⁻²³ relative plus the final rounding.
//  * rope: cpu and gpu compute angles in f32 (|Δangle| ≲ pos·θ_i·2⁻²³), so
//    |Δy| ≤ 7000·4·u·8 for positions ≤ 7000 and |x| ≲ 4. OpenCL, per element,
//    from the spec: the device's angle pos·θ^(-2i/d) carries a relative error
//    δ ≤ (2.5·ln θ + 16 + 0.5)·2⁻²³ (division in the exponent amplified by
//    ln θ, pow ≤ 16 ulp, the product); sin/cos add ≤ 4 ulp; a·c − b·s rounds
//    3 times: |Δy| ≤ 1.01·(|a| + |b|)·(angle·δ + 4·2⁻²³ + 3·2⁻²⁴).
//  * hand-computed values: closed forms evaluated in double on the values
//    the node holds; the oracle within the absolute 1e-15 (1e-14 for rope)
//    it has always been held to, other nodes within the bounds above.
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/model/rope_frequencies.hpp"
#include "tests/backend/gpu_emulated_node.hpp"
#include "tests/backend/matmul_bound.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

using namespace kvasir;

namespace {

using test::gamma;
using test::kU32;
using test::matmul_within_bound;

// ---- the nodes ----------------------------------------------------------------------

// The f32 arithmetic of a backend, which sets the bounds that do not follow
// from the storage and accumulation formats alone.
enum class Family { oracle, cpu, opencl, gpu };

struct Node {
    std::string label;  // test-name suffix
    std::string spec;   // test::create_node() spec: a registered backend's, or gpu-emu[:options]
    Family family;
    std::string device;   // the backend whose device this node needs ("" = always there)
    std::string sibling;  // the same backend at f32 storage and accumulation
};

void PrintTo(const Node& n, std::ostream* os) { *os << n.spec; }

std::string node_label(const ::testing::TestParamInfo<Node>& p) { return p.param.label; }

std::unique_ptr<Backend> make(const std::string& spec) { return test::create_node(spec); }

std::unique_ptr<Backend> ref() { return create_backend("cpu-ref"); }

const BackendStatus* status_of(const std::string& name) {
    static const std::vector<BackendStatus> all = list_backends();
    for (const BackendStatus& s : all)
        if (s.name == name) return &s;
    return nullptr;
}

// A GPU vendor's node and its variants; cuda also has cuBLAS (tf32=0 claims
// the f32 contract).
std::vector<Node> gpu_nodes(const std::string& vendor) {
    const std::string base = vendor + ":0";
    std::vector<Node> nodes = {
        {vendor, base, Family::gpu, vendor, base},
        {vendor + "_storage_f16", base + ":storage=f16", Family::gpu, vendor, base},
        {vendor + "_storage_bf16", base + ":storage=bf16", Family::gpu, vendor, base},
        {vendor + "_acc_f16", base + ":acc=f16", Family::gpu, vendor, base},
        {vendor + "_nondeterministic", base + ":nondeterministic=1", Family::gpu, vendor, base},
    };
    if (vendor == "cuda") nodes.push_back({"cuda_cublas", "cuda:0:blas=cublas,tf32=0", Family::gpu, "cuda", base});
    return nodes;
}

std::vector<Node> all_nodes() {
    std::vector<Node> nodes = {
        {"cpu_ref", "cpu-ref", Family::oracle, "", "cpu-ref"},
        {"cpu", "cpu", Family::cpu, "", "cpu"},
        {"cpu_threads1", "cpu:threads=1", Family::cpu, "", "cpu"},
        {"cpu_storage_f16", "cpu:storage=f16", Family::cpu, "", "cpu"},
        {"cpu_storage_bf16", "cpu:storage=bf16", Family::cpu, "", "cpu"},
        {"cpu_acc_f16", "cpu:acc=f16", Family::cpu, "", "cpu"},
#if defined(KVASIR_HAVE_OPENCL)
        // storage=f16 needs no cl_khr_fp16 (vload_half/vstore_half are core);
        // acc=f16 does, so it is test_opencl.cpp's (unsupported or it runs).
        {"opencl", "opencl:0", Family::opencl, "opencl", "opencl:0"},
        {"opencl_storage_f16", "opencl:0:storage=f16", Family::opencl, "opencl", "opencl:0"},
        {"opencl_storage_bf16", "opencl:0:storage=bf16", Family::opencl, "opencl", "opencl:0"},
#endif
        {"gpu_emu", "gpu-emu", Family::gpu, "", "gpu-emu"},
        {"gpu_emu_storage_f16", "gpu-emu:storage=f16", Family::gpu, "", "gpu-emu"},
        {"gpu_emu_storage_bf16", "gpu-emu:storage=bf16", Family::gpu, "", "gpu-emu"},
        {"gpu_emu_acc_f16", "gpu-emu:acc=f16", Family::gpu, "", "gpu-emu"},
        {"gpu_emu_nondeterministic", "gpu-emu:nondeterministic=1", Family::gpu, "", "gpu-emu"},
        // The blas= path on the emulation's stand-in BLAS (a shape-chosen split-K, as cuBLAS chooses its kernel).
        {"gpu_emu_blas", "gpu-emu:blas=emulated,tf32=0", Family::gpu, "", "gpu-emu"},
    };
    for (const char* vendor : {"cuda", "hip"})
        for (Node& n : gpu_nodes(vendor)) nodes.push_back(std::move(n));
    return nodes;
}

std::string option_of(const std::string& spec, const std::string& key, const std::string& absent) {
    const BackendSpec s = BackendSpec::parse(spec);
    const auto it = s.options.find(key);
    return it == s.options.end() ? absent : it->second;
}

std::vector<Node> nodes_where(const std::function<bool(const Node&)>& keep) {
    std::vector<Node> out;
    for (const Node& n : all_nodes())
        if (keep(n)) out.push_back(n);
    return out;
}

// ---- precision ------------------------------------------------------------------------

double unit_roundoff(DType t) {
    switch (t) {
        case DType::f64: return 0x1p-53;
        case DType::f32: return 0x1p-24;
        case DType::f16: return 0x1p-11;
        case DType::bf16: return 0x1p-8;
        default: return NAN;
    }
}

// The largest error of one rounding into the subnormals of a storage format
// narrower than f32: half their spacing.
double subnormal_half_step(DType t) { return t == DType::f16 ? 0x1p-25 : t == DType::bf16 ? 0x1p-134 : NAN; }

// Every element: |got − want| ≤ rel·|want| + abs. NaN anywhere fails.
::testing::AssertionResult elementwise_close(const Tensor& want, const Tensor& got, double rel, double abs) {
    if (want.numel() != got.numel()) return ::testing::AssertionFailure() << "element counts differ";
    for (std::int64_t i = 0; i < want.numel(); ++i) {
        const double w = want.at(i), g = got.at(i);
        if (!(std::fabs(g - w) <= rel * std::fabs(w) + abs))
            return ::testing::AssertionFailure() << "element " << i << ": " << g << " vs " << w << ", |Δ| "
                                                 << std::fabs(g - w) << " > " << rel * std::fabs(w) + abs;
    }
    return ::testing::AssertionSuccess();
}

// A row-major tensor as [rows, numel / rows].
Tensor as_matrix(const Tensor& t, std::int64_t rows) {
    Tensor copy = t;
    return std::move(copy).reshaped({rows, t.numel() / std::max<std::int64_t>(rows, 1)});
}

// ---- the fixture ----------------------------------------------------------------------

class NodeTest : public ::testing::TestWithParam<Node> {
protected:
    void SetUp() override {
        const Node& n = GetParam();
        if (!n.device.empty()) {
            const BackendStatus* st = status_of(n.device);
            ASSERT_NE(st, nullptr) << n.device << " is not registered";
            if (n.device == "opencl") {
                ASSERT_TRUE(st->available) << "OpenCL is compiled in but has no device: " << st->reason;
            } else if (!st->available) {
                GTEST_SKIP() << n.spec << ": " << (st->compiled ? "absent: " : "not compiled: ") << st->reason;
            }
        }
        node_ = make(n.spec);
        caps_ = node_->capabilities();
    }

    Backend& node() { return *node_; }
    const Capabilities& caps() const { return caps_; }
    bool oracle() const { return GetParam().family == Family::oracle; }
    bool narrow() const { return caps_.storage == DType::f16 || caps_.storage == DType::bf16; }
    bool f16_acc() const { return caps_.accumulation == DType::f16; }
    double us() const { return unit_roundoff(caps_.storage); }
    double ua() const { return unit_roundoff(caps_.accumulation); }
    double underflow() const { return narrow() ? subnormal_half_step(caps_.storage) : 0.0; }

    // Literal inputs as the node's callers hand them over: f64 to the oracle,
    // f32 to every other node.
    Tensor input(std::vector<double> v, Shape s) const { return Tensor::from_f64(v, std::move(s), caps_.output); }
    // The values the node holds after rounding its inputs to storage (in its
    // output dtype): what the oracle is given so that both see the same numbers.
    Tensor held(const Tensor& x) const {
        if (caps_.storage == DType::f64) return Tensor::convert(x.view(), DType::f64);
        return Tensor::convert(Tensor::convert(x.view(), caps_.storage).view(), DType::f32);
    }

    // Family bounds (see the top of the file).
    double swiglu_ulp() const { return GetParam().family == Family::opencl ? 13.0 : 4.0; }
    double sigmoid_ulp() const { return GetParam().family == Family::opencl ? 12.0 : 3.0; }
    // +, ×, /, √ and fma correctly rounded: scaling by a power of two commutes
    // with every step. The OpenCL spec allows ulps of error in / and √.
    bool correctly_rounded() const { return GetParam().family != Family::opencl; }

    // A few roundings of f32 for a closed form of a handful of operations:
    // 32 u covers OpenCL's exp (3 ulp = 6 u) and division (2.5 ulp = 5 u) too.
    double few_roundings() const { return 32 * kU32; }

    // swiglu/sigmoid: r f32 ulp of the oracle's value; with narrow storage,
    // r·2⁻²³ relative plus the rounding of the result.
    ::testing::AssertionResult within_ulp(const Tensor& want, const Tensor& got, double r) const {
        if (!narrow()) {
            const CompareStats s = compare(want, got);
            if (within(s.max_ulp, r)) return ::testing::AssertionSuccess();
            return ::testing::AssertionFailure() << "max ulp " << s.max_ulp << " > " << r;
        }
        return elementwise_close(want, got, r * 0x1p-23 + 1.01 * us(), underflow());
    }

    // Softmax relative bound for rows of `cols`, valid only when
    // reduction_bound_exists(cols).
    double softmax_rel(std::int64_t cols) const {
        return (cols <= 5000 ? 1e-5 : 1e-4) + (narrow() ? 3 * us() : 0.0) + (f16_acc() ? gamma(cols, ua()) : 0.0);
    }
    double rmsnorm_rel(std::int64_t cols) const {
        return 1e-5 + (narrow() ? us() : 0.0) + (f16_acc() ? gamma(cols, ua()) : 0.0);
    }
    // γ_n(u_a) exists for n·u_a < 1 only: a half accumulator has no error
    // bound on rows of 2048 and more (F16AccConformance shows how large the
    // error gets).
    bool reduction_bound_exists(std::int64_t n) const { return static_cast<double>(n) * ua() < 1.0; }

    // The matmul bound for this node's formats, for inner dimension K and
    // abs_sum = Σ_k|x w| per output.
    ::testing::AssertionResult matmul_bound(std::int64_t K, const std::vector<double>& abs_sum, const Tensor& y,
                                            const Tensor& yr) const {
        const double input_rel = narrow() ? 2 * us() + us() * us() : 0.0;
        const double out_u = narrow() ? 1.01 * us() : kU32;
        const double abs_err = (f16_acc() ? static_cast<double>(K) * 0x1p-25 : 0.0) + underflow();
        return matmul_within_bound(K, abs_sum, y, yr, input_rel, out_u, f16_acc() ? ua() : kU32, abs_err);
    }
    ::testing::AssertionResult matmul_bound(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& yr) const {
        return matmul_bound(x.dim(1), test::abs_products(x, w), y, yr);
    }

    std::unique_ptr<Backend> node_;
    Capabilities caps_;
};

ErrorCode code_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.code();
    }
    return ErrorCode::internal;  // nothing thrown: compared against error codes only
}

// ---- matmul ---------------------------------------------------------------------------

using Shape3 = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

// T, N, K: one output; odd sizes around every backend's tiles (cpu 6×16 and
// 8×8 transposes, OpenCL 16×16, GPU 64×64 with K staged 16 at a time); K of
// 768 and 2048 as in real layers, with T from one token to a batch.
const std::vector<Shape3>& matmul_shapes() {
    static const std::vector<Shape3> shapes = [] {
        std::vector<Shape3> s = {{1, 1, 1},     {3, 4, 8},         {5, 7, 13},        {7, 9, 100},
                                 {3, 65, 33},   {70, 130, 100},    {64, 70, 1000},    {16, 33, 2048},
                                 {4, 2048, 768}, {64, 768, 2048}};
        for (std::int64_t T : {1, 5, 16, 33})
            for (std::int64_t N : {7, 768})
                for (std::int64_t K : {13, 2048})
                    if (Shape3{T, N, K} != Shape3{5, 7, 13}) s.emplace_back(T, N, K);
        return s;
    }();
    return shapes;
}

class Conformance : public NodeTest {};

// Operands, oracle result and Σ|x w| of one shape, computed once per process
// and shared by every node.
struct MatmulCase {
    Tensor x, w, yr;
    std::vector<double> abs_sum;
};
const MatmulCase& matmul_case(const Shape3& shape) {
    static std::map<Shape3, MatmulCase> cache;
    const auto it = cache.find(shape);
    if (it != cache.end()) return it->second;
    const auto [T, N, K] = shape;
    MatmulCase c;
    c.x = seeded_normal(7, "conf/x", {T, K}, 0, 1);
    c.w = seeded_normal(7, "conf/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
    c.yr = ref()->matmul(c.x, c.w);
    c.abs_sum = test::abs_products(c.x, c.w);
    return cache.emplace(shape, std::move(c)).first->second;
}

TEST_P(Conformance, MatmulWithinGammaKBound) {
    for (const Shape3& shape : matmul_shapes()) {
        const auto [T, N, K] = shape;
        // γ_K(u_a) does not exist; F16AccConformance pins these bit for bit.
        if (f16_acc() && !reduction_bound_exists(K)) continue;
        const MatmulCase& c = matmul_case(shape);
        const Tensor y = node().matmul(c.x, c.w);
        ASSERT_EQ(y.dtype(), caps().output);
        ASSERT_TRUE(matmul_bound(K, c.abs_sum, y, c.yr)) << T << "x" << N << "x" << K;
    }
}

TEST_P(Conformance, MatmulByHand) {
    // x = [[1,2,3],[4,5,6]], w = [[1,0,-1],[2,1,0]] → y = x·wᵀ = [[-2,4],[-2,13]]:
    // small integers, exact in every format and every accumulator.
    const Tensor y = node().matmul(input({1, 2, 3, 4, 5, 6}, {2, 3}), input({1, 0, -1, 2, 1, 0}, {2, 3}));
    ASSERT_EQ(y.shape(), (Shape{2, 2}));
    EXPECT_EQ(y.to_f64(), (std::vector<double>{-2, 4, -2, 13}));
}

TEST_P(Conformance, MatmulKeepsLeadingDimsAndHandlesEmpty) {
    const Tensor x = seeded_normal(43, "conf/l/x", {2, 3, 40}, 0, 1);
    const Tensor w = seeded_normal(43, "conf/l/w", {5, 40}, 0, 1);
    const Tensor y = node().matmul(x, w);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
    const Tensor x2 = as_matrix(x, 6);
    EXPECT_TRUE(matmul_bound(x2, w, as_matrix(y, 6), ref()->matmul(x2, w)));
    // No rows: no outputs. K = 0: every output is an empty sum, +0.
    EXPECT_EQ(node().matmul(Tensor(DType::f32, {0, 40}), w).shape(), (Shape{0, 5}));
    const Tensor y0 = node().matmul(Tensor(DType::f32, {2, 0}), Tensor(DType::f32, {3, 0}));
    EXPECT_EQ(y0.shape(), (Shape{2, 3}));
    EXPECT_EQ(y0.to_f64(), std::vector<double>(6, 0.0));
}

TEST_P(Conformance, MatmulNonFiniteValuesPropagate) {
    // inf·0 = NaN, inf + finite = inf, a NaN weight poisons its column only.
    Tensor x = seeded_normal(13, "conf/nf/x", {5, 20}, 0, 1);
    Tensor w = seeded_normal(13, "conf/nf/w", {9, 20}, 0, 1);
    x.set(1 * 20 + 3, INFINITY);
    w.set(4 * 20 + 7, NAN);
    w.set(6 * 20 + 3, 0.0);
    const Tensor y = node().matmul(x, w);
    EXPECT_TRUE(finite_parity(compare(ref()->matmul(x, w), y)));
    EXPECT_TRUE(std::isnan(y.at(1 * 9 + 6)));  // inf · 0
    EXPECT_TRUE(std::isinf(y.at(1 * 9 + 0)));
    for (int t = 0; t < 5; ++t) EXPECT_TRUE(std::isnan(y.at(t * 9 + 4))) << t;
    for (int t : {0, 2, 3, 4}) EXPECT_TRUE(std::isfinite(y.at(t * 9 + 2))) << t;  // rows without the inf
}

// ---- softmax --------------------------------------------------------------------------

TEST_P(Conformance, SoftmaxByHand) {
    // softmax([0, ln 2, ln 5]) = [1, 2, 5] / 8, and the same shifted by 100;
    // on the values the node holds (ln 2 rounded to its storage).
    const Tensor x = input({0, std::log(2.0), std::log(5.0), 100, 100 + std::log(2.0), 100 + std::log(5.0)}, {2, 3});
    const Tensor xh = held(x);
    const Tensor y = node().softmax(x);
    for (int r = 0; r < 2; ++r) {
        double m = -INFINITY, sum = 0;
        for (int c = 0; c < 3; ++c) m = std::max(m, xh.at(r * 3 + c));
        for (int c = 0; c < 3; ++c) sum += std::exp(xh.at(r * 3 + c) - m);
        for (int c = 0; c < 3; ++c) {
            const double want = std::exp(xh.at(r * 3 + c) - m) / sum;
            const double tol = oracle() ? 1e-15 : (few_roundings() + (narrow() ? 3 * us() : 0.0) + (f16_acc() ? gamma(2, ua()) : 0.0)) * want;
            EXPECT_NEAR(y.at(r * 3 + c), want, tol) << r << "," << c;
        }
    }
    if (oracle()) {  // the held values are the inputs themselves: the fractions by hand
        const double fractions[3] = {0.125, 0.25, 0.625};
        for (int c = 0; c < 3; ++c) EXPECT_NEAR(y.at(c), fractions[c], 1e-15);
    }
}

TEST_P(Conformance, SoftmaxRowsSumToOneWithinBoundOfTheOracle) {
    auto r = ref();
    // Widths below, at and above a 256-wide work-group or block and not
    // multiples of it; and a vocabulary-wide row (600 terms per GPU thread).
    for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {8, 1}, {8, 7}, {8, 256}, {8, 300}, {8, 4096}, {8, 5000}, {2, 151936}}) {
        const Tensor x = held(seeded_normal(11, "conf/r/x", {rows, cols}, 0, 3));
        const Tensor y = node().softmax(x);
        ASSERT_EQ(y.shape(), x.shape());
        for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(y.at(i) >= 0.0 && y.at(i) <= 1.0) << cols << " " << i;
        if (!reduction_bound_exists(cols)) continue;
        const double rel = softmax_rel(cols), abs = 2 * underflow();
        EXPECT_TRUE(elementwise_close(r->softmax(x), y, rel, abs)) << "cols=" << cols;
        for (std::int64_t row = 0; row < rows; ++row) {
            double sum = 0;
            for (std::int64_t c = 0; c < cols; ++c) sum += y.at(row * cols + c);
            EXPECT_LE(std::fabs(sum - 1), rel + static_cast<double>(cols) * abs) << "cols=" << cols << " row " << row;
        }
    }
}

TEST_P(Conformance, SoftmaxNonFiniteInputsPoisonOnlyTheirRow) {
    // NaN: the whole row is NaN. +inf: inf − inf = NaN, the whole row too.
    // −inf: an exact 0 in a row that is otherwise normal. Other rows untouched.
    const Tensor x = input({1, NAN, 2, 1, 2, 3, 1, INFINITY, 2, 1, -INFINITY, 2}, {4, 3});
    const Tensor y = node().softmax(x);
    EXPECT_TRUE(finite_parity(compare(ref()->softmax(x), y)));
    for (int c = 0; c < 3; ++c) EXPECT_TRUE(std::isnan(y.at(c))) << c;
    for (int c = 3; c < 6; ++c) EXPECT_TRUE(std::isfinite(y.at(c))) << c;
    for (int c = 6; c < 9; ++c) EXPECT_TRUE(std::isnan(y.at(c))) << c;
    EXPECT_EQ(y.at(10), 0.0);
    EXPECT_TRUE(std::isfinite(y.at(9)) && std::isfinite(y.at(11)));
    EXPECT_NEAR(y.at(9) + y.at(11), 1.0, oracle() ? 1e-15 : few_roundings() + 3 * us() + gamma(2, ua()));
}

// ---- rmsnorm --------------------------------------------------------------------------

TEST_P(Conformance, RmsnormByHand) {
    // x = [3, 4]: mean square 12.5, eps 0 → y = x / sqrt(12.5) · w
    const Tensor y = node().rmsnorm(input({3, 4}, {1, 2}), input({1, 2}, {2}), 0.0);
    const double want[2] = {3 / std::sqrt(12.5), 8 / std::sqrt(12.5)};
    for (int i = 0; i < 2; ++i)
        EXPECT_NEAR(y.at(i), want[i], oracle() ? 1e-15 : (few_roundings() + (narrow() ? us() : 0.0)) * want[i]) << i;
}

TEST_P(Conformance, RmsnormWithinBoundOfTheOracleAndNormalisesRows) {
    auto r = ref();
    for (std::int64_t cols : {1, 7, 256, 300, 4096, 5000}) {
        const Tensor x = held(seeded_normal(11, "conf/r/x", {8, cols}, 0, 3));
        const Tensor w = held(seeded_normal(11, "conf/r/w", {cols}, 1, 0.1));
        const Tensor y = node().rmsnorm(x, w, 1e-6);
        ASSERT_EQ(y.shape(), x.shape());
        if (!reduction_bound_exists(cols)) continue;
        const double rel = rmsnorm_rel(cols);
        EXPECT_TRUE(elementwise_close(r->rmsnorm(x, w, 1e-6), y, rel, underflow())) << "cols=" << cols;
        // Unit weight, eps 0: every row comes out with mean square 1.
        const Tensor ones = held(Tensor::from_f64(std::vector<double>(static_cast<std::size_t>(cols), 1.0), {cols}));
        const Tensor u = node().rmsnorm(x, ones, 0.0);
        for (std::int64_t row = 0; row < 8; ++row) {
            double mean_sq = 0;
            for (std::int64_t c = 0; c < cols; ++c) mean_sq += u.at(row * cols + c) * u.at(row * cols + c);
            mean_sq /= static_cast<double>(cols);
            EXPECT_LE(std::fabs(mean_sq - 1), 2 * rel + rel * rel + 2 * underflow()) << "cols=" << cols << " row " << row;
        }
    }
}

TEST_P(Conformance, RmsnormIsScaleInvariant) {
    // rmsnorm(4x) = rmsnorm(x) with eps = 0: every step scales exactly by a
    // power of two. Entries of magnitude 1 to 1.875, exact in every format,
    // keep every square and partial sum normal even in half.
    std::vector<double> v(2 * 64);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = (1.0 + static_cast<double>(i % 8) / 8) * (i % 3 == 0 ? -1 : 1);
    std::vector<double> v4(v);
    for (double& e : v4) e *= 4;
    const Tensor w = held(seeded_normal(3, "conf/si/w", {64}, 1, 0.1));
    const Tensor a = node().rmsnorm(input(v, {2, 64}), w, 0.0), b = node().rmsnorm(input(v4, {2, 64}), w, 0.0);
    if (correctly_rounded()) {
        EXPECT_EQ(a.to_f64(), b.to_f64());
    } else {
        EXPECT_TRUE(elementwise_close(a, b, 2 * rmsnorm_rel(64), 2 * underflow()));
    }
}

// ---- rope -----------------------------------------------------------------------------

namespace {
// The OpenCL spec's error of one rope output (see the top of the file).
double opencl_rope_bound(double ab, double angle, double theta) {
    const double delta = (2.5 * std::log(theta) + 16.5) * 2 * kU32;
    return 1.01 * ab * (angle * delta + 8 * kU32 + 3 * kU32);
}
}  // namespace

namespace {
// The element indices of rotated pair i of the head that starts at `base`.
std::pair<std::int64_t, std::int64_t> rope_pair(RopeLayout layout, std::int64_t base, std::int64_t i, std::int64_t D) {
    return layout == RopeLayout::neox ? std::pair{base + i, base + i + D / 2} : std::pair{base + 2 * i, base + 2 * i + 1};
}
}  // namespace

TEST_P(Conformance, RopeByHand) {
    // D = 4, theta = 10000: pair 0 turns by pos·1, pair 1 by pos·10000^(-1/2) = pos/100.
    // Every f32 node is held to the per-element bound of the OpenCL spec here
    // (glibc's and the GPU's sin/cos/pow are at least that accurate): at
    // angles ≤ 3 it is far tighter than the f32-angle bound for positions to 7000.
    const Tensor x = input({1, 2, 3, 4}, {1, 1, 4});
    const std::vector<std::int64_t> pos{3};
    const double a0 = 3.0, a1 = 0.03;
    const auto near = [&](double got, double want, double a, double b, double angle) {
        const double tol = oracle() ? 1e-14
                                    : opencl_rope_bound(std::fabs(a) + std::fabs(b), angle, 10000.0) +
                                          (narrow() ? 1.01 * us() * std::fabs(want) : 0.0);
        EXPECT_NEAR(got, want, tol);
    };
    const Tensor neox = node().rope(x, pos, {10000.0, RopeLayout::neox});  // pairs (0,2), (1,3)
    near(neox.at(0), 1 * std::cos(a0) - 3 * std::sin(a0), 1, 3, a0);
    near(neox.at(2), 3 * std::cos(a0) + 1 * std::sin(a0), 1, 3, a0);
    near(neox.at(1), 2 * std::cos(a1) - 4 * std::sin(a1), 2, 4, a1);
    near(neox.at(3), 4 * std::cos(a1) + 2 * std::sin(a1), 2, 4, a1);
    const Tensor normal = node().rope(x, pos, {10000.0, RopeLayout::normal});  // pairs (0,1), (2,3)
    near(normal.at(0), 1 * std::cos(a0) - 2 * std::sin(a0), 1, 2, a0);
    near(normal.at(1), 2 * std::cos(a0) + 1 * std::sin(a0), 1, 2, a0);
    near(normal.at(2), 3 * std::cos(a1) - 4 * std::sin(a1), 3, 4, a1);
    near(normal.at(3), 4 * std::cos(a1) + 3 * std::sin(a1), 3, 4, a1);
}

TEST_P(Conformance, RopeWithinAngleErrorOfTheOraclePreservingNorms) {
    const std::int64_t T = 8, H = 2, D = 64;
    const double theta = 1e6;
    const Tensor x = held(seeded_normal(13, "conf/p/x", {T, H, D}, 0, 1));
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) pos[static_cast<std::size_t>(i)] = 1000 * i;
    auto r = ref();
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        const char* name = layout == RopeLayout::neox ? "neox" : "normal";
        const Tensor yr = r->rope(x, pos, {theta, layout});
        const Tensor y = node().rope(x, pos, {theta, layout});
        double max_abs = 0;
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t i = 0; i < D / 2; ++i) {
                    const auto [i0, i1] = rope_pair(layout, (t * H + h) * D, i, D);
                    const double a = x.at(i0), b = x.at(i1);
                    const double angle = static_cast<double>(pos[static_cast<std::size_t>(t)]) *
                                         std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
                    double bound = GetParam().family == Family::opencl ? opencl_rope_bound(std::fabs(a) + std::fabs(b), angle, theta)
                                                                       : 7000 * 4 * kU32 * 8;
                    for (std::int64_t j : {i0, i1}) {
                        const double tol = bound + (narrow() ? 1.01 * us() * std::fabs(yr.at(j)) : 0.0) + underflow();
                        ASSERT_LE(std::fabs(y.at(j) - yr.at(j)), tol) << name << " t=" << t << " i=" << i;
                        max_abs = std::max(max_abs, std::fabs(y.at(j) - yr.at(j)));
                    }
                    // A rotation: each pair keeps its length.
                    const double tol = std::sqrt(2.0) * (bound + (narrow() ? 1.01 * us() * (std::fabs(a) + std::fabs(b)) : 0.0) + underflow());
                    ASSERT_LE(std::fabs(std::hypot(y.at(i0), y.at(i1)) - std::hypot(a, b)), tol) << name << " t=" << t << " i=" << i;
                }
        // f32 angles are not the oracle's: the error is there, and bounded.
        if (!oracle()) {
            EXPECT_GT(max_abs, 0.0) << name;
        }
        // Position 0 is the identity everywhere (cos 0 = 1, sin 0 = 0 exactly).
        const std::vector<std::int64_t> zero(static_cast<std::size_t>(T), 0);
        EXPECT_EQ(node().rope(x, zero, {theta, layout}).to_f64(), x.to_f64()) << name;
    }
}

// A frequency-scaled rope (llama3): the node rotates pair i by pos · inv_freq[i]
// of the table it is given (rounded to f32 on f32 nodes), not by theta^(−2i/d).
// Bound: the angle is one product of f32 values (≤ 2 roundings of the exact
// angle), so the plain-rope bounds, which include pow's error, hold.
TEST_P(Conformance, RopeWithScaledFrequenciesFollowsTheTable) {
    const std::int64_t T = 6, H = 2, D = 64;
    ModelConfig mc;
    mc.head_dim = D;
    mc.rope_theta = 500000.0;
    mc.rope_type = "llama3";
    mc.rope_scaling = {8.0, 1.0, 4.0, 8192.0};  // Llama 3.1's values
    const std::vector<double> table = rope_inverse_frequencies(mc);
    ASSERT_EQ(table.size(), static_cast<std::size_t>(D / 2));
    const Tensor x = held(seeded_normal(14, "conf/p/scaled", {T, H, D}, 0, 1));
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) pos[static_cast<std::size_t>(i)] = 1300 * i + 7;
    auto r = ref();
    for (RopeLayout layout : {RopeLayout::neox, RopeLayout::normal}) {
        RopeParams scaled{mc.rope_theta, layout};
        scaled.inv_freq = std::make_shared<const std::vector<double>>(table);
        const Tensor yr = r->rope(x, pos, scaled);
        const Tensor y = node().rope(x, pos, scaled);
        const Tensor plain = node().rope(x, pos, {mc.rope_theta, layout});
        double max_abs = 0, moved = 0;
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t i = 0; i < D / 2; ++i) {
                    const auto [i0, i1] = rope_pair(layout, (t * H + h) * D, i, D);
                    const double a = x.at(i0), b = x.at(i1);
                    const double angle = static_cast<double>(pos[static_cast<std::size_t>(t)]) * table[static_cast<std::size_t>(i)];
                    // The oracle is the textbook rotation by the table's angle.
                    if (oracle()) {
                        EXPECT_NEAR(yr.at(i0), a * std::cos(angle) - b * std::sin(angle), 1e-13);
                        EXPECT_NEAR(yr.at(i1), b * std::cos(angle) + a * std::sin(angle), 1e-13);
                    }
                    const double bound = GetParam().family == Family::opencl
                                             ? opencl_rope_bound(std::fabs(a) + std::fabs(b), angle, mc.rope_theta)
                                             : 7000 * 4 * kU32 * 8;
                    for (std::int64_t j : {i0, i1}) {
                        const double tol = bound + (narrow() ? 1.01 * us() * std::fabs(yr.at(j)) : 0.0) + underflow();
                        ASSERT_LE(std::fabs(y.at(j) - yr.at(j)), tol) << " t=" << t << " i=" << i;
                        max_abs = std::max(max_abs, std::fabs(y.at(j) - yr.at(j)));
                        moved = std::max(moved, std::fabs(y.at(j) - plain.at(j)));
                    }
                }
        // The table was used: the low-frequency pairs (divided by 8) turn far less than unscaled.
        EXPECT_GT(moved, 0.1);
    }
    // A table of the wrong length is refused.
    RopeParams bad{mc.rope_theta, RopeLayout::neox};
    bad.inv_freq = std::make_shared<const std::vector<double>>(table.begin(), table.begin() + 3);
    try {
        (void)node().rope(x, pos, bad);
        ADD_FAILURE() << "a 3-entry table for head dim 64 was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
        EXPECT_NE(std::string(e.what()).find("inverse frequencies"), std::string::npos) << e.what();
    }
}

// ---- element-wise ---------------------------------------------------------------------

TEST_P(Conformance, SwigluAndSigmoidByHand) {
    const Tensor g = input({0, 1, -2}, {3}), u = input({5, 2, 3}, {3});
    const Tensor s = node().swiglu(g, u);
    EXPECT_EQ(s.at(0), 0.0);
    const Tensor s_want = Tensor::from_f64(std::vector<double>{0, 2.0 / (1.0 + std::exp(-1.0)), 3.0 * -2.0 / (1.0 + std::exp(2.0))}, {3});
    const Tensor l = input({0, std::log(3.0)}, {2});
    const double l3 = held(l).at(1);  // ln 3 as the node holds it
    const Tensor sg = node().sigmoid(l);
    EXPECT_EQ(sg.at(0), 0.5);
    const Tensor sg_want = Tensor::from_f64(std::vector<double>{0.5, 1.0 / (1.0 + std::exp(-l3))}, {2});
    if (oracle()) {
        for (int i = 1; i < 3; ++i) EXPECT_NEAR(s.at(i), s_want.at(i), 1e-15);
        EXPECT_NEAR(sg.at(1), 0.75, 1e-15);
    } else {
        EXPECT_TRUE(within_ulp(s_want, s, swiglu_ulp()));
        EXPECT_TRUE(within_ulp(sg_want, sg, sigmoid_ulp()));
    }
}

TEST_P(Conformance, SwigluAndSigmoidWithinUlpOfTheOracle) {
    const Tensor g = held(seeded_normal(9, "conf/e/g", {4, 1000}, 0, 3));
    const Tensor u = held(seeded_normal(9, "conf/e/u", {4, 1000}, 0, 1));
    auto r = ref();
    EXPECT_TRUE(within_ulp(r->swiglu(g, u), node().swiglu(g, u), swiglu_ulp()));
    EXPECT_TRUE(within_ulp(r->sigmoid(g), node().sigmoid(g), sigmoid_ulp()));
}

// gpt-oss's clamped SwiGLU. f32 nodes take alpha and the limit rounded to
// f32; their error relative to the oracle is then, per element, a few
// roundings plus the exp argument's relative error amplified by |s|, s = g'·alpha
// (exp(x(1+δ)) = exp(x)·(1 + xδ)): |Δy| ≤ |y|·u·(C + 4|s|), C = 8 (cpu, gpu) or
// 26 (OpenCL: exp ≤ 3 ulp, / ≤ 2.5 ulp), plus the storage rounding.
namespace {
constexpr double kGptOssAlpha = 1.702, kGptOssLimit = 7.0;
double clamped_swiglu_f64(double g, double u) {
    const double gc = std::min(g, kGptOssLimit), uc = std::clamp(u, -kGptOssLimit, kGptOssLimit);
    return (uc + 1.0) * gc / (1.0 + std::exp(-gc * kGptOssAlpha));
}
}  // namespace

TEST_P(Conformance, ClampedSwigluByHandAndWithinBoundOfTheOracle) {
    // Clamps: g = 10 → 7, u = −9 → −7, u = 8 → 7; g below −limit is not clamped (only from above).
    const std::vector<double> gv{0, 1, 10, -3, -9, 2.5, 7, 0.25}, uv{5, -9, 0.5, 8, 1, -1, 7, -0.5};
    const Tensor g = input(gv, {8}), u = input(uv, {8});
    const Tensor y = node().clamped_swiglu(g, u, kGptOssAlpha, kGptOssLimit);
    const Tensor gh = held(g), uh = held(u);
    const double cf = GetParam().family == Family::opencl ? 26.0 : 8.0;
    const auto bound = [&](double want, double gin) {
        const double s = std::fabs(std::min(gin, kGptOssLimit) * kGptOssAlpha);
        return std::fabs(want) * (kU32 * (cf + 4 * s) + (narrow() ? 1.01 * us() : 0.0)) + underflow();
    };
    for (std::size_t i = 0; i < gv.size(); ++i) {
        const double want = clamped_swiglu_f64(gh.at(static_cast<std::int64_t>(i)), uh.at(static_cast<std::int64_t>(i)));
        const double tol = oracle() ? 1e-15 * std::max(1.0, std::fabs(want)) : bound(want, gh.at(static_cast<std::int64_t>(i)));
        EXPECT_NEAR(y.at(static_cast<std::int64_t>(i)), want, tol) << "g " << gv[i] << " u " << uv[i];
    }
    EXPECT_EQ(y.at(0), 0.0);  // g = 0: (u + 1) · 0 · σ(0)
    EXPECT_EQ(y.at(5), 0.0);  // u = −1: (−1 + 1) · …
    // Seeded, wide enough that every clamp fires often.
    const Tensor gs = held(seeded_normal(15, "conf/e/cg", {4, 1000}, 0, 5));
    const Tensor us_ = held(seeded_normal(15, "conf/e/cu", {4, 1000}, 0, 5));
    auto r = ref();
    const Tensor yr = r->clamped_swiglu(gs, us_, kGptOssAlpha, kGptOssLimit);
    const Tensor yn = node().clamped_swiglu(gs, us_, kGptOssAlpha, kGptOssLimit);
    std::int64_t clamped = 0;
    for (std::int64_t i = 0; i < gs.numel(); ++i) {
        clamped += gs.at(i) > kGptOssLimit || std::fabs(us_.at(i)) > kGptOssLimit;
        const double want = clamped_swiglu_f64(gs.at(i), us_.at(i));
        ASSERT_NEAR(yr.at(i), want, 1e-15 * std::max(1.0, std::fabs(want))) << i;  // the oracle is the formula
        ASSERT_NEAR(yn.at(i), yr.at(i), oracle() ? 0.0 : bound(yr.at(i), gs.at(i))) << i;
    }
    EXPECT_GT(clamped, 200);
    // NaN passes the clamps (no fmin/fmax); +inf gate clamps to the limit; −inf gate gives −inf·0 = NaN.
    const Tensor gx = input({NAN, 1, INFINITY, -INFINITY}, {4}), ux = input({1, NAN, -INFINITY, 1}, {4});
    const Tensor yx = node().clamped_swiglu(gx, ux, kGptOssAlpha, kGptOssLimit);
    EXPECT_TRUE(std::isnan(yx.at(0)));
    EXPECT_TRUE(std::isnan(yx.at(1)));
    EXPECT_NEAR(yx.at(2), clamped_swiglu_f64(7.0, -7.0), std::fabs(clamped_swiglu_f64(7.0, -7.0)) * 1e-2);
    EXPECT_TRUE(std::isnan(yx.at(3)));
    EXPECT_THROW((void)node().clamped_swiglu(g, u, kGptOssAlpha, 0.0), Error);
}

TEST_P(Conformance, ElementwiseNonFiniteValuesPropagate) {
    // sigmoid(±inf) = 1, 0; swiglu(−inf, ·) = −inf/inf = NaN; NaN stays NaN.
    const Tensor x = input({NAN, INFINITY, -INFINITY, 1}, {4});
    const Tensor one = input({1, 1, 1, 1}, {4});
    auto r = ref();
    const Tensor sg = node().sigmoid(x), sw = node().swiglu(x, one);
    EXPECT_TRUE(finite_parity(compare(r->sigmoid(x), sg)));
    EXPECT_TRUE(finite_parity(compare(r->swiglu(x, one), sw)));
    EXPECT_TRUE(std::isnan(sg.at(0)));
    EXPECT_EQ(sg.at(1), 1.0);
    EXPECT_EQ(sg.at(2), 0.0);
    EXPECT_TRUE(std::isnan(sw.at(0)));
    EXPECT_TRUE(std::isinf(sw.at(1)) && sw.at(1) > 0);
    EXPECT_TRUE(std::isnan(sw.at(2)));
    // rmsnorm: a NaN poisons its row; rope: a NaN stays in its pair.
    const Tensor rn = node().rmsnorm(input({1, NAN, 2, 1, 2, 3}, {2, 3}), input({1, 1, 1}, {3}), 1e-6);
    for (int c = 0; c < 3; ++c) EXPECT_TRUE(std::isnan(rn.at(c))) << c;
    for (int c = 3; c < 6; ++c) EXPECT_TRUE(std::isfinite(rn.at(c))) << c;
    const std::vector<std::int64_t> pos{5};
    const Tensor rp = node().rope(input({NAN, 1, 2, 3}, {1, 1, 4}), pos, {10000.0, RopeLayout::neox});
    EXPECT_TRUE(std::isnan(rp.at(0)) && std::isnan(rp.at(2)));
    EXPECT_TRUE(std::isfinite(rp.at(1)) && std::isfinite(rp.at(3)));
}

// ---- errors and determinism -------------------------------------------------------------

TEST_P(Conformance, ShapeErrorsAreBadInput) {
    Backend& b = node();
    const Tensor a = seeded_normal(1, "conf/bad/a", {2, 3}, 0, 1);
    const Tensor c = seeded_normal(1, "conf/bad/b", {4, 5}, 0, 1);
    const Tensor odd = seeded_normal(1, "conf/bad/r", {1, 1, 3}, 0, 1);
    const std::vector<std::int64_t> one{0}, two{0, 1};
    const Tensor w = Tensor::from_f64(std::vector<double>{1}, {1, 1}, DType::f32);
    std::vector<ExpertWeights> experts{{w, w, w}};
    RoutingPlan plan{Tensor(DType::i32, {1, 1}), Tensor::from_f64(std::vector<double>{1}, {1, 1})};
    plan.ids.as<std::int32_t>()[0] = 5;  // expert 5 of 1
    RouterParams too_many;
    too_many.top_k = 6;  // of 5 experts
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"matmul K", [&] { b.matmul(a, c); }},
        {"matmul K'", [&] { b.matmul(seeded_normal(1, "conf/bad/x", {1, 2}, 0, 1), seeded_normal(1, "conf/bad/w", {1, 3}, 0, 1)); }},
        {"swiglu", [&] { b.swiglu(a, c); }},
        {"rmsnorm", [&] { b.rmsnorm(a, c, 1e-6); }},
        {"rmsnorm weight", [&] { b.rmsnorm(a, Tensor(DType::f32, {2}), 1e-6); }},
        {"rope rank", [&] { b.rope(a, two, {}); }},
        {"rope odd dim", [&] { b.rope(odd, one, {}); }},
        {"rope positions", [&] { b.rope(seeded_normal(1, "conf/bad/p", {2, 1, 4}, 0, 1), one, {}); }},
        {"route top-k", [&] { b.route(seeded_normal(1, "conf/bad/l", {2, 5}, 0, 1), too_many); }},
        {"moe plan", [&] { b.moe_block(Tensor::from_f64(std::vector<double>{2}, {1, 1}, DType::f32), experts, plan); }},
    };
    for (const auto& [what, op] : ops) EXPECT_EQ(code_of(op), ErrorCode::bad_input) << what;
}

TEST_P(Conformance, RepeatedRunsGiveTheSameBitsUnlessNondeterministic) {
    const Tensor x = seeded_normal(5, "conf/d/x", {33, 1000}, 0, 1);
    const Tensor w = seeded_normal(5, "conf/d/w", {257, 1000}, 0, 1);
    const Tensor x2 = seeded_normal(5, "conf/d/x2", {33, 2048}, 0, 1);
    const Tensor w2 = seeded_normal(5, "conf/d/w2", {77, 2048}, 0, 1);
    const Tensor s = seeded_normal(5, "conf/d/s", {8, 5000}, 0, 3);
    const Tensor sw = seeded_normal(5, "conf/d/sw", {5000}, 1, 0.1);
    const std::string nondeterministic = option_of(GetParam().spec, "nondeterministic", "0");
    EXPECT_EQ(caps().deterministic, nondeterministic != "1");
    auto other = make(GetParam().spec);  // a second node: shares nothing that could hide a difference
    const auto same = [](const Tensor& p, const Tensor& q) {
        return p.nbytes() == q.nbytes() && std::memcmp(p.raw(), q.raw(), p.nbytes()) == 0;
    };
    if (!caps().deterministic) {
        // Split-K with atomics: the claim is the same error bound on every run.
        auto r = ref();
        const Tensor yr = r->matmul(x2, w2);
        for (int run = 0; run < 3; ++run) EXPECT_TRUE(matmul_bound(x2, w2, node().matmul(x2, w2), yr)) << run;
        EXPECT_TRUE(same(node().softmax(s), other->softmax(s)));
        return;
    }
    EXPECT_TRUE(same(node().matmul(x, w), node().matmul(x, w)));
    EXPECT_TRUE(same(node().matmul(x, w), other->matmul(x, w)));
    EXPECT_TRUE(same(node().matmul(x2, w2), other->matmul(x2, w2)));
    EXPECT_TRUE(same(node().softmax(s), other->softmax(s)));
    EXPECT_TRUE(same(node().rmsnorm(s, sw, 1e-6), other->rmsnorm(s, sw, 1e-6)));
}

TEST_P(Conformance, CapabilitiesNameTheArithmetic) {
    const Node& n = GetParam();
    EXPECT_EQ(caps().node.rfind(caps().backend, 0), 0u) << caps().node;
    EXPECT_FALSE(caps().device.empty());
    EXPECT_FALSE(caps().runtime.empty());
    EXPECT_GE(caps().threads, 1);
    EXPECT_EQ(caps().output, oracle() ? DType::f64 : DType::f32);
    EXPECT_EQ(dtype_name(caps().storage), option_of(n.spec, "storage", oracle() ? "f64" : "f32"));
    EXPECT_EQ(dtype_name(caps().accumulation), option_of(n.spec, "acc", oracle() ? "f64" : "f32"));
    // The canonical name creates the same node.
    EXPECT_EQ(make(caps().node)->capabilities().node, caps().node);
}

// ---- router and MoE ---------------------------------------------------------------------

TEST_P(Conformance, RouterByHand) {
    // logits [ln1, ln4, ln2, ln3] → probs [.1, .4, .2, .3]; top-2 = {1, 3},
    // renormalised [4/7, 3/7]; on the values the node holds.
    const Tensor logits = input({0, std::log(4.0), std::log(2.0), std::log(3.0)}, {1, 4});
    const Tensor lh = held(logits);
    double e[4], sum = 0;
    for (int i = 0; i < 4; ++i) sum += e[i] = std::exp(lh.at(i));
    const double tol_rel = few_roundings() + (narrow() ? 4 * us() : 0.0) + (f16_acc() ? gamma(4, ua()) : 0.0);
    const auto near = [&](double got, double want, double oracle_want) {
        if (oracle())
            EXPECT_NEAR(got, oracle_want, 1e-15);
        else
            EXPECT_NEAR(got, want, tol_rel * want);
    };
    RouterParams p;
    p.top_k = 2;
    const RouterOutput r = node().route(logits, p);
    EXPECT_EQ(r.ids.as<std::int32_t>()[0], 1);
    EXPECT_EQ(r.ids.as<std::int32_t>()[1], 3);
    near(r.weights.at(0), e[1] / (e[1] + e[3]), 4.0 / 7.0);
    near(r.weights.at(1), e[3] / (e[1] + e[3]), 3.0 / 7.0);
    p.renormalize = false;
    near(node().route(logits, p).weights.at(0), e[1] / sum, 0.4);

    // Ties go to the lower id.
    const RouterOutput tie = node().route(input({1, 5, 5, 5}, {1, 4}), p);
    EXPECT_EQ(tie.ids.as<std::int32_t>()[0], 1);
    EXPECT_EQ(tie.ids.as<std::int32_t>()[1], 2);

    // Sigmoid scoring: selection uses score + bias, the weights the unbiased
    // score (sigmoid(0) = 0.5 exactly on every node).
    const Tensor bias = Tensor::from_f64(std::vector<double>{0, 0.3, 0, 0.2}, {4});
    const TensorView bv = bias.view();
    RouterParams sp;
    sp.top_k = 2;
    sp.scoring = RouterScoring::sigmoid;
    sp.renormalize = false;
    sp.scaling = 2.0;
    sp.bias = &bv;
    const RouterOutput sr = node().route(input({0, 0, 0, 0}, {1, 4}), sp);
    EXPECT_EQ(sr.ids.as<std::int32_t>()[0], 1);
    EXPECT_EQ(sr.ids.as<std::int32_t>()[1], 3);
    EXPECT_DOUBLE_EQ(sr.weights.at(0), 1.0);  // 0.5 · 2
    // Groups {0,1} and {2,3}, keep one group: group {0,1} scores 0.5+0.8 > 0.5+0.7.
    sp.n_group = 2;
    sp.topk_group = 1;
    const RouterOutput g = node().route(input({0, 0, 0, 0}, {1, 4}), sp);
    EXPECT_EQ(g.ids.as<std::int32_t>()[0], 1);
    EXPECT_EQ(g.ids.as<std::int32_t>()[1], 0);
}

TEST_P(Conformance, RouterAgreesWithTheOracleOnSeparatedLogits) {
    // Each row is a permutation of -1.6, -1.55, ..., 1.55: neighbouring
    // softmax scores differ by 5% and sigmoid scores by ≥ σ'(1.6)·0.05 =
    // 0.0075, both far above any node's error and above bf16's spacing (1/128
    // for the logits, 1/256 for the sigmoids), so the top-k must agree, in order.
    const std::int64_t T = 32, E = 64;
    std::vector<double> v(static_cast<std::size_t>(T * E));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t e = 0; e < E; ++e)
            v[static_cast<std::size_t>(t * E + e)] = 0.05 * static_cast<double>((e * 37 + t * 11) % E) - 1.6;
    const Tensor logits = held(Tensor::from_f64(v, {T, E}, DType::f32));
    auto r = ref();
    for (RouterScoring scoring : {RouterScoring::softmax, RouterScoring::sigmoid}) {
        RouterParams p;
        p.top_k = 8;
        p.scoring = scoring;
        const RouterOutput want = r->route(logits, p);
        const RouterOutput got = node().route(logits, p);
        const IndexAgreement a = compare_indices(want.ids, got.ids);
        EXPECT_EQ(a.exact_match_rate, 1.0);
        EXPECT_EQ(std::memcmp(want.ids.raw(), got.ids.raw(), want.ids.nbytes()), 0);  // same order too
        // Scores: softmax's or sigmoid's bound; weights: one more division
        // and a sum of k in the accumulator.
        const double rel = scoring == RouterScoring::softmax ? softmax_rel(E) : 1e-5 + (narrow() ? 1.01 * us() : 0.0);
        EXPECT_TRUE(within(compare(want.scores, got.scores).max_rel, rel)) << compare(want.scores, got.scores).max_rel;
        const double wrel = rel + (narrow() ? 2 * us() : 0.0) + (f16_acc() ? gamma(p.top_k, ua()) : 0.0);
        EXPECT_TRUE(within(compare(want.weights, got.weights).max_rel, wrel)) << compare(want.weights, got.weights).max_rel;
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

// The MoE block as the sum of 4 shards of the experts, and the shards.
struct Sharded {
    Tensor combined;
    std::vector<Tensor> parts;
};
Sharded sharded(Backend& b, const SmallMoe& m) {
    Sharded out;
    const int shards = 4;
    const auto E = static_cast<std::int64_t>(m.experts.size());
    for (int s = 0; s < shards; ++s) {
        std::vector<bool> mine(static_cast<std::size_t>(E));
        for (std::int64_t e = 0; e < E; ++e) mine[static_cast<std::size_t>(e)] = e * shards / E == s;
        out.parts.push_back(b.moe_block(m.x, m.experts, m.plan, &mine));
        out.combined = s == 0 ? out.parts.back() : b.add(out.combined, out.parts.back());
    }
    return out;
}

// The MoE of the MoE tests and what the oracle makes of it, once per process.
struct MoeCase {
    SmallMoe m{12, 256, 96, 16, 8};
    Tensor want;
    CompareStats oracle_shards;
    MoeCase() {
        auto r = create_backend("cpu-ref");
        want = r->moe_block(m.x, m.experts, m.plan);
        oracle_shards = compare(want, sharded(*r, m).combined);
    }
};
const MoeCase& moe_case() {
    static const MoeCase c;
    return c;
}
}  // namespace

TEST_P(Conformance, MoeBlockByHand) {
    // H = 1, I = 1: expert e computes down_e · silu(gate_e·x) · (up_e·x).
    const Tensor x = input({2.0}, {1, 1});
    std::vector<Tensor> w{input({1}, {1, 1}), input({3}, {1, 1}), input({0.5}, {1, 1}),   // expert 0
                          input({-1}, {1, 1}), input({1}, {1, 1}), input({2}, {1, 1})};   // expert 1
    std::vector<ExpertWeights> experts{{w[0], w[1], w[2]}, {w[3], w[4], w[5]}};
    RoutingPlan plan{Tensor(DType::i32, {1, 2}), Tensor::from_f64(std::vector<double>{0.25, 0.75}, {1, 2})};
    plan.ids.as<std::int32_t>()[0] = 1;
    plan.ids.as<std::int32_t>()[1] = 0;
    const auto silu = [](double g) { return g / (1 + std::exp(-g)); };
    const double e0 = 0.5 * silu(2.0) * 6.0, e1 = 2.0 * silu(-2.0) * 2.0;
    const double want = 0.25 * e1 + 0.75 * e0;
    // swiglu's error, then the down projection, the combine and the result
    // each rounded once (to storage, or to half in a half accumulator).
    const double rel = swiglu_ulp() * 0x1p-23 + few_roundings() + (narrow() ? 4 * us() : 0.0) + (f16_acc() ? 3 * ua() : 0.0);
    EXPECT_NEAR(node().moe_block(x, experts, plan).at(0), want, oracle() ? 1e-15 : rel * std::fabs(want));
}

TEST_P(Conformance, MoeBlockMatchesTheOracleAndItsShards) {
    const MoeCase& mc = moe_case();
    const SmallMoe& m = mc.m;
    const Tensor mono = node().moe_block(m.x, m.experts, m.plan);
    const Sharded sh = sharded(node(), m);
    const CompareStats s = compare(mc.want, mono), c = compare(mono, sh.combined);
    if (oracle()) {
        // Exact up to the order of f64 accumulation.
        EXPECT_TRUE(within(c.max_rel, 1e-10)) << c.max_rel;
        EXPECT_TRUE(within(c.max_abs, 1e-12)) << c.max_abs;
        return;
    }
    if (!narrow()) {
        // Partial sums in f32: sharding is equivalent, not exact; larger than
        // on the oracle, still tiny. A node that declares itself
        // nondeterministic (split-K: partial sums added in the order its
        // blocks finish) reorders every matmul of the block and of each
        // shard on its own: gpu-emu:nondeterministic=1 over 100 block
        // orders gave 1.0e-4 … 3.2e-4 (median 1.4e-4) where it exceeded
        // the deterministic nodes' 1e-4.
        EXPECT_TRUE(within(c.max_rel, caps().deterministic ? 1e-4 : 1e-3)) << c.max_rel;
        EXPECT_GT(c.max_abs, mc.oracle_shards.max_abs);
    } else {
        // Each shard's sum is rounded to storage, and so is every add() of
        // them (running sums ≤ Σ|p|) and the whole block's sum: on top of the
        // f32 tolerance, u_s·(|y| + 4·Σ_s|p_s|) and half a subnormal step per rounding.
        const std::vector<double> y64 = mono.to_f64();
        const double guard =
            kRelGuardFraction * std::sqrt(std::inner_product(y64.begin(), y64.end(), y64.begin(), 0.0) / static_cast<double>(y64.size()));
        for (std::int64_t i = 0; i < mono.numel(); ++i) {
            double parts = 0;
            for (const Tensor& p : sh.parts) parts += std::fabs(p.at(i));
            const double y = std::fabs(mono.at(i));
            const double bound = 1.01 * us() * (y + 4 * parts) + 5 * underflow() + 1e-4 * std::max(y, guard);
            ASSERT_LE(std::fabs(sh.combined.at(i) - mono.at(i)), bound) << "element " << i;
        }
    }
    if (!narrow() && !f16_acc()) {
        EXPECT_TRUE(at_least(s.cosine, 0.999999)) << s.cosine;
        EXPECT_TRUE(within(s.max_rel, 1e-3)) << s.max_rel;
        return;
    }
    // Narrow storage or a half accumulator: three matmuls and a swiglu, each
    // with a relative error of about ε (3u_s: inputs and result rounded;
    // √K·u_a for a half sum of K = 256 terms of random sign), adding in
    // quadrature to a relative RMS error of about 2ε: cosine ≥ 1 − (2ε)²/2.
    const double eps = narrow() ? 3 * us() : std::sqrt(256.0) * ua();
    EXPECT_TRUE(at_least(s.cosine, 1 - 2 * eps * eps)) << s.cosine;
}

INSTANTIATE_TEST_SUITE_P(Nodes, Conformance, ::testing::ValuesIn(all_nodes()), node_label);

// ---- causal GQA attention over a KV cache -------------------------------------------------
//
// Backend::causal_attention on every node. q [T, nh, D] at positions
// p0 … p0+T−1, K/V caches [S, D] per kv head (S = p0 + T).
//  * the oracle is bit for bit a plain f64 loop written here (every sum
//    sequential from +0); every node is bit for bit its own default
//    composition (backend.hpp) — the fused cpu kernel promises exactly that;
//  * against the oracle on the inputs the node holds, per output element
//    o = Σ_s p_s v_s: a score's error is at most γ_D(u_a)·Σ_j|q_j k_j| (any
//    order, Higham §3.1), plus its rounding to storage and the rounding of
//    the scaled score (2u_s·|x| in all, u_s = u for f32), times the scale;
//    with every scaled score off by at most ε, each p̂_s/p_s lies within
//    e^{±2ε}; the softmax's own exp, sum and division add softmax_rel(n) as
//    in the softmax tests; P·V is a dot product of length n: γ_n(u_a)·Σ p̂|v|.
//    So with ρ = e^{2ε} − 1 + softmax_rel(n) and A = Σ_s p_s|v_s|:
//      |ô − o| ≤ (ρ + γ_n(u_a)·(1 + ρ))·A + out_u·|o| + abs
//    out_u = 1.01u_s for narrow storage (u for f32), abs the subnormal steps
//    of a half accumulator (D·2⁻²⁵ in the score, n·2⁻²⁵ in P·V) and of narrow
//    storage.
class AttentionConformance : public NodeTest {
protected:
    struct Case {
        std::int64_t T, nh, nkv, D, p0;
    };
    // Inputs as the node holds them (rounded to storage), in its output dtype.
    struct Inputs {
        Tensor q;
        std::vector<Tensor> k, v;
        std::vector<TensorView> kv() const { return {k.begin(), k.end()}; }
        std::vector<TensorView> vv() const { return {v.begin(), v.end()}; }
    };
    Inputs inputs(const Case& c, const std::string& tag) const {
        const std::int64_t S = c.p0 + c.T;
        Inputs in;
        in.q = held(seeded_normal(11, "conf/attn/q/" + tag, {c.T, c.nh, c.D}, 0, 1));
        for (std::int64_t g = 0; g < c.nkv; ++g) {
            in.k.push_back(held(seeded_normal(11, fmt::format("conf/attn/k/{}/{}", tag, g), {S, c.D}, 0, 1)));
            in.v.push_back(held(seeded_normal(11, fmt::format("conf/attn/v/{}/{}", tag, g), {S, c.D}, 0, 1)));
        }
        return in;
    }
    Tensor run(Backend& b, const Inputs& in, double scale) const { return b.causal_attention(in.q, in.kv(), in.vv(), scale); }
    static bool same_bits(const Tensor& a, const Tensor& b) {
        return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    }
    // Row t of out [T, nh·D], bits.
    static bool same_row(const Tensor& a, const Tensor& b, std::int64_t t) {
        const std::size_t row = static_cast<std::size_t>(a.dim(1)) * dtype_size(a.dtype());
        return std::memcmp(static_cast<const std::byte*>(a.raw()) + static_cast<std::size_t>(t) * row,
                           static_cast<const std::byte*>(b.raw()) + static_cast<std::size_t>(t) * row, row) == 0;
    }
};

// The textbook definition, f64, sequential sums: what cpu-ref must equal bit for bit.
Tensor textbook_attention(const Tensor& q, const std::vector<Tensor>& k, const std::vector<Tensor>& v, double scale,
                          std::vector<double>* abs_pv = nullptr, std::vector<double>* eps_in = nullptr) {
    const std::int64_t T = q.dim(0), nh = q.dim(1), D = q.dim(2), S = k[0].dim(0);
    const std::int64_t rep = nh / static_cast<std::int64_t>(k.size()), p0 = S - T;
    std::vector<double> out(static_cast<std::size_t>(T * nh * D));
    if (abs_pv != nullptr) abs_pv->assign(out.size(), 0.0);
    if (eps_in != nullptr) eps_in->assign(static_cast<std::size_t>(T * nh * 2), 0.0);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < nh; ++h) {
            const Tensor& kg = k[static_cast<std::size_t>(h / rep)];
            const Tensor& vg = v[static_cast<std::size_t>(h / rep)];
            const std::int64_t n = p0 + t + 1;
            std::vector<double> x(static_cast<std::size_t>(n));
            double m = -INFINITY, max_abs_dot = 0, max_x = 0;
            for (std::int64_t s = 0; s < n; ++s) {
                double dot = 0, abs_dot = 0;
                for (std::int64_t j = 0; j < D; ++j) {
                    dot += q.at((t * nh + h) * D + j) * kg.at(s * D + j);
                    abs_dot += std::fabs(q.at((t * nh + h) * D + j) * kg.at(s * D + j));
                }
                x[static_cast<std::size_t>(s)] = dot * scale;
                m = std::fmax(m, x[static_cast<std::size_t>(s)]);
                max_abs_dot = std::max(max_abs_dot, abs_dot);
                max_x = std::max(max_x, std::fabs(dot * scale));
            }
            double sum = 0;
            for (std::int64_t s = 0; s < n; ++s) sum += (x[static_cast<std::size_t>(s)] = std::exp(x[static_cast<std::size_t>(s)] - m));
            for (std::int64_t s = 0; s < n; ++s) x[static_cast<std::size_t>(s)] /= sum;
            for (std::int64_t i = 0; i < D; ++i) {
                double o = 0, a = 0;
                for (std::int64_t s = 0; s < n; ++s) {
                    o += x[static_cast<std::size_t>(s)] * vg.at(s * D + i);
                    a += x[static_cast<std::size_t>(s)] * std::fabs(vg.at(s * D + i));
                }
                out[static_cast<std::size_t>((t * nh + h) * D + i)] = o;
                if (abs_pv != nullptr) (*abs_pv)[static_cast<std::size_t>((t * nh + h) * D + i)] = a;
            }
            if (eps_in != nullptr) {
                (*eps_in)[static_cast<std::size_t>((t * nh + h) * 2)] = max_abs_dot * scale;
                (*eps_in)[static_cast<std::size_t>((t * nh + h) * 2 + 1)] = max_x;
            }
        }
    return Tensor::from_f64(out, {T, nh * D});
}

// Shapes: one query and a batch; GQA rep 1, 2, 3, 4, 6, 7, 8; D below 8, not a
// multiple of 8, crossing the 64-term summation block, 128; S not a multiple
// of 8 and past 64 (P·V crosses a block); p0 = 0 (prefill) and p0 > 0 (a
// decode step or a chunk continuing over a cache).
const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>>& attention_shapes() {
    static const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>> s = {
        {1, 1, 1, 4, 0},  {5, 4, 2, 8, 0},   {3, 6, 2, 72, 37}, {1, 8, 2, 128, 200},
        {17, 4, 4, 64, 9}, {40, 3, 1, 130, 30}, {9, 12, 3, 16, 0}, {2, 16, 4, 24, 75},
        // Rows of 2048 and 2049 keys: the opencl and gpu kernels hold 2048
        // probabilities at once, a longer row recomputes its scores per pass
        // (D = 16: opencl's key-panel kernel on a CPU device; D = 8: the other).
        {2, 4, 2, 8, 2047}, {2, 4, 2, 16, 2047},
        // Decode steps with 6–8 query heads per kv head (the cpu kernel's
        // heads-in-lanes path): rep 8 at Qwen3-30B-A3B's 32/4 heads of 128
        // over 575 cached keys, rep 7 with D = 130, rep 6 with T = 3 and D = 20.
        {1, 32, 4, 128, 575}, {1, 14, 2, 130, 70}, {3, 12, 2, 20, 13}};
    return s;
}

// Bit-level properties: only nodes deterministic by their own promise.
class AttentionBits : public AttentionConformance {};

TEST_P(AttentionConformance, ByHandUniformWeightsAverageTheVisibleValues) {
    // q = 0: every score is 0, exp(0) = 1, the weights are 1/n over the n
    // visible keys, so out = the mean of V's first n rows. T = 2, p0 = 1:
    // query 0 sees rows 0–1, query 1 rows 0–2. Two query heads share the one kv head.
    const Tensor q = input(std::vector<double>(2 * 2 * 2, 0.0), {2, 2, 2});
    const std::vector<Tensor> k = {input({1, 2, -3, 4, 0.5, 6}, {3, 2})};
    const std::vector<Tensor> v = {input({1, 2, 3, 4, 5, 6}, {3, 2})};
    const std::vector<TensorView> kv(k.begin(), k.end()), vv(v.begin(), v.end());
    const Tensor y = node().causal_attention(q, kv, vv, 0.5);
    ASSERT_EQ(y.shape(), Shape({2, 4}));
    const Tensor want = Tensor::from_f64(std::vector<double>{2, 3, 2, 3, 3, 4, 3, 4}, {2, 4});
    if (oracle())
        EXPECT_TRUE(elementwise_close(want, y, 4 * 0x1p-53, 0));
    else
        EXPECT_TRUE(elementwise_close(want, y, few_roundings() + (narrow() ? 3.1 * us() : 0.0) + (f16_acc() ? 4 * ua() : 0.0),
                                      underflow()));
}

// Attention sinks (gpt-oss): q = 0, so every score is 0 and each visible key
// weighs 1 / (n + e^sink): out = (Σ visible V rows) / (n + e^sink).
TEST_P(AttentionConformance, SinksByHandTakeTheirShareOfTheSoftmax) {
    const Tensor q = input(std::vector<double>(2 * 2 * 2, 0.0), {2, 2, 2});
    const std::vector<Tensor> k = {input({1, 2, -3, 4, 0.5, 6}, {3, 2})};
    const std::vector<Tensor> v = {input({1, 2, 3, 4, 5, 6}, {3, 2})};
    const std::vector<TensorView> kv(k.begin(), k.end()), vv(v.begin(), v.end());
    const Tensor sinks = input({0.0, std::log(2.0)}, {2});  // head 0: e^0 = 1, head 1: e^(ln 2) held = ~2
    const double e1 = std::exp(held(sinks).at(1));
    const Tensor y = node().causal_attention_sinks(q, kv, vv, 0.5, sinks);
    ASSERT_EQ(y.shape(), Shape({2, 4}));
    // Query 0 sees rows 0–1 (sums 4, 6), query 1 rows 0–2 (sums 9, 12); head h divides by n + e^sink_h.
    const Tensor want = Tensor::from_f64(std::vector<double>{4.0 / 3, 6.0 / 3, 4 / (2 + e1), 6 / (2 + e1),
                                                             9.0 / 4, 12.0 / 4, 9 / (3 + e1), 12 / (3 + e1)},
                                         {2, 4});
    if (oracle())
        EXPECT_TRUE(elementwise_close(want, y, 8 * 0x1p-53, 0));
    else
        EXPECT_TRUE(elementwise_close(want, y, few_roundings() + (narrow() ? 4.1 * us() : 0.0) + (f16_acc() ? 4 * ua() : 0.0),
                                      underflow()));
    // A sink of −inf takes nothing: the plain attention's bits (an exp(−inf) = +0 more in each row sum).
    if (caps().deterministic) {
        const Inputs in = inputs({5, 4, 2, 8, 3}, "sink-none");
        const Tensor plain = run(node(), in, 0.3);
        const Tensor with = node().causal_attention_sinks(in.q, in.kv(), in.vv(), 0.3, input({-INFINITY, -INFINITY, -INFINITY, -INFINITY}, {4}));
        EXPECT_TRUE(same_bits(plain, with));
    }
    // A dominant sink takes (almost) everything: the output shrinks by e^−40 relative to the values.
    const Tensor big = node().causal_attention_sinks(q, kv, vv, 0.5, input({40.0, 40.0}, {2}));
    for (std::int64_t i = 0; i < big.numel(); ++i) EXPECT_LT(std::fabs(big.at(i)), 1e-15) << i;
    // Against the oracle on seeded inputs with seeded sinks, within the plain attention's f32 scale.
    auto r = ref();
    const Inputs in = inputs({9, 12, 3, 16, 5}, "sinks");
    const Tensor sk = held(seeded_normal(11, "conf/attn/sinks", {12}, 0, 2));
    const Tensor yr = r->causal_attention_sinks(in.q, in.kv(), in.vv(), 0.25, sk);
    const Tensor yn = node().causal_attention_sinks(in.q, in.kv(), in.vv(), 0.25, sk);
    double m = 0, d = 0;
    for (std::int64_t i = 0; i < yr.numel(); ++i) {
        m = std::max(m, std::fabs(yr.at(i)));
        d = std::max(d, std::fabs(yr.at(i) - yn.at(i)));
    }
    EXPECT_LE(d / m, oracle() ? 0.0 : narrow() || f16_acc() ? 3e-2 : 2e-6) << "normwise";
    EXPECT_THROW((void)node().causal_attention_sinks(in.q, in.kv(), in.vv(), 0.25, input({1, 2}, {2})), Error);
}

TEST_P(AttentionConformance, WithinTheSoftmaxAndDotProductBoundOfTheTextbook) {
    auto r = ref();
    for (const auto& [T, nh, nkv, D, p0] : attention_shapes()) {
        if (f16_acc() && !reduction_bound_exists(std::max(D, p0 + T))) continue;
        const Inputs in = inputs({T, nh, nkv, D, p0}, fmt::format("{}x{}x{}x{}x{}", T, nh, nkv, D, p0));
        const double scale = 1 / std::sqrt(static_cast<double>(D));
        std::vector<double> abs_pv, eps_in;
        const Tensor want = textbook_attention(in.q, in.k, in.v, scale, &abs_pv, &eps_in);
        const Tensor y = run(node(), in, scale);
        ASSERT_EQ(y.dtype(), caps().output);
        ASSERT_EQ(y.shape(), Shape({T, nh * D}));
        if (oracle()) {
            EXPECT_TRUE(same_bits(want, y)) << "cpu-ref is the textbook loop, bit for bit";
            continue;
        }
        const double u_round = narrow() ? us() : kU32;
        const double out_u = narrow() ? 1.01 * us() : kU32;
        double worst = 0;
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t h = 0; h < nh; ++h) {
                const std::int64_t n = p0 + t + 1;
                const double abs_dot = eps_in[static_cast<std::size_t>((t * nh + h) * 2)];
                const double max_x = eps_in[static_cast<std::size_t>((t * nh + h) * 2 + 1)];
                const double eps = gamma(D, ua()) * abs_dot + (f16_acc() ? D * 0x1p-25 * scale : 0.0) + 2 * u_round * max_x * 1.01 +
                                   underflow();
                const double rho = std::expm1(2 * eps) + softmax_rel(n);
                for (std::int64_t i = 0; i < D; ++i) {
                    const std::int64_t e = t * nh * D + h * D + i;
                    const double a = abs_pv[static_cast<std::size_t>(e)], w = want.at(e), g = y.at(e);
                    const double bound = (rho + gamma(n, ua()) * (1 + rho)) * a + out_u * std::fabs(w) +
                                         (f16_acc() ? n * 0x1p-25 : 0.0) + underflow();
                    ASSERT_TRUE(std::fabs(g - w) <= bound)
                        << T << "x" << nh << "x" << nkv << "x" << D << " p0=" << p0 << " t=" << t << " h=" << h << " i=" << i
                        << ": |" << g << " − " << w << "| > " << bound;
                    worst = std::max(worst, std::fabs(g - w) / bound);
                }
            }
        std::printf("[ measured ] %s attention %lldx%lldx%lldx%lld p0=%lld: max |Δ| / bound = %.3f\n",
                    GetParam().spec.c_str(), static_cast<long long>(T), static_cast<long long>(nh),
                    static_cast<long long>(nkv), static_cast<long long>(D), static_cast<long long>(p0), worst);
    }
}

TEST_P(AttentionBits, FusedIsItsOwnCompositionBitForBit) {
    for (const auto& [T, nh, nkv, D, p0] : attention_shapes()) {
        const Inputs in = inputs({T, nh, nkv, D, p0}, fmt::format("c{}x{}x{}x{}x{}", T, nh, nkv, D, p0));
        // 1/√D as a model scales (a power of two for D = 4, 16, 64, where the
        // rounding of the score before the scale cannot show) and 0.3.
        for (const double scale : {1 / std::sqrt(static_cast<double>(D)), 0.3}) {
            const Tensor fused = run(node(), in, scale);
            // The base class's composition of this node's own matmul/scale/softmax.
            const Tensor composed = node().compose_attention(in.q, in.kv(), in.vv(), scale, nullptr);
            EXPECT_TRUE(same_bits(fused, composed))
                << T << "x" << nh << "x" << nkv << "x" << D << " p0=" << p0 << " scale " << scale;
            // With sinks (the sink column S of the composition's row lands in a lane or in the tail as S
            // varies over the shapes): whatever the node runs, it is its composition's bits.
            const Tensor sk = held(seeded_normal(11, fmt::format("conf/attn/sk/{}x{}", T, nh), {nh}, 0, 1));
            const Tensor fs = node().causal_attention_sinks(in.q, in.kv(), in.vv(), scale, sk);
            const TensorView sk_view = sk.view();
            const Tensor cs = node().compose_attention(in.q, in.kv(), in.vv(), scale, &sk_view);
            EXPECT_TRUE(same_bits(fs, cs)) << "sinks " << T << "x" << nh << "x" << nkv << "x" << D << " p0=" << p0
                                           << " scale " << scale;
        }
    }
}

// The sink column lands inside the last lane chunk only when S mod 8 = 7: rows
// whose chunk ends before it (lane added afterwards) and rows sharing its chunk.
TEST_P(AttentionBits, SinksInTheLastLaneChunkAreTheCompositionBitForBit) {
    for (const auto& [T, nh, nkv, D, p0] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
             {3, 4, 2, 16, 4}, {9, 4, 2, 8, 14}, {1, 2, 1, 8, 22}, {17, 8, 2, 64, 14}}) {
        ASSERT_EQ((p0 + T) % 8, 7);
        const Inputs in = inputs({T, nh, nkv, D, p0}, fmt::format("l{}x{}x{}x{}x{}", T, nh, nkv, D, p0));
        const Tensor sk = held(seeded_normal(12, fmt::format("conf/attn/sl/{}", T), {nh}, 0, 2));
        const Tensor fs = node().causal_attention_sinks(in.q, in.kv(), in.vv(), 0.3, sk);
        const TensorView sk_view = sk.view();
        const Tensor cs = node().compose_attention(in.q, in.kv(), in.vv(), 0.3, &sk_view);
        EXPECT_TRUE(same_bits(fs, cs)) << T << "x" << nh << "x" << nkv << "x" << D << " p0=" << p0;
    }
}

TEST_P(AttentionBits, ALaterKeyNeverReachesAnEarlierQuery) {
    const std::int64_t T = 6, nh = 4, nkv = 2, D = 16, p0 = 3, S = p0 + T;
    const Inputs in = inputs({T, nh, nkv, D, p0}, "mask");
    const Tensor base = run(node(), in, 0.25);
    for (const std::int64_t s : {p0 + 1, S - 1}) {
        // Key and value at cache position s of every kv head replaced by large
        // other values: queries t with p0 + t < s must not change a bit, the
        // first query that sees s must change.
        Inputs changed = in;
        for (std::int64_t g = 0; g < nkv; ++g)
            for (Tensor* c : {&changed.k[static_cast<std::size_t>(g)], &changed.v[static_cast<std::size_t>(g)]}) {
                *c = Tensor::convert(c->view(), c->dtype());  // own copy
                for (std::int64_t j = 0; j < D; ++j) c->set(s * D + j, 8.0 + static_cast<double>(j));
            }
        const Tensor y = run(node(), changed, 0.25);
        for (std::int64_t t = 0; t < T; ++t) {
            if (p0 + t < s) {
                EXPECT_TRUE(same_row(base, y, t)) << "query " << t << " at " << p0 + t << " saw key " << s;
            } else if (p0 + t == s) {
                EXPECT_FALSE(same_row(base, y, t)) << "query " << t << " did not see key " << s;
            }
        }
    }
}

TEST_P(AttentionBits, QueryHeadHReadsKvHeadHOverRep) {
    const std::int64_t T = 3, nh = 6, nkv = 2, rep = 3, D = 8, p0 = 4;
    const Inputs in = inputs({T, nh, nkv, D, p0}, "gqa");
    const Tensor all = run(node(), in, 0.3);
    for (std::int64_t g = 0; g < nkv; ++g) {
        // Heads g·rep … g·rep+rep−1 alone against kv head g alone: the same bits.
        Inputs one;
        one.q = Tensor(in.q.dtype(), {T, rep, D});
        const std::size_t head = static_cast<std::size_t>(D) * dtype_size(in.q.dtype());
        for (std::int64_t t = 0; t < T; ++t)
            std::memcpy(static_cast<std::byte*>(one.q.raw()) + static_cast<std::size_t>(t * rep) * head,
                        static_cast<const std::byte*>(in.q.raw()) + static_cast<std::size_t>(t * nh + g * rep) * head, rep * head);
        one.k = {in.k[static_cast<std::size_t>(g)]};
        one.v = {in.v[static_cast<std::size_t>(g)]};
        const Tensor part = run(node(), one, 0.3);
        for (std::int64_t t = 0; t < T; ++t)
            EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(part.raw()) + static_cast<std::size_t>(t * rep) * head,
                                  static_cast<const std::byte*>(all.raw()) + static_cast<std::size_t>(t * nh + g * rep) * head,
                                  rep * head),
                      0)
                << "kv head " << g << " query " << t;
    }
}

TEST_P(AttentionConformance, NonFiniteValuesNeverPass) {
    const std::int64_t T = 3, nh = 2, nkv = 1, D = 8, p0 = 2;
    Inputs in = inputs({T, nh, nkv, D, p0}, "nan");
    // A NaN in the key at position p0 + 1: queries 1 and 2 see it (all their
    // outputs NaN), query 0 does not.
    in.k[0] = Tensor::convert(in.k[0].view(), in.k[0].dtype());
    in.k[0].set((p0 + 1) * D + 3, std::numeric_limits<double>::quiet_NaN());
    const Tensor y = run(node(), in, 0.5);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < nh * D; ++i) {
            if (t == 0)
                EXPECT_TRUE(std::isfinite(y.at(t * nh * D + i))) << t << " " << i;
            else
                EXPECT_TRUE(std::isnan(y.at(t * nh * D + i))) << t << " " << i;
        }
    // An infinite value seen by a query: its output is not finite.
    Inputs inf = inputs({T, nh, nkv, D, p0}, "inf");
    inf.v[0] = Tensor::convert(inf.v[0].view(), inf.v[0].dtype());
    inf.v[0].set(0 * D + 5, std::numeric_limits<double>::infinity());
    const Tensor yi = run(node(), inf, 0.5);
    for (std::int64_t t = 0; t < T; ++t) EXPECT_FALSE(std::isfinite(yi.at(t * nh * D + 5))) << t;
}

TEST_P(AttentionConformance, ShapeErrorsAreBadInput) {
    Backend& b = node();
    const Tensor q = seeded_normal(1, "conf/attn/bad/q", {2, 4, 8}, 0, 1);
    const Tensor k = seeded_normal(1, "conf/attn/bad/k", {5, 8}, 0, 1);
    const Tensor k_short = seeded_normal(1, "conf/attn/bad/ks", {1, 8}, 0, 1);
    const Tensor k_dim = seeded_normal(1, "conf/attn/bad/kd", {5, 6}, 0, 1);
    const std::vector<TensorView> one{k}, three{k, k, k}, shorter{k_short}, dim{k_dim}, mixed{k, k_short};
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"q rank", [&] { b.causal_attention(k, one, one, 1.0); }},
        {"no kv heads", [&] { b.causal_attention(q, {}, {}, 1.0); }},
        {"k/v count", [&] { b.causal_attention(q, one, three, 1.0); }},
        {"heads not divisible", [&] { b.causal_attention(q, three, three, 1.0); }},
        {"fewer rows than tokens", [&] { b.causal_attention(q, shorter, shorter, 1.0); }},
        {"head dim", [&] { b.causal_attention(q, dim, dim, 1.0); }},
        {"rows differ between heads", [&] { b.causal_attention(q, mixed, mixed, 1.0); }},
    };
    for (const auto& [what, op] : ops) EXPECT_EQ(code_of(op), ErrorCode::bad_input) << what;
}

INSTANTIATE_TEST_SUITE_P(Nodes, AttentionConformance, ::testing::ValuesIn(all_nodes()), node_label);
// The bit-for-bit properties (fused == own composition, mask, GQA) on every
// node that promises the same bits run to run; the split-K-atomics variants
// do not, and are held to the bound (AttentionConformance) instead.
INSTANTIATE_TEST_SUITE_P(Nodes, AttentionBits, ::testing::ValuesIn(nodes_where([](const Node& n) {
                             return option_of(n.spec, "nondeterministic", "0") != "1";
                         })),
                         node_label);

// ---- Gated DeltaNet: causal conv + SiLU, the gated delta rule -----------------------------
//
// The two ops of the hybrid families (linear_attention.hpp), on every node:
// cpu-ref, cpu, OpenCL, the CUDA/HIP source on the emulation and cuda/hip
// where a device exists. Their sums (the conv's taps, the l2norms' Σx², the
// delta rule's m and out) run in the node's acc= dtype; the state is f32 in
// every variant. Bounds (u = 2⁻²⁴ for f32 sums, u = 2⁻¹¹ for f16 sums;
// narrow storage adds the rounding of the result, 1.01·u_s relative, plus
// half a subnormal step):
//  * conv: y = silu(s), s = Σ_{j<K} w_j·x_j. Any summation order, with or
//    without fma: |ŝ − s| ≤ γ_K·Σ|w_j x_j| (Higham §3.1). silu′ lies in
//    [−0.0999, 1.0999], so that error reaches y times ≤ 1.1; silu itself,
//    ŝ/(1 + e^−ŝ) with exp ≤ 1 ulp (2u relative), 1 + e (the exp's error
//    scaled by e/(1+e) ≤ 1, plus u) and the division (u), adds ≤ 4u·|y| to
//    first order: |ŷ − y| ≤ 1.11·γ_K·Σ|w x| + 4.01u·|y|.
//  * delta rule, normwise (max|Δ| / max|ref| over out, and over the state):
//    one token maps the state by S ← (I − β k kᵀ)·(e^g S) + β k vᵀ with
//    ‖k‖ = 1 (l2-normalised), β = σ(b) ∈ (0, 1), e^g ∈ (0, 1]: the linear
//    part has spectral norm ≤ 1, so rounding errors made at earlier tokens
//    are carried, never amplified, and after T tokens the state's error is
//    at most the sum of the per-token errors, each a few dot products of
//    length dk (plus the l2norm, exp and softplus, a few u): ≲ T·(dk + 8)·u
//    relative in the worst case, where every rounding goes the same way
//    (64·40·u ≈ 1.5e-4 and 20·308·u ≈ 3.7e-4 for the cases below).
//    Roundings that do not conspire grow like the square root of their
//    number instead, and that is what is measured (printed; ≤ 7.5e-7 on cpu
//    and gpu-emu, T = 1..64, dk = 8..300, GQA rep 1–3). Held to 1e-5: over
//    13× the largest measured error, and 15–37× below the worst case.
//    f16 sums (acc=f16): the worst case T·(dk + 8)·2⁻¹¹ exceeds 1 at these
//    sizes, so the probabilistic form is the yardstick: 4·√dk·2⁻¹¹ (7.8e-3
//    at dk = 16, 3.4e-2 at dk = 300) against the measured ≤ 1.4e-3 / 4.6e-3
//    (cpu:acc=f16, gpu-emu:acc=f16) — over 5× margin; and at least 0.1·2⁻¹¹,
//    so a node whose sums silently stay f32 (≤ 7.5e-7) fails.
class LinearAttentionConformance : public NodeTest {
protected:
    static constexpr double kDeltaRuleRel = 1e-5;

    // max|Δ| / max|want|; NaN in either fails.
    static double normwise(const Tensor& want, const Tensor& got) {
        EXPECT_EQ(want.numel(), got.numel());
        double d = 0, m = 0;
        for (std::int64_t i = 0; i < want.numel(); ++i) {
            if (std::isnan(want.at(i)) || std::isnan(got.at(i))) return INFINITY;
            d = std::max(d, std::fabs(got.at(i) - want.at(i)));
            m = std::max(m, std::fabs(want.at(i)));
        }
        return d / m;
    }
};

// Inputs of one gated delta rule call, already as the node holds them.
struct DeltaCase {
    Tensor q, k, v, a, b, a_log, dt_bias, state;
    bool has_state = true;
    GatedDeltaInputs inputs() const {
        GatedDeltaInputs in{q, k, v, a, b, a_log, dt_bias};
        in.state = has_state ? &state_view : nullptr;
        return in;
    }
    TensorView state_view;
};

TEST_P(LinearAttentionConformance, CausalConv1dSiluByHand) {
    // x [3, 2], w [2, 2] (K = 2), history [1, 2]: small integers and
    // quarters, exact in every format, so the sums are exact and only silu rounds.
    const Tensor x = input({1, 2, 3, 4, 5, 6}, {3, 2});
    const Tensor w = input({0.5, 1, -1, 0.25}, {2, 2});
    const Tensor h = input({7, 8}, {1, 2});
    const auto silu = [](double s) { return s / (1 + std::exp(-s)); };
    for (const bool with_history : {false, true}) {
        std::vector<double> want;
        for (int t = 0; t < 3; ++t)
            for (int c = 0; c < 2; ++c) {
                const double prev = t > 0 ? x.at((t - 1) * 2 + c) : with_history ? h.at(c) : 0.0;
                want.push_back(silu(w.at(c * 2) * prev + w.at(c * 2 + 1) * x.at(t * 2 + c)));
            }
        const TensorView hv = h;
        const Tensor y = node().causal_conv1d_silu(x, w, with_history ? &hv : nullptr);
        ASSERT_EQ(y.shape(), Shape({3, 2}));
        const Tensor yw = Tensor::from_f64(want, {3, 2});
        if (oracle())
            EXPECT_TRUE(elementwise_close(yw, y, 0, 1e-15)) << with_history;
        else
            EXPECT_TRUE(elementwise_close(yw, y, few_roundings() + (narrow() ? 1.01 * us() : 0.0), underflow()))
                << with_history;
    }
}

TEST_P(LinearAttentionConformance, CausalConv1dSiluWithinDotProductBoundOfTheOracle) {
    struct Case {
        std::int64_t T, C, K;
        bool history, rank3;
    };
    // 300 channels: more than one 256-thread block; T = 1 (decode) and T < K−1
    // (rows from the history and from x in one sum); [C, 1, K] as checkpoints store it.
    const std::vector<Case> cases = {{37, 300, 4, true, false}, {37, 300, 4, false, true}, {1, 70, 4, true, false},
                                     {2, 9, 6, true, true},     {5, 3, 1, false, false}};
    auto r = ref();
    double worst = 0;
    for (const Case& cs : cases) {
        const Tensor x = held(seeded_normal(31, "conf/la/x", {cs.T, cs.C}, 0, 1));
        const Tensor w = held(seeded_normal(31, "conf/la/w", cs.rank3 ? Shape{cs.C, 1, cs.K} : Shape{cs.C, cs.K}, 0, 0.5));
        const Tensor h = held(seeded_normal(31, "conf/la/h", {cs.K - 1, cs.C}, 0, 1));
        const TensorView hv = h;
        const TensorView* hp = cs.history ? &hv : nullptr;
        const Tensor y = node().causal_conv1d_silu(x, w, hp), yr = r->causal_conv1d_silu(x, w, hp);
        ASSERT_EQ(y.shape(), Shape({cs.T, cs.C}));
        const double gk = gamma(cs.K, f16_acc() ? ua() : kU32);
        // An f16 running sum below 2⁻¹⁴ is subnormal: each add may lose half its step, 2⁻²⁵.
        const double acc_underflow = f16_acc() ? static_cast<double>(cs.K) * 0x1p-25 * 1.11 : 0.0;
        for (std::int64_t t = 0; t < cs.T; ++t)
            for (std::int64_t c = 0; c < cs.C; ++c) {
                double abs_sum = 0;
                for (std::int64_t j = 0; j < cs.K; ++j) {
                    const std::int64_t tp = t + j - (cs.K - 1);
                    const double xv = tp >= 0 ? x.at(tp * cs.C + c) : cs.history ? h.at((cs.K - 1 + tp) * cs.C + c) : 0.0;
                    abs_sum += std::fabs(w.at(c * cs.K + j) * xv);
                }
                const double want = yr.at(t * cs.C + c), got = y.at(t * cs.C + c);
                const double bound = 1.11 * gk * abs_sum + (4.01 * kU32 + (narrow() ? 1.01 * us() : 0.0)) * std::fabs(want) +
                                     underflow() + acc_underflow;
                ASSERT_LE(std::fabs(got - want), oracle() ? 0.0 : bound)
                    << "T " << cs.T << " C " << cs.C << " K " << cs.K << " at (" << t << ", " << c << ")";
                if (bound > 0) worst = std::max(worst, std::fabs(got - want) / bound);
            }
    }
    std::printf("[ measured ] %s causal_conv1d_silu: max |Δ| / bound = %.3f\n", GetParam().spec.c_str(), worst);
}

TEST_P(LinearAttentionConformance, GatedDeltaRuleByHand) {
    // One token from a zero state: S = k̂ δᵀ with δ = β·v, out_j = (k̂·q̂)/√dk · δ_j.
    // q = k = s·(3, 4): k̂·q̂ = n²/(n² + 1e-6), n² = |q|²; at s = 1e-4 the
    // l2norm's eps is 4× n² (k̂·q̂ = 0.2). b = ln 3: β = 3/4 (as the node holds ln 3).
    const Tensor v = input({2}, {1, 1, 1});
    const Tensor a = input({0.5}, {1, 1}), b = input({std::log(3.0)}, {1, 1});
    const Tensor a_log = input({0.25}, {1}), dt = input({0}, {1});
    const double beta = 1 / (1 + std::exp(-held(b).at(0))), delta = beta * 2;
    const double rel = oracle() ? 1e-15 : few_roundings();
    GatedDeltaResult r;
    for (const double scale : {1.0, 1e-4}) {
        const Tensor q = input({3 * scale, 4 * scale}, {1, 1, 2});
        const GatedDeltaInputs in{q, q, v, a, b, a_log, dt};
        r = node().gated_delta_rule(in);
        ASSERT_EQ(r.out.shape(), Shape({1, 1, 1}));
        ASSERT_EQ(r.state.shape(), Shape({1, 2, 1}));
        const double q0 = held(q).at(0), q1 = held(q).at(1);
        // An f16 sum of squares is rounded to half after each add; at 1e-4
        // the squares (9e-8, 1.6e-7) are subnormal halves, so n² is far
        // from the true one and the by-hand value takes the half chain.
        const double n2 = f16_acc() ? round_to(DType::f16, round_to(DType::f16, q0 * q0) + q1 * q1) : q0 * q0 + q1 * q1;
        const double inv = 1 / std::sqrt(n2 + 1e-6);
        // out = Σ_i k̂_i δ · q̂_i (two positive terms; f16: γ₂(2⁻¹¹) more).
        const double dot = (q0 * inv) * (q0 * inv) + (q1 * inv) * (q1 * inv);
        const Tensor out_want = Tensor::from_f64(std::vector<double>{dot / std::sqrt(2.0) * delta}, {1, 1, 1});
        const Tensor state_want = Tensor::from_f64(std::vector<double>{q0 * inv * delta, q1 * inv * delta}, {1, 2, 1});
        EXPECT_TRUE(elementwise_close(out_want, r.out, rel + (narrow() ? 1.01 * us() : 0.0) + (f16_acc() ? gamma(2, ua()) : 0.0),
                                      underflow()))
            << scale;
        EXPECT_TRUE(elementwise_close(state_want, r.state, rel, 0)) << scale;  // the state is never rounded to storage
    }
    // No tokens: no output, the state handed back as it came.
    const Tensor none = input({}, {0, 1, 2});
    const Tensor none1 = input({}, {0, 1, 1});
    const Tensor none_ab = input({}, {0, 1});
    GatedDeltaInputs empty{none, none, none1, none_ab, none_ab, a_log, dt};
    const TensorView sv = r.state;
    empty.state = &sv;
    const GatedDeltaResult e = node().gated_delta_rule(empty);
    EXPECT_EQ(e.out.shape(), Shape({0, 1, 1}));
    // Every backend keeps the recurrent state f32, as transformers keeps it
    // float32, in every storage variant: handed back unchanged.
    EXPECT_EQ(e.state.to_f64(), r.state.to_f64());
}

TEST_P(LinearAttentionConformance, GatedDeltaRuleWithinRecurrenceBoundOfTheOracle) {
    struct Case {
        std::int64_t T, nk, nv, dk, dv;
        bool state;
    };
    // The fixture's heads (2 key, 4 value heads of 16), GQA with rep 3, more
    // value columns than a block has threads (dv 300), a key dim beyond one
    // pass of the l2norm (dk 300), a decode step; T up to 64, with and
    // without an initial state.
    const std::vector<Case> cases = {{16, 2, 4, 16, 16, true},  {64, 2, 6, 32, 24, true}, {33, 1, 2, 8, 300, false},
                                     {20, 1, 2, 300, 8, true},  {1, 2, 4, 16, 16, true},  {48, 4, 8, 16, 16, false}};
    auto r = ref();
    for (const Case& cs : cases) {
        const std::string tag = fmt::format("T{} nk{} nv{} dk{} dv{}", cs.T, cs.nk, cs.nv, cs.dk, cs.dv);
        DeltaCase d;
        d.q = held(seeded_normal(43, "conf/gd/q", {cs.T, cs.nk, cs.dk}, 0, 1));
        d.k = held(seeded_normal(43, "conf/gd/k", {cs.T, cs.nk, cs.dk}, 0, 1));
        d.v = held(seeded_normal(43, "conf/gd/v", {cs.T, cs.nv, cs.dv}, 0, 1));
        d.a = held(seeded_normal(43, "conf/gd/a", {cs.T, cs.nv}, 0, 2));
        d.b = held(seeded_normal(43, "conf/gd/b", {cs.T, cs.nv}, 0, 1.5));
        // A_log from −3 (decay close to 1: long memory, errors carried furthest) to 1.
        d.a_log = held(seeded_uniform(43, "conf/gd/alog", {cs.nv}, -3, 1));
        d.dt_bias = held(seeded_normal(43, "conf/gd/dt", {cs.nv}, 0, 0.5));
        if (cs.T > 3) d.a.set(3 * cs.nv, 25.0);  // softplus above its threshold: x itself
        d.state = held(seeded_normal(43, "conf/gd/s", {cs.nv, cs.dk, cs.dv}, 0, 0.3));
        d.state_view = d.state;
        d.has_state = cs.state;
        const GatedDeltaResult got = node().gated_delta_rule(d.inputs());
        const GatedDeltaResult want = r->gated_delta_rule(d.inputs());
        ASSERT_EQ(got.out.shape(), Shape({cs.T, cs.nv, cs.dv})) << tag;
        ASSERT_EQ(got.state.shape(), Shape({cs.nv, cs.dk, cs.dv})) << tag;
        const double e_out = normwise(want.out, got.out), e_state = normwise(want.state, got.state);
        std::printf("[ measured ] %s gated_delta_rule %s: normwise rel. out %.3e, state %.3e\n", GetParam().spec.c_str(),
                    tag.c_str(), e_out, e_state);
        if (oracle()) {
            EXPECT_EQ(e_out, 0.0) << tag;
            continue;
        }
        if (f16_acc()) {
            const double tol = 4 * std::sqrt(static_cast<double>(cs.dk)) * ua();
            EXPECT_LE(e_out, tol + (narrow() ? 1.01 * us() : 0.0)) << tag;
            EXPECT_LE(e_state, tol) << tag;
            EXPECT_GE(e_out, 0.1 * ua()) << tag << ": the sums of an acc=f16 node must be f16";
            continue;
        }
        EXPECT_LE(e_out, kDeltaRuleRel + (narrow() ? 1.01 * us() : 0.0)) << tag;
        EXPECT_LE(e_state, kDeltaRuleRel) << tag;
    }
}

TEST_P(LinearAttentionConformance, ShapeErrorsAreBadInput) {
    Backend& n = node();
    const auto t = [&](Shape s) { return input(std::vector<double>(static_cast<std::size_t>(shape_numel(s)), 0.5), s); };
    const Tensor x = t({5, 6}), w = t({6, 4}), h = t({3, 6}), h2 = t({2, 6}), h5 = t({3, 5});
    const TensorView h_rows = h2, h_cols = h5, hv = h;
    // q/k [T, nk, dk] = [3, 2, 4]; v [3, 4, 5]; a, b [3, 4]; A_log, dt_bias [4]; state [4, 4, 5].
    const Tensor q = t({3, 2, 4}), v = t({3, 4, 5}), ab = t({3, 4}), per_head = t({4}), st = t({4, 4, 5});
    const Tensor bad_state = t({4, 5, 4}), v3 = t({3, 3, 5}), v_t = t({2, 4, 5}), ab_bad = t({3, 3}), head_bad = t({3});
    const Tensor k_bad = t({3, 2, 5}), q2 = t({3, 8});
    const TensorView bad_sv = bad_state;
    const auto delta = [&](auto edit) {
        return [&, edit] {
            GatedDeltaInputs in{q, q, v, ab, ab, per_head, per_head};
            edit(in);
            n.gated_delta_rule(in);
        };
    };
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"conv x rank", [&] { n.causal_conv1d_silu(t({1, 5, 6}), w, nullptr); }},
        {"conv weight channels", [&] { n.causal_conv1d_silu(x, t({5, 4}), nullptr); }},
        {"conv weight [C, 2, K]", [&] { n.causal_conv1d_silu(x, t({6, 2, 4}), nullptr); }},
        {"conv history rows", [&] { n.causal_conv1d_silu(x, w, &h_rows); }},
        {"conv history channels", [&] { n.causal_conv1d_silu(x, w, &h_cols); }},
        {"delta q rank", delta([&](GatedDeltaInputs& in) { in.q = q2; in.k = q2; })},
        {"delta k shape", delta([&](GatedDeltaInputs& in) { in.k = k_bad; })},
        {"delta v tokens", delta([&](GatedDeltaInputs& in) { in.v = v_t; })},
        {"delta nv not a multiple of nk", delta([&](GatedDeltaInputs& in) { in.v = v3; })},
        {"delta a", delta([&](GatedDeltaInputs& in) { in.a = ab_bad; })},
        {"delta b", delta([&](GatedDeltaInputs& in) { in.b = ab_bad; })},
        {"delta A_log", delta([&](GatedDeltaInputs& in) { in.a_log = head_bad; })},
        {"delta dt_bias", delta([&](GatedDeltaInputs& in) { in.dt_bias = head_bad; })},
        {"delta state", delta([&](GatedDeltaInputs& in) { in.state = &bad_sv; })},
    };
    for (const auto& [what, op] : ops) EXPECT_EQ(code_of(op), ErrorCode::bad_input) << what;
    // The well-formed calls run.
    const TensorView sv = st;
    GatedDeltaInputs ok{q, q, v, ab, ab, per_head, per_head};
    ok.state = &sv;
    EXPECT_EQ(n.gated_delta_rule(ok).out.shape(), Shape({3, 4, 5}));
    EXPECT_EQ(n.causal_conv1d_silu(x, w, &hv).shape(), Shape({5, 6}));
}

TEST_P(LinearAttentionConformance, NonFiniteValuesPropagateAsTheDefinitionSays) {
    auto r = ref();
    // conv: a NaN input reaches the K outputs of its channel that read it, nothing else.
    const std::int64_t T = 9, C = 5, K = 4;
    Tensor x = held(seeded_normal(47, "conf/nan/x", {T, C}, 0, 1));
    x.set(2 * C + 1, NAN);
    const Tensor w = held(seeded_normal(47, "conf/nan/w", {C, K}, 0, 0.5));
    const Tensor y = node().causal_conv1d_silu(x, w, nullptr);
    EXPECT_TRUE(finite_parity(compare(r->causal_conv1d_silu(x, w, nullptr), y)));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t c = 0; c < C; ++c)
            EXPECT_EQ(std::isnan(y.at(t * C + c)), c == 1 && t >= 2 && t < 2 + K) << t << ", " << c;
    // delta rule (nk 2, nv 4: value heads 2, 3 read key head 1): a NaN in v at
    // (token 3, head 2, column 1) poisons column 1 of head 2's state from
    // token 3 on; a NaN in q at (token 5, key head 1) only that token's
    // output of heads 2 and 3 (q never enters the state).
    const std::int64_t TT = 8, nk = 2, nv = 4, dk = 4, dv = 3;
    DeltaCase d;
    d.q = held(seeded_normal(47, "conf/nan/q", {TT, nk, dk}, 0, 1));
    d.k = held(seeded_normal(47, "conf/nan/k", {TT, nk, dk}, 0, 1));
    d.v = held(seeded_normal(47, "conf/nan/v", {TT, nv, dv}, 0, 1));
    d.a = held(seeded_normal(47, "conf/nan/a", {TT, nv}, 0, 1));
    d.b = held(seeded_normal(47, "conf/nan/b", {TT, nv}, 0, 1));
    d.a_log = held(seeded_normal(47, "conf/nan/al", {nv}, 0, 0.5));
    d.dt_bias = held(seeded_normal(47, "conf/nan/dt", {nv}, 0, 0.5));
    d.has_state = false;
    d.v.set((3 * nv + 2) * dv + 1, NAN);
    d.q.set((5 * nk + 1) * dk + 2, NAN);
    const GatedDeltaResult g = node().gated_delta_rule(d.inputs()), want = r->gated_delta_rule(d.inputs());
    EXPECT_TRUE(finite_parity(compare(want.out, g.out)));
    EXPECT_TRUE(finite_parity(compare(want.state, g.state)));
    for (std::int64_t t = 0; t < TT; ++t)
        for (std::int64_t hh = 0; hh < nv; ++hh)
            for (std::int64_t j = 0; j < dv; ++j) {
                const bool poisoned = (hh == 2 && j == 1 && t >= 3) || (t == 5 && hh >= 2);
                EXPECT_EQ(std::isnan(g.out.at((t * nv + hh) * dv + j)), poisoned) << t << ", " << hh << ", " << j;
            }
    for (std::int64_t hh = 0; hh < nv; ++hh)
        for (std::int64_t i = 0; i < dk; ++i)
            for (std::int64_t j = 0; j < dv; ++j)
                EXPECT_EQ(std::isnan(g.state.at((hh * dk + i) * dv + j)), hh == 2 && j == 1) << hh << ", " << i << ", " << j;
}

INSTANTIATE_TEST_SUITE_P(Nodes, LinearAttentionConformance, ::testing::ValuesIn(nodes_where([](const Node&) { return true; })),
                         node_label);

// ---- narrow storage ---------------------------------------------------------------------

class StorageConformance : public NodeTest {};

TEST_P(StorageConformance, EveryOpWritesValuesOfTheFormat) {
    const DType st = caps().storage;
    const Tensor x = seeded_normal(17, "conf/s/x", {4, 256}, 0, 1);
    const Tensor w = seeded_normal(17, "conf/s/w", {32, 256}, 0, 0.0625);
    const Tensor s = seeded_normal(17, "conf/s/s", {3, 300}, 0, 2);
    const Tensor r = seeded_normal(17, "conf/s/r", {3, 2, 64}, 0, 1);
    const std::vector<std::int64_t> pos{0, 17, 4000};
    const SmallMoe m(4, 64, 32, 8, 2);
    const std::vector<std::pair<const char*, Tensor>> outputs = {
        {"matmul", node().matmul(x, w)},
        {"softmax", node().softmax(s)},
        {"sigmoid", node().sigmoid(s)},
        {"swiglu", node().swiglu(s, s)},
        {"rmsnorm", node().rmsnorm(s, Tensor::convert(s.view().row(0), DType::f32), 1e-6)},
        {"rope", node().rope(r, pos, {1e6, RopeLayout::neox})},
        {"moe_block", node().moe_block(m.x, m.experts, m.plan)},
        {"add", node().add(s, s)},
    };
    for (const auto& [op, out] : outputs)
        for (std::int64_t i = 0; i < out.numel(); ++i)
            ASSERT_EQ(out.at(i), round_to(st, out.at(i))) << op << " " << dtype_name(st) << " element " << i;
}

TEST_P(StorageConformance, ErrorIsTheFormatsVisiblyAboveF32) {
    const Tensor x = seeded_normal(17, "conf/s/x", {4, 256}, 0, 1);
    const Tensor w = seeded_normal(17, "conf/s/w", {32, 256}, 0, 0.0625);
    auto r = ref();
    const Tensor yr = r->matmul(x, w);
    const CompareStats narrow_err = compare(yr, node().matmul(x, w));
    const CompareStats f32_err = compare(yr, make(GetParam().sibling)->matmul(x, w));
    EXPECT_GT(narrow_err.max_abs, 100 * f32_err.max_abs) << narrow_err.max_abs << " vs " << f32_err.max_abs;
    // The same format on the cpu backend: equivalent, the same error scale.
    const Tensor s = seeded_normal(17, "conf/s/s", {3, 300}, 0, 2);
    const CompareStats c = compare(create_backend(std::string("cpu:storage=") + dtype_name(caps().storage))->softmax(s),
                                   node().softmax(s));
    EXPECT_TRUE(within(c.max_rel, 4 * us())) << c.max_rel;
}

INSTANTIATE_TEST_SUITE_P(Nodes, StorageConformance, ::testing::ValuesIn(nodes_where([](const Node& n) {
                             return option_of(n.spec, "storage", "f32") != "f32";
                         })),
                         node_label);

// ---- half accumulation --------------------------------------------------------------------

class F16AccConformance : public NodeTest {};

// What an accumulator that rounds its running sum to half after every add
// computes, in ascending k: the products of two floats are exact in double.
std::vector<double> f16_chain(const Tensor& x, const Tensor& w) {
    const std::int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
    std::vector<double> y(static_cast<std::size_t>(T * N));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (std::int64_t k = 0; k < K; ++k) acc = round_to_f16(acc + x.at(t * K + k) * w.at(n * K + k));
            y[static_cast<std::size_t>(t * N + n)] = acc;
        }
    return y;
}

TEST_P(F16AccConformance, MatmulIsTheHalfAccumulatorBitForBit) {
    auto cpu16 = create_backend("cpu:acc=f16");
    for (const auto& [T, N, K] : std::vector<Shape3>{
             {2, 3, 64}, {1, 1, 1}, {5, 7, 13}, {3, 65, 33}, {9, 70, 300}, {70, 130, 100}, {64, 70, 1000}, {4, 33, 2048}}) {
        const Tensor x = seeded_normal(23, "conf/h/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(23, "conf/h/w", {N, K}, 0, 1);
        const Tensor y = node().matmul(x, w);
        EXPECT_EQ(y.to_f64(), f16_chain(x, w)) << T << "x" << N << "x" << K;
        EXPECT_EQ(y.to_f64(), cpu16->matmul(x, w).to_f64()) << "cpu:acc=f16, " << T << "x" << N << "x" << K;
    }
}

TEST_P(F16AccConformance, ErrorIsOrdersOfMagnitudeAboveF32) {
    const Tensor x = seeded_normal(29, "o/x", {8, 2048}, 0, 1);
    const Tensor w = seeded_normal(29, "o/w", {64, 2048}, 0, 1 / std::sqrt(2048.0));
    auto r = ref();
    auto f32 = make(GetParam().sibling);
    const Tensor yr = r->matmul(x, w);
    const CompareStats e32 = compare(yr, f32->matmul(x, w));
    const CompareStats e16 = compare(yr, node().matmul(x, w));
    EXPECT_GT(e16.max_abs, 1000 * e32.max_abs) << e16.max_abs << " vs " << e32.max_abs;
    EXPECT_LT(e16.cosine, e32.cosine);
    // rmsnorm over 4096: the cpu sums one row in one running half sum; the
    // GPU's 256-thread tree keeps each partial sum short, so its f16 error is
    // smaller (still two orders above f32).
    const Tensor s = seeded_normal(29, "o/s", {4, 4096}, 0, 1);
    const Tensor sw = seeded_normal(29, "o/sw", {4096}, 1, 0.1);
    const double factor = GetParam().family == Family::cpu ? 1000 : 100;
    const Tensor rr = r->rmsnorm(s, sw, 1e-6);
    EXPECT_GT(compare(rr, node().rmsnorm(s, sw, 1e-6)).max_abs, factor * compare(rr, f32->rmsnorm(s, sw, 1e-6)).max_abs);
}

INSTANTIATE_TEST_SUITE_P(Nodes, F16AccConformance, ::testing::ValuesIn(nodes_where([](const Node& n) {
                             return option_of(n.spec, "acc", "f32") == "f16";
                         })),
                         node_label);

}  // namespace
