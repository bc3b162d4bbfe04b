// A node whose own router sees noisy logits: the decide command's
// --perturb-router EPS (0 = off; audit/step_decide.cpp).
//
// The candidates' router logits get seeded noise uniform in [−EPS, EPS]
// (kvasir RNG, stream "decide/perturb-router/<m>" for the m-th MoE layer of
// a forward pass: the m-th route() call modulo the model's MoE layer count,
// so every forward pass — the decide step's free run, the determinism
// step's repeats, every decode step — sees the same noise at the same
// layer) BEFORE their top-k. It stands in for a backend whose router logits
// are off by ~EPS (a lower-precision router, another reduction order) on a
// model whose border tokens a natural backend would not flip. It only acts
// where a backend decides for itself: with router authority there is no
// top-k to perturb, and the agreement stays 100% — which is the point.
#pragma once

#include "kvasir/backend/forwarding.hpp"

#include <cstdint>
#include <memory>

namespace kvasir {

// Owns `inner`, forwards every op to it and adds the noise above in route().
// capabilities() are inner's with an extra ("perturb_router", EPS); the
// node's name is inner's. Error(bad_input) for EPS < 0 or no MoE layer.
class RouterPerturbedBackend : private detail::OwnedInner, public ForwardingBackend {
public:
    // moe_layers: route() calls per forward pass (the model's MoE layers), ≥ 1.
    RouterPerturbedBackend(std::unique_ptr<Backend> inner, double eps, std::uint64_t seed, std::int64_t moe_layers);
    const Capabilities& capabilities() const override { return caps_; }
    RouterOutput route(const TensorView& logits, const RouterParams& params) override;

private:
    double eps_;
    std::uint64_t seed_;
    std::int64_t moe_layers_;
    std::int64_t calls_ = 0;
    Capabilities caps_;
};

}  // namespace kvasir
