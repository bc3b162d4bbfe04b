// qwen3_5_moe (Qwen3_5MoeForConditionalGeneration / Qwen3_5MoeForCausalLM,
// transformers 5.24): the hybrid stack — Gated DeltaNet linear attention on
// the layers layer_types names "linear_attention", gated full attention
// (output gate from q_proj, q/k RMSNorm, partial rotary) on the others —
// zero-centred RMSNorm weights (1 + w) everywhere but the DeltaNet's gated
// norm, and on every layer the MoE block: softmax top-k renormalised, plus
// the shared expert scaled by sigmoid(x·shared_expert_gateᵀ).
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen3_5_moe() {
    static const FamilyDecoder a(Architecture::qwen3_5_moe, &LayerGraph::hybrid_layer);
    return a;
}

}  // namespace kvasir::arch
