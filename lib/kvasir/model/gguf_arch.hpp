// llama.cpp's naming inside a GGUF file: which role a tensor plays
// ("blk.3.ffn_up_exps.weight" → layer 3, expert-stacked up projection) and
// the hyperparameters of the supported architectures, read from `<arch>.*`
// metadata. The container itself (parsing, bounds checks) is gguf.hpp.
#pragma once

#include "kvasir/model/gguf.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// ---------------------------------------------------------------------------
// llama.cpp tensor names → neutral roles
// ---------------------------------------------------------------------------

// What a llama.cpp tensor is, independent of the name it has in a file.
enum class GgufRole {
    token_embd,        // token_embd            [vocab, n_embd] row-major
    output_norm,       // output_norm           final RMSNorm weight
    output,            // output                lm_head [vocab, n_embd]; absent when tied to token_embd
    attn_norm,         // blk.N.attn_norm
    attn_q,            // blk.N.attn_q          (qwen2moe also has .bias for q/k/v)
    attn_k,
    attn_v,
    attn_output,       // blk.N.attn_output     o_proj
    attn_q_norm,       // blk.N.attn_q_norm     per-head RMSNorm (qwen3moe)
    attn_k_norm,
    ffn_norm,          // blk.N.ffn_norm        post-attention RMSNorm
    ffn_gate_inp,      // blk.N.ffn_gate_inp    router [n_expert, n_embd]
    ffn_gate_exps,     // blk.N.ffn_gate_exps   expert stack [n_expert, n_ff_exp, n_embd]
    ffn_up_exps,       // blk.N.ffn_up_exps     expert stack [n_expert, n_ff_exp, n_embd]
    ffn_down_exps,     // blk.N.ffn_down_exps   expert stack [n_expert, n_embd, n_ff_exp]
    ffn_gate_inp_shexp,  // blk.N.ffn_gate_inp_shexp  shared-expert gate [n_embd] (qwen2moe)
    ffn_gate_shexp,    // blk.N.ffn_gate_shexp  shared expert [n_ff_shexp, n_embd]
    ffn_up_shexp,
    ffn_down_shexp,
    ffn_gate,          // blk.N.ffn_gate        dense FFN (or one expert in legacy split files)
    ffn_up,
    ffn_down,
    exp_probs_b,       // blk.N.exp_probs_b     DeepSeek-style router score-correction bias [n_expert]
    attn_sinks,        // blk.N.attn_sinks      gpt-oss: a learned sink logit per head [n_head]
    post_attention_norm,  // blk.N.post_attention_norm  gpt-oss: its post-attention RMSNorm (others: ffn_norm)
    // deepseek2 (MLA, as llama.cpp's converter writes it): q-LoRA down/norm/up (or attn_q), the latent with
    // the shared rope key and its norm, and kv_b_proj split per head into attn_k_b [nh, kv_lora, nope]
    // (transposed) and attn_v_b [nh, v, kv_lora].
    attn_q_a, attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, attn_k_b, attn_v_b,
    // qwen3next / qwen35moe Gated DeltaNet layers (llama.cpp's converter): attn_qkv [q | k | v], attn_gate
    // (z), ssm_ba (qwen3next: per key head [b | a]) or ssm_beta + ssm_alpha (qwen35moe), ssm_conv1d [C, K],
    // ssm_a = −exp(A_log) (stored without a .weight suffix), ssm_dt (.bias: dt_bias), ssm_norm, ssm_out.
    attn_qkv, attn_gate, ssm_ba, ssm_beta, ssm_alpha, ssm_conv1d, ssm_a, ssm_dt, ssm_norm, ssm_out,
};
std::string_view gguf_role_name(GgufRole role) noexcept;  // the llama.cpp base name, e.g. "ffn_up_exps"

struct GgufTensorRole {
    int layer = -1;               // N of blk.N; −1 for token_embd / output_norm / output
    GgufRole role = GgufRole::token_embd;
    bool expert_stacked = false;  // one tensor holds all experts (outermost row-major dim = expert)
    int expert = -1;              // legacy per-expert files: blk.N.ffn_gate.E.weight → E; else −1
    bool bias = false;            // ".bias" rather than ".weight" (exp_probs_b is always a bias)
};

// Map a llama.cpp GGUF tensor name ("blk.3.ffn_up_exps.weight") to its role;
// nullopt for names outside the table above (rope_freqs, vision towers, ...)
// or malformed ones (layer index not a plain decimal < 2^31).
std::optional<GgufTensorRole> gguf_tensor_role(std::string_view name);

// ---------------------------------------------------------------------------
// Architecture hyperparameters
// ---------------------------------------------------------------------------

// The hyperparameters of a qwen2moe / qwen3moe / llama (Mixtral when
// expert_count > 0) / gpt-oss GGUF, read from `<arch>.*` metadata and the tensor list.
// A plain record: the common model description is built from it elsewhere.
struct GgufModelParams {
    std::string architecture;                    // general.architecture
    std::int64_t block_count = 0;                // <arch>.block_count (layers)
    std::int64_t embedding_length = 0;           // <arch>.embedding_length (hidden size)
    std::int64_t feed_forward_length = 0;        // <arch>.feed_forward_length (dense FFN width); 0 if absent
    std::int64_t head_count = 0;                 // <arch>.attention.head_count
    std::int64_t head_count_kv = 0;              // <arch>.attention.head_count_kv; default head_count
    std::int64_t key_length = 0;                 // <arch>.attention.key_length; default embedding_length / head_count
    std::int64_t value_length = 0;               // <arch>.attention.value_length; default key_length
    double rope_freq_base = 10000.0;             // <arch>.rope.freq_base; llama.cpp's default when absent
    double rms_norm_eps = 0.0;                   // <arch>.attention.layer_norm_rms_epsilon (required)
    std::int64_t expert_count = 0;               // <arch>.expert_count; 0 = dense model
    std::int64_t expert_used_count = 0;          // <arch>.expert_used_count (top-k)
    std::int64_t expert_feed_forward_length = 0;  // <arch>.expert_feed_forward_length; Mixtral: feed_forward_length
    std::int64_t expert_shared_feed_forward_length = 0;  // <arch>.expert_shared_feed_forward_length; 0 = none
    // Renormalise the top-k weights to sum 1. llama.cpp hard-codes it per
    // architecture (qwen2moe: no; qwen3moe and Mixtral: yes);
    // <arch>.expert_weights_norm overrides when present.
    bool norm_topk_prob = false;
    std::int64_t vocab_size = 0;                 // tokenizer.ggml.tokens length, else <arch>.vocab_size, else token_embd rows
    bool qk_norm = false;                        // any blk.N.attn_q_norm tensor
    bool shared_expert = false;                  // any blk.N.ffn_*_shexp tensor
    bool shared_expert_gate = false;             // any blk.N.ffn_gate_inp_shexp tensor
    bool tied_embeddings = false;                // no `output` tensor: lm_head is token_embd
    std::vector<bool> moe_layers;                // per layer: has a router (blk.N.ffn_gate_inp)
    // <arch>.attention.sliding_window (0: none) and which layers use it:
    // <arch>.attention.sliding_window_pattern — a bool per layer, or a period
    // n (layer l slides iff l % n < n − 1; 0: every layer) — else llama.cpp's
    // default for the architecture (gpt-oss: period 2, the even layers).
    std::int64_t sliding_window = 0;
    std::vector<bool> sliding_layers;
    // deepseek2 (0 / neutral elsewhere): MLA ranks and per-head widths (attention.key_length_mla = nope +
    // rope, value_length_mla = v; the plain key/value_length describe llama.cpp's MQA form of the latent),
    // rope.dimension_count (the rope part), the sigmoid router's groups, scaling and gating function
    // (expert_gating_func 2 = sigmoid), leading dense layers and the shared experts' count.
    std::int64_t q_lora_rank = 0, kv_lora_rank = 0, key_length_mla = 0, value_length_mla = 0, rope_dimension_count = 0;
    std::int64_t expert_group_count = 1, expert_group_used_count = 1, expert_gating_func = 0;
    std::int64_t leading_dense_block_count = 0, expert_shared_count = 0;
    double expert_weights_scale = 1.0;
    // qwen3next / qwen35moe: the Gated DeltaNet's widths (ssm.conv_kernel; state_size = the key and value
    // head dim; group_count = key heads; time_step_rank = value heads; inner_size = value heads × dim) and
    // which layers are linear attention (attention.recurrent_layers, one bool per layer).
    std::int64_t ssm_conv_kernel = 0, ssm_state_size = 0, ssm_group_count = 0, ssm_time_step_rank = 0,
                 ssm_inner_size = 0;
    std::vector<bool> recurrent_layers;
};

// The GGUF architectures of the families, for messages: "qwen2moe, qwen3moe, llama, …".
std::string gguf_supported_architectures();
// Read the hyperparameters. Throws Error(bad_input) naming the file for a
// missing/ill-typed required key or inconsistent values, and
// Error(unsupported) for another architecture (listing the supported ones).
GgufModelParams read_gguf_model_params(const GgufFile& file);

}  // namespace kvasir
