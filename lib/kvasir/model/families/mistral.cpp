// mistral (MistralForCausalLM, transformers 5.24): the llama layer without
// biases, and sliding-window attention on every layer when sliding_window is
// set (a query at position p sees the keys p − W < j ≤ p).
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

namespace kvasir::families {

namespace {

void read_mistral(const ConfigKeys& k, ModelConfig& c) {
    c.sliding_window = read_sliding_window(k, 4096);  // MistralConfig default 4096; null = full attention
    read_dense_mlp(k, c);
}

}  // namespace

const Family& mistral() {
    static const Family f{.id = Architecture::mistral, .model_type = "mistral", .class_prefix = "Mistral",
                          .defaults = {.kv_heads = 8, .max_positions = 4096 * 32, .rms_eps = 1e-6, .rope_theta = 10000.0},
                          .read = read_mistral, .sliding_checked = true};
    return f;
}

}  // namespace kvasir::families
