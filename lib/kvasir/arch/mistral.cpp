// mistral (MistralForCausalLM, transformers 5.24): the llama layer without
// biases, and sliding-window attention on every layer when sliding_window is
// set (a query at position p sees the keys p − W < j ≤ p).
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& mistral() {
    static const FamilyDecoder a(Architecture::mistral, &LayerGraph::standard_layer, FamilyDecoder::Sliding::checked);
    return a;
}

}  // namespace kvasir::arch
