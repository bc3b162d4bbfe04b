// llama-perplexity's divergence statistics (metrics/llamacpp_kld.hpp) on
// hand-computed cases; tests/cli/test_llamacpp_node.sh checks every figure
// against llama-perplexity's own output on real data.
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/llamacpp_kld.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvasir {
namespace {

Tensor rows(const std::vector<std::vector<double>>& r) {
    Tensor t(DType::f64, {static_cast<std::int64_t>(r.size()), static_cast<std::int64_t>(r[0].size())});
    double* p = t.as<double>();
    for (const auto& row : r)
        for (double x : row) *p++ = x;
    return t;
}

TEST(LlamaCppKld, TwoPredictionsByHand) {
    // Prediction 0: base softmax [1/4, 3/4], candidate [1/2, 1/2], target 1.
    // Prediction 1: identical [1, 2, 3]-like rows (here 2 logits), target 0.
    const Tensor base = rows({{0.0, std::log(3.0)}, {1.0, 2.0}});
    const Tensor cand = rows({{0.0, 0.0}, {1.0, 2.0}});
    const LlamaCppKld k = llamacpp_kl_divergence(base.view(), cand.view(), {1, 0}, BaseRounding::exact);
    const double kl0 = 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5);
    EXPECT_EQ(k.count, 2);
    EXPECT_NEAR(k.kld.value, kl0 / 2, 1e-15);
    EXPECT_EQ(k.kld.uncertainty, 0.0);  // n <= 10: llama.cpp reports no uncertainty
    EXPECT_NEAR(k.kld_spread.max, kl0, 1e-15);
    EXPECT_NEAR(k.kld_spread.min, 0.0, 1e-15);
    EXPECT_NEAR(k.kld_spread.median, kl0 / 2, 1e-15);         // even count: mean of the middle two
    EXPECT_NEAR(k.kld_spread.p99, 0.99 * kl0, 1e-15);         // p = 0.99·(n − 1), linear between the two
    EXPECT_NEAR(k.kld_spread.p10, 0.10 * kl0, 1e-15);
    // Δp of the targets: 1/2 − 3/4 and 0.
    const double p_b1 = std::exp(1.0) / (std::exp(1.0) + std::exp(2.0));
    EXPECT_NEAR(k.dp_spread.min, -0.25, 1e-15);
    EXPECT_NEAR(k.dp_spread.max, 0.0, 1e-15);
    EXPECT_NEAR(k.dp.value, -0.125, 1e-15);
    EXPECT_NEAR(k.dp_rms.value, std::sqrt(0.0625 / 2), 1e-15);
    // Same top: prediction 0's candidate ties (first maximum: token 0), the base's top is 1; prediction 1 agrees.
    EXPECT_DOUBLE_EQ(k.same_top.value, 0.5);
    EXPECT_DOUBLE_EQ(k.same_top.uncertainty, std::sqrt(0.5 * 0.5 / 1));
    // Perplexities of the targets.
    const double nll_q = (std::log(2.0) - std::log(p_b1)) / 2, nll_b = (-std::log(0.75) - std::log(p_b1)) / 2;
    EXPECT_NEAR(k.ppl.value, std::exp(nll_q), 1e-12);
    EXPECT_NEAR(k.ppl_base.value, std::exp(nll_b), 1e-12);
    EXPECT_NEAR(k.ln_ppl_ratio.value, nll_q - nll_b, 1e-15);
    EXPECT_NEAR(k.ppl_ratio.value, std::exp(nll_q - nll_b), 1e-15);
    EXPECT_NEAR(k.ppl_diff.value, std::exp(nll_q) - std::exp(nll_b), 1e-12);
    const auto j = to_json(k);
    EXPECT_EQ(j["predictions"], 2);
    EXPECT_NEAR(j["Mean KLD"]["value"].get<double>(), kl0 / 2, 1e-15);
    EXPECT_TRUE(j.contains("99.9% KLD") && j.contains("RMS Δp") && j.contains("Same top p") &&
                j.contains("Cor(ln(PPL(Q)), ln(PPL(base)))"));
}

TEST(LlamaCppKld, UncertaintiesFollowLlamaCppFromElevenPredictions) {
    // 12 predictions, base row i = [0, a_i], candidate [0, 0], target 0: KLD_i and nll are known in closed form;
    // the uncertainty is sqrt(population variance / (n − 1)), the covariance (Σab/n − ΣaΣb/n²)/(n − 1).
    std::vector<std::vector<double>> b, c;
    std::vector<double> kl, nq, nb;
    for (int i = 0; i < 12; ++i) {
        const double a = 0.1 * i;
        b.push_back({0.0, a});
        c.push_back({0.0, 0.0});
        const double p1 = std::exp(a) / (1 + std::exp(a)), p0 = 1 - p1;
        kl.push_back(p0 * std::log(p0 / 0.5) + p1 * std::log(p1 / 0.5));
        nq.push_back(std::log(2.0));
        nb.push_back(-std::log(p0));
    }
    const Tensor base = rows(b), cand = rows(c);
    const LlamaCppKld k = llamacpp_kl_divergence(base.view(), cand.view(), std::vector<std::int32_t>(12, 0), BaseRounding::exact);
    const auto mean_unc = [](const std::vector<double>& x) {
        double s = 0, s2 = 0;
        for (double v : x) {
            s += v;
            s2 += v * v;
        }
        const double n = static_cast<double>(x.size()), f = s / n;
        return std::pair{f, std::sqrt((s2 / n - f * f) / (n - 1))};
    };
    EXPECT_NEAR(k.kld.value, mean_unc(kl).first, 1e-15);
    EXPECT_NEAR(k.kld.uncertainty, mean_unc(kl).second, 1e-12);
    // The candidate's nll is constant: no spread (up to the cancellation of llama.cpp's one-pass variance,
    // Σx²/n − f², ~1e-17 here), so the ln-ratio uncertainty is the base's alone (cov ~0).
    EXPECT_NEAR(k.ppl.uncertainty, 0.0, 1e-7);
    EXPECT_NEAR(k.ln_ppl_ratio.uncertainty, mean_unc(nb).second, 1e-8);
    // Same top: the candidate ties (first maximum: token 0), the base's top is token 1 except for a_0 = 0.
    EXPECT_DOUBLE_EQ(k.same_top.value, 1.0 / 12);
    EXPECT_DOUBLE_EQ(k.same_top.uncertainty, std::sqrt((1.0 / 12) * (11.0 / 12) / 11));
}

TEST(LlamaCppKld, Uint16BaseRoundingAsLlamaPerplexityStoresIt) {
    // A target 20 nats below the top: llama-perplexity's base file floors every log-prob at max − 16 (stored 0),
    // so its nll_base is ~16, not ~20; exact keeps 20. Elsewhere the rounding moves a log-prob by at most half a
    // step (16/65535)/2.
    const Tensor base = rows({{0.0, -20.0, -3.0}, {0.5, 0.25, -1.0}});
    const Tensor cand = rows({{0.0, -20.0, -3.0}, {0.5, 0.25, -1.0}});
    const LlamaCppKld exact = llamacpp_kl_divergence(base.view(), cand.view(), {1, 2}, BaseRounding::exact);
    const LlamaCppKld u16 = llamacpp_kl_divergence(base.view(), cand.view(), {1, 2}, BaseRounding::llamacpp_u16);
    EXPECT_NEAR(exact.kld.value, 0.0, 1e-15);  // identical rows
    const double lse0 = std::log(1 + std::exp(-20.0) + std::exp(-3.0));
    // exact: −log b(1) = 20 + lse0; u16: −(min_logit − max − lse) = 16 + lse0 (f32).
    const double lse1 = std::log(std::exp(0.5) + std::exp(0.25) + std::exp(-1.0));
    EXPECT_NEAR(std::log(exact.ppl_base.value) * 2, (20 + lse0) + (1 + lse1), 1e-12);
    EXPECT_LT(u16.ppl_base.value, exact.ppl_base.value);
    EXPECT_NEAR(std::log(exact.ppl_base.value / u16.ppl_base.value) * 2, 4.0, 1e-3);
    // Rounded identical rows: |KLD| within the rounding (f32 terms and half a u16 step).
    EXPECT_LT(std::abs(u16.kld.value), 16.0 / 65535);
    EXPECT_EQ(to_string(BaseRounding::llamacpp_u16), std::string("llamacpp-u16"));
    EXPECT_EQ(parse_base_rounding("exact"), BaseRounding::exact);
    EXPECT_THROW((void)parse_base_rounding("u16"), Error);
}

TEST(LlamaCppKld, BadInputIsRefusedAndNaNPropagates) {
    const Tensor a = rows({{0.0, 1.0}, {1.0, 0.0}});
    const Tensor b3 = rows({{0.0, 1.0, 2.0}, {1.0, 0.0, 2.0}});
    EXPECT_THROW((void)llamacpp_kl_divergence(a.view(), b3.view(), {0, 1}, BaseRounding::exact), Error);  // shapes
    EXPECT_THROW((void)llamacpp_kl_divergence(a.view(), a.view(), {0}, BaseRounding::exact), Error);      // targets
    EXPECT_THROW((void)llamacpp_kl_divergence(a.view(), a.view(), {0, 2}, BaseRounding::exact), Error);   // target ≥ V
    const Tensor n = rows({{0.0, std::numeric_limits<double>::quiet_NaN()}, {1.0, 0.0}});
    const LlamaCppKld k = llamacpp_kl_divergence(a.view(), n.view(), {0, 1}, BaseRounding::exact);
    EXPECT_TRUE(std::isnan(k.kld.value));
    EXPECT_TRUE(std::isnan(k.kld_spread.max));
    EXPECT_TRUE(std::isnan(k.same_top.value));
}

}  // namespace
}  // namespace kvasir
