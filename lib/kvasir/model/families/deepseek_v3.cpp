// deepseek_v3 (DeepseekV3ForCausalLM, transformers 5.24; DeepSeek-V3/R1/V3.1, Kimi-K2 and their
// fine-tunes): the standard pre-norm layer with multi-head latent attention (LayerGraph::mla_attention:
// q-LoRA or a plain q_proj, the compressed kv with one shared rope key, interleaved rope on the rope part,
// yarn with DeepSeek's mscale softmax correction); the dense SwiGLU MLP on the first
// first_k_dense_replace layers, the MoE block on the others: sigmoid router, e_score_correction_bias for
// the selection only, top-k within the topk_group best of n_group groups, weights renormalised ×
// routed_scaling_factor (Backend::route), plus the ungated shared experts.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"

namespace kvasir::families {

namespace {

void read_deepseek_v3(const ConfigKeys& k, ModelConfig& c) {
    // DeepseekV3Attention: q_a_proj, kv_a_proj_with_mqa and o_proj take bias=attention_bias
    // (q_b_proj, kv_b_proj, q_proj never).
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    read_sigmoid_router(k, c, {8, 4, 2.5, 3});
}

// llama.cpp's deepseek2 graph: expert_gating_func 2 = sigmoid (DeepSeek-V3, Kimi-K2) with exp_probs_b for the
// selection, expert_group_count / _used_count, expert_weights_norm and _scale; leading dense layers;
// expert_shared_count shared experts of expert_feed_forward_length, ungated. DeepSeek-V2's softmax router
// (gating func 1) is another model, not modelled.
void read_deepseek_v3_gguf(const GgufFile&, const GgufModelParams& p, const std::string& path, ModelConfig& c) {
    const std::string& a = p.architecture;
    KVASIR_CHECK(p.expert_gating_func == 2, ErrorCode::unsupported,
                 "{}: {}.expert_gating_func is {} (only 2, sigmoid — DeepSeek-V3's router — is implemented)", path, a,
                 p.expert_gating_func);
    for (std::int64_t l = 0; l < c.num_layers; ++l)
        KVASIR_CHECK(c.moe_layers[static_cast<std::size_t>(l)] == (l >= p.leading_dense_block_count), ErrorCode::bad_input,
                     "{}: layer {} {} a router but {}.leading_dense_block_count is {}", path, l,
                     c.moe_layers[static_cast<std::size_t>(l)] ? "has" : "lacks", a, p.leading_dense_block_count);
    c.first_k_dense_replace = p.leading_dense_block_count;
    c.intermediate_size = p.feed_forward_length;
    c.shared_expert_intermediate_size = p.expert_shared_count * p.expert_feed_forward_length;
    c.router.scoring = RouterScoring::sigmoid;
    c.router.score_correction_bias = true;
    c.router.num_experts = p.expert_count;
    c.router.top_k = p.expert_used_count;
    c.router.norm_topk_prob = p.norm_topk_prob;
    c.router.n_group = p.expert_group_count;
    c.router.topk_group = p.expert_group_used_count;
    c.router.routed_scaling_factor = p.expert_weights_scale;
}

}  // namespace

const Family& deepseek_v3() {
    // Kimi-K2's checkpoints name their own model_type (remote code) over
    // DeepseekV3ForCausalLM: the same config keys and model (the class name must
    // then say DeepseekV3).
    static const Family f{.id = Architecture::deepseek_v3, .model_type = "deepseek_v3", .class_prefix = "DeepseekV3",
                          .other_model_types = {"kimi_k2"},
                          .defaults = {.kv_heads = 128, .max_positions = 4096, .rms_eps = 1e-6, .rope_theta = 10000.0},
                          .read = read_deepseek_v3, .experts_key = "n_routed_experts", .gguf_architecture = "deepseek2",
                          .gguf_experts = GgufExperts::with, .read_gguf = read_deepseek_v3_gguf,
                          .gguf_norm_topk = false,  // llama.cpp's deepseek2: only with expert_weights_norm
                          .layer = LayerKind::mla};
    return f;
}

}  // namespace kvasir::families
