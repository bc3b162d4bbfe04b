// Step 3 as an audit step: logit divergence (steps/logits.hpp explains the
// statistics). The authority's routing is imposed on every node, so the
// logits differ by arithmetic alone.
//
// Tensors: logits.logits [T, V].
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/steps/forward.hpp"

#include <memory>

namespace kvasir {

namespace {

class LogitsAudit final : public ForwardPassStep {
public:
    const char* name() const override { return "logits"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->logits.enabled) return false;
        plan.logits = detail::token_step<LogitsConfig>(ac, plan.seed, ac.protocol->logits.tokens);
        plan.logits->router_authority = true;
        plan.logits->validate();
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        ForwardOptions opt;
        opt.keep_hidden = false;
        return std::make_shared<const ForwardResult>(forward(authority, *env.model, env.plan->logits->tokens.ids, opt));
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const ForwardResult& ref = *std::any_cast<std::shared_ptr<const ForwardResult>>(decisions);
        StepOutput out;
        if (self) {
            out.tensors.emplace("logits.logits", ref.logits);
            return out;
        }
        ForwardOptions opt;
        opt.keep_hidden = false;
        opt.routing = &ref.routing;
        out.tensors.emplace("logits.logits", forward(node, *env.model, env.plan->logits->tokens.ids, opt).logits);
        return out;
    }

    nlohmann::ordered_json compare(const Protocol&, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const TensorView rl = ref.view("logits.logits");
        nlohmann::ordered_json j;
        j["reference"] = ref.node();
        j["positions"] = rl.shape.empty() ? 0 : rl.shape[0];
        j["compared"] = "per position: L∞ and L2 of the logit delta and KL(P_ref ‖ P_cand), routing pinned by the reference";
        j["results"] = for_each_candidate(in, led, "logits", [&](std::size_t i) {
            const PositionDivergence d = logit_divergence(rl, in.nodes[i]->view("logits.logits"));
            const Summary linf = summarize(d.linf), l2 = summarize(d.l2), kl = summarize(d.kl);
            led.measure(i, "logits", "logits.kl_p99", kl.p99);
            led.measure(i, "logits", "logits.linf_max", linf.max);
            nlohmann::ordered_json e{{"node", in.nodes[i]->node()}, {"linf", to_json(linf)}, {"l2", to_json(l2)}, {"kl", to_json(kl)}};
            // Its own router: the delta holds its routing flips too (on a dense model the same thing).
            if (in.free_running[i]) e["free_running"] = true;
            return e;
        });
        return j;
    }
};

}  // namespace

const Step& logits_step() {
    static const LogitsAudit s;
    return s;
}

}  // namespace kvasir
