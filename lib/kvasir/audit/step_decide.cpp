// Step 4 as an audit step: decision agreement (steps/decide.hpp explains the
// measurement). Top-1 agreement is measured WITH router authority (how a
// swarm runs); routing agreement WITHOUT it (each node's own router: why the
// authority is needed).
//
// Tensors: decide.pinned.logits [T, V] (routing pinned by the authority) and
// decide.free.ids.<m> [T, k] (the node's own expert choice in its m-th MoE
// layer, routing free).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <memory>

namespace kvasir {

namespace {

class DecideAudit final : public Step {
public:
    const char* name() const override { return "decide"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->decide.enabled) return false;
        plan.decide = detail::token_step<DecideConfig>(ac, plan.seed, ac.protocol->decide.tokens);
        plan.decide->validate();
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        ForwardOptions opt;
        opt.keep_hidden = false;
        return std::make_shared<const ForwardResult>(forward(authority, *env.model, env.plan->decide->tokens.ids, opt));
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const ForwardResult& ref = *std::any_cast<std::shared_ptr<const ForwardResult>>(decisions);
        const auto& ids = env.plan->decide->tokens.ids;
        ForwardOptions free_opt;
        free_opt.keep_hidden = false;
        ForwardOptions pinned = free_opt;
        pinned.routing = &ref.routing;
        const ForwardResult fr = self ? ForwardResult{} : forward(node, *env.model, ids, free_opt);
        const ForwardResult pn = self ? ForwardResult{} : forward(node, *env.model, ids, pinned);
        StepOutput out;
        out.tensors.emplace("decide.pinned.logits", self ? ref.logits : pn.logits);
        const ForwardResult& own = self ? ref : fr;
        std::size_t m = 0;
        for (std::int64_t l = 0; l < env.model->config().num_layers; ++l)
            if (env.model->config().is_moe(l))
                out.tensors.emplace(fmt::format("decide.free.ids.{}", m++), own.routing[static_cast<std::size_t>(l)].ids);
        return out;
    }

    nlohmann::ordered_json compare(const Protocol&, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const TensorView rl = ref.view("decide.pinned.logits");
        const std::vector<TensorView> rids = numbered(ref, "decide.free.ids.");
        nlohmann::ordered_json j;
        j["reference"] = ref.node();
        j["moe_layers"] = rids.size();
        j["compared"] = "top-1 with router authority; exact expert-set agreement without it (each node's own router)";
        j["results"] = for_each_candidate(in, led, "decide", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const Fraction top1 = top1_agreement(rl, c.view("decide.pinned.logits"));
            const std::vector<TensorView> cids = numbered(c, "decide.free.ids.");
            KVASIR_CHECK(cids.size() == rids.size(), ErrorCode::bad_input, "{}: routing of {} MoE layers, the reference has {}",
                         c.origin(), cids.size(), rids.size());
            std::int64_t rows = 0, exact = 0;
            nlohmann::ordered_json per_layer = nlohmann::ordered_json::array();
            for (std::size_t l = 0; l < rids.size(); ++l) {
                const IndexAgreement a = compare_indices(rids[l], cids[l]);
                rows += a.rows;
                exact += a.exact_matches;
                per_layer.push_back(to_json(a));
            }
            nlohmann::ordered_json e{{"node", c.node()}, {"top1_pinned", to_json(top1)}};
            led.measure(i, "decide", "decide.top1_agreement_min", top1.rate);
            if (rows > 0) {
                const double rate = static_cast<double>(exact) / static_cast<double>(rows);
                led.measure(i, "decide", "decide.routing_agreement_min", rate);
                e["routing_free"] = nlohmann::ordered_json{{"rows", rows}, {"exact_matches", exact},
                                                           {"exact_match_rate", json_double(rate)}, {"per_moe_layer", per_layer}};
            } else {
                e["routing_free"] = "no MoE layers";
            }
            return e;
        });
        return j;
    }
};

}  // namespace

const Step& decide_step() {
    static const DecideAudit s;
    return s;
}

}  // namespace kvasir
