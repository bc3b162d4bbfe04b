// qwen3_5 (Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM, transformers
// 5.24): the dense Qwen3.5 — qwen3_5_moe's hybrid stack (Gated DeltaNet and
// gated full attention, zero-centred norms, partial rotary) with a dense
// SwiGLU MLP in place of the MoE block on every layer.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

namespace kvasir::families {

namespace {

void read_qwen3_5(const ConfigKeys& k, ModelConfig& c) {
    read_hybrid(k, c, false);  // Qwen3_5DecoderLayer: the hybrid mixers, a dense MLP on every layer
    read_dense_mlp(k, c);
}

}  // namespace

const Family& qwen3_5() {
    // Qwen3_5TextConfig; head_dim is a field, default 256.
    static const Family f{.id = Architecture::qwen3_5, .model_type = "qwen3_5", .class_prefix = "Qwen3_5",
                          .other_model_types = {"qwen3_5_text"},  // Qwen3_5ForCausalLM's text-only config
                          .defaults = {.kv_heads = 4, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0,
                                       .head_dim = 256},
                          .read = read_qwen3_5, .text_config_wrapper = true, .layer = LayerKind::hybrid};
    return f;
}

}  // namespace kvasir::families
