// Step 6 as an audit step: perplexity over a token stream (steps/perplexity.hpp
// explains the windows). Routing is pinned per window by the authority.
//
// Tensors: perplexity.nll [predictions] (f64, window by window).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/core/error.hpp"
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
        plan.perplexity->router_authority = true;
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
        StepOutput out;
        out.tensors.emplace("perplexity.nll", f64_tensor(self ? ref.pass.nll
                                                              : run_perplexity_windows(node, *env.plan->perplexity,
                                                                                       ref.windows, &ref.pass)
                                                                    .nll));
        return out;
    }

    nlohmann::ordered_json compare(const Protocol&, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const std::vector<double> rn = double_vector(ref.view("perplexity.nll"));
        const double ref_ppl = perplexity_from_nll(rn);
        nlohmann::ordered_json j;
        j["reference"] = ref.node();
        j["predictions"] = rn.size();
        j["reference_perplexity"] = json_double(ref_ppl);
        j["results"] = for_each_candidate(in, led, "perplexity", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const std::vector<double> cn = double_vector(c.view("perplexity.nll"));
            KVASIR_CHECK(cn.size() == rn.size(), ErrorCode::bad_input, "{}: {} predictions, the reference has {}", c.origin(),
                         cn.size(), rn.size());
            const double ppl = perplexity_from_nll(cn), ratio = ppl / ref_ppl;
            led.measure(i, "perplexity", "perplexity.ratio_max", std::abs(ratio - 1.0));
            nlohmann::ordered_json e{{"node", c.node()}, {"perplexity", json_double(ppl)}, {"ratio", json_double(ratio)}};
            if (in.free_running[i]) e["free_running"] = true;  // its own router in every window
            return e;
        });
        return j;
    }
};

}  // namespace

const Step& perplexity_step() {
    static const PerplexityAudit s;
    return s;
}

}  // namespace kvasir
