// qwen3_moe (Qwen3MoeForCausalLM, transformers 5.24): the standard pre-norm
// layer; attention with per-head q/k RMSNorm over head_dim, no biases
// (attention_bias adds the o_proj bias when set); MoE layers (softmax top-k,
// renormalised when norm_topk_prob) and dense layers (mlp_only_layers,
// decoder_sparse_step) in one stack.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen3_moe() {
    static const FamilyDecoder a(Architecture::qwen3_moe, &LayerGraph::standard_layer);
    return a;
}

}  // namespace kvasir::arch
