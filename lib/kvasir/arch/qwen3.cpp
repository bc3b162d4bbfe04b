// qwen3 (Qwen3ForCausalLM, transformers 5.24): qwen2's layer with per-head
// q/k RMSNorm over head_dim before rope, biases only when attention_bias
// (then on o_proj too), the same sliding-window rule.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen3() {
    static const FamilyDecoder a(Architecture::qwen3, &LayerGraph::standard_layer, FamilyDecoder::Sliding::checked);
    return a;
}

}  // namespace kvasir::arch
