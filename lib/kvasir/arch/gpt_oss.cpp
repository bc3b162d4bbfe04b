// gpt_oss (GptOssForCausalLM, transformers 5.24): the standard pre-norm
// layer; attention with q/k/v/o biases, a learned sink logit per head in
// every softmax (Backend::causal_attention_sinks), sliding-window attention
// on the layer_types "sliding_attention" layers (default: every other layer,
// starting with layer 0), yarn rope (its cos/sin scale folded into the
// softmax scale, LayerGraph::attend); on every layer the MoE block: router
// logits with a bias, top-k, softmax over the chosen k; experts with biases
// and the clamped SwiGLU (Backend::clamped_swiglu), MXFP4 or plain weights
// (Model, load_gpt_oss_experts).
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& gpt_oss() {
    static const FamilyDecoder a(Architecture::gpt_oss, &LayerGraph::standard_layer, FamilyDecoder::Sliding::checked);
    return a;
}

}  // namespace kvasir::arch
