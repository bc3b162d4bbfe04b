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

// Where the audit is, for a progress line: step `step` (1-based index of
// `steps`), node `node` (1-based of `nodes`; 0 = the step is starting). The
// node is the one computing now: reported whenever the step's calls move to
// another node (steps may alternate, e.g. reference then candidate per token).
struct AuditProgress {
    std::string step;
    int step_index = 0, steps = 0;
    std::string node;
    int node_index = 0, nodes = 0;
};

struct AuditConfig {
    const Protocol* protocol = nullptr;  // required
    const Model* model = nullptr;        // required
    Gate gate = Gate::sensitive;
    // Overrides the protocol's seed (seeded op inputs, seeded perturbations).
    // The report records the seed actually used next to the protocol's hash.
    std::optional<std::uint64_t> seed;
    // Called at the start of each step and whenever computing moves to
    // another node. Optional; must not throw.
    std::function<void(const AuditProgress&)> progress;
    // Read the weights the steps will use before the first step (the "load"
    // phase of the timings) unless they exceed half the memory available.
    // Off: weights are read lazily by the first computation that touches
    // them (results are the same either way).
    bool load_first = true;
    // Nodes that were asked for but could not be created (a device that
    // failed to initialise, an OpenCL program that did not build): judged
    // as error, listed after the nodes that ran. Each needs errors set.
    std::vector<NodeInput> failed_nodes;
    // Contrast nodes: shown with their verdict but not gated (exit_code()
    // ignores them) — the cpu:acc=f16 precision-mismatch node the default
    // run shows unless the user names it.
    std::vector<std::string> contrast_nodes;
    // Steps to run and judge (a subset of the protocol's, any order; run in
    // protocol order); empty: every step the protocol runs. The report names
    // them (ProtocolRef::steps_judged); other steps' tolerances are not
    // applied. Error(bad_input) for a step the protocol does not run.
    std::vector<std::string> only_steps;
};

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

// The steps a run asked for (`option` names where: "--steps",
// "--only-steps"), validated against the protocol and put in protocol
// order; empty stays empty (every step). Error(bad_input) "<option>:
// protocol '<id>' does not run step "<name>" (it runs: …)" for a name the
// protocol does not run (unknown names included: they come from the user).
std::vector<std::string> select_steps(const Protocol& protocol, const std::vector<std::string>& asked, const char* option);
// `steps` empty: every step. Otherwise whether `step` is among them.
bool step_selected(const std::vector<std::string>& steps, std::string_view step);
// A tier's tolerances restricted to the criteria of `steps` (empty: all):
// a subset run judges only what it measured.
Tolerances tolerances_of_steps(const Tolerances& tier, const std::vector<std::string>& steps);

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
