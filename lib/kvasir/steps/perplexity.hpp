// Protocol step 6 — task level: perplexity on a token stream.
//
// The stream (StepCommon::tokens: by default fixtures/tokens/default.txt,
// chosen by the CLI) is cut into consecutive, non-overlapping windows of
// `context` tokens (the last window keeps what is left if that is at least 2
// tokens; a shorter tail predicts nothing and is dropped). Each window is
// one forward pass from an empty cache; inside it position t predicts token
// t+1, so a window of C tokens gives C − 1 predictions with NLL =
// −log softmax(logits[t])[token t+1] (f64, token_nll). Per node:
//   perplexity = exp(mean NLL over every prediction of every window)
// and, against the reference: delta = ppl_node − ppl_ref, ratio = ppl_node /
// ppl_ref, and the largest per-prediction |ΔNLL|. The absolute value means
// little on the fixtures: random weights on a random stream are confidently
// wrong (peaked distributions, logits up to ~14), so their perplexity lies
// far ABOVE the vocabulary size that a uniform guess would score (exactly V).
// The ratio is the point: measured 1 ± 2e-7 for the f32 backends, ~1.001–
// 1.002 with f16 accumulation or bf16 storage.
//
// Routing: pinned by the reference (router authority, per window) by
// default, as a swarm runs; router_authority = false lets each node route
// for itself.
//
// The audit's perplexity step (audit/step_perplexity.cpp) runs these
// windows on every node and compares them; the perplexity command is its
// view (audit/step_view.hpp).
#pragma once

#include "kvasir/metrics/llamacpp_kld.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

// The window lengths a run accepts (the CLI's --context and a protocol's
// steps.perplexity.context alike).
inline constexpr std::int64_t kMinPerplexityContext = 2, kMaxPerplexityContext = 65536;

struct PerplexityConfig : StepCommon {
    std::int64_t context = 64;    // window length, kMinPerplexityContext … kMaxPerplexityContext
    bool router_authority = true;
    // llama-perplexity's scoring: only the predictions from position ⌊C/2⌋
    // of each window of C tokens count (its rule; needs C ≥ 4).
    bool second_half = false;
    // llama-perplexity --kl-divergence's statistics of each node against the
    // reference over the scored predictions (metrics/llamacpp_kld.hpp), the
    // base rounded as "exact" or "llamacpp-u16"; empty: not computed.
    std::string kl_divergence;
    void validate() const;        // StepCommon::validate + context range + at least one window of ≥ 2 tokens
};

// The windows [begin, end) of a stream of n tokens (pure, for tests).
std::vector<std::pair<std::int64_t, std::int64_t>> perplexity_windows(std::int64_t n, std::int64_t context);

// One backend's pass over the windows (exposed for capture): per window the
// logits and the routing used, and the NLL of every prediction in order.
// `authority` (may be null) pins each window's routing to its plans.
struct PerplexityPass {
    std::vector<Tensor> logits;                     // per window [C, V]
    std::vector<std::vector<RoutingPlan>> routing;  // per window
    std::vector<double> nll;                        // every prediction, window by window
};
PerplexityPass run_perplexity_windows(Backend& be, const PerplexityConfig& config,
                                      const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                                      const PerplexityPass* authority);

// The predictions a run scores, in pass order: every one, or with
// second_half those from position ⌊C/2⌋ of each window of C tokens.
struct ScoredPrediction {
    std::size_t window = 0;
    std::int64_t position = 0;  // in the window: predicts its token position + 1
    std::size_t index = 0;      // into PerplexityPass::nll
};
std::vector<ScoredPrediction> scored_predictions(const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                                                 bool second_half);
// The scored predictions' NLL, logits rows [P, V] (the pass's float type) and target ids.
std::vector<double> scored_nll(const PerplexityPass& pass, const std::vector<ScoredPrediction>& scored);
Tensor scored_logits(const PerplexityPass& pass, const std::vector<ScoredPrediction>& scored);
std::vector<std::int32_t> scored_targets(const std::vector<std::int32_t>& ids,
                                         const std::vector<std::pair<std::int64_t, std::int64_t>>& windows,
                                         const std::vector<ScoredPrediction>& scored);

}  // namespace kvasir
