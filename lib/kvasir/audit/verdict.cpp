#include "kvasir/audit/verdict.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/core/number_format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

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
};

std::vector<CriterionResult> judge_tier(const std::map<std::string, Measured>& measured, const Tolerances& tols, Tier tier,
                                        const std::map<std::string, std::string>& not_applicable,
                                        const std::map<std::string, std::string>& not_measurable) {
    std::vector<CriterionResult> out;
    const auto judge_one = [&](const std::string& name, const std::string& from) {
        const auto it = measured.find(name);
        const auto info = find_criterion(name);
        const std::string step = it != measured.end() ? it->second.step : info->step;
        out.push_back(judge_criterion(name, step, it != measured.end() ? std::optional<double>(it->second.value) : std::nullopt,
                                      tols.at(from), from, tier));
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

CriterionResult judge_criterion(const std::string& criterion, const std::string& step, std::optional<double> value,
                                const Tolerance& tol, const std::string& tolerance_from, Tier tier) {
    const auto info = find_criterion(criterion);
    KVASIR_CHECK(info.has_value(), ErrorCode::internal, "criterion '{}' is not in the catalogue", criterion);
    CriterionResult r;
    r.criterion = criterion;
    r.step = step;
    r.tier = tier;
    r.tolerance = tol.value;
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
    return r;
}

NodeVerdict judge_node(const NodeInput& in, const Tolerances& sensitive, const Tolerances& tolerant) {
    NodeVerdict v;
    v.node = in.node;
    v.capabilities = in.capabilities.is_object() ? in.capabilities : nlohmann::ordered_json::object();
    v.errors = in.errors;
    v.not_applicable = in.not_applicable;
    v.not_measurable = in.not_measurable;

    std::map<std::string, Measured> measured;
    for (const Measurement& m : in.measurements) {
        const auto info = find_criterion(m.criterion);
        KVASIR_CHECK(info.has_value(), ErrorCode::internal, "node {}: measurement '{}' (step '{}') is not a known criterion",
                     in.node, m.criterion, m.step);
        const auto it = measured.find(m.criterion);
        if (it == measured.end())
            measured.emplace(m.criterion, Measured{m.value, m.step});
        else {
            const double old = it->second.value;
            const double w = worse(old, m.value, info->direction);
            const bool replaced = std::isnan(w) ? !std::isnan(old) : w != old;
            if (replaced) it->second = Measured{w, m.step};  // the step that measured the worst value
        }
    }

    if (const auto d = measured.find("determinism"); d != measured.end()) {
        nlohmann::ordered_json det;
        det["bit_identical"] = d->second.value == 0.0;
        det["run_to_run_max_rel"] = json_double(d->second.value);
        v.capabilities["determinism_measured"] = det;
    } else {
        v.capabilities["determinism_measured"] = nullptr;
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

    v.sensitive = judge_tier(measured, sensitive, Tier::sensitive, in.not_applicable, in.not_measurable);
    v.tolerant = judge_tier(measured, tolerant, Tier::tolerant, in.not_applicable, in.not_measurable);
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
    return v;
}

NodeVerdict judge_node(const NodeInput& input, const Protocol& protocol) {
    return judge_node(input, protocol.sensitive, protocol.tolerant);
}

std::vector<NodeVerdict> judge(const std::vector<NodeInput>& inputs, const Protocol& protocol) {
    std::vector<NodeVerdict> out;
    out.reserve(inputs.size());
    for (const NodeInput& in : inputs) out.push_back(judge_node(in, protocol));
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
    return j;
}

nlohmann::ordered_json to_json(const NodeVerdict& v) {
    nlohmann::ordered_json j;
    j["node"] = v.node;
    j["verdict"] = to_string(v.verdict);
    if (v.contrast) j["contrast"] = true;
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

std::string describe(const CriterionResult& r) {
    const char* rel = r.direction == Direction::max ? (r.pass ? "<=" : ">") : (r.pass ? ">=" : "<");
    if (!r.measured)
        return fmt::format("{} not measured (tolerance {} {})", r.criterion, r.direction == Direction::max ? "<=" : ">=",
                           format_value(r, r.tolerance));
    return fmt::format("{} {} {} {} ({})", r.criterion, format_value(r, r.value), rel, format_value(r, r.tolerance),
                       format_margin(r));
}

}  // namespace kvasir
