#include "kvasir/metrics/compact.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/logits.hpp"
#include "kvasir/metrics/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

namespace kvasir {

namespace {

void check_ids_values(const char* what, const TensorView& ids, const TensorView& values) {
    KVASIR_CHECK(ids.rank() == 2 && ids.dtype == DType::i32 && values.shape == ids.shape && dtype_is_float(values.dtype),
                 ErrorCode::bad_input, "{}: ids {} ({}) and values {} must be [N, K] i32 and a float of the same shape",
                 what, shape_str(ids.shape), dtype_name(ids.dtype), shape_str(values.shape));
}

}  // namespace

CompactRows compact_rows(const TensorView& logits, int k) {
    KVASIR_CHECK(logits.rank() == 2 && k >= 1 && k <= logits.dim(1), ErrorCode::bad_input,
                 "compact logits: rows {} and top-{} (need [T, V] with K in [1, V])", shape_str(logits.shape), k);
    const std::int64_t t_count = logits.dim(0), v = logits.dim(1);
    CompactRows out{Tensor(DType::i32, {t_count, k}), Tensor(DType::f32, {t_count, k}), Tensor(DType::f32, {t_count})};
    std::vector<std::int32_t> order(static_cast<std::size_t>(v));
    for (std::int64_t t = 0; t < t_count; ++t) {
        const std::vector<double> row = logits_row(logits, t);
        const double lse = logsumexp(row);
        std::iota(order.begin(), order.end(), 0);
        const auto before = [&](std::int32_t a, std::int32_t b) {  // descending, ties to the lower id, NaN last
            const double x = row[static_cast<std::size_t>(a)], y = row[static_cast<std::size_t>(b)];
            if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
            if (!std::isnan(x) && x != y) return x > y;
            return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int j = 0; j < k; ++j) {
            const std::int32_t id = order[static_cast<std::size_t>(j)];
            static_cast<std::int32_t*>(out.ids.raw())[t * k + j] = id;
            static_cast<float*>(out.logprobs.raw())[t * k + j] = static_cast<float>(row[static_cast<std::size_t>(id)] - lse);
        }
        static_cast<float*>(out.lse.raw())[t] = static_cast<float>(lse);
    }
    return out;
}

Fingerprint hidden_fingerprint(const TensorView& hidden) {
    KVASIR_CHECK(hidden.rank() == 2, ErrorCode::bad_input, "fingerprint: hidden {} must be [T, H]", shape_str(hidden.shape));
    const std::int64_t t_count = hidden.dim(0), h = hidden.dim(1);
    const std::int64_t chunks = (t_count + kFingerprintChunk - 1) / kFingerprintChunk;
    Fingerprint out{Tensor(DType::i32, {chunks, kFingerprintEntries}), Tensor(DType::f32, {chunks, kFingerprintEntries})};
    auto* index = static_cast<std::int32_t*>(out.index.raw());
    auto* value = static_cast<float*>(out.value.raw());
    std::fill(index, index + chunks * kFingerprintEntries, -1);
    for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t first = c * kFingerprintChunk * h;
        const std::int64_t n = std::min(kFingerprintChunk, t_count - c * kFingerprintChunk) * h;
        std::vector<std::int32_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        const auto mag = [&](std::int32_t i) {
            const double x = hidden.at(first + i);
            return std::isnan(x) ? std::numeric_limits<double>::infinity() : std::fabs(x);
        };
        const std::int64_t keep = std::min<std::int64_t>(kFingerprintEntries, n);
        std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](std::int32_t a, std::int32_t b) {
            const double x = mag(a), y = mag(b);
            return x > y || (x == y && a < b);
        });
        for (std::int64_t j = 0; j < keep; ++j) {
            index[c * kFingerprintEntries + j] = order[static_cast<std::size_t>(j)];
            value[c * kFingerprintEntries + j] = static_cast<float>(hidden.at(first + order[static_cast<std::size_t>(j)]));
        }
    }
    return out;
}

std::vector<double> top_logprob_delta(const TensorView& ref_ids, const TensorView& ref_logprobs,
                                      const TensorView& cand_ids, const TensorView& cand_logprobs) {
    check_ids_values("top log-probabilities", ref_ids, ref_logprobs);
    check_ids_values("top log-probabilities", cand_ids, cand_logprobs);
    KVASIR_CHECK(ref_ids.dim(0) == cand_ids.dim(0), ErrorCode::bad_input,
                 "top log-probabilities: {} and {} positions", ref_ids.dim(0), cand_ids.dim(0));
    const std::int64_t t_count = ref_ids.dim(0), kr = ref_ids.dim(1), kc = cand_ids.dim(1);
    const auto* ri = ref_ids.as<std::int32_t>();
    const auto* ci = cand_ids.as<std::int32_t>();
    std::vector<double> out(static_cast<std::size_t>(t_count), 0.0);
    for (std::int64_t t = 0; t < t_count; ++t) {
        double worst = 0;
        for (std::int64_t a = 0; a < kr; ++a)
            for (std::int64_t b = 0; b < kc; ++b) {
                if (ri[t * kr + a] != ci[t * kc + b]) continue;
                const double x = ref_logprobs.at(t * kr + a), y = cand_logprobs.at(t * kc + b);
                const double d = x == y ? 0.0 : std::fabs(x - y);  // equal infinities (a masked token) agree
                worst = std::isnan(d) || std::isnan(worst) ? std::numeric_limits<double>::quiet_NaN() : std::max(worst, d);
            }
        // A row whose log-probabilities are not finite on one side only agrees with nothing.
        for (std::int64_t a = 0; a < kr; ++a)
            if (std::isnan(ref_logprobs.at(t * kr + a))) worst = std::numeric_limits<double>::quiet_NaN();
        for (std::int64_t b = 0; b < kc; ++b)
            if (std::isnan(cand_logprobs.at(t * kc + b))) worst = std::numeric_limits<double>::quiet_NaN();
        out[static_cast<std::size_t>(t)] = worst;
    }
    return out;
}

namespace {

// One side's log-probabilities at position t: a full row (log-softmax in f64)
// or a compact row; each with the half-width of its rounding interval.
class SideRow {
public:
    SideRow(const LogprobRows& r, const char* who) : r_(r) {
        full_ = r.logits.data != nullptr;
        KVASIR_CHECK(full_ || (r.ids.data != nullptr && r.logprobs.data != nullptr), ErrorCode::bad_input,
                     "KL lower bound: the {} has neither logit rows nor top-K log-probabilities", who);
        if (full_) {
            KVASIR_CHECK(r.logits.rank() == 2 && r.logits.dim(1) >= 1, ErrorCode::bad_input,
                         "KL lower bound: the {}'s logits are {}, not [T, V]", who, shape_str(r.logits.shape));
        } else {
            check_ids_values("KL lower bound", r.ids, r.logprobs);
        }
    }
    bool full() const { return full_; }
    std::int64_t positions() const { return full_ ? r_.logits.dim(0) : r_.ids.dim(0); }
    std::int64_t vocab() const { return full_ ? r_.logits.dim(1) : -1; }
    void at_position(std::int64_t t) {
        t_ = t;
        if (!full_) return;
        row_ = logits_row(r_.logits, t);
        lse_ = logsumexp(row_);
    }
    // The compact ids of this position (empty for a full row: every id).
    std::vector<std::int32_t> ids() const {
        if (full_) return {};
        const std::int64_t k = r_.ids.dim(1);
        const auto* p = r_.ids.as<std::int32_t>() + t_ * k;
        return {p, p + k};
    }
    // log p of `id` with its interval half-width; nullopt when this side does not hold it.
    std::optional<std::pair<double, double>> logprob(std::int32_t id) const {
        if (full_) {
            const double x = row_[static_cast<std::size_t>(id)];
            const double lp = x - lse_;
            return std::pair{lp, std::isfinite(lp) ? 1e-14 * (1 + std::fabs(x) + std::fabs(lse_)) : 0.0};
        }
        const std::int64_t k = r_.ids.dim(1);
        const auto* p = r_.ids.as<std::int32_t>() + t_ * k;
        for (std::int64_t j = 0; j < k; ++j)
            if (p[j] == id) {
                const double lp = r_.logprobs.at(t_ * k + j);
                return std::pair{lp, std::isfinite(lp) ? std::ldexp(std::fabs(lp), -23) + 1e-300 : 0.0};  // -inf: exactly 0
            }
        return std::nullopt;
    }

private:
    const LogprobRows& r_;
    bool full_ = false;
    std::int64_t t_ = 0;
    std::vector<double> row_;  // a full side's row at this position
    double lse_ = 0;
};

// min over x in [xl, xh] of x·log(x / qh) (0·log 0 = 0; qh = 0 < x: +inf). Falls
// in q, so qh (the interval's top) gives the smallest value; convex in x with its
// minimum −qh/e at x = qh/e.
double term_lower(double xl, double xh, double qh) {
    if (xh <= 0) return 0;
    if (qh <= 0) return xl > 0 ? std::numeric_limits<double>::infinity() : 0;
    const auto h = [qh](double x) { return x <= 0 ? 0.0 : x * std::log(x / qh); };
    const double star = qh / std::exp(1.0);
    if (star >= xl && star <= xh) return -star;
    return std::min(h(xl), h(xh));
}

}  // namespace

std::vector<double> kl_lower_bound(const LogprobRows& ref_rows, const LogprobRows& cand_rows) {
    SideRow ref(ref_rows, "reference"), cand(cand_rows, "candidate");
    KVASIR_CHECK(ref.positions() == cand.positions(), ErrorCode::bad_input, "KL lower bound: {} and {} positions",
                 ref.positions(), cand.positions());
    KVASIR_CHECK(!ref.full() || !cand.full() || ref.vocab() == cand.vocab(), ErrorCode::bad_input,
                 "KL lower bound: vocabularies of {} and {}", ref.vocab(), cand.vocab());
    const std::int64_t vocab = ref.full() ? ref.vocab() : cand.vocab();  // -1: both compact
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> out(static_cast<std::size_t>(ref.positions()), 0.0);
    for (std::int64_t t = 0; t < ref.positions(); ++t) {
        ref.at_position(t);
        cand.at_position(t);
        // A: the tokens both sides hold.
        std::vector<std::int32_t> a;
        if (ref.full() && cand.full()) {
            a.resize(static_cast<std::size_t>(vocab));
            for (std::int64_t j = 0; j < vocab; ++j) a[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
        } else {
            a = ref.full() ? cand.ids() : ref.ids();
            std::sort(a.begin(), a.end());
            a.erase(std::unique(a.begin(), a.end()), a.end());
        }
        double bound = 0, p_lo = 0, p_hi = 0, q_lo = 0, q_hi = 0;  // sums of the intervals over A
        bool is_nan = false;
        for (const std::int32_t id : a) {
            if (vocab >= 0) KVASIR_CHECK(id >= 0 && id < vocab, ErrorCode::bad_input, "KL lower bound: token id {} outside "
                                         "the vocabulary of {}", id, vocab);
            const auto p = ref.logprob(id), q = cand.logprob(id);
            if (!p || !q) continue;  // held by one side only
            if (std::isnan(p->first) || std::isnan(q->first)) {
                is_nan = true;
                break;
            }
            const double pl = std::exp(p->first - p->second), ph = std::exp(p->first + p->second);
            const double ql = std::exp(q->first - q->second), qh = std::exp(q->first + q->second);
            bound += term_lower(pl, ph, qh);
            p_lo += pl, p_hi += ph, q_lo += ql, q_hi += qh;
        }
        if (is_nan) {
            out[static_cast<std::size_t>(t)] = nan;
            continue;
        }
        // The rest: p_R in [1 − Σ p_hi, 1 − Σ p_lo] (within [0, 1]), q_R's top 1 − Σ q_lo.
        bound += term_lower(std::clamp(1 - p_hi, 0.0, 1.0), std::clamp(1 - p_lo, 0.0, 1.0), std::clamp(1 - q_lo, 0.0, 1.0));
        out[static_cast<std::size_t>(t)] = std::max(0.0, bound);
    }
    // NaN logits in a full row poison its log-sum-exp: every bound of that position is NaN by the same rule.
    return out;
}

std::vector<double> fingerprint_rel(const TensorView& ref_index, const TensorView& ref_value, const TensorView& cand_index,
                                    const TensorView& cand_value) {
    check_ids_values("fingerprint", ref_index, ref_value);
    check_ids_values("fingerprint", cand_index, cand_value);
    KVASIR_CHECK(ref_index.shape == cand_index.shape, ErrorCode::bad_input, "fingerprint: shapes {} and {} differ",
                 shape_str(ref_index.shape), shape_str(cand_index.shape));
    const std::int64_t chunks = ref_index.dim(0), k = ref_index.dim(1);
    const auto* ri = ref_index.as<std::int32_t>();
    const auto* ci = cand_index.as<std::int32_t>();
    std::vector<double> out(static_cast<std::size_t>(chunks), 0.0);
    for (std::int64_t c = 0; c < chunks; ++c) {
        double smallest = std::numeric_limits<double>::infinity();  // the candidate's smallest kept magnitude
        for (std::int64_t b = 0; b < k; ++b)
            if (ci[c * k + b] >= 0) smallest = std::min(smallest, std::fabs(cand_value.at(c * k + b)));
        double worst = 0;
        for (std::int64_t a = 0; a < k; ++a) {
            if (ri[c * k + a] < 0) continue;
            const double r = ref_value.at(c * k + a);
            double d = std::numeric_limits<double>::quiet_NaN();
            bool found = false;
            for (std::int64_t b = 0; b < k && !found; ++b)
                if (ci[c * k + b] == ri[c * k + a]) {
                    const double x = cand_value.at(c * k + b);
                    d = x == r ? 0.0 : std::fabs(x - r) / std::fabs(r);
                    found = true;
                }
            if (!found && std::isfinite(r) && std::isfinite(smallest)) d = std::max(0.0, std::fabs(r) - smallest) / std::fabs(r);
            worst = std::isnan(d) || std::isnan(worst) ? std::numeric_limits<double>::quiet_NaN() : std::max(worst, d);
        }
        out[static_cast<std::size_t>(c)] = worst;
    }
    return out;
}

}  // namespace kvasir
