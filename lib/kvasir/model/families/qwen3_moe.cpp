// qwen3_moe (Qwen3MoeForCausalLM, transformers 5.24): the standard pre-norm
// layer; attention with per-head q/k RMSNorm over head_dim, no biases
// (attention_bias adds the o_proj bias when set); MoE layers (softmax top-k,
// renormalised when norm_topk_prob) and dense layers (mlp_only_layers,
// decoder_sparse_step) in one stack.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_config.hpp"

namespace kvasir::families {

namespace {

using namespace config_bounds;

void read_qwen3_moe(const ConfigKeys& k, ModelConfig& c) {
    // Qwen3MoeAttention: q/k/v AND o_proj take bias=config.attention_bias; q_norm/k_norm always.
    c.qk_norm = true;
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    // attribute_map {"num_experts": "num_local_experts"}: save_pretrained writes num_local_experts.
    c.router.num_experts = k.size_aliased("num_experts", "num_local_experts", 1, kMaxExperts);
    read_qwen_moe_block(k, c);
}

}  // namespace

const Family& qwen3_moe() {
    static const Family f{.id = Architecture::qwen3_moe, .model_type = "qwen3_moe", .class_prefix = "Qwen3Moe",
                          .defaults = {.kv_heads = 4, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0},
                          .read = read_qwen3_moe, .gguf_architecture = "qwen3moe", .gguf_experts = GgufExperts::with,
                          .read_gguf = gguf_softmax_moe_ffn};
    return f;
}

}  // namespace kvasir::families
