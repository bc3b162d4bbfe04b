// olmoe (OlmoeForCausalLM, transformers 5.24): the standard pre-norm layer;
// attention with RMSNorm over the whole q and k projections (q_norm [nh·D],
// k_norm [nkv·D]) before the split into heads; every layer the MoE block:
// softmax over all experts, top-k, renormalised only with norm_topk_prob
// (default false), no shared expert.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

namespace kvasir::families {

namespace {

using namespace config_bounds;

void read_olmoe(const ConfigKeys& k, ModelConfig& c) {
    RouterConfig& r = c.router;
    // OlmoeAttention (transformers 5.24): q_norm over hidden_size and k_norm over (hidden/heads)·kv
    // applied to the whole projections before the split into heads; q/k/v/o bias = attention_bias;
    // clip_qkv (clamping q, k, v) is not modelled. OlmoeTopKRouter: softmax over all experts, top-k,
    // renormalised only with norm_topk_prob (default false). OlmoeExperts: intermediate_size wide.
    c.qk_norm = c.qk_norm_full = true;
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    if (const nlohmann::json* v = k.find("clip_qkv", true))
        fail(ErrorCode::unsupported, "{}: clip_qkv {} (clamping q, k and v) is not implemented", c.source, show_json(*v));
    KVASIR_CHECK(c.head_dim * c.num_heads == c.hidden_size, ErrorCode::unsupported,
                 "{}: head_dim {} × num_attention_heads {} != hidden_size {} (OlmoeAttention's q_norm is "
                 "hidden_size wide)", c.source, c.head_dim, c.num_heads, c.hidden_size);
    r.num_experts = k.size_aliased("num_experts", "num_local_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    r.norm_topk_prob = k.boolean("norm_topk_prob", false);
    c.moe_intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.intermediate_size = 0;
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);  // OlmoeDecoderLayer: every layer
}

}  // namespace

const Family& olmoe() {
    // OlmoeConfig (OLMoE-1B-7B: 64 experts of 1024, top-8; intermediate = expert width; num_key_value_heads
    // None → num_attention_heads)
    static const Family f{.id = Architecture::olmoe, .model_type = "olmoe", .class_prefix = "Olmoe",
                          .defaults = {.kv_heads = 0, .max_positions = 4096, .rms_eps = 1e-5, .rope_theta = 10000.0},
                          .read = read_olmoe};
    return f;
}

}  // namespace kvasir::families
