// What bench_cpu and bench_opencl share so that their tables line up: the
// Qwen3-30B-A3B shapes, the seeded inputs (made once per name, shape and
// dtype), the 128 seeded experts, the Qwen router's parameters, the GFLOP/s
// counter and benchmark registration.
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/rng.hpp"

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvasir::bench {

constexpr std::int64_t kHidden = 2048, kExpertFfn = 768, kExperts = 128, kTopK = 8;
constexpr std::int64_t kHeads = 32, kKvHeads = 4, kHeadDim = 128;

inline benchmark::Counter gflops(double flops) {
    return benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// Seeded N(0, stddev²) tensors, made once per (name, shape, dtype); other
// dtypes are the f32 values converted.
inline const Tensor& input(const std::string& name, const Shape& shape, double stddev, DType dtype = DType::f32) {
    static std::map<std::string, Tensor> cache;
    std::string key = name + "/" + dtype_name(dtype);
    for (auto d : shape) {
        key += 'x';  // (not "x" + to_string: GCC 12's false -Wrestrict)
        key += std::to_string(d);
    }
    auto it = cache.find(key);
    if (it == cache.end()) {
        Tensor t = seeded_normal(1, name, shape, 0, stddev);
        if (dtype != DType::f32) t = Tensor::convert(t, dtype);
        it = cache.emplace(key, std::move(t)).first;
    }
    return it->second;
}

inline RouterParams qwen_router() {
    RouterParams p;
    p.top_k = int(kTopK);
    p.scoring = RouterScoring::softmax;
    p.renormalize = true;  // Qwen3-MoE: norm_topk_prob
    return p;
}

// 128 experts, weights ~ N(0, 1/fan_in), in f32 or converted to `dtype`;
// made once per dtype (2.4 GB in f32, 1.2 GB in bf16).
inline const std::vector<ExpertWeights>& experts(DType dtype) {
    static std::map<DType, std::pair<std::vector<Tensor>, std::vector<ExpertWeights>>> cache;
    auto& [store, views] = cache[dtype];
    if (views.empty()) {
        const auto make = [dtype](const std::string& name, Shape shape, double stddev) {
            Tensor t = seeded_normal(1, name, std::move(shape), 0, stddev);
            if (dtype == DType::f32) return t;
            return Tensor::convert(t, dtype);
        };
        for (std::int64_t e = 0; e < kExperts; ++e) {
            const std::string id = std::to_string(e);
            store.push_back(make("moe/gate" + id, {kExpertFfn, kHidden}, 1 / std::sqrt(double(kHidden))));
            store.push_back(make("moe/up" + id, {kExpertFfn, kHidden}, 1 / std::sqrt(double(kHidden))));
            store.push_back(make("moe/down" + id, {kHidden, kExpertFfn}, 1 / std::sqrt(double(kExpertFfn))));
        }
        for (std::int64_t e = 0; e < kExperts; ++e)
            views.push_back({store[std::size_t(3 * e)], store[std::size_t(3 * e + 1)], store[std::size_t(3 * e + 2)]});
    }
    return views;
}

// Flops of the routed experts: T·top-k tokens × 3 matmuls of 2048×768.
inline double moe_flops(std::int64_t T) { return 2.0 * double(T * kTopK) * 3.0 * double(kHidden * kExpertFfn); }

inline std::string shape_name(std::int64_t T, std::int64_t N, std::int64_t K) {
    return "/T:" + std::to_string(T) + "/N:" + std::to_string(N) + "/K:" + std::to_string(K);
}

// Registers `f(state, args...)` under `name`, timed on the wall clock.
template <typename F, typename... Args>
benchmark::internal::Benchmark* add(const std::string& name, F f, Args... args) {
    return benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { f(s, args...); })->UseRealTime();
}

// The element-wise and row ops each program times.
enum class RowOp { softmax, rmsnorm, swiglu, sigmoid, add, mul, scale };

// The row ops at T = 128 tokens, at the shapes a Qwen3-30B-A3B layer runs
// them: router and attention softmax, hidden and q/k RMSNorm, the routed
// experts' SwiGLU, the router sigmoid, RoPE on q and k, the router's top-8;
// add / mul / scale where forward.cpp uses them: the residual and
// shared-expert adds and the shared-expert gate over [T, hidden], attention's
// 1/√d on the [heads·T, S] scores.
// row_op(state, spec, RowOp, Shape), rope(state, spec, T, heads) and
// route(state, spec, T) are the calling program's own benchmark bodies.
template <typename RowOpFn, typename RopeFn, typename RouteFn>
void add_row_ops(const std::string& spec, RowOpFn row_op, RopeFn rope, RouteFn route) {
    constexpr std::int64_t T = 128;
    add("softmax/" + spec + "/router:128x128", row_op, spec, RowOp::softmax, Shape{T, kExperts});
    add("softmax/" + spec + "/attention:4096x128", row_op, spec, RowOp::softmax, Shape{kHeads * T, T});
    add("rmsnorm/" + spec + "/hidden:128x2048", row_op, spec, RowOp::rmsnorm, Shape{T, kHidden});
    add("rmsnorm/" + spec + "/qk_norm:4096x128", row_op, spec, RowOp::rmsnorm, Shape{kHeads * T, kHeadDim});
    add("swiglu/" + spec + "/routed:1024x768", row_op, spec, RowOp::swiglu, Shape{T * kTopK, kExpertFfn});
    add("sigmoid/" + spec + "/router:128x128", row_op, spec, RowOp::sigmoid, Shape{T, kExperts});
    add("rope/" + spec + "/q:128x32x128", rope, spec, T, kHeads);
    add("rope/" + spec + "/k:128x4x128", rope, spec, T, kKvHeads);
    add("route/" + spec + "/softmax_top8:128x128", route, spec, T);
    add("add/" + spec + "/residual:128x2048", row_op, spec, RowOp::add, Shape{T, kHidden});
    add("mul/" + spec + "/shared_gate:128x2048", row_op, spec, RowOp::mul, Shape{T, kHidden});
    add("scale/" + spec + "/attention:4096x128", row_op, spec, RowOp::scale, Shape{kHeads * T, T});
}

}  // namespace kvasir::bench
