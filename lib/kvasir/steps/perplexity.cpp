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

}  // namespace kvasir
