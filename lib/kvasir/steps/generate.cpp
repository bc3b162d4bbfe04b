#include "kvasir/steps/generate.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"

#include <cmath>
#include <limits>

namespace kvasir {

void GenerateConfig::validate() const {
    StepCommon::validate();
    KVASIR_CHECK(new_tokens >= 1 && new_tokens <= 4096, ErrorCode::bad_input, "--new-tokens must be in 1..4096, got {}",
                 new_tokens);
}

namespace {

// Row i of [n, V] logits as a [1, V] view.
TensorView row_view(const Tensor& t, std::int64_t i) {
    const TensorView r = t.view().row(i);
    return TensorView{r.dtype, r.data, {1, t.dim(1)}};
}

SelfCheck compare_generations(const std::string& node, const GenerateResult& a, const GenerateResult& b) {
    SelfCheck s;
    s.node = node;
    s.compared = "free greedy generation: tokens and per-step logits";
    for (std::size_t i = 0; i < a.tokens.size() && i < b.tokens.size(); ++i) s.tokens_differing += a.tokens[i] != b.tokens[i];
    s.bit_identical = s.tokens_differing == 0 && same_bits(a.logits, b.logits);
    s.max_abs = max_abs_difference(a.logits, b.logits);
    return s;
}

}  // namespace

GenerateReport run_generate(const GenerateConfig& config, std::vector<std::unique_ptr<Backend>>& nodes,
                            std::size_t reference) {
    config.validate();
    KVASIR_CHECK(reference < nodes.size(), ErrorCode::bad_input, "reference index {} of {} nodes", reference, nodes.size());
    const Model& model = *config.model;
    const std::vector<std::int32_t>& prompt = config.tokens.ids;
    const int n = config.new_tokens;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    GenerateReport rep;
    rep.config = config;
    rep.reference = reference;
    for (const auto& nd : nodes) rep.nodes.push_back(nd->capabilities());

    Backend& refb = *nodes[reference];
    const GenerateResult ref = greedy_generate(refb, model, prompt, n);
    rep.reference_tokens = ref.tokens;
    if (config.tokenizer) rep.reference_text = config.tokenizer->decode(ref.tokens);
    rep.reference_margins = ref.margins;
    if (config.repeat)
        rep.repeat.push_back(compare_generations(refb.capabilities().node, ref, greedy_generate(refb, model, prompt, n)));

    for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (i == reference) continue;
        Backend& be = *nodes[i];
        NodeGenerate ng;
        ng.node = be.capabilities().node;
        try {
            const GenerateResult fr = greedy_generate(be, model, prompt, n);
            ng.tokens = fr.tokens;
            if (config.tokenizer) ng.text = config.tokenizer->decode(fr.tokens);
            ng.margins = fr.margins;
            ng.first_divergence = first_divergence(ref.tokens, fr.tokens);
            ng.ref_margin_at_divergence =
                ng.first_divergence >= 0 ? ref.margins[static_cast<std::size_t>(ng.first_divergence)] : nan;
            ng.cand_margin_at_divergence =
                ng.first_divergence >= 0 ? fr.margins[static_cast<std::size_t>(ng.first_divergence)] : nan;

            const GenerateResult pn = greedy_generate(be, model, prompt, n, &ref.tokens, &ref.routing);
            ng.pinned_own = pn.tokens;
            ng.sequence_identical = pn.fed == ref.fed;
            for (int s = 0; s < n; ++s) {
                const auto si = static_cast<std::size_t>(s);
                if (pn.tokens[si] != ref.tokens[si]) {
                    ++ng.divergences;
                    ng.divergence_steps.push_back(s);
                }
                const TensorView a = row_view(ref.logits, s), b = row_view(pn.logits, s);
                const double d = max_abs_difference(a, b);
                ng.step_max_abs.push_back(d);
                ng.step_kl.push_back(logit_divergence(a, b).kl[0]);
                if (std::isnan(d) || std::isnan(ng.max_abs))
                    ng.max_abs = nan;
                else if (d > ng.max_abs)
                    ng.max_abs = d;
            }
            if (config.repeat) {
                try {
                    rep.repeat.push_back(compare_generations(ng.node, fr, greedy_generate(be, model, prompt, n)));
                } catch (const Error& e) {
                    rep.repeat.push_back(self_check_error(ng.node, e.what()));
                }
            }
        } catch (const Error& e) {
            const std::string node = ng.node;
            ng = NodeGenerate{};
            ng.node = node;
            ng.error = e.what();
        }
        rep.results.push_back(std::move(ng));
    }
    return rep;
}

nlohmann::ordered_json to_json(const GenerateReport& r) {
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/generate/1";
    j["tool"] = tool_json();
    nlohmann::ordered_json c = common_json(r.config);
    c["new_tokens"] = r.config.new_tokens;
    c["free"] = "each node decodes on its own: own router, own argmax fed back";
    c["pinned"] = "the reference's tokens fed (teacher forcing) and its routing imposed at every step";
    j["config"] = c;
    j["reference"] = r.nodes[r.reference].node;
    j["nodes"] = nlohmann::ordered_json::array();
    for (const Capabilities& cap : r.nodes) j["nodes"].push_back(to_json(cap));
    j["reference_tokens"] = r.reference_tokens;
    if (r.reference_text) j["reference_text"] = *r.reference_text;
    j["reference_margins"] = json_doubles(r.reference_margins);
    j["results"] = nlohmann::ordered_json::array();
    for (const NodeGenerate& ng : r.results) {
        nlohmann::ordered_json o;
        o["node"] = ng.node;
        if (!ng.error.empty()) {
            o["error"] = ng.error;
            j["results"].push_back(std::move(o));
            continue;
        }
        nlohmann::ordered_json f;
        f["tokens"] = ng.tokens;
        if (ng.text) f["text"] = *ng.text;
        f["margins"] = json_doubles(ng.margins);
        f["first_divergence"] = ng.first_divergence;
        f["ref_margin_at_divergence"] = json_double(ng.ref_margin_at_divergence);
        f["cand_margin_at_divergence"] = json_double(ng.cand_margin_at_divergence);
        o["free"] = f;
        nlohmann::ordered_json p;
        p["own_tokens"] = ng.pinned_own;
        p["divergences"] = ng.divergences;
        p["steps"] = r.config.new_tokens;
        p["divergence_steps"] = ng.divergence_steps;
        p["sequence_identical"] = ng.sequence_identical;
        p["step_max_abs"] = json_doubles(ng.step_max_abs);
        p["step_kl"] = json_doubles(ng.step_kl);
        p["max_abs"] = json_double(ng.max_abs);
        o["pinned"] = p;
        j["results"].push_back(std::move(o));
    }
    j["repeat"] = nlohmann::ordered_json::array();
    for (const SelfCheck& s : r.repeat) j["repeat"].push_back(to_json(s));
    return j;
}

}  // namespace kvasir
