// qwen3_5 (Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM, transformers
// 5.24): the dense Qwen3.5 — qwen3_5_moe's hybrid stack (Gated DeltaNet and
// gated full attention, zero-centred norms, partial rotary) with a dense
// SwiGLU MLP in place of the MoE block on every layer.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen3_5() {
    static const FamilyDecoder a(Architecture::qwen3_5, &LayerGraph::hybrid_layer);
    return a;
}

}  // namespace kvasir::arch
