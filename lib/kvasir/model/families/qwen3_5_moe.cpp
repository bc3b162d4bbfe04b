// qwen3_5_moe (Qwen3_5MoeForConditionalGeneration / Qwen3_5MoeForCausalLM,
// transformers 5.24): the hybrid stack — Gated DeltaNet linear attention on
// the layers layer_types names "linear_attention", gated full attention
// (output gate from q_proj, q/k RMSNorm, partial rotary) on the others —
// zero-centred RMSNorm weights (1 + w) everywhere but the DeltaNet's gated
// norm, and on every layer the MoE block: softmax top-k renormalised, plus
// the shared expert scaled by sigmoid(x·shared_expert_gateᵀ).
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_config.hpp"

namespace kvasir::families {

namespace {

void read_qwen3_5_moe(const ConfigKeys& k, ModelConfig& c) {
    read_hybrid(k, c, true);
    // Qwen3_5MoeTopKRouter renormalises the top-k unconditionally; every
    // layer's MLP is the sparse MoE block (Qwen3_5MoeDecoderLayer).
    c.router.norm_topk_prob = true;
    c.intermediate_size = 0;
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);
}

}  // namespace

const Family& qwen3_5_moe() {
    // Qwen3_5MoeTextConfig (the released 35B-A3B's shape); head_dim is a field, default 256.
    static const Family f{.id = Architecture::qwen3_5_moe, .model_type = "qwen3_5_moe", .class_prefix = "Qwen3_5Moe",
                          .other_model_types = {"qwen3_5_moe_text"},  // Qwen3_5MoeForCausalLM's text-only config
                          .defaults = {.kv_heads = 2, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0,
                                       .head_dim = 256},
                          .read = read_qwen3_5_moe, .text_config_wrapper = true, .gguf_architecture = "qwen35moe",
                          .gguf_experts = GgufExperts::with, .read_gguf = gguf_softmax_moe_ffn,
                          .gguf_deltanet_tiled = true, .layer = LayerKind::hybrid};
    return f;
}

}  // namespace kvasir::families
