// The decoder of each model family: the layer of graph.hpp its record names
// (model/family.hpp Family::layer, LayerKind) and its checks. The runner
// (steps/forward.cpp) knows nothing of any family: embeddings, the layer
// loop, router authority, anchors, hidden-state capture and the final norm +
// lm_head are its part; what happens inside a layer is the family's.
//
// Adding a family is its record (model/families/<family>.cpp), its fixtures
// and tests — nothing here, in steps/, audit/, report/ or app/, unless it
// needs a decoder layer graph.hpp does not have.
#pragma once

#include "kvasir/arch/graph.hpp"
#include "kvasir/model/config.hpp"
#include "kvasir/model/family.hpp"

#include <string_view>
#include <vector>

namespace kvasir::arch {

class DecoderArchitecture {
public:
    virtual ~DecoderArchitecture() = default;
    virtual Architecture id() const = 0;
    // Refuses (Error(unsupported), naming the config key) a configuration
    // this forward pass does not implement: never silently wrong numbers.
    virtual void check(const ModelConfig& config) const = 0;
    // Decoder layer l on input h [T, H] → the residual stream after it.
    virtual Tensor layer(LayerGraph& g, std::int64_t l, const TensorView& h, LayerIO& io) const = 0;
};

// A family's decoder: the layer of LayerGraph its record names —
// standard_layer (qwen2_moe, qwen3_moe, mixtral, llama, mistral, qwen2,
// qwen3, olmoe, gpt_oss, glm4_moe: they differ only in which weights a layer
// has — biases, q/k norms, a dense MLP or the MoE block with or without a
// shared expert — which the blocks read from the layer), mla_layer
// (deepseek_v3) or hybrid_layer (qwen3_5_moe, qwen3_next, qwen3_5). All use
// the standard attention checks (check_standard_attention); a sliding window
// runs where the record says its rule is checked by a fixture
// (Family::sliding_checked), else it is refused.
class FamilyDecoder final : public DecoderArchitecture {
public:
    explicit FamilyDecoder(const Family& family);
    Architecture id() const override { return family_.id; }
    void check(const ModelConfig& config) const override;
    Tensor layer(LayerGraph& g, std::int64_t l, const TensorView& h, LayerIO& io) const override;

private:
    using LayerFn = Tensor (LayerGraph::*)(std::int64_t, const TensorView&, LayerIO&);
    const Family& family_;
    LayerFn layer_;
};

// The decoder of every family (model/family.hpp all_families()), in its order.
std::vector<const DecoderArchitecture*> architectures();

// The architecture of `config`, checked: Error(unsupported) naming the
// config's source when no family is registered for it or when check()
// refuses it.
const DecoderArchitecture& architecture_for(const ModelConfig& config);

// The checks every family built on the standard attention shares: rope
// type "default" or "llama3" (full rotary only). Sliding windows are
// LayerGraph::attend's, one mechanism for every family; a family runs them
// once a fixture made by transformers checks its window rule (which layers
// slide), else FamilyDecoder::check refuses them.
void check_standard_attention(const ModelConfig& config);

}  // namespace kvasir::arch
