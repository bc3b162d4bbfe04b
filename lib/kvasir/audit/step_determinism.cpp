// The determinism check as an audit step: the full forward pass (own router)
// run `repeats` times on ONE node; the largest guarded max_rel of runs 2…R
// against run 1 over logits, final hidden and every hidden state (0 =
// bit-identical; NaN when the non-finite patterns differ). Each node against
// itself, so the authority decides nothing; measured on the reference too
// (reported, not judged).
//
// Tensors: determinism.run_to_run_max_rel [1] (f64),
// determinism.routing_rows_differing [1] (f64: (layer, token) rows whose
// expert sets differed between runs).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_determinism.hpp"

#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvasir {

namespace {

class DeterminismAudit final : public Step {
public:
    const char* name() const override { return "determinism"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        const Protocol& p = *ac.protocol;
        if (!p.determinism.enabled) return false;
        // The longest forward any token step runs (the logits stream when
        // there is one): determinism is measured on the work the audit does.
        const TokenStream* s = p.logits.enabled ? &p.logits.tokens
                               : p.drift.enabled ? &p.drift.tokens
                               : p.decide.enabled ? &p.decide.tokens
                                                  : nullptr;
        StepCommon c;
        c.model = ac.model;
        c.tokens = s || ac.tokens ? detail::stream_tokens(ac, s ? *s : TokenStream{}) : seeded_tokens(plan.seed, 16, ac.model->config().vocab_size);
        c.validate();
        plan.determinism_tokens = c.tokens;
        plan.repeats = p.determinism.repeats;
        return true;
    }

    std::any decide(const StepEnv&, Backend&) const override { return {}; }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any&, bool) const override {
        const auto& ids = env.plan->determinism_tokens->ids;
        const ForwardResult first = forward(node, *env.model, ids);
        double worst = 0;
        double rows = 0;
        for (int r = 1; r < env.plan->repeats; ++r) {
            const ForwardResult again = forward(node, *env.model, ids);
            worst = nan_max(worst, self_max_rel(first.logits.view(), again.logits.view()));
            worst = nan_max(worst, self_max_rel(first.final_hidden.view(), again.final_hidden.view()));
            for (std::size_t k = 0; k < first.hidden.size() && k < again.hidden.size(); ++k)
                worst = nan_max(worst, self_max_rel(first.hidden[k].view(), again.hidden[k].view()));
            rows += static_cast<double>(run_to_run_delta(first, again).routing_rows_differing);
        }
        StepOutput out;
        out.tensors.emplace("determinism.run_to_run_max_rel", f64_tensor({worst}));
        out.tensors.emplace("determinism.routing_rows_differing", f64_tensor({rows}));
        return out;
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        auto r = std::make_shared<DeterminismResult>();
        r->repeats = p.determinism.repeats;
        r->compared = "logits, final hidden and every hidden state of the full forward (own router), runs 2..R vs run 1";
        r->nodes = for_each_node_itself<DeterminismResult::Entry>(in, led, "determinism", [&](std::size_t i, DeterminismResult::Entry& e) {
            const NodeOutputs& n = *in.nodes[i];
            const double worst = n.view("determinism.run_to_run_max_rel").at(0);
            led.measure(i, "determinism", "determinism", worst);
            e.run_to_run_max_rel = worst;
            if (n.has("determinism.routing_rows_differing")) e.routing_rows_differing = n.view("determinism.routing_rows_differing").at(0);
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json DeterminismResult::Entry::to_json() const {
    nlohmann::ordered_json e{{"node", node}};
    if (run_to_run_max_rel) e.update({{"bit_identical", bit_identical()}, {"run_to_run_max_rel", json_double(*run_to_run_max_rel)}});
    if (routing_rows_differing) e["routing_rows_differing"] = *routing_rows_differing;
    if (error) e["error"] = *error;
    return e;
}

nlohmann::ordered_json DeterminismResult::to_json() const {
    return {{"repeats", repeats}, {"compared", compared}, {"nodes", entries_json(nodes)}};
}

const Step& determinism_step() {
    static const DeterminismAudit s;
    return s;
}

}  // namespace kvasir
