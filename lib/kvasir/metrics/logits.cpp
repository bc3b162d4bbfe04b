#include "kvasir/metrics/logits.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvasir {

double max_abs_difference(const TensorView& a, const TensorView& b) {
    KVASIR_CHECK(a.numel() == b.numel(), ErrorCode::bad_input, "max|Δ|: {} and {} have different sizes", shape_str(a.shape),
                 shape_str(b.shape));
    double m = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        const double x = a.at(i), y = b.at(i);
        if (std::isnan(x) || std::isnan(y)) {
            if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
            continue;
        }
        if (std::isinf(x) || std::isinf(y)) {
            if (x != y) return std::numeric_limits<double>::quiet_NaN();
            continue;
        }
        m = std::max(m, std::fabs(x - y));
    }
    return m;
}

bool same_bits(const TensorView& a, const TensorView& b) {
    if (a.dtype != b.dtype || a.shape != b.shape) return false;
    const void* pa = a.host_data();  // a device result's bytes, fetched
    const void* pb = b.host_data();
    if (pa == nullptr || pb == nullptr) return pa == pb;  // no bytes (an empty Tensor's view): equal only to another
    const std::size_t n = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype);
    return n == 0 || std::memcmp(pa, pb, n) == 0;
}

namespace {

void check_logits_2d(const char* what, const TensorView& v) {
    KVASIR_CHECK(v.rank() == 2 && v.shape[0] >= 1 && v.shape[1] >= 1, ErrorCode::bad_input,
                 "{}: logits must be [T, V] with T, V ≥ 1, got {}", what, shape_str(v.shape));
}

void check_pair(const char* what, const TensorView& a, const TensorView& b) {
    check_logits_2d(what, a);
    KVASIR_CHECK(a.shape == b.shape, ErrorCode::bad_input, "{}: reference {} and candidate {} differ in shape", what,
                 shape_str(a.shape), shape_str(b.shape));
}

}  // namespace

std::vector<double> logits_row(const TensorView& v, std::int64_t r) {
    const std::int64_t n = v.shape.back();
    std::vector<double> out(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) out[static_cast<std::size_t>(j)] = v.at(r * n + j);
    return out;
}

namespace {

std::int32_t argmax_of(std::span<const double> row) {
    std::int64_t best = -1;
    for (std::size_t j = 0; j < row.size(); ++j) {
        if (std::isnan(row[j])) continue;
        if (best < 0 || row[j] > row[static_cast<std::size_t>(best)]) best = static_cast<std::int64_t>(j);
    }
    return static_cast<std::int32_t>(best);
}

}  // namespace

std::vector<std::int32_t> argmax_rows(const TensorView& logits) {
    check_logits_2d("argmax", logits);
    std::vector<std::int32_t> out;
    for (std::int64_t r = 0; r < logits.shape[0]; ++r) out.push_back(argmax_of(logits_row(logits, r)));
    return out;
}

std::vector<double> top_margins(const TensorView& logits) {
    check_logits_2d("margins", logits);
    std::vector<double> out;
    for (std::int64_t r = 0; r < logits.shape[0]; ++r) {
        double t1 = -std::numeric_limits<double>::infinity(), t2 = t1;
        int seen = 0;
        for (double x : logits_row(logits, r)) {
            if (std::isnan(x)) continue;
            ++seen;
            if (x > t1) {
                t2 = t1;
                t1 = x;
            } else if (x > t2) {
                t2 = x;
            }
        }
        out.push_back(seen >= 2 ? t1 - t2 : std::numeric_limits<double>::quiet_NaN());
    }
    return out;
}

Fraction top1_agreement(const TensorView& ref_logits, const TensorView& cand_logits) {
    check_pair("top-1 agreement", ref_logits, cand_logits);
    return token_agreement(argmax_rows(ref_logits), argmax_rows(cand_logits));
}

Fraction token_agreement(std::span<const std::int32_t> ref, std::span<const std::int32_t> cand) {
    KVASIR_CHECK(ref.size() == cand.size(), ErrorCode::bad_input, "token agreement: {} and {} tokens", ref.size(), cand.size());
    std::int64_t same = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) same += (ref[i] >= 0 && ref[i] == cand[i]) ? 1 : 0;
    return binomial(same, static_cast<std::int64_t>(ref.size()));
}

std::int64_t first_divergence(std::span<const std::int32_t> ref, std::span<const std::int32_t> cand) {
    const std::size_t n = std::min(ref.size(), cand.size());
    for (std::size_t i = 0; i < n; ++i)
        if (ref[i] != cand[i]) return static_cast<std::int64_t>(i);
    return ref.size() == cand.size() ? -1 : static_cast<std::int64_t>(n);
}

PositionDivergence logit_divergence(const TensorView& ref_logits, const TensorView& cand_logits) {
    check_pair("logit divergence", ref_logits, cand_logits);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    PositionDivergence d;
    for (std::int64_t t = 0; t < ref_logits.shape[0]; ++t) {
        const std::vector<double> r = logits_row(ref_logits, t), c = logits_row(cand_logits, t);
        double linf = 0;
        NeumaierSum sq;
        bool poisoned = false;
        for (std::size_t j = 0; j < r.size(); ++j) {
            const bool fr = std::isfinite(r[j]), fc = std::isfinite(c[j]);
            if (fr && fc) {
                const double x = c[j] - r[j];
                linf = std::max(linf, std::fabs(x));
                sq.add(x * x);
            } else if (!(std::isnan(r[j]) && std::isnan(c[j])) && !(std::isinf(r[j]) && r[j] == c[j])) {
                poisoned = true;  // a non-finite mismatch: no distance can describe it
            }
        }
        d.linf.push_back(poisoned ? nan : linf);
        d.l2.push_back(poisoned ? nan : std::sqrt(sq.value()));
        d.kl.push_back(kl_divergence_from_logits(r, c));
        const std::int32_t a = argmax_of(r);
        if (a < 0) {
            d.dp_top.push_back(nan);
        } else {
            const std::vector<double> lr = log_softmax(r), lc = log_softmax(c);
            d.dp_top.push_back(std::exp(lc[static_cast<std::size_t>(a)]) - std::exp(lr[static_cast<std::size_t>(a)]));
        }
    }
    return d;
}

double rms(std::span<const double> xs) {
    if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
    NeumaierSum s;
    for (double x : xs) s.add(x * x);
    return std::sqrt(s.value() / static_cast<double>(xs.size()));
}

double relative_l2(const TensorView& ref, const TensorView& cand) {
    KVASIR_CHECK(ref.numel() == cand.numel() && ref.numel() >= 1, ErrorCode::bad_input,
                 "relative delta: {} and {} differ in size", shape_str(ref.shape), shape_str(cand.shape));
    // compare() already gives Σ Δ² / Σ ref² (nmse) with compensated, rescaled
    // sums and NaN on a non-finite mismatch; the relative L2 is its root.
    const CompareStats s = compare(ref, cand);
    if (s.nonfinite_mismatch > 0) return std::numeric_limits<double>::quiet_NaN();
    return std::sqrt(s.nmse);
}

std::vector<double> token_nll(const TensorView& logits, std::span<const std::int32_t> targets) {
    check_logits_2d("nll", logits);
    const std::int64_t v = logits.shape[1];
    KVASIR_CHECK(static_cast<std::int64_t>(targets.size()) <= logits.shape[0], ErrorCode::bad_input,
                 "nll: {} targets for {} rows", targets.size(), logits.shape[0]);
    std::vector<double> out;
    for (std::size_t t = 0; t < targets.size(); ++t) {
        KVASIR_CHECK(targets[t] >= 0 && targets[t] < v, ErrorCode::bad_input, "nll: target {} at {} outside [0, {})",
                     targets[t], t, v);
        const std::vector<double> ls = log_softmax(logits_row(logits, static_cast<std::int64_t>(t)));
        out.push_back(-ls[static_cast<std::size_t>(targets[t])]);
    }
    return out;
}

}  // namespace kvasir
