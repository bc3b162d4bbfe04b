// Element-wise comparison of a candidate tensor against a reference.
//
// This header is the specification of every number kvasir-equiv puts in a
// pair matrix or gates CI on. All arithmetic is f64 (inputs of any dtype are
// widened exactly through TensorView::at); sums are Neumaier-compensated and
// computed on power-of-two-rescaled values, so they neither lose the small
// terms of a million-element tensor nor overflow, and give the same bits on
// every machine (no long double, whose width differs between x86 and ARM).
//
// The rule that is the point of this tool: NaN never makes a comparison pass.
//   * within()/at_least() are the only pass/fail primitives and are written
//     as `!(value <= tol) → fail`, so a NaN value or a NaN tolerance fails.
//   * Reductions never use std::max/std::fmax (fmax drops NaN).
//   * A position whose non-finite pattern differs between reference and
//     candidate POISONS the numeric statistics with NaN (see CompareStats).
//
// Positions are classified as finite, NaN, +inf or -inf (for each side):
//   both finite               → compared: they make up `count` and every
//                               numeric statistic;
//   same non-finite class     → (NaN/NaN, +inf/+inf, -inf/-inf) excluded from
//                               the numeric statistics, counted in the
//                               nan_*/inf_* counters; not a mismatch;
//   different classes         → a non-finite mismatch (NaN vs number, +inf vs
//                               -inf, inf vs number, NaN vs inf).
#pragma once

#include "kvasir/core/tensor.hpp"
#include "kvasir/metrics/stats.hpp"  // json_double

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace kvasir {

// max_rel denominator floor, as a fraction of the RMS of the compared
// reference values (see CompareStats::rel_guard). Why scale-relative: an
// element near zero gets its error from cancellation at the scale of the whole
// tensor, not from its own magnitude, so |Δ|/|ref_i| there says nothing about
// the backend; an absolute floor (say FLT_MIN) would also make max_rel depend
// on the units of the tensor. 1e-3·RMS keeps max_rel a true relative error for
// every element of meaningful size while staying finite and scale-invariant.
inline constexpr double kRelGuardFraction = 1e-3;

struct CompareStats {
    // Positions where both reference and candidate are finite. Every numeric
    // statistic below is computed over exactly these positions.
    std::int64_t count = 0;

    // max |cand_i - ref_i|. The absolute difference is computed in double from
    // the exactly widened inputs; it is +inf only if the difference of two
    // finite doubles overflows.
    double max_abs = 0;
    // Flat (row-major) index of the first position attaining max_abs. When the
    // statistics are poisoned it is instead the first non-finite mismatch
    // position: "where it went wrong".
    std::int64_t max_abs_index = -1;

    // max |Δ_i| / max(|ref_i|, rel_guard), with
    //   rel_guard = max(kRelGuardFraction · RMS(ref over compared positions),
    //                   DBL_MIN)  (DBL_MIN = smallest normal double).
    // The DBL_MIN floor only matters for an all-zero reference: then max_rel is
    // 0 when the candidate is also zero, and huge (possibly +inf) otherwise.
    double max_rel = 0;
    double rel_guard = 0;  // the guard actually used, for the report

    double mean_abs = 0;  // mean |Δ_i|
    double rms = 0;       // sqrt(mean Δ_i²)

    // Σ Δ_i² / Σ ref_i². All-zero reference: 0 if the candidate is all zero
    // too, +inf otherwise (any error is infinitely large relative to nothing).
    double nmse = 0;

    // <ref,cand> / (|ref|·|cand|), clamped to [-1, 1] (Cauchy–Schwarz holds
    // mathematically; rounding may overshoot by an ulp). Zero vectors: both
    // zero → 1 (identical), exactly one zero → 0 (no direction in common).
    // Computed as dot / sqrt(Σref²·Σcand²) so identical inputs give exactly 1.
    double cosine = 1;

    // max |Δ_i| / ulp_f32(ref_i): the difference measured in f32 units in the
    // last place of the reference value, for every input dtype alike (so f64,
    // f32, f16 and bf16 candidates are on one scale; an f16 output naturally
    // shows ~2^13 f32 ulps of storage rounding). ulp_f32(x) is the spacing of
    // f32 values in the binade of float(x) — x rounded to f32 (RNE) — i.e.
    // 2^(floor(log2|float(x)|) − 23); 2^-149 for |float(x)| below FLT_MIN
    // (zero and subnormals); 2^104 (the spacing at FLT_MAX) when x overflows
    // f32. Note this is the spacing ABOVE a power of two, so a candidate one
    // f32 step below 1.0 is 0.5 ulp away while one step above is 1 ulp.
    double max_ulp = 0;

    // Counters over ALL positions (compared or not).
    std::int64_t nan_ref = 0, nan_cand = 0;  // NaN positions in each tensor
    std::int64_t inf_ref = 0, inf_cand = 0;  // ±inf positions in each tensor
    // Positions whose non-finite class differs (see the top of this file).
    // When > 0 the comparison is POISONED: max_abs, max_rel, mean_abs, rms,
    // nmse, max_ulp and cosine are NaN, so every within()/at_least() check on
    // them fails whatever the tolerance (NaN rather than +inf because +inf
    // would still pass a tolerance of +inf, and "infinitely different" is not
    // what a NaN-vs-number position means).
    std::int64_t nonfinite_mismatch = 0;

    // Every position equal as a VALUE (operator== after widening to double:
    // +0 == -0, NaN payloads ignored) with NaN / ±inf positions matching.
    // Inputs of different dtypes can be bit_identical if their values agree.
    bool bit_identical = false;
};

// Compare `candidate` against `reference` element by element, flat row-major.
// Throws Error(bad_input), naming both shapes, when the element counts differ;
// equal counts with different shapes ARE compared (a [16,2048] capture may
// arrive flattened) — callers that need equal shapes check them themselves.
// Throws Error(bad_input) when there is nothing to compare: empty tensors, or
// no position where both are finite AND no non-finite mismatch (e.g. both all
// NaN). If there are mismatches, a poisoned result (count possibly 0) is
// returned instead of throwing: a backend that returns all NaN is a FAILED
// comparison (the node is unfit), not bad input to the tool.
// Inputs may be any dtype, i32 included (read exactly as double).
CompareStats compare(const TensorView& reference, const TensorView& candidate);

// Non-finite values appear in the same places with the same class.
bool finite_parity(const CompareStats& s) noexcept;  // nonfinite_mismatch == 0

// THE pass/fail primitive for "smaller is better" figures (max_abs, nmse, KL,
// ...): passes iff value <= tolerance, written as `!(value <= tolerance) →
// fail`, so a NaN value or a NaN tolerance never passes.
bool within(double value, double tolerance) noexcept;
// The mirror for "larger is better" figures (cosine, agreement rates): passes
// iff value >= minimum; NaN on either side fails.
bool at_least(double value, double minimum) noexcept;

// Agreement of two [rows, k] tables of ids (router top-k), i32 only.
struct IndexAgreement {
    std::int64_t rows = 0;
    double exact_match_rate = 0;     // exact_matches / rows
    double set_overlap_rate = 0;     // mean over rows of |A∩B| / k
    std::int64_t exact_matches = 0;  // rows whose SETS of k ids are equal
};

// Rows are compared as SETS: the order of ids within a row is not a decision
// (equal-weight ties may be listed in any order; the combine is a weighted
// sum), so [3,7] vs [7,3] is an exact match. Both tensors must be i32 with the
// same shape, rank >= 1 (rank 1 = one row; higher ranks are [numel/k, k] with
// k the last dim), k >= 1 and at least one row; a row listing the same id
// twice is rejected (a top-k names k distinct experts). Violations throw
// Error(bad_input) naming the shapes.
IndexAgreement compare_indices(const TensorView& reference_ids, const TensorView& candidate_ids);

// Per row of two [rows, k] id tensors (any integer dtype): do their id SETS
// differ? The order within a row is not a decision; a repeated id counts as
// often as it appears. Error(bad_input) for different shapes or a rank
// other than 2.
std::vector<bool> id_sets_differ(const TensorView& a, const TensorView& b);


// Stable key order: count, max_abs, max_abs_index, max_rel, rel_guard,
// mean_abs, rms, nmse, cosine, max_ulp, nan_ref, nan_cand, inf_ref, inf_cand,
// nonfinite_mismatch, finite_parity, bit_identical. Doubles via json_double().
nlohmann::ordered_json to_json(const CompareStats& s);
// Keys: rows, exact_matches, exact_match_rate, set_overlap_rate.
nlohmann::ordered_json to_json(const IndexAgreement& a);

}  // namespace kvasir
