// The two ops of Gated DeltaNet linear attention (qwen3_5_moe, qwen3_next),
// as transformers 5.24 defines them (modeling_qwen3_5_moe.py:
// causal_conv1d_fn / causal_conv1d_update, torch_recurrent_gated_delta_rule
// with use_qk_l2norm_in_kernel=True, the decay g and β computed as
// Qwen3_5MoeGatedDeltaNet.forward does). The RECURRENT form is the reference
// (transformers' chunked prefill is the same arithmetic regrouped; its
// float64 results agree with the recurrent ones to ~1e-13, fixtures'
// REFERENCE.md).
//
// One textbook implementation, templated on the arithmetic type: cpu-ref
// runs it in double, cpu in float (after rounding its inputs to its storage
// dtype; outputs are rounded to storage by the caller). `f16_acc` (float
// only) makes every running sum of both ops — the conv's K taps, the
// l2norms' Σx², the delta rule's m_j and out_j — an f16 accumulator: each
// step adds the exact product (in double) and rounds the sum to half, the
// contract of backend.hpp and of cpu:acc=f16's matmul (matmul_f16acc). The
// recurrent state S, the decay and the rank-1 update are not reductions and
// stay in R (f32), as transformers and every kvasir kernel keep the state. Backends without
// their own kernel refuse the ops (Error(unsupported)): the host never
// computes on a device's behalf.
#pragma once

#include "kvasir/core/tensor.hpp"

#include <cstdint>
#include <vector>

namespace kvasir {

// Inputs of gated_delta_rule. T tokens, nk key heads of dk, nv value heads of
// dv (nv a multiple of nk: value head h reads key head h / (nv / nk)).
struct GatedDeltaInputs {
    TensorView q, k;         // [T, nk, dk] (after the conv; l2-normalised inside)
    TensorView v;            // [T, nv, dv]
    TensorView a, b;         // [T, nv]: decay input and β logit (in_proj_a, in_proj_b outputs)
    TensorView a_log;        // [nv]  A_log
    TensorView dt_bias;      // [nv]
    const TensorView* state = nullptr;  // [nv, dk, dv] recurrent state before these tokens; null = zeros
};

struct GatedDeltaResult {
    Tensor out;    // [T, nv, dv]
    Tensor state;  // [nv, dk, dv] after the last token (the decoder's cache)
};

// Checks shapes (Error(bad_input) naming the op and the operand).
void check_conv1d_args(const TensorView& x, const TensorView& weight, const TensorView* history);
void check_gated_delta_args(const GatedDeltaInputs& in);

// y[t, c] = silu(Σ_{j<K} w[c, j] · xx[t + j, c]), xx = (history or K−1 zero
// rows) followed by x; x [T, C], weight [C, K] or [C, 1, K], history [K−1, C].
// Sums in ascending j; the result in R, returned as f64 (R double) or f32.
template <class R>
Tensor causal_conv1d_silu_ref(const TensorView& x, const TensorView& weight, const TensorView* history,
                              bool f16_acc = false);

// The gated delta rule, token by token, every value head on its own:
//   q, k ← x · rsqrt(Σ x² + 1e-6) (l2norm, eps 1e-6);  q ← q / √dk
//   g = −exp(A_log) · softplus(a + dt_bias)  (softplus(x) = x for x > 20, as torch)
//   β = sigmoid(b)
//   S ← S · exp(g);  m_j = Σ_i S_ij k_i;  δ_j = (v_j − m_j) · β;  S_ij += k_i δ_j
//   out_j = Σ_i S_ij q_i                     (sums in ascending i)
//
// `trace` (R = double only): what the rule's a-priori error bound needs of
// the exact run (audit/step_ops.cpp gated_delta_bounds), per token t, value
// head h and state column j, six values in `cols` [T, nv, dv, 6]:
//   ‖S[:, j]‖₂ before the decay, Σ_i |S_ij·k_i| after it, v_j, m_j,
//   ‖S[:, j]‖₂ after the update, Σ_i |S_ij·q_i| after it;
// and per (t, h) in `heads` [T, nv, 2]: Σ q² and Σ k² of the raw q and k
// (before the l2norm).
struct GatedDeltaTrace {
    std::vector<double> cols, heads;
};
template <class R>
GatedDeltaResult gated_delta_rule_ref(const GatedDeltaInputs& in, bool f16_acc = false, GatedDeltaTrace* trace = nullptr);

}  // namespace kvasir
