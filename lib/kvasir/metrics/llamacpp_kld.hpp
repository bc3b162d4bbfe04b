// llama.cpp's divergence statistics (`llama-perplexity --kl-divergence`,
// tools/perplexity/perplexity.cpp of the llama.cpp the tests build), with
// its definitions, over P predictions: the base (reference) and candidate
// logits of each scored position and the token that follows it.
//
// Per prediction i (base b, candidate q; log-softmax over the vocabulary):
//   nll_q  = −log q(t_i),   nll_b = −log b(t_i)
//   KLD_i  = Σ_{v: log b(v) > −16} b(v)·(log b(v) − log q(v))   (llama.cpp's cut)
//   Δp_i   = q(t_i) − b(t_i)
//   same   = argmax q == argmax b (first maximum on both sides)
// Aggregates, each "mean ± uncertainty" as llama.cpp's mean_and_uncertainty:
//   f = Σx/n, uncertainty = sqrt((Σx²/n − f²)/(n−1)) when that variance is
//   > 0 and n > 10, else 0; cov(a, b) = (Σab/n − (Σa/n)(Σb/n))/(n−1) (0 when
//   n < 10):
//   PPL(Q) = exp(mean nll_q) ± PPL·unc, PPL(base) likewise;
//   Cor(ln PPL(Q), ln PPL(base)) = cov / (unc_q · unc_b);
//   ln(PPL(Q)/PPL(base)) = mean nll_q − mean nll_b ± sqrt(unc_q² + unc_b² − 2 cov);
//   PPL(Q)/PPL(base) = exp(that) ± ratio·unc; PPL(Q) − PPL(base) ±
//   sqrt(unc_PPLq² + unc_PPLb² − 2·PPLq·PPLb·cov);
//   KLD: mean ± unc, and of the sorted values max, min, the median (mean of
//   the two middle ones for an even count) and percentiles 99.9 99 95 90 10
//   5 1 0.1 as llama.cpp's percentile(): p = f·(n − 1), linear between
//   values[⌊p⌋] and values[⌊p⌋ + 1];
//   Δp: mean ± unc, max, min, median and percentiles 99.9 99 95 90 75 25 10
//   5 1 0.1; RMS Δp = sqrt(mean Δp²) ± 0.5/RMS · unc(Δp²);
//   same top p = n_same/n ± sqrt(p(1 − p)/(n − 1)).
// Checked against llama-perplexity's own output in tests/cli/test_llamacpp_node.sh:
// every figure it prints, to its printed digits.
//
// Base rounding. llama-perplexity never keeps the base logits: its
// --kl-divergence-base file stores each row's log-probabilities as uint16,
// q = nearest_int((logit − m)/s) with m = max(min logit, max logit − 16),
// s = (max logit − m)/65535, decoded as s·q + (m − max − log Σ e^(logit−max))
// (every logit ≤ m stores 0, so a target ≥ 16 nats below the top token
// keeps only that floor). `llamacpp_u16` applies that rounding (in f32, as
// llama.cpp does) to the base and computes each prediction's terms in f32 as
// llama-perplexity does (sums in f64): its figures are then llama-perplexity's
// own, quantisation steps of up to 16/65535 ≈ 2.4e-4 nats included (KLDs
// below ~1e-4 and even negative ones are that rounding). `exact` (the
// default) is f64 throughout on the base's log-probabilities as they are.
#pragma once

#include "kvasir/core/tensor.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvasir {

enum class BaseRounding { exact, llamacpp_u16 };
// "exact" / "llamacpp-u16"; Error(bad_input) naming both for anything else.
BaseRounding parse_base_rounding(std::string_view s);
const char* to_string(BaseRounding r) noexcept;

struct ValueUncertainty {
    double value = 0;
    double uncertainty = 0;
};

// The order statistics llama-perplexity prints of a sample: max, min, the
// median and percentiles (llama.cpp's percentile(), see the header).
struct Spread {
    double max = 0, p999 = 0, p99 = 0, p95 = 0, p90 = 0, p75 = 0, median = 0, p25 = 0, p10 = 0, p5 = 0, p1 = 0, p01 = 0,
           min = 0;
};

struct LlamaCppKld {
    std::int64_t count = 0;  // predictions
    ValueUncertainty ppl, ppl_base, ln_ppl_ratio, ppl_ratio, ppl_diff;
    double ln_ppl_correlation = 0;  // Cor(ln PPL(Q), ln PPL(base)), a fraction (llama.cpp prints %)
    ValueUncertainty kld;
    Spread kld_spread;    // llama.cpp prints all but p75 / p25 for the KLD
    ValueUncertainty dp;  // Δp as a fraction (llama.cpp prints %)
    Spread dp_spread;
    ValueUncertainty dp_rms;
    ValueUncertainty same_top;  // fraction
};

// base and cand: [P, V] logits (any float dtype, widened exactly); targets:
// P token ids in [0, V). Error(bad_input) for mismatched shapes, P < 2 or a
// target outside the vocabulary. A non-finite logit makes the figures NaN.
LlamaCppKld llamacpp_kl_divergence(const TensorView& base, const TensorView& cand, const std::vector<std::int32_t>& targets,
                                   BaseRounding rounding);

// The figures under llama.cpp's names ("Mean PPL(Q)", "Mean KLD", "99.9% KLD",
// "RMS Δp", "Same top p", …: {"value", "uncertainty"} or a number).
nlohmann::ordered_json to_json(const LlamaCppKld& k);

}  // namespace kvasir
