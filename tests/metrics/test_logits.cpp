// The statistics of logits and tensor pairs (metrics/logits.hpp) on
// constructed cases: identical logits → KL 0 and agreement 100 %; a planted
// flip at position k → first divergence k; a KL computed by hand; the
// perplexity of a uniform distribution over V is V; NaN never agrees or
// passes; a relative L2 by hand.
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/logits.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

using namespace kvasir;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor logits_from(const std::vector<std::vector<double>>& rows) {
    std::vector<double> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    return Tensor::from_f64(flat, {static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(rows[0].size())});
}

TEST(LogitMetrics, IdenticalLogitsGiveZeroKlAndFullAgreement) {
    const Tensor a = seeded_normal(7, "test/logits", {32, 384}, 0.0, 3.0, DType::f32);
    const PositionDivergence d = logit_divergence(a, a);
    ASSERT_EQ(d.kl.size(), 32u);
    for (std::size_t t = 0; t < 32; ++t) {
        EXPECT_EQ(d.kl[t], 0.0) << t;  // exactly: every term of the KL sum is p·(0 + expm1(0)) = 0
        EXPECT_EQ(d.linf[t], 0.0);
        EXPECT_EQ(d.l2[t], 0.0);
        EXPECT_EQ(d.dp_top[t], 0.0);
    }
    const Fraction f = top1_agreement(a, a);
    EXPECT_EQ(f.successes, 32);
    EXPECT_EQ(f.rate, 1.0);
    EXPECT_EQ(f.sigma, 0.0);
    EXPECT_EQ(rms(d.dp_top), 0.0);
}

TEST(LogitMetrics, PlantedFlipAtPositionKIsTheFirstDivergence) {
    // Logit rows whose argmax is token (3i mod V); the candidate swaps the top
    // two at step k only (a margin-sized wobble), so its greedy choice differs
    // there and nowhere else.
    const int n = 16, v = 40;
    for (int k : {0, 5, n - 1}) {
        std::vector<std::vector<double>> ref(n, std::vector<double>(v, 0.0)), cand;
        for (int i = 0; i < n; ++i) {
            ref[static_cast<std::size_t>(i)][static_cast<std::size_t>((3 * i) % v)] = 1.0;
            ref[static_cast<std::size_t>(i)][static_cast<std::size_t>((3 * i + 1) % v)] = 0.999;
        }
        cand = ref;
        std::swap(cand[static_cast<std::size_t>(k)][static_cast<std::size_t>((3 * k) % v)],
                  cand[static_cast<std::size_t>(k)][static_cast<std::size_t>((3 * k + 1) % v)]);
        const auto a = argmax_rows(logits_from(ref)), b = argmax_rows(logits_from(cand));
        EXPECT_EQ(first_divergence(a, b), k);
        const Fraction f = top1_agreement(logits_from(ref), logits_from(cand));
        EXPECT_EQ(f.successes, n - 1);
        const auto margins = top_margins(logits_from(ref));
        EXPECT_NEAR(margins[static_cast<std::size_t>(k)], 0.001, 1e-12);  // the margin at the flip is the wobble it took
    }
    const std::vector<std::int32_t> s{1, 2, 3}, prefix{1, 2};
    EXPECT_EQ(first_divergence(s, s), -1);
    EXPECT_EQ(first_divergence(s, prefix), 2);  // a proper prefix diverges where it ends
}

TEST(LogitMetrics, KlComputedByHand) {
    // P = softmax(0, ln 2) = (1/3, 2/3); Q = softmax(0, 0) = (1/2, 1/2):
    // KL(P‖Q) = 1/3·ln(2/3) + 2/3·ln(4/3).
    const Tensor ref = logits_from({{0.0, std::log(2.0)}});
    const Tensor cand = logits_from({{0.0, 0.0}});
    const double want = (1.0 / 3.0) * std::log(2.0 / 3.0) + (2.0 / 3.0) * std::log(4.0 / 3.0);
    const PositionDivergence d = logit_divergence(ref, cand);
    EXPECT_NEAR(d.kl[0], want, 1e-16);
    EXPECT_NEAR(d.linf[0], std::log(2.0), 1e-16);
    EXPECT_NEAR(d.l2[0], std::log(2.0), 1e-16);
    EXPECT_NEAR(d.dp_top[0], 0.5 - 2.0 / 3.0, 4e-16);  // the reference's top token loses 1/6
    // A constant shift of every logit is the same distribution: KL 0 while L∞ is the shift.
    const PositionDivergence s = logit_divergence(logits_from({{1.0, 2.0, 3.0}}), logits_from({{1.5, 2.5, 3.5}}));
    EXPECT_NEAR(s.kl[0], 0.0, 1e-16);
    EXPECT_NEAR(s.linf[0], 0.5, 1e-15);
}

TEST(LogitMetrics, PerplexityOfAUniformDistributionIsV) {
    for (std::int64_t v : {2, 384, 50000}) {
        const Tensor logits(DType::f32, {8, v});  // all zeros: uniform
        std::vector<std::int32_t> targets;
        for (int t = 0; t < 8; ++t) targets.push_back(static_cast<std::int32_t>((t * 37) % v));
        const std::vector<double> nll = token_nll(logits, targets);
        for (double x : nll) EXPECT_NEAR(x, std::log(static_cast<double>(v)), 1e-12);
        EXPECT_NEAR(perplexity_from_nll(nll) / static_cast<double>(v), 1.0, 1e-12) << v;
    }
}

// The argmax tokens a compact capture keeps are judged as the rows they came
// from: a −1 (an all-NaN row) agrees with nothing, not even another −1.
TEST(LogitMetrics, TokenAgreementByHand) {
    const std::vector<std::int32_t> ref{1, 2, -1, 4}, cand{1, 3, -1, 4};
    const Fraction f = token_agreement(ref, cand);
    EXPECT_EQ(f.successes, 2);
    EXPECT_EQ(f.n, 4);
    const std::vector<std::int32_t> shorter{1};
    EXPECT_THROW(token_agreement(ref, shorter), Error);
}

TEST(LogitMetrics, NanNeverAgreesOrPasses) {
    Tensor ref = logits_from({{0.0, 1.0, 2.0}, {2.0, 1.0, 0.0}});
    Tensor cand = ref;
    for (int j = 0; j < 3; ++j) cand.set(3 + j, kNaN);  // row 1 all NaN
    EXPECT_EQ(argmax_rows(cand)[1], -1);
    EXPECT_EQ(top1_agreement(ref, cand).successes, 1);
    const PositionDivergence d = logit_divergence(ref, cand);
    EXPECT_EQ(d.kl[0], 0.0);
    EXPECT_TRUE(std::isnan(d.kl[1]));
    EXPECT_TRUE(std::isnan(d.linf[1]));
    EXPECT_TRUE(std::isnan(summarize(d.kl).max));  // the NaN survives the summary
    cand.set(4, 1.0);                                // one finite value: still a mismatch row
    EXPECT_TRUE(std::isnan(logit_divergence(ref, cand).l2[1]));
}

TEST(LogitMetrics, RelativeL2) {
    const Tensor ref = Tensor::from_f64(std::vector<double>{3.0, 4.0}, {2});
    const Tensor cand = Tensor::from_f64(std::vector<double>{3.0, 4.5}, {2});
    EXPECT_NEAR(relative_l2(ref, cand), 0.1, 1e-15);
    EXPECT_EQ(relative_l2(ref, ref), 0.0);
}

}  // namespace

namespace {

TEST(LogitMetrics, SameBitsComparesBytesDtypeAndShapeAndNeverReadsAnEmptyTensor) {
    const Tensor a = Tensor::from_f64(std::vector<double>{1.0, -0.0}, {2});
    Tensor b = a;
    EXPECT_TRUE(same_bits(a, b));
    b.set(1, 0.0);  // +0 == −0 as numbers, not as bits
    EXPECT_FALSE(same_bits(a, b));
    EXPECT_FALSE(same_bits(a, Tensor::from_f64(std::vector<double>{1.0, -0.0}, {1, 2})));
    EXPECT_FALSE(same_bits(a, Tensor::convert(a.view(), DType::f32)));
    const Tensor none, other;  // no bytes: the view's shape {} claims one element
    EXPECT_TRUE(same_bits(none, other));
    EXPECT_FALSE(same_bits(none, Tensor(DType::f32, {})));
}

}  // namespace
