// qwen3_next (Qwen3NextForCausalLM, transformers 5.24): the hybrid stack of
// qwen3_5_moe (Gated DeltaNet + gated full attention, zero-centred norms,
// partial rotary), with the DeltaNet's projections fused per key head
// (in_proj_qkvz, in_proj_ba: graph.cpp undoes the interleaving exactly as
// fix_query_key_value_ordering does) and the qwen3_moe rule for which layers
// are MoE (decoder_sparse_step, mlp_only_layers; the others dense SwiGLU).
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& qwen3_next() {
    static const FamilyDecoder a(Architecture::qwen3_next, &LayerGraph::hybrid_layer);
    return a;
}

}  // namespace kvasir::arch
