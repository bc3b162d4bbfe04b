// qwen3_next (Qwen3NextForCausalLM, transformers 5.24): the hybrid stack of
// qwen3_5_moe (Gated DeltaNet + gated full attention, zero-centred norms,
// partial rotary), with the DeltaNet's projections fused per key head
// (in_proj_qkvz, in_proj_ba: graph.cpp undoes the interleaving exactly as
// fix_query_key_value_ordering does) and the qwen3_moe rule for which layers
// are MoE (decoder_sparse_step, mlp_only_layers; the others dense SwiGLU).
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_config.hpp"

#include <fmt/format.h>

namespace kvasir::families {

namespace {

using namespace config_bounds;

void read_qwen3_next(const ConfigKeys& k, ModelConfig& c) {
    read_hybrid(k, c, true);
    c.router.norm_topk_prob = k.boolean("norm_topk_prob", true);
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    read_qwen_sparse_layers(k, c);  // Qwen3NextDecoderLayer: the qwen3_moe rule
}

// Qwen3NextGatedDeltaNet: two fused input projections in place of the four.
void name_qwen3_next_layer(const ModelConfig& c, std::int64_t layer, LayerTensorNames& n) {
    if (!c.is_linear_attention(layer)) return;
    const std::string a = fmt::format("{}layers.{}.linear_attn.", c.tensor_prefix, layer);
    n.in_proj_qkv.clear();
    n.in_proj_z.clear();
    n.in_proj_b.clear();
    n.in_proj_a.clear();
    n.in_proj_qkvz = a + "in_proj_qkvz.weight";
    n.in_proj_ba = a + "in_proj_ba.weight";
}

}  // namespace

const Family& qwen3_next() {
    // Qwen3NextConfig; head_dim is a field, default 256.
    static const Family f{.id = Architecture::qwen3_next, .model_type = "qwen3_next", .class_prefix = "Qwen3Next",
                          .defaults = {.kv_heads = 2, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0,
                                       .head_dim = 256},
                          .read = read_qwen3_next, .name_layer = name_qwen3_next_layer, .gguf_architecture = "qwen3next",
                          .gguf_experts = GgufExperts::with, .read_gguf = gguf_softmax_moe_ffn,
                          .layer = LayerKind::hybrid};
    return f;
}

}  // namespace kvasir::families
