// Step 6 as an audit step: perplexity over a token stream (steps/perplexity.hpp
// explains the windows). Routing is pinned per window by the authority.
// With "score": "second_half" only the predictions from position ⌊C/2⌋ of a
// window of C tokens count (llama-perplexity's rule); with "kl_divergence"
// the report adds llama-perplexity --kl-divergence's statistics against the
// reference (metrics/llamacpp_kld.hpp).
//
// Tensors: perplexity.nll [P] (f64, the scored predictions window by window);
// with kl_divergence also perplexity.logits [P, V] (the node's logits of each
// scored prediction, its own float type) and perplexity.targets [P] (i32).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_perplexity.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/llamacpp_kld.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <cmath>
#include <memory>

namespace kvasir {

namespace {

struct PerplexityDecision {
    std::vector<std::pair<std::int64_t, std::int64_t>> windows;
    PerplexityPass pass;
};

class PerplexityAudit final : public Step {
public:
    const char* name() const override { return "perplexity"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->perplexity.enabled) return false;
        plan.perplexity = detail::token_step<PerplexityConfig>(ac, plan.seed, ac.protocol->perplexity.tokens);
        plan.perplexity->context = ac.protocol->perplexity.context;
        plan.perplexity->router_authority = ac.protocol->perplexity.router_authority;
        plan.perplexity->second_half = ac.protocol->perplexity.second_half;
        if (ac.protocol->perplexity.kl_divergence) plan.perplexity->kl_divergence = ac.protocol->perplexity.base_rounding;
        plan.perplexity->validate();
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        const PerplexityConfig& c = *env.plan->perplexity;
        auto d = std::make_shared<PerplexityDecision>();
        d->windows = perplexity_windows(static_cast<std::int64_t>(c.tokens.ids.size()), c.context);
        d->pass = run_perplexity_windows(authority, c, d->windows, nullptr);
        return std::shared_ptr<const PerplexityDecision>(d);
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const PerplexityDecision& ref = *std::any_cast<std::shared_ptr<const PerplexityDecision>>(decisions);
        const PerplexityConfig& pc = *env.plan->perplexity;
        PerplexityPass own;
        if (!self) own = run_perplexity_windows(node, pc, ref.windows, pc.router_authority ? &ref.pass : nullptr);
        const PerplexityPass& pass = self ? ref.pass : own;
        const std::vector<ScoredPrediction> scored = scored_predictions(ref.windows, pc.second_half);
        StepOutput out;
        out.tensors.emplace("perplexity.nll", f64_tensor(scored_nll(pass, scored)));
        if (!pc.kl_divergence.empty()) {
            out.tensors.emplace("perplexity.logits", scored_logits(pass, scored));
            out.tensors.emplace("perplexity.targets",
                                i32_tensor(scored_targets(pc.tokens.ids, ref.windows, scored)));
        }
        return out;
    }

    bool shares_decisions() const override { return true; }
    NamedTensors save_decisions(const std::any& d) const override {
        NamedTensors out;
        save_routing_sets(out, "routing", std::any_cast<std::shared_ptr<const PerplexityDecision>>(d)->pass.routing);
        return out;
    }
    std::any load_decisions(const StepEnv& env, const NodeOutputs& saved) const override {
        const PerplexityConfig& c = *env.plan->perplexity;
        auto d = std::make_shared<PerplexityDecision>();
        d->windows = perplexity_windows(static_cast<std::int64_t>(c.tokens.ids.size()), c.context);
        d->pass.routing = load_routing_sets(saved, "routing", env.model->config().num_layers, d->windows.size());
        return std::shared_ptr<const PerplexityDecision>(std::move(d));
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const std::vector<double> rn = double_vector(ref.view("perplexity.nll"));
        auto r = std::make_shared<PerplexityResult>();
        r->reference = ref.node();
        r->predictions = static_cast<std::int64_t>(rn.size());
        r->context = p.perplexity.context;
        r->scored = p.perplexity.second_half ? "second half of each window (llama-perplexity)" : "every prediction";
        r->routing = p.perplexity.router_authority ? "pinned by the reference per window (router authority)"
                                                   : "each node runs its own router (no authority)";
        r->reference_mean_nll = mean_nll(rn);
        r->reference_perplexity = perplexity_from_nll(rn);
        const bool kld = p.perplexity.kl_divergence;
        if (kld) r->kl_divergence_base_rounding = p.perplexity.base_rounding;
        r->results = for_each_candidate<PerplexityResult::Entry>(in, led, "perplexity", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const std::vector<double> cn = double_vector(c.view("perplexity.nll"));
            KVASIR_CHECK(cn.size() == rn.size(), ErrorCode::bad_input, "{}: {} predictions, the reference has {}", c.origin(),
                         cn.size(), rn.size());
            PerplexityResult::Entry e;
            const double ratio_m1 = perplexity_ratio_minus_one(cn, rn);
            led.measure(i, "perplexity", "perplexity.ratio_max", std::abs(ratio_m1));
            e.mean_nll = mean_nll(cn);
            e.perplexity = perplexity_from_nll(cn);
            e.delta = e.perplexity - r->reference_perplexity;
            e.ratio = 1.0 + ratio_m1;
            for (std::size_t k = 0; k < cn.size(); ++k) e.nll_max_abs_delta = nan_max(e.nll_max_abs_delta, std::abs(cn[k] - rn[k]));
            e.free_running = in.free_running[i];
            if (kld) {
                const std::vector<std::int32_t> rt = int_vector(ref.view("perplexity.targets")),
                                                ct = int_vector(c.view("perplexity.targets"));
                KVASIR_CHECK(rt == ct, ErrorCode::bad_input, "{}: its perplexity targets differ from the reference's",
                             c.origin());
                e.llamacpp_kl_divergence = llamacpp_kl_divergence(ref.view("perplexity.logits"), c.view("perplexity.logits"), rt,
                                                                  parse_base_rounding(p.perplexity.base_rounding));
            }
            return e;
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json PerplexityResult::Entry::to_json() const {
    if (error) return json_with({});
    nlohmann::ordered_json f{{"mean_nll", json_double(mean_nll)}, {"perplexity", json_double(perplexity)}, {"delta", json_double(delta)},
                             {"ratio", json_double(ratio)}, {"nll_max_abs_delta", json_double(nll_max_abs_delta)}};
    if (free_running) f["free_running"] = true;
    if (llamacpp_kl_divergence) f["llamacpp_kl_divergence"] = kvasir::to_json(*llamacpp_kl_divergence);
    return json_with(f);
}

nlohmann::ordered_json PerplexityResult::to_json() const {
    nlohmann::ordered_json j{{"reference", reference}, {"predictions", predictions}, {"context", context}, {"scored", scored},
                             {"routing", routing}, {"reference_mean_nll", json_double(reference_mean_nll)},
                             {"reference_perplexity", json_double(reference_perplexity)}};
    if (kl_divergence_base_rounding) j["kl_divergence_base_rounding"] = *kl_divergence_base_rounding;
    j["results"] = entries_json(results);
    return j;
}

const Step& perplexity_step() {
    static const PerplexityAudit s;
    return s;
}

}  // namespace kvasir
