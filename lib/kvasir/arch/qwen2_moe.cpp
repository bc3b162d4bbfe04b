// qwen2_moe (Qwen2MoeForCausalLM, transformers 5.24): the standard pre-norm
// layer; attention with q/k/v biases and no q/k norm; MoE layers every
// decoder_sparse_step (softmax top-k, norm_topk_prob) with a shared expert
// whose output is scaled by sigmoid(x·shared_expert_gateᵀ) before it is added.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen2_moe() {
    static const FamilyDecoder a(Architecture::qwen2_moe, &LayerGraph::standard_layer);
    return a;
}

}  // namespace kvasir::arch
