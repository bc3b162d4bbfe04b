// The whole-model forward pass, composed from the Backend op interface, so
// that every backend runs the model with its own kernels (protocol steps 2–6:
// drift, logits, decisions, generation, perplexity).
//
// The rule: ALL arithmetic goes through Backend ops (matmul, rmsnorm, rope,
// softmax, swiglu, sigmoid, add, mul, scale, causal_attention, route,
// moe_block). The host only moves data, exactly: the embedding gather,
// reshapes, per-head slicing, broadcasting a bias/gate vector to a full
// tensor (the default causal_attention also transposes V and writes −inf
// into the masked attention scores, see below). Nothing the host
// does rounds: the only dtype change on the host is the exact widening of
// gathered embedding rows to the backend's output dtype (f32/f16/bf16 → f32 or
// f64; an f64 embedding is left as f64 for an f32 backend, whose first op
// rounds it like any other input).
//
// One decoder layer, as transformers 5.24 computes it for qwen2_moe,
// qwen3_moe and mixtral (op by op):
//
//   x   = rmsnorm(h, input_norm, eps)
//   q   = matmul(x, q_proj) [+ add(q, bias broadcast)]      [T, nh·D] → [T, nh, D]
//   k,v = likewise with k_proj / v_proj                      [T, nkv, D]
//   q,k = rmsnorm(q, q_norm), rmsnorm(k, k_norm)             (qwen3: per head, over D)
//   q,k = rope(q, pos), rope(k, pos)                         (theta from the config,
//                                                             layout Model::rope_layout())
//   append k, v to the KV cache (per kv head, [S, D] rows: host copy)
//   o   = causal_attention(q, K, V, head_dim^-0.5)   [T, nh·D]; GQA: the rep = nh/nkv query
//         heads h = g·rep … share kv head g. Its default (backend.hpp) is the composition
//           scores[g] = matmul(Q_g, K_g)    Q_g [rep·T, D] (heads stacked), K_g [S, D] as the "weight"
//           s   = scale(scores, head_dim^-0.5)  all heads at once, [nh·T, S]
//           mask: s[h, t, j] = −inf for j > p0 + t  (written on the host; see below)
//           p   = softmax(s)                one call for all heads
//           o_g = matmul(P_g, V_gᵀ)         P_g [rep·T, S] (a zero-copy slice), V_gᵀ [D, S] (host transpose)
//         which the fused cpu kernel reproduces bit for bit on finite inputs
//   a   = matmul(o [T, nh·D], o_proj) [+ o bias]
//   h   = add(h, a)
//   x   = rmsnorm(h, post_attention_norm, eps)
//   dense layer:  m = matmul(swiglu(matmul(x, gate), matmul(x, up)), down)
//   MoE layer:    r = matmul(x, router)                         router logits [T, E]
//                 plan = the authority's RoutingPlan, or route(r, params) (softmax top-k,
//                        renormalised when norm_topk_prob / mixtral; or the sigmoid /
//                        grouped router of RouterConfig with its bias)
//                 m = moe_block(x, experts, plan)
//                 qwen2_moe shared expert: s = matmul(swiglu(matmul(x, sg), matmul(x, su)), sd)
//                        g = sigmoid(matmul(x, shared_expert_gate)) [T, 1] → broadcast to [T, H]
//                        m = add(m, mul(g, s))
//   h   = add(h, m)
// and at the end: final = rmsnorm(h, final_norm), logits = matmul(final, lm_head).
//
// Causal mask (the default causal_attention). transformers adds a mask of 0 / dtype-min to the scaled scores.
// Adding 0 is exact in every precision and adding −inf (or dtype-min) to a
// finite score yields −inf (dtype-min) — so writing −inf directly into the
// masked positions of the backend's own scaled-scores tensor is bit-identical
// to a backend add of the mask, and costs no extra op. softmax then gives
// those positions exp(−inf) = 0 on every backend. Position t of a call
// starting at p0 (the KV-cache length before it) sees cached positions
// 0 … p0 + t.
//
// Router authority. ForwardOptions::routing imposes, per MoE layer, the
// expert ids and combine weights decided by an authority (default in the
// protocol: the reference backend's own ForwardResult::routing). The backend
// still computes its router logits (reported), but never its own top-k.
// Without a plan each backend routes with its own softmax/sigmoid.
//
// Re-anchored mode. ForwardOptions::anchor_inputs feeds layer l the given
// hidden state (normally the reference's hidden[l]) instead of this backend's
// own output of layer l−1: hidden[l+1] then measures the LOCAL error of layer
// l alone, free of everything upstream. hidden[0] is still this backend's
// embedding.
//
// Decoding. Decoder keeps a KV cache (post-norm, post-rope K and V in the
// backend's output dtype) and feeds new tokens at positions p0, p0+1, ...;
// forward() is exactly one Decoder step over the whole prompt from an empty
// cache. greedy_generate() decodes with it; pinned decoding (the authority's
// tokens fed instead of the backend's own argmax) keeps two backends on the
// same trajectory while still recording each one's own choices and logits.
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/tensor.hpp"
#include "kvasir/model/model.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kvasir {

struct ForwardOptions {
    // Router authority: one plan per layer (size == num_layers; entries of
    // dense layers are ignored and may be empty). Each MoE layer's plan has
    // ids [T, k] i32 and weights [T, k] (any float dtype) for the T tokens of
    // this call. Null: the backend runs its own router.
    const std::vector<RoutingPlan>* routing = nullptr;
    // Re-anchored mode: entry l (l < num_layers) is the input of layer l,
    // [T, H] in any float dtype. A ForwardResult::hidden vector (L+1 entries,
    // entry l = input of layer l) can be passed as it is. Null: free running.
    const std::vector<Tensor>* anchor_inputs = nullptr;
    // With anchor_inputs: entry l is the MLP / MoE block input of layer l
    // (normally the reference's ForwardResult::mlp_input[l]) used instead of
    // this backend's own, so mlp_output[l] holds the block's LOCAL error
    // alone. Layers whose architecture does not run the shared feed-forward
    // ignore it. Null: each block runs on its own input.
    const std::vector<Tensor>* anchor_mlp_inputs = nullptr;
    // Keep hidden[0..L] (the residual stream after each layer). When false,
    // ForwardResult::hidden is empty (final_hidden and logits are kept).
    bool keep_hidden = true;
    // Keep each layer's MLP / MoE-block input and output (reference names
    // layer.{l}.mlp_input / mlp_output).
    bool keep_mlp_io = false;
    // Run the final norm and the LM head. False: only the cache and the
    // routing are wanted (a prefix whose logits nobody reads), so
    // final_hidden and logits stay empty and the [T, V] matmul, the largest
    // of a small model's step, is not run. Every other output is unchanged.
    bool logits = true;
};

struct ForwardResult {
    // L+1 entries [T, H] when keep_hidden: [0] = embeddings (input of layer 0),
    // [l+1] = residual stream after layer l, before the final norm — the
    // layout of the fixtures' reference hidden_states.
    std::vector<Tensor> hidden;
    // Per layer (L entries): router logits x·W_routerᵀ [T, E]; empty Tensor for dense layers.
    std::vector<Tensor> router_logits;
    // Per layer (L entries): the routing actually used — the backend's own
    // route() output (ids by descending score, weights as combined) or the
    // imposed plan (copied). Empty ids/weights for dense layers. Passing this
    // vector as another backend's ForwardOptions::routing pins it to these
    // decisions (router authority).
    std::vector<RoutingPlan> routing;
    // Per layer when keep_mlp_io: MLP / MoE-block input (post_attention_norm
    // output) and output (before the residual add).
    std::vector<Tensor> mlp_input, mlp_output;
    // Per layer when keep_mlp_io, hybrid families only: the token mixer's
    // output (gated attention or Gated DeltaNet, before the residual add).
    std::vector<Tensor> mixer_output;
    Tensor final_hidden;  // [T, H] final-norm output
    Tensor logits;        // [T, V]
};

// The forward pass over `tokens` (positions 0 … T−1). Every id must be in
// [0, vocab): else Error(bad_input). Error(unsupported) for a model the
// forward pass does not implement (deepseek_v3 attention, rope scaling other
// than "default", sliding-window attention). Error(bad_input) for a routing
// plan or anchor of the wrong shape, naming the layer. Backend errors
// propagate (Error(backend_failure)).
ForwardResult forward(Backend& backend, const Model& model, std::span<const std::int32_t> tokens,
                      const ForwardOptions& options = {});

// Several independent sequences in ONE pass, as a serving node batches
// requests: the rows of all of them are stacked [ΣT, H] through every
// row-wise op (projections, norms, router, MoE block, MLP, lm_head), while
// attention and linear-attention state stay per sequence (each from
// position 0, its own cache). Each backend runs its own router (no
// authority: batching is the node's own business). Returns the logits
// [T_i, V] of each sequence, in order. A backend whose arithmetic does not
// depend on the batch returns for each sequence the bits forward() returns
// for it alone (the invariance step measures exactly that).
std::vector<Tensor> forward_batch(Backend& backend, const Model& model,
                                  std::span<const std::vector<std::int32_t>> sequences);

// Incremental decoding with a KV cache. The Backend and Model must outlive
// the Decoder. Not thread-safe (one decoding stream).
class Decoder {
public:
    Decoder(Backend& backend, const Model& model);
    ~Decoder();
    Decoder(Decoder&&) noexcept;
    Decoder& operator=(Decoder&&) noexcept;

    // Feed `new_tokens` at positions position() … position()+n−1 and return
    // their logits [n, V]. `routing` as ForwardOptions::routing, with [n, k]
    // plans for these n tokens. Throws like forward(); after an exception the
    // Decoder is left as it was before the call.
    Tensor step(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing = nullptr);
    // step() without the logits (ForwardOptions::logits = false): the cache,
    // the position and last_routing() are those step() leaves, bit for bit.
    void advance(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing = nullptr);

    std::int64_t position() const;  // tokens consumed so far (= KV-cache length)
    // The routing used by the last step (per layer, as ForwardResult::routing).
    const std::vector<RoutingPlan>& last_routing() const;
    void reset();  // empty the cache, back to position 0

    // A point to come back to (several continuations of one prefix): the
    // position and the linear-attention state at mark(); rewind() drops the
    // KV cache after it and restores that state, so the next step() gives
    // the bits it would have given right after mark().
    struct Mark {
        std::int64_t position = 0;
        std::vector<std::pair<Tensor, Tensor>> linear;  // per layer: conv history, recurrent state
    };
    Mark mark() const;
    void rewind(const Mark& m);  // Error(bad_input) for a mark beyond the position

private:
    Tensor run_step(std::span<const std::int32_t> new_tokens, const std::vector<RoutingPlan>* routing, bool logits);
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

struct GenerateResult {
    // Per step i (0 … n−1): this backend's own argmax of the logits that
    // predict token i (ties to the lower id; NaN logits never win).
    std::vector<std::int32_t> tokens;
    // The token actually fed after step i: tokens[i] when free running, the
    // pinned token when pinned (fed[n−1] is never fed; kept for symmetry).
    std::vector<std::int32_t> fed;
    Tensor logits;                // [n, V] the logits of each step (backend output dtype)
    std::vector<double> margins;  // top1 − top2 of each step's logits
    // The routing used at each step: [0] for the prompt ([T_prompt, k] plans),
    // [i] for the single token fed before step i. Pass it as another
    // backend's `step_routing` to pin its routing too.
    std::vector<std::vector<RoutingPlan>> routing;
};

// Greedy decoding of n tokens after `prompt` with a KV cache (no sampling,
// no EOS stop): step 0 runs the prompt, step i ≥ 1 feeds one token. With
// `pinned_tokens` (≥ n−1 entries: the authority's tokens) step i feeds
// pinned[i−1] instead of this backend's own choice. With `step_routing` (n
// entries, as GenerateResult::routing) each step's MoE routing is imposed.
GenerateResult greedy_generate(Backend& backend, const Model& model, std::span<const std::int32_t> prompt, int n,
                               const std::vector<std::int32_t>* pinned_tokens = nullptr,
                               const std::vector<std::vector<RoutingPlan>>* step_routing = nullptr);

// --- self non-determinism (the same backend run twice) ---------------------

// Every tensor of the two results has the same dtype, shape and bits
// (hidden, router logits, routing ids and weights, MLP I/O, final hidden,
// logits).
bool bit_identical(const ForwardResult& a, const ForwardResult& b);

struct RunToRunDelta {
    bool bit_identical = false;
    double logits_max_abs = 0;      // max |Δ| over the logits (NaN if the non-finite patterns differ)
    double final_max_abs = 0;       // over final_hidden
    double hidden_max_abs = 0;      // over every hidden state (0 when neither kept them)
    std::int64_t hidden_worst = -1; // index into hidden of the largest |Δ| (−1: none / all equal)
    double router_logits_max_abs = 0;
    std::int64_t routing_rows_differing = 0;  // (layer, token) rows whose expert SETS differ
};
// Throws Error(bad_input) if the two results have different shapes (they
// are not runs of the same thing).
RunToRunDelta run_to_run_delta(const ForwardResult& a, const ForwardResult& b);

}  // namespace kvasir
