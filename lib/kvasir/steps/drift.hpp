// Protocol step 2 — layer-boundary drift.
//
// How the residual stream of each candidate drifts away from the reference
// with depth. The reference runs the whole prompt once with its own router;
// its routing plan is then imposed on every candidate (router authority), so
// that what is measured is pure arithmetic error, never a different choice of
// experts (routing flips are step 4's subject). Two views per layer l:
//
//  * free-running: the candidate carries its own residual stream through all
//    layers. delta_free(l) = ‖h_cand[l+1] − h_ref[l+1]‖₂ / ‖h_ref[l+1]‖₂ over
//    the whole [T, H] residual after layer l: the ACCUMULATED error of layers
//    0 … l (what the next layer, and finally lm_head, actually receives).
//  * re-anchored: layer l is fed the reference's input of layer l
//    (ForwardOptions::anchor_inputs = the reference's hidden states), so
//    delta_anchored(l) is the LOCAL error of layer l alone. A layer whose
//    local error is much larger than its neighbours' is where precision is
//    lost; free-running ≫ anchored means the error is amplified downstream.
//
// Growth with depth. Δ(L) ∝ L^α is fitted by least squares in log-log space
// over depths d = 1 … L (d = l + 1) of the FREE-running deltas
// (fit_power_law: layers with a delta of exactly 0 are excluded and counted).
// α ≈ 0.5 says errors of successive layers add incoherently (√L); α ≈ 1
// coherent, linear growth; α ≈ 0 a fixed error that depth neither grows nor
// damps (e.g. one dominant early layer). R² says how well a power law
// describes the curve at all — with the fixtures' 3–4 layers the fit has 1–2
// degrees of freedom and R² is a rough guide, not a test statistic.
// Measured on the fixtures (cpu, cpu:acc=f16, cpu:storage=bf16, opencl vs
// cpu-ref): α ≈ 0.2 on qwen3_moe_tiny (layer 0 contributes most of the
// error) and α ≈ 0.4–0.5 on mixtral_tiny — sub-linear, as incoherent
// per-layer errors under F32 boundaries should be.
//
// "Where it went wrong": the first layer whose free-running delta exceeds
// `threshold` (default 1e-3, a relative residual error), and the first
// layer whose LOCAL (anchored) delta does; −1 when none does.
#pragma once

#include "kvasir/steps/protocol_steps.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvasir {

struct DriftConfig : StepCommon {
    double threshold = 1e-3;  // relative residual delta; > 0
    void validate() const;    // StepCommon::validate + threshold finite and > 0
};

struct LayerDrift {
    std::int64_t layer = 0;     // 0-based decoder layer; depth = layer + 1
    bool moe = false;
    double free_rel = 0;        // ‖Δ‖₂/‖ref‖₂ of the residual after this layer, free-running
    double free_max_abs = 0;    // max|Δ| of the same
    double free_cosine = 1;     // cosine of the same (flattened [T, H])
    double anchored_rel = 0;    // re-anchored (local error of this layer)
    double anchored_max_abs = 0;
};

struct NodeDrift {
    std::string node;
    std::string error;                // non-empty: this node's run threw; nothing else is set
    double embedding_rel = 0;         // hidden[0] (the embedding gather: exact widening, 0 unless a backend rounds it)
    std::vector<LayerDrift> layers;   // one per decoder layer
    PowerFit fit;                     // Δ_free(d) ∝ d^α over d = 1 … L
    double alpha = 0;                 // growth_alpha of the fit: as the audit judges it (0: no growth)
    std::int64_t first_over = -1;     // first layer with free_rel > threshold (−1: none)
    std::int64_t first_over_local = -1;  // first layer with anchored_rel > threshold
    double logits_rel = 0;            // ‖Δ logits‖₂/‖ref logits‖₂ at the end of the free run
};

struct DriftReport {
    DriftConfig config;
    std::vector<Capabilities> nodes;
    std::size_t reference = 0;
    std::vector<NodeDrift> results;   // one per candidate (every node but the reference), in node order
    std::vector<SelfCheck> repeat;    // one per node (reference included) when config.repeat
};

// Runs step 2 (see the top of this file). Throws what config.validate()
// throws, and the reference's own errors.
DriftReport run_drift(const DriftConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference);

// Schema "kvasir-equiv/drift/1": schema, tool, config {common…, threshold,
// routing}, reference, nodes[], results[{node, error | embedding_rel,
// layers[{layer, depth, moe, free{rel, max_abs, cosine}, anchored{rel,
// max_abs}}], alpha, fit{alpha, c, r2, points_used, points_excluded}, first_over,
// first_over_local, logits_rel}], repeat[].
nlohmann::ordered_json to_json(const DriftReport& report);

}  // namespace kvasir
