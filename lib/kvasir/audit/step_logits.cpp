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
// Compact captures (capture --compact K; metrics/compact.hpp): a node keeps
// its top-K log-probabilities, their ids and the log-sum-exp per position
// instead of the row. Every node also keeps the TOPLOC-style fingerprint of
// its final hidden states (16 entries per 32 positions). Two criteria are
// measured from these on every node, full rows or compact:
//   logits.top_logprob_delta_max  max |Δ log p| at the tokens in both top-Ks
//                                 (≤ 2·L∞: its tolerance is twice L∞'s, so it
//                                 never fails a node the full rows pass)
//   logits.fingerprint_max_rel    the fingerprints' relative delta (a missing
//                                 entry counts by a rigorous lower bound)
//   logits.kl_lower_p99           p99 of a rigorous lower bound of KL from the
//                                 tokens both sides hold (KL itself when both
//                                 rows are full): judged at KL's tolerance, a
//                                 failure is certain and a node whose full rows
//                                 pass never fails it
// KL and L∞ themselves need both full rows: a compact node has them not
// measured, named with the reason.
//
// Tensors: logits.logits [T, V] (or logits.top_ids [T, K] i32,
// logits.top_logprobs [T, K] f32, logits.lse [T] f32), and
// logits.fingerprint_index / logits.fingerprint_value [ceil(T/32), 16].
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_logits.hpp"

#include "kvasir/metrics/compact.hpp"
#include "kvasir/metrics/logits.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <optional>
#include <utility>

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
        const auto keep = [&](const ForwardResult& r) {
            if (const int k = env.plan->compact_top_k; k > 0) {
                CompactRows c = compact_rows(r.logits.view(), k);
                out.tensors.emplace("logits.top_ids", std::move(c.ids));
                out.tensors.emplace("logits.top_logprobs", std::move(c.logprobs));
                out.tensors.emplace("logits.lse", std::move(c.lse));
            } else {
                out.tensors.emplace("logits.logits", r.logits);
            }
            Fingerprint f = hidden_fingerprint(r.final_hidden.view());
            out.tensors.emplace("logits.fingerprint_index", std::move(f.index));
            out.tensors.emplace("logits.fingerprint_value", std::move(f.value));
        };
        if (self) {
            keep(ref);
            return out;
        }
        ForwardOptions opt;
        opt.keep_hidden = false;
        if (env.plan->logits->router_authority) opt.routing = &ref.routing;
        keep(forward(node, *env.model, env.plan->logits->tokens.ids, opt));
        return out;
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const bool ref_full = ref.has("logits.logits");
        auto r = std::make_shared<LogitsResult>();
        r->reference = ref.node();
        r->positions = ref.view(ref_full ? "logits.logits" : "logits.top_ids").dim(0);
        r->compared = std::string("per position: L∞ and L2 of the logit delta and KL(P_ref ‖ P_cand) (full rows), "
                                  "|Δ log p| at the tokens in both top-Ks; the final hidden states' fingerprints; ") +
                      (p.logits.router_authority ? "routing pinned by the reference" : "each node running its own router");
        std::map<int, CompactRows> ref_top;
        r->results = for_each_candidate<LogitsResult::Entry>(in, led, "logits", [&](std::size_t i) {
            const NodeOutputs& cand = *in.nodes[i];
            LogitsResult::Entry e;
            const bool cand_full = cand.has("logits.logits");
            if (ref_full && cand_full) {
                const PositionDivergence d = logit_divergence(ref.view("logits.logits"), cand.view("logits.logits"));
                const Summary linf = summarize(d.linf), l2 = summarize(d.l2), kl = summarize(d.kl);
                led.measure(i, "logits", "logits.kl_p99", kl.p99);
                led.measure(i, "logits", "logits.kl_lower_p99", kl.p99);  // KL is its own best lower bound
                led.measure(i, "logits", "logits.linf_max", linf.max);
                e.linf = linf;
                e.l2 = l2;
                e.kl = kl;
                e.top_dp_rms = rms(d.dp_top);
            } else {
                const std::string why = fmt::format("compact capture ({} keeps the top-K of each row, not the row)",
                                                    ref_full ? "the node" : "the reference");
                led.not_applicable_for(i, "logits.kl_p99", why);
                led.not_applicable_for(i, "logits.linf_max", why);
                e.compact = why;
                const auto rows = [](const NodeOutputs& n) {
                    return n.has("logits.logits") ? LogprobRows{n.view("logits.logits"), {}, {}}
                                                  : LogprobRows{{}, n.view("logits.top_ids"), n.view("logits.top_logprobs")};
                };
                e.kl_lower_bound = summarize(kl_lower_bound(rows(ref), rows(cand)));
                led.measure(i, "logits", "logits.kl_lower_p99", e.kl_lower_bound->p99);
            }
            // The top-K of a full row, at the K of the compact side (the default when both are full).
            const int k = !cand_full ? static_cast<int>(cand.view("logits.top_ids").dim(1))
                          : !ref_full ? static_cast<int>(ref.view("logits.top_ids").dim(1))
                                      : kCompactDefaultTopK;
            // The reference's full rows are reduced once per K, not once per candidate.
            if (ref_full && !ref_top.count(k)) ref_top.emplace(k, compact_rows(ref.view("logits.logits"), k));
            const auto top = [k](const NodeOutputs& n, std::optional<CompactRows>& held) {
                if (!n.has("logits.logits")) return std::pair{n.view("logits.top_ids"), n.view("logits.top_logprobs")};
                held = compact_rows(n.view("logits.logits"), k);
                return std::pair{held->ids.view(), held->logprobs.view()};
            };
            std::optional<CompactRows> cand_held;
            const auto [ref_ids, ref_lp] = ref_full ? std::pair{ref_top.at(k).ids.view(), ref_top.at(k).logprobs.view()}
                                                    : std::pair{ref.view("logits.top_ids"), ref.view("logits.top_logprobs")};
            const auto [cand_ids, cand_lp] = top(cand, cand_held);
            e.top_logprob_delta = summarize(top_logprob_delta(ref_ids, ref_lp, cand_ids, cand_lp));
            led.measure(i, "logits", "logits.top_logprob_delta_max", e.top_logprob_delta.max);
            e.top_k = k;
            if (ref.has("logits.fingerprint_index") && cand.has("logits.fingerprint_index")) {
                e.fingerprint_rel = summarize(fingerprint_rel(ref.view("logits.fingerprint_index"), ref.view("logits.fingerprint_value"),
                                                             cand.view("logits.fingerprint_index"), cand.view("logits.fingerprint_value")));
                led.measure(i, "logits", "logits.fingerprint_max_rel", e.fingerprint_rel->max);
            } else {
                led.not_applicable_for(i, "logits.fingerprint_max_rel", "a capture without fingerprints (written before them)");
            }
            // Its own router: the delta holds its routing flips too (on a dense model the same thing).
            e.free_running = in.free_running[i];
            return e;
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json LogitsResult::Entry::to_json() const {
    if (error) return json_with({});
    nlohmann::ordered_json f;
    if (linf) f["linf"] = kvasir::to_json(*linf);
    if (l2) f["l2"] = kvasir::to_json(*l2);
    if (kl) f.update({{"kl", kvasir::to_json(*kl)}, {"top_dp_rms", json_double(top_dp_rms)}});
    if (compact) f["compact"] = *compact;
    if (kl_lower_bound) f["kl_lower_bound"] = kvasir::to_json(*kl_lower_bound);
    f.update({{"top_logprob_delta", kvasir::to_json(top_logprob_delta)}, {"top_k", top_k}});
    if (fingerprint_rel) f["fingerprint_rel"] = kvasir::to_json(*fingerprint_rel);
    if (free_running) f["free_running"] = true;
    return json_with(f);
}

nlohmann::ordered_json LogitsResult::to_json() const {
    return {{"reference", reference}, {"positions", positions}, {"compared", compared}, {"results", entries_json(results)}};
}

const Step& logits_step() {
    static const LogitsAudit s;
    return s;
}

}  // namespace kvasir
