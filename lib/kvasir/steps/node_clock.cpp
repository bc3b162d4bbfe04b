#include "kvasir/steps/node_clock.hpp"

#include "kvasir/backend/forwarding.hpp"

#include <chrono>
#include <optional>

namespace kvasir {

struct NodeClock::Shared {
    std::vector<double> seconds;
    std::optional<std::size_t> current;
    OnSwitch on_switch;
};

namespace {

class TimedBackend final : public ForwardingBackend {
public:
    TimedBackend(Backend& inner, std::size_t index, std::shared_ptr<NodeClock::Shared> shared)
        : ForwardingBackend(inner), index_(index), shared_(std::move(shared)) {}

private:
    template <class F>
    auto timed(F&& f) {
        NodeClock::Shared& s = *shared_;
        if (s.current != index_) {
            s.current = index_;
            if (s.on_switch) s.on_switch(index_);
        }
        const auto t0 = std::chrono::steady_clock::now();
        struct Add {  // also when the node throws: the time was spent
            NodeClock::Shared& s;
            std::size_t i;
            std::chrono::steady_clock::time_point t0;
            ~Add() { s.seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
        } add{s, index_, t0};
        return f();
    }

public:
    Tensor matmul(const TensorView& x, const TensorView& w) override {
        return timed([&] { return inner().matmul(x, w); });
    }
    Tensor swiglu(const TensorView& g, const TensorView& u) override {
        return timed([&] { return inner().swiglu(g, u); });
    }
    Tensor clamped_swiglu(const TensorView& g, const TensorView& u, double a, double l) override {
        return timed([&] { return inner().clamped_swiglu(g, u, a, l); });
    }
    Tensor softmax(const TensorView& x) override { return timed([&] { return inner().softmax(x); }); }
    Tensor sigmoid(const TensorView& x) override { return timed([&] { return inner().sigmoid(x); }); }
    Tensor rmsnorm(const TensorView& x, const TensorView& w, double eps) override {
        return timed([&] { return inner().rmsnorm(x, w, eps); });
    }
    Tensor rope(const TensorView& x, std::span<const std::int64_t> pos, const RopeParams& p) override {
        return timed([&] { return inner().rope(x, pos, p); });
    }
    RouterOutput route(const TensorView& logits, const RouterParams& params) override {
        return timed([&] { return inner().route(logits, params); });
    }
    Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                     const std::vector<bool>* filter = nullptr) override {
        return timed([&] { return inner().moe_block(x, experts, plan, filter); });
    }
    Tensor add(const TensorView& a, const TensorView& b) override { return timed([&] { return inner().add(a, b); }); }
    Tensor mul(const TensorView& a, const TensorView& b) override { return timed([&] { return inner().mul(a, b); }); }
    Tensor scale(const TensorView& x, double s) override { return timed([&] { return inner().scale(x, s); }); }
    std::optional<Tensor> kv_rows(const TensorView* cache, std::int64_t keep, const TensorView& rows) override {
        return timed([&] { return inner().kv_rows(cache, keep, rows); });
    }
    using Backend::copy_columns;
    Tensor copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) override {
        return timed([&] { return inner().copy_columns(x, c0, n, step); });
    }
    Tensor last_rows(const TensorView* prev, const TensorView& x, std::int64_t n) override {
        return timed([&] { return inner().last_rows(prev, x, n); });
    }
    Tensor join_columns(std::span<const TensorView> parts) override {
        return timed([&] { return inner().join_columns(parts); });
    }
    Tensor repeat_columns(const TensorView& x, std::int64_t times) override {
        return timed([&] { return inner().repeat_columns(x, times); });
    }

private:
    std::size_t index_;
    std::shared_ptr<NodeClock::Shared> shared_;
};

}  // namespace

NodeClock::NodeClock(const std::vector<std::unique_ptr<Backend>>& nodes, OnSwitch on_switch)
    : shared_(std::make_shared<Shared>()) {
    shared_->seconds.assign(nodes.size(), 0.0);
    shared_->on_switch = std::move(on_switch);
    for (std::size_t i = 0; i < nodes.size(); ++i) timed_.push_back(std::make_unique<TimedBackend>(*nodes[i], i, shared_));
}

NodeClock::~NodeClock() = default;

void NodeClock::new_phase() { shared_->current.reset(); }

void load_phase(const Model& model, std::span<const std::int64_t> layers, bool globals, RunTimings& t) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t l : layers) t.load_bytes += model.load_layer(l);
    if (globals) t.load_bytes += model.load_globals();
    t.load_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.loaded = true;
}

void record_node_counters(const std::vector<std::unique_ptr<Backend>>& nodes, RunTimings& t) {
    for (const auto& n : nodes) {
        if (const auto s = n->weight_cache_stats()) t.weight_caches.emplace_back(n->capabilities().node, *s);
        if (const auto s = n->transfer_stats()) t.transfers.push_back({n->capabilities().node, *s, {}});
    }
}

double NodeClock::seconds(std::size_t i) const { return shared_->seconds.at(i); }

}  // namespace kvasir
