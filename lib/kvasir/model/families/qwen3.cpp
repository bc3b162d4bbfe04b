// qwen3 (Qwen3ForCausalLM, transformers 5.24): qwen2's layer with per-head
// q/k RMSNorm over head_dim before rope, biases only when attention_bias
// (then on o_proj too), the same sliding-window rule.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

namespace kvasir::families {

namespace {

void read_qwen3(const ConfigKeys& k, ModelConfig& c) {
    c.qk_norm = true;
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    read_qwen_sliding_window(k, c);
    read_dense_mlp(k, c);
}

}  // namespace

const Family& qwen3() {
    // Qwen3Config: head_dim is a field, default 128 (Qwen3Attention reads it, not hidden_size / heads).
    static const Family f{.id = Architecture::qwen3, .model_type = "qwen3", .class_prefix = "Qwen3",
                          .defaults = {.kv_heads = 32, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0,
                                       .head_dim = 128},
                          .read = read_qwen3, .sliding_checked = true};
    return f;
}

}  // namespace kvasir::families
