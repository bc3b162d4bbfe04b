// qwen2 (Qwen2ForCausalLM, transformers 5.24): the standard pre-norm layer
// with q/k/v biases (no o_proj bias) and a dense SwiGLU MLP; with
// use_sliding_window, sliding-window attention on the layers layer_types names
// "sliding_attention".
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

namespace kvasir::families {

namespace {

void read_qwen2(const ConfigKeys& k, ModelConfig& c) {
    c.attention_bias = true;  // Qwen2Attention: q/k/v bias always, o_proj none
    read_qwen_sliding_window(k, c);
    read_dense_mlp(k, c);
}

}  // namespace

const Family& qwen2() {
    static const Family f{.id = Architecture::qwen2, .model_type = "qwen2", .class_prefix = "Qwen2",
                          .defaults = {.kv_heads = 32, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0},
                          .read = read_qwen2, .sliding_checked = true};
    return f;
}

}  // namespace kvasir::families
