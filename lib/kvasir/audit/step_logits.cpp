// Protocol step 3 — end-to-end logit divergence (the audit step, and the
// logits command as its view: step_view.hpp).
//
// A full forward pass over the prompt on every node; the candidate's logits
// [T, V] are compared with the reference's position by position (position t
// = the next-token distribution after tokens 0 … t):
//   L∞(t)  = max_v |Δ logit|      — the worst single logit
//   L2(t)  = ‖Δ logit‖₂           — the whole row
//   KL(t)  = KL(P_ref ‖ P_cand)   — what sampling sees: the extra surprise, in
//                                   nats, of drawing from the candidate's
//                                   distribution when the reference's is true
// each summarised over positions (mean, median, p90, p99, p99.9, max; with
// the fixtures' 24 positions p99 and p99.9 interpolate between the two
// largest values), and the RMS over positions of Δp(top) = P_cand(a_t) −
// P_ref(a_t), a_t the reference's argmax: how much probability the
// reference's choice gains or loses (what a greedy decoder's margin must
// absorb).
//
// Routing: by default every candidate runs with the reference's routing
// plan (router authority — how a swarm runs, so the figures are the
// arithmetic error the deployment sees). With the protocol's logits.router_authority false each
// candidate runs its own router: a routing flip on a border token then shows
// up as a large local KL (step 4 counts the flips).
//
// Tensors: logits.logits [T, V].
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/metrics/logits.hpp"
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
        plan.logits->router_authority = ac.protocol->logits.router_authority;
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
        if (env.plan->logits->router_authority) opt.routing = &ref.routing;
        out.tensors.emplace("logits.logits", forward(node, *env.model, env.plan->logits->tokens.ids, opt).logits);
        return out;
    }

    nlohmann::ordered_json compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const TensorView rl = ref.view("logits.logits");
        nlohmann::ordered_json j;
        j["reference"] = ref.node();
        j["positions"] = rl.shape.empty() ? 0 : rl.shape[0];
        j["compared"] = std::string("per position: L∞ and L2 of the logit delta and KL(P_ref ‖ P_cand), ") +
                        (p.logits.router_authority ? "routing pinned by the reference" : "each node running its own router");
        j["results"] = for_each_candidate(in, led, "logits", [&](std::size_t i) {
            const PositionDivergence d = logit_divergence(rl, in.nodes[i]->view("logits.logits"));
            const Summary linf = summarize(d.linf), l2 = summarize(d.l2), kl = summarize(d.kl);
            led.measure(i, "logits", "logits.kl_p99", kl.p99);
            led.measure(i, "logits", "logits.linf_max", linf.max);
            nlohmann::ordered_json e{{"node", in.nodes[i]->node()},
                                     {"linf", to_json(linf)},
                                     {"l2", to_json(l2)},
                                     {"kl", to_json(kl)},
                                     {"top_dp_rms", json_double(rms(d.dp_top))}};
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
