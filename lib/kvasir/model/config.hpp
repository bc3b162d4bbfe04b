// Hugging Face config.json → ModelConfig, the neutral description of a MoE
// model that the rest of kvasir works from, and the names (and shapes) of the
// tensors a Hugging Face checkpoint of each architecture holds.
//
// Semantics follow transformers 5.24 (the version the fixtures are made with):
// the default of every key is the default of that architecture's config
// class, and which layers are MoE is decided by the same rule as the
// architecture's decoder layer (see ModelConfig::moe_layers).
//
// What differs between the families — defaults, their own keys, tensor
// names — is in their records (model/family.hpp, model/families/*.cpp);
// parse_model_config reads the keys they share and calls the family's reader.
// deepseek_v3's attention is MLA (ModelConfig::Mla), its and glm4_moe's
// router sigmoid + e_score_correction_bias + grouped top-k.
#pragma once

#include "kvasir/core/model_types.hpp"  // RouterScoring
#include "kvasir/core/tensor.hpp"  // Shape

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// The id of a model family (model/family.hpp: what kvasir knows of each).
// These are the built-in families; a family registered from elsewhere
// (register_family) takes a value past them.
enum class Architecture : std::uint8_t {
    qwen2_moe, qwen3_moe, mixtral, deepseek_v3, qwen3_5_moe, qwen3_next,
    // Dense decoders (no MoE layer): the standard layer, or the hybrid one (qwen3_5).
    llama, mistral, qwen2, qwen3, qwen3_5,
    olmoe, gpt_oss, glm4_moe
};

// Bounds on what a config may claim (sizes are checked before anything is allocated from them).
namespace config_bounds {
inline constexpr std::int64_t kMaxDim = std::int64_t{1} << 20;  // any width: hidden, heads, head_dim, vocab, ffn
inline constexpr std::int64_t kMaxLayers = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxExperts = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxPositions = std::int64_t{1} << 40;
inline constexpr double kMaxRopeTheta = 1e12;
}  // namespace config_bounds

// Everything a layer-level audit needs to route tokens the way the reference
// implementation does.
struct RouterConfig {
    RouterScoring scoring = RouterScoring::softmax;
    std::int64_t num_experts = 0;
    std::int64_t top_k = 0;
    // Divide the k selected weights by their sum. qwen2/qwen3: config
    // norm_topk_prob; mixtral: always (MixtralTopKRouter has no switch);
    // deepseek_v3: norm_topk_prob (denominator + 1e-20, as transformers).
    bool norm_topk_prob = false;
    // --- DeepSeek-style (sigmoid) routing; neutral values for softmax routers.
    // transformers' DeepseekV3TopkRouter: s = sigmoid(logits); c = s + bias
    // (e_score_correction_bias, used for *selection only*); group score = sum
    // of the top-2 c in each of n_group equal groups; keep the topk_group best
    // groups; top_k of c among their experts; weights = s at those experts
    // (renormalised if norm_topk_prob) × routed_scaling_factor.
    bool score_correction_bias = false;  // the checkpoint has e_score_correction_bias [num_experts]
    std::int64_t n_group = 1;
    std::int64_t topk_group = 1;
    double routed_scaling_factor = 1.0;
};

struct ModelConfig {
    std::string source;             // path of the config.json it was read from (for messages)
    Architecture architecture = Architecture::qwen3_moe;

    std::int64_t hidden_size = 0;
    std::int64_t num_layers = 0;     // num_hidden_layers
    std::int64_t num_heads = 0;      // num_attention_heads
    std::int64_t num_kv_heads = 0;   // num_key_value_heads (null/absent: num_heads)
    std::int64_t head_dim = 0;       // explicit head_dim, else hidden_size / num_heads
                                     // (deepseek_v3: qk_nope_head_dim + qk_rope_head_dim, the q·k width)
    // Multi-head latent attention (deepseek_v3, DeepseekV3Attention in
    // transformers 5.24); kv_lora_rank 0 = not MLA. Per token:
    //   q = q_b_proj(rmsnorm(q_a_proj(x), q_a_layernorm))  (q_lora_rank > 0) | q_proj(x),
    //       split per head into [q_nope (qk_nope_head_dim) | q_rot (qk_rope_head_dim)];
    //   [kv (kv_lora_rank) | k_rot (qk_rope_head_dim)] = kv_a_proj_with_mqa(x); k_rot is ONE head shared by all;
    //   [k_nope | v (v_head_dim)] per head = kv_b_proj(rmsnorm(kv, kv_a_layernorm));
    //   q_rot, k_rot roped (rope_interleave: the pairs are (x0, x1), (x2, x3), …, and the result is laid out
    //   [even′ | odd′]); q = [q_nope | q_rot], k = [k_nope | k_rot]; softmax scale
    //   head_dim^−½ · yarn's mscale(factor, mscale_all_dim)² (attention_scale()).
    // The two latent RMSNorms use eps 1e-6 whatever rms_norm_eps says (DeepseekV3RMSNorm's default).
    struct Mla {
        std::int64_t q_lora_rank = 0;  // 0: plain q_proj (Kimi-K2, DeepSeek-V2-Lite)
        std::int64_t kv_lora_rank = 0;
        std::int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
        bool rope_interleave = true;
        static constexpr double latent_norm_eps = 1e-6;
    } mla;
    double rope_theta = 10000.0;     // rope_parameters.rope_theta | rope_scaling.rope_theta | rope_theta
                                     // | the class default (mixtral 1e6, others 1e4)
    std::string rope_type = "default";  // "default" or "llama3"; anything else (yarn, ...) is refused by the forward pass
    // rope_type "llama3" (transformers' _compute_llama3_parameters): the
    // inverse frequencies of the pairs whose wavelength exceeds
    // original_max_position_embeddings / low_freq_factor are divided by
    // factor, those below .../high_freq_factor kept, the ones between
    // interpolated. Neutral values otherwise.
    struct RopeScaling {
        double factor = 1.0;
        double low_freq_factor = 1.0;
        double high_freq_factor = 4.0;
        double original_max_position_embeddings = 8192.0;
        // rope_type "yarn" (transformers' _compute_yarn_parameters): the
        // correction range from beta_fast / beta_slow (floored / ceiled with
        // truncate), and the cos/sin scale attention_factor (NaN: derived from
        // factor, mscale and mscale_all_dim as transformers does).
        double beta_fast = 32.0;
        double beta_slow = 1.0;
        bool truncate = true;
        double attention_factor = std::numeric_limits<double>::quiet_NaN();
        double mscale = 0.0, mscale_all_dim = 0.0;
    } rope_scaling;
    // A GGUF's rope_freqs.weight (llama.cpp's converter writes the llama3
    // scaling this way): pair i turns by pos · theta^(−2i/d) / factor_i. Empty otherwise.
    std::vector<double> rope_freq_factors;
    double rms_norm_eps = 1e-6;
    std::string hidden_act = "silu";    // only silu (SwiGLU) is accepted

    bool qk_norm = false;              // per-head RMSNorm on q and k before rope (qwen3_moe)
    // olmoe: the q/k RMSNorm is over the whole projection (q_norm [nh·D],
    // k_norm [nkv·D]) before it is split into heads.
    bool qk_norm_full = false;
    // gpt_oss: a learned sink logit per query head in every attention
    // softmax (self_attn.sinks [nh]); experts with the clamped SwiGLU
    // (GptOssExperts: alpha, limit); expert weights MXFP4 (`*_blocks` /
    // `*_scales`) or plain, as the checkpoint has them. (The router's logit
    // bias and the experts' biases are tensors of the layer: LayerTensorNames.)
    bool attention_sinks = false;
    bool clamped_swiglu = false;
    double swiglu_alpha = 1.702, swiglu_limit = 7.0;
    bool mxfp4_experts = false;  // set by Model::open from the checkpoint's tensors
    bool attention_bias = false;       // q/k/v projections have a bias (qwen2_moe: qkv_bias; qwen3_moe: attention_bias)
    bool attention_out_bias = false;   // o_proj has a bias (qwen3_moe: attention_bias)
    std::int64_t sliding_window = 0;   // 0 = full causal attention; W > 0: a query at position p sees keys p−W < j ≤ p
    // Which layers use sliding_window (layer_types "sliding_attention" of the
    // Qwen dense configs); empty = every layer (mistral, mixtral).
    std::vector<bool> sliding_layers;
    std::int64_t max_position_embeddings = 0;

    std::int64_t vocab_size = 0;
    bool tie_word_embeddings = false;  // lm_head is embed_tokens (no lm_head.weight in the checkpoint)

    std::int64_t intermediate_size = 0;                // dense-MLP layers; 0 when the architecture has none (mixtral)
    std::int64_t moe_intermediate_size = 0;            // per routed expert (mixtral: intermediate_size)
    std::int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
                                                       // (deepseek_v3: n_shared_experts × moe_intermediate_size)
    bool shared_expert_gate = false;  // shared output × sigmoid(x·w_gateᵀ), w_gate [1, hidden] (qwen2_moe)

    // Provenance of moe_layers (as read; neutral values where the architecture has no such key).
    std::int64_t decoder_sparse_step = 1;
    std::vector<std::int64_t> mlp_only_layers;
    std::int64_t first_k_dense_replace = 0;
    // Per layer: true when the layer's MLP is the sparse MoE block. Rules of transformers 5.24:
    //  qwen2_moe / qwen3_moe (Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer.__init__):
    //    MoE iff (layer not in mlp_only_layers) and (num_experts > 0 and (layer + 1) % decoder_sparse_step == 0)
    //  mixtral (MixtralDecoderLayer): every layer
    //  deepseek_v3 (DeepseekV3DecoderLayer): MoE iff layer >= first_k_dense_replace
    std::vector<bool> moe_layers;

    // Hybrid stacks (qwen3_5_moe, qwen3_next; transformers 5.24 layer_types,
    // default: every full_attention_interval-th layer full attention, the
    // others Gated DeltaNet). Per layer: true = linear attention.
    std::vector<bool> linear_attention_layers;
    struct LinearAttention {
        std::int64_t conv_kernel = 0;           // linear_conv_kernel_dim
        std::int64_t key_head_dim = 0, value_head_dim = 0;
        std::int64_t key_heads = 0, value_heads = 0;
        std::int64_t key_dim() const { return key_heads * key_head_dim; }
        std::int64_t value_dim() const { return value_heads * value_head_dim; }
        std::int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
    } linear;
    double partial_rotary_factor = 1.0;  // rope rotates the first head_dim·factor dimensions
    bool attention_output_gate = false;  // q_proj also yields a per-head gate: o_proj(attn · sigmoid(gate))
    bool norm_weight_offset = false;     // RMSNorm scales by (1 + w) (zero-centred weights)
    // Where the decoder's tensors live: "model." (text-only checkpoints) or
    // "model.language_model." (the multimodal wrapper of Qwen3.5 checkpoints;
    // the vision tower and mtp.* tensors are not the audited model).
    std::string tensor_prefix = "model.";
    bool multimodal_wrapper = false;
    // The checkpoint stores each MoE layer's experts fused ([E, 2I, H]
    // gate_up_proj, [E, H, I] down_proj) instead of one tensor per expert:
    // not in config.json — Model::open sets it from the tensor names.
    bool fused_experts = false;

    RouterConfig router;

    std::int64_t num_experts() const { return router.num_experts; }
    std::int64_t top_k() const { return router.top_k; }
    bool norm_topk_prob() const { return router.norm_topk_prob; }
    bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
    bool has_mla() const { return mla.kv_lora_rank > 0; }
    // The dimensions of a head that rope turns: qk_rope_head_dim (the LAST ones) under MLA,
    // else the first head_dim·partial_rotary_factor.
    std::int64_t rotary_dims() const {
        return has_mla() ? mla.qk_rope_head_dim
                         : static_cast<std::int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
    }
    // The width attention's output has per head: v_head_dim under MLA, else head_dim.
    std::int64_t value_head_dim() const { return has_mla() ? mla.v_head_dim : head_dim; }
    // The width of one head in the KV cache and the attention kernel: head_dim, or under MLA the wider of
    // the q·k and value widths (the narrower is zero-padded: exact, see LayerGraph::mla_attention).
    std::int64_t attention_width() const { return has_mla() ? std::max(head_dim, mla.v_head_dim) : head_dim; }
    std::int64_t q_dim() const { return num_heads * head_dim; }
    std::int64_t kv_dim() const { return num_kv_heads * head_dim; }
    // Throws Error(bad_input) for a layer outside [0, num_layers).
    bool is_moe(std::int64_t layer) const;
    std::int64_t num_moe_layers() const;
    bool is_linear_attention(std::int64_t layer) const;  // Error(bad_input) outside [0, num_layers)
    // The attention window of layer l: sliding_window where the layer slides, else 0 (full causal).
    std::int64_t attention_window(std::int64_t layer) const;
    bool has_moe() const { return num_moe_layers() > 0; }
    // Which layers are dense and which MoE, as ranges: "dense 0-2, MoE 3-60".
    std::string layer_kinds() const;
    // The widths of the q_norm / k_norm weights: head_dim, or the whole projection (qk_norm_full).
    std::int64_t q_norm_dim() const { return qk_norm_full ? q_dim() : head_dim; }
    std::int64_t k_norm_dim() const { return qk_norm_full ? kv_dim() : head_dim; }
};

// Read <dir>/config.json (or the file itself). Throws Error(bad_input) with one
// line "PATH: problem" naming the offending key: unreadable/oversized file,
// invalid JSON, unknown architecture (listing the supported ones), a value of
// the wrong type or out of range, inconsistent values. Error(unsupported) for a
// valid config this tool does not model (hidden_act other than silu).
ModelConfig load_model_config(const std::string& dir_or_file);
// The same on text already in memory; `source` names it in messages.
ModelConfig parse_model_config(std::string_view json_text, const std::string& source);
// The range and consistency checks, for a ModelConfig built another way (e.g.
// from GGUF metadata). Throws Error(bad_input) "SOURCE: field: problem".
void validate_model_config(const ModelConfig& cfg);

// ---------------------------------------------------------------------------
// Hugging Face tensor names. Verified against what transformers 5.24
// save_pretrained writes: experts are saved one tensor per expert and matrix
// (the fused in-memory `experts.gate_up_proj` [E, 2I, H] / `experts.down_proj`
// are split back on save), under the legacy names below.
//   qwen2_moe / qwen3_moe / deepseek_v3: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
//   mixtral:                             model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight
//                                        (w1 = gate, w3 = up, w2 = down)
// Shapes are PyTorch Linear [out, in].
// ---------------------------------------------------------------------------
struct TensorSpec {
    std::string name;
    Shape shape;
};

struct ExpertTensorNames {
    std::string gate, up, down;
};

// Names of one decoder layer; a name is empty when the layer has no such tensor.
struct LayerTensorNames {
    std::string input_norm;           // input_layernorm.weight [H]
    std::string post_attention_norm;  // post_attention_layernorm.weight [H]
    // attention (MLA: q_proj only without q-LoRA, k_proj / v_proj empty)
    std::string q_proj, k_proj, v_proj, o_proj;
    // MLA (deepseek_v3): q_a_proj [q_lora_rank, H], q_a_layernorm [q_lora_rank], q_b_proj
    // [nh·(nope + rope), q_lora_rank]; kv_a_proj_with_mqa [kv_lora_rank + rope, H], kv_a_layernorm
    // [kv_lora_rank], kv_b_proj [nh·(nope + v), kv_lora_rank]; o_proj is then [H, nh·v].
    std::string q_a_proj, q_a_norm, q_b_proj, kv_a_proj, kv_a_norm, kv_b_proj;
    std::string q_a_bias, kv_a_bias;  // attention_bias: [q_lora_rank], [kv_lora_rank + rope]
    std::string q_bias, k_bias, v_bias, o_bias;
    std::string q_norm, k_norm;  // [head_dim]
    // dense MLP (is_moe(layer) == false)
    std::string mlp_gate, mlp_up, mlp_down;
    // MoE block (is_moe(layer) == true)
    std::string router;       // [E, H]
    std::string router_bias;  // deepseek_v3 e_score_correction_bias [E]
    std::vector<ExpertTensorNames> experts;
    std::string shared_gate, shared_up, shared_down;  // shared expert
    std::string shared_expert_gate;                   // [1, H]
    // Fused experts (transformers 5 in-memory layout, and how some Qwen3.5
    // checkpoints store them): one [E, 2I, H] gate_up tensor (gate rows
    // first) and one [E, H, I] down tensor; `experts` is then empty and each
    // expert is a slice (a view: one expert's bytes, never the whole tensor).
    std::string fused_gate_up, fused_down;
    // Gated DeltaNet (linear-attention layers of qwen3_5_moe / qwen3_next);
    // the attention names above are then empty.
    std::string in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // qwen3_5_moe
    std::string in_proj_qkvz, in_proj_ba;                      // qwen3_next (interleaved per key head)
    std::string conv1d, dt_bias, a_log, linear_norm, out_proj;
    // gpt_oss: attention sinks [nh], the router's logit bias [E], and the
    // experts as GptOssExperts stores them — gate_up [E, H, 2I] (gate/up
    // interleaved along 2I) and down [E, I, H], or MXFP4 (`*_blocks` U8
    // [E, 2I, H/32, 16] / [E, H, I/32, 16] with `*_scales` U8 [E, 2I, H/32] /
    // [E, H, I/32], rows = output features), plus their biases [E, 2I], [E, H].
    std::string sinks, router_logit_bias;
    std::string oss_gate_up, oss_gate_up_bias, oss_down, oss_down_bias;
    std::string oss_gate_up_scales, oss_down_scales;  // MXFP4 only
};

struct ModelTensorNames {
    std::string embed;       // model.embed_tokens.weight [V, H]
    std::string final_norm;  // model.norm.weight [H]
    std::string lm_head;     // lm_head.weight [V, H]; == embed when tie_word_embeddings
};

LayerTensorNames layer_tensor_names(const ModelConfig& cfg, std::int64_t layer);
ModelTensorNames model_tensor_names(const ModelConfig& cfg);
// Every tensor of layer `layer` with its expected shape.
std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& cfg, std::int64_t layer);
// The non-layer tensors (embed, final norm, lm_head unless tied).
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg);

}  // namespace kvasir
