// mixtral (MixtralForCausalLM, transformers 5.24): the standard pre-norm
// layer; plain GQA attention (no biases, no q/k norm); every layer MoE, top-k
// of the softmax always renormalised (MixtralTopKRouter has no switch).
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& mixtral() {
    static const FamilyDecoder a(Architecture::mixtral, &LayerGraph::standard_layer);
    return a;
}

}  // namespace kvasir::arch
