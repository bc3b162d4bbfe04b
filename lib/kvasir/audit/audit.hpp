// The audit (SPEC §2–§3): run every step a protocol names on every node,
// turn what each step measured into verdict Measurements, judge them against
// the protocol's two tiers, and assemble the AuditReport the writers render.
//
// Each step is one object (step.hpp): the authority decides, every node
// collects, the step compares. Steps run in protocol order: ops → drift →
// logits → decide → generate → perplexity → determinism. What happens when
// something fails (one policy: node_failure, core/error.hpp):
//   * a candidate fails in a step (kvasir::Error other than internal,
//     std::bad_alloc): that step's error is recorded for that node (verdict
//     error) and the audit goes on;
//   * the reference fails in a step: the error is recorded on the reference
//     and, as "not compared: the reference failed", on every candidate for
//     that step (nothing compared is never a pass), and the audit goes on
//     with the next step. exit_code() is then 1;
//   * the reference computes NaN/Inf: Error(bad_input) naming the model's
//     non-finite weight (layer and tensor), or the reference's tensor —
//     nothing is judged against a broken yardstick (exit 2);
//   * Error(internal), std::logic_error, anything else (a bug of this tool,
//     not of a backend) propagates: exit 3 and nothing written.
// Every step's configuration is checked (token streams read and verified
// against their sha256, ids inside the vocabulary, ...) BEFORE any step runs:
// bad input is exit 2 with nothing half-done.
//
// run_audit() computes every node in this process (--in-process); isolation.hpp
// runs each node in a child process that writes a capture, and compares the
// captures here: a node that crashes, hangs or eats memory is that node's
// error, not the audit's end.
//
// Measurements per candidate (criterion names: protocol.hpp's catalogue):
//   ops          ops.<op>.max_rel, ops.<op>.cosine_min for every op (vs the
//                reference, same seeded inputs); shard.max_rel (the node's own
//                sharded vs monolithic MoE block)
//   drift        drift.final_rel = ‖Δ‖/‖ref‖ of the residual after the last
//                layer (free running); drift.alpha_max = fitted α of the
//                per-layer series — 0 when fewer than two layers have a
//                nonzero delta (a bit-identical node has no growth), NaN when
//                a delta is not finite
//   logits       logits.kl_p99, logits.linf_max (router authority on)
//   decide       decide.top1_agreement_min = top-1 agreement WITH router
//                authority (how the swarm runs: discrete decisions pinned);
//                decide.routing_agreement_min = exact expert-set agreement
//                WITHOUT authority (pooled over MoE layers and tokens)
//   generate     generate.first_divergence_min = first differing greedy token
//                (n when none); generate.divergences_max = argmax differences
//                under teacher forcing
//   perplexity   perplexity.ratio_max = |ppl/ppl_ref − 1|
//   determinism  the full forward pass (own router) run `repeats` times on the
//                node: max over runs 2…R and over logits, final hidden and
//                every hidden state of the guarded max_rel against run 1; 0 =
//                bit-identical. Measured on the reference too (reported in its
//                capabilities, not judged).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/audit/audit_config.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/audit/results.hpp"
#include "kvasir/steps/node_clock.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

struct AuditRun {
    AuditReport report;                  // verdicts, pairs, drift, per-step JSON
    std::vector<std::string> step_order; // the steps that ran, in order
    std::vector<NodeInput> inputs;       // what judge() was given, per node
    // Where the time went (not part of the report: reports are reproducible
    // byte for byte, timings are not). Shown by --timings.
    RunTimings timings;
};

// Runs the protocol's steps on `nodes` (nodes[reference] is the reference).
// Error(bad_input) for a bad configuration (see the top of this file).
AuditRun run_audit(const AuditConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference);


class Capture;  // capture.hpp

struct CompareConfig {
    const Protocol* protocol = nullptr;  // required; its content hash must be every capture's
    Gate gate = Gate::sensitive;
    // Steps to judge (a subset of the protocol's); empty = all the protocol
    // runs. Tolerances of other steps are not applied: an ops-only external
    // node (numpy, torch) is judged on step 1 with --only-steps ops.
    std::vector<std::string> only_steps;
    // As AuditConfig's: nodes that produced no capture (the isolated audit's
    // crashed children), and nodes shown but not gated.
    std::vector<NodeInput> failed_nodes;
    std::vector<std::string> contrast_nodes;
};

// compare: the audit from captures (capture.hpp). The same measurements,
// verdicts, pair matrices and drift series as run_audit() on the same nodes
// with reference cpu-ref. Error(bad_input) naming the capture when captures
// disagree on protocol hash, seed or model fingerprint (model-dependent
// captures only), when two carry the same node name, or when `reference`
// is out of range. A capture without a judged step → that step is an error
// of that node ("not captured"); the reference without it → nothing
// compared for that step.
AuditRun compare_captures(const CompareConfig& config, const std::vector<const Capture*>& captures, std::size_t reference);

// The model block of the report: fingerprint, path, architecture, layers.
nlohmann::ordered_json audit_model_json(const Model& model);

}  // namespace kvasir
