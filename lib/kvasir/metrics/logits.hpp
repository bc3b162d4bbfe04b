// Statistics of logits and of pairs of tensors, f64 throughout: what steps
// 2–6 measure between a reference's outputs and a candidate's (argmax and
// top-1 agreement, per-position L∞ / L2 / KL, NLL, relative residual delta).
// Pure: no model, no backend.
#pragma once

#include "kvasir/core/tensor.hpp"
#include "kvasir/metrics/stats.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvasir {

// max|a − b| over two tensors of the same element count, f64. 0 for equal
// values; NaN when their non-finite patterns differ. (run_to_run_delta does
// this for whole ForwardResults; this is for single tensors.)
double max_abs_difference(const TensorView& a, const TensorView& b);
// Same dtype, shape and bytes (a device result's bytes fetched). Views without
// bytes (an empty Tensor's) are the same only as each other.
bool same_bits(const TensorView& a, const TensorView& b);

// Argmax of each row of [T, V] logits: ties to the lower id, NaN never wins,
// an all-NaN row gives −1 (it agrees with nothing).
std::vector<std::int32_t> argmax_rows(const TensorView& logits);
// top1 − top2 of each row (NaN ignored; NaN if fewer than 2 non-NaN values).
std::vector<double> top_margins(const TensorView& logits);

// Fraction of rows whose argmax agrees, with its binomial σ. Shapes must
// match and be [T, V] (bad_input otherwise). A −1 (all-NaN) row never agrees.
Fraction top1_agreement(const TensorView& ref_logits, const TensorView& cand_logits);
// The same from the argmax tokens themselves (argmax_rows, or what a capture
// kept of them): equal lengths (bad_input otherwise); a −1 never agrees.
Fraction token_agreement(std::span<const std::int32_t> ref, std::span<const std::int32_t> cand);

// First index where two token sequences differ; −1 when they agree on their
// common length and have the same length; the shorter length when one is a
// proper prefix of the other.
std::int64_t first_divergence(std::span<const std::int32_t> ref, std::span<const std::int32_t> cand);

// Per position t of [T, V] logits (P = softmax over V, f64):
//   linf[t]   = max_v |cand − ref|
//   l2[t]     = sqrt(Σ_v (cand − ref)²)
//   kl[t]     = KL(P_ref ‖ P_cand) (kl_divergence_from_logits)
//   dp_top[t] = P_cand(a_t) − P_ref(a_t), a_t = argmax of the reference row
//               (the probability the candidate gives the reference's choice;
//               NaN when the reference row is all NaN)
// A non-finite mismatch in a row makes linf/l2 NaN (never a number that
// could pass a tolerance).
struct PositionDivergence {
    std::vector<double> linf, l2, kl, dp_top;
};
PositionDivergence logit_divergence(const TensorView& ref_logits, const TensorView& cand_logits);
// sqrt(mean x²), compensated; NaN propagates; empty → NaN.
double rms(std::span<const double> xs);

// ‖cand − ref‖₂ / ‖ref‖₂ over whole tensors (equal element counts, f64):
// the relative residual delta of step 2. 0/0 (both zero) → 0; x/0 → +inf;
// a non-finite mismatch → NaN.
double relative_l2(const TensorView& ref, const TensorView& cand);

// Row r of [T, V] logits as f64 (any dtype the view holds).
std::vector<double> logits_row(const TensorView& logits, std::int64_t r);

// Negative log-likelihood of targets[t] under row t of [T, V] logits:
// −log_softmax(row t)[targets[t]], f64, nats. targets.size() must be ≤ T and
// every target in [0, V) (bad_input otherwise). NaN logits → NaN.
std::vector<double> token_nll(const TensorView& logits, std::span<const std::int32_t> targets);

}  // namespace kvasir
