// CPU benchmarks at Qwen3-30B-A3B shapes (hidden 2048, 128 experts of FFN
// 768, top-8, 32 query / 4 KV heads of 128), every op of the Backend
// interface on cpu-ref and on cpu (and its variants), and the matmul side by
// side with OpenBLAS sgemm — the yardstick a user would otherwise reach for,
// linked into this program only, never into the tool.
//
// Names: op/node/…  e.g. "matmul/cpu:threads=2/f32/T:16/N:768/K:2048",
// "openblas_sgemm/threads:2/T:16/N:768/K:2048", "moe_layer/cpu:threads=1/T:128".
// All times are wall-clock (UseRealTime: the threads' work counts).
// Counters: GFLOP/s for matmul and the MoE (2 flops per multiply-add),
// items_per_second (elements) for the rest.
//
//   ./bench_cpu --benchmark_filter='^(matmul/cpu:threads|openblas)' --benchmark_min_time=0.3
//   ./bench_cpu --benchmark_filter='^moe_layer' --benchmark_min_time=1
//   ./bench_cpu --benchmark_filter='^memory_read' --benchmark_min_time=2   (the machine's read GB/s)
//
// The matmul inputs are seeded normals; the weights of the bf16/f16 rows are
// the same values converted to that dtype before timing (the form a
// checkpoint hands over), run on the node with that storage. The MoE weights
// (128 experts × 3 matrices, 2.4 GB in f32, 1.2 GB in bf16) are made on first
// use, which takes a few seconds.
#include "bench_inputs.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/huge_pages.hpp"
#include "kvasir/core/rng.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#if defined(KVASIR_BENCH_OPENBLAS)
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace kvasir;
using namespace kvasir::bench;

namespace {

Backend& node(const std::string& spec) {
    static std::map<std::string, std::unique_ptr<Backend>> cache;
    auto& b = cache[spec];
    if (!b) b = create_backend(spec);
    return *b;
}

// ---- matmul ------------------------------------------------------------------------

void matmul(benchmark::State& state, std::string spec, DType wdtype, std::int64_t T, std::int64_t N, std::int64_t K) {
    const Tensor& x = input("bench/x", {T, K}, 1);
    const Tensor& w = input("bench/w", {N, K}, 1 / std::sqrt(double(K)), wdtype);
    Backend& b = node(spec);
    for (auto _ : state) benchmark::DoNotOptimize(b.matmul(x, w));
    state.counters["GFLOP/s"] = gflops(2.0 * double(T * N * K));
}

#if defined(KVASIR_BENCH_OPENBLAS)
void openblas_sgemm(benchmark::State& state, int threads, std::int64_t T, std::int64_t N, std::int64_t K) {
    const Tensor& x = input("bench/x", {T, K}, 1);
    const Tensor& w = input("bench/w", {N, K}, 1 / std::sqrt(double(K)));
    Tensor y(DType::f32, {T, N});
    openblas_set_num_threads(threads);
    for (auto _ : state) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(N), int(K), 1.0f, x.as<float>(), int(K),
                    w.as<float>(), int(K), 0.0f, y.as<float>(), int(N));
        benchmark::DoNotOptimize(y.raw());
        benchmark::ClobberMemory();
    }
    state.counters["GFLOP/s"] = gflops(2.0 * double(T * N * K));
}
#endif

// ---- element-wise and row ops ------------------------------------------------------

void row_op(benchmark::State& state, std::string spec, RowOp op, Shape shape) {
    const Tensor& x = input("bench/r", shape, 1);
    const Tensor& u = input("bench/u", shape, 1);
    const Tensor& nw = input("bench/nw", {shape.back()}, 0.1);
    Backend& b = node(spec);
    for (auto _ : state) {
        switch (op) {
            case RowOp::softmax: benchmark::DoNotOptimize(b.softmax(x)); break;
            case RowOp::rmsnorm: benchmark::DoNotOptimize(b.rmsnorm(x, nw, 1e-6)); break;
            case RowOp::swiglu: benchmark::DoNotOptimize(b.swiglu(x, u)); break;
            case RowOp::sigmoid: benchmark::DoNotOptimize(b.sigmoid(x)); break;
            case RowOp::add: benchmark::DoNotOptimize(b.add(x, u)); break;
            case RowOp::mul: benchmark::DoNotOptimize(b.mul(x, u)); break;
            case RowOp::scale: benchmark::DoNotOptimize(b.scale(x, 1 / std::sqrt(double(kHeadDim)))); break;
        }
    }
    state.SetItemsProcessed(state.iterations() * x.numel());
}

void rope(benchmark::State& state, std::string spec, std::int64_t T, std::int64_t heads) {
    const Tensor& x = input("bench/rope", {T, heads, kHeadDim}, 1);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) pos[std::size_t(i)] = 1000 + i;
    Backend& b = node(spec);
    for (auto _ : state) benchmark::DoNotOptimize(b.rope(x, pos, {1e6, RopeLayout::neox}));
    state.SetItemsProcessed(state.iterations() * x.numel());
}

void route(benchmark::State& state, std::string spec, std::int64_t T) {
    const Tensor& logits = input("bench/logits", {T, kExperts}, 1);
    Backend& b = node(spec);
    for (auto _ : state) benchmark::DoNotOptimize(b.route(logits, qwen_router()));
    state.SetItemsProcessed(state.iterations() * logits.numel());
}

// ---- the MoE block and layer -------------------------------------------------------

// moe_block with a fixed routing plan (the cpu-ref oracle's routing of seeded logits).
void moe_block(benchmark::State& state, std::string spec, DType wdtype, std::int64_t T) {
    const Tensor& x = input("bench/moe_x", {T, kHidden}, 1);
    const auto& ex = experts(wdtype);
    const RouterOutput r = node("cpu-ref").route(input("bench/moe_logits", {T, kExperts}, 1), qwen_router());
    const RoutingPlan plan{r.ids, r.weights};
    Backend& b = node(spec);
    for (auto _ : state) benchmark::DoNotOptimize(b.moe_block(x, ex, plan));
    state.counters["GFLOP/s"] = gflops(moe_flops(T));
}

// The whole routed-MoE layer as scripts/bench_numpy.py times it: router
// matmul (T×2048 · 2048×128), softmax top-8 with renormalised weights, the 8
// experts' SwiGLU MLPs per token and the weighted combine; f32 weights.
void moe_layer(benchmark::State& state, std::string spec, std::int64_t T) {
    const Tensor& x = input("bench/moe_x", {T, kHidden}, 1);
    const Tensor& wr = input("bench/router", {kExperts, kHidden}, 1 / std::sqrt(double(kHidden)));
    const auto& ex = experts(DType::f32);
    Backend& b = node(spec);
    for (auto _ : state) {
        const Tensor logits = b.matmul(x, wr);
        RouterOutput r = b.route(logits, qwen_router());
        benchmark::DoNotOptimize(b.moe_block(x, ex, RoutingPlan{std::move(r.ids), std::move(r.weights)}));
    }
    state.counters["GFLOP/s"] = gflops(moe_flops(T) + 2.0 * double(T * kExperts * kHidden));
}

// Causal GQA attention over a KV cache of S = p0 + T rows (32 query heads, 4
// kv heads of 128): the node's causal_attention ("fused"), or the default
// composition of its matmul/scale/softmax (Backend::compose_attention, what
// LayerGraph::attend ran before the op existed: "composed"). Prefill is
// T = 512 at p0 = 0, a decode step T = 1 at p0 = 511. GFLOP/s counts the
// unmasked multiply-adds of Q·Kᵀ and P·V (2·2·D per visible pair).
// sinks: the same with gpt-oss's attention sinks (causal_attention_sinks, one
// logit per query head). heads: the query heads (kHeads; 16 = four per kv
// head, the bench GGUF's attention, which decodes with keys in the lanes).
void attention(benchmark::State& state, std::string spec, bool fused, std::int64_t T, std::int64_t p0, bool sinks,
               std::int64_t heads) {
    const std::int64_t S = p0 + T;
    const Tensor& q = input("bench/attn/q" + std::to_string(heads), {T, heads, kHeadDim}, 1);
    std::vector<TensorView> k, v;
    for (std::int64_t g = 0; g < kKvHeads; ++g) {
        k.push_back(input("bench/attn/k" + std::to_string(g), {S, kHeadDim}, 1));
        v.push_back(input("bench/attn/v" + std::to_string(g), {S, kHeadDim}, 1));
    }
    Backend& b = node(spec);
    const double scale = 1 / std::sqrt(double(kHeadDim));
    const Tensor& sk = input("bench/attn/sinks" + std::to_string(heads), {heads}, 1);
    const TensorView sk_view = sk.view();
    for (auto _ : state) {
        if (sinks)
            benchmark::DoNotOptimize(fused ? b.causal_attention_sinks(q, k, v, scale, sk)
                                           : b.compose_attention(q, k, v, scale, &sk_view));
        else
            benchmark::DoNotOptimize(fused ? b.causal_attention(q, k, v, scale) : b.compose_attention(q, k, v, scale, nullptr));
    }
    const double pairs = double(T) * double(p0) + double(T) * double(T + 1) / 2;  // Σ_t (p0 + t + 1)
    state.counters["GFLOP/s"] = gflops(4.0 * double(kHeadDim) * double(heads) * pairs);
}

// Seeded input generation (Philox + libm-free Box–Muller), all threads.
void seeded(benchmark::State& state, bool normal) {
    for (auto _ : state)
        benchmark::DoNotOptimize(normal ? seeded_normal(1, "bench/rng", {1 << 22}, 0, 1)
                                        : seeded_uniform(1, "bench/rng", {1 << 22}, 0, 1));
    state.SetItemsProcessed(state.iterations() * (1 << 22));
}

// The machine's read bandwidth: a 1 GiB buffer (larger than any L3 here)
// summed by `threads` threads, each its own contiguous share, 64-byte lines
// added into four independent line-wide sums so the loads, not the adds, set
// the pace. One core pulls more from DRAM with wider loads (fewer
// instructions per line in flight), so the summing loop is compiled for the
// widest vectors the CPU has (target_clones: AVX-512, AVX2 or the baseline,
// picked at load time). The roof a decode step's weight streaming
// (bench_model's "tg GB/s") is read against: counters GB/s (bytes per second).
using Line = std::uint64_t __attribute__((vector_size(64)));
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
std::uint64_t sum_lines(const Line* p, std::size_t n) {
    Line s[4] = {};
    for (std::size_t i = 0; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; ++j) s[j] += p[i + j];
    const Line all = (s[0] + s[1]) + (s[2] + s[3]);
    std::uint64_t total = 0;
    for (int j = 0; j < 8; ++j) total += all[j];
    return total;
}

constexpr std::size_t kReadLines = (std::size_t{1} << 30) / sizeof(Line);

const Line* filled_lines(std::byte* mem) {
    Line* b = reinterpret_cast<Line*>(mem);
    for (std::size_t i = 0; i < kReadLines; ++i) b[i] = Line{} + i;
    return b;
}

// The buffer on huge pages (core/huge_pages.hpp, where the cpu node keeps its
// packed weights) or on 4 KiB pages (malloc's).
const Line* read_buffer(bool huge) {
    if (huge) {
        static const std::shared_ptr<std::byte[]> mem = huge_page_buffer(kReadLines * sizeof(Line));
        static const Line* lines = filled_lines(mem.get());
        return lines;
    }
    static std::vector<Line> small(kReadLines);
    static const Line* lines = filled_lines(reinterpret_cast<std::byte*>(small.data()));
    return lines;
}

void memory_read(benchmark::State& state, int threads, bool huge) {
    constexpr std::size_t kLines = kReadLines;
    const Line* buffer = read_buffer(huge);
    for (auto _ : state) {
        std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const std::size_t share = kLines / static_cast<std::size_t>(omp_get_num_threads());
            total += sum_lines(buffer + share * static_cast<std::size_t>(omp_get_thread_num()), share);
        }
        benchmark::DoNotOptimize(total);
    }
    state.counters["GB/s"] = benchmark::Counter(double(kLines * sizeof(Line)) * double(state.iterations()) / 1e9,
                                               benchmark::Counter::kIsRate);
}

// ---- registration ------------------------------------------------------------------

void register_all() {
    const std::pair<std::int64_t, std::int64_t> expert_nk[] = {{kExpertFfn, kHidden}, {kHidden, kExpertFfn}};
    const std::int64_t tokens[] = {1, 16, 128, 512};
    // Our matmuls first, OpenBLAS after: its idle worker threads keep
    // spinning for a while after each call and would slow what follows.
    for (const char* spec : {"cpu:threads=2", "cpu:threads=1"})
        for (auto [wd, storage] : {std::pair{DType::f32, ""}, std::pair{DType::bf16, ",storage=bf16"},
                                   std::pair{DType::f16, ",storage=f16"}})
            for (std::int64_t t : tokens)
                for (auto [n, k] : expert_nk)
                    add(std::string("matmul/") + spec + storage + "/" + dtype_name(wd) + shape_name(t, n, k), matmul,
                        std::string(spec) + storage, wd, t, n, k)
                        ->Unit(benchmark::kMicrosecond);
    // The f64 oracle at every T, f32 and bf16 weights (bf16 is what real
    // checkpoints hold: widened inside the kernel while packing).
    for (DType wd : {DType::f32, DType::bf16})
        for (std::int64_t t : tokens)
            for (auto [n, k] : expert_nk)
                add(std::string("matmul/cpu-ref/") + dtype_name(wd) + shape_name(t, n, k), matmul, std::string("cpu-ref"), wd,
                    t, n, k)
                    ->Unit(benchmark::kMillisecond);
    for (std::int64_t t : {1, 16})
        for (auto [n, k] : expert_nk)
            add(std::string("matmul/cpu:acc=f16/f32") + shape_name(t, n, k), matmul, std::string("cpu:acc=f16"), DType::f32, t, n, k)
                ->Unit(benchmark::kMillisecond);
#if defined(KVASIR_BENCH_OPENBLAS)
    for (int threads : {2, 1})
        for (std::int64_t t : tokens)
            for (auto [n, k] : expert_nk)
                add("openblas_sgemm/threads:" + std::to_string(threads) + shape_name(t, n, k), openblas_sgemm, threads, t, n, k)
                    ->Unit(benchmark::kMicrosecond);
#endif

    for (const std::string spec : {"cpu-ref", "cpu", "cpu:acc=f16", "cpu:storage=bf16"}) add_row_ops(spec, row_op, rope, route);
    for (std::int64_t t : {16, 128}) {
        for (const char* spec : {"cpu:threads=2", "cpu:threads=1"}) {
            add(std::string("moe_block/") + spec + "/f32/T:" + std::to_string(t), moe_block, std::string(spec), DType::f32, t)
                ->Unit(benchmark::kMillisecond);
            add(std::string("moe_block/") + spec + ",storage=bf16/bf16/T:" + std::to_string(t), moe_block,
                std::string(spec) + ",storage=bf16", DType::bf16, t)
                ->Unit(benchmark::kMillisecond);
            add(std::string("moe_layer/") + spec + "/T:" + std::to_string(t), moe_layer, std::string(spec), t)
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (std::int64_t t : {16, 128})
        add("moe_block/cpu-ref/f32/T:" + std::to_string(t), moe_block, std::string("cpu-ref"), DType::f32, t)
            ->Unit(benchmark::kMillisecond);
    std::vector<std::string> attention_nodes = {"cpu:threads=2", "cpu:threads=1", "cpu:threads=2,storage=bf16", "cpu-ref"};
#if defined(KVASIR_HAVE_OPENCL)
    attention_nodes.push_back("opencl:0");  // attention.cl against the node's composition, next to cpu's
#endif
    for (const std::string& spec : attention_nodes)
        for (const bool sinks : {false, true})
            for (const bool fused : {true, false})
                for (auto [t, p0] : {std::pair<std::int64_t, std::int64_t>{512, 0}, {1, 511}})
                    add(std::string(sinks ? "attention_sinks/" : "attention/") + spec + (fused ? "/fused" : "/composed") +
                            "/T:" + std::to_string(t) + "/p0:" + std::to_string(p0),
                        attention, std::string(spec), fused, t, p0, sinks, kHeads)
                        ->Unit(benchmark::kMillisecond);
    // Decode steps at the bench GGUF's 16 / 4 heads, at the mean cache of
    // bench_model --prompt 512 --gen 384 (S = 704).
    for (const char* spec : {"cpu:threads=2", "cpu:threads=1"})
        add(std::string("attention/") + spec + "/fused/H:16/T:1/p0:703", attention, std::string(spec), true, 1, 703, false,
            std::int64_t{16})
            ->Unit(benchmark::kMillisecond);
    add("seeded/normal_f32", seeded, true)->Unit(benchmark::kMillisecond);
    add("seeded/uniform_f32", seeded, false)->Unit(benchmark::kMillisecond);
    for (bool huge : {false, true})
        for (int threads : {1, 2})
            add(std::string("memory_read/") + (huge ? "huge_pages" : "small_pages") + "/threads:" + std::to_string(threads), memory_read,
                threads, huge)
                ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
