// compare(), within()/at_least(), compare_indices() and their JSON, against
// hand-computed values. The NaN tests are the important ones: a NaN must
// never let a comparison pass.
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace kvasir {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor vec(std::vector<double> v, DType t = DType::f64) {
    const auto n = static_cast<std::int64_t>(v.size());
    return Tensor::from_f64(v, Shape{n}, t);
}

Tensor ids(std::vector<double> v, std::int64_t rows, std::int64_t k) {
    return Tensor::from_f64(v, Shape{rows, k}, DType::i32);
}

// Every "smaller is better" figure of a poisoned comparison must fail any
// tolerance, +inf included, and cosine must fail any minimum.
void expect_every_gate_fails(const CompareStats& s) {
    for (double v : {s.max_abs, s.max_rel, s.mean_abs, s.rms, s.nmse, s.max_ulp}) {
        EXPECT_TRUE(std::isnan(v));
        EXPECT_FALSE(within(v, kInf));
        EXPECT_FALSE(within(v, 1e300));
    }
    EXPECT_TRUE(std::isnan(s.cosine));
    EXPECT_FALSE(at_least(s.cosine, -1.0));
    EXPECT_FALSE(finite_parity(s));
    EXPECT_FALSE(s.bit_identical);
}

TEST(Compare, HandComputedValues) {
    // ref [1,2,3], cand [1,2,4]: Δ = [0,0,1].
    const CompareStats s = compare(vec({1, 2, 3}), vec({1, 2, 4}));
    EXPECT_EQ(s.count, 3);
    EXPECT_EQ(s.max_abs, 1.0);
    EXPECT_EQ(s.max_abs_index, 2);
    EXPECT_DOUBLE_EQ(s.rel_guard, 1e-3 * std::sqrt(14.0 / 3.0));  // 1e-3·RMS(ref)
    EXPECT_DOUBLE_EQ(s.max_rel, 1.0 / 3.0);                        // |ref| = 3 is far above the guard
    EXPECT_DOUBLE_EQ(s.mean_abs, 1.0 / 3.0);
    EXPECT_DOUBLE_EQ(s.rms, std::sqrt(1.0 / 3.0));
    EXPECT_DOUBLE_EQ(s.nmse, 1.0 / 14.0);                          // 1 / (1+4+9)
    EXPECT_DOUBLE_EQ(s.cosine, 17.0 / (std::sqrt(14.0) * std::sqrt(21.0)));  // (1+4+12)/(|r||c|)
    EXPECT_EQ(s.max_ulp, 4194304.0);  // ulp_f32(3) = 2^-22, so |Δ| = 1 is 2^22 ulps
    EXPECT_EQ(s.nan_ref + s.nan_cand + s.inf_ref + s.inf_cand + s.nonfinite_mismatch, 0);
    EXPECT_TRUE(finite_parity(s));
    EXPECT_FALSE(s.bit_identical);
}

TEST(Compare, MaxAbsIndexIsFirstAttainingPosition) {
    const CompareStats s = compare(vec({0, 5, 0, 5}), vec({0, 3, 0, 7}));
    EXPECT_EQ(s.max_abs, 2.0);
    EXPECT_EQ(s.max_abs_index, 1);
}

TEST(Compare, IdenticalInputsAreExactlyIdentical) {
    // [1,1]: the naive sqrt(Σa²)·sqrt(Σb²) = sqrt(2)² rounds above 2 and would
    // give cosine 0.9999999999999998; the documented form gives exactly 1.
    for (const std::vector<double>& v : {std::vector<double>{1, 1}, std::vector<double>{0.1, -0.7, 3.3, 1e-9, 2.5}}) {
        const CompareStats s = compare(vec(v), vec(v));
        EXPECT_EQ(s.cosine, 1.0);
        EXPECT_EQ(s.max_abs, 0.0);
        EXPECT_EQ(s.max_rel, 0.0);
        EXPECT_EQ(s.nmse, 0.0);
        EXPECT_EQ(s.rms, 0.0);
        EXPECT_EQ(s.max_ulp, 0.0);
        EXPECT_TRUE(s.bit_identical);
    }
}

TEST(Compare, ZeroVectors) {
    const CompareStats both = compare(vec({0, 0, 0}), vec({0, -0.0, 0}));
    EXPECT_EQ(both.count, 3);
    EXPECT_EQ(both.cosine, 1.0);  // both zero: identical
    EXPECT_EQ(both.nmse, 0.0);
    EXPECT_EQ(both.max_rel, 0.0);
    EXPECT_EQ(both.rel_guard, std::numeric_limits<double>::min());
    EXPECT_TRUE(both.bit_identical);  // -0 == +0 as a value

    const CompareStats ref_zero = compare(vec({0, 0}), vec({0, 1e-3}));
    EXPECT_EQ(ref_zero.cosine, 0.0);
    EXPECT_EQ(ref_zero.nmse, kInf);  // any error relative to a zero reference
    EXPECT_FALSE(within(ref_zero.nmse, 1e10));
    EXPECT_DOUBLE_EQ(ref_zero.max_rel, 1e-3 / std::numeric_limits<double>::min());

    const CompareStats cand_zero = compare(vec({3, 4}), vec({0, 0}));
    EXPECT_EQ(cand_zero.cosine, 0.0);
    EXPECT_EQ(cand_zero.nmse, 1.0);
    EXPECT_EQ(cand_zero.max_rel, 1.0);
}

TEST(Compare, RelGuardFloorsNearZeroReferences) {
    // RMS(ref) = sqrt(1e6/2) → guard ≈ 0.707; the element with ref 0 is
    // measured against the guard, not against 0.
    const CompareStats s = compare(vec({0, 1000}), vec({1e-3, 1000}));
    EXPECT_DOUBLE_EQ(s.rel_guard, kRelGuardFraction * std::sqrt(1e6 / 2));
    EXPECT_DOUBLE_EQ(s.max_rel, 1e-3 / s.rel_guard);
    // Scale invariance: the same tensors in other units give the same max_rel.
    const double k = std::ldexp(1.0, -40);
    const CompareStats t = compare(vec({0, 1000 * k}), vec({1e-3 * k, 1000 * k}));
    EXPECT_DOUBLE_EQ(t.max_rel, s.max_rel);
    EXPECT_DOUBLE_EQ(t.cosine, s.cosine);
}

TEST(Compare, NanInCandidateOnlyNeverPasses) {
    const CompareStats s = compare(vec({1, 2, 3}), vec({1, kNaN, 3}));
    EXPECT_EQ(s.count, 2);
    EXPECT_EQ(s.nan_ref, 0);
    EXPECT_EQ(s.nan_cand, 1);
    EXPECT_EQ(s.nonfinite_mismatch, 1);
    EXPECT_EQ(s.max_abs_index, 1);  // points at the mismatch
    expect_every_gate_fails(s);
}

TEST(Compare, NanInReferenceOnlyNeverPasses) {
    const CompareStats s = compare(vec({kNaN, 2, 3}), vec({1, 2, 3}));
    EXPECT_EQ(s.nan_ref, 1);
    EXPECT_EQ(s.nan_cand, 0);
    EXPECT_EQ(s.nonfinite_mismatch, 1);
    EXPECT_EQ(s.max_abs_index, 0);
    expect_every_gate_fails(s);
}

TEST(Compare, AllNanCandidateIsAFailureNotAnError) {
    // No finite pair at all, but the mismatch is the finding: poisoned, count 0.
    const CompareStats s = compare(vec({1, 2}), vec({kNaN, kNaN}));
    EXPECT_EQ(s.count, 0);
    EXPECT_EQ(s.nonfinite_mismatch, 2);
    expect_every_gate_fails(s);
}

TEST(Compare, NanInBothAtSamePlaceIsExcludedAndCounted) {
    const CompareStats s = compare(vec({1, kNaN, 3}), vec({1, kNaN, 4}));
    EXPECT_EQ(s.count, 2);
    EXPECT_EQ(s.nan_ref, 1);
    EXPECT_EQ(s.nan_cand, 1);
    EXPECT_EQ(s.nonfinite_mismatch, 0);
    EXPECT_TRUE(finite_parity(s));
    EXPECT_EQ(s.max_abs, 1.0);
    EXPECT_EQ(s.max_abs_index, 2);
    EXPECT_DOUBLE_EQ(s.rms, std::sqrt(0.5));
    EXPECT_DOUBLE_EQ(s.nmse, 1.0 / 10.0);  // 1 / (1+9)
    EXPECT_FALSE(s.bit_identical);

    const CompareStats same = compare(vec({1, kNaN, 3}), vec({1, kNaN, 3}));
    EXPECT_TRUE(same.bit_identical);
    EXPECT_EQ(same.max_abs, 0.0);
}

TEST(Compare, MatchingInfinitiesAreExcludedAndCounted) {
    const CompareStats s = compare(vec({kInf, -kInf, 1, 2}), vec({kInf, -kInf, 1, 2.5}));
    EXPECT_EQ(s.count, 2);
    EXPECT_EQ(s.inf_ref, 2);
    EXPECT_EQ(s.inf_cand, 2);
    EXPECT_EQ(s.nonfinite_mismatch, 0);
    EXPECT_EQ(s.max_abs, 0.5);
    EXPECT_EQ(s.max_abs_index, 3);
    EXPECT_TRUE(within(s.max_abs, 0.5));

    EXPECT_TRUE(compare(vec({kInf, -kInf, 1}), vec({kInf, -kInf, 1})).bit_identical);
}

TEST(Compare, MismatchingInfinitiesPoison) {
    // +inf vs -inf, inf vs number, NaN vs inf: each one mismatch.
    const CompareStats a = compare(vec({kInf, 1}), vec({-kInf, 1}));
    EXPECT_EQ(a.nonfinite_mismatch, 1);
    expect_every_gate_fails(a);
    const CompareStats b = compare(vec({1, 2}), vec({1, kInf}));
    EXPECT_EQ(b.nonfinite_mismatch, 1);
    EXPECT_EQ(b.inf_cand, 1);
    EXPECT_EQ(b.max_abs_index, 1);
    expect_every_gate_fails(b);
    const CompareStats c = compare(vec({kNaN, 2}), vec({kInf, 2}));
    EXPECT_EQ(c.nonfinite_mismatch, 1);
    expect_every_gate_fails(c);
}

TEST(Compare, ElementCountMismatchThrowsNamingShapes) {
    try {
        compare(Tensor::from_f64(std::vector<double>(6, 1.0), Shape{2, 3}), vec({1, 2, 3}));
        FAIL() << "expected an Error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
    }
}

TEST(Compare, EqualCountDifferentShapesAreComparedFlat) {
    const CompareStats s = compare(Tensor::from_f64(std::vector<double>{1, 2, 3, 4}, Shape{2, 2}), vec({1, 2, 3, 5}));
    EXPECT_EQ(s.count, 4);
    EXPECT_EQ(s.max_abs_index, 3);
}

TEST(Compare, NothingToCompareThrows) {
    EXPECT_THROW(compare(vec({}), vec({})), Error);
    EXPECT_THROW(compare(Tensor(DType::f32, Shape{0, 4}), Tensor(DType::f32, Shape{0, 4})), Error);
    try {
        compare(vec({kNaN, kInf}), vec({kNaN, kInf}));  // matching, but nothing finite
        FAIL() << "expected an Error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
    }
}

TEST(Compare, ReducedPrecisionInputsAreWidenedExactly) {
    const std::vector<double> ref = {1.0, 0.1, -3.7};
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
        const CompareStats s = compare(vec(ref, DType::f64), vec(ref, t));
        double expect_max = 0;
        for (double r : ref) expect_max = std::max(expect_max, std::fabs(round_to(t, r) - r));
        EXPECT_EQ(s.max_abs, expect_max) << dtype_name(t);
        EXPECT_GT(s.max_abs, 0.0) << dtype_name(t);  // 0.1 is not representable in any of them
        EXPECT_FALSE(s.bit_identical) << dtype_name(t);
        // Same dtype on both sides: identical.
        EXPECT_TRUE(compare(vec(ref, t), vec(ref, t)).bit_identical) << dtype_name(t);
    }
    // f16 and bf16 rounding of 0.1 in f32 ulps of 0.1 (ulp_f32(0.1) = 2^-27).
    const CompareStats h = compare(vec({0.1}, DType::f32), vec({0.1}, DType::f16));
    EXPECT_EQ(h.max_ulp, std::fabs(round_to_f16(0.1) - round_to(DType::f32, 0.1)) / std::ldexp(1.0, -27));
    // Integer tensors compare too.
    EXPECT_EQ(compare(vec({1, 2}, DType::i32), vec({1, 5}, DType::i32)).max_abs, 3.0);
}

TEST(Compare, UlpDistance) {
    auto ulps = [](double r, double c, DType t) { return compare(vec({r}, t), vec({c}, t)).max_ulp; };
    EXPECT_EQ(ulps(1.0, std::nextafter(1.0f, 2.0f), DType::f32), 1.0);
    EXPECT_EQ(ulps(1.0, std::nextafter(1.0f, 0.0f), DType::f32), 0.5);  // spacing above a power of two
    EXPECT_EQ(ulps(-1.0, -1.0 - std::ldexp(1.0, -22), DType::f32), 2.0);
    EXPECT_EQ(ulps(1.0, 1.0 + std::ldexp(1.0, -23), DType::f64), 1.0);  // f64 outputs: same f32 scale
    EXPECT_EQ(ulps(1.0, 1.0 + std::ldexp(1.0, -30), DType::f64), 1.0 / 128);
    EXPECT_EQ(ulps(0.0, std::ldexp(1.0, -149), DType::f64), 1.0);  // zero reference: smallest subnormal
    EXPECT_EQ(ulps(1e39, 1e39 + std::ldexp(1.0, 104), DType::f64), 1.0);  // beyond f32: spacing at FLT_MAX
    EXPECT_EQ(ulps(1.5, 1.5, DType::f32), 0.0);
}

TEST(Compare, CompensatedMeanOverAMillionElements) {
    // One Δ of 1 and a million Δs of 1e-16: a plain running sum drops every
    // 1e-16 against the 1; the compensated sum keeps their 1e-10.
    const std::int64_t n = 1'000'001;
    Tensor ref(DType::f64, Shape{n});
    Tensor cand(DType::f64, Shape{n});
    cand.set(0, 1.0);
    for (std::int64_t i = 1; i < n; ++i) cand.set(i, 1e-16);
    const CompareStats s = compare(ref, cand);
    EXPECT_NEAR(s.mean_abs, (1.0 + 1e-10) / static_cast<double>(n), 1e-13 / static_cast<double>(n));
    EXPECT_NEAR(s.rms, std::sqrt((1.0 + 1e-26) / static_cast<double>(n)), 1e-15);
}

TEST(Compare, HugeValuesDoNotOverflowTheSums) {
    // Squares of 1e200 overflow double; the power-of-two rescaling keeps nmse
    // and cosine exact.
    const CompareStats s = compare(vec({1e200, 2e200, 3e200}), vec({1e200, 2e200, 4e200}));
    EXPECT_DOUBLE_EQ(s.nmse, 1.0 / 14.0);
    EXPECT_DOUBLE_EQ(s.cosine, 17.0 / (std::sqrt(14.0) * std::sqrt(21.0)));
    EXPECT_DOUBLE_EQ(s.rms, 1e200 * std::sqrt(1.0 / 3.0));
}

TEST(Within, NanNeverPasses) {
    EXPECT_TRUE(within(1.0, 2.0));
    EXPECT_TRUE(within(2.0, 2.0));
    EXPECT_FALSE(within(2.0, 1.0));
    EXPECT_FALSE(within(kNaN, 1.0));
    EXPECT_FALSE(within(1.0, kNaN));
    EXPECT_FALSE(within(kNaN, kNaN));
    EXPECT_FALSE(within(kNaN, kInf));
    EXPECT_TRUE(within(kInf, kInf));  // an explicit "unbounded" tolerance admits +inf, never NaN
    EXPECT_TRUE(at_least(0.9999, 0.999));
    EXPECT_FALSE(at_least(0.99, 0.999));
    EXPECT_FALSE(at_least(kNaN, 0.0));
    EXPECT_FALSE(at_least(1.0, kNaN));
}

TEST(CompareIndices, OrderInsensitiveExactMatch) {
    const IndexAgreement a = compare_indices(ids({1, 2, 3, 4}, 2, 2), ids({2, 1, 3, 4}, 2, 2));
    EXPECT_EQ(a.rows, 2);
    EXPECT_EQ(a.exact_matches, 2);
    EXPECT_EQ(a.exact_match_rate, 1.0);
    EXPECT_EQ(a.set_overlap_rate, 1.0);
}

TEST(CompareIndices, PartialOverlap) {
    // row 0: {1,2,3} vs {1,2,9} share 2; row 1: {4,5,6} vs {7,8,9} share 0;
    // row 2: {0,5,6} vs {6,0,5} exact.
    const IndexAgreement a =
        compare_indices(ids({1, 2, 3, 4, 5, 6, 0, 5, 6}, 3, 3), ids({1, 2, 9, 7, 8, 9, 6, 0, 5}, 3, 3));
    EXPECT_EQ(a.rows, 3);
    EXPECT_EQ(a.exact_matches, 1);
    EXPECT_DOUBLE_EQ(a.exact_match_rate, 1.0 / 3.0);
    EXPECT_DOUBLE_EQ(a.set_overlap_rate, (2.0 + 0.0 + 3.0) / 9.0);
}

TEST(CompareIndices, RankOneIsOneRow) {
    const Tensor a = Tensor::from_f64(std::vector<double>{5, 7}, Shape{2}, DType::i32);
    const Tensor b = Tensor::from_f64(std::vector<double>{7, 8}, Shape{2}, DType::i32);
    const IndexAgreement r = compare_indices(a, b);
    EXPECT_EQ(r.rows, 1);
    EXPECT_EQ(r.exact_matches, 0);
    EXPECT_EQ(r.set_overlap_rate, 0.5);
}

TEST(CompareIndices, BadInputsThrow) {
    EXPECT_THROW(compare_indices(ids({1, 2, 3, 4}, 2, 2), ids({1, 2, 3, 4}, 1, 4)), Error);  // shape
    EXPECT_THROW(compare_indices(ids({1, 1, 3, 4}, 2, 2), ids({1, 2, 3, 4}, 2, 2)), Error);  // duplicate id
    EXPECT_THROW(compare_indices(ids({1, 2, 3, 4}, 2, 2), ids({1, 2, 4, 4}, 2, 2)), Error);
    const Tensor f = Tensor::from_f64(std::vector<double>{1, 2}, Shape{1, 2}, DType::f32);
    EXPECT_THROW(compare_indices(f, f), Error);  // not i32
    const Tensor empty(DType::i32, Shape{0, 8});
    EXPECT_THROW(compare_indices(empty, empty), Error);
}

TEST(Json, StableKeysAndNonFiniteAsStrings) {
    const CompareStats s = compare(vec({1, 2}), vec({1, kNaN}));
    const nlohmann::ordered_json j = to_json(s);
    std::vector<std::string> keys;
    for (const auto& item : j.items()) keys.push_back(item.key());
    const std::vector<std::string> expected = {
        "count",  "max_abs", "max_abs_index", "max_rel", "rel_guard", "mean_abs",           "rms",
        "nmse",   "cosine",  "max_ulp",       "nan_ref", "nan_cand",  "inf_ref",            "inf_cand",
        "nonfinite_mismatch", "finite_parity", "bit_identical"};
    EXPECT_EQ(keys, expected);
    EXPECT_EQ(j["max_abs"], "nan");
    EXPECT_EQ(j["cosine"], "nan");
    EXPECT_EQ(j["nan_cand"], 1);
    EXPECT_EQ(j["finite_parity"], false);
    // The document is valid JSON (no bare NaN) and round-trips.
    EXPECT_EQ(nlohmann::ordered_json::parse(j.dump()), j);

    EXPECT_EQ(json_double(kInf), "inf");
    EXPECT_EQ(json_double(-kInf), "-inf");
    EXPECT_EQ(json_double(0.1).get<double>(), 0.1);

    const nlohmann::ordered_json a = to_json(compare_indices(ids({1, 2}, 1, 2), ids({2, 3}, 1, 2)));
    EXPECT_EQ(a["rows"], 1);
    EXPECT_EQ(a["set_overlap_rate"].get<double>(), 0.5);
}

TEST(IdSetsDiffer, ByRowAsSetsAnyIntegerDtypeAndShapesChecked) {
    // Row 0 reordered (no decision), row 1 one id swapped, row 2 a repeat that is not the same multiset.
    const Tensor a = ids({3, 7, 1, 2, 5, 5}, 3, 2), b = ids({7, 3, 1, 4, 5, 6}, 3, 2);
    EXPECT_EQ(id_sets_differ(a, b), (std::vector<bool>{false, true, true}));
    EXPECT_EQ(id_sets_differ(a, a), (std::vector<bool>{false, false, false}));
    // Any dtype the view reads (routing ids kept in f64 by a capture).
    EXPECT_EQ(id_sets_differ(Tensor::convert(a.view(), DType::f64), b), (std::vector<bool>{false, true, true}));
    EXPECT_THROW(id_sets_differ(a, ids({3, 7, 1, 2}, 2, 2)), Error);
    const Tensor flat = Tensor::from_f64(std::vector<double>{1, 2, 3, 4}, Shape{4}, DType::i32);
    EXPECT_THROW(id_sets_differ(flat, flat), Error);  // one [rows, k] table, not a list
}

}  // namespace
}  // namespace kvasir
