// Protocol step 5 — generation stability (the audit step; the generate
// command is its view: step_view.hpp).
//
// Greedy decoding (argmax, ties to the lower id, KV cache, no sampling, no
// EOS stop) of the protocol's n tokens after the prompt, on every node. Two
// runs per candidate:
//
//  * FREE: the candidate decodes entirely on its own — its own router, its
//    own argmax fed back. Once one token differs the two sequences fork and
//    every later position is a different computation, so only the FIRST
//    divergence index is meaningful: the step i where the candidate's token
//    differs from the reference's (−1: none in n), with the reference's
//    logit margin (top1 − top2) there — small margins are where a ~1e-3
//    logit error flips argmax — and the candidate's own margin there.
//
//  * PINNED: decoding pinned to the reference (the authority's tokens are
//    fed: greedy_generate's pinned_tokens) and its routing imposed step by
//    step (valid because the candidate now sees exactly the reference's
//    tokens). This is TEACHER FORCING: after each step the candidate is
//    resynchronised to the reference prefix, so every step where its own
//    argmax differs from the reference's token is an independent
//    divergence: the divergences over n (a rate, unlike the free run's
//    single index) and the steps where they happen. The logit error a
//    pinned deployment carries is the logits step's subject.
//
// Tensors: generate.tokens [n] (own greedy tokens), generate.pinned_own [n]
// (own argmax when fed the authority's tokens), generate.margins [n] (top1 −
// top2 of each free step). Note generate.text: the free continuation decoded
// by the model's tokenizer.json, when it has one (reported, not judged).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_generate.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <memory>

namespace kvasir {

namespace {

class GenerateAudit final : public Step {
public:
    const char* name() const override { return "generate"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->generate.enabled) return false;
        plan.generate = detail::token_step<GenerateConfig>(ac, plan.seed, ac.protocol->generate.prompt);
        plan.generate->new_tokens = static_cast<int>(ac.protocol->generate.n);  // 1 … 65536, as parsed
        // The continuations as text where the model has a tokenizer (or the run names one).
        if (!ac.tokenizer.empty() || !tokenizer_path_for(ac.model->path()).empty())
            plan.generate->tokenizer = load_tokenizer_for(ac.model->path(), ac.tokenizer);
        plan.generate->validate();  // the prompt's ids
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        return std::make_shared<const GenerateResult>(
            greedy_generate(authority, *env.model, env.plan->generate->tokens.ids, env.plan->generate->new_tokens));
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const GenerateResult& ref = *std::any_cast<std::shared_ptr<const GenerateResult>>(decisions);
        StepOutput out;
        const auto& tok = env.plan->generate->tokenizer;
        if (self) {
            if (tok) out.notes["generate.text"] = tok->decode(ref.tokens);
            out.tensors.emplace("generate.tokens", i32_tensor(ref.tokens));
            out.tensors.emplace("generate.pinned_own", i32_tensor(ref.tokens));
            out.tensors.emplace("generate.margins", f64_tensor(ref.margins));
            return out;
        }
        const auto& prompt = env.plan->generate->tokens.ids;
        const int n = env.plan->generate->new_tokens;
        const GenerateResult fr = greedy_generate(node, *env.model, prompt, n);
        const GenerateResult pn = greedy_generate(node, *env.model, prompt, n, &ref.tokens, &ref.routing);
        if (tok) out.notes["generate.text"] = tok->decode(fr.tokens);
        out.tensors.emplace("generate.tokens", i32_tensor(fr.tokens));
        out.tensors.emplace("generate.pinned_own", i32_tensor(pn.tokens));
        out.tensors.emplace("generate.margins", f64_tensor(fr.margins));
        return out;
    }

    bool shares_decisions() const override { return true; }
    NamedTensors save_decisions(const std::any& d) const override {
        const GenerateResult& r = *std::any_cast<std::shared_ptr<const GenerateResult>>(d);
        NamedTensors out{{"tokens", i32_tensor(r.tokens)}};
        save_routing_sets(out, "routing", r.routing);
        return out;
    }
    std::any load_decisions(const StepEnv& env, const NodeOutputs& saved) const override {
        auto r = std::make_shared<GenerateResult>();
        r->tokens = int_vector(saved.view("tokens"));
        const auto n = static_cast<std::size_t>(env.plan->generate->new_tokens);
        KVASIR_CHECK(r->tokens.size() == n, ErrorCode::bad_input, "{}: {} tokens for {} new tokens", saved.origin(), r->tokens.size(), n);
        r->routing = load_routing_sets(saved, "routing", env.model->config().num_layers, n);
        return std::shared_ptr<const GenerateResult>(std::move(r));
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const std::vector<std::int32_t> rt = int_vector(ref.view("generate.tokens"));
        auto r = std::make_shared<GenerationResult>();
        r->reference = ref.node();
        r->new_tokens = p.generate.n;
        r->reference_tokens = rt;
        r->reference_text = ref.note("generate.text");
        r->results = for_each_candidate<GenerationResult::Entry>(in, led, "generate", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const std::vector<std::int32_t> ct = int_vector(c.view("generate.tokens"));
            // A free-running node (its own decoding, authority "none") is teacher-forced only when its writer was
            // given the reference's tokens; without generate.pinned_own that criterion is not measurable on it.
            const bool forced = !in.free_running[i] || c.has("generate.pinned_own");
            const std::vector<std::int32_t> pinned = forced ? int_vector(c.view("generate.pinned_own")) : rt;
            KVASIR_CHECK(ct.size() == rt.size() && pinned.size() == rt.size(), ErrorCode::bad_input,
                         "{}: {} generated tokens, the reference has {}", c.origin(), ct.size(), rt.size());
            GenerationResult::Entry e;
            e.first_divergence = first_divergence(rt, ct);
            std::vector<std::int64_t> steps;
            for (std::size_t st = 0; st < rt.size(); ++st)
                if (pinned[st] != rt[st]) steps.push_back(static_cast<std::int64_t>(st));
            led.measure(i, "generate", "generate.first_divergence_min",
                        e.first_divergence < 0 ? static_cast<double>(p.generate.n) : static_cast<double>(e.first_divergence));
            if (p.generate.teacher_forcing && forced)
                led.measure(i, "generate", "generate.divergences_max", static_cast<double>(steps.size()));
            else if (p.generate.teacher_forcing)
                led.not_applicable_for(i, "generate.divergences_max",
                                       "free-running node captured without the reference's tokens (no generate.pinned_own)");
            e.tokens = ct;
            e.text = c.note("generate.text");
            if (forced) e.teacher_forced_divergence_steps = std::move(steps);
            e.free_running = in.free_running[i];
            const std::int64_t first = e.first_divergence;
            if (first >= 0 && c.has("generate.margins") && ref.has("generate.margins")) {
                const TensorView rm = ref.view("generate.margins"), cm = c.view("generate.margins");
                if (first < rm.numel() && first < cm.numel()) {
                    e.ref_margin_at_divergence = rm.at(first);
                    e.cand_margin_at_divergence = cm.at(first);
                }
            }
            return e;
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json GenerationResult::Entry::to_json() const {
    if (error) return json_with({});
    nlohmann::ordered_json f{{"first_divergence", first_divergence}, {"tokens", tokens}};
    if (text) f["text"] = *text;
    if (teacher_forced_divergence_steps)
        f.update({{"teacher_forced_divergences", teacher_forced_divergence_steps->size()},
                  {"teacher_forced_divergence_steps", *teacher_forced_divergence_steps}});
    if (free_running) f["free_running"] = true;
    if (ref_margin_at_divergence) f["ref_margin_at_divergence"] = json_double(*ref_margin_at_divergence);
    if (cand_margin_at_divergence) f["cand_margin_at_divergence"] = json_double(*cand_margin_at_divergence);
    return json_with(f);
}

nlohmann::ordered_json GenerationResult::to_json() const {
    nlohmann::ordered_json j{{"reference", reference}, {"new_tokens", new_tokens}, {"reference_tokens", reference_tokens}};
    if (reference_text) j["reference_text"] = *reference_text;
    j["results"] = entries_json(results);
    return j;
}

const Step& generate_step() {
    static const GenerateAudit s;
    return s;
}

}  // namespace kvasir
