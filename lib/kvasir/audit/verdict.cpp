#include "kvasir/audit/verdict.hpp"
#include "kvasir/core/nonfinite.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/core/number_format.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ranges>
#include <set>

namespace kvasir {

const char* to_string(Verdict v) noexcept {
    switch (v) {
        case Verdict::reference: return "reference";
        case Verdict::fit: return "fit";
        case Verdict::unfit_sensitive: return "unfit-sensitive";
        case Verdict::unfit: return "unfit";
        case Verdict::error: return "error";
    }
    return "error";
}

const char* to_string(Gate g) noexcept {
    switch (g) {
        case Gate::sensitive: return "sensitive";
        case Gate::tolerant: return "tolerant";
        case Gate::none: return "none";
    }
    return "sensitive";
}

Gate parse_gate(std::string_view text) {
    if (text == "sensitive") return Gate::sensitive;
    if (text == "tolerant") return Gate::tolerant;
    if (text == "none") return Gate::none;
    fail(ErrorCode::bad_input, "gate '{}': expected sensitive, tolerant or none", text);
}

void mark_contrast(std::vector<NodeInput>& inputs, const std::vector<std::string>& contrast_nodes) {
    for (NodeInput& in : inputs)
        in.contrast = std::find(contrast_nodes.begin(), contrast_nodes.end(), in.node) != contrast_nodes.end();
}

NodeInput node_input(const Capabilities& caps, bool is_reference) {
    NodeInput in;
    in.node = caps.node;
    in.capabilities = to_json(caps);
    in.is_reference = is_reference;
    return in;
}

namespace {

double margin_of(double value, double tol, Direction dir, MarginScale scale) {
    if (std::isnan(value) || std::isnan(tol)) return kNaN;
    switch (scale) {
        case MarginScale::log:
            // Error magnitudes: a value of 0 (bit-identical) is infinitely
            // inside any tolerance; a zero tolerance is infinitely far from
            // any positive value.
            if (dir == Direction::max) {
                if (value <= 0) return kInf;
                if (std::isinf(value)) return -kInf;
                if (tol <= 0) return -kInf;
                return std::log10(tol / value);
            }
            if (tol <= 0) return kInf;
            if (value <= 0) return -kInf;
            if (std::isinf(value)) return kInf;
            return std::log10(value / tol);
        case MarginScale::complement_log: {
            // Cosines and agreement rates live just below 1: the distance to 1
            // is the quantity that spans decades.
            const double cv = 1.0 - value, ct = 1.0 - tol;
            if (dir == Direction::min) {
                if (cv <= 0) return kInf;
                if (ct <= 0) return -kInf;
                return std::log10(ct / cv);
            }
            if (ct <= 0) return kInf;
            if (cv <= 0) return -kInf;
            return std::log10(cv / ct);
        }
        case MarginScale::linear: return dir == Direction::max ? tol - value : value - tol;
    }
    return kNaN;
}

// The worse of two measurements of one criterion; NaN is worst of all.
double worse(double a, double b, Direction dir) {
    if (std::isnan(a) || std::isnan(b)) return kNaN;
    return dir == Direction::max ? (a < b ? b : a) : (a < b ? a : b);
}

// NaN margins (unmeasured, NaN value) rank below everything.
double rank(const CriterionResult& r) { return std::isnan(r.margin) ? -kInf : r.margin; }

const CriterionResult* least_margin(const std::vector<CriterionResult>& rs, bool failing_only, bool decades_first) {
    const CriterionResult* best = nullptr;
    for (const bool decades : decades_first ? std::vector<bool>{true, false} : std::vector<bool>{false}) {
        for (const CriterionResult& r : rs) {
            if (failing_only && r.pass) continue;
            if (decades_first && decades && r.scale == MarginScale::linear) continue;
            if (best == nullptr || rank(r) < rank(*best)) best = &r;
        }
        if (best != nullptr) return best;
    }
    return best;
}

struct Measured {
    double value;
    std::string step;
    std::optional<RateCount> count;
};

struct TierContext {
    const Protocol::Statistics& stats;
    const FloorValues* floor;  // null: no floor node in this run
    const std::string& floor_node;
    // The node IS the floor: its x_floor criteria are not judged (it is
    // their yardstick); the tolerance keys skipped go here.
    bool is_floor;
    std::set<std::string>* skipped;
};

std::vector<CriterionResult> judge_tier(const std::map<std::string, Measured>& measured, const Tolerances& tols, Tier tier,
                                        const std::map<std::string, std::string>& not_applicable,
                                        const std::map<std::string, std::string>& not_measurable, const TierContext& ctx) {
    std::vector<CriterionResult> out;
    const auto judge_one = [&](const std::string& name, const std::string& from) {
        if (ctx.is_floor && tols.at(from).x_floor) {
            ctx.skipped->insert(from);
            return;
        }
        const auto it = measured.find(name);
        const auto info = find_criterion(name);
        const bool m = it != measured.end();
        const std::string step = m ? it->second.step : info->step;
        out.push_back(judge_criterion(name, step, m ? std::optional<double>(it->second.value) : std::nullopt, tols.at(from), from,
                                      tier, m ? it->second.count : std::nullopt, ctx.stats, ctx.floor, ctx.floor_node));
    };
    // Not judged (see the header): a key that does not apply to the model;
    // on this node, a key not measurable — a family tolerance ("ops.max_rel")
    // covering its per-op keys ("ops.moe.max_rel") when nothing of the family
    // was measured. Family tolerances are never skipped as "not applicable".
    const auto family_measured = [&](const std::string& family) {
        return measured.count(family) != 0 || std::any_of(measured.begin(), measured.end(), [&](const auto& m) {
                   return !criterion_op(m.first).empty() && criterion_family(m.first) == family;
               });
    };
    const auto not_judged = [&](const std::string& key, bool family) {
        if (measured.count(key) != 0) return false;
        if (family) return not_measurable.count(key) != 0 && !family_measured(key);
        return not_applicable.count(key) != 0 || not_measurable.count(key) != 0 ||
               (!criterion_op(key).empty() && not_measurable.count(criterion_family(key)) != 0 &&
                !family_measured(criterion_family(key)));
    };
    for (const auto& [key, tol] : tols) {
        const bool family = key.rfind("ops.", 0) == 0 && criterion_op(key).empty();
        if (not_judged(key, family)) continue;
        if (!family) {
            judge_one(key, key);
            continue;
        }
        // Family tolerance: the aggregate itself and every per-op figure that
        // has no tolerance of its own in this tier.
        bool any = false;
        if (measured.count(key) != 0) {
            judge_one(key, key);
            any = true;
        }
        for (const auto& [name, m] : measured)
            if (!criterion_op(name).empty() && criterion_family(name) == key) {
                any = true;
                if (tols.count(name) == 0) judge_one(name, key);
            }
        if (!any) judge_one(key, key);  // unmeasured → a failed criterion
    }
    std::sort(out.begin(), out.end(), [](const CriterionResult& a, const CriterionResult& b) { return a.criterion < b.criterion; });
    return out;
}

}  // namespace

namespace {

// A rate criterion judged on its bounds (RateJudgement); r was judged on its
// point value, which stands only for a non-finite value (an error anyway).
void judge_rate(CriterionResult& r, std::optional<RateCount> count, const Protocol::Statistics& stats) {
    KVASIR_CHECK(count.has_value() && count->trials > 0, ErrorCode::internal,
                 "rate criterion '{}' measured without its trials (Measurement::count)", r.criterion);
    KVASIR_CHECK(r.direction == Direction::min, ErrorCode::internal, "rate criterion '{}' must be direction min", r.criterion);
    RateJudgement j;
    j.count = *count;
    j.confidence = stats.confidence;
    j.interval = stats.interval;
    j.lower = binomial_lower_bound(count->successes, count->trials, stats.confidence, stats.interval);
    j.upper = binomial_upper_bound(count->successes, count->trials, stats.confidence, stats.interval);
    if (!std::isfinite(r.value)) {
        r.rate = j;
        return;
    }
    if (r.tolerance >= 1.0 || r.tolerance <= 0.0) {
        // Every trial must agree (or any may): a count, not a rate claim.
        j.decision = RateJudgement::Decision::exact;
        r.pass = r.tolerance <= 0.0 || count->successes == count->trials;
    } else {
        const bool shown = j.lower >= r.tolerance;
        j.decision = shown ? RateJudgement::Decision::shown
                           : (j.upper < r.tolerance ? RateJudgement::Decision::refuted : RateJudgement::Decision::undecided);
        r.pass = shown;
        r.margin = margin_of(j.lower, r.tolerance, r.direction, r.scale);
        r.tightest_passing = j.lower;
        j.trials_to_decide = binomial_trials_to_decide(r.value, r.tolerance, stats.confidence, stats.interval);
        j.trials_to_show = binomial_trials_to_show(r.tolerance, stats.confidence, stats.interval);
    }
    r.rate = j;
}

}  // namespace

const char* to_string(RateJudgement::Decision d) noexcept {
    switch (d) {
        case RateJudgement::Decision::shown: return "shown";
        case RateJudgement::Decision::refuted: return "refuted";
        case RateJudgement::Decision::undecided: return "undecided";
        case RateJudgement::Decision::exact: return "exact";
    }
    return "undecided";
}

CriterionResult judge_criterion(const std::string& criterion, const std::string& step, std::optional<double> value,
                                const Tolerance& tol, const std::string& tolerance_from, Tier tier,
                                std::optional<RateCount> count, const Protocol::Statistics& stats, const FloorValues* floor,
                                const std::string& floor_node) {
    const auto info = find_criterion(criterion);
    KVASIR_CHECK(info.has_value(), ErrorCode::internal, "criterion '{}' is not in the catalogue", criterion);
    CriterionResult r;
    r.criterion = criterion;
    r.step = step;
    r.tier = tier;
    r.tolerance = tol.value;
    if (tol.x_floor) {
        // The effective tolerance from the floor node's value of the same
        // criterion; the absolute `value` when there is nothing to scale.
        FloorUse f;
        f.multiple = *tol.x_floor;
        f.floor_value = kNaN;
        if (floor == nullptr) {
            f.node = floor_node;
            f.why = floor_node.empty() ? std::string("no floor node in this run")
                                       : fmt::format("the floor node {} is not in this run", floor_node);
        } else {
            f.node = floor->node;
            const auto it = floor->values.find(criterion);
            if (it == floor->values.end()) {
                f.why = "the floor node did not measure it";
            } else {
                const double v = it->second;
                f.floor_value = v;
                f.floor_measured = true;
                const bool similarity = info->scale == MarginScale::complement_log;
                const double distance = similarity ? 1.0 - v : v;
                if (!std::isfinite(v))
                    f.why = "the floor's value is not finite";
                else if (distance <= 0)
                    f.why = similarity ? "the floor measured 1 - x = 0 (identical to the reference)"
                                       : "the floor measured 0 (bit-identical to the reference)";
                else {
                    f.relative = true;
                    r.tolerance = similarity ? std::max(-1.0, 1.0 - f.multiple * distance) : f.multiple * v;
                }
            }
        }
        if (!f.relative) f.why += ": the absolute fallback";
        r.floor = std::move(f);
    }
    r.tolerance_from = tolerance_from;
    r.why = tol.why;
    r.direction = info->direction;
    r.scale = info->scale;
    r.measured = value.has_value();
    r.value = value.value_or(kNaN);
    // within()/at_least() already fail NaN; ±Inf is refused explicitly (−inf
    // would otherwise "pass" every max criterion).
    r.pass = r.measured && std::isfinite(r.value) &&
             (r.direction == Direction::max ? within(r.value, r.tolerance) : at_least(r.value, r.tolerance));
    r.margin = margin_of(r.value, r.tolerance, r.direction, r.scale);
    r.tightest_passing = r.value;
    if (info->rate && r.measured) judge_rate(r, count, stats);
    return r;
}

namespace {

// Each criterion the node measured, at its worst measurement (verdict.hpp:
// the largest for max, the smallest for min, NaN over everything), with the
// step and counts of that measurement. Error(internal) for an unknown
// criterion or a rate without its trials.
std::map<std::string, Measured> worst_measurements(const NodeInput& in) {
    std::map<std::string, Measured> measured;
    for (const Measurement& m : in.measurements) {
        const auto info = find_criterion(m.criterion);
        KVASIR_CHECK(info.has_value(), ErrorCode::internal, "node {}: measurement '{}' (step '{}') is not a known criterion",
                     in.node, m.criterion, m.step);
        KVASIR_CHECK(!info->rate || (m.count.has_value() && m.count->trials > 0), ErrorCode::internal,
                     "node {}: rate '{}' (step '{}') measured without its trials", in.node, m.criterion, m.step);
        const auto it = measured.find(m.criterion);
        if (it == measured.end())
            measured.emplace(m.criterion, Measured{m.value, m.step, m.count});
        else {
            const double old = it->second.value;
            const double w = worse(old, m.value, info->direction);
            const bool replaced = std::isnan(w) ? !std::isnan(old) : w != old;
            if (replaced) it->second = Measured{w, m.step, m.count};  // the step that measured the worst value
        }
    }
    return measured;
}

}  // namespace

std::map<std::string, double> worst_values(const NodeInput& in) {
    std::map<std::string, double> out;
    for (const auto& [criterion, m] : worst_measurements(in)) out.emplace(criterion, m.value);
    return out;
}

NodeVerdict judge_node(const NodeInput& in, const Tolerances& sensitive, const Tolerances& tolerant,
                       const Protocol::Statistics& stats, const FloorValues* floor, const std::string& floor_node) {
    NodeVerdict v;
    v.node = in.node;
    v.capabilities = in.capabilities.is_object() ? in.capabilities : nlohmann::ordered_json::object();
    v.errors = in.errors;
    v.not_applicable = in.not_applicable;
    v.not_measurable = in.not_measurable;

    const std::map<std::string, Measured> measured = worst_measurements(in);

    if (const auto d = measured.find("determinism"); d != measured.end()) {
        nlohmann::ordered_json det;
        det["bit_identical"] = d->second.value == 0.0;
        det["run_to_run_max_rel"] = json_double(d->second.value);
        v.capabilities["determinism_measured"] = det;
    } else {
        v.capabilities["determinism_measured"] = nullptr;
    }

    if (in.faults_fired) {
        nlohmann::ordered_json fired = nlohmann::ordered_json::object();
        std::int64_t total = 0;
        for (const auto& [step, n] : *in.faults_fired) {
            fired[step] = n;
            total += n;
        }
        v.capabilities["faults_fired"] = fired;
        if (total == 0 && !in.is_reference) {
            std::vector<std::string> steps;
            for (const auto& kv : *in.faults_fired) steps.push_back(kv.first);
            v.errors["fault"] = fmt::format(
                "the injected fault never fired in the steps compared ({}): a verdict would say nothing about whether it "
                "is caught (check fault_call / fault_op against what the steps run)",
                steps.empty() ? std::string("none") : fmt::format("{}", fmt::join(steps, ", ")));
        }
    }

    v.contrast = in.contrast && !in.is_reference;
    if (in.is_reference) {
        v.verdict = Verdict::reference;
        return v;
    }

    // A non-finite figure means a NaN/Inf where the reference had none (see
    // the header): the node errored, whatever the tolerances say.
    for (const Measurement& m : in.measurements)
        if (!std::isfinite(m.value)) {
            std::string& e = v.errors[m.step];
            const std::string msg = fmt::format("{} measured {} (non-finite where the reference had none)", m.criterion,
                                                fmt_sci(m.value));
            if (e.find(msg) == std::string::npos) e += (e.empty() ? "" : "; ") + msg;
        }

    // The floor node is no yardstick for itself: it is judged on the
    // absolute fallbacks, as every node is when the run has no floor.
    v.floor = !floor_node.empty() && in.node == floor_node;
    std::set<std::string> skipped;
    const TierContext ctx{stats, v.floor ? nullptr : floor, floor_node, v.floor, &skipped};
    v.sensitive = judge_tier(measured, sensitive, Tier::sensitive, in.not_applicable, in.not_measurable, ctx);
    v.tolerant = judge_tier(measured, tolerant, Tier::tolerant, in.not_applicable, in.not_measurable, ctx);
    for (const std::string& key : skipped)
        v.not_measurable.emplace(key, "the floor node: the yardstick of this x_floor tolerance, not judged by it");
    // Nothing judged is never a pass: a node whose every criterion was
    // declared not applicable or not measurable has no verdict but error.
    if (v.sensitive.empty() && v.tolerant.empty() && v.errors.empty() &&
        !(in.not_applicable.empty() && in.not_measurable.empty()))
        v.errors["verdict"] = fmt::format("no criterion could be judged on this node ({} not applicable, {} not measurable)",
                                          in.not_applicable.size(), in.not_measurable.size());
    const auto all_pass = [](const std::vector<CriterionResult>& rs) {
        return std::all_of(rs.begin(), rs.end(), [](const CriterionResult& r) { return r.pass; });
    };
    const bool tolerant_ok = all_pass(v.tolerant);
    const bool sensitive_ok = all_pass(v.sensitive);
    const CriterionResult* worst = nullptr;
    if (!v.errors.empty()) {
        v.verdict = Verdict::error;
        for (const auto* tier : {&v.sensitive, &v.tolerant}) {
            for (const CriterionResult& r : *tier)
                if (!r.measured || !std::isfinite(r.value)) {
                    worst = &r;
                    break;
                }
            if (worst != nullptr) break;
        }
        if (worst == nullptr) worst = least_margin(v.tolerant, true, false);
        if (worst == nullptr) worst = least_margin(v.sensitive, true, false);
    } else if (!tolerant_ok) {
        v.verdict = Verdict::unfit;
        worst = least_margin(v.tolerant, true, false);
    } else if (!sensitive_ok) {
        v.verdict = Verdict::unfit_sensitive;
        worst = least_margin(v.sensitive, true, false);
    } else {
        v.verdict = Verdict::fit;
        worst = least_margin(v.sensitive, false, true);
        if (worst == nullptr) worst = least_margin(v.tolerant, false, true);
    }
    if (worst != nullptr) v.worst = *worst;
    for (const auto& loc : in.localisation) {
        const std::string& step = loc.first;  // a plain reference: lambdas capture it (not a structured binding)
        const auto failed = [&](const std::vector<CriterionResult>& rs) {
            return std::any_of(rs.begin(), rs.end(), [&](const CriterionResult& r) { return r.step == step && !r.pass; });
        };
        if (failed(v.sensitive) || failed(v.tolerant)) v.localisation.emplace(step, loc.second);
    }
    return v;
}

NodeVerdict judge_node(const NodeInput& input, const Protocol& protocol) {
    return judge({input}, protocol).front();
}

std::vector<NodeVerdict> judge(const std::vector<NodeInput>& inputs, const Protocol& protocol, const Tolerances* sensitive,
                               const Tolerances* tolerant) {
    std::optional<FloorValues> floor;
    for (const NodeInput& in : inputs)
        if (!in.is_reference && in.node == protocol.floor) floor = FloorValues{in.node, worst_values(in)};
    std::vector<NodeVerdict> out;
    out.reserve(inputs.size());
    for (const NodeInput& in : inputs)
        out.push_back(judge_node(in, sensitive != nullptr ? *sensitive : protocol.sensitive,
                                 tolerant != nullptr ? *tolerant : protocol.tolerant, protocol.statistics,
                                 floor ? &*floor : nullptr, protocol.uses_floor() ? protocol.floor : std::string()));
    return out;
}

std::vector<std::string> sample_size_warnings(const std::vector<NodeVerdict>& verdicts) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const NodeVerdict& v : verdicts) {
        if (v.verdict == Verdict::reference) continue;
        for (const Tier t : {Tier::sensitive, Tier::tolerant})
            for (const CriterionResult& c : v.tier(t)) {
                if (!c.rate || !c.rate->trials_to_show || c.rate->count.trials >= *c.rate->trials_to_show) continue;
                const std::string w = fmt::format(
                    "{} ({}): {} trials cannot show >= {} at {:g} % confidence ({}); a node agreeing on every one needs {}",
                    c.criterion, to_string(t), c.rate->count.trials, format_value(c, c.tolerance), 100.0 * c.rate->confidence,
                    to_string(c.rate->interval), *c.rate->trials_to_show);
                if (seen.insert(w).second) out.push_back(w);
            }
    }
    return out;
}

const std::map<std::string, std::string>& not_applicable_criteria(const std::vector<NodeVerdict>& verdicts) {
    static const std::map<std::string, std::string> none;
    for (const NodeVerdict& v : verdicts)
        if (v.verdict != Verdict::reference) return v.not_applicable;
    return none;
}

std::map<std::string, std::vector<std::string>> not_measurable_by_reason(const NodeVerdict& v) {
    std::map<std::string, std::vector<std::string>> out;
    for (const auto& [criterion, why] : v.not_measurable) out[why].push_back(criterion);
    return out;
}

bool meets_gate(const NodeVerdict& v, Gate gate) noexcept {
    if (v.verdict == Verdict::reference || gate == Gate::none) return true;
    if (gate == Gate::sensitive) return v.verdict == Verdict::fit;
    return v.verdict == Verdict::fit || v.verdict == Verdict::unfit_sensitive;
}

int exit_code(const std::vector<NodeVerdict>& verdicts, Gate gate) {
    std::size_t judged = 0;
    bool ok = true;
    for (const NodeVerdict& v : verdicts) {
        if (v.verdict == Verdict::reference) {
            // A reference that failed a step leaves its candidates compared
            // against nothing; do not let such an audit pass a real gate.
            if (!v.errors.empty() && gate != Gate::none) ok = false;
            continue;
        }
        if (v.contrast) continue;  // shown, not gated
        ++judged;
        if (!meets_gate(v, gate)) ok = false;
    }
    if (judged == 0) return 1;  // nothing compared is never a pass
    return ok ? 0 : 1;
}

nlohmann::ordered_json to_json(const CriterionResult& r) {
    nlohmann::ordered_json j;
    j["criterion"] = r.criterion;
    j["tier"] = to_string(r.tier);
    j["step"] = r.step;
    j["value"] = r.measured ? json_double(r.value) : nlohmann::ordered_json(nullptr);
    j["tolerance"] = json_double(r.tolerance);
    j["tolerance_from"] = r.tolerance_from;
    j["direction"] = to_string(r.direction);
    j["pass"] = r.pass;
    j["measured"] = r.measured;
    j["margin"] = r.measured ? json_double(r.margin) : nlohmann::ordered_json(nullptr);
    j["margin_unit"] = margin_unit(r.scale);
    j["tightest_passing"] = r.measured ? json_double(r.tightest_passing) : nlohmann::ordered_json(nullptr);
    j["why"] = r.why;
    if (r.floor) {
        const FloorUse& f = *r.floor;
        j["floor"] = nlohmann::ordered_json{{"node", f.node},
                                            {"x_floor", json_double(f.multiple)},
                                            {"floor_value", f.floor_measured ? nlohmann::ordered_json(json_double(f.floor_value))
                                                                             : nlohmann::ordered_json(nullptr)},
                                            {"relative", f.relative},
                                            {"why", f.why}};
    }
    if (r.rate) {
        const RateJudgement& q = *r.rate;
        const auto opt = [](const std::optional<std::int64_t>& x) {
            return x ? nlohmann::ordered_json(*x) : nlohmann::ordered_json(nullptr);
        };
        j["rate"] = nlohmann::ordered_json{{"successes", q.count.successes},
                                           {"trials", q.count.trials},
                                           {"confidence", q.confidence},
                                           {"interval", to_string(q.interval)},
                                           {"lower_bound", json_double(q.lower)},
                                           {"upper_bound", json_double(q.upper)},
                                           {"decision", to_string(q.decision)},
                                           {"trials_to_decide", opt(q.trials_to_decide)},
                                           {"trials_to_show", opt(q.trials_to_show)}};
    }
    return j;
}

nlohmann::ordered_json to_json(const NodeVerdict& v) {
    nlohmann::ordered_json j;
    j["node"] = v.node;
    j["verdict"] = to_string(v.verdict);
    if (v.contrast) j["contrast"] = true;
    if (v.floor) j["floor"] = true;
    j["capabilities"] = v.capabilities;
    j["worst"] = v.worst ? to_json(*v.worst) : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json errors = nlohmann::ordered_json::object();
    for (const auto& [step, msg] : v.errors) errors[step] = msg;
    j["errors"] = errors;
    nlohmann::ordered_json criteria;
    for (const Tier t : {Tier::sensitive, Tier::tolerant}) {
        nlohmann::ordered_json list = nlohmann::ordered_json::array();
        for (const CriterionResult& r : v.tier(t)) list.push_back(to_json(r));
        criteria[to_string(t)] = list;
    }
    j["criteria"] = criteria;
    nlohmann::ordered_json na = nlohmann::ordered_json::object();
    for (const auto& [criterion, why] : v.not_applicable) na[criterion] = why;
    j["not_applicable"] = na;
    nlohmann::ordered_json nm = nlohmann::ordered_json::object();
    for (const auto& [criterion, why] : v.not_measurable) nm[criterion] = why;
    j["not_measurable"] = nm;
    if (!v.localisation.empty()) {
        nlohmann::ordered_json loc = nlohmann::ordered_json::object();
        for (const auto& [step, where] : v.localisation) loc[step] = where;
        j["localisation"] = loc;
    }
    return j;
}

std::string format_value(const CriterionResult& r, double x) {
    const auto info = find_criterion(r.criterion);
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (info && info->integer) return fmt::format("{:.0f}", x);
    if (r.scale == MarginScale::complement_log) return fmt_cosine(x);
    if (r.scale == MarginScale::linear) return fmt::format("{:.3g}", x);
    return fmt_sci(x);
}

std::string format_margin(const CriterionResult& r) {
    if (std::isnan(r.margin)) return "no margin";
    if (std::isinf(r.margin)) return r.margin > 0 ? "exact" : "infinitely outside";
    return fmt::format("{:+.2g} {}", r.margin, margin_unit(r.scale));
}

std::string format_rate(const CriterionResult& r) {
    if (!r.rate) return "";
    const RateJudgement& q = *r.rate;
    const std::string counts = fmt::format("{}/{}", q.count.successes, q.count.trials);
    const std::string at = fmt::format("{:g} % {}", 100.0 * q.confidence, to_string(q.interval));
    switch (q.decision) {
        case RateJudgement::Decision::exact: return fmt::format("{} (every trial must agree)", counts);
        case RateJudgement::Decision::shown:
            return fmt::format("{}, lower bound {} ({}): shown", counts, format_value(r, q.lower), at);
        case RateJudgement::Decision::refuted:
            return fmt::format("{}, upper bound {} ({}): shown to miss", counts, format_value(r, q.upper), at);
        case RateJudgement::Decision::undecided:
            return fmt::format("{}, bounds {}..{} ({}): undecided, {}", counts, format_value(r, q.lower), format_value(r, q.upper),
                               at,
                               q.trials_to_decide ? fmt::format("{} trials at this rate would decide", *q.trials_to_decide)
                                                  : std::string("no number of trials decides a rate equal to the tolerance"));
    }
    return counts;
}

std::string format_floor(const CriterionResult& r) {
    if (!r.floor) return "";
    const FloorUse& f = *r.floor;
    if (f.relative) return fmt::format("{:g} x floor {} {}", f.multiple, f.node, format_value(r, f.floor_value));
    return fmt::format("x_floor {:g}: {}", f.multiple, f.why);
}

std::string describe(const CriterionResult& r) {
    const char* rel = r.direction == Direction::max ? (r.pass ? "<=" : ">") : (r.pass ? ">=" : "<");
    if (r.measured && r.rate && std::isfinite(r.value))
        return fmt::format("{} {} [{}] {} {} ({})", r.criterion, format_value(r, r.value), format_rate(r), rel,
                           format_value(r, r.tolerance), format_margin(r));
    if (r.measured && r.floor)
        return fmt::format("{} {} {} {} [{}] ({})", r.criterion, format_value(r, r.value), rel, format_value(r, r.tolerance),
                           format_floor(r), format_margin(r));
    if (!r.measured)
        return fmt::format("{} not measured (tolerance {} {})", r.criterion, r.direction == Direction::max ? "<=" : ">=",
                           format_value(r, r.tolerance));
    return fmt::format("{} {} {} {} ({})", r.criterion, format_value(r, r.value), rel, format_value(r, r.tolerance),
                       format_margin(r));
}

}  // namespace kvasir
