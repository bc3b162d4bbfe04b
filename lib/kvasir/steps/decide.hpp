// Protocol step 4 — decision agreement.
//
// The network makes two kinds of discrete decisions: which experts each MoE
// layer routes a token to, and which token the decoder emits. Both flip
// only where the quantity being compared is closer than the error. This
// step counts the flips.
//
// Runs. The reference runs the prompt with its own router (its routing is
// the plan an authority would dispatch). Every candidate runs the prompt
// twice:
//   * WITHOUT authority — its own router (ForwardOptions::routing = null):
//     what happens if every node re-runs the router;
//   * WITH authority — the reference's plan imposed: the swarm's rule.
//     Routing agreement is then 100% by construction; it is MEASURED here
//     anyway (compare_indices on the routing actually used), so the report
//     shows both side by side — the evidence for why authority is needed.
//
// Per MoE layer (without authority): exact top-k SET match rate and mean set
// overlap |A∩B|/k over tokens (compare_indices: order within a row is not a
// decision). Border tokens: the reference's router gap (k-th minus (k+1)-th
// selection score, router_gaps()) below `border` (default 1e-3, the scale
// of the per-op error); the number of them whose expert set flipped; flips
// at non-border tokens are counted separately (they come from upstream
// flips changing the layer's input, or from an error larger than `border`).
// Without authority layer l's input already carries the consequences of
// flips in layers < l: that cascade is part of what is measured.
//
// Top-1 agreement: argmax of the prompt logits at every position vs the
// reference's, with the binomial σ = sqrt(r(1−r)/T) — both with and without
// router authority.
//
// perturb_router (the CLI's --perturb-router EPS; 0 = off): the candidates'
// router logits get seeded noise uniform in [−EPS, EPS] (kvasir RNG, stream
// "decide/perturb-router/<n>" for the n-th router call of a forward pass —
// the n-th MoE layer — so every run sees the same noise) BEFORE their
// top-k. It stands in for a backend whose router logits are off by ~EPS
// (a lower-precision router, another reduction order) on a model whose
// border tokens a natural backend would not flip. It only acts where a
// backend decides for itself: with router authority there is no top-k to
// perturb, and the agreement stays 100% — which is the point.
#pragma once

#include "kvasir/backend/forwarding.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvasir {

struct DecideConfig : StepCommon {
    double border = 1e-3;        // router gap below which a token is a border token; > 0
    double perturb_router = 0;   // noise amplitude on the candidates' router logits; ≥ 0 (0: off)
    void validate() const;       // StepCommon::validate + the two ranges; the model must have a MoE layer
};

// The reference's router gaps of one MoE layer (shared by every candidate).
struct RouterGapsLayer {
    std::int64_t layer = 0;
    std::vector<double> gaps;                 // per token
    std::vector<std::int64_t> border_tokens;  // tokens with gap < border, ascending
};

struct LayerAgreement {
    std::int64_t layer = 0;
    IndexAgreement free;                  // without authority
    IndexAgreement pinned;                // with authority (100% by construction)
    std::int64_t border_tokens = 0;       // reference gap < border
    std::int64_t border_flipped = 0;      // border tokens whose expert set differs without authority
    std::int64_t other_flipped = 0;       // non-border tokens whose set differs without authority
    std::int64_t pinned_flipped = 0;      // rows differing with authority (0 by construction)
    std::vector<std::int64_t> flipped_tokens;  // every token whose set differs without authority
};

struct NodeDecide {
    std::string node;
    std::string error;
    Fraction top1_free;    // top-1 agreement without router authority
    Fraction top1_pinned;  // with router authority
    std::vector<LayerAgreement> layers;  // MoE layers only, ascending
    // Totals over MoE layers.
    IndexAgreement routing_free, routing_pinned;  // pooled over (layer, token) rows
    std::int64_t border_tokens = 0, border_flipped = 0, other_flipped = 0, pinned_flipped = 0;
};

struct DecideReport {
    DecideConfig config;
    std::vector<Capabilities> nodes;
    std::size_t reference = 0;
    std::vector<RouterGapsLayer> reference_gaps;  // MoE layers of the reference's own run
    std::vector<NodeDecide> results;              // one per candidate, in node order
    std::vector<SelfCheck> repeat;                // per node: the run WITHOUT authority twice (routing rows compared too)
};

DecideReport run_decide(const DecideConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference);

// A backend that forwards every op to `inner` and adds the seeded router
// noise described at the top of this file in route(). reset() restarts the
// router-call counter: call it before every forward pass so that the n-th
// MoE layer always sees the same noise. capabilities() are inner's with an
// extra ("perturb_router", EPS). `inner` must outlive it.
class RouterPerturbedBackend : public ForwardingBackend {
public:
    RouterPerturbedBackend(Backend& inner, double eps, std::uint64_t seed);
    void reset() { calls_ = 0; }
    const Capabilities& capabilities() const override { return caps_; }
    RouterOutput route(const TensorView& logits, const RouterParams& params) override;

private:
    double eps_;
    std::uint64_t seed_;
    int calls_ = 0;
    Capabilities caps_;
};

// Schema "kvasir-equiv/decide/1": schema, tool, config {common…, border,
// perturb_router}, reference, nodes[], reference_routing[{layer, gaps[],
// border_tokens[]}], results[{node, error | top1{without_authority{Fraction},
// with_authority{Fraction}}, routing{without_authority{IndexAgreement},
// with_authority{IndexAgreement}}, border_tokens, border_flipped,
// other_flipped, pinned_flipped, layers[{layer, without_authority{…},
// with_authority{…}, border_tokens, border_flipped, other_flipped,
// pinned_flipped, flipped_tokens[]}]}], repeat[].
nlohmann::ordered_json to_json(const DecideReport& report);

}  // namespace kvasir
