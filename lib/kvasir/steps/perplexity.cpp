#include "kvasir/steps/perplexity.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvasir {

std::vector<std::pair<std::int64_t, std::int64_t>> perplexity_windows(std::int64_t n, std::int64_t context) {
    KVASIR_CHECK(context >= 2, ErrorCode::bad_input, "--context must be ≥ 2, got {}", context);
    std::vector<std::pair<std::int64_t, std::int64_t>> w;
    for (std::int64_t b = 0; b < n; b += context) {
        const std::int64_t e = std::min(n, b + context);
        if (e - b >= 2) w.emplace_back(b, e);
    }
    return w;
}

void PerplexityConfig::validate() const {
    StepCommon::validate();
    KVASIR_CHECK(context >= kMinPerplexityContext && context <= kMaxPerplexityContext, ErrorCode::bad_input,
                 "--context must be in {}..{}, got {}", kMinPerplexityContext, kMaxPerplexityContext, context);
    KVASIR_CHECK(!perplexity_windows(static_cast<std::int64_t>(tokens.ids.size()), context).empty(), ErrorCode::bad_input,
                 "{}: {} token(s) predict nothing (need at least 2)", tokens.source, tokens.ids.size());
    KVASIR_CHECK(!second_half || context >= 4, ErrorCode::bad_input,
                 "--score second-half needs windows of at least 4 tokens, got --context {}", context);
    if (!kl_divergence.empty()) (void)parse_base_rounding(kl_divergence);
}

std::vector<ScoredPrediction> scored_predictions(const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                                                 bool second_half) {
    std::vector<ScoredPrediction> scored;
    std::size_t k = 0;
    for (std::size_t w = 0; w < windows.size(); ++w) {
        const auto [b, e] = windows[w];
        const std::int64_t first = second_half ? (e - b) / 2 : 0;
        for (std::int64_t t = 0; t + 1 < e - b; ++t, ++k)
            if (t >= first) scored.push_back({w, t, k});
    }
    return scored;
}

std::vector<double> scored_nll(const PerplexityPass& pass, const std::vector<ScoredPrediction>& scored) {
    std::vector<double> nll;
    nll.reserve(scored.size());
    for (const ScoredPrediction& s : scored) nll.push_back(pass.nll.at(s.index));
    return nll;
}

Tensor scored_logits(const PerplexityPass& pass, const std::vector<ScoredPrediction>& scored) {
    const Tensor& l0 = pass.logits.at(0);
    const std::int64_t V = l0.shape().at(1);
    const std::size_t row_bytes = static_cast<std::size_t>(V) * dtype_size(l0.dtype());
    Tensor logits(l0.dtype(), {static_cast<std::int64_t>(scored.size()), V});
    for (std::size_t r = 0; r < scored.size(); ++r) {
        const Tensor& w = pass.logits.at(scored[r].window);
        KVASIR_ASSERT(w.dtype() == l0.dtype() && w.shape().at(1) == V && scored[r].position < w.shape().at(0));
        std::memcpy(static_cast<std::byte*>(logits.raw()) + r * row_bytes,
                    static_cast<const std::byte*>(w.raw()) + static_cast<std::size_t>(scored[r].position) * row_bytes,
                    row_bytes);
    }
    return logits;
}

std::vector<std::int32_t> scored_targets(const std::vector<std::int32_t>& ids,
                                         const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                                         const std::vector<ScoredPrediction>& scored) {
    std::vector<std::int32_t> targets;
    targets.reserve(scored.size());
    for (const ScoredPrediction& s : scored)
        targets.push_back(ids.at(static_cast<std::size_t>(windows.at(s.window).first + s.position + 1)));
    return targets;
}

PerplexityPass run_perplexity_windows(Backend& be, const PerplexityConfig& c,
                                      const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                                      const PerplexityPass* authority) {
    PerplexityPass p;
    const std::vector<std::int32_t>& ids = c.tokens.ids;
    for (std::size_t w = 0; w < windows.size(); ++w) {
        const auto [b, e] = windows[w];
        const std::span<const std::int32_t> win(ids.data() + b, static_cast<std::size_t>(e - b));
        ForwardOptions opt;
        opt.keep_hidden = false;
        if (authority != nullptr) opt.routing = &authority->routing[w];
        ForwardResult fr = forward(be, *c.model, win, opt);
        const std::vector<double> nll = token_nll(fr.logits, win.subspan(1));
        p.nll.insert(p.nll.end(), nll.begin(), nll.end());
        p.logits.push_back(std::move(fr.logits));
        p.routing.push_back(std::move(fr.routing));
    }
    return p;
}

namespace {

using Pass = PerplexityPass;

Pass run_windows(Backend& be, const PerplexityConfig& c, const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                 const Pass* authority) {
    return run_perplexity_windows(be, c, windows, authority);
}

SelfCheck compare_passes(const std::string& node, const Pass& a, const Pass& b) {
    SelfCheck s;
    s.node = node;
    s.compared = "logits of every window";
    s.bit_identical = true;
    for (std::size_t w = 0; w < a.logits.size(); ++w) {
        s.bit_identical = s.bit_identical && same_bits(a.logits[w], b.logits[w]);
        s.max_abs = nan_max(s.max_abs, max_abs_difference(a.logits[w], b.logits[w]));
    }
    return s;
}

}  // namespace

PerplexityReport run_perplexity(const PerplexityConfig& config, std::vector<std::unique_ptr<Backend>>& nodes,
                                std::size_t reference) {
    config.validate();
    KVASIR_CHECK(reference < nodes.size(), ErrorCode::bad_input, "reference index {} of {} nodes", reference, nodes.size());
    const auto windows = perplexity_windows(static_cast<std::int64_t>(config.tokens.ids.size()), config.context);
    PerplexityReport rep;
    rep.config = config;
    rep.reference = reference;
    rep.windows = static_cast<std::int64_t>(windows.size());
    for (const auto& n : nodes) rep.nodes.push_back(n->capabilities());

    Backend& refb = *nodes[reference];
    const Pass ref = run_windows(refb, config, windows, nullptr);
    const std::vector<ScoredPrediction> scored = scored_predictions(windows, config.second_half);
    const std::vector<double> ref_nll = scored_nll(ref, scored);
    rep.predictions = static_cast<std::int64_t>(ref_nll.size());
    KVASIR_CHECK(rep.predictions > 0, ErrorCode::bad_input, "{}: no prediction is scored (windows of {} tokens{})",
                 config.tokens.source, config.context, config.second_half ? ", second half" : "");
    const double ref_mean = mean_nll(ref_nll);
    const double ref_ppl = perplexity_from_nll(ref_nll);
    const Pass* authority = config.router_authority ? &ref : nullptr;
    std::optional<Tensor> ref_logits;
    std::vector<std::int32_t> targets;
    if (!config.kl_divergence.empty()) {
        ref_logits = scored_logits(ref, scored);
        targets = scored_targets(config.tokens.ids, windows, scored);
    }

    for (std::size_t i = 0; i < nodes.size(); ++i) {
        Backend& be = *nodes[i];
        NodePerplexity np;
        np.node = be.capabilities().node;
        np.reference = i == reference;
        if (i == reference) {
            np.predictions = rep.predictions;
            np.mean_nll = ref_mean;
            np.perplexity = ref_ppl;
            if (config.repeat) rep.repeat.push_back(compare_passes(np.node, ref, run_windows(be, config, windows, nullptr)));
            rep.results.push_back(std::move(np));
            continue;
        }
        try {
            const Pass p = run_windows(be, config, windows, authority);
            const std::vector<double> nll = scored_nll(p, scored);
            np.predictions = static_cast<std::int64_t>(nll.size());
            np.mean_nll = mean_nll(nll);
            np.perplexity = perplexity_from_nll(nll);
            np.delta = np.perplexity - ref_ppl;
            np.ratio = 1.0 + std::expm1(np.mean_nll - ref_mean);  // as perplexity_ratio_minus_one: finite where the perplexities overflow
            if (ref_logits)
                np.kl_divergence = llamacpp_kl_divergence(ref_logits->view(), scored_logits(p, scored).view(), targets,
                                                          parse_base_rounding(config.kl_divergence));
            for (std::size_t k = 0; k < nll.size(); ++k) {
                np.nll_max_abs_delta = nan_max(np.nll_max_abs_delta, std::fabs(nll[k] - ref_nll[k]));
            }
            if (config.repeat) {
                try {
                    rep.repeat.push_back(compare_passes(np.node, p, run_windows(be, config, windows, authority)));
                } catch (const Error& e) {
                    rep.repeat.push_back(self_check_error(np.node, e.what()));
                }
            }
        } catch (const Error& e) {
            const std::string node = np.node;
            np = NodePerplexity{};
            np.node = node;
            np.error = e.what();
        }
        rep.results.push_back(std::move(np));
    }
    return rep;
}

nlohmann::ordered_json to_json(const PerplexityReport& r) {
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/perplexity/1";
    j["tool"] = tool_json();
    nlohmann::ordered_json c = common_json(r.config);
    c["context"] = r.config.context;
    c["routing"] = r.config.router_authority ? "pinned by the reference per window (router authority)"
                                             : "each node runs its own router (no authority)";
    c["scored"] = r.config.second_half ? "second half of each window (llama-perplexity)" : "every prediction";
    if (!r.config.kl_divergence.empty()) c["kl_divergence_base_rounding"] = r.config.kl_divergence;
    j["config"] = c;
    j["reference"] = r.nodes[r.reference].node;
    j["nodes"] = nlohmann::ordered_json::array();
    for (const Capabilities& cap : r.nodes) j["nodes"].push_back(to_json(cap));
    j["windows"] = r.windows;
    j["predictions"] = r.predictions;
    j["results"] = nlohmann::ordered_json::array();
    for (const NodePerplexity& np : r.results) {
        nlohmann::ordered_json o;
        o["node"] = np.node;
        o["reference"] = np.reference;
        if (!np.error.empty()) {
            o["error"] = np.error;
            j["results"].push_back(std::move(o));
            continue;
        }
        o["predictions"] = np.predictions;
        o["mean_nll"] = json_double(np.mean_nll);
        o["perplexity"] = json_double(np.perplexity);
        o["delta"] = json_double(np.delta);
        o["ratio"] = json_double(np.ratio);
        o["nll_max_abs_delta"] = json_double(np.nll_max_abs_delta);
        if (np.kl_divergence) o["llamacpp_kl_divergence"] = to_json(*np.kl_divergence);
        j["results"].push_back(std::move(o));
    }
    j["repeat"] = nlohmann::ordered_json::array();
    for (const SelfCheck& s : r.repeat) j["repeat"].push_back(to_json(s));
    return j;
}

}  // namespace kvasir
