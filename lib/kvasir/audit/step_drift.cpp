// Protocol step 2 — layer-boundary drift (the audit step, and the drift
// command as its view: step_view.hpp).
//
// How the residual stream of each candidate drifts away from the reference
// with depth. The reference runs the whole prompt once with its own router;
// its routing plan is then imposed on every candidate (router authority), so
// that what is measured is pure arithmetic error, never a different choice of
// experts (routing flips are step 4's subject). Two views per layer l:
//
//  * free-running: the candidate carries its own residual stream through all
//    layers. delta_free(l) = ‖h_cand[l+1] − h_ref[l+1]‖₂ / ‖h_ref[l+1]‖₂ over
//    the whole [T, H] residual after layer l: the ACCUMULATED error of layers
//    0 … l (what the next layer, and finally lm_head, actually receives).
//  * re-anchored: layer l is fed the reference's input of layer l
//    (ForwardOptions::anchor_inputs = the reference's hidden states), so
//    delta_anchored(l) is the LOCAL error of layer l alone. A layer whose
//    local error is much larger than its neighbours' is where precision is
//    lost; free-running ≫ anchored means the error is amplified downstream.
//
// Growth with depth. Δ(L) ∝ L^α is fitted by least squares in log-log space
// over depths d = 1 … L (d = l + 1) of the FREE-running deltas
// (fit_power_law: layers with a delta of exactly 0 are excluded and counted).
// α ≈ 0.5 says errors of successive layers add incoherently (√L); α ≈ 1
// coherent, linear growth; α ≈ 0 a fixed error that depth neither grows nor
// damps (e.g. one dominant early layer). R² says how well a power law
// describes the curve at all — with the fixtures' 3–4 layers the fit has 1–2
// degrees of freedom and R² is a rough guide, not a test statistic.
// Measured on the fixtures (cpu, cpu:acc=f16, cpu:storage=bf16, opencl vs
// cpu-ref): α ≈ 0.2 on qwen3_moe_tiny (layer 0 contributes most of the
// error) and α ≈ 0.4–0.5 on mixtral_tiny — sub-linear, as incoherent
// per-layer errors under F32 boundaries should be.
//
// "Where it went wrong": the first layer whose free-running delta exceeds
// the protocol's drift.threshold (default 1e-3, a relative residual error), and the first
// layer whose LOCAL (anchored) delta does; −1 when none does.
//
// The authority runs the prompt once; its routing is imposed on every node
// (router authority) and its hidden states are the anchors of the
// re-anchored run.
//
// Tensors: drift.hidden.<k> (k = 0 … L: the residual stream, free-running,
// routing pinned) and drift.anchored.<k> (k = 1 … L: the output of layer k−1
// fed the authority's input of that layer — the layer's LOCAL error), and
// for the localisation of that error inside the layer drift.mlp_input.<k>
// (the MLP / MoE block input of layer k−1 in the anchored run: what the
// attention block — input norm, attention, post-attention norm — made of the
// authority's layer input) and drift.mlp_output.<k> (the block's output fed
// the authority's block input: its own error alone, routing pinned); the
// authority stores its own. Architectures without the shared feed-forward
// (gpt-oss) store neither: their layers are localised as a whole.
//
// Localisation (issue #18): per layer, the attention block's and the MLP /
// experts block's relative deltas; the first layer (and block) whose delta
// crosses its yardstick is named in the node's verdict — the yardstick is
// x_floor × the floor node's delta of the same block and layer when the
// protocol writes drift.final_rel relative to a floor node and the floor
// ran (its delta > 0), else the protocol's drift.threshold.
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/core/nonfinite.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_drift.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/logits.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

namespace kvasir {

namespace {

class DriftAudit final : public ForwardPassStep {
public:
    const char* name() const override { return "drift"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->drift.enabled) return false;
        plan.drift = detail::token_step<StepCommon>(ac, plan.seed, ac.protocol->drift.tokens);
        plan.drift->validate();
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        ForwardOptions opt;
        opt.keep_mlp_io = true;
        return std::make_shared<const ForwardResult>(forward(authority, *env.model, env.plan->drift->tokens.ids, opt));
    }

    // The blocks' tensors of a run kept with keep_mlp_io: k = 1 … L.
    static void add_blocks(StepOutput& out, const std::vector<Tensor>& mlp_input, const std::vector<Tensor>& mlp_output) {
        for (std::size_t l = 0; l < mlp_input.size(); ++l) {
            if (!mlp_input[l].empty()) out.tensors.emplace(fmt::format("drift.mlp_input.{}", l + 1), mlp_input[l]);
            if (l < mlp_output.size() && !mlp_output[l].empty())
                out.tensors.emplace(fmt::format("drift.mlp_output.{}", l + 1), mlp_output[l]);
        }
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const ForwardResult& ref = *std::any_cast<std::shared_ptr<const ForwardResult>>(decisions);
        StepOutput out;
        if (self) {
            for (std::size_t k = 0; k < ref.hidden.size(); ++k) out.tensors.emplace(fmt::format("drift.hidden.{}", k), ref.hidden[k]);
            add_blocks(out, ref.mlp_input, ref.mlp_output);
            return out;
        }
        const auto& ids = env.plan->drift->tokens.ids;
        ForwardOptions opt;
        opt.routing = &ref.routing;
        ForwardResult free = forward(node, *env.model, ids, opt);
        for (std::size_t k = 0; k < free.hidden.size(); ++k)
            out.tensors.emplace(fmt::format("drift.hidden.{}", k), std::move(free.hidden[k]));
        opt.anchor_inputs = &ref.hidden;
        opt.keep_mlp_io = true;
        ForwardResult anchored = forward(node, *env.model, ids, opt);
        for (std::size_t k = 1; k < anchored.hidden.size(); ++k)
            out.tensors.emplace(fmt::format("drift.anchored.{}", k), std::move(anchored.hidden[k]));
        // The MLP / experts block alone: fed the authority's block inputs too.
        const bool blocks = std::any_of(ref.mlp_input.begin(), ref.mlp_input.end(), [](const Tensor& t) { return !t.empty(); });
        if (blocks) {
            opt.anchor_mlp_inputs = &ref.mlp_input;
            const ForwardResult own_block = forward(node, *env.model, ids, opt);
            add_blocks(out, anchored.mlp_input, own_block.mlp_output);
        }
        return out;
    }

    // A block of a layer whose local delta the localisation measures.
    struct Block {
        std::optional<double> DriftResult::Layer::*field;  // its field in the layer's result
        const char* name;    // as reports name it
        const char* prefix;  // its tensors
    };
    static constexpr Block kBlocks[] = {
        {&DriftResult::Layer::attention_block_rel, "attention block (input norm, attention, post-attention norm)", "drift.mlp_input."},
        {&DriftResult::Layer::mlp_block_rel, "MLP / experts block (routing pinned)", "drift.mlp_output."}};

    static std::optional<double> block_delta(const NodeOutputs& ref, const NodeOutputs& c, const Block& b, std::size_t k) {
        const std::string name = b.prefix + std::to_string(k);
        if (!ref.has(name) || !c.has(name)) return std::nullopt;
        return relative_l2(ref.view(name), c.view(name));
    }


    // The anchors: the authority's hidden states, one row per token.
    bool keeps_anchors() const override { return true; }
    std::int64_t anchor_rows(const StepEnv& env) const override {
        return static_cast<std::int64_t>(env.plan->drift->tokens.ids.size());
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport& out) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        const std::vector<TensorView> rh = numbered(ref, "drift.hidden.");
        KVASIR_CHECK(rh.size() >= 2, ErrorCode::bad_input, "{}: drift step without hidden states", ref.origin());
        const double threshold = p.drift.threshold;
        // The localisation's yardstick: x_floor × the floor node's delta of
        // the same block, when drift.final_rel is written relative to a
        // floor that ran; else the absolute threshold.
        std::optional<std::size_t> floor;
        std::optional<double> multiple;
        if (const auto t = p.sensitive.find("drift.final_rel"); t != p.sensitive.end() && t->second.x_floor)
            for (std::size_t i = 0; i < in.nodes.size(); ++i)
                if (i != in.reference && in.present[i] && in.nodes[i]->node() == p.floor) {
                    floor = i;
                    multiple = *t->second.x_floor;
                }
        auto r = std::make_shared<DriftResult>();
        r->reference = ref.node();
        r->threshold = threshold;
        r->compared = "‖Δ‖₂/‖ref‖₂ of the residual after each layer: free-running (accumulated) and re-anchored (local), "
                      "and of each block of the re-anchored layer; routing pinned by the reference in every run";
        if (floor) r->localisation_floor = DriftResult::Floor{p.floor, *multiple};
        r->results = for_each_candidate<DriftResult::Entry>(in, led, "drift", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const std::vector<TensorView> ch = numbered(c, "drift.hidden.");
            KVASIR_CHECK(ch.size() == rh.size(), ErrorCode::bad_input, "{}: {} hidden states, the reference has {}", c.origin(),
                         ch.size(), rh.size());
            std::vector<double> depth, rel;
            DriftResult::Entry e;
            const bool relative = floor && *floor != i;  // the floor is no yardstick for itself
            for (std::size_t k = 1; k < rh.size(); ++k) {
                const std::int64_t layer = static_cast<std::int64_t>(k) - 1;
                const double free_rel = relative_l2(rh[k], ch[k]);
                const CompareStats free = kvasir::compare(rh[k], ch[k]);
                depth.push_back(static_cast<double>(k));
                rel.push_back(free_rel);
                DriftResult::Layer lr;
                lr.layer = layer;
                lr.depth = static_cast<std::int64_t>(k);
                lr.free_rel = free_rel;
                lr.free_max_abs = free.max_abs;
                lr.free_cosine = free.cosine;
                if (!(free_rel <= threshold) && e.first_over < 0) e.first_over = layer;
                const std::string anchored = fmt::format("drift.anchored.{}", k);
                if (c.has(anchored)) {
                    const TensorView av = c.view(anchored);
                    const double local = relative_l2(rh[k], av);
                    lr.anchored_rel = local;
                    lr.anchored_max_abs = max_abs_difference(rh[k], av);
                    if (!(local <= threshold) && e.first_over_local < 0) e.first_over_local = layer;
                }
                for (const Block& b : kBlocks) {
                    const std::optional<double> d = block_delta(ref, c, b, k);
                    if (!d) continue;
                    lr.*b.field = *d;
                    if (e.localisation) continue;
                    double yardstick = threshold;
                    std::string rule = fmt::format("the absolute threshold {:g}", threshold);
                    if (relative)
                        if (const auto fd = block_delta(ref, *in.nodes[*floor], b, k); fd && std::isfinite(*fd) && *fd > 0) {
                            yardstick = *multiple * *fd;
                            rule = fmt::format("{:g} x the floor {}'s {:.2e}", *multiple, p.floor, *fd);
                        }
                    if (!(*d <= yardstick)) {
                        e.localisation = DriftResult::Localisation{layer, b.name, *d, yardstick, rule};
                        led.localise(i, "drift",
                                     fmt::format("drift first crosses its yardstick at layer {}, {}: local delta {:.2e} > {:.2e} ({})",
                                                 layer, b.name, *d, yardstick, rule));
                    }
                }
                e.layers.push_back(std::move(lr));
            }
            e.fit = fit_power_law(depth, rel);
            e.alpha = growth_alpha(e.fit, rel);
            led.measure(i, "drift", "drift.final_rel", rel.empty() ? kNaN : rel.back());
            led.measure(i, "drift", "drift.alpha_max", e.alpha);
            out.drift.push_back(DriftSeries{c.node(), rel, e.alpha});
            e.embedding_rel = relative_l2(rh[0], ch[0]);  // after the series: a gather of another size errs the entry only
            return e;
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json DriftResult::Entry::to_json() const {
    if (error) return json_with({});
    nlohmann::ordered_json lj = nlohmann::ordered_json::array();
    for (const Layer& l : layers) {
        nlohmann::ordered_json j{{"layer", l.layer},
                                 {"depth", l.depth},
                                 {"free_rel", json_double(l.free_rel)},
                                 {"free_max_abs", json_double(l.free_max_abs)},
                                 {"free_cosine", json_double(l.free_cosine)}};
        if (l.anchored_rel) j["anchored_rel"] = json_double(*l.anchored_rel);
        if (l.anchored_max_abs) j["anchored_max_abs"] = json_double(*l.anchored_max_abs);
        if (l.attention_block_rel) j["attention_block_rel"] = json_double(*l.attention_block_rel);
        if (l.mlp_block_rel) j["mlp_block_rel"] = json_double(*l.mlp_block_rel);
        lj.push_back(std::move(j));
    }
    nlohmann::ordered_json where = nullptr;
    if (const auto& w = localisation)
        where = {{"layer", w->layer}, {"block", w->block}, {"delta", json_double(w->delta)}, {"yardstick", json_double(w->yardstick)},
                 {"rule", w->rule}};
    return json_with({{"embedding_rel", json_double(embedding_rel)}, {"layers", std::move(lj)}, {"fit", kvasir::to_json(fit)},
                 {"alpha", json_double(alpha)}, {"first_over", first_over}, {"first_over_local", first_over_local},
                 {"localisation", std::move(where)}});
}

nlohmann::ordered_json DriftResult::to_json() const {
    nlohmann::ordered_json j{{"reference", reference}, {"threshold", threshold}, {"compared", compared}};
    if (localisation_floor) j["localisation_floor"] = {{"node", localisation_floor->node}, {"x_floor", localisation_floor->x_floor}};
    j["results"] = entries_json(results);
    return j;
}

const Step& drift_step() {
    static const DriftAudit s;
    return s;
}

}  // namespace kvasir
