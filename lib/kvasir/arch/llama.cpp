// llama (LlamaForCausalLM, transformers 5.24): the standard pre-norm layer
// with a dense SwiGLU MLP on every layer; GQA attention, q/k/v/o biases when
// attention_bias; rope "default" or "llama3" (the frequency-scaled rope of
// Llama 3.1+, model/rope_frequencies.hpp); tied or untied embeddings.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& llama() {
    static const FamilyDecoder a(Architecture::llama, &LayerGraph::standard_layer);
    return a;
}

}  // namespace kvasir::arch
