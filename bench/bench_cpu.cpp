// CPU op benchmarks: every op on cpu-ref, cpu and cpu:acc=f16 at real expert
// shapes, and the matmul side by side with OpenBLAS sgemm (the yardstick a
// user would otherwise reach for; used here only, never by the tool).
// Counters: GFLOP/s for matmul (2·T·N·K flops), elements/s otherwise.
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/rng.hpp"

#include <benchmark/benchmark.h>

#if defined(KVASIR_BENCH_OPENBLAS)
#include <cblas.h>
#endif

#include <cmath>
#include <map>
#include <memory>
#include <string>

using namespace kvasir;

namespace {

Backend& node(const std::string& spec) {
    static std::map<std::string, std::unique_ptr<Backend>> cache;
    auto& b = cache[spec];
    if (!b) b = create_backend(spec);
    return *b;
}

const char* kSpecs[] = {"cpu-ref", "cpu", "cpu:threads=1", "cpu:acc=f16", "cpu:storage=bf16"};

// args: spec index, T, N, K
void BM_matmul(benchmark::State& state) {
    const std::string spec = kSpecs[state.range(0)];
    const std::int64_t T = state.range(1), N = state.range(2), K = state.range(3);
    const Tensor x = seeded_normal(1, "bench/x", {T, K}, 0, 1);
    const Tensor w = seeded_normal(1, "bench/w", {N, K}, 0, 1 / std::sqrt(double(K)));
    Backend& b = node(spec);
    for (auto _ : state) benchmark::DoNotOptimize(b.matmul(x, w));
    state.SetLabel(spec);
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(T * N * K), benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}

void matmul_shapes(benchmark::internal::Benchmark* b, std::initializer_list<int> specs) {
    for (int s : specs)
        for (int t : {1, 16, 128, 512}) {
            b->Args({s, t, 768, 2048});
            b->Args({s, t, 2048, 768});
        }
}

BENCHMARK(BM_matmul)->Apply([](auto* b) { matmul_shapes(b, {1, 2, 4}); })->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_matmul)->Apply([](auto* b) {
    for (int s : {0, 3})
        for (int t : {1, 16}) b->Args({s, t, 768, 2048});
})->Unit(benchmark::kMillisecond);

#if defined(KVASIR_BENCH_OPENBLAS)
void BM_openblas_sgemm(benchmark::State& state) {
    const std::int64_t T = state.range(1), N = state.range(2), K = state.range(3);
    openblas_set_num_threads(state.range(0) == 2 ? 1 : 0 /* 0: all */);
    const Tensor x = seeded_normal(1, "bench/x", {T, K}, 0, 1);
    const Tensor w = seeded_normal(1, "bench/w", {N, K}, 0, 1 / std::sqrt(double(K)));
    Tensor y(DType::f32, {T, N});
    for (auto _ : state) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(N), int(K), 1.0f, x.as<float>(), int(K),
                    w.as<float>(), int(K), 0.0f, y.as<float>(), int(N));
        benchmark::DoNotOptimize(y.raw());
    }
    state.SetLabel(state.range(0) == 2 ? "openblas 1 thread" : "openblas all threads");
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(T * N * K), benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}
BENCHMARK(BM_openblas_sgemm)->Apply([](auto* b) { matmul_shapes(b, {1, 2}); })->Unit(benchmark::kMicrosecond);
#endif

// args: spec index
void BM_rowops(benchmark::State& state, const char* op) {
    const std::string spec = kSpecs[state.range(0)];
    const Tensor x = seeded_normal(2, "bench/r", {64, 2048}, 0, 1);
    const Tensor w = seeded_normal(2, "bench/rw", {2048}, 1, 0.1);
    Backend& b = node(spec);
    const std::string o = op;
    for (auto _ : state) {
        if (o == "softmax") benchmark::DoNotOptimize(b.softmax(x));
        else if (o == "rmsnorm") benchmark::DoNotOptimize(b.rmsnorm(x, w, 1e-6));
        else if (o == "swiglu") benchmark::DoNotOptimize(b.swiglu(x, x));
        else benchmark::DoNotOptimize(b.sigmoid(x));
    }
    state.SetLabel(spec);
    state.SetItemsProcessed(state.iterations() * x.numel());
}
BENCHMARK_CAPTURE(BM_rowops, softmax, "softmax")->DenseRange(0, 3);
BENCHMARK_CAPTURE(BM_rowops, rmsnorm, "rmsnorm")->DenseRange(0, 3);
BENCHMARK_CAPTURE(BM_rowops, swiglu, "swiglu")->DenseRange(0, 3);
BENCHMARK_CAPTURE(BM_rowops, sigmoid, "sigmoid")->DenseRange(0, 3);

void BM_rope(benchmark::State& state) {
    const std::string spec = kSpecs[state.range(0)];
    const Tensor x = seeded_normal(3, "bench/rope", {64, 32, 128}, 0, 1);
    std::vector<std::int64_t> pos(64);
    for (int i = 0; i < 64; ++i) pos[std::size_t(i)] = i;
    Backend& b = node(spec);
    for (auto _ : state) benchmark::DoNotOptimize(b.rope(x, pos, {1e6, RopeLayout::neox}));
    state.SetLabel(spec);
    state.SetItemsProcessed(state.iterations() * x.numel());
}
BENCHMARK(BM_rope)->DenseRange(0, 3);

// Seeded input generation (Philox + libm-free Box–Muller), all threads.
void BM_seeded(benchmark::State& state) {
    const bool normal = state.range(0) == 0;
    for (auto _ : state)
        benchmark::DoNotOptimize(normal ? seeded_normal(1, "bench/rng", {1 << 22}, 0, 1)
                                        : seeded_uniform(1, "bench/rng", {1 << 22}, 0, 1));
    state.SetLabel(normal ? "normal f32" : "uniform f32");
    state.SetItemsProcessed(state.iterations() * (1 << 22));
}
BENCHMARK(BM_seeded)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
