// OpenCL matmul on the expert shapes of Qwen3-30B-A3B (hidden 2048, expert
// FFN 768), next to the cpu backend on the same inputs. The counter GFLOP is
// 2·T·N·K per iteration, reported per second. An iteration is what a node
// really pays per op here: host→device upload of x and w, the kernel, and the
// read-back (the program is built once, before timing).
//
//   ./bench_opencl --benchmark_min_time=0.5
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"

#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>

namespace {

void matmul(benchmark::State& state, const char* spec) {
    const std::int64_t T = state.range(0), N = state.range(1), K = state.range(2);
    std::unique_ptr<kvasir::Backend> node;
    try {
        node = kvasir::create_backend(spec);
    } catch (const kvasir::Error& e) {
        state.SkipWithError(e.what());
        return;
    }
    const kvasir::Tensor x = kvasir::seeded_normal(1, "bench/x", {T, K}, 0, 1);
    const kvasir::Tensor w = kvasir::seeded_normal(1, "bench/w", {N, K}, 0, 1 / std::sqrt(static_cast<double>(K)));
    benchmark::DoNotOptimize(node->matmul(x, w));  // warm-up: builds the OpenCL program once
    for (auto _ : state) benchmark::DoNotOptimize(node->matmul(x, w));
    state.counters["GFLOP"] =
        benchmark::Counter(2e-9 * static_cast<double>(T * N * K), benchmark::Counter::kIsIterationInvariantRate);
    state.SetLabel(node->capabilities().node);
}

// {T, N, K}: up/gate projection (768×2048) and down projection (2048×768).
void expert_shapes(benchmark::internal::Benchmark* b) {
    for (std::int64_t t : {16, 128}) {
        b->Args({t, 768, 2048});
        b->Args({t, 2048, 768});
    }
    b->ArgNames({"T", "N", "K"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_CAPTURE(matmul, opencl, "opencl:0")->Apply(expert_shapes);
BENCHMARK_CAPTURE(matmul, cpu, "cpu")->Apply(expert_shapes);

BENCHMARK_MAIN();
