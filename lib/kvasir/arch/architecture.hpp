// One file per architecture family (lib/kvasir/arch/<family>.cpp), each
// composing its decoder layer from the blocks of graph.hpp, and a registry
// from the config's architecture to it. The runner (steps/forward.cpp) knows
// nothing of any family: embeddings, the layer loop, router authority,
// anchors, hidden-state capture and the final norm + lm_head are its part;
// what happens inside a layer is the architecture's.
//
// Adding an architecture: its config parsing (model/config.cpp), one file
// here defining a DecoderArchitecture and its line in architectures(), its
// fixtures and tests — nothing in steps/, audit/, report/ or app/.
#pragma once

#include "kvasir/arch/graph.hpp"
#include "kvasir/model/config.hpp"

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

// A family: its id and which layer of LayerGraph it is made of —
// standard_layer (qwen2_moe, qwen3_moe, mixtral, llama, mistral, qwen2,
// qwen3, olmoe, gpt_oss, glm4_moe: they differ only in which weights a layer
// has — biases, q/k norms, a dense MLP or the MoE block with or without a
// shared expert — which the blocks read from the layer), mla_layer
// (deepseek_v3) or hybrid_layer (qwen3_5_moe, qwen3_next, qwen3_5). All use
// the standard attention checks (check_standard_attention).
class FamilyDecoder final : public DecoderArchitecture {
public:
    using LayerFn = Tensor (LayerGraph::*)(std::int64_t, const TensorView&, LayerIO&);
    // Whether a sliding window in the config is run (the family's windows are
    // checked against transformers by a fixture) or refused.
    enum class Sliding { refused, checked };
    FamilyDecoder(Architecture id, LayerFn layer_fn, Sliding sliding = Sliding::refused)
        : id_(id), layer_(layer_fn), sliding_(sliding) {}
    Architecture id() const override { return id_; }
    void check(const ModelConfig& config) const override;
    Tensor layer(LayerGraph& g, std::int64_t l, const TensorView& h, LayerIO& io) const override;

private:
    Architecture id_;
    LayerFn layer_;
    Sliding sliding_;
};

// Every family with a full forward pass.
const std::vector<const DecoderArchitecture*>& architectures();

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
