#include "kvasir/steps/drift.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"

#include <cmath>

namespace kvasir {

void DriftConfig::validate() const {
    StepCommon::validate();
    KVASIR_CHECK(std::isfinite(threshold) && threshold > 0, ErrorCode::bad_input, "--threshold must be > 0, got {}",
                 threshold);
}

namespace {

SelfCheck repeat_forward(Backend& be, const Model& m, const std::vector<std::int32_t>& ids, const ForwardResult& first,
                         const ForwardOptions& opt) {
    const ForwardResult second = forward(be, m, ids, opt);
    return self_check_of(be.capabilities().node, run_to_run_delta(first, second));
}

}  // namespace

DriftReport run_drift(const DriftConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference) {
    config.validate();
    KVASIR_CHECK(reference < nodes.size(), ErrorCode::bad_input, "reference index {} of {} nodes", reference, nodes.size());
    const Model& model = *config.model;
    const std::vector<std::int32_t>& ids = config.tokens.ids;
    DriftReport rep;
    rep.config = config;
    rep.reference = reference;
    for (const auto& n : nodes) rep.nodes.push_back(n->capabilities());

    Backend& refb = *nodes[reference];
    const ForwardResult ref = forward(refb, model, ids);
    if (config.repeat) rep.repeat.push_back(repeat_forward(refb, model, ids, ref, {}));

    const std::int64_t L = model.config().num_layers;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (i == reference) continue;
        Backend& be = *nodes[i];
        NodeDrift nd;
        nd.node = be.capabilities().node;
        try {
            ForwardOptions free_opt;
            free_opt.routing = &ref.routing;  // router authority: identical experts, arithmetic error only
            const ForwardResult fr = forward(be, model, ids, free_opt);
            ForwardOptions anch_opt = free_opt;
            anch_opt.anchor_inputs = &ref.hidden;  // layer l fed the reference's input of layer l
            const ForwardResult an = forward(be, model, ids, anch_opt);
            nd.embedding_rel = relative_l2(ref.hidden[0], fr.hidden[0]);
            std::vector<double> depth, delta;
            for (std::int64_t l = 0; l < L; ++l) {
                const auto k = static_cast<std::size_t>(l + 1);
                LayerDrift ld;
                ld.layer = l;
                ld.moe = model.config().is_moe(l);
                const CompareStats s = compare(ref.hidden[k], fr.hidden[k]);
                ld.free_rel = relative_l2(ref.hidden[k], fr.hidden[k]);
                ld.free_max_abs = s.max_abs;
                ld.free_cosine = s.cosine;
                ld.anchored_rel = relative_l2(ref.hidden[k], an.hidden[k]);
                ld.anchored_max_abs = max_abs_difference(ref.hidden[k], an.hidden[k]);
                // "exceeds" is written so that a NaN delta counts as exceeding: a blown-up layer is where it went wrong.
                if (nd.first_over < 0 && !within(ld.free_rel, config.threshold)) nd.first_over = l;
                if (nd.first_over_local < 0 && !within(ld.anchored_rel, config.threshold)) nd.first_over_local = l;
                depth.push_back(static_cast<double>(l + 1));
                delta.push_back(ld.free_rel);
                nd.layers.push_back(ld);
            }
            nd.fit = fit_power_law(depth, delta);
            nd.alpha = growth_alpha(nd.fit, delta);
            nd.logits_rel = relative_l2(ref.logits, fr.logits);
            if (config.repeat) {
                try {
                    rep.repeat.push_back(repeat_forward(be, model, ids, fr, free_opt));
                } catch (const Error& e) {
                    rep.repeat.push_back(self_check_error(nd.node, e.what()));
                }
            }
        } catch (const Error& e) {
            nd = NodeDrift{};
            nd.node = be.capabilities().node;
            nd.error = e.what();
        }
        rep.results.push_back(std::move(nd));
    }
    return rep;
}

nlohmann::ordered_json to_json(const DriftReport& r) {
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/drift/1";
    j["tool"] = tool_json();
    nlohmann::ordered_json c = common_json(r.config);
    c["threshold"] = json_double(r.config.threshold);
    c["routing"] = "pinned by the reference (router authority) in both runs";
    j["config"] = c;
    j["reference"] = r.nodes[r.reference].node;
    j["nodes"] = nlohmann::ordered_json::array();
    for (const Capabilities& cap : r.nodes) j["nodes"].push_back(to_json(cap));
    j["results"] = nlohmann::ordered_json::array();
    for (const NodeDrift& nd : r.results) {
        nlohmann::ordered_json o;
        o["node"] = nd.node;
        if (!nd.error.empty()) {
            o["error"] = nd.error;
            j["results"].push_back(std::move(o));
            continue;
        }
        o["embedding_rel"] = json_double(nd.embedding_rel);
        o["layers"] = nlohmann::ordered_json::array();
        for (const LayerDrift& ld : nd.layers) {
            nlohmann::ordered_json l;
            l["layer"] = ld.layer;
            l["depth"] = ld.layer + 1;
            l["moe"] = ld.moe;
            l["free"] = {{"rel", json_double(ld.free_rel)},
                         {"max_abs", json_double(ld.free_max_abs)},
                         {"cosine", json_double(ld.free_cosine)}};
            l["anchored"] = {{"rel", json_double(ld.anchored_rel)}, {"max_abs", json_double(ld.anchored_max_abs)}};
            o["layers"].push_back(std::move(l));
        }
        o["alpha"] = json_double(nd.alpha);
        o["fit"] = to_json(nd.fit);
        o["first_over"] = nd.first_over;
        o["first_over_local"] = nd.first_over_local;
        o["logits_rel"] = json_double(nd.logits_rel);
        j["results"].push_back(std::move(o));
    }
    j["repeat"] = nlohmann::ordered_json::array();
    for (const SelfCheck& s : r.repeat) j["repeat"].push_back(to_json(s));
    return j;
}

}  // namespace kvasir
