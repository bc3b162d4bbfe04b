// Compact logits (issue 43): what a node can send instead of its [T, V]
// logit rows — at a 248,320-token vocabulary one f32 row is ~1 MB — and the
// comparisons that remain computable from it.
//
// Per position t (CompactRows): the K most probable token ids (descending
// log-probability, ties to the lower id, NaN never chosen), their
// log-probabilities log_softmax(row)[id] (computed in f64, kept as f32) and
// the row's log-sum-exp (f32; logit = log-prob + lse recovers the K logits).
// Per chunk of 32 positions (Fingerprint, TOPLOC-style): the 16 entries of
// largest magnitude of the final hidden states [32, H] (the final norm's
// output), as flat indices t·H + j within the chunk (ties to the lower
// index, NaN first: it is never hidden) and their values (f32). At K = 3 a
// chunk costs 32·(3·4 + 3·4 + 4) + 16·(4 + 4) = 1,024 bytes, whatever the
// vocabulary.
//
// What stays computable (every statistic f64, NaN for a non-finite mismatch):
//  * top_logprob_delta: per position, max |lp_cand − lp_ref| over the ids in
//    BOTH nodes' top-K. Since lp = logit − lse and lse is 1-Lipschitz in the
//    max norm, |Δlp| ≤ |Δlogit| + |Δlse| ≤ 2·L∞(t): a tolerance of twice the
//    L∞ one never fails a node the full rows pass.
//  * fingerprint_rel: per chunk, over the reference's 16 entries, the
//    relative delta |v_cand − v_ref| / |v_ref| where the candidate's
//    fingerprint holds the same index; where it does not, the candidate's
//    value there is at most its own smallest fingerprint magnitude m in size,
//    so (|v_ref| − m)⁺ / |v_ref| is a rigorous lower bound of that delta and
//    is what counts — a near-tie swap of the 16th entry costs its gap only.
//  * kl_lower_bound: per position, a rigorous lower bound of KL(P_ref ‖ P_cand)
//    from what both sides hold (a full row knows every token, a compact one
//    its top-K): over the tokens A whose probability both sides know, the
//    partition {each token of A, the rest} coarsens the distributions, and a
//    coarsening never increases KL (data processing):
//        KL ≥ Σ_{i∈A} p_i log(p_i/q_i) + p_R log(p_R/q_R),  p_R = 1 − Σ_A p_i.
//    Every p_i, q_i is known only to its storage's rounding (a compact
//    log-probability is f32: |Δ log p| ≤ 2⁻²³·|log p|; a full row's, computed
//    here in f64, ≤ 1e-14·(1 + |logit| + |lse|)), so each term is minimised
//    over its interval box (x log(x/q) falls in q and is convex in x) and the
//    sum is floored at 0. It judges a compact node at KL's own tolerance: a
//    bound above it is a certain failure, and a node whose full rows pass
//    never fails it. Both sides full: A is the vocabulary and the bound is
//    KL itself (less the rounding allowance).
// What does not: KL itself and L∞ over the whole vocabulary (the rows are gone).
#pragma once

#include "kvasir/core/tensor.hpp"

#include <cstdint>
#include <vector>

namespace kvasir {

inline constexpr int kCompactDefaultTopK = 3;
inline constexpr std::int64_t kFingerprintChunk = 32;
inline constexpr int kFingerprintEntries = 16;

struct CompactRows {
    Tensor ids;       // [T, K] i32
    Tensor logprobs;  // [T, K] f32
    Tensor lse;       // [T] f32
};
// Error(bad_input) for logits that are not [T, V] or K outside [1, V].
CompactRows compact_rows(const TensorView& logits, int k);

struct Fingerprint {
    Tensor index;  // [C, 16] i32, C = ceil(T / 32); a chunk with fewer than 16 entries pads with −1
    Tensor value;  // [C, 16] f32
};
// hidden: [T, H] (any float dtype).
Fingerprint hidden_fingerprint(const TensorView& hidden);

// Per position (T entries) / per chunk (C entries), as described above.
// Shapes must agree on T (resp. C): Error(bad_input) otherwise.
std::vector<double> top_logprob_delta(const TensorView& ref_ids, const TensorView& ref_logprobs,
                                      const TensorView& cand_ids, const TensorView& cand_logprobs);
// What one node holds of its next-token distributions: full logit rows
// [T, V] (`logits` present), or a compact capture's top-K `ids` [T, K] i32 and
// `logprobs` [T, K].
struct LogprobRows {
    TensorView logits;
    TensorView ids, logprobs;
};
// Per position (T entries), as described above; NaN where a log-probability
// either side holds is NaN, +inf where the candidate gives a token the
// reference holds probable probability 0. Error(bad_input) for positions that
// disagree, ids outside the vocabulary of a full side, or a side with neither.
std::vector<double> kl_lower_bound(const LogprobRows& ref, const LogprobRows& cand);

std::vector<double> fingerprint_rel(const TensorView& ref_index, const TensorView& ref_value,
                                    const TensorView& cand_index, const TensorView& cand_value);

}  // namespace kvasir
