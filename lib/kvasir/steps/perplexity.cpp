#include "kvasir/steps/perplexity.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"

#include <algorithm>
#include <cmath>
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
    KVASIR_CHECK(context >= 2 && context <= 65536, ErrorCode::bad_input, "--context must be in 2..65536, got {}", context);
    KVASIR_CHECK(!perplexity_windows(static_cast<std::int64_t>(tokens.ids.size()), context).empty(), ErrorCode::bad_input,
                 "{}: {} token(s) predict nothing (need at least 2)", tokens.source, tokens.ids.size());
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
        const double d = max_abs_difference(a.logits[w], b.logits[w]);
        if (std::isnan(d) || std::isnan(s.max_abs))
            s.max_abs = std::numeric_limits<double>::quiet_NaN();
        else if (d > s.max_abs)
            s.max_abs = d;
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
    rep.predictions = static_cast<std::int64_t>(ref.nll.size());
    const double ref_mean = mean_nll(ref.nll);
    const double ref_ppl = perplexity_from_nll(ref.nll);
    const Pass* authority = config.router_authority ? &ref : nullptr;

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
            np.predictions = static_cast<std::int64_t>(p.nll.size());
            np.mean_nll = mean_nll(p.nll);
            np.perplexity = perplexity_from_nll(p.nll);
            np.delta = np.perplexity - ref_ppl;
            np.ratio = 1.0 + std::expm1(np.mean_nll - ref_mean);  // as perplexity_ratio_minus_one: finite where the perplexities overflow
            for (std::size_t k = 0; k < p.nll.size(); ++k) {
                const double d = std::fabs(p.nll[k] - ref.nll[k]);
                if (std::isnan(d) || std::isnan(np.nll_max_abs_delta))
                    np.nll_max_abs_delta = std::numeric_limits<double>::quiet_NaN();
                else if (d > np.nll_max_abs_delta)
                    np.nll_max_abs_delta = d;
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
        j["results"].push_back(std::move(o));
    }
    j["repeat"] = nlohmann::ordered_json::array();
    for (const SelfCheck& s : r.repeat) j["repeat"].push_back(to_json(s));
    return j;
}

}  // namespace kvasir
