// olmoe (OlmoeForCausalLM, transformers 5.24): the standard pre-norm layer;
// attention with RMSNorm over the whole q and k projections (q_norm [nh·D],
// k_norm [nkv·D]) before the split into heads; every layer the MoE block:
// softmax over all experts, top-k, renormalised only with norm_topk_prob
// (default false), no shared expert.
#include "kvasir/arch/architecture.hpp"

namespace kvasir::arch {

const DecoderArchitecture& olmoe() {
    static const FamilyDecoder a(Architecture::olmoe, &LayerGraph::standard_layer);
    return a;
}

}  // namespace kvasir::arch
