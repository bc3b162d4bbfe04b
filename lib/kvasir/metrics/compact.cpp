#include "kvasir/metrics/compact.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/logits.hpp"
#include "kvasir/metrics/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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
