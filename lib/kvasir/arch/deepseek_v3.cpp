// deepseek_v3 (DeepseekV3ForCausalLM, transformers 5.24; DeepSeek-V3/R1/V3.1, Kimi-K2 and their
// fine-tunes): the standard pre-norm layer with multi-head latent attention (LayerGraph::mla_attention:
// q-LoRA or a plain q_proj, the compressed kv with one shared rope key, interleaved rope on the rope part,
// yarn with DeepSeek's mscale softmax correction); the dense SwiGLU MLP on the first
// first_k_dense_replace layers, the MoE block on the others: sigmoid router, e_score_correction_bias for
// the selection only, top-k within the topk_group best of n_group groups, weights renormalised ×
// routed_scaling_factor (Backend::route), plus the ungated shared experts.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& deepseek_v3() {
    static const FamilyDecoder a(Architecture::deepseek_v3, &LayerGraph::mla_layer);
    return a;
}

}  // namespace kvasir::arch
