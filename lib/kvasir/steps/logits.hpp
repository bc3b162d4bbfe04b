// Protocol step 3 — end-to-end logit divergence.
//
// A full forward pass over the prompt on every node; the candidate's logits
// [T, V] are compared with the reference's position by position (position t
// = the next-token distribution after tokens 0 … t):
//   L∞(t)  = max_v |Δ logit|      — the worst single logit
//   L2(t)  = ‖Δ logit‖₂           — the whole row
//   KL(t)  = KL(P_ref ‖ P_cand)   — what sampling sees: the extra surprise, in
//                                   nats, of drawing from the candidate's
//                                   distribution when the reference's is true
// each summarised over positions (mean, median, p90, p99, p99.9, max; with
// the fixtures' 24 positions p99 and p99.9 interpolate between the two
// largest values), and the RMS over positions of Δp(top) = P_cand(a_t) −
// P_ref(a_t), a_t the reference's argmax: how much probability the
// reference's choice gains or loses (what a greedy decoder's margin must
// absorb).
//
// Routing: by default every candidate runs with the reference's routing
// plan (router authority — how a swarm runs, so the figures are the
// arithmetic error the deployment sees). With router_authority = false each
// candidate runs its own router: a routing flip on a border token then shows
// up as a large local KL (step 4 counts the flips).
#pragma once

#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvasir {

struct LogitsConfig : StepCommon {
    bool router_authority = true;
    void validate() const { StepCommon::validate(); }
};

struct NodeLogits {
    std::string node;
    std::string error;                  // non-empty: this node's run threw
    PositionDivergence positions;       // per position linf, l2, kl, dp_top
    Summary linf, l2, kl;               // summaries over positions
    double top_dp_rms = 0;              // RMS over positions of dp_top
    CompareStats stats;                 // whole [T, V] logits tensor (max|Δ|, cosine, ...)
};

struct LogitsReport {
    LogitsConfig config;
    std::vector<Capabilities> nodes;
    std::size_t reference = 0;
    std::vector<NodeLogits> results;  // one per candidate, in node order
    std::vector<SelfCheck> repeat;    // one per node when config.repeat
};

LogitsReport run_logits(const LogitsConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference);

// Schema "kvasir-equiv/logits/1": schema, tool, config {common…, routing},
// reference, nodes[], results[{node, error | linf{summary}, l2{summary},
// kl{summary}, top_dp_rms, stats{CompareStats}, positions{linf[], l2[],
// kl[], dp_top[]}}], repeat[].
nlohmann::ordered_json to_json(const LogitsReport& report);

}  // namespace kvasir
