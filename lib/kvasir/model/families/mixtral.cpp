// mixtral (MixtralForCausalLM, transformers 5.24): the standard pre-norm
// layer; plain GQA attention (no biases, no q/k norm); every layer MoE, top-k
// of the softmax always renormalised (MixtralTopKRouter has no switch); the
// experts under block_sparse_moe as w1 (gate), w3 (up), w2 (down). llama.cpp
// writes it as "llama" with experts.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_config.hpp"

#include <fmt/format.h>

namespace kvasir::families {

namespace {

using namespace config_bounds;

void read_mixtral(const ConfigKeys& k, ModelConfig& c) {
    RouterConfig& r = c.router;
    // attribute_map {"num_experts": "num_local_experts"}.
    r.num_experts = k.size_aliased("num_local_experts", "num_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    // MixtralTopKRouter.forward: router_top_value /= router_top_value.sum(...) unconditionally.
    r.norm_topk_prob = true;
    // MixtralExperts: intermediate_dim = config.intermediate_size; no dense layers.
    c.moe_intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.intermediate_size = 0;
    c.sliding_window = read_sliding_window(k, 0);  // MixtralConfig default None = full attention
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);  // MixtralDecoderLayer
}

void name_mixtral_layer(const ModelConfig& c, std::int64_t layer, LayerTensorNames& n) {
    if (!c.is_moe(layer)) return;
    n.fused_gate_up.clear();  // one tensor per expert (MixtralExperts' checkpoints are never fused)
    n.fused_down.clear();
    n.experts.resize(static_cast<std::size_t>(c.num_experts()));
    const std::string m = fmt::format("{}layers.{}.block_sparse_moe.", c.tensor_prefix, layer);
    n.router = m + "gate.weight";
    for (std::size_t e = 0; e < n.experts.size(); ++e) {
        n.experts[e].gate = fmt::format("{}experts.{}.w1.weight", m, e);
        n.experts[e].up = fmt::format("{}experts.{}.w3.weight", m, e);
        n.experts[e].down = fmt::format("{}experts.{}.w2.weight", m, e);
    }
}

// llama.cpp's "llama" with experts: every layer MoE, no dense MLP.
void read_mixtral_gguf(const GgufFile& file, const GgufModelParams& p, const std::string& path, ModelConfig& c) {
    gguf_softmax_moe_ffn(file, p, path, c);
    c.intermediate_size = 0;
}

}  // namespace

const Family& mixtral() {
    // MixtralConfig.default_theta = 1e6
    static const Family f{.id = Architecture::mixtral, .model_type = "mixtral", .class_prefix = "Mixtral",
                          .defaults = {.kv_heads = 8, .max_positions = 4096 * 32, .rms_eps = 1e-5, .rope_theta = 1e6},
                          .read = read_mixtral, .experts_key = "num_local_experts", .name_layer = name_mixtral_layer,
                          .gguf_architecture = "llama", .gguf_experts = GgufExperts::with, .read_gguf = read_mixtral_gguf,
                          .gguf_rope_permuted = true};
    return f;
}

}  // namespace kvasir::families
