// Step 2 as an audit step: layer drift (steps/drift.hpp explains the
// measurement). The authority runs the prompt once; its routing is imposed
// on every node (router authority) and its hidden states are the anchors of
// the re-anchored run.
//
// Tensors: drift.hidden.<k> (k = 0 … L: the residual stream, free-running,
// routing pinned) and drift.anchored.<k> (k = 1 … L: the output of layer k−1
// fed the authority's input of that layer — the layer's LOCAL error).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <memory>

namespace kvasir {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// α for the verdict: the fitted exponent; 0 when fewer than two layers have
// a nonzero delta (a bit-identical node has no growth); NaN when a delta is
// not finite.
double drift_alpha(const PowerFit& fit, const std::vector<double>& rel) {
    if (fit.points_used >= 2) return fit.alpha;  // NaN only if the fit itself failed
    for (double r : rel)
        if (!std::isfinite(r)) return kNaN;
    return 0.0;
}

class DriftAudit final : public Step {
public:
    const char* name() const override { return "drift"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->drift.enabled) return false;
        plan.drift = detail::token_step<DriftConfig>(ac, plan.seed, ac.protocol->drift.tokens);
        plan.drift->validate();
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        return std::make_shared<const ForwardResult>(forward(authority, *env.model, env.plan->drift->tokens.ids));
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const ForwardResult& ref = *std::any_cast<std::shared_ptr<const ForwardResult>>(decisions);
        StepOutput out;
        if (self) {
            for (std::size_t k = 0; k < ref.hidden.size(); ++k) out.tensors.emplace(fmt::format("drift.hidden.{}", k), ref.hidden[k]);
            return out;
        }
        const auto& ids = env.plan->drift->tokens.ids;
        ForwardOptions opt;
        opt.routing = &ref.routing;
        ForwardResult free = forward(node, *env.model, ids, opt);
        for (std::size_t k = 0; k < free.hidden.size(); ++k)
            out.tensors.emplace(fmt::format("drift.hidden.{}", k), std::move(free.hidden[k]));
        opt.anchor_inputs = &ref.hidden;
        ForwardResult anchored = forward(node, *env.model, ids, opt);
        for (std::size_t k = 1; k < anchored.hidden.size(); ++k)
            out.tensors.emplace(fmt::format("drift.anchored.{}", k), std::move(anchored.hidden[k]));
        return out;
    }

    nlohmann::ordered_json compare(const Protocol&, const StepNodes& in, Ledger& led, AuditReport& out) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const std::vector<TensorView> rh = numbered(ref, "drift.hidden.");
        KVASIR_CHECK(rh.size() >= 2, ErrorCode::bad_input, "{}: drift step without hidden states", ref.origin());
        const double threshold = DriftConfig{}.threshold;
        nlohmann::ordered_json j;
        j["reference"] = ref.node();
        j["threshold"] = threshold;
        j["compared"] = "‖Δ‖₂/‖ref‖₂ of the residual after each layer: free-running (accumulated) and re-anchored (local)";
        j["results"] = for_each_candidate(in, led, "drift", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const std::vector<TensorView> ch = numbered(c, "drift.hidden.");
            KVASIR_CHECK(ch.size() == rh.size(), ErrorCode::bad_input, "{}: {} hidden states, the reference has {}", c.origin(),
                         ch.size(), rh.size());
            std::vector<double> depth, rel;
            nlohmann::ordered_json layers = nlohmann::ordered_json::array();
            std::int64_t first_over = -1, first_over_local = -1;
            for (std::size_t k = 1; k < rh.size(); ++k) {
                const std::int64_t layer = static_cast<std::int64_t>(k) - 1;
                const double free_rel = relative_l2(rh[k], ch[k]);
                depth.push_back(static_cast<double>(k));
                rel.push_back(free_rel);
                nlohmann::ordered_json lj{{"layer", layer}, {"depth", k}, {"free_rel", json_double(free_rel)}};
                if (!(free_rel <= threshold) && first_over < 0) first_over = layer;
                const std::string anchored = fmt::format("drift.anchored.{}", k);
                if (c.has(anchored)) {
                    const double local = relative_l2(rh[k], c.view(anchored));
                    lj["anchored_rel"] = json_double(local);
                    if (!(local <= threshold) && first_over_local < 0) first_over_local = layer;
                }
                layers.push_back(std::move(lj));
            }
            const PowerFit fit = fit_power_law(depth, rel);
            DriftSeries s{c.node(), rel, drift_alpha(fit, rel)};
            led.measure(i, "drift", "drift.final_rel", rel.empty() ? kNaN : rel.back());
            led.measure(i, "drift", "drift.alpha_max", s.alpha);
            out.drift.push_back(std::move(s));
            return nlohmann::ordered_json{{"node", c.node()},        {"layers", std::move(layers)},
                                          {"fit", to_json(fit)},      {"first_over", first_over},
                                          {"first_over_local", first_over_local}};
        });
        return j;
    }
};

}  // namespace

const Step& drift_step() {
    static const DriftAudit s;
    return s;
}

}  // namespace kvasir
