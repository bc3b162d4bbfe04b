#include "kvasir/steps/logits.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"

namespace kvasir {

LogitsReport run_logits(const LogitsConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference) {
    config.validate();
    KVASIR_CHECK(reference < nodes.size(), ErrorCode::bad_input, "reference index {} of {} nodes", reference, nodes.size());
    const Model& model = *config.model;
    const std::vector<std::int32_t>& ids = config.tokens.ids;
    LogitsReport rep;
    rep.config = config;
    rep.reference = reference;
    for (const auto& n : nodes) rep.nodes.push_back(n->capabilities());

    // Hidden states are not needed here; keeping only logits and routing
    // keeps long --tokens runs small.
    ForwardOptions ref_opt;
    ref_opt.keep_hidden = false;
    Backend& refb = *nodes[reference];
    const ForwardResult ref = forward(refb, model, ids, ref_opt);
    if (config.repeat)
        rep.repeat.push_back(self_check_of(refb.capabilities().node, run_to_run_delta(ref, forward(refb, model, ids, ref_opt))));

    ForwardOptions opt = ref_opt;
    if (config.router_authority) opt.routing = &ref.routing;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (i == reference) continue;
        Backend& be = *nodes[i];
        NodeLogits nl;
        nl.node = be.capabilities().node;
        try {
            const ForwardResult fr = forward(be, model, ids, opt);
            nl.positions = logit_divergence(ref.logits, fr.logits);
            nl.linf = summarize(nl.positions.linf);
            nl.l2 = summarize(nl.positions.l2);
            nl.kl = summarize(nl.positions.kl);
            nl.top_dp_rms = rms(nl.positions.dp_top);
            nl.stats = compare(ref.logits, fr.logits);
            if (config.repeat) {
                try {
                    rep.repeat.push_back(self_check_of(nl.node, run_to_run_delta(fr, forward(be, model, ids, opt))));
                } catch (const Error& e) {
                    rep.repeat.push_back(self_check_error(nl.node, e.what()));
                }
            }
        } catch (const Error& e) {
            nl = NodeLogits{};
            nl.node = be.capabilities().node;
            nl.error = e.what();
        }
        rep.results.push_back(std::move(nl));
    }
    return rep;
}

nlohmann::ordered_json to_json(const LogitsReport& r) {
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/logits/1";
    j["tool"] = tool_json();
    nlohmann::ordered_json c = common_json(r.config);
    c["routing"] = r.config.router_authority ? "pinned by the reference (router authority)"
                                             : "each node runs its own router (no authority)";
    j["config"] = c;
    j["reference"] = r.nodes[r.reference].node;
    j["nodes"] = nlohmann::ordered_json::array();
    for (const Capabilities& cap : r.nodes) j["nodes"].push_back(to_json(cap));
    j["results"] = nlohmann::ordered_json::array();
    for (const NodeLogits& nl : r.results) {
        nlohmann::ordered_json o;
        o["node"] = nl.node;
        if (!nl.error.empty()) {
            o["error"] = nl.error;
            j["results"].push_back(std::move(o));
            continue;
        }
        o["linf"] = to_json(nl.linf);
        o["l2"] = to_json(nl.l2);
        o["kl"] = to_json(nl.kl);
        o["top_dp_rms"] = json_double(nl.top_dp_rms);
        o["stats"] = to_json(nl.stats);
        o["positions"] = {{"linf", json_doubles(nl.positions.linf)},
                          {"l2", json_doubles(nl.positions.l2)},
                          {"kl", json_doubles(nl.positions.kl)},
                          {"dp_top", json_doubles(nl.positions.dp_top)}};
        j["results"].push_back(std::move(o));
    }
    j["repeat"] = nlohmann::ordered_json::array();
    for (const SelfCheck& s : r.repeat) j["repeat"].push_back(to_json(s));
    return j;
}

}  // namespace kvasir
