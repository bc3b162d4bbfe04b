// Step 4 as an audit step: decision agreement (steps/decide.hpp explains the
// measurement). Top-1 agreement is measured WITH router authority (how a
// swarm runs); routing agreement WITHOUT it (each node's own router: why the
// authority is needed).
//
// Tensors: decide.pinned.logits [T, V] (routing pinned by the authority),
// decide.free.top1 [T] i32 (argmax of the node's own free-routing logits),
// decide.free.ids.<m> [T, k] (the node's own expert choice in its m-th MoE
// layer, routing free) and, from the authority only, decide.gaps.<m> [T] f64
// (its router gap: k-th minus (k+1)-th selection score). Border tokens are
// those with a gap below DecideConfig::border (1e-3, the per-op error scale):
// the report counts how many of them flipped expert set without authority,
// and how many non-border tokens did (SPEC §2 step 4).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

namespace kvasir {

namespace {

class DecideAudit final : public ForwardPassStep {
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

    // Routing without authority (each node's own router) against the
    // reference's: exact expert-set agreement per (token, MoE layer) row, and
    // the flips at rows whose authority gap is at least the border (a flip
    // there is no near-tie). Into the node's entry `e`.
    static void free_routing(const std::vector<TensorView>& rids, const std::vector<TensorView>& gaps, double border,
                             const NodeOutputs& c, std::size_t i, Ledger& led, nlohmann::ordered_json& e) {
        const std::vector<TensorView> cids = numbered(c, "decide.free.ids.");
        KVASIR_CHECK(cids.size() == rids.size(), ErrorCode::bad_input, "{}: routing of {} MoE layers, the reference has {}",
                     c.origin(), cids.size(), rids.size());
        std::int64_t rows = 0, exact = 0, border_tokens = 0, border_flipped = 0, other_flipped = 0;
        nlohmann::ordered_json per_layer = nlohmann::ordered_json::array();
        for (std::size_t l = 0; l < rids.size(); ++l) {
            const IndexAgreement a = compare_indices(rids[l], cids[l]);
            rows += a.rows;
            exact += a.exact_matches;
            nlohmann::ordered_json lj = to_json(a);
            if (l < gaps.size()) {
                const std::vector<bool> flipped = id_sets_differ(rids[l], cids[l]);
                std::int64_t lb = 0, lbf = 0, lof = 0;
                for (std::size_t t = 0; t < flipped.size() && static_cast<std::int64_t>(t) < gaps[l].numel(); ++t) {
                    const bool is_border = gaps[l].at(static_cast<std::int64_t>(t)) < border;
                    lb += is_border;
                    lbf += is_border && flipped[t];
                    lof += !is_border && flipped[t];
                }
                lj["border_tokens"] = lb;
                lj["border_flipped"] = lbf;
                lj["other_flipped"] = lof;
                border_tokens += lb;
                border_flipped += lbf;
                other_flipped += lof;
            }
            per_layer.push_back(std::move(lj));
        }
        if (rows == 0) {
            e["routing_free"] = "no MoE layers";
            return;
        }
        const double rate = static_cast<double>(exact) / static_cast<double>(rows);
        led.measure_rate(i, "decide", "decide.routing_agreement_min", binomial(exact, rows));
        e["routing_free"] = nlohmann::ordered_json{{"rows", rows}, {"exact_matches", exact},
                                                   {"exact_match_rate", json_double(rate)}, {"per_moe_layer", per_layer}};
        if (!gaps.empty()) {
            e["border"] = nlohmann::ordered_json{
                {"border_tokens", border_tokens}, {"border_flipped", border_flipped}, {"other_flipped", other_flipped}};
            led.measure(i, "decide", "decide.routing_clear_flips_max", static_cast<double>(other_flipped));
        } else {
            led.not_applicable_for(i, "decide.routing_clear_flips_max", "the reference recorded no router gaps (decide.gaps.*)");
        }
        e["routing_pinned"] = "100% by construction (the authority's routing is imposed)";
    }

    // A node that runs its own router (capability authority "none": an
    // external runtime) has no pinned logits: its top-1 agreement is measured
    // free-running (its own argmax vs the reference's, which for the
    // authority itself is its pinned one), and routing agreement needs its
    // expert choices, which such a node may not expose.
    // Top-1 of each node's own free-routing logits against the reference's.
    static Fraction free_top1(const NodeOutputs& ref, const NodeOutputs& c) {
        const std::vector<std::int32_t> a = int_vector(ref.view("decide.free.top1")), b = int_vector(c.view("decide.free.top1"));
        KVASIR_CHECK(a.size() == b.size() && !a.empty(), ErrorCode::bad_input, "{}: {} free top-1 tokens, the reference has {}",
                     c.origin(), b.size(), a.size());
        std::int64_t same = 0;
        for (std::size_t t = 0; t < a.size(); ++t) same += a[t] == b[t];
        return binomial(same, static_cast<std::int64_t>(a.size()));
    }

    static nlohmann::ordered_json free_running_node(const NodeOutputs& ref, const NodeOutputs& c, const std::vector<TensorView>& rids,
                                                    const std::vector<TensorView>& gaps, double border, std::size_t i, Ledger& led) {
        const Fraction top1 = free_top1(ref, c);
        led.measure_rate(i, "decide", "decide.top1_agreement_min", top1);
        nlohmann::ordered_json e{{"node", c.node()}, {"free_running", true}, {"top1_free", to_json(top1)}};
        if (rids.empty()) return e;
        if (numbered(c, "decide.free.ids.").empty()) {
            for (const char* crit : {"decide.routing_agreement_min", "decide.routing_clear_flips_max"})
                led.not_applicable_for(i, crit, "the node runs its own router and exposes no expert choices (no decide.free.ids.*)");
            e["routing_free"] = "not exposed by this node";
            return e;
        }
        free_routing(rids, gaps, border, c, i, led, e);
        return e;
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
        out.tensors.emplace("decide.free.top1", i32_tensor(argmax_rows(own.logits.view())));
        const ModelConfig& mc = env.model->config();
        std::size_t m = 0;
        for (std::int64_t l = 0; l < mc.num_layers; ++l) {
            if (!mc.is_moe(l)) continue;
            const auto ul = static_cast<std::size_t>(l);
            out.tensors.emplace(fmt::format("decide.free.ids.{}", m), own.routing[ul].ids);
            if (self) {
                const TensorView bias = env.model->layer(l).router_bias;
                out.tensors.emplace(fmt::format("decide.gaps.{}", m),
                                    f64_tensor(router_gaps(ref.router_logits[ul].view(), mc.router, present(bias) ? &bias : nullptr)));
            }
            ++m;
        }
        return out;
    }

    nlohmann::ordered_json compare(const Protocol&, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const TensorView rl = ref.view("decide.pinned.logits");
        const std::vector<TensorView> rids = numbered(ref, "decide.free.ids.");
        const std::vector<TensorView> gaps = numbered(ref, "decide.gaps.");
        const double border = DecideConfig{}.border;
        nlohmann::ordered_json j;
        j["reference"] = ref.node();
        j["moe_layers"] = rids.size();
        j["border"] = border;
        j["compared"] = "top-1 with router authority; exact expert-set agreement without it (each node's own router)";
        // A dense model has no router: routing agreement does not apply (the
        // reference's outputs say so — it routed no layer).
        if (rids.empty())
            for (const char* crit : {"decide.routing_agreement_min", "decide.routing_clear_flips_max"})
                led.not_applicable(crit, "no MoE layers: the model has no router");
        j["results"] = for_each_candidate(in, led, "decide", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            if (in.free_running[i]) return free_running_node(ref, c, rids, gaps, border, i, led);
            const Fraction top1 = top1_agreement(rl, c.view("decide.pinned.logits"));
            nlohmann::ordered_json e{{"node", c.node()}, {"top1_pinned", to_json(top1)}};
            if (ref.has("decide.free.top1") && c.has("decide.free.top1")) e["top1_free"] = to_json(free_top1(ref, c));
            led.measure_rate(i, "decide", "decide.top1_agreement_min", top1);
            free_routing(rids, gaps, border, c, i, led, e);
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
