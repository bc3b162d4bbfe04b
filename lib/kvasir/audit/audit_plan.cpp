// The plan of a run and the steps' shared comparison loop (audit_plan.hpp):
// what audit, capture and compare each use, below the driver that runs them.
#include "kvasir/audit/audit_plan.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvasir {

namespace detail {

TokenSequence stream_tokens(const AuditConfig& ac, const TokenStream& s) {
    if (ac.tokens) return *ac.tokens;
    const Model& model = *ac.model;
    return {read_token_stream(s, model.path()),
            fmt::format("{}{} [{}, {})", s.text ? "text " : "", s.path, s.offset, s.offset + s.count)};
}

AuditPlan make_audit_plan(const AuditConfig& ac, std::size_t held) {
    KVASIR_ASSERT(ac.protocol != nullptr && ac.model != nullptr);
    AuditPlan plan;
    plan.seed = ac.seed.value_or(ac.protocol->seed);
    plan.compact_top_k = ac.compact_top_k;
    const std::vector<std::string> only = select_steps(*ac.protocol, ac.only_steps, "--steps");
    for (const Step* s : audit_steps())
        if (step_selected(only, s->name()) && s->plan(ac, plan)) plan.steps.push_back(s->name());
    // What one process holds at once, for the longest token stream: `held`
    // nodes' outputs (audit_plan.hpp).
    const std::pair<const char*, const StepCommon*> forward[] = {
        {"drift", plan.drift ? &*plan.drift : nullptr},       {"logits", plan.logits ? &*plan.logits : nullptr},
        {"decide", plan.decide ? &*plan.decide : nullptr},    {"generate", plan.generate ? &*plan.generate : nullptr},
        {"perplexity", plan.perplexity ? &*plan.perplexity : nullptr}};
    for (const auto& [name, common] : forward)
        if (common != nullptr) check_step_memory(*common, held, fmt::format("{}: /steps/{}", ac.protocol->source, name));
    return plan;
}

std::optional<std::string> first_non_finite_weight(const Model& model) {
    const auto check = [](const TensorView& v, const std::string& what) -> std::optional<std::string> {
        if (!present(v)) return std::nullopt;
        for (std::int64_t i = 0; i < v.numel(); ++i)
            if (!std::isfinite(v.at(i))) return fmt::format("{} element {} is {}", what, i, v.at(i));
        return std::nullopt;
    };
    if (auto w = check(model.embed(), "the embedding")) return w;
    for (std::int64_t l = 0; l < model.config().num_layers; ++l) {
        const LayerWeights& lw = model.layer(l);
        for (const auto& [v, what] : lw.named_views())
            if (auto w = check(*v, fmt::format("layer {} {}", l, what))) return w;
        for (std::size_t e = 0; e < lw.experts.size(); ++e) {
            const ExpertWeights& x = lw.experts[e];
            for (const auto& [v, what] : {std::pair{&x.gate, "gate_proj"}, std::pair{&x.up, "up_proj"},
                                          std::pair{&x.down, "down_proj"}, std::pair{&x.gate_bias, "gate_proj bias"},
                                          std::pair{&x.up_bias, "up_proj bias"}, std::pair{&x.down_bias, "down_proj bias"}})
                if (auto w = check(*v, fmt::format("layer {} expert {} {}", l, e, what))) return w;
        }
    }
    if (auto w = check(model.final_norm(), "the final norm")) return w;
    if (auto w = check(model.lm_head(), "lm_head")) return w;
    return std::nullopt;
}

void check_reference_finite(const StepOutput& out, const std::string& node, const std::string& step, const Model* model) {
    const std::optional<std::string> where = first_non_finite(out);
    if (!where) return;
    if (model != nullptr)
        if (const auto w = first_non_finite_weight(*model))
            fail(ErrorCode::bad_input,
                 "the model is not finite: {} (the reference {} computes {} in step {}); no candidate is judged against "
                 "a broken model — fix the checkpoint",
                 *w, node, *where, step);
    fail(ErrorCode::bad_input,
         "the reference {} computed a non-finite value from finite inputs in step {}: {}; it cannot be the yardstick "
         "(name another node with --reference)",
         node, step, *where);
}

void compare_step(const Protocol& p, const std::string& name, const std::vector<NodeRecord>& nodes, std::size_t reference,
                  Ledger& led, AuditReport& out) {
    const Step& s = step_named(name);
    const std::size_t n = nodes.size();
    std::vector<bool> present(n, false);
    std::vector<const NodeOutputs*> outs(n);
    for (std::size_t i = 0; i < n; ++i) {
        outs[i] = nodes[i].outputs;
        const bool ran = std::find(nodes[i].steps.begin(), nodes[i].steps.end(), name) != nodes[i].steps.end();
        const auto e = nodes[i].errors.find(name);
        present[i] = ran && e == nodes[i].errors.end();
    }
    if (!present[reference]) {
        const NodeRecord& r = nodes[reference];
        const auto e = r.errors.find(name);
        const std::string why = e != r.errors.end() ? e->second : fmt::format("{} has no step '{}'", r.outputs->origin(), name);
        led.reference_failed(name, why);
        out.steps[name] = nlohmann::ordered_json{{"error", why}};
        return;
    }
    // A fault-injecting node that ran the step: what its fault did there
    // (the verdict tells a fault that never fired from one not caught).
    for (std::size_t i = 0; i < n; ++i)
        if (nodes[i].faults && present[i]) {
            const auto f = nodes[i].faults->find(name);
            led.faults_fired(i, name, f != nodes[i].faults->end() ? f->second : 0);
        }
    std::vector<bool> free(n, false);
    for (std::size_t i = 0; i < n; ++i) {
        free[i] = nodes[i].free_running;
        if (present[i]) continue;
        const auto e = nodes[i].errors.find(name);
        if (const auto nc = nodes[i].not_captured.find(name); e == nodes[i].errors.end() && nc != nodes[i].not_captured.end()) {
            for (const CriterionInfo& c : s.criteria())
                led.not_applicable_for(i, c.name, fmt::format("step {} not captured by this node: {}", name, nc->second));
            continue;
        }
        led.error(i, name, e != nodes[i].errors.end() ? e->second
                                                      : fmt::format("not captured ({} has no step '{}')", nodes[i].outputs->origin(), name));
    }
    // A problem with the reference's own tensors (a capture without them)
    // leaves nothing compared; a candidate's is that candidate's (the step
    // records it).
    if (auto why = as_node_failure([&] {
            std::shared_ptr<const StepResult> result = s.compare(p, StepNodes{outs, present, reference, free}, led, out);
            KVASIR_CHECK(result != nullptr, ErrorCode::internal, "step {} compared to no result", name);
            out.steps[name] = result->to_json();
            out.results[name] = std::move(result);
        })) {
        led.reference_failed(name, *why);
        out.steps[name] = nlohmann::ordered_json{{"error", *why}};
    }
}

}  // namespace detail

}  // namespace kvasir
