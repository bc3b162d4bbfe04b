// A Backend that forwards every op — the optional ones included, so the
// inner backend's own route/moe_block/add/mul/scale run, not the defaults —
// to another backend it does not own. Decorators derive from it and
// override only what they change (RouterPerturbedBackend: route), and
// capture lends a caller's backend to code that takes owned nodes.
// `inner` must outlive it.
#pragma once

#include "kvasir/backend/backend.hpp"

#include <memory>

namespace kvasir {

namespace detail {
// A decorator that owns the node it wraps derives from this first, so the
// node is constructed before the ForwardingBackend that refers to it.
struct OwnedInner {
    std::unique_ptr<Backend> inner;
};
}  // namespace detail

class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
    const Capabilities& capabilities() const override { return inner_.capabilities(); }
    std::optional<WeightCacheStats> weight_cache_stats() const override { return inner_.weight_cache_stats(); }
    std::optional<TransferStats> transfer_stats() const override { return inner_.transfer_stats(); }
    std::optional<std::int64_t> injected_faults() const override { return inner_.injected_faults(); }
    Tensor matmul(const TensorView& x, const TensorView& w) override { return inner_.matmul(x, w); }
    Tensor swiglu(const TensorView& g, const TensorView& u) override { return inner_.swiglu(g, u); }
    Tensor clamped_swiglu(const TensorView& g, const TensorView& u, double a, double l) override {
        return inner_.clamped_swiglu(g, u, a, l);
    }
    Tensor softmax(const TensorView& x) override { return inner_.softmax(x); }
    Tensor sigmoid(const TensorView& x) override { return inner_.sigmoid(x); }
    Tensor rmsnorm(const TensorView& x, const TensorView& w, double eps) override { return inner_.rmsnorm(x, w, eps); }
    Tensor rope(const TensorView& x, std::span<const std::int64_t> pos, const RopeParams& p) override {
        return inner_.rope(x, pos, p);
    }
    RouterOutput route(const TensorView& logits, const RouterParams& params) override { return inner_.route(logits, params); }
    Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                     const std::vector<bool>* filter = nullptr) override {
        return inner_.moe_block(x, experts, plan, filter);
    }
    Tensor add(const TensorView& a, const TensorView& b) override { return inner_.add(a, b); }
    Tensor mul(const TensorView& a, const TensorView& b) override { return inner_.mul(a, b); }
    Tensor scale(const TensorView& x, double s) override { return inner_.scale(x, s); }
    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* h) override {
        return inner_.causal_conv1d_silu(x, w, h);
    }
    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override { return inner_.gated_delta_rule(in); }
    Tensor run_attention(const TensorView& q, std::span<const TensorView> k, std::span<const TensorView> v, double s,
                         const TensorView* sinks) override {
        return sinks != nullptr ? inner_.causal_attention_sinks(q, k, v, s, *sinks) : inner_.causal_attention(q, k, v, s);
    }
    std::optional<Tensor> kv_rows(const TensorView* cache, std::int64_t keep, const TensorView& rows) override {
        return inner_.kv_rows(cache, keep, rows);
    }
    using Backend::copy_columns;
    Tensor copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) override {
        return inner_.copy_columns(x, c0, n, step);
    }
    Tensor last_rows(const TensorView* prev, const TensorView& x, std::int64_t n) override {
        return inner_.last_rows(prev, x, n);
    }
    Tensor join_columns(std::span<const TensorView> parts) override { return inner_.join_columns(parts); }
    Tensor repeat_columns(const TensorView& x, std::int64_t times) override { return inner_.repeat_columns(x, times); }

protected:
    Backend& inner() { return inner_; }

private:
    Backend& inner_;
};

}  // namespace kvasir
