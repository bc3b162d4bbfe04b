// metrics/compact.hpp on hand-computed cases: the top-K with its ties and
// NaNs, the log-probabilities and log-sum-exp, the fingerprint's order, and the
// two comparisons — the missing-entry lower bound included.
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/compact.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

}  // namespace
