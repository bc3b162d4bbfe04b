// llama (LlamaForCausalLM, transformers 5.24): the standard pre-norm layer
// with a dense SwiGLU MLP on every layer; GQA attention, q/k/v/o biases when
// attention_bias; rope "default" or "llama3" (the frequency-scaled rope of
// Llama 3.1+, model/rope_frequencies.hpp); tied or untied embeddings.
// llama.cpp writes it as "llama" without experts (q/k permuted by its converter).
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_config.hpp"

namespace kvasir::families {

namespace {

void read_llama(const ConfigKeys& k, ModelConfig& c) {
    // LlamaAttention: q/k/v/o bias = attention_bias (default false); mlp_bias is not modelled.
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    KVASIR_CHECK(!k.boolean("mlp_bias", false), ErrorCode::unsupported,
                 "{}: mlp_bias true (biases on the MLP projections) is not implemented", c.source);
    read_dense_mlp(k, c);
}

// llama.cpp's "llama" without experts: the dense MLP on every layer.
void read_llama_gguf(const GgufFile&, const GgufModelParams& p, const std::string&, ModelConfig& c) {
    c.intermediate_size = p.feed_forward_length;
    c.router = RouterConfig{};
}

}  // namespace

const Family& llama() {
    // LlamaConfig (num_key_value_heads None → num_attention_heads)
    static const Family f{.id = Architecture::llama, .model_type = "llama", .class_prefix = "Llama",
                          .defaults = {.kv_heads = 0, .max_positions = 2048, .rms_eps = 1e-6, .rope_theta = 10000.0},
                          .read = read_llama, .gguf_architecture = "llama", .gguf_experts = GgufExperts::without,
                          .read_gguf = read_llama_gguf, .gguf_rope_permuted = true};
    return f;
}

}  // namespace kvasir::families
