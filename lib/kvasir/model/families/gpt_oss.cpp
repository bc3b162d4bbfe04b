// gpt_oss (GptOssForCausalLM, transformers 5.24): the standard pre-norm
// layer; attention with q/k/v/o biases, a learned sink logit per head in
// every softmax (Backend::causal_attention_sinks), sliding-window attention
// on the layer_types "sliding_attention" layers (default: every other layer,
// starting with layer 0), yarn rope (its cos/sin scale folded into the
// softmax scale, LayerGraph::attend); on every layer the MoE block: router
// logits with a bias, top-k, softmax over the chosen k; experts with biases
// and the clamped SwiGLU (Backend::clamped_swiglu), MXFP4 or plain weights
// (Model, load_gpt_oss_experts), stored per layer as two tensors for all
// experts.
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"

#include <fmt/format.h>

namespace kvasir::families {

namespace {

using namespace config_bounds;

void read_gpt_oss(const ConfigKeys& k, ModelConfig& c) {
    // GptOssConfig.head_dim defaults to 64 when absent; an explicit null is
    // hidden_size // num_attention_heads.
    if (const nlohmann::json* v = k.find("head_dim"); v != nullptr && v->is_null()) {
        KVASIR_CHECK(c.hidden_size % c.num_heads == 0, ErrorCode::bad_input,
                     "{}: head_dim is not given and hidden_size ({}) is not divisible by num_attention_heads ({})",
                     c.source, c.hidden_size, c.num_heads);
        c.head_dim = c.hidden_size / c.num_heads;
    }
    if (!k.find("rope_parameters", true) && !k.find("rope_scaling", true)) {
        // GptOssConfig.__post_init__'s rope when none is given.
        c.rope_type = "yarn";
        c.rope_scaling.factor = 32.0;
        c.rope_scaling.beta_fast = 32.0;
        c.rope_scaling.beta_slow = 1.0;
        c.rope_scaling.truncate = false;
        c.rope_scaling.original_max_position_embeddings = 4096.0;
    }
    RouterConfig& r = c.router;
    // GptOssAttention (transformers 5.24): q/k/v/o bias = attention_bias (default true), a learned sink
    // per head, sliding_window on the layer_types "sliding_attention" layers (default: even layers).
    // GptOssTopKRouter: logits = x·Wᵀ + b, top-k of the logits, softmax over the k — the softmax over
    // all experts renormalised over the chosen k, in exact arithmetic (RouterScoring::softmax with
    // norm_topk_prob). GptOssExperts: gate_up [E, H, 2I] interleaved (gate = columns 0, 2, …; up = 1,
    // 3, …) with bias, the clamped SwiGLU, down [E, I, H] with bias; intermediate_size is the expert width.
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", true);
    c.attention_sinks = true;
    c.clamped_swiglu = true;
    c.swiglu_alpha = k.real("swiglu_alpha", 1.702, -1e6, 1e6);
    c.swiglu_limit = k.real("swiglu_limit", 7.0, 0.0, 1e6);
    c.sliding_window = read_sliding_window(k, 128);
    if (!read_sliding_layer_types(k, c))  // GptOssConfig.__post_init__: layer i slides iff (i + 1) % 2
        for (std::int64_t l = 0; l < c.num_layers; ++l) c.sliding_layers[static_cast<std::size_t>(l)] = (l + 1) % 2 != 0;
    r.num_experts = k.size_aliased("num_local_experts", "num_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    r.norm_topk_prob = true;
    c.moe_intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.intermediate_size = 0;
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);  // GptOssDecoderLayer: every layer
}

// GptOssMLP: router with a bias; the experts as two tensors for all of them
// (MXFP4 blocks + scales in the published checkpoints), each with a bias.
void name_gpt_oss_layer(const ModelConfig& c, std::int64_t layer, LayerTensorNames& n) {
    if (!c.is_moe(layer)) return;
    const std::string m = fmt::format("{}layers.{}.mlp.", c.tensor_prefix, layer);
    n.experts.clear();
    n.fused_gate_up.clear();
    n.fused_down.clear();
    n.router = m + "router.weight";
    n.router_logit_bias = m + "router.bias";
    const std::string x = m + "experts.";
    n.oss_gate_up = x + (c.mxfp4_experts ? "gate_up_proj_blocks" : "gate_up_proj");
    n.oss_down = x + (c.mxfp4_experts ? "down_proj_blocks" : "down_proj");
    if (c.mxfp4_experts) {
        n.oss_gate_up_scales = x + "gate_up_proj_scales";
        n.oss_down_scales = x + "down_proj_scales";
    }
    n.oss_gate_up_bias = x + "gate_up_proj_bias";
    n.oss_down_bias = x + "down_proj_bias";
}

// llama.cpp's openai-moe graph: a sink per head, the router's logits with a bias, top-k, softmax over the
// chosen k (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT), experts with biases and ggml_swiglu_oai with the
// constants it hard-codes (alpha 1.702, limit 7: the GGUF carries neither), every layer MoE.
void read_gpt_oss_gguf(const GgufFile& file, const GgufModelParams& p, const std::string& path, ModelConfig& c) {
    const std::string& a = p.architecture;
    KVASIR_CHECK(!file.has(a + ".rope.freq_base_swa") ||
                     file.get_float(a + ".rope.freq_base_swa") == file.get_float(a + ".rope.freq_base"),
                 ErrorCode::unsupported, "{}: {}.rope.freq_base_swa differs from rope.freq_base (a second rope base "
                 "for the sliding layers is not modelled)", path, a);
    for (std::int64_t l = 0; l < c.num_layers; ++l)
        KVASIR_CHECK(c.moe_layers[static_cast<std::size_t>(l)], ErrorCode::bad_input,
                     "{}: layer {} has no blk.{}.ffn_gate_inp.weight (every gpt-oss layer is MoE)", path, l, l);
    c.attention_sinks = true;
    c.clamped_swiglu = true;
    c.swiglu_alpha = 1.702;
    c.swiglu_limit = 7.0;
    c.intermediate_size = 0;
    c.router.scoring = RouterScoring::softmax;
    c.router.num_experts = p.expert_count;
    c.router.top_k = p.expert_used_count;
    c.router.norm_topk_prob = true;
}

}  // namespace

const Family& gpt_oss() {
    // GptOssConfig (gpt-oss-120b's shape; default_theta 150000); head_dim 64.
    static const Family f{.id = Architecture::gpt_oss, .model_type = "gpt_oss", .class_prefix = "GptOss",
                          .defaults = {.kv_heads = 8, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 150000.0,
                                       .head_dim = 64},
                          .read = read_gpt_oss, .name_layer = name_gpt_oss_layer, .gguf_architecture = "gpt-oss",
                          .gguf_experts = GgufExperts::with, .read_gguf = read_gpt_oss_gguf, .gguf_swa_period = 2,
                          .experts = ExpertStorage::gate_up_interleaved, .sliding_checked = true};
    return f;
}

}  // namespace kvasir::families
