// metrics/compact.hpp on hand-computed cases: the top-K with its ties and
// NaNs, the log-probabilities and log-sum-exp, the fingerprint's order, and the
// two comparisons — the missing-entry lower bound included.
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/compact.hpp"
#include "kvasir/metrics/logits.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

using namespace kvasir;

namespace {

Tensor f64(std::vector<double> v, Shape s) { return Tensor::from_f64(v, std::move(s), DType::f64); }
Tensor i32(std::vector<std::int32_t> v, Shape s) {
    Tensor t(DType::i32, std::move(s));
    for (std::size_t i = 0; i < v.size(); ++i) static_cast<std::int32_t*>(t.raw())[i] = v[i];
    return t;
}

TEST(Compact, TopKLogProbabilitiesAndLogSumExpByHand) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // Row 0: ties 3 = 3 go to the lower id; row 1: NaN is never chosen.
    const Tensor logits = f64({1, 3, 2, 3, 0, /**/ nan, -1, 5, 0, 5}, {2, 5});
    const CompactRows c = compact_rows(logits.view(), 3);
    const double lse0 = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0) + 1.0);
    EXPECT_EQ(std::vector<std::int32_t>(c.ids.as<std::int32_t>(), c.ids.as<std::int32_t>() + 3), (std::vector<std::int32_t>{1, 3, 2}));
    EXPECT_FLOAT_EQ(c.lse.as<float>()[0], static_cast<float>(lse0));
    EXPECT_FLOAT_EQ(c.logprobs.as<float>()[0], static_cast<float>(3 - lse0));
    EXPECT_FLOAT_EQ(c.logprobs.as<float>()[2], static_cast<float>(2 - lse0));
    // Row 1 holds a NaN: its log-sum-exp is NaN, and so is every log-probability; the ids skip it.
    EXPECT_EQ(c.ids.as<std::int32_t>()[3], 2);
    EXPECT_EQ(c.ids.as<std::int32_t>()[4], 4);
    EXPECT_EQ(c.ids.as<std::int32_t>()[5], 3);
    EXPECT_TRUE(std::isnan(c.lse.as<float>()[1]));
    EXPECT_THROW(compact_rows(logits.view(), 6), Error);
}

TEST(Compact, FingerprintKeepsTheLargestMagnitudesPerChunkOf32) {
    // 33 positions of width 1: chunk 0 holds positions 0–31 (values ±t), chunk 1 position 32 alone.
    std::vector<double> v(33);
    for (int t = 0; t < 33; ++t) v[static_cast<std::size_t>(t)] = (t % 2 ? -1.0 : 1.0) * t;
    const Fingerprint f = hidden_fingerprint(f64(v, {33, 1}).view());
    ASSERT_EQ(f.index.shape(), (Shape{2, 16}));
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(f.index.as<std::int32_t>()[j], 31 - j);
        EXPECT_EQ(f.value.as<float>()[j], static_cast<float>(v[static_cast<std::size_t>(31 - j)]));
    }
    EXPECT_EQ(f.index.as<std::int32_t>()[16], 0);  // chunk 1: flat index 0 within it, value 32
    EXPECT_EQ(f.value.as<float>()[16], 32.0f);
    EXPECT_EQ(f.index.as<std::int32_t>()[17], -1);  // padding
}

TEST(Compact, TopLogprobDeltaComparesTheSharedTokensOnly) {
    const Tensor ri = i32({4, 7, 9}, {1, 3}), rl = f64({-0.1, -2.5, -4.0}, {1, 3});
    const Tensor ci = i32({7, 4, 1}, {1, 3}), cl = f64({-2.0, -0.125, -3.0}, {1, 3});
    const std::vector<double> d = top_logprob_delta(ri.view(), rl.view(), ci.view(), cl.view());
    ASSERT_EQ(d.size(), 1u);
    EXPECT_DOUBLE_EQ(d[0], 0.5);  // id 7: |−2.5 − (−2)|; id 4: 0.025; ids 9 and 1 are not shared
    const Tensor none = i32({1, 2, 3}, {1, 3});
    EXPECT_EQ(top_logprob_delta(ri.view(), rl.view(), none.view(), cl.view())[0], 0.0);
}

TEST(Compact, FingerprintRelCountsAMissingEntryByItsLowerBound) {
    // Reference entries 5 (8.0) and 9 (−4.0); the candidate has 5 at 8.2 and, instead of 9,
    // 11 at 3.0: its value at 9 is at most 3.0 in size, so |Δ| ≥ 4 − 3 = 1, i.e. 0.25 of 4.
    std::vector<std::int32_t> r(16, -1), c(16, -1);
    std::vector<double> rv(16, 0), cv(16, 0);
    r[0] = 5, rv[0] = 8.0, r[1] = 9, rv[1] = -4.0;
    c[0] = 5, cv[0] = 8.2, c[1] = 11, cv[1] = 3.0;
    const std::vector<double> d =
        fingerprint_rel(i32(r, {1, 16}).view(), f64(rv, {1, 16}).view(), i32(c, {1, 16}).view(), f64(cv, {1, 16}).view());
    EXPECT_DOUBLE_EQ(d[0], 0.25);
    cv[1] = 3.9;  // a near tie: the bound shrinks to the gap
    EXPECT_NEAR(fingerprint_rel(i32(r, {1, 16}).view(), f64(rv, {1, 16}).view(), i32(c, {1, 16}).view(), f64(cv, {1, 16}).view())[0],
                std::max(0.2 / 8.0, 0.1 / 4.0), 1e-15);
}


// The KL lower bound by hand. p = (1/6, 2/6, 3/6) from the logits (0, ln 2, ln 3).
TEST(Compact, KlLowerBoundByHand) {
    const Tensor ref = f64({0.0, std::log(2.0), std::log(3.0)}, {1, 3});
    // A candidate that keeps its top-1 only: token 2 at q = 0.4. The partition {2, rest}:
    // 0.5·ln(0.5/0.4) + 0.5·ln(0.5/0.6), whatever the candidate does with tokens 0 and 1.
    const double want = 0.5 * std::log(0.5 / 0.4) + 0.5 * std::log(0.5 / 0.6);
    const Tensor ci = i32({2}, {1, 1}), cl = f64({static_cast<float>(std::log(0.4))}, {1, 1});
    const std::vector<double> lb = kl_lower_bound({ref.view(), {}, {}}, {{}, ci.view(), cl.view()});
    ASSERT_EQ(lb.size(), 1u);
    EXPECT_NEAR(lb[0], want, 1e-6);
    EXPECT_LE(lb[0], want);  // the rounding allowance only lowers it
    // Both compact (K = 2): the reference holds {2, 1}, the candidate {2, 0}; A = {2}: the same bound.
    const Tensor ri = i32({2, 1}, {1, 2}), rl = f64({std::log(0.5), std::log(1.0 / 3)}, {1, 2});
    const Tensor ci2 = i32({2, 0}, {1, 2}), cl2 = f64({std::log(0.4), std::log(0.35)}, {1, 2});
    EXPECT_NEAR(kl_lower_bound({{}, ri.view(), rl.view()}, {{}, ci2.view(), cl2.view()})[0], want, 1e-6);
    // Both full: the bound is KL itself, here against the uniform q: Σ p ln(3p).
    const Tensor uniform = f64({1.0, 1.0, 1.0}, {1, 3});
    const double kl = (1.0 / 6) * std::log(0.5) + (1.0 / 2) * std::log(1.5);
    const double got = kl_lower_bound({ref.view(), {}, {}}, {uniform.view(), {}, {}})[0];
    EXPECT_LE(got, kl);
    EXPECT_NEAR(got, kl, 1e-12);
    EXPECT_EQ(kl_lower_bound({ref.view(), {}, {}}, {ref.view(), {}, {}})[0], 0.0);  // floored at 0
    // The candidate gives a token the reference holds probable no probability at all: certain, infinite.
    const Tensor zero = f64({-std::numeric_limits<double>::infinity()}, {1, 1});
    EXPECT_EQ(kl_lower_bound({ref.view(), {}, {}}, {{}, ci.view(), zero.view()})[0], std::numeric_limits<double>::infinity());
    // NaN on either side: NaN (never passes).
    const Tensor nan = f64({std::numeric_limits<double>::quiet_NaN()}, {1, 1});
    EXPECT_TRUE(std::isnan(kl_lower_bound({ref.view(), {}, {}}, {{}, ci.view(), nan.view()})[0]));
    // Malformed: positions that disagree, an id outside the vocabulary, a side with nothing.
    const Tensor two = f64({0, 0, 0, 0, 0, 0}, {2, 3});
    EXPECT_THROW((void)kl_lower_bound({two.view(), {}, {}}, {{}, ci.view(), cl.view()}), Error);
    const Tensor far = i32({7}, {1, 1});
    EXPECT_THROW((void)kl_lower_bound({ref.view(), {}, {}}, {{}, far.view(), cl.view()}), Error);
    EXPECT_THROW((void)kl_lower_bound({ref.view(), {}, {}}, {{}, {}, {}}), Error);
}

// A lower bound of KL on random rows: never above KL itself (metrics/logits.hpp computes it from the full
// rows), for a compact candidate, a compact reference and both compact, at K = 1, 3 and 8; and not vacuous.
TEST(Compact, KlLowerBoundNeverExceedsKlOnRandomRows) {
    std::uint64_t state = 12345;
    const auto uniform = [&] {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return static_cast<double>(state >> 11) * 0x1.0p-53;
    };
    const std::int64_t t_count = 64, v = 50;
    std::vector<double> a(static_cast<std::size_t>(t_count * v)), b(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        a[i] = static_cast<float>(4 * uniform() - 2);
        b[i] = static_cast<float>(a[i] + (i % 7 == 0 ? 1.5 : 0.3) * (uniform() - 0.5));
    }
    const Tensor ra = Tensor::from_f64(a, {t_count, v}, DType::f32), rb = Tensor::from_f64(b, {t_count, v}, DType::f32);
    const std::vector<double> kl = logit_divergence(ra.view(), rb.view()).kl;
    int positive = 0;
    for (const int k : {1, 3, 8}) {
        const CompactRows ca = compact_rows(ra.view(), k), cb = compact_rows(rb.view(), k);
        const LogprobRows full_a{ra.view(), {}, {}}, full_b{rb.view(), {}, {}};
        const LogprobRows comp_a{{}, ca.ids.view(), ca.logprobs.view()}, comp_b{{}, cb.ids.view(), cb.logprobs.view()};
        for (const auto& [ref, cand] : {std::pair{full_a, comp_b}, std::pair{comp_a, full_b}, std::pair{comp_a, comp_b}}) {
            const std::vector<double> lb = kl_lower_bound(ref, cand);
            for (std::int64_t t = 0; t < t_count; ++t) {
                const auto i = static_cast<std::size_t>(t);
                EXPECT_LE(lb[i], kl[i]) << "K " << k << " position " << t;
                positive += lb[i] > 0.01 * kl[i];
            }
        }
    }
    EXPECT_GT(positive, 100);
}

}  // namespace
