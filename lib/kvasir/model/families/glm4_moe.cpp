// glm4_moe (Glm4MoeForCausalLM, transformers 5.24; GLM-4.5 / 4.6): the standard pre-norm layer; GQA
// attention with q/k/v biases (attention_bias; o_proj none), per-head q/k RMSNorm when use_qk_norm, rope
// on the first head_dim·partial_rotary_factor dims (rotate_half within them); the dense SwiGLU MLP on the
// first first_k_dense_replace layers, then the MoE block with DeepSeek-V3's sigmoid router
// (Glm4MoeTopkRouter: correction bias for selection, groups, routed_scaling_factor) and shared experts.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

namespace kvasir::families {

namespace {

void read_glm4_moe(const ConfigKeys& k, ModelConfig& c) {
    // Glm4MoeAttention (transformers 5.24): q/k/v bias = attention_bias, o_proj none; per-head q/k
    // RMSNorm iff use_qk_norm; rope on the first head_dim·partial_rotary_factor dims (default 0.5,
    // Glm4MoeConfig.__post_init__), rotate_half within them. Glm4MoeTopkRouter = DeepseekV3TopkRouter.
    c.attention_bias = k.boolean("attention_bias", false);
    c.qk_norm = k.boolean("use_qk_norm", false);
    c.partial_rotary_factor = k.real("partial_rotary_factor", 0.5, 0.0, 1.0);
    if (const nlohmann::json* rp = k.find("rope_parameters", true);
        rp && rp->is_object() && rp->contains("partial_rotary_factor"))
        c.partial_rotary_factor =
            k.real_value((*rp)["partial_rotary_factor"], "rope_parameters.partial_rotary_factor", 0.0, 1.0);
    read_sigmoid_router(k, c, {1, 1, 1.0, 1});
}

}  // namespace

const Family& glm4_moe() {
    // Glm4MoeConfig (GLM-4.5's shape)
    static const Family f{.id = Architecture::glm4_moe, .model_type = "glm4_moe", .class_prefix = "Glm4Moe",
                          .defaults = {.kv_heads = 8, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 10000.0},
                          .read = read_glm4_moe, .experts_key = "n_routed_experts"};
    return f;
}

}  // namespace kvasir::families
