// The building blocks every architecture's decoder layer is made of, and
// the one home of their arithmetic rules (lib/kvasir/steps/forward.hpp's
// header states them: ALL arithmetic goes through Backend ops; the host only
// moves data, exactly).
//
//   host data movement   row slices, bias/gate broadcasts, the embedding
//                        gather (exact widening)
//   KvLayer              one layer's KV cache ([S, D] rows per kv head)
//   LayerGraph           a backend + model + config with the blocks: linear
//                        (+ bias), SwiGLU MLP, GQA attention with q/k norm and
//                        rope over a KV cache, the MoE block (router authority
//                        or the backend's own router; shared expert with its
//                        sigmoid gate), and the standard pre-norm decoder layer
//                        built from them
//
// An architecture (arch/architecture.hpp) composes its layer from these; a
// new kind of block (linear attention, an output gate, attention sinks) is
// added here once and used by every architecture that needs it.
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/tensor.hpp"
#include "kvasir/model/model.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace kvasir::arch {

// Causal GQA attention of q [T, nh, D] over one cache per kv head (keys and
// values [S, D], S ≥ T; query row r sits at cache position S − T + r) with the
// backend's own attention op (Backend::causal_attention, or
// causal_attention_sinks when sinks [nh] are given). window W > 0: the query
// at position p sees only the keys p − W < j ≤ p — the rows whose whole prefix
// fits in the window go to one causal call, each later row to its own call on
// its window's keys (views of the cache), so every backend computes it with
// its own kernel. Used by the decoder layer and by step 1's attention ops.
Tensor windowed_attention(Backend& be, const TensorView& q, std::span<const TensorView> keys,
                          std::span<const TensorView> values, double scale, std::int64_t window = 0,
                          const TensorView* sinks = nullptr);

// --- exact host data movement ---------------------------------------------------

// Rows [r0, r0 + n) of a tensor viewed as [rows, last dim]: zero copy.
TensorView row_slice(const TensorView& v, std::int64_t r0, std::int64_t n);
// Entries [r0, r0 + n) of x's FIRST dim, the others kept (a host copy):
// [T, H, D] → [n, H, D].
Tensor leading_rows(const TensorView& x, std::int64_t r0, std::int64_t n);
// The tensors stacked along their first dim (same dtype and trailing dims).
Tensor stack_rows(const std::vector<Tensor>& parts);
// The embedding rows of `tokens`, widened (exactly) to `out` when possible.
Tensor gather_embeddings(const TensorView& table, std::span<const std::int32_t> tokens, DType out);

// The scale an RMSNorm weight stands for: w itself, or 1 + w for the
// zero-centred weights of qwen3_5_moe / qwen3_next (config
// norm_weight_offset), computed by the backend (add of an exact ones vector),
// as transformers computes (1.0 + weight) in the working precision.
Tensor norm_scale(Backend& be, const TensorView& w, bool offset);

// --- one layer's KV cache --------------------------------------------------------

// K and V per kv head, contiguous [S, D] rows, in the backend's output dtype:
// zero-copy views for Backend::causal_attention. Two homes for the rows, fixed
// at the first append: the host (per head, grown in place: a host node), or
// the node's device (Backend::kv_rows: every head's rows in one [heads, S', D]
// tensor left there, of which the first `len` rows of each head are the cache
// — a device node inside a DeviceResidency scope; nothing comes back to the
// host unless something there reads the views).
struct KvLayer {
    DType dtype = DType::f32;
    std::int64_t heads = 0, dim = 0, len = 0;
    std::vector<std::vector<std::byte>> k, v;  // host: per kv head, len·dim elements
    Tensor kd, vd;                             // device: [heads, S' ≥ len, dim]
    bool on_device = false;

    void init(std::int64_t h, std::int64_t d);
    std::size_t row_bytes() const { return static_cast<std::size_t>(dim) * dtype_size(dtype); }
    // Append T rows: kk [T, heads, dim], vv [T, heads·dim] (same dtype), where be keeps them.
    void append(Backend& be, const TensorView& kk, const TensorView& vv);
    void truncate(std::int64_t n);
    TensorView keys(std::int64_t g) const;
    TensorView values(std::int64_t g) const;

    // Linear-attention layers (Gated DeltaNet) keep no K/V but the last K−1
    // conv inputs [K−1, C] and the recurrent state [nv, dk, dv].
    Tensor conv_history, recurrent;
    std::int64_t seen = 0;  // tokens this layer has consumed (every layer kind)
};

// --- the blocks ------------------------------------------------------------------

// One sequence of a layer call. A call may carry several independent
// sequences stacked along the rows, as a serving node batches requests:
// every row-wise op (projections, norms, the MoE block, the MLP) sees all
// rows at once — that is what makes batch composition visible in the bits —
// while attention and the linear-attention state stay per sequence.
struct Segment {
    std::int64_t row0 = 0, rows = 0;  // rows [row0, row0 + rows) of the call's input
    KvLayer* kv = nullptr;            // this sequence's cache of the layer
};

// What one layer call reads and writes besides its input.
struct LayerIO {
    std::span<const std::int64_t> positions;  // per row
    std::span<const Segment> segments;        // >= 1, tiling the rows in order
    const RoutingPlan* plan = nullptr;  // router authority for this layer (MoE only), or null
    Tensor& router_logits;              // out: [T, E] for MoE layers
    RoutingPlan& routing;               // out: the routing used
    Tensor* mlp_input = nullptr;        // out (optional): the MLP / MoE block input
    Tensor* mlp_output = nullptr;       // out (optional): its output
    Tensor* mixer_output = nullptr;     // out (optional): the attention / linear-attention output (hybrid layers)
    // in (optional): the MLP / MoE block runs on this input instead of the
    // layer's own (the drift step's localisation: the block's own error,
    // free of the attention block's; ForwardOptions::anchor_mlp_inputs).
    const Tensor* mlp_anchor = nullptr;
};

class LayerGraph {
public:
    LayerGraph(Backend& backend, const Model& model);

    Backend& be;
    const Model& model;
    const ModelConfig& c;
    RopeParams rope;
    double attention_factor = 1.0;  // rope_attention_factor: yarn's cos/sin scale
    double attention_scale = 1.0;   // the softmax scale (model/rope_frequencies.hpp attention_scale)
    RouterParams router;

    // x·wᵀ (+ bias broadcast over rows when present).
    Tensor linear(const TensorView& x, const TensorView& w, const TensorView& bias);
    // down(silu(x·gateᵀ) · x·upᵀ).
    Tensor swiglu_mlp(const TensorView& x, const TensorView& gate, const TensorView& up, const TensorView& down);
    // GQA self-attention over the cache: q/k/v (+ biases), per-head q/k
    // RMSNorm when the layer has it, rope, append to `kv`, causal softmax
    // attention, o_proj (+ bias).
    Tensor attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos,
                     std::span<const Segment> segs);
    // The attention core over the cache: q [T, nh, D], k [T, nkv, D] (normed,
    // rotated), v [T, nkv·D] appended to `kv`, then the backend's causal GQA
    // softmax attention (Backend::causal_attention, scale 1/√head_dim)
    // → [T, nh·D] (before o_proj); window W > 0 (sliding-window layers) as
    // windowed_attention describes.
    // sinks (gpt_oss, [nh]): Backend::causal_attention_sinks instead.
    Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, KvLayer& kv, std::int64_t window = 0,
                  const TensorView* sinks = nullptr);
    // attend() for each sequence of a call on its rows of q, k, v, stacked
    // back in row order (one sequence: attend() itself, no copy).
    Tensor attend_each(const Tensor& q, const Tensor& k, const Tensor& v, std::span<const Segment> segs,
                       std::int64_t window = 0, const TensorView* sinks = nullptr);
    // Multi-head latent attention (deepseek_v3; ModelConfig::Mla states it): q (q-LoRA or q_proj), the
    // latent and the one shared rope key from kv_a_proj_with_mqa, kv_a_layernorm, per-head keys and values
    // from kv_b_proj, rope (interleaved pairs de-interleaved first) on the rope parts — times yarn's cos/sin
    // scale there —, attention over the cache at attention_width() (the narrower of q·k and v zero-padded),
    // o_proj.
    Tensor mla_attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos,
                         std::span<const Segment> segs);
    // Rope on the first rotary_dims() dimensions of x [T, H, D].
    Tensor rope_partial(const Tensor& x, std::span<const std::int64_t> pos);
    // Gated full attention (qwen3_5_moe, qwen3_next): q_proj yields query and
    // a per-head gate; q/k RMSNorm (1 + w), partial rope, attention, output ·
    // sigmoid(gate), o_proj.
    Tensor gated_attention(const LayerWeights& w, const TensorView& x, std::span<const std::int64_t> pos,
                           std::span<const Segment> segs);
    // Gated DeltaNet linear attention (linear_attention.hpp): projections,
    // causal conv + SiLU, the gated delta rule with the layer's recurrent
    // state, gated RMSNorm with z, out_proj.
    Tensor gated_deltanet(const LayerWeights& w, const TensorView& x, std::span<const Segment> segs);
    // The scale RMSNorm weight w stands for on this model: w, or 1 + w
    // (norm_scale) computed once per weight on this backend and cached.
    TensorView scale_of(const TensorView& w);
    // The hybrid layer: zero-centred pre-norms around gated attention or Gated
    // DeltaNet, then the MoE / dense feed-forward.
    Tensor hybrid_layer(std::int64_t l, const TensorView& h, LayerIO& io);
    // The feed-forward part of layer w: the dense SwiGLU MLP, or the MoE
    // block (router logits, the authority's plan or the backend's own router,
    // routed experts, plus the shared expert — sigmoid-gated when the layer
    // has a shared_expert_gate) — on io.mlp_anchor instead of own_input when
    // one is given.
    Tensor feed_forward(const LayerWeights& w, const Tensor& own_input, LayerIO& io);
    // The standard pre-norm decoder layer (qwen2_moe, qwen3_moe, mixtral):
    //   h1 = h + attention(rmsnorm(h));  out = h1 + feed_forward(rmsnorm(h1)).
    Tensor standard_layer(std::int64_t l, const TensorView& h, LayerIO& io);
    // The same pre-norm layer with multi-head latent attention (deepseek_v3).
    Tensor mla_layer(std::int64_t l, const TensorView& h, LayerIO& io);

private:
    using Mixer = Tensor (LayerGraph::*)(const LayerWeights&, const TensorView&, std::span<const std::int64_t>,
                                         std::span<const Segment>);
    // h1 = h + mixer(rmsnorm(h));  out = h1 + feed_forward(rmsnorm(h1)).
    Tensor pre_norm_layer(std::int64_t l, const TensorView& h, LayerIO& io, Mixer mixer);
    // Gated DeltaNet's per-sequence part: causal conv + SiLU continuing
    // `state`'s history, then the gated delta rule with its recurrent state
    // → [T, nv, dv] for one sequence's rows of qkv, a, b.
    Tensor deltanet_core(const LayerWeights& w, const Tensor& qkv, const Tensor& a, const Tensor& b, KvLayer& state);
    std::map<const void*, Tensor> scales_;  // scale_of's cache, by weight address (the model's mmap outlives the graph)
};

}  // namespace kvasir::arch
