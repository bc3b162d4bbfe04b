#include "kvasir/model/config.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/model/family.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace kvasir {

using namespace config_bounds;

bool ModelConfig::is_linear_attention(std::int64_t layer) const {
    KVASIR_CHECK(layer >= 0 && layer < num_layers, ErrorCode::bad_input, "{}: layer {} does not exist (the model has {} layers)",
                 source, layer, num_layers);
    return static_cast<std::size_t>(layer) < linear_attention_layers.size() &&
           linear_attention_layers[static_cast<std::size_t>(layer)];
}

std::int64_t ModelConfig::attention_window(std::int64_t layer) const {
    KVASIR_CHECK(layer >= 0 && layer < num_layers, ErrorCode::bad_input, "{}: layer {} does not exist (the model has {} layers)",
                 source, layer, num_layers);
    if (sliding_window == 0) return 0;
    if (sliding_layers.empty()) return sliding_window;
    return static_cast<std::size_t>(layer) < sliding_layers.size() && sliding_layers[static_cast<std::size_t>(layer)]
               ? sliding_window
               : 0;
}

bool ModelConfig::is_moe(std::int64_t layer) const {
    KVASIR_CHECK(layer >= 0 && layer < static_cast<std::int64_t>(moe_layers.size()), ErrorCode::bad_input,
                 "{}: layer {} does not exist (the model has {} layers)", source, layer, moe_layers.size());
    return moe_layers[static_cast<std::size_t>(layer)];
}

std::string ModelConfig::layer_kinds() const {
    std::vector<std::string> parts;
    const std::int64_t n = static_cast<std::int64_t>(moe_layers.size());
    for (std::int64_t l = 0; l < n;) {
        std::int64_t e = l;
        while (e + 1 < n && is_moe(e + 1) == is_moe(l)) ++e;
        parts.push_back(fmt::format("{} {}", is_moe(l) ? "MoE" : "dense", e == l ? fmt::format("{}", l) : fmt::format("{}-{}", l, e)));
        l = e + 1;
    }
    return fmt::format("{}", fmt::join(parts, ", "));
}

std::int64_t ModelConfig::num_moe_layers() const {
    return static_cast<std::int64_t>(std::count(moe_layers.begin(), moe_layers.end(), true));
}

namespace {

// v in [lo, hi], else Error(bad_input) naming the key.
void check_dim(const ModelConfig& c, std::int64_t v, std::string_view key, std::int64_t lo, std::int64_t hi) {
    KVASIR_CHECK(v >= lo && v <= hi, ErrorCode::bad_input, "{}: {} = {} is out of range [{}, {}]", c.source, key, v, lo,
                 hi);
}

// Sizes, heads, MLA, epsilon and rope.
void validate_attention(const ModelConfig& c) {
    const std::string& s = c.source;
    check_dim(c, c.hidden_size, "hidden_size", 1, kMaxDim);
    check_dim(c, c.num_layers, "num_hidden_layers", 1, kMaxLayers);
    check_dim(c, c.num_heads, "num_attention_heads", 1, kMaxDim);
    check_dim(c, c.num_kv_heads, "num_key_value_heads", 1, kMaxDim);
    check_dim(c, c.head_dim, "head_dim", 1, kMaxDim);
    check_dim(c, c.vocab_size, "vocab_size", 1, kMaxDim);
    check_dim(c, c.max_position_embeddings, "max_position_embeddings", 1, kMaxPositions);
    check_dim(c, c.sliding_window, "sliding_window", 0, kMaxPositions);
    KVASIR_CHECK(c.num_heads % c.num_kv_heads == 0, ErrorCode::bad_input,
                 "{}: num_key_value_heads ({}) must divide num_attention_heads ({})", s, c.num_kv_heads, c.num_heads);
    KVASIR_CHECK(c.head_dim % 2 == 0, ErrorCode::bad_input, "{}: head_dim ({}) must be even for rotary embeddings", s,
                 c.head_dim);
    if (c.has_mla()) {
        const auto& m = c.mla;
        check_dim(c, m.kv_lora_rank, "kv_lora_rank", 1, kMaxDim);
        check_dim(c, m.q_lora_rank, "q_lora_rank", 0, kMaxDim);
        check_dim(c, m.v_head_dim, "v_head_dim", 1, kMaxDim);
        KVASIR_CHECK(m.qk_rope_head_dim >= 2 && m.qk_rope_head_dim % 2 == 0 &&
                         c.head_dim == m.qk_nope_head_dim + m.qk_rope_head_dim && c.num_kv_heads == c.num_heads,
                     ErrorCode::bad_input,
                     "{}: MLA needs an even qk_rope_head_dim ({}), head_dim = qk_nope_head_dim + qk_rope_head_dim ({} + "
                     "{}) and one kv head per head", s, m.qk_rope_head_dim, m.qk_nope_head_dim, m.qk_rope_head_dim);
        KVASIR_CHECK(c.partial_rotary_factor == 1.0, ErrorCode::bad_input,
                     "{}: partial_rotary_factor with MLA (its rope part is qk_rope_head_dim)", s);
    }
    KVASIR_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0.0 && c.rms_norm_eps <= 0.5,
                 ErrorCode::bad_input, "{}: rms_norm_eps = {} is out of range (0, 0.5]", s, c.rms_norm_eps);
    KVASIR_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0.0 && c.rope_theta <= kMaxRopeTheta,
                 ErrorCode::bad_input, "{}: rope_theta = {} is out of range (0, {}]", s, c.rope_theta, kMaxRopeTheta);
}

// The per-layer flags and the MLP, expert and DeltaNet widths.
void validate_layers(const ModelConfig& c) {
    const std::string& s = c.source;
    KVASIR_CHECK(static_cast<std::int64_t>(c.moe_layers.size()) == c.num_layers, ErrorCode::bad_input,
                 "{}: {} MoE-layer flags for num_hidden_layers = {}", s, c.moe_layers.size(), c.num_layers);
    const bool any_moe = c.num_moe_layers() > 0;
    const bool any_dense = c.num_moe_layers() < c.num_layers;
    check_dim(c, c.intermediate_size, "intermediate_size", any_dense ? 1 : 0, kMaxDim);
    check_dim(c, c.moe_intermediate_size, "moe_intermediate_size", any_moe ? 1 : 0, kMaxDim);
    check_dim(c, c.shared_expert_intermediate_size, "shared_expert_intermediate_size", 0, kMaxDim);
    KVASIR_CHECK(!c.shared_expert_gate || c.shared_expert_intermediate_size > 0, ErrorCode::bad_input,
                 "{}: a shared_expert_gate needs shared_expert_intermediate_size > 0", s);
    for (std::int64_t l : c.mlp_only_layers) check_dim(c, l, "mlp_only_layers", 0, c.num_layers - 1);
    KVASIR_CHECK(c.linear_attention_layers.empty() ||
                     static_cast<std::int64_t>(c.linear_attention_layers.size()) == c.num_layers,
                 ErrorCode::bad_input, "{}: {} layer types for num_hidden_layers = {}", s, c.linear_attention_layers.size(),
                 c.num_layers);
    if (!c.linear_attention_layers.empty()) {
        check_dim(c, c.linear.conv_kernel, "linear_conv_kernel_dim", 1, 64);
        check_dim(c, c.linear.key_heads, "linear_num_key_heads", 1, kMaxDim);
        check_dim(c, c.linear.value_heads, "linear_num_value_heads", 1, kMaxDim);
        check_dim(c, c.linear.key_head_dim, "linear_key_head_dim", 1, kMaxDim);
        check_dim(c, c.linear.value_head_dim, "linear_value_head_dim", 1, kMaxDim);
    }
    const double rotary = static_cast<double>(c.head_dim) * c.partial_rotary_factor;
    KVASIR_CHECK(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0 && rotary == std::floor(rotary) &&
                     static_cast<std::int64_t>(rotary) % 2 == 0,
                 ErrorCode::bad_input, "{}: partial_rotary_factor {} × head_dim {} is not an even number of dimensions", s,
                 c.partial_rotary_factor, c.head_dim);

    KVASIR_CHECK(c.sliding_layers.empty() || static_cast<std::int64_t>(c.sliding_layers.size()) == c.num_layers,
                 ErrorCode::bad_input, "{}: {} sliding-layer flags for num_hidden_layers = {}", s, c.sliding_layers.size(),
                 c.num_layers);
}

// The router of a model with MoE layers.
void validate_router(const ModelConfig& c) {
    if (c.num_moe_layers() == 0) return;  // a dense model (or every layer dense): no router is used
    const std::string& s = c.source;
    const RouterConfig& r = c.router;
    const std::string_view experts_key = family_of(c.architecture).experts_key;
    check_dim(c, r.num_experts, experts_key, 1, kMaxExperts);
    KVASIR_CHECK(r.top_k >= 1 && r.top_k <= r.num_experts, ErrorCode::bad_input,
                 "{}: num_experts_per_tok ({}) must be in [1, {} = {}]", s, r.top_k, experts_key, r.num_experts);
    KVASIR_CHECK(std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0.0, ErrorCode::bad_input,
                 "{}: routed_scaling_factor = {} must be a positive number", s, r.routed_scaling_factor);
    KVASIR_CHECK(r.n_group >= 1 && r.num_experts % r.n_group == 0, ErrorCode::bad_input,
                 "{}: n_group ({}) must divide {} ({})", s, r.n_group, experts_key, r.num_experts);
    KVASIR_CHECK(r.topk_group >= 1 && r.topk_group <= r.n_group, ErrorCode::bad_input,
                 "{}: topk_group ({}) must be in [1, n_group = {}]", s, r.topk_group, r.n_group);
    if (r.scoring == RouterScoring::sigmoid) {
        const std::int64_t per_group = r.num_experts / r.n_group;
        // DeepseekV3TopkRouter scores a group by the sum of its top-2 experts.
        KVASIR_CHECK(per_group >= 2, ErrorCode::bad_input,
                     "{}: n_group ({}) leaves fewer than 2 experts per group ({} = {})", s, r.n_group, experts_key,
                     r.num_experts);
        KVASIR_CHECK(r.top_k <= r.topk_group * per_group, ErrorCode::bad_input,
                     "{}: num_experts_per_tok ({}) exceeds the experts of topk_group ({}) groups of {}", s, r.top_k,
                     r.topk_group, per_group);
    } else {
        KVASIR_CHECK(r.n_group == 1 && r.topk_group == 1 && !r.score_correction_bias &&
                         r.routed_scaling_factor == 1.0,
                     ErrorCode::bad_input, "{}: grouped top-k, score-correction bias and routed_scaling_factor are "
                     "only modelled with sigmoid scoring", s);
    }
}

}  // namespace

void validate_model_config(const ModelConfig& c) {
    validate_attention(c);
    validate_layers(c);
    validate_router(c);
}

// ---------------------------------------------------------------------------
// Tensor names
// ---------------------------------------------------------------------------

ModelTensorNames model_tensor_names(const ModelConfig& c) {
    ModelTensorNames n;
    n.embed = c.tensor_prefix + "embed_tokens.weight";
    n.final_norm = c.tensor_prefix + "norm.weight";
    n.lm_head = c.tie_word_embeddings ? n.embed : "lm_head.weight";
    return n;
}

namespace {

// The attention (or DeltaNet mixer) of layer `layer`, prefix p = "…layers.N.".
void name_attention(const ModelConfig& c, std::int64_t layer, const std::string& p, LayerTensorNames& n) {
    if (c.is_linear_attention(layer)) {
        // Gated DeltaNet (Qwen3_5MoeGatedDeltaNet / Qwen3NextGatedDeltaNet).
        const std::string a = p + "linear_attn.";
        n.in_proj_qkv = a + "in_proj_qkv.weight";
        n.in_proj_z = a + "in_proj_z.weight";
        n.in_proj_b = a + "in_proj_b.weight";
        n.in_proj_a = a + "in_proj_a.weight";
        n.conv1d = a + "conv1d.weight";
        n.dt_bias = a + "dt_bias";
        n.a_log = a + "A_log";
        n.linear_norm = a + "norm.weight";
        n.out_proj = a + "out_proj.weight";
    } else if (c.has_mla()) {
        const std::string a = p + "self_attn.";
        if (c.mla.q_lora_rank > 0) {
            n.q_a_proj = a + "q_a_proj.weight";
            n.q_a_norm = a + "q_a_layernorm.weight";
            n.q_b_proj = a + "q_b_proj.weight";
        } else {
            n.q_proj = a + "q_proj.weight";
        }
        n.kv_a_proj = a + "kv_a_proj_with_mqa.weight";
        n.kv_a_norm = a + "kv_a_layernorm.weight";
        n.kv_b_proj = a + "kv_b_proj.weight";
        n.o_proj = a + "o_proj.weight";
        if (c.attention_bias) {  // on the two down-projections and o_proj (DeepseekV3Attention)
            if (c.mla.q_lora_rank > 0) n.q_a_bias = a + "q_a_proj.bias";
            n.kv_a_bias = a + "kv_a_proj_with_mqa.bias";
            n.o_bias = a + "o_proj.bias";
        }
    } else {
        const std::string a = p + "self_attn.";
        n.q_proj = a + "q_proj.weight";
        n.k_proj = a + "k_proj.weight";
        n.v_proj = a + "v_proj.weight";
        n.o_proj = a + "o_proj.weight";
        if (c.attention_bias) {
            n.q_bias = a + "q_proj.bias";
            n.k_bias = a + "k_proj.bias";
            n.v_bias = a + "v_proj.bias";
        }
        if (c.attention_out_bias) n.o_bias = a + "o_proj.bias";
        if (c.qk_norm) {
            n.q_norm = a + "q_norm.weight";
            n.k_norm = a + "k_norm.weight";
        }
        if (c.attention_sinks) n.sinks = a + "sinks";
    }
}

// The MoE block: router, experts (one tensor per expert or fused), shared experts.
void name_moe_block(const ModelConfig& c, const std::string& p, LayerTensorNames& n) {
    const auto experts = static_cast<std::size_t>(c.num_experts());
    n.experts.resize(experts);
    const std::string m = p + "mlp.";
    n.router = m + "gate.weight";
    if (c.fused_experts) {
        n.experts.clear();
        n.fused_gate_up = m + "experts.gate_up_proj";
        n.fused_down = m + "experts.down_proj";
    }
    for (std::size_t e = 0; e < n.experts.size(); ++e) {
        n.experts[e].gate = fmt::format("{}experts.{}.gate_proj.weight", m, e);
        n.experts[e].up = fmt::format("{}experts.{}.up_proj.weight", m, e);
        n.experts[e].down = fmt::format("{}experts.{}.down_proj.weight", m, e);
    }
    if (c.router.score_correction_bias) {  // deepseek_v3, glm4_moe
        n.router_bias = m + "gate.e_score_correction_bias";
        if (c.has_shared_expert()) {
            n.shared_gate = m + "shared_experts.gate_proj.weight";
            n.shared_up = m + "shared_experts.up_proj.weight";
            n.shared_down = m + "shared_experts.down_proj.weight";
        }
    } else if (c.has_shared_expert()) {
        n.shared_gate = m + "shared_expert.gate_proj.weight";
        n.shared_up = m + "shared_expert.up_proj.weight";
        n.shared_down = m + "shared_expert.down_proj.weight";
        if (c.shared_expert_gate) n.shared_expert_gate = m + "shared_expert_gate.weight";
    }
}

}  // namespace

LayerTensorNames layer_tensor_names(const ModelConfig& c, std::int64_t layer) {
    const bool moe = c.is_moe(layer);  // also checks the range
    const std::string p = fmt::format("{}layers.{}.", c.tensor_prefix, layer);
    LayerTensorNames n;
    n.input_norm = p + "input_layernorm.weight";
    n.post_attention_norm = p + "post_attention_layernorm.weight";
    name_attention(c, layer, p, n);
    if (moe) {
        name_moe_block(c, p, n);
    } else {
        n.mlp_gate = p + "mlp.gate_proj.weight";
        n.mlp_up = p + "mlp.up_proj.weight";
        n.mlp_down = p + "mlp.down_proj.weight";
    }
    if (const auto rename = family_of(c.architecture).name_layer) rename(c, layer, n);
    return n;
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c) {
    const ModelTensorNames n = model_tensor_names(c);
    std::vector<TensorSpec> out{{n.embed, {c.vocab_size, c.hidden_size}}, {n.final_norm, {c.hidden_size}}};
    if (!c.tie_word_embeddings) out.push_back({n.lm_head, {c.vocab_size, c.hidden_size}});
    return out;
}

std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& c, std::int64_t layer) {
    const LayerTensorNames n = layer_tensor_names(c, layer);
    const std::int64_t H = c.hidden_size;
    std::vector<TensorSpec> out;
    auto add = [&](const std::string& name, Shape shape) {
        if (!name.empty()) out.push_back({name, std::move(shape)});
    };
    add(n.input_norm, {H});
    add(n.post_attention_norm, {H});
    add(n.q_proj, {c.attention_output_gate ? 2 * c.q_dim() : c.q_dim(), H});
    add(n.k_proj, {c.kv_dim(), H});
    add(n.v_proj, {c.kv_dim(), H});
    add(n.o_proj, {H, c.num_heads * c.value_head_dim()});
    const auto& mla = c.mla;
    const std::int64_t kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim;
    add(n.q_a_proj, {mla.q_lora_rank, H});
    add(n.q_a_norm, {mla.q_lora_rank});
    add(n.q_b_proj, {c.q_dim(), mla.q_lora_rank});
    add(n.kv_a_proj, {kv_a, H});
    add(n.kv_a_norm, {mla.kv_lora_rank});
    add(n.kv_b_proj, {c.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank});
    add(n.q_a_bias, {mla.q_lora_rank});
    add(n.kv_a_bias, {kv_a});
    add(n.q_bias, {c.q_dim()});
    add(n.k_bias, {c.kv_dim()});
    add(n.v_bias, {c.kv_dim()});
    add(n.o_bias, {H});
    add(n.q_norm, {c.q_norm_dim()});
    add(n.k_norm, {c.k_norm_dim()});
    add(n.mlp_gate, {c.intermediate_size, H});
    add(n.mlp_up, {c.intermediate_size, H});
    add(n.mlp_down, {H, c.intermediate_size});
    add(n.router, {c.num_experts(), H});
    add(n.router_bias, {c.num_experts()});
    for (const ExpertTensorNames& e : n.experts) {
        add(e.gate, {c.moe_intermediate_size, H});
        add(e.up, {c.moe_intermediate_size, H});
        add(e.down, {H, c.moe_intermediate_size});
    }
    add(n.shared_gate, {c.shared_expert_intermediate_size, H});
    add(n.shared_up, {c.shared_expert_intermediate_size, H});
    add(n.shared_down, {H, c.shared_expert_intermediate_size});
    add(n.shared_expert_gate, {1, H});
    const std::int64_t E = c.num_experts(), I = c.moe_intermediate_size;
    add(n.sinks, {c.num_heads});
    add(n.router_logit_bias, {E});
    if (c.mxfp4_experts) {  // U8: blocks of 32 values, 16 bytes each, one e8m0 scale per block
        add(n.oss_gate_up, {E, 2 * I, H / 32, 16});
        add(n.oss_gate_up_scales, {E, 2 * I, H / 32});
        add(n.oss_down, {E, H, I / 32, 16});
        add(n.oss_down_scales, {E, H, I / 32});
    } else {
        add(n.oss_gate_up, {E, H, 2 * I});
        add(n.oss_down, {E, I, H});
    }
    add(n.oss_gate_up_bias, {E, 2 * I});
    add(n.oss_down_bias, {E, H});
    add(n.fused_gate_up, {c.num_experts(), 2 * c.moe_intermediate_size, H});
    add(n.fused_down, {c.num_experts(), H, c.moe_intermediate_size});
    const auto& la = c.linear;
    add(n.in_proj_qkv, {la.conv_dim(), H});
    add(n.in_proj_z, {la.value_dim(), H});
    add(n.in_proj_b, {la.value_heads, H});
    add(n.in_proj_a, {la.value_heads, H});
    add(n.in_proj_qkvz, {2 * la.key_dim() + 2 * la.value_dim(), H});
    add(n.in_proj_ba, {2 * la.value_heads, H});
    add(n.conv1d, {la.conv_dim(), 1, la.conv_kernel});
    add(n.dt_bias, {la.value_heads});
    add(n.a_log, {la.value_heads});
    add(n.linear_norm, {la.value_head_dim});
    add(n.out_proj, {H, la.value_dim()});
    return out;
}

}  // namespace kvasir
