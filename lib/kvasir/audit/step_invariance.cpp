// The invariance step: does a node give a request the same numbers whatever
// company it keeps? A serving node never computes a request alone — it
// batches it with strangers, prefills it in one pass and then decodes it
// token by token from a KV cache, and it answers the same request many
// times. Each part compares the node with ITSELF (like determinism), so the
// authority decides nothing; the reference is measured too (reported, not
// judged).
//
//   ops             matmul x·wᵀ, softmax and rmsnorm on op_rows seeded rows
//                   [op_rows, hidden]; rows 0, op_rows/2 and op_rows−1 each
//                   recomputed alone ([1, hidden]) → guarded max_rel of the
//                   row alone vs the same row in the batch (worst row). This
//                   is where shape-dependent algorithm choice (split-K, tile
//                   sizes picked by T) shows up.
//   batch           the sequence alone vs the same sequence in a batch of B
//                   sequences (forward_batch: rows stacked through every
//                   row-wise op, attention per sequence), at slot B/2 among
//                   B−1 seeded batchmates of lengths T−2 … T+2 → guarded
//                   max_rel and max|Δ| of its logits, per B. Each run uses
//                   the node's own router: a flip caused by the batch shows.
//   prefill_decode  logits of one prefill over the T tokens vs the same
//                   positions decoded one token at a time from the KV cache
//                   (Decoder) → guarded max_rel, max|Δ|, first position
//                   whose bits differ (−1: none).
//   repeat          `repeats` identical greedy requests (prompt = the T
//                   tokens, `decode` tokens each) → distinct outputs bit for
//                   bit (the greedy tokens with the logits they came from:
//                   the criterion) and distinct token sequences alone (what
//                   deterministic-inference work reports as "unique outputs
//                   of N", reported beside it: on a model with few near-ties
//                   last-bit noise rarely flips a token, but it will on some
//                   request).
//
// Tensors (f64): invariance.ops_max_rel [3] (matmul, softmax, rmsnorm),
// invariance.batch_sizes / batch_max_rel / batch_max_abs [nB],
// invariance.prefill_decode {max_rel, max_abs, first_diff} [3],
// invariance.repeat {unique outputs, unique logit bits} [2].
#include "kvasir/arch/graph.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_invariance.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

namespace kvasir {

namespace {

constexpr const char* kOps[] = {"matmul", "softmax", "rmsnorm"};

// Seeded batchmate j of a batch of B: length T−2 … T+2 (at least 1), ids
// uniform over the vocabulary.
std::vector<std::int32_t> batchmate(std::uint64_t seed, std::int64_t b, std::int64_t j, std::int64_t t_count,
                                    std::int64_t vocab) {
    const std::int64_t n = std::max<std::int64_t>(1, t_count + (j % 5) - 2);
    const Tensor u = seeded_uniform(seed, fmt::format("invariance/batch{}/mate{}", b, j), {n}, 0.0, 1.0, DType::f64, 1);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
        ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(
            std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(u.at(i) * static_cast<double>(vocab))), 0, vocab - 1));
    return ids;
}

// The op-level part: each op on all rows, then rows 0, R/2, R−1 alone.
std::vector<double> op_rows_rel(Backend& node, std::uint64_t seed, std::int64_t rows, std::int64_t hidden, double eps) {
    const Tensor x = seeded_normal(seed, "invariance/ops/x", {rows, hidden}, 0.0, 1.0);
    const Tensor w = seeded_normal(seed, "invariance/ops/w", {hidden, hidden}, 0.0, 1.0 / std::sqrt(static_cast<double>(hidden)));
    const Tensor g = seeded_normal(seed, "invariance/ops/norm", {hidden}, 1.0, 0.1);
    const auto run = [&](int op, const TensorView& in) -> Tensor {
        switch (op) {
            case 0: return node.matmul(in, w);
            case 1: return node.softmax(in);
            default: return node.rmsnorm(in, g, eps);
        }
    };
    std::vector<double> out;
    for (int op = 0; op < 3; ++op) {
        const Tensor all = run(op, x);
        double worst = 0.0;
        for (const std::int64_t r : {std::int64_t{0}, rows / 2, rows - 1}) {
            const Tensor alone = run(op, arch::row_slice(x, r, 1));
            worst = nan_max(worst, self_max_rel(alone.view(), arch::row_slice(all, r, 1)));
        }
        out.push_back(worst);
    }
    return out;
}

class InvarianceAudit final : public Step {
public:
    const char* name() const override { return "invariance"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        const InvarianceStep& p = ac.protocol->invariance;
        if (!p.enabled) return false;
        StepCommon c;
        c.model = ac.model;
        c.tokens = detail::stream_tokens(ac, p.tokens);
        c.validate();
        plan.invariance = detail::AuditPlan::Invariance{c.tokens, p.batch_sizes, p.op_rows, p.repeats, p.decode};
        return true;
    }

    std::any decide(const StepEnv&, Backend&) const override { return {}; }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any&, bool) const override {
        const auto& inv = *env.plan->invariance;
        const Model& model = *env.model;
        const ModelConfig& c = model.config();
        const std::vector<std::int32_t>& ids = inv.tokens.ids;
        const auto t_count = static_cast<std::int64_t>(ids.size());
        const std::uint64_t seed = env.plan->seed;
        StepOutput out;

        out.tensors.emplace("invariance.ops_max_rel", f64_tensor(op_rows_rel(node, seed, inv.op_rows, c.hidden_size,
                                                                             c.rms_norm_eps)));

        ForwardOptions opt;
        opt.keep_hidden = false;
        const Tensor alone = forward(node, model, ids, opt).logits;

        std::vector<double> sizes, rel, abs;
        for (const std::int64_t b : inv.batch_sizes) {
            std::vector<std::vector<std::int32_t>> seqs;
            const std::int64_t slot = b / 2;
            for (std::int64_t j = 0, mate = 0; j < b; ++j)
                seqs.push_back(j == slot ? ids : batchmate(seed, b, mate++, t_count, c.vocab_size));
            const std::vector<Tensor> logits = forward_batch(node, model, seqs);
            const Tensor& mine = logits[static_cast<std::size_t>(slot)];
            sizes.push_back(static_cast<double>(b));
            const SelfDelta d = self_delta(alone.view(), mine.view());
            rel.push_back(d.max_rel);
            abs.push_back(d.max_abs);
        }
        out.tensors.emplace("invariance.batch_sizes", f64_tensor(sizes));
        out.tensors.emplace("invariance.batch_max_rel", f64_tensor(rel));
        out.tensors.emplace("invariance.batch_max_abs", f64_tensor(abs));

        Decoder dec(node, model);
        Tensor decoded(alone.dtype(), alone.shape());
        const std::size_t row = decoded.nbytes() / static_cast<std::size_t>(t_count);
        double first_diff = -1;
        for (std::int64_t t = 0; t < t_count; ++t) {
            const Tensor lg = dec.step(std::span<const std::int32_t>(&ids[static_cast<std::size_t>(t)], 1));
            KVASIR_CHECK(lg.dtype() == alone.dtype() && lg.nbytes() == row, ErrorCode::backend_failure,
                         "invariance: decode step {} returned {} {} (prefill: {} rows of {})", t, dtype_name(lg.dtype()),
                         shape_str(lg.shape()), t_count, dtype_name(alone.dtype()));
            std::byte* dst = static_cast<std::byte*>(decoded.raw()) + static_cast<std::size_t>(t) * row;
            std::memcpy(dst, lg.raw(), row);
            if (first_diff < 0 && std::memcmp(dst, static_cast<const std::byte*>(alone.raw()) + static_cast<std::size_t>(t) * row, row) != 0)
                first_diff = static_cast<double>(t);
        }
        const SelfDelta pd = self_delta(alone.view(), decoded.view());
        out.tensors.emplace("invariance.prefill_decode", f64_tensor({pd.max_rel, pd.max_abs, first_diff}));

        std::set<std::vector<std::int32_t>> outputs;
        std::set<std::string> bits;  // the logits' bytes (tokens follow from them)
        for (int r = 0; r < inv.repeats; ++r) {
            const GenerateResult g = greedy_generate(node, model, ids, static_cast<int>(inv.decode));
            outputs.insert(g.tokens);
            bits.emplace(static_cast<const char*>(g.logits.raw()), g.logits.nbytes());
        }
        out.tensors.emplace("invariance.repeat",
                            f64_tensor({static_cast<double>(outputs.size()), static_cast<double>(bits.size())}));
        return out;
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const InvarianceStep& s = p.invariance;
        auto r = std::make_shared<InvarianceResult>();
        r->tokens = s.tokens.count;
        r->batch_sizes = s.batch_sizes;
        r->op_rows = s.op_rows;
        r->repeats = s.repeats;
        r->decode = s.decode;
        r->compared = "each node against itself: a row alone vs among op_rows rows (matmul, softmax, rmsnorm); the "
                      "sequence alone vs in a batch of B; one prefill vs token-by-token decode; repeated greedy requests";
        r->nodes = for_each_node_itself<InvarianceResult::Entry>(in, led, "invariance", [&](std::size_t i, InvarianceResult::Entry& e) {
            const NodeOutputs& n = *in.nodes[i];
            // An external runtime that runs whole graphs (llama.cpp) has no single ops to recompute.
            const bool no_ops = in.free_running[i] && i != in.reference && !n.has("invariance.ops_max_rel");
            double worst_op = 0;
            std::vector<std::pair<std::string, double>> op_rel;
            if (no_ops) {
                led.not_applicable_for(i, "invariance.ops_max_rel",
                                       "the node runs whole graphs: no single op to recompute alone (no invariance.ops_max_rel)");

            } else {
                const std::vector<double> ops = double_vector(n.view("invariance.ops_max_rel"));
                KVASIR_CHECK(ops.size() == std::size(kOps), ErrorCode::bad_input,
                             "{}: invariance.ops_max_rel has {} entries, not {}", n.origin(), ops.size(), std::size(kOps));
                for (std::size_t k = 0; k < ops.size(); ++k) {
                    op_rel.emplace_back(kOps[k], ops[k]);
                    worst_op = nan_max(worst_op, ops[k]);
                }
            }
            const std::vector<double> sizes = double_vector(n.view("invariance.batch_sizes"));
            const std::vector<double> rel = double_vector(n.view("invariance.batch_max_rel"));
            const std::vector<double> abs = double_vector(n.view("invariance.batch_max_abs"));
            KVASIR_CHECK(!sizes.empty() && rel.size() == sizes.size() && abs.size() == sizes.size(),
                         ErrorCode::bad_input, "{}: invariance batch tensors of {} / {} / {} entries", n.origin(),
                         sizes.size(), rel.size(), abs.size());
            double worst_batch = 0;
            std::vector<InvarianceResult::Batch> batch;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                batch.push_back({sizes[k], rel[k], abs[k]});
                worst_batch = nan_max(worst_batch, rel[k]);
            }
            const std::vector<double> pd = double_vector(n.view("invariance.prefill_decode"));
            const std::vector<double> rep = double_vector(n.view("invariance.repeat"));
            KVASIR_CHECK(pd.size() == 3 && rep.size() == 2, ErrorCode::bad_input,
                         "{}: invariance.prefill_decode / repeat have {} / {} entries, not 3 / 2", n.origin(),
                         pd.size(), rep.size());
            if (!no_ops) led.measure(i, "invariance", "invariance.ops_max_rel", worst_op);
            led.measure(i, "invariance", "invariance.batch_max_rel", worst_batch);
            led.measure(i, "invariance", "invariance.prefill_decode_max_rel", pd[0]);
            led.measure(i, "invariance", "invariance.repeat_unique_max", rep[1]);
            if (!no_ops) e.ops = std::move(op_rel);  // unset: not measurable on this node
            e.batch = std::move(batch);
            e.prefill_decode_max_rel = pd[0];
            e.prefill_decode_max_abs = pd[1];
            e.first_differing_position = pd[2];
            e.unique_outputs = rep[1];
            e.unique_token_sequences = rep[0];
            e.requests = s.repeats;
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json InvarianceResult::Entry::to_json() const {
    if (error) return json_with({});  // a node's tensors that gave an error have no figures
    nlohmann::ordered_json f;
    if (ops) {
        nlohmann::ordered_json o;
        for (const auto& [op, rel] : *ops) o[op] = json_double(rel);
        f["ops"] = std::move(o);
    }
    nlohmann::ordered_json bj = nlohmann::ordered_json::array();
    for (const Batch& b : batch)
        bj.push_back({{"B", b.batch_size}, {"max_rel", json_double(b.max_rel)}, {"max_abs", json_double(b.max_abs)},
                      {"bit_identical", b.bit_identical()}});
    f["batch"] = std::move(bj);
    f["prefill_decode"] = {{"max_rel", json_double(prefill_decode_max_rel)}, {"max_abs", json_double(prefill_decode_max_abs)},
                           {"first_differing_position", first_differing_position}, {"bit_identical", first_differing_position < 0}};
    f["repeat"] = {{"unique_outputs", unique_outputs}, {"unique_token_sequences", unique_token_sequences}, {"of", requests}};
    return json_with(f);
}

nlohmann::ordered_json InvarianceResult::to_json() const {
    return {{"tokens", tokens},   {"batch_sizes", batch_sizes}, {"op_rows", op_rows},
            {"repeats", repeats}, {"decode", decode},           {"compared", compared}, {"nodes", entries_json(nodes)}};
}

const Step& invariance_step() {
    static const InvarianceAudit s;
    return s;
}

}  // namespace kvasir
