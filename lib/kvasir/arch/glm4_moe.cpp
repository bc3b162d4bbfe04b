// glm4_moe (Glm4MoeForCausalLM, transformers 5.24; GLM-4.5 / 4.6): the standard pre-norm layer; GQA
// attention with q/k/v biases (attention_bias; o_proj none), per-head q/k RMSNorm when use_qk_norm, rope
// on the first head_dim·partial_rotary_factor dims (rotate_half within them); the dense SwiGLU MLP on the
// first first_k_dense_replace layers, then the MoE block with DeepSeek-V3's sigmoid router
// (Glm4MoeTopkRouter: correction bias for selection, groups, routed_scaling_factor) and shared experts.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& glm4_moe() {
    static const FamilyDecoder a(Architecture::glm4_moe, &LayerGraph::standard_layer);
    return a;
}

}  // namespace kvasir::arch
