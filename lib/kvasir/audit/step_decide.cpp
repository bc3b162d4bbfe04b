// Protocol step 4 — decision agreement (the audit step; the decide command
// is its view: step_view.hpp).
//
// The network makes two kinds of discrete decisions: which experts each MoE
// layer routes a token to, and which token the decoder emits. Both flip
// only where the quantity being compared is closer than the error. This
// step counts the flips.
//
// Runs. The reference runs the prompt with its own router (its routing is
// the plan an authority would dispatch). Every candidate runs the prompt
// twice:
//   * WITHOUT authority — its own router (ForwardOptions::routing = null):
//     what happens if every node re-runs the router;
//   * WITH authority — the reference's plan imposed: the swarm's rule.
//     Routing agreement is then 100% by construction (the report says so);
//     side by side with the free run it is the evidence for why authority
//     is needed.
//
// Per MoE layer (without authority): exact top-k SET match rate and mean set
// overlap |A∩B|/k over tokens (compare_indices: order within a row is not a
// decision). Border tokens: the reference's router gap (k-th minus (k+1)-th
// selection score, router_gaps()) below the protocol's decide.border
// (default 1e-3, the scale of the per-op error); the number of them whose expert set flipped; flips
// at non-border tokens are counted separately (they come from upstream
// flips changing the layer's input, or from an error larger than `border`).
// Without authority layer l's input already carries the consequences of
// flips in layers < l: that cascade is part of what is measured.
//
// Top-1 agreement: argmax of the prompt logits at every position vs the
// reference's — judged WITH router authority (how a swarm runs), reported
// without it too.
//
// Tensors: decide.pinned.logits [T, V] (routing pinned by the authority; a
// compact capture keeps their argmax instead, decide.pinned.top1 [T] i32),
// decide.free.top1 [T] i32 (argmax of the node's own free-routing logits),
// decide.free.ids.<m> [T, k] (the node's own expert choice in its m-th MoE
// layer, routing free) and, from the authority only, decide.gaps.<m> [T] f64
// (its router gap: k-th minus (k+1)-th selection score) and decide.moe_layers
// [M] i32 (the model layer of each MoE layer m). Border tokens are those
// with a gap below the protocol's decide.border (default 1e-3, the per-op
// error scale): the report lists them with their gaps, and counts per node
// how many of them flipped expert set without authority and how many
// non-border tokens did, naming every flipped token (SPEC §2 step 4).
//
// The decide command is this step's view (step_view.hpp); its
// --perturb-router wraps the candidates in RouterPerturbedBackend
// (backend/router_perturbed.hpp).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_decide.hpp"

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
        plan.decide = detail::token_step<StepCommon>(ac, plan.seed, ac.protocol->decide.tokens);
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
                             const std::vector<std::int64_t>& layers, const NodeOutputs& c, std::size_t i, Ledger& led,
                             DecisionResult::Entry& e) {
        const std::vector<TensorView> cids = numbered(c, "decide.free.ids.");
        KVASIR_CHECK(cids.size() == rids.size(), ErrorCode::bad_input, "{}: routing of {} MoE layers, the reference has {}",
                     c.origin(), cids.size(), rids.size());
        DecisionResult::Routing routing;
        DecisionResult::Flips total;
        for (std::size_t l = 0; l < rids.size(); ++l) {
            DecisionResult::LayerRouting lr;
            lr.layer = layers[l];
            lr.agreement = compare_indices(rids[l], cids[l]);
            routing.rows += lr.agreement.rows;
            routing.exact_matches += lr.agreement.exact_matches;
            if (l < gaps.size()) {
                const std::vector<bool> flipped = id_sets_differ(rids[l], cids[l]);
                DecisionResult::Flips f;
                for (std::size_t t = 0; t < flipped.size() && static_cast<std::int64_t>(t) < gaps[l].numel(); ++t) {
                    const bool is_border = gaps[l].at(static_cast<std::int64_t>(t)) < border;
                    f.border_tokens += is_border;
                    f.border_flipped += is_border && flipped[t];
                    f.other_flipped += !is_border && flipped[t];
                    if (flipped[t]) lr.flipped_tokens.push_back(static_cast<std::int64_t>(t));
                }
                total.border_tokens += f.border_tokens;
                total.border_flipped += f.border_flipped;
                total.other_flipped += f.other_flipped;
                lr.flips = f;
            }
            routing.per_moe_layer.push_back(std::move(lr));
        }
        if (routing.rows == 0) {
            e.routing_free_note = "no MoE layers";
            return;
        }
        routing.exact_match_rate = static_cast<double>(routing.exact_matches) / static_cast<double>(routing.rows);
        led.measure_rate(i, "decide", "decide.routing_agreement_min", binomial(routing.exact_matches, routing.rows));
        e.routing_free = std::move(routing);
        if (!gaps.empty()) {
            e.border = total;
            led.measure(i, "decide", "decide.routing_clear_flips_max", static_cast<double>(total.other_flipped));
        } else {
            led.not_applicable_for(i, "decide.routing_clear_flips_max", "the reference recorded no router gaps (decide.gaps.*)");
        }
        e.routing_pinned = true;
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
        return token_agreement(a, b);
    }

    // Top-1 agreement of the pinned runs (as metrics' top1_agreement: an
    // all-NaN row, argmax −1, agrees with nothing), from the rows' argmax or
    // the argmax a compact capture keeps (decide.pinned.top1).
    static Fraction pinned_top1(const NodeOutputs& ref, const NodeOutputs& c) {
        const auto top1 = [](const NodeOutputs& n) {
            return n.has("decide.pinned.top1") ? int_vector(n.view("decide.pinned.top1"))
                                               : argmax_rows(n.view("decide.pinned.logits"));
        };
        const std::vector<std::int32_t> a = top1(ref), b = top1(c);
        KVASIR_CHECK(a.size() == b.size() && !a.empty(), ErrorCode::bad_input, "{}: {} pinned top-1 tokens, the reference has {}",
                     c.origin(), b.size(), a.size());
        return token_agreement(a, b);
    }

    static DecisionResult::Entry free_running_node(const NodeOutputs& ref, const NodeOutputs& c, const std::vector<TensorView>& rids,
                                                   const std::vector<TensorView>& gaps, double border,
                                                   const std::vector<std::int64_t>& layers, std::size_t i, Ledger& led) {
        const Fraction top1 = free_top1(ref, c);
        led.measure_rate(i, "decide", "decide.top1_agreement_min", top1);
        DecisionResult::Entry e;
        e.free_running = true;
        e.top1_free = top1;
        if (rids.empty()) return e;
        if (numbered(c, "decide.free.ids.").empty()) {
            for (const char* crit : {"decide.routing_agreement_min", "decide.routing_clear_flips_max"})
                led.not_applicable_for(i, crit, "the node runs its own router and exposes no expert choices (no decide.free.ids.*)");
            e.routing_free_note = "not exposed by this node";
            return e;
        }
        free_routing(rids, gaps, border, layers, c, i, led, e);
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
        // A compact capture keeps the pinned rows' argmax only: all that top-1 agreement reads.
        const Tensor& pinned_logits = self ? ref.logits : pn.logits;
        if (env.plan->compact_top_k > 0)
            out.tensors.emplace("decide.pinned.top1", i32_tensor(argmax_rows(pinned_logits.view())));
        else
            out.tensors.emplace("decide.pinned.logits", pinned_logits);
        const ForwardResult& own = self ? ref : fr;
        out.tensors.emplace("decide.free.top1", i32_tensor(argmax_rows(own.logits.view())));
        const ModelConfig& mc = env.model->config();
        std::vector<std::int32_t> moe_layers;
        std::size_t m = 0;
        for (std::int64_t l = 0; l < mc.num_layers; ++l) {
            if (!mc.is_moe(l)) continue;
            const auto ul = static_cast<std::size_t>(l);
            moe_layers.push_back(static_cast<std::int32_t>(l));
            out.tensors.emplace(fmt::format("decide.free.ids.{}", m), own.routing[ul].ids);
            if (self) {
                const TensorView bias = env.model->layer(l).router_bias;
                out.tensors.emplace(fmt::format("decide.gaps.{}", m),
                                    f64_tensor(router_gaps(ref.router_logits[ul].view(), mc.router, present(bias) ? &bias : nullptr)));
            }
            ++m;
        }
        if (self && !moe_layers.empty()) out.tensors.emplace("decide.moe_layers", i32_tensor(moe_layers));
        return out;
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const std::vector<TensorView> rids = numbered(ref, "decide.free.ids.");
        const std::vector<TensorView> gaps = numbered(ref, "decide.gaps.");
        const double border = p.decide.border;
        // The model layer of each MoE layer (a capture without decide.moe_layers: their indices).
        std::vector<std::int64_t> layers;
        if (ref.has("decide.moe_layers"))
            for (std::int32_t l : int_vector(ref.view("decide.moe_layers"))) layers.push_back(l);
        KVASIR_CHECK(layers.empty() || layers.size() == rids.size(), ErrorCode::bad_input,
                     "{}: decide.moe_layers names {} layers, the routing has {}", ref.origin(), layers.size(), rids.size());
        for (std::size_t m = layers.size(); m < rids.size(); ++m) layers.push_back(static_cast<std::int64_t>(m));
        auto r = std::make_shared<DecisionResult>();
        r->reference = ref.node();
        r->moe_layers = static_cast<std::int64_t>(rids.size());
        r->border = border;
        // The reference's border tokens, with their gaps: where a node's own router may decide otherwise.
        if (!gaps.empty()) {
            r->border_tokens.emplace();
            for (std::size_t m = 0; m < gaps.size() && m < layers.size(); ++m) {
                std::vector<DecisionResult::BorderToken> tokens;
                for (std::int64_t t = 0; t < gaps[m].numel(); ++t)
                    if (gaps[m].at(t) < border) tokens.push_back({t, gaps[m].at(t)});
                r->border_tokens->emplace_back(layers[m], std::move(tokens));
            }
        }
        r->compared = "top-1 with router authority; exact expert-set agreement without it (each node's own router)";
        // A dense model has no router: routing agreement does not apply (the
        // reference's outputs say so — it routed no layer).
        if (rids.empty())
            for (const char* crit : {"decide.routing_agreement_min", "decide.routing_clear_flips_max"})
                led.not_applicable(crit, "no MoE layers: the model has no router");
        r->results = for_each_candidate<DecisionResult::Entry>(in, led, "decide", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            if (in.free_running[i]) return free_running_node(ref, c, rids, gaps, border, layers, i, led);
            DecisionResult::Entry e;
            e.top1_pinned = pinned_top1(ref, c);
            if (ref.has("decide.free.top1") && c.has("decide.free.top1")) e.top1_free = free_top1(ref, c);
            led.measure_rate(i, "decide", "decide.top1_agreement_min", *e.top1_pinned);
            free_routing(rids, gaps, border, layers, c, i, led, e);
            return e;
        });
        return r;
    }
};

}  // namespace

namespace {

nlohmann::ordered_json flips_json(const DecisionResult::Flips& f) {
    return {{"border_tokens", f.border_tokens}, {"border_flipped", f.border_flipped}, {"other_flipped", f.other_flipped}};
}

}  // namespace

nlohmann::ordered_json DecisionResult::Entry::to_json() const {
    if (error) return json_with({});
    nlohmann::ordered_json f;
    if (free_running) f["free_running"] = true;
    if (top1_pinned) f["top1_pinned"] = kvasir::to_json(*top1_pinned);
    if (top1_free) f["top1_free"] = kvasir::to_json(*top1_free);
    if (routing_free_note) f["routing_free"] = *routing_free_note;
    if (routing_free) {
        nlohmann::ordered_json per_layer = nlohmann::ordered_json::array();
        for (const LayerRouting& lr : routing_free->per_moe_layer) {
            nlohmann::ordered_json lj{{"layer", lr.layer}};
            lj.update(kvasir::to_json(lr.agreement));
            if (lr.flips) {
                lj.update(flips_json(*lr.flips));
                lj["flipped_tokens"] = lr.flipped_tokens;
            }
            per_layer.push_back(std::move(lj));
        }
        f["routing_free"] = {{"rows", routing_free->rows}, {"exact_matches", routing_free->exact_matches},
                             {"exact_match_rate", json_double(routing_free->exact_match_rate)}, {"per_moe_layer", std::move(per_layer)}};
    }
    if (border) f["border"] = flips_json(*border);
    if (routing_pinned) f["routing_pinned"] = "100% by construction (the authority's routing is imposed)";
    return json_with(f);
}

nlohmann::ordered_json DecisionResult::to_json() const {
    nlohmann::ordered_json j{{"reference", reference}, {"moe_layers", moe_layers}, {"border", border}};
    if (border_tokens) {
        nlohmann::ordered_json layers = nlohmann::ordered_json::array();
        for (const auto& [layer, tokens] : *border_tokens) {
            nlohmann::ordered_json tj = nlohmann::ordered_json::array();
            for (const BorderToken& t : tokens) tj.push_back({{"token", t.token}, {"gap", json_double(t.gap)}});
            layers.push_back({{"layer", layer}, {"tokens", std::move(tj)}});
        }
        j["border_tokens"] = std::move(layers);
    }
    j["compared"] = compared;
    j["results"] = entries_json(results);
    return j;
}

const Step& decide_step() {
    static const DecideAudit s;
    return s;
}

}  // namespace kvasir
