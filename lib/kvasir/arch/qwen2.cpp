// qwen2 (Qwen2ForCausalLM, transformers 5.24): the standard pre-norm layer
// with q/k/v biases (no o_proj bias) and a dense SwiGLU MLP; with
// use_sliding_window, sliding-window attention on the layers layer_types names
// "sliding_attention".
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen2() {
    static const FamilyDecoder a(Architecture::qwen2, &LayerGraph::standard_layer, FamilyDecoder::Sliding::checked);
    return a;
}

}  // namespace kvasir::arch
