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
//  * A rate criterion (agreement: CriterionInfo::rate) passes iff its
//    one-sided lower confidence bound (the protocol's "statistics") reaches
//    the tolerance; its upper bound below the tolerance is a fail on
//    evidence, neither is "undecided" (not a pass) — see RateJudgement. A
//    tolerance of 1 asks that every trial agree (a count, not a rate).
//  * The same criterion measured several times (e.g. once per layer) is
//    judged on the WORST value: the largest for max, the smallest for min,
//    NaN over everything.
//  * error: the node has a step error (it threw, crashed, timed out), or any
//    measured value is NaN/±Inf, or it is a fault-injecting node whose fault
//    never fired in the steps compared (NodeInput::faults_fired). Steps compare with metrics::compare(), which
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
#include <utility>
#include <vector>

namespace kvasir {

// A rate criterion's counts: `successes` of `trials` (value = their ratio).
struct RateCount {
    std::int64_t successes = 0;
    std::int64_t trials = 0;
};

// One number measured on one node (against the reference).
struct Measurement {
    Measurement() = default;
    Measurement(std::string criterion_, std::string step_, double value_, std::optional<RateCount> count_ = std::nullopt)
        : criterion(std::move(criterion_)), step(std::move(step_)), value(value_), count(count_) {}
    std::string criterion;  // a catalogue name (find_criterion() must know it)
    std::string step;       // the step that measured it ("logits"); for reports
    double value = 0;
    // Rate criteria (CriterionInfo::rate) only, and required there: the
    // counts the value came from (a rate without its trials cannot be bounded).
    std::optional<RateCount> count;
};

// How a rate criterion was judged (CriterionResult::rate). The rate is
// judged on one-sided bounds at the protocol's confidence, so that few
// trials can neither fail a node on sampling noise nor pass it:
//   shown      the lower bound reaches the tolerance: pass;
//   refuted    the upper bound is below it: fail (the rate is shown to miss);
//   undecided  neither: too few trials to tell either way — NOT a pass
//              (nothing shown is never a pass), reported with the trials
//              that would decide it;
//   exact      a tolerance of 1 (or 0) is no rate claim but a count: every
//              trial must agree (any may): pass iff successes == trials.
struct RateJudgement {
    enum class Decision { shown, refuted, undecided, exact };
    RateCount count;
    double confidence = 0.95;
    BinomialBound interval = BinomialBound::wilson;
    double lower = 0, upper = 1;  // the one-sided bounds at `confidence`
    Decision decision = Decision::undecided;
    // Trials at which a node keeping the observed rate would be decided
    // against the tolerance (binomial_trials_to_decide); nullopt: never
    // (observed == tolerance, or an exact criterion).
    std::optional<std::int64_t> trials_to_decide;
    // Trials a node agreeing on every one needs to pass (binomial_trials_to_show);
    // nullopt for an exact criterion.
    std::optional<std::int64_t> trials_to_show;
};
const char* to_string(RateJudgement::Decision d) noexcept;  // "shown", "refuted", "undecided", "exact"

// One criterion judged in one tier.
// How an x_floor tolerance was made (CriterionResult::floor).
struct FloorUse {
    std::string node;       // the floor node
    double multiple = 1;    // x_floor
    double floor_value = 0; // its value of this criterion
    bool floor_measured = false;
    // true: tolerance = multiple × floor_value (cosines: 1 − multiple·(1 − v));
    // false: the absolute fallback `value` was used, for `why`.
    bool relative = false;
    std::string why;
};

// The floor node's measurements, criterion → its worst value (judge()).
struct FloorValues {
    std::string node;
    std::map<std::string, double> values;
};

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
    // Rate criteria: the bound it was judged on (margin and tightest_passing
    // are then of the lower bound, so margin > 0 iff shown).
    std::optional<RateJudgement> rate;
    // x_floor tolerances: the floor it was made from (`tolerance` is the
    // effective one).
    std::optional<FloorUse> floor;
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
    // A fault-injecting node (Backend::injected_faults): per step compared,
    // the op outputs its fault corrupted. All zero → the node is error ("the
    // injected fault never fired"): a clean verdict would claim the fault
    // was tolerated when it was never there. nullopt for real nodes.
    std::optional<std::map<std::string, std::int64_t>> faults_fired;
    // Step → where it locates this node's error first (the drift step: the
    // first layer and block whose local delta crosses its yardstick).
    std::map<std::string, std::string> localisation;
};
// node + to_json(caps).
NodeInput node_input(const Capabilities& caps, bool is_reference = false);
// Sets `contrast` on the inputs whose node is named in `contrast_nodes`.
void mark_contrast(std::vector<NodeInput>& inputs, const std::vector<std::string>& contrast_nodes);

struct NodeVerdict {
    std::string node;
    // The input capabilities plus "determinism_measured": {"bit_identical",
    // "run_to_run_max_rel"} from the "determinism" measurement (null when
    // not measured), and for a fault-injecting node "faults_fired": {step:
    // corrupted op outputs}.
    nlohmann::ordered_json capabilities;
    Verdict verdict = Verdict::error;
    bool contrast = false;  // not gated (NodeInput::contrast)
    bool floor = false;     // the floor node of the protocol's x_floor tolerances (not judged by them)
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
    // Step → where it locates the error (NodeInput::localisation), kept when
    // a criterion of that step failed: the engineer's first place to look.
    std::map<std::string, std::string> localisation;

    const std::vector<CriterionResult>& tier(Tier t) const { return t == Tier::sensitive ? sensitive : tolerant; }
};

// Sample sizes that cannot decide (the audit's warnings): for every rate
// criterion judged on some node with fewer trials than a node agreeing on
// every one needs to pass it ("decide.top1_agreement_min (sensitive): 64
// trials cannot show >= 0.99 at 95 % confidence (wilson); a node agreeing on
// every one needs 268"), once per criterion and tier.
std::vector<std::string> sample_size_warnings(const std::vector<NodeVerdict>& verdicts);

// The criteria that do not apply to the audited model (the same for every
// node: verdict.hpp's rule), from the first judged node; empty if none.
const std::map<std::string, std::string>& not_applicable_criteria(const std::vector<NodeVerdict>& verdicts);
// The criteria not judged on `v` alone (NodeVerdict::not_measurable),
// grouped by reason: why → the criteria (for reports).
std::map<std::string, std::vector<std::string>> not_measurable_by_reason(const NodeVerdict& v);

// Judge one criterion (exposed for tests and for reports that recompute).
// A rate criterion with a value needs its `count` (Error(internal) without:
// see Measurement), judged at `stats`.
// An x_floor tolerance takes its effective value from `floor` (the floor
// node's values; null: no floor node in this run — the absolute fallback,
// said so in CriterionResult::floor).
CriterionResult judge_criterion(const std::string& criterion, const std::string& step, std::optional<double> value,
                                const Tolerance& tol, const std::string& tolerance_from, Tier tier,
                                std::optional<RateCount> count = std::nullopt, const Protocol::Statistics& stats = {},
                                const FloorValues* floor = nullptr, const std::string& floor_node = "");

// Judge one node. Error(internal) for a measurement whose criterion is not in
// the catalogue (a misspelt name must be loud, not silently unjudged).
NodeVerdict judge_node(const NodeInput& input, const Tolerances& sensitive, const Tolerances& tolerant,
                       const Protocol::Statistics& stats = {}, const FloorValues* floor = nullptr,
                       const std::string& floor_node = "");
NodeVerdict judge_node(const NodeInput& input, const Protocol& protocol);
// Every node; x_floor tolerances relative to the input named
// protocol.floor (whose own x_floor criteria are not judged: it is their
// yardstick; listed as not measurable), or on the absolute fallbacks when
// no input is the floor. `sensitive` / `tolerant` default to
// the protocol's (compare passes the tiers restricted to its steps).
std::vector<NodeVerdict> judge(const std::vector<NodeInput>& inputs, const Protocol& protocol,
                               const Tolerances* sensitive = nullptr, const Tolerances* tolerant = nullptr);
// The worst value of each criterion the node measured (NaN-sticky).
std::map<std::string, double> worst_values(const NodeInput& input);

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
// A rate criterion's evidence, "64/64, bounds 1-4.1e-2..1 (95 % wilson):
// undecided, 268 trials at this rate would decide"; "" for other criteria.
std::string format_rate(const CriterionResult& r);
// An x_floor tolerance's origin, "10 x floor cpu 3.2e-07" or "x_floor 10:
// this node is the floor (cpu): the absolute fallback"; "" for others.
std::string format_floor(const CriterionResult& r);

}  // namespace kvasir
