// What only the cpu backends have: spec parsing and the registry, cpu-ref's
// blocked matmul against the textbook loop, the cpu kernels' summation order
// (AVX2 vs portable, independent of the thread count, the same bits for a
// token alone and in a batch), in-kernel rounding and the fast f16 rounding.
// The backend contract itself — error bounds against cpu-ref, hand-computed
// values, storage and f16 accumulation, shape errors, NaN/Inf — is
// tests/backend/test_conformance.cpp, run on cpu-ref and every cpu variant
// like on every other node.
//
// Tolerances (u = unit roundoff of the accumulation format): matmul
// |ŷ - y| ≤ γ_K · Σ_k |x_k w_k|, γ_K = K·u / (1 - K·u), for any summation
// order (Higham, Accuracy and Stability of Numerical Algorithms, §3.1;
// matmul_bound.hpp). u = 2^-24 for f32.
#include "kernels/cpu/f16_round.hpp"
#include "kernels/cpu/matmul.hpp"
#include "tests/backend/matmul_bound.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/rng.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

using namespace kvasir;

namespace {

std::unique_ptr<Backend> ref() { return create_backend("cpu-ref"); }

using test::gamma;
using test::kU32;
using test::matmul_within_bound;

}  // namespace

// ---- spec parsing ---------------------------------------------------------------

TEST(BackendSpec, ParsesNameDeviceAndOptions) {
    const BackendSpec s = BackendSpec::parse("opencl:1:storage=f16,acc=f16");
    EXPECT_EQ(s.name, "opencl");
    EXPECT_TRUE(s.device_given);
    EXPECT_EQ(s.device, 1);
    EXPECT_EQ(s.options.at("storage"), "f16");
    EXPECT_EQ(s.options.at("acc"), "f16");
    EXPECT_EQ(s.canonical(), "opencl:1:acc=f16,storage=f16");
    EXPECT_EQ(BackendSpec::parse("cpu:acc=f16").canonical(), "cpu:acc=f16");
}

TEST(BackendSpec, RejectsMalformed) {
    for (const char* bad : {"", ":", "cpu:", "cpu:acc", "cpu:acc=", "cpu:=f16", "cpu:acc=f16,acc=f32", "c pu",
                            "cpu:acc=f16:1", "cpu:99999"}) {
        try {
            BackendSpec::parse(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << bad;
        }
    }
}

TEST(Registry, UnknownBackendAndVariantAreBadInput) {
    try {
        create_backend("tpu");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("known: cpu-ref, cpu"), std::string::npos) << e.what();
    }
    EXPECT_THROW(create_backend("cpu:acc=f64"), Error);
    EXPECT_THROW(create_backend("cpu:storage=i32"), Error);
    EXPECT_THROW(create_backend("cpu:threads=0"), Error);
    EXPECT_THROW(create_backend("cpu:speed=fast"), Error);
    EXPECT_THROW(create_backend("cpu-ref:acc=f16"), Error);
    EXPECT_THROW(create_backend("cpu:1"), Error);
}

TEST(Registry, ListsEveryBackendAndDefaultsIncludeF16Variant) {
    const auto all = list_backends();
    ASSERT_GE(all.size(), 5u);
    EXPECT_EQ(all[0].name, "cpu-ref");
    EXPECT_TRUE(all[0].available);
    EXPECT_TRUE(all[1].available);
    for (const auto& s : all)
        if (!s.available) {
            EXPECT_FALSE(s.reason.empty()) << s.name;
        }
    const auto nodes = default_nodes();
    EXPECT_EQ(nodes.front(), "cpu-ref");
    EXPECT_EQ(nodes.back(), "cpu:acc=f16");
}

TEST(Registry, CapabilitiesDescribeVariants) {
    const auto c = create_backend("cpu:storage=bf16,acc=f16")->capabilities();
    EXPECT_EQ(c.node, "cpu:acc=f16,storage=bf16");
    EXPECT_EQ(c.storage, DType::bf16);
    EXPECT_EQ(c.accumulation, DType::f16);
    EXPECT_EQ(c.output, DType::f32);
    EXPECT_EQ(ref()->capabilities().accumulation, DType::f64);
    EXPECT_EQ(ref()->capabilities().output, DType::f64);
}

// ---- cpu-ref's blocked matmul is the textbook loop, bit for bit ------------------

namespace {

// The loop matmul.hpp specifies for the oracle, written out independently.
std::vector<double> textbook_f64(const Tensor& x, const Tensor& w) {
    const std::int64_t T = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
    const std::vector<double> xs = x.to_f64(), ws = w.to_f64();
    std::vector<double> y(static_cast<std::size_t>(T * N));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t n = 0; n < N; ++n) {
            double s = 0.0;
            for (std::int64_t k = 0; k < K; ++k)
                s += xs[static_cast<std::size_t>(t * K + k)] * ws[static_cast<std::size_t>(n * K + k)];
            y[static_cast<std::size_t>(t * N + n)] = s;
        }
    return y;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

TEST(CpuRefMatmul, BlockedKernelsAreTheTextbookLoopBitForBit) {
    // Shapes that cut every block edge: T around the 4- and 8-row tiles, N around the
    // 8-column panel and 32-column job, K around the 8-wide transpose and
    // the 256 K block; weights in every format the oracle accepts.
    const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> shapes = {
        {1, 1, 1}, {1, 8, 8}, {3, 7, 9}, {4, 8, 256}, {5, 33, 257}, {7, 31, 513}, {9, 40, 100}, {2, 65, 1000},
        {8, 16, 300}, {17, 9, 64}};  // and around the AVX-512 tile's 8 rows
    for (const auto& [T, N, K] : shapes) {
        const Tensor x = seeded_normal(11, "f64/x", {T, K}, 0, 1);
        const Tensor x64 = Tensor::convert(x.view(), DType::f64);
        for (DType wd : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
            const Tensor w = Tensor::convert(seeded_normal(12, "f64/w", {N, K}, 0, 1).view(), wd);
            const std::vector<double> want = textbook_f64(x64, w);
            for (int threads : {1, 2, 3}) {
                std::vector<double> got(want.size(), -1.0);
                kernels::matmul_f64_generic(x64.as<double>(), w.raw(), wd, got.data(), T, N, K, threads);
                EXPECT_TRUE(same_bits(got, want)) << "generic T=" << T << " N=" << N << " K=" << K << " w " << dtype_name(wd);
                // The blocked version this CPU runs (cpu_kernels_isa_* rerun this with the dispatch capped).
                std::fill(got.begin(), got.end(), -1.0);
                kernels::matmul_f64(x64.as<double>(), w.raw(), wd, got.data(), T, N, K, threads);
                EXPECT_TRUE(same_bits(got, want)) << kernels::cpu_isa_name(kernels::cpu_isa()) << " T=" << T
                                                  << " N=" << N << " K=" << K << " w " << dtype_name(wd) << " threads " << threads;
            }
        }
    }
}

TEST(CpuRefMatmul, NonFiniteValuesPropagateLikeTheLoop) {
    // inf·0 = NaN, inf + finite = inf, NaN anywhere poisons its outputs only:
    // the same positions and the same values as the loop (where NaN and inf
    // land on every node: Conformance.MatmulNonFiniteValuesPropagate).
    Tensor x = Tensor::convert(seeded_normal(13, "nf/x", {5, 20}, 0, 1).view(), DType::f64);
    Tensor w = seeded_normal(13, "nf/w", {9, 20}, 0, 1);
    x.as<double>()[1 * 20 + 3] = INFINITY;
    w.as<float>()[4 * 20 + 7] = NAN;
    w.as<float>()[6 * 20 + 3] = 0.0f;
    const std::vector<double> want = textbook_f64(x, w);
    const Tensor got = ref()->matmul(x, w);
    const std::vector<double> g = got.to_f64();
    for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(std::isnan(g[i]), std::isnan(want[i])) << i;
        if (!std::isnan(want[i])) {
            EXPECT_EQ(g[i], want[i]) << i;
        }
    }
}

TEST(CpuRefMatmul, ZeroKGivesZeros) {
    std::vector<double> y(6, -1.0);
    const double x = 0;
    const float w = 0;
    kernels::matmul_f64_generic(&x, &w, DType::f32, y.data(), 2, 3, 0, 1);
    EXPECT_EQ(y, std::vector<double>(6, 0.0));
    std::fill(y.begin(), y.end(), -1.0);
    kernels::matmul_f64(&x, &w, DType::f32, y.data(), 2, 3, 0, 1);
    EXPECT_EQ(y, std::vector<double>(6, 0.0));
}

// ---- cpu (f32): AVX2 vs portable kernels, thread counts --------------------------

TEST(Cpu, GenericAndAvx2KernelsAgreeWithinBound) {
    if (!kernels::cpu_has_fma_kernels()) GTEST_SKIP() << "no fused kernels (AVX2/FMA, NEON) on this CPU";
    const std::int64_t T = 5, N = 11, K = 517;
    const Tensor x = seeded_normal(3, "k/x", {T, K}, 0, 1);
    const Tensor w = seeded_normal(3, "k/w", {N, K}, 0, 1);
    std::vector<float> a(static_cast<std::size_t>(T * N)), b(a.size());
    kernels::matmul_f32_fma(x.as<float>(), w.as<float>(), a.data(), T, N, K, 2);
    kernels::matmul_f32_generic(x.as<float>(), w.as<float>(), b.data(), T, N, K, 2);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2 * gamma(K, kU32) * K) << i;
}

TEST(Cpu, ResultsDoNotDependOnThreadCount) {
    const Tensor x = seeded_normal(5, "d/x", {13, 300}, 0, 1);
    const Tensor w = seeded_normal(5, "d/w", {77, 300}, 0, 1);
    const Tensor a = create_backend("cpu:threads=1")->matmul(x, w);
    const Tensor b = create_backend("cpu:threads=2")->matmul(x, w);
    const Tensor c = create_backend("cpu:threads=3")->matmul(x, w);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    EXPECT_EQ(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
}

// ---- the packed AVX2 GEMM / GEMV (kernels/cpu/matmul_fma.cpp) ------------------

namespace {

// The kernel's contract, written out: per K block of kMatmulKBlock one FMA
// chain in ascending k from +0; the block sums added in order.
std::vector<float> fma_chain(const float* x, const float* w, std::int64_t T, std::int64_t N, std::int64_t K) {
    std::vector<float> y(static_cast<std::size_t>(T * N));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t n = 0; n < N; ++n) {
            float total = 0.0f;
            for (std::int64_t k0 = 0; k0 < K; k0 += kernels::kMatmulKBlock) {
                float s = 0.0f;
                for (std::int64_t k = k0; k < std::min(K, k0 + kernels::kMatmulKBlock); ++k)
                    s = std::fma(x[t * K + k], w[n * K + k], s);
                total = k0 == 0 ? s : total + s;
            }
            y[static_cast<std::size_t>(t * N + n)] = total;
        }
    return y;
}

// Shapes that are not multiples of the 6×16 tile, the 8×8 transposes, the
// 16-k GEMV step, the 64-k summation block or the 256-wide packing block;
// K = 1; T ≤ 3 (GEMV) and T > 3 (GEMM).
const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>& awkward_shapes() {
    static const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> shapes = {
        {1, 1, 1},     {1, 17, 1},    {3, 5, 1},     {1, 7, 9},    {1, 33, 100}, {1, 100, 257}, {1, 47, 2048},
        {2, 16, 16},   {3, 17, 7},    {5, 33, 255},  {7, 1, 513},  {7, 31, 17},  {17, 65, 257}, {33, 129, 300},
        {49, 130, 33}, {73, 20, 520}, {97, 200, 64}, {6, 16, 256}, {12, 32, 512}, {1, 24, 256},
        {1, 16, 512},  {2, 24, 261},  {3, 9, 768},   {1, 40, 1030}, {1, 16, 64},   {1, 17, 65},   {2, 33, 128},
        {5, 16, 129}};
    return shapes;
}

}  // namespace

TEST(CpuPacked, AwkwardShapesWithinGammaKBoundAndThreadInvariant) {
    for (const auto& [T, N, K] : awkward_shapes()) {
        const Tensor x = seeded_normal(41, "aw/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(41, "aw/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
        const Tensor yr = ref()->matmul(x, w);
        const Tensor y1 = create_backend("cpu:threads=1")->matmul(x, w);
        for (const char* spec : {"cpu:threads=2", "cpu:threads=3", "cpu:threads=7"}) {
            const Tensor yt = create_backend(spec)->matmul(x, w);
            ASSERT_EQ(std::memcmp(y1.raw(), yt.raw(), y1.nbytes()), 0) << spec << " T=" << T << " N=" << N << " K=" << K;
        }
        ASSERT_TRUE(matmul_within_bound(x, w, y1, yr, 0, kU32));
    }
}

TEST(CpuPacked, EveryElementIsSummedInTheContractOrder) {
    if (!kernels::cpu_has_fma_kernels()) GTEST_SKIP() << "no fused kernels (AVX2/FMA, NEON) on this CPU";
    for (const auto& [T, N, K] : awkward_shapes()) {
        const Tensor x = seeded_normal(43, "ch/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(43, "ch/w", {N, K}, 0, 1);
        const std::vector<float> want = fma_chain(x.as<float>(), w.as<float>(), T, N, K);
        for (int threads : {1, 2}) {
            std::vector<float> got(want.size(), -1.0f);
            kernels::matmul_f32_fma(x.as<float>(), w.as<float>(), got.data(), T, N, K, threads);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
                << "T=" << T << " N=" << N << " K=" << K << " threads=" << threads;
        }
    }
}

TEST(CpuPacked, ATokenGivesTheSameBitsAloneAsInABatch) {
    // GEMV (T = 1) and GEMM (T > 1) share the per-element order, and so do
    // all row positions inside the 6-row tiles.
    const std::int64_t T = 29, N = 70, K = 600;
    const Tensor x = seeded_normal(47, "bi/x", {T, K}, 0, 1);
    const Tensor w = seeded_normal(47, "bi/w", {N, K}, 0, 0.05);
    auto cpu = create_backend("cpu");
    const Tensor all = cpu->matmul(x, w);
    for (std::int64_t t = 0; t < T; ++t) {
        const Tensor one = cpu->matmul(x.view().row(t), w);
        ASSERT_EQ(std::memcmp(one.raw(), all.as<float>() + t * N, static_cast<std::size_t>(N) * sizeof(float)), 0) << t;
    }
}

// The decode GEMV on weights packed once (kernels::pack_gemv +
// gemv_packed) gives the GEMV's bits: T = 1 … 3, N and K around the group
// (32), the vector width (8) and the summation block (64), f32/f16/bf16
// weights, every rounding, 1 and 2 threads — with the panels in the
// narrowest exact format: 2 bytes a weight unless f32 weights meet no
// rounding, and exactly the bytes gemv_packed_bytes names (a sentinel past
// them stays untouched).
TEST(CpuPacked, DecodeGemvOnPackedWeightsGivesTheGemvsBits) {
    if (!kernels::cpu_has_fma_kernels()) GTEST_SKIP() << "no fused kernels (AVX2/FMA, NEON) on this CPU";
    for (const auto& [N, K] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {7, 9}, {32, 64}, {33, 65}, {70, 600}, {64, 128}, {257, 1024}, {96, 17}}) {
        for (std::int64_t T = 1; T <= kernels::kGemvPackMaxRows; ++T) {
            const Tensor x = seeded_normal(61, "pg/x", {T, K}, 0, 1);
            const Tensor w = seeded_normal(61, "pg/w", {N, K}, 0, 0.05);
            for (DType wd : {DType::f32, DType::f16, DType::bf16}) {
                const Tensor wn = Tensor::convert(w, wd);
                for (auto r : {kernels::WeightRounding::none, kernels::WeightRounding::f16, kernels::WeightRounding::bf16})
                    for (int threads : {1, 2}) {
                        std::vector<float> want(static_cast<std::size_t>(T * N)), got(want.size(), NAN);
                        kernels::matmul_fma(x.as<float>(), wn.raw(), kernels::weight_format_of(wd), r, want.data(), T, N, K, threads, r);
                        const kernels::WeightFormat panel = kernels::gemv_panel_format(kernels::weight_format_of(wd), r);
                        const kernels::WeightFormat expected =
                            r == kernels::WeightRounding::f16    ? kernels::WeightFormat::f16
                            : r == kernels::WeightRounding::bf16 ? kernels::WeightFormat::bf16
                                                                 : kernels::weight_format_of(wd);
                        ASSERT_EQ(panel, expected) << dtype_name(wd) << " rounding " << static_cast<int>(r);
                        const auto bytes = static_cast<std::size_t>(kernels::gemv_packed_bytes(N, K, panel));
                        ASSERT_EQ(bytes, static_cast<std::size_t>((N + 31) / 32 * 32 * K * (panel == kernels::WeightFormat::f32 ? 4 : 2)));
                        std::vector<unsigned char> packed(bytes + 64, 0xA5);
                        kernels::pack_gemv(wn.raw(), kernels::weight_format_of(wd), r, N, K, packed.data(), threads);
                        ASSERT_TRUE(std::all_of(packed.begin() + static_cast<std::ptrdiff_t>(bytes), packed.end(),
                                                [](unsigned char c) { return c == 0xA5; }))
                            << "pack_gemv wrote past gemv_packed_bytes";
                        kernels::gemv_packed(x.as<float>(), packed.data(), panel, got.data(), T, N, K, threads, r);
                        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                            << "T " << T << " N " << N << " K " << K << " " << dtype_name(wd) << " rounding " << static_cast<int>(r)
                            << " threads " << threads;
                    }
            }
        }
    }
}

TEST(CpuPacked, BatchedGemvsGiveEachGemvsBits) {
    // Jobs of different shapes and row counts in one region: each y equals
    // the GEMV run alone, for 1 and 2 threads and every rounding.
    if (!kernels::cpu_has_fma_kernels()) GTEST_SKIP() << "no fused kernels (AVX2/FMA, NEON) on this CPU";
    struct Shape3 { std::int64_t t, n, k; };
    // Weights f32, bf16 and f16 (panels of 4 and 2 bytes side by side in one region).
    const std::vector<Shape3> shapes{{1, 256, 1024}, {2, 70, 600}, {3, 33, 65}, {1, 1, 1}, {1, 1024, 256}};
    const std::vector<DType> wdt{DType::f32, DType::bf16, DType::f16, DType::f32, DType::bf16};
    std::vector<Tensor> xs, ws;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
        const auto [t, n, k] = shapes[i];
        xs.push_back(seeded_normal(71, "pb/x" + std::to_string(i), {t, k}, 0, 1));
        ws.push_back(Tensor::convert(seeded_normal(71, "pb/w" + std::to_string(i), {n, k}, 0, 0.05), wdt[i]));
    }
    for (auto r : {kernels::WeightRounding::none, kernels::WeightRounding::bf16})
        for (int threads : {1, 2}) {
            std::vector<std::vector<unsigned char>> packs;
            std::vector<kernels::WeightFormat> panels;
            for (std::size_t i = 0; i < shapes.size(); ++i) {
                const auto [t, n, k] = shapes[i];
                panels.push_back(kernels::gemv_panel_format(kernels::weight_format_of(wdt[i]), r));
                packs.emplace_back(static_cast<std::size_t>(kernels::gemv_packed_bytes(n, k, panels.back())));
                kernels::pack_gemv(ws[i].raw(), kernels::weight_format_of(wdt[i]), r, n, k, packs.back().data());
            }
            std::vector<Tensor> alone, together;
            std::vector<Tensor> xr;  // x rounded as gemv_packed rounds it itself
            std::vector<kernels::PackedGemvJob> jobs;
            for (std::size_t i = 0; i < shapes.size(); ++i) {
                const auto [t, n, k] = shapes[i];
                alone.emplace_back(DType::f32, Shape{t, n});
                kernels::gemv_packed(xs[i].as<float>(), packs[i].data(), panels[i], alone.back().as<float>(), t, n, k,
                                          threads, r);
                xr.emplace_back(DType::f32, Shape{t, k});
                kernels::convert_rounded(xs[i].as<float>(), kernels::WeightFormat::f32, r, xr.back().as<float>(), t * k);
                together.emplace_back(DType::f32, Shape{t, n});
                std::fill(together.back().as<float>(), together.back().as<float>() + t * n, NAN);
            }
            for (std::size_t i = 0; i < shapes.size(); ++i)
                jobs.push_back({xr[i].as<float>(), packs[i].data(), together[i].as<float>(), shapes[i].t, shapes[i].n,
                                shapes[i].k, panels[i]});
            kernels::gemv_packed_batch(jobs, threads, r);
            for (std::size_t i = 0; i < shapes.size(); ++i)
                ASSERT_EQ(std::memcmp(alone[i].raw(), together[i].raw(), alone[i].nbytes()), 0)
                    << "job " << i << " threads " << threads << " rounding " << static_cast<int>(r);
        }
}

TEST(CpuPacked, BatchedExpertsGiveTheDefaultsBits) {
    // The cpu node runs a decode step's experts on packed checkpoint weights
    // in two parallel regions (CpuBackend::expert_ffns); the same node with
    // weight_cache=0 runs Backend's default, one expert after another through
    // matmul and swiglu. The MoE block must be the same bits, for T = 1 … 3,
    // with one expert chosen twice across tokens, f32, bf16 and f16 weights
    // (panels of 4 and 2 bytes) on f32, bf16 and f16 storage and 1 or 2
    // threads; and the packed path must have run (the cache's counters).
    if (!kernels::cpu_has_fma_kernels()) GTEST_SKIP() << "no fused kernels (AVX2/FMA, NEON) on this CPU";
    const std::int64_t E = 6, H = 96, I = 40, k = 3;
    for (const DType wd : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::byte> weights;  // one block registered as immutable, as a checkpoint's mapping
    for (const char* part : {"gate", "up", "down"})
        for (std::int64_t e = 0; e < E; ++e) {
            const Tensor w = Tensor::convert(seeded_normal(73, std::string("bx/") + part + std::to_string(e), {I * H}, 0, 0.1), wd);
            weights.insert(weights.end(), static_cast<const std::byte*>(w.raw()), static_cast<const std::byte*>(w.raw()) + w.nbytes());
        }
    const ImmutableRegistration reg(weights.data(), weights.size());
    std::vector<ExpertWeights> experts;
    const std::size_t matrix = static_cast<std::size_t>(I * H) * dtype_size(wd);
    for (std::int64_t e = 0; e < E; ++e) {
        const std::byte* g = weights.data() + static_cast<std::size_t>(e) * matrix;
        experts.push_back({TensorView{wd, g, {I, H}}, TensorView{wd, g + static_cast<std::size_t>(E) * matrix, {I, H}},
                           TensorView{wd, g + 2 * static_cast<std::size_t>(E) * matrix, {H, I}}});
    }
    for (const char* spec : {"cpu", "cpu:threads=1", "cpu:storage=bf16", "cpu:storage=f16"}) {
        auto batched = create_backend(spec);
        auto plain = create_backend(std::string(spec) + (std::string(spec) == "cpu" ? ":" : ",") + "weight_cache=0");
        std::uint64_t expert_matmuls = 0;
        // f16/bf16 weights are packed from their 8th decode matmul on (before,
        // the GEMV reads them in place): ten rounds use every expert more often.
        const int rounds = wd == DType::f32 ? 1 : 10;
        for (int round = 0; round < rounds; ++round)
        for (std::int64_t T = 1; T <= kernels::kGemvPackMaxRows; ++T) {
            const Tensor x = seeded_normal(73, "bx/x" + std::to_string(T), {T, H}, 0, 1);
            RoutingPlan plan{Tensor(DType::i32, {T, k}), seeded_normal(73, "bx/w" + std::to_string(T), {T, k}, 0.3, 0.1)};
            std::vector<bool> used(static_cast<std::size_t>(E));
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t j = 0; j < k; ++j) {
                    const auto e = static_cast<std::int32_t>((t + 2 * j) % E);  // expert 2 serves tokens 0 and 2
                    plan.ids.as<std::int32_t>()[t * k + j] = e;
                    used[static_cast<std::size_t>(e)] = true;
                }
            const Tensor a = batched->moe_block(x, experts, plan), b = plain->moe_block(x, experts, plan);
            ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << spec << " T " << T << " weights " << dtype_name(wd);
            expert_matmuls += 3 * static_cast<std::uint64_t>(std::count(used.begin(), used.end(), true));
        }
        const WeightCacheStats s = *batched->weight_cache_stats();
        EXPECT_EQ(s.misses, 3u * E) << spec << " " << dtype_name(wd);  // every expert packed once …
        if (wd == DType::f32)
            EXPECT_EQ(s.hits + s.misses, expert_matmuls) << spec;  // … and every expert matmul ran packed
        else
            EXPECT_GT(s.hits, 3u * E) << spec << " " << dtype_name(wd);  // … and the packed copies ran
        // … in the narrowest exact format: 2 bytes a weight unless f32 weights meet f32 storage.
        const std::uint64_t per = wd == DType::f32 && std::string(spec).find("storage") == std::string::npos ? 4 : 2;
        // Gate and up: 40 rows padded to 2 groups of 32, K = 96; down: 96 rows, K = 40.
        EXPECT_EQ(s.bytes_uploaded, static_cast<std::uint64_t>(E) * (2 * 64 * 96 + 96 * 40) * per) << spec << " " << dtype_name(wd);
        EXPECT_EQ(plain->weight_cache_stats()->misses, 0u) << spec;
    }
    }
}

TEST(CpuPacked, HalfAndBf16WeightsAreConvertedInTheKernelExactly) {
    // Weights handed over as f16/bf16 (a checkpoint's dtype) give the same bits
    // as the same weights converted to f32 first, on every storage variant; and
    // f32 weights and activations rounded by a storage=f16|bf16 node inside the
    // kernel give the same bits as operands rounded to that dtype beforehand.
    for (const auto& [T, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 40, 300}, {1, 17, 7}, {3, 20, 40}, {9, 33, 259}}) {
        const Tensor x = seeded_normal(53, "hb/x", {T, K}, 0, 1);
        const Tensor w = seeded_normal(53, "hb/w", {N, K}, 0, 0.05);
        for (DType wd : {DType::f16, DType::bf16}) {
            const Tensor wn = Tensor::convert(w, wd);            // narrow weights
            const Tensor wn32 = Tensor::convert(wn, DType::f32);  // the same values in f32
            for (const char* spec : {"cpu", "cpu:storage=f16", "cpu:storage=bf16", "cpu:threads=1"}) {
                auto node = create_backend(spec);
                const Tensor a = node->matmul(x, wn);
                const Tensor b = node->matmul(x, wn32);
                ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << spec << " weights " << dtype_name(wd);
            }
            const std::string spec = std::string("cpu:storage=") + dtype_name(wd);
            const Tensor a = create_backend(spec)->matmul(x, w);    // rounded while packed
            const Tensor b = create_backend(spec)->matmul(x, wn);   // rounded beforehand
            ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << spec;
            // The activations too: f32 x rounded by the kernel = x rounded beforehand.
            const Tensor c = create_backend(spec)->matmul(Tensor::convert(x, wd), wn);
            ASSERT_EQ(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0) << spec << " (x rounded beforehand)";
        }
    }
}

TEST(CpuPacked, InKernelRoundingMatchesRoundTo) {
    if (!kernels::cpu_has_fma_kernels()) GTEST_SKIP() << "no fused kernels (AVX2/FMA, NEON) on this CPU";
    // Rounding ties, subnormals of both formats, values near their largest
    // finite, and (K = 1 only, the scalar path) overflow, inf and NaN.
    std::vector<float> finite = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                                 0x1p-130f,     3e-39f,              5.96e-8f,          2.98e-8f,          6.1e-5f,
                                 1e-7f,         65504.0f,            65519.0f,          3.3e38f,           0.1f,
                                 -0.3f,         1234.567f,           7.0e-6f,           1.0f,              2.0f};
    for (auto [r, d] : {std::pair{kernels::WeightRounding::f16, DType::f16}, std::pair{kernels::WeightRounding::bf16, DType::bf16}}) {
        // Identity x (T = K = 24, the vector paths): y[t, n] = 1 · round(w[n, t]),
        // every other term adds ±0. Values that round to ±inf would make 0 · inf.
        std::vector<float> vals;
        for (float v : finite)
            if (std::isfinite(round_to(d, v))) vals.push_back(v);
        const std::int64_t K = 24, N = static_cast<std::int64_t>(vals.size());
        std::vector<float> w(static_cast<std::size_t>(N * K)), x(static_cast<std::size_t>(K * K), 0.0f);
        for (std::int64_t n = 0; n < N; ++n)
            for (std::int64_t k = 0; k < K; ++k)
                w[static_cast<std::size_t>(n * K + k)] = vals[static_cast<std::size_t>((n + k) % N)] * (k % 3 == 0 ? -1.0f : 1.0f);
        for (std::int64_t k = 0; k < K; ++k) x[static_cast<std::size_t>(k * K + k)] = 1.0f;
        std::vector<float> y(static_cast<std::size_t>(K * N));
        kernels::matmul_fma(x.data(), w.data(), kernels::WeightFormat::f32, r, y.data(), K, N, K, 1);
        for (std::int64_t t = 0; t < K; ++t)
            for (std::int64_t n = 0; n < N; ++n) {
                const float want = static_cast<float>(round_to(d, w[static_cast<std::size_t>(n * K + t)]));
                ASSERT_EQ(y[static_cast<std::size_t>(t * N + n)], want) << dtype_name(d) << " " << w[static_cast<std::size_t>(n * K + t)];
            }
        // K = 1: y[n] = 1 · round(w[n]), including what overflows and non-finite values.
        std::vector<float> special = finite;
        for (float v : {65520.0f, -70000.0f, 3.4e38f, INFINITY, -INFINITY, NAN}) special.push_back(v);
        std::vector<float> ys(special.size());
        const float one = 1.0f;
        kernels::matmul_fma(&one, special.data(), kernels::WeightFormat::f32, r, ys.data(), 1,
                             static_cast<std::int64_t>(special.size()), 1, 1);
        for (std::size_t i = 0; i < special.size(); ++i) {
            const double want = round_to(d, special[i]);
            if (std::isnan(want)) EXPECT_TRUE(std::isnan(ys[i])) << special[i];
            else EXPECT_EQ(ys[i], static_cast<float>(want)) << dtype_name(d) << " " << special[i];
        }
    }
}

// ---- f16 accumulation ----------------------------------------------------------

TEST(F16Accumulation, FastRoundingMatchesExactRounding) {
    const Tensor v = seeded_normal(19, "f16/v", {200000}, 0, 100);
    for (std::int64_t i = 0; i < v.numel(); ++i) {
        const double x = v.at(i) * std::ldexp(1.0, static_cast<int>(i % 40) - 20);
        ASSERT_EQ(kernels::round_f16_fast(x), round_to_f16(x)) << x;
    }
    for (double x : {0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 6.1e-5, 5.96e-8, 1e-9, 2049.0, 2051.0})
        EXPECT_EQ(kernels::round_f16_fast(x), round_to_f16(x)) << x;
}

namespace {

// The f16-accumulation matmul by its definition: per output one chain in
// ascending k, acc = round_to_f16(acc + x·w) in double from +0 (the exact
// rounding, not the kernels' fast one).
std::vector<float> f16acc_by_definition(const std::vector<float>& x, const std::vector<float>& w, std::int64_t t_count,
                                        std::int64_t n_count, std::int64_t k_count) {
    std::vector<float> y(static_cast<std::size_t>(t_count * n_count));
    for (std::int64_t t = 0; t < t_count; ++t)
        for (std::int64_t n = 0; n < n_count; ++n) {
            double acc = 0.0;
            for (std::int64_t k = 0; k < k_count; ++k)
                acc = round_to_f16(acc + static_cast<double>(x[static_cast<std::size_t>(t * k_count + k)]) *
                                             static_cast<double>(w[static_cast<std::size_t>(n * k_count + k)]));
            y[static_cast<std::size_t>(t * n_count + n)] = static_cast<float>(acc);
        }
    return y;
}

// Every f16-accumulation kernel this CPU can run, by name.
std::vector<std::pair<const char*, kernels::MatmulF32*>> f16acc_isas() {
    std::vector<std::pair<const char*, kernels::MatmulF32*>> isas{{"generic", kernels::matmul_f16acc_generic}};
#if defined(__x86_64__)
    if (kernels::cpu_has_avx2_fma()) isas.emplace_back("avx2", kernels::matmul_f16acc_avx2);
    if (kernels::cpu_has_avx512()) isas.emplace_back("avx512", kernels::matmul_f16acc_avx512);
#endif
    return isas;
}

bool same_float_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(F16Accumulation, EveryIsaGivesTheDefinitionsBitsOnEveryRange) {
    // Values spread over 2^-24 … 2^12 so the sums cross f16's subnormals,
    // normals and overflow (±inf, then inf − inf = NaN): every branch of the
    // lane rounding. Shapes: tails of the 8-output blocks and 4-row tiles.
    const auto isas = f16acc_isas();
    std::size_t non_finite = 0, tiny = 0;
    for (const auto& [t_count, n_count, k_count] : std::vector<std::array<std::int64_t, 3>>{
             {1, 1, 1}, {1, 8, 64}, {3, 13, 37}, {4, 16, 64}, {5, 70, 300}, {9, 23, 129}, {2, 40, 50}, {6, 17, 20}, {7, 100, 3}}) {
        const Tensor xs = seeded_normal(41, "f16acc/x", {t_count, k_count}, 0, 1);
        const Tensor ws = seeded_normal(42, "f16acc/w", {n_count, k_count}, 0, 1);
        std::vector<float> x(static_cast<std::size_t>(t_count * k_count)), w(static_cast<std::size_t>(n_count * k_count));
        // Row t of x scaled by 2^(9·(t mod 4) − 20), row n of w by 2^(5·(n mod 4) − 6), and k by 2^(k mod 5 − 2):
        // products from ~2^-28 (wholly subnormal sums) to ~2^18 (sums past 65520).
        const auto scale = [](std::int64_t a, int step, int base, std::int64_t k) {
            return std::ldexp(1.0, static_cast<int>(a % 4) * step + base + static_cast<int>(k % 5) - 2);
        };
        for (std::int64_t t = 0; t < t_count; ++t)
            for (std::int64_t k = 0; k < k_count; ++k)
                x[static_cast<std::size_t>(t * k_count + k)] = static_cast<float>(xs.at(t * k_count + k) * scale(t, 9, -20, k));
        for (std::int64_t n = 0; n < n_count; ++n)
            for (std::int64_t k = 0; k < k_count; ++k)
                w[static_cast<std::size_t>(n * k_count + k)] = static_cast<float>(ws.at(n * k_count + k) * scale(n, 5, -6, 0));
        const std::vector<float> want = f16acc_by_definition(x, w, t_count, n_count, k_count);
        for (float v : want) {
            non_finite += !std::isfinite(v);
            tiny += v != 0 && std::fabs(v) < 0x1p-14f;
        }
        for (const auto& [name, kernel] : isas)
            for (int threads : {1, 3}) {
                std::vector<float> y(want.size(), -1.0f);
                kernel(x.data(), w.data(), y.data(), t_count, n_count, k_count, threads);
                EXPECT_TRUE(same_float_bits(y, want)) << name << " threads " << threads << " shape " << t_count << "x"
                                                      << n_count << "x" << k_count;
            }
    }
    EXPECT_GT(non_finite, 0u) << "no sum overflowed: the inf/NaN lanes were not exercised";
    EXPECT_GT(tiny, 0u) << "no f16 subnormal result: the tiny lanes were not exercised";
}

TEST(F16Accumulation, EveryIsaRoundsTheEdgesAsRoundToF16) {
    // K = 1, w = 1: y = round_f16(+0 + x) in every lane, at the boundaries of each range.
    const auto isas = f16acc_isas();
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x{0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, -65520.0f, 65535.0f, 1e30f, -1e30f, inf, -inf, nan,
                               0x1p-14f, 0x1.ffcp-15f, 0x1p-24f, 0x1p-25f, 0x3p-25f, -0x3p-25f, 0x1p-26f, 1e-30f,
                               1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 2049.0f, 2051.0f, 1.00048828125f, 0.333333343f};
    const auto t_count = static_cast<std::int64_t>(x.size());
    const std::vector<float> w(8, 1.0f);
    std::vector<float> want(x.size() * 8);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(round_to_f16(0.0 + static_cast<double>(x[i / 8])));  // the chain starts at +0
    for (const auto& [name, kernel] : isas) {
        std::vector<float> y(want.size(), -1.0f);
        kernel(x.data(), w.data(), y.data(), t_count, 8, 1, 1);
        for (std::size_t i = 0; i < y.size(); i += 8)
            EXPECT_EQ(std::memcmp(&y[i], &want[i], sizeof(float)), 0) << name << ": x " << x[i / 8] << " gives " << y[i]
                                                                      << ", round_to_f16 " << want[i];
    }
}

TEST(F16Accumulation, DispatchIsTheBestIsaOfThisCpu) {
    // What cpu_isa() picks is what the CPU has (KVASIR_CPU_ISA unset in the tests).
    ASSERT_EQ(std::getenv("KVASIR_CPU_ISA"), nullptr);
    EXPECT_EQ(kernels::cpu_has_avx512(), kernels::cpu_isa() == kernels::CpuIsa::avx512);
    EXPECT_EQ(kernels::cpu_has_avx2_fma(), kernels::cpu_isa() == kernels::CpuIsa::avx2 || kernels::cpu_isa() == kernels::CpuIsa::avx512);
    EXPECT_STREQ(kernels::cpu_isa_name(kernels::CpuIsa::avx512), "avx512");
    EXPECT_STREQ(kernels::cpu_isa_name(kernels::CpuIsa::neon), "neon");
#if defined(__aarch64__)
    EXPECT_EQ(kernels::cpu_isa(), kernels::CpuIsa::neon);  // AdvSIMD is part of every AArch64 CPU
#endif
    EXPECT_EQ(kernels::cpu_has_fma_kernels(), kernels::cpu_isa() != kernels::CpuIsa::generic);
}

TEST(Threads, TinyWorkRunsOnTheCallingThreadAndLargeWorkOnEvery) {
    EXPECT_EQ(kernels::team_for(16, 0, 16), 1);
    EXPECT_EQ(kernels::team_for(16, std::nan(""), 16), 1);
    EXPECT_EQ(kernels::team_for(16, 1.5 * kernels::kFlopsPerThread, 16), 1);
    EXPECT_EQ(kernels::team_for(16, 2 * kernels::kFlopsPerThread, 16), 2);
    EXPECT_EQ(kernels::team_for(16, 5.9 * kernels::kFlopsPerThread, 16), 5);
    EXPECT_EQ(kernels::team_for(16, 1e12, 16), 16);
    EXPECT_EQ(kernels::team_for(1, 1e12, 16), 1);
    EXPECT_EQ(kernels::threads_for_work(16, 1e3), 1);  // tiny work: the calling thread, free cores not asked
}

TEST(Threads, NoMoreThreadsThanTheCoresOthersLeave) {
    // Cores left = cores − round(others' busy cores), at least 1.
    EXPECT_EQ(kernels::free_cores_of(2, 0.0), 2);
    EXPECT_EQ(kernels::free_cores_of(2, -0.3), 2);  // clock noise
    EXPECT_EQ(kernels::free_cores_of(2, 0.4), 2);
    EXPECT_EQ(kernels::free_cores_of(2, 0.6), 1);
    EXPECT_EQ(kernels::free_cores_of(2, 1.0), 1);
    EXPECT_EQ(kernels::free_cores_of(2, 5.0), 1);
    EXPECT_EQ(kernels::free_cores_of(16, 3.2), 13);
    EXPECT_EQ(kernels::free_cores_of(16, std::nan("")), 16);
    // The team: the work's and the caller's limits, then the free cores.
    EXPECT_EQ(kernels::team_for(16, 1e12, 13), 13);
    EXPECT_EQ(kernels::team_for(2, 1e12, 1), 1);
    EXPECT_EQ(kernels::team_for(8, 4 * kernels::kFlopsPerThread, 13), 4);
    // Sampled from this machine: between 1 and its cores.
    const int f = kernels::free_cores();
    EXPECT_GE(f, 1);
    EXPECT_LE(f, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}
