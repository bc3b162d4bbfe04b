#include "kvasir/metrics/metrics.hpp"
#include "kvasir/core/nonfinite.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvasir {
namespace {

enum class Cls : std::uint8_t { finite, nan, pos_inf, neg_inf };

Cls classify(double x) noexcept {
    if (std::isnan(x)) return Cls::nan;
    if (std::isinf(x)) return x > 0 ? Cls::pos_inf : Cls::neg_inf;
    return Cls::finite;
}

// Running maximum that lets NaN win (std::max / fmax would drop it). Inside
// compare() only finite pairs reach it, so this is defence in depth.
void take_max(double& m, double v) noexcept {
    if (!(v <= m)) m = v;
}

double f32_ulp(double ref) noexcept {
    const double f = std::fabs(round_to(DType::f32, ref));  // no UB on overflow, unlike a cast
    if (std::isinf(f)) return std::ldexp(1.0, 104);
    if (f < static_cast<double>(std::numeric_limits<float>::min())) return std::ldexp(1.0, -149);
    return std::ldexp(1.0, std::ilogb(f) - 23);
}

}  // namespace

CompareStats compare(const TensorView& reference, const TensorView& candidate) {
    const std::int64_t n = reference.numel();
    const std::int64_t nc = candidate.numel();
    KVASIR_CHECK(n == nc, ErrorCode::bad_input,
                 "compare: reference has shape {} ({} elements) but candidate has shape {} ({} elements)",
                 shape_str(reference.shape), n, shape_str(candidate.shape), nc);
    KVASIR_CHECK(n > 0, ErrorCode::bad_input, "compare: nothing to compare, reference shape {} and candidate shape {}",
                 shape_str(reference.shape), shape_str(candidate.shape));

    CompareStats s;
    std::int64_t first_mismatch = -1;
    bool values_equal = true;
    double max_mag = 0;  // largest |ref|, |cand| over compared positions: sets the rescaling

    // Pass 1: classification, counters, maxima.
    for (std::int64_t i = 0; i < n; ++i) {
        const double r = reference.at(i);
        const double c = candidate.at(i);
        const Cls cr = classify(r), cc = classify(c);
        s.nan_ref += cr == Cls::nan;
        s.nan_cand += cc == Cls::nan;
        s.inf_ref += cr == Cls::pos_inf || cr == Cls::neg_inf;
        s.inf_cand += cc == Cls::pos_inf || cc == Cls::neg_inf;
        if (cr != cc) {
            ++s.nonfinite_mismatch;
            if (first_mismatch < 0) first_mismatch = i;
            values_equal = false;
            continue;
        }
        if (cr != Cls::finite) continue;  // same NaN / same infinity: counted, not compared
        ++s.count;
        if (r != c) values_equal = false;
        const double d = std::fabs(c - r);
        if (s.max_abs_index < 0 || !(d <= s.max_abs)) {  // strictly greater: the FIRST position attaining it
            s.max_abs = d;
            s.max_abs_index = i;
        }
        take_max(s.max_ulp, d / f32_ulp(r));
        take_max(max_mag, std::fabs(r));
        take_max(max_mag, std::fabs(c));
    }
    s.bit_identical = values_equal;

    if (s.count == 0 && s.nonfinite_mismatch == 0)
        fail(ErrorCode::bad_input,
             "compare: no position where both reference and candidate are finite ({} elements, shape {}; NaN in "
             "both: {}, inf in both: {})",
             n, shape_str(reference.shape), s.nan_ref, s.inf_ref);

    if (s.count > 0) {
        // Pass 2: sums on values rescaled by a power of two (exact) so the
        // largest magnitude is in [0.5, 1): squares cannot overflow, and the
        // ratios (nmse, cosine) are unaffected. Δ is formed from the scaled
        // operands, so even a Δ that overflows unscaled is summed finitely.
        // (Exponent capped so a subnormal-only tensor does not ask for 2^1074.)
        const double scale = max_mag > 0 ? std::ldexp(1.0, std::min(-std::ilogb(max_mag) - 1, 1000)) : 1.0;
        NeumaierSum sum_abs, sum_d2, sum_r2, sum_c2, sum_rc;
        for (std::int64_t i = 0; i < n; ++i) {
            const double r0 = reference.at(i), c0 = candidate.at(i);
            if (!std::isfinite(r0) || !std::isfinite(c0)) continue;
            const double r = r0 * scale, c = c0 * scale, d = c - r;
            sum_abs.add(std::fabs(d));
            sum_d2.add(d * d);
            sum_r2.add(r * r);
            sum_c2.add(c * c);
            sum_rc.add(r * c);
        }
        const double cnt = static_cast<double>(s.count);
        s.mean_abs = sum_abs.value() / cnt / scale;
        s.rms = std::sqrt(sum_d2.value() / cnt) / scale;
        const double rr = sum_r2.value(), cc = sum_c2.value(), dd = sum_d2.value();
        s.nmse = rr > 0 ? dd / rr : (dd == 0 ? 0.0 : kInf);
        if (rr == 0 && cc == 0) {
            s.cosine = 1.0;
        } else if (rr == 0 || cc == 0) {
            s.cosine = 0.0;
        } else {
            double cosv = sum_rc.value() / std::sqrt(rr * cc);
            if (cosv > 1.0) cosv = 1.0;  // comparisons, not std::clamp: NaN passes through
            if (cosv < -1.0) cosv = -1.0;
            s.cosine = cosv;
        }

        // Pass 3: max_rel with the guard from the reference RMS.
        const double rms_ref = std::sqrt(rr / cnt) / scale;
        s.rel_guard = kRelGuardFraction * rms_ref;
        if (!(s.rel_guard >= std::numeric_limits<double>::min())) s.rel_guard = std::numeric_limits<double>::min();
        for (std::int64_t i = 0; i < n; ++i) {
            const double r = reference.at(i), c = candidate.at(i);
            if (!std::isfinite(r) || !std::isfinite(c)) continue;
            const double a = std::fabs(r);
            take_max(s.max_rel, std::fabs(c - r) / (a > s.rel_guard ? a : s.rel_guard));
        }
    }

    if (s.nonfinite_mismatch > 0) {
        s.max_abs = s.max_rel = s.mean_abs = s.rms = s.nmse = s.cosine = s.max_ulp = kNaN;
        s.max_abs_index = first_mismatch;
        if (s.count == 0) s.rel_guard = kNaN;
    }
    return s;
}

bool finite_parity(const CompareStats& s) noexcept { return s.nonfinite_mismatch == 0; }

bool within(double value, double tolerance) noexcept {
    if (!(value <= tolerance)) return false;  // NaN value or NaN tolerance lands here
    return true;
}

bool at_least(double value, double minimum) noexcept {
    if (!(value >= minimum)) return false;
    return true;
}

IndexAgreement compare_indices(const TensorView& reference_ids, const TensorView& candidate_ids) {
    const TensorView& a = reference_ids;
    const TensorView& b = candidate_ids;
    KVASIR_CHECK(a.dtype == DType::i32 && b.dtype == DType::i32, ErrorCode::bad_input,
                 "compare_indices: ids must be i32, got reference {} {} and candidate {} {}", dtype_name(a.dtype),
                 shape_str(a.shape), dtype_name(b.dtype), shape_str(b.shape));
    KVASIR_CHECK(a.shape == b.shape, ErrorCode::bad_input,
                 "compare_indices: reference ids have shape {} but candidate ids have shape {}", shape_str(a.shape),
                 shape_str(b.shape));
    KVASIR_CHECK(a.rank() >= 1 && a.numel() > 0, ErrorCode::bad_input,
                 "compare_indices: need at least one row of at least one id, got shape {}", shape_str(a.shape));
    const std::int64_t k = a.dim(-1);
    const std::int64_t rows = a.numel() / k;
    const std::int32_t* pa = a.as<std::int32_t>();
    const std::int32_t* pb = b.as<std::int32_t>();

    std::vector<std::int32_t> ra(static_cast<std::size_t>(k)), rb(static_cast<std::size_t>(k));
    std::int64_t exact = 0, overlap = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        std::copy_n(pa + r * k, k, ra.begin());
        std::copy_n(pb + r * k, k, rb.begin());
        std::sort(ra.begin(), ra.end());
        std::sort(rb.begin(), rb.end());
        for (const auto* row : {&ra, &rb}) {
            const auto dup = std::adjacent_find(row->begin(), row->end());
            KVASIR_CHECK(dup == row->end(), ErrorCode::bad_input,
                         "compare_indices: {} ids (shape {}) list id {} twice in row {}",
                         row == &ra ? "reference" : "candidate", shape_str(a.shape), *dup, r);
        }
        // Both rows are sorted and duplicate-free: a merge walk counts |A∩B|.
        std::int64_t common = 0;
        for (std::size_t i = 0, j = 0; i < ra.size() && j < rb.size();) {
            if (ra[i] < rb[j]) {
                ++i;
            } else if (rb[j] < ra[i]) {
                ++j;
            } else {
                ++common;
                ++i;
                ++j;
            }
        }
        overlap += common;
        exact += common == k;
    }
    IndexAgreement out;
    out.rows = rows;
    out.exact_matches = exact;
    out.exact_match_rate = static_cast<double>(exact) / static_cast<double>(rows);
    // Σ|A∩B| / (rows·k) equals the mean of the per-row fractions (k is fixed)
    // and is a single rounding of an exact integer ratio.
    out.set_overlap_rate = static_cast<double>(overlap) / (static_cast<double>(rows) * static_cast<double>(k));
    return out;
}

std::vector<bool> id_sets_differ(const TensorView& a, const TensorView& b) {
    KVASIR_CHECK(a.shape == b.shape && a.rank() == 2, ErrorCode::bad_input, "routing ids of shapes {} and {}: not one [rows, k]",
                 shape_str(a.shape), shape_str(b.shape));
    const std::int64_t rows = a.shape[0], k = a.shape[1];
    std::vector<bool> out(static_cast<std::size_t>(rows));
    std::vector<double> x(static_cast<std::size_t>(k)), y(static_cast<std::size_t>(k));
    for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < k; ++j) {
            x[static_cast<std::size_t>(j)] = a.at(r * k + j);
            y[static_cast<std::size_t>(j)] = b.at(r * k + j);
        }
        std::sort(x.begin(), x.end());
        std::sort(y.begin(), y.end());
        out[static_cast<std::size_t>(r)] = x != y;
    }
    return out;
}

nlohmann::ordered_json to_json(const CompareStats& s) {
    nlohmann::ordered_json j;
    j["count"] = s.count;
    j["max_abs"] = json_double(s.max_abs);
    j["max_abs_index"] = s.max_abs_index;
    j["max_rel"] = json_double(s.max_rel);
    j["rel_guard"] = json_double(s.rel_guard);
    j["mean_abs"] = json_double(s.mean_abs);
    j["rms"] = json_double(s.rms);
    j["nmse"] = json_double(s.nmse);
    j["cosine"] = json_double(s.cosine);
    j["max_ulp"] = json_double(s.max_ulp);
    j["nan_ref"] = s.nan_ref;
    j["nan_cand"] = s.nan_cand;
    j["inf_ref"] = s.inf_ref;
    j["inf_cand"] = s.inf_cand;
    j["nonfinite_mismatch"] = s.nonfinite_mismatch;
    j["finite_parity"] = finite_parity(s);
    j["bit_identical"] = s.bit_identical;
    return j;
}

nlohmann::ordered_json to_json(const IndexAgreement& a) {
    nlohmann::ordered_json j;
    j["rows"] = a.rows;
    j["exact_matches"] = a.exact_matches;
    j["exact_match_rate"] = json_double(a.exact_match_rate);
    j["set_overlap_rate"] = json_double(a.set_overlap_rate);
    return j;
}

}  // namespace kvasir
