#include "kvasir/steps/decide.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvasir {

void DecideConfig::validate() const {
    StepCommon::validate();
    KVASIR_CHECK(std::isfinite(border) && border > 0, ErrorCode::bad_input, "--border must be > 0, got {}", border);
    KVASIR_CHECK(std::isfinite(perturb_router) && perturb_router >= 0, ErrorCode::bad_input,
                 "--perturb-router must be ≥ 0, got {}", perturb_router);
    // A dense model (no MoE layer) has top-1 agreement only: no router to compare.
}

RouterPerturbedBackend::RouterPerturbedBackend(Backend& inner, double eps, std::uint64_t seed)
    : ForwardingBackend(inner), eps_(eps), seed_(seed), caps_(inner.capabilities()) {
    caps_.extra.emplace_back("perturb_router", fmt::format("{}", eps));
}

RouterOutput RouterPerturbedBackend::route(const TensorView& logits, const RouterParams& params) {
    // Noise in f64, then rounded once to the dtype the backend produced its
    // logits in: the inner router sees a tensor it could have produced itself.
    const Tensor noise = seeded_uniform(seed_, fmt::format("decide/perturb-router/{}", calls_++), logits.shape, -eps_, eps_,
                                        DType::f64, 1);
    Tensor noisy(logits.dtype, logits.shape);
    for (std::int64_t i = 0; i < logits.numel(); ++i) noisy.set(i, logits.at(i) + noise.at(i));
    return ForwardingBackend::route(noisy, params);
}

namespace {

// The rows (tokens) whose expert sets differ.
std::vector<std::int64_t> differing_rows(const Tensor& a, const Tensor& b) {
    const std::vector<bool> differ = id_sets_differ(a, b);
    std::vector<std::int64_t> out;
    for (std::size_t t = 0; t < differ.size(); ++t)
        if (differ[t]) out.push_back(static_cast<std::int64_t>(t));
    return out;
}

// Pools per-layer agreements as if all (layer, token) rows were one table.
IndexAgreement pool(const std::vector<IndexAgreement>& parts) {
    IndexAgreement p;
    double overlap = 0;
    for (const IndexAgreement& a : parts) {
        p.rows += a.rows;
        p.exact_matches += a.exact_matches;
        overlap += a.set_overlap_rate * static_cast<double>(a.rows);
    }
    if (p.rows > 0) {
        p.exact_match_rate = static_cast<double>(p.exact_matches) / static_cast<double>(p.rows);
        p.set_overlap_rate = overlap / static_cast<double>(p.rows);
    }
    return p;
}

}  // namespace

DecideReport run_decide(const DecideConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference) {
    config.validate();
    KVASIR_CHECK(reference < nodes.size(), ErrorCode::bad_input, "reference index {} of {} nodes", reference, nodes.size());
    const Model& model = *config.model;
    const ModelConfig& mc = model.config();
    const std::vector<std::int32_t>& ids = config.tokens.ids;
    DecideReport rep;
    rep.config = config;
    rep.reference = reference;
    for (const auto& n : nodes) rep.nodes.push_back(n->capabilities());

    ForwardOptions free_opt;
    free_opt.keep_hidden = false;
    Backend& refb = *nodes[reference];
    const ForwardResult ref = forward(refb, model, ids, free_opt);
    if (config.repeat)
        rep.repeat.push_back(
            self_check_of(refb.capabilities().node, run_to_run_delta(ref, forward(refb, model, ids, free_opt))));

    std::vector<std::int64_t> moe_layers;
    for (std::int64_t l = 0; l < mc.num_layers; ++l)
        if (mc.is_moe(l)) moe_layers.push_back(l);
    for (std::int64_t l : moe_layers) {
        const LayerWeights& w = model.layer(l);
        RouterGapsLayer g;
        g.layer = l;
        g.gaps = router_gaps(ref.router_logits[static_cast<std::size_t>(l)], mc.router,
                             present(w.router_bias) ? &w.router_bias : nullptr);
        for (std::size_t t = 0; t < g.gaps.size(); ++t)
            // NaN gaps count as border: a router that produced NaN decides nothing reliably.
            if (!(g.gaps[t] >= config.border)) g.border_tokens.push_back(static_cast<std::int64_t>(t));
        rep.reference_gaps.push_back(std::move(g));
    }

    ForwardOptions pinned_opt = free_opt;
    pinned_opt.routing = &ref.routing;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (i == reference) continue;
        NodeDecide nd;
        nd.node = nodes[i]->capabilities().node;
        try {
            std::unique_ptr<RouterPerturbedBackend> perturbed;
            if (config.perturb_router > 0)
                perturbed = std::make_unique<RouterPerturbedBackend>(*nodes[i], config.perturb_router, config.seed);
            Backend& be = perturbed ? static_cast<Backend&>(*perturbed) : *nodes[i];
            const auto run = [&](const ForwardOptions& opt) {
                if (perturbed) perturbed->reset();
                return forward(be, model, ids, opt);
            };
            const ForwardResult fr = run(free_opt);
            const ForwardResult pn = run(pinned_opt);
            nd.top1_free = top1_agreement(ref.logits, fr.logits);
            nd.top1_pinned = top1_agreement(ref.logits, pn.logits);
            std::vector<IndexAgreement> frees, pins;
            for (std::size_t m = 0; m < moe_layers.size(); ++m) {
                const auto l = static_cast<std::size_t>(moe_layers[m]);
                const RouterGapsLayer& g = rep.reference_gaps[m];
                LayerAgreement la;
                la.layer = moe_layers[m];
                la.free = compare_indices(ref.routing[l].ids, fr.routing[l].ids);
                la.pinned = compare_indices(ref.routing[l].ids, pn.routing[l].ids);
                la.flipped_tokens = differing_rows(ref.routing[l].ids, fr.routing[l].ids);
                la.pinned_flipped = static_cast<std::int64_t>(differing_rows(ref.routing[l].ids, pn.routing[l].ids).size());
                la.border_tokens = static_cast<std::int64_t>(g.border_tokens.size());
                for (std::int64_t t : la.flipped_tokens) {
                    const bool border = std::binary_search(g.border_tokens.begin(), g.border_tokens.end(), t);
                    (border ? la.border_flipped : la.other_flipped) += 1;
                }
                nd.border_tokens += la.border_tokens;
                nd.border_flipped += la.border_flipped;
                nd.other_flipped += la.other_flipped;
                nd.pinned_flipped += la.pinned_flipped;
                frees.push_back(la.free);
                pins.push_back(la.pinned);
                nd.layers.push_back(std::move(la));
            }
            nd.routing_free = pool(frees);
            nd.routing_pinned = pool(pins);
            if (config.repeat) {
                try {
                    rep.repeat.push_back(self_check_of(nd.node, run_to_run_delta(fr, run(free_opt))));
                } catch (const Error& e) {
                    rep.repeat.push_back(self_check_error(nd.node, e.what()));
                }
            }
        } catch (const Error& e) {
            const std::string node = nd.node;
            nd = NodeDecide{};
            nd.node = node;
            nd.error = e.what();
        }
        rep.results.push_back(std::move(nd));
    }
    return rep;
}

nlohmann::ordered_json to_json(const DecideReport& r) {
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/decide/1";
    j["tool"] = tool_json();
    nlohmann::ordered_json c = common_json(r.config);
    c["border"] = json_double(r.config.border);
    c["perturb_router"] = json_double(r.config.perturb_router);
    j["config"] = c;
    j["reference"] = r.nodes[r.reference].node;
    j["nodes"] = nlohmann::ordered_json::array();
    for (const Capabilities& cap : r.nodes) j["nodes"].push_back(to_json(cap));
    j["reference_routing"] = nlohmann::ordered_json::array();
    for (const RouterGapsLayer& g : r.reference_gaps) {
        nlohmann::ordered_json o;
        o["layer"] = g.layer;
        o["gaps"] = nlohmann::ordered_json::array();
        for (double x : g.gaps) o["gaps"].push_back(json_double(x));
        o["border_tokens"] = g.border_tokens;
        j["reference_routing"].push_back(std::move(o));
    }
    j["results"] = nlohmann::ordered_json::array();
    for (const NodeDecide& nd : r.results) {
        nlohmann::ordered_json o;
        o["node"] = nd.node;
        if (!nd.error.empty()) {
            o["error"] = nd.error;
            j["results"].push_back(std::move(o));
            continue;
        }
        o["top1"] = {{"without_authority", to_json(nd.top1_free)}, {"with_authority", to_json(nd.top1_pinned)}};
        if (!r.config.model->config().has_moe()) {  // dense: top-1 only
            o["routing"] = "no MoE layers";
            j["results"].push_back(std::move(o));
            continue;
        }
        o["routing"] = {{"without_authority", to_json(nd.routing_free)}, {"with_authority", to_json(nd.routing_pinned)}};
        o["border_tokens"] = nd.border_tokens;
        o["border_flipped"] = nd.border_flipped;
        o["other_flipped"] = nd.other_flipped;
        o["pinned_flipped"] = nd.pinned_flipped;
        o["layers"] = nlohmann::ordered_json::array();
        for (const LayerAgreement& la : nd.layers) {
            nlohmann::ordered_json l;
            l["layer"] = la.layer;
            l["without_authority"] = to_json(la.free);
            l["with_authority"] = to_json(la.pinned);
            l["border_tokens"] = la.border_tokens;
            l["border_flipped"] = la.border_flipped;
            l["other_flipped"] = la.other_flipped;
            l["pinned_flipped"] = la.pinned_flipped;
            l["flipped_tokens"] = la.flipped_tokens;
            o["layers"].push_back(std::move(l));
        }
        j["results"].push_back(std::move(o));
    }
    j["repeat"] = nlohmann::ordered_json::array();
    for (const SelfCheck& s : r.repeat) j["repeat"].push_back(to_json(s));
    return j;
}

}  // namespace kvasir
