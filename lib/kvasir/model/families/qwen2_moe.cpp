// qwen2_moe (Qwen2MoeForCausalLM, transformers 5.24): the standard pre-norm
// layer; attention with q/k/v biases and no q/k norm; MoE layers every
// decoder_sparse_step (softmax top-k, norm_topk_prob) with a shared expert
// whose output is scaled by sigmoid(x·shared_expert_gateᵀ) before it is added.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_config.hpp"

namespace kvasir::families {

namespace {

using namespace config_bounds;

void read_qwen2_moe(const ConfigKeys& k, ModelConfig& c) {
    // Qwen2MoeAttention: q/k/v bias=config.qkv_bias (default True), o_proj none.
    c.attention_bias = k.boolean("qkv_bias", true);
    c.router.num_experts = k.size("num_experts", 1, kMaxExperts);
    // Qwen2MoeSparseMoeBlock: shared_expert (SwiGLU) × sigmoid(shared_expert_gate(x)).
    c.shared_expert_intermediate_size = k.size("shared_expert_intermediate_size", 1, kMaxDim);
    c.shared_expert_gate = true;
    read_qwen_moe_block(k, c);
}

}  // namespace

const Family& qwen2_moe() {
    static const Family f{.id = Architecture::qwen2_moe, .model_type = "qwen2_moe", .class_prefix = "Qwen2Moe",
                          .defaults = {.kv_heads = 16, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0},
                          .read = read_qwen2_moe, .gguf_architecture = "qwen2moe", .gguf_experts = GgufExperts::with,
                          .read_gguf = gguf_softmax_moe_ffn, .gguf_norm_topk = false};
    return f;
}

}  // namespace kvasir::families
