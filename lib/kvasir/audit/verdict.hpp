// Verdicts: turn the numbers the protocol steps measured on each node into
// fit / unfit-sensitive / unfit / error, and the verdicts into a CI exit code.
//
// The engine knows nothing about how a number was measured: a step hands it
// Measurements {criterion, step, value} per node, the protocol hands it the
// tolerances of the two tiers, and it applies these rules (SPEC §3):
//
//  * A criterion passes iff the value is finite and within(value, tol)
//    (direction max) or at_least(value, tol) (direction min) — NaN and ±Inf
//    never pass.
//  * Which criteria are judged, per tier: every tolerance of the tier, plus
//    every measured per-op figure "ops.<op>.<metric>" (judged against its own
//    tolerance when the tier has one, else against the family "ops.<metric>").
//    A tolerance with no measurement is a FAILED criterion (value NaN,
//    measured = false): nothing compared is never a pass. The family
//    tolerance "ops.<metric>" counts as measured when "ops.<metric>" itself
//    or any "ops.<op>.<metric>" was measured. A measured criterion for which
//    the tier has no tolerance (an optional one, e.g. routing agreement in a
//    tier that omits it) is not judged in that tier.
//  * A criterion that does not apply to the audited model (routing agreement
//    on a dense model: no router) is not judged when the step that owns it
//    declared it so (NodeInput::not_applicable, set for every node from the
//    reference's outputs) and nothing measured it; the verdict lists it with
//    the reason. The same holds for one node alone when what the node IS
//    rules a measurement out, decided by the compare from the node's capture
//    metadata, never from its numbers: a step its writer declared not
//    captured (an external runtime exposes no single ops or hidden states),
//    a pinned measurement of a node that runs its own router (capability
//    authority "none"): NodeInput::not_measurable. A family tolerance
//    ("ops.max_rel") not measurable covers its per-op keys when nothing of
//    the family was measured (a family is never skipped as merely "not
//    applicable"). A node left with no judged criterion at all is error
//    ("no criterion could be judged"): nothing compared is never a pass.
//  * The same criterion measured several times (e.g. once per layer) is
//    judged on the WORST value: the largest for max, the smallest for min,
//    NaN over everything.
//  * error: the node has a step error (it threw, crashed, timed out), or any
//    measured value is NaN/±Inf. Steps compare with metrics::compare(), which
//    excludes positions non-finite on BOTH sides, so a non-finite
//    measurement means a NaN/Inf where the reference had none. (Consequence
//    for producers: a figure that is legitimately undefined — e.g. the
//    growth exponent of a drift that is identically zero — must be reported
//    as a finite value, 0 for α, not NaN.)
//  * fit: every criterion of both tiers passes (the parser guarantees the
//    sensitive tier is at least as strict as the tolerant one).
//  * unfit-sensitive: every tolerant criterion passes, some sensitive one
//    fails — the node can still serve tolerant ranks (expert workers).
//  * unfit: some tolerant criterion fails.
//  * reference: the reference node is reported (capabilities, errors, its own
//    measurements are ignored) but not judged.
//
// Exit code for CI (exit_code()): 0 iff at least one node was judged and every
// judged node meets the gate (sensitive: fit; tolerant: fit or
// unfit-sensitive; none: anything, error nodes included) and no reference
// node has a step error (the gate none excepted); 1 otherwise. Zero judged
// nodes → 1 under every gate: nothing compared is never a pass.
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/audit/protocol.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// One number measured on one node (against the reference).
struct Measurement {
    std::string criterion;  // a catalogue name (find_criterion() must know it)
    std::string step;       // the step that measured it ("logits"); for reports
    double value = 0;
};

// One criterion judged in one tier.
struct CriterionResult {
    std::string criterion;
    std::string step;
    double value = 0;      // the measured value (NaN when not measured)
    double tolerance = 0;  // the tier's tolerance (per-op, else family)
    std::string tolerance_from;  // the tolerance key used ("ops.max_rel" for ops.matmul.max_rel)
    std::string why;             // the tolerance's justification
    Direction direction = Direction::max;
    MarginScale scale = MarginScale::log;
    bool measured = false;
    bool pass = false;
    // Distance to the tolerance, positive inside, negative outside, in
    // margin_unit(scale) (see MarginScale). NaN when value is NaN or missing.
    double margin = 0;
    // The tightest tolerance that would still have passed: the measured
    // value itself (NaN when none would: NaN passes nothing).
    double tightest_passing = 0;
    Tier tier = Tier::sensitive;
};

enum class Verdict { reference, fit, unfit_sensitive, unfit, error };
const char* to_string(Verdict v) noexcept;  // "reference", "fit", "unfit-sensitive", "unfit", "error"

enum class Gate { sensitive, tolerant, none };
const char* to_string(Gate g) noexcept;  // "sensitive", "tolerant", "none"
// Error(bad_input) naming the accepted values for anything else.
Gate parse_gate(std::string_view text);

// What the steps produced for one node.
struct NodeInput {
    std::string node;                   // canonical spec, e.g. "cpu:acc=f16"
    nlohmann::ordered_json capabilities = nlohmann::ordered_json::object();  // to_json(Capabilities) or a capture's
    bool is_reference = false;
    // Shown with its verdict but not gated: exit_code() ignores it (the
    // default run's precision-mismatch contrast, cpu:acc=f16).
    bool contrast = false;
    std::vector<Measurement> measurements;
    std::map<std::string, std::string> errors;  // step → one-line message
    // Criteria that do not apply to the audited model → why ("no MoE layers").
    std::map<std::string, std::string> not_applicable;
    // Criteria this node alone cannot be measured on → why (a step its writer
    // declared not captured, a pinned measurement of a free-running node).
    std::map<std::string, std::string> not_measurable;
};
// node + to_json(caps).
NodeInput node_input(const Capabilities& caps, bool is_reference = false);
// Sets `contrast` on the inputs whose node is named in `contrast_nodes`.
void mark_contrast(std::vector<NodeInput>& inputs, const std::vector<std::string>& contrast_nodes);

struct NodeVerdict {
    std::string node;
    // The input capabilities plus "determinism_measured": {"bit_identical",
    // "run_to_run_max_rel"} from the "determinism" measurement (null when
    // not measured).
    nlohmann::ordered_json capabilities;
    Verdict verdict = Verdict::error;
    bool contrast = false;  // not gated (NodeInput::contrast)
    // The criterion that explains the verdict: fit → the sensitive criterion
    // with the least margin (decade-scaled criteria first: a linear margin
    // such as "no divergence within n tokens" says nothing about closeness);
    // unfit-sensitive → the sensitive criterion furthest outside; unfit →
    // the tolerant criterion furthest outside; error → the first non-finite
    // or unmeasured criterion, if any. Absent for the reference and for an
    // error node without criteria.
    std::optional<CriterionResult> worst;
    std::vector<CriterionResult> sensitive;  // in criterion-name order
    std::vector<CriterionResult> tolerant;
    std::map<std::string, std::string> errors;  // step → message (incl. non-finite measurements)
    std::map<std::string, std::string> not_applicable;  // criterion → why, not judged (NodeInput::not_applicable)
    std::map<std::string, std::string> not_measurable;  // criterion → why, not judged on this node (NodeInput)

    const std::vector<CriterionResult>& tier(Tier t) const { return t == Tier::sensitive ? sensitive : tolerant; }
};

// The criteria that do not apply to the audited model (the same for every
// node: verdict.hpp's rule), from the first judged node; empty if none.
const std::map<std::string, std::string>& not_applicable_criteria(const std::vector<NodeVerdict>& verdicts);
// The criteria not judged on `v` alone (NodeVerdict::not_measurable),
// grouped by reason: why → the criteria (for reports).
std::map<std::string, std::vector<std::string>> not_measurable_by_reason(const NodeVerdict& v);

// Judge one criterion (exposed for tests and for reports that recompute).
CriterionResult judge_criterion(const std::string& criterion, const std::string& step, std::optional<double> value,
                                const Tolerance& tol, const std::string& tolerance_from, Tier tier);

// Judge one node. Error(internal) for a measurement whose criterion is not in
// the catalogue (a misspelt name must be loud, not silently unjudged).
NodeVerdict judge_node(const NodeInput& input, const Tolerances& sensitive, const Tolerances& tolerant);
NodeVerdict judge_node(const NodeInput& input, const Protocol& protocol);
std::vector<NodeVerdict> judge(const std::vector<NodeInput>& inputs, const Protocol& protocol);

// Does this (judged) node meet the gate? The reference always does.
bool meets_gate(const NodeVerdict& v, Gate gate) noexcept;
// 0 or 1, see the top of this file.
int exit_code(const std::vector<NodeVerdict>& verdicts, Gate gate);

// Stable key order: criterion, tier, step, value, tolerance, tolerance_from,
// direction, pass, measured, margin, margin_unit, tightest_passing, why.
nlohmann::ordered_json to_json(const CriterionResult& r);
// node, verdict, capabilities, worst, errors, criteria {sensitive, tolerant}.
nlohmann::ordered_json to_json(const NodeVerdict& v);

// "logits.kl_p99 3.2e-07 > 1.0e-07 (-0.5 decades)" — one line for terminals.
std::string describe(const CriterionResult& r);
// The parts of that line, for reports that lay them out in columns: a value
// or tolerance of this criterion as describe() writes it (integer criteria
// without decimals, cosines and rates as 1-x, linear ones with 3 digits,
// the rest scientific; "nan"/"inf") and its margin ("+1.8 decades",
// "exact" for +inf, "infinitely outside" for -inf, "no margin" for NaN).
std::string format_value(const CriterionResult& r, double x);
std::string format_margin(const CriterionResult& r);

}  // namespace kvasir
