#include "kvasir/model/config_keys.hpp"

#include "kvasir/model/family.hpp"

#include <algorithm>

namespace kvasir {

using json = nlohmann::json;
using namespace config_bounds;

// A JSON value for a message: compact, escaped (so one line), truncated.
std::string show_json(const json& v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (s.size() > 48) s = s.substr(0, 45) + "...";
    return s;
}

// The sigmoid router family (DeepseekV3TopkRouter; Glm4MoeTopkRouter is the same code) with its MoE
// block and layer rule, transformers 5.24: s = sigmoid(logits), selection on s + e_score_correction_bias
// within the topk_group best of n_group groups, weights s renormalised (norm_topk_prob) ×
// routed_scaling_factor; shared_experts = MLP(moe_intermediate_size × n_shared_experts), no gate;
// MoE iff layer >= first_k_dense_replace (DeepseekV3DecoderLayer / Glm4MoeDecoderLayer.__init__).
void read_sigmoid_router(const ConfigKeys& k, ModelConfig& c, const SigmoidRouterDefaults& d) {
    RouterConfig& r = c.router;
    const char* arch = architecture_name(c.architecture);
    if (const json* v = k.find("scoring_func", true)) {  // hub configs carry it; transformers hard-codes sigmoid
        KVASIR_CHECK(v->is_string() && v->get<std::string>() == "sigmoid", ErrorCode::bad_input,
                     "{}: scoring_func {} is not supported for {} (sigmoid only)", k.source(), show_json(*v), arch);
    }
    if (const json* v = k.find("topk_method", true)) {  // DeepSeek-V3 hub configs: "noaux_tc", the rule above
        KVASIR_CHECK(v->is_string() && v->get<std::string>() == "noaux_tc", ErrorCode::unsupported,
                     "{}: topk_method {} is not implemented for {} (transformers runs noaux_tc)", k.source(), show_json(*v),
                     arch);
    }
    r.scoring = RouterScoring::sigmoid;
    r.score_correction_bias = true;  // the router always has e_score_correction_bias
    // attribute_map {"num_local_experts": "n_routed_experts"}.
    r.num_experts = k.size_aliased("n_routed_experts", "num_local_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    r.norm_topk_prob = k.boolean("norm_topk_prob", true);
    r.n_group = k.integer("n_group", d.n_group, 1, kMaxExperts);
    r.topk_group = k.integer("topk_group", d.topk_group, 1, kMaxExperts);
    r.routed_scaling_factor = k.real("routed_scaling_factor", d.routed_scaling_factor, 0.0, 1e6);
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.moe_intermediate_size = k.size("moe_intermediate_size", 1, kMaxDim);
    c.shared_expert_intermediate_size = k.integer("n_shared_experts", 1, 0, 1024) * c.moe_intermediate_size;
    c.first_k_dense_replace = k.integer("first_k_dense_replace", d.first_k_dense_replace, 0, c.num_layers);
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), false);
    for (std::int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) c.moe_layers[static_cast<std::size_t>(l)] = true;
}

static void read_mlp_only_layers(const ConfigKeys& k, ModelConfig& c) {
    const json* v = k.find("mlp_only_layers", true);  // None → [] (Qwen*MoeConfig.__post_init__)
    if (!v) return;
    if (!v->is_array()) fail(ErrorCode::bad_input, "{}: mlp_only_layers must be a list of layer indices, got {}",
                             k.source(), show_json(*v));
    for (const json& e : *v) c.mlp_only_layers.push_back(k.integer_value(e, "mlp_only_layers", 0, c.num_layers - 1));
}

// Which layers are MoE in the Qwen MoE families (decoder_sparse_step,
// mlp_only_layers). Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer /
// Qwen3NextDecoderLayer.__init__ (transformers 5.24):
//   if (layer_idx not in config.mlp_only_layers) and (
//       config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0):
//       self.mlp = <SparseMoeBlock>  else: self.mlp = <MLP>(intermediate_size=config.intermediate_size)
// Needs router.num_experts and num_layers read first.
void read_qwen_sparse_layers(const ConfigKeys& k, ModelConfig& c) {
    c.decoder_sparse_step = k.integer("decoder_sparse_step", 1, 1, kMaxLayers);
    read_mlp_only_layers(k, c);
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), false);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
        const bool listed = std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), l) != c.mlp_only_layers.end();
        c.moe_layers[static_cast<std::size_t>(l)] = !listed && c.router.num_experts > 0 && (l + 1) % c.decoder_sparse_step == 0;
    }
}

// sliding_window as the config classes hold it: absent → the class default,
// null → no sliding window (0), else the number of keys.
std::int64_t read_sliding_window(const ConfigKeys& k, std::int64_t class_default) {
    const json* v = k.find("sliding_window");
    if (v == nullptr) return class_default;
    return v->is_null() ? 0 : k.integer_value(*v, "sliding_window", 0, kMaxPositions);
}

// Sliding-window attention as the Qwen configs resolve it: only when
// use_sliding_window is true (the config classes set sliding_window = None
// otherwise), and then on the layers layer_types names "sliding_attention"
// (Qwen2Config / Qwen3Config default: the layers i >= max_window_layers).
// c.sliding_layers from layer_types ("sliding_attention" / "full_attention",
// one per layer) when the config has them; false (all full) when it has none.
bool read_sliding_layer_types(const ConfigKeys& k, ModelConfig& c) {
    c.sliding_layers.assign(static_cast<std::size_t>(c.num_layers), false);
    const json* lt = k.find("layer_types", true);
    if (!lt) return false;
    KVASIR_CHECK(lt->is_array() && static_cast<std::int64_t>(lt->size()) == c.num_layers, ErrorCode::bad_input,
                 "{}: layer_types must list one type per layer ({}), got {}", k.source(), c.num_layers, show_json(*lt));
    for (std::size_t l = 0; l < lt->size(); ++l) {
        const json& t = (*lt)[l];
        KVASIR_CHECK(t.is_string() && (t == "sliding_attention" || t == "full_attention"), ErrorCode::bad_input,
                     "{}: layer_types[{}] = {} (expected \"sliding_attention\" or \"full_attention\")", k.source(), l,
                     show_json(t));
        c.sliding_layers[l] = t == "sliding_attention";
    }
    return true;
}

void read_qwen_sliding_window(const ConfigKeys& k, ModelConfig& c) {
    const bool use = k.boolean("use_sliding_window", false);
    c.sliding_window = use ? read_sliding_window(k, 4096) : 0;
    if (c.sliding_window == 0) return;
    if (!read_sliding_layer_types(k, c)) {
        const std::int64_t from = k.integer("max_window_layers", 28, 0, kMaxLayers);
        for (std::int64_t l = from; l < c.num_layers; ++l) c.sliding_layers[static_cast<std::size_t>(l)] = true;
    }
}

// What qwen3_5_moe and qwen3_next share (transformers 5.24): gated full
// attention (q_proj yields query and a per-head output gate; q/k RMSNorm over
// head_dim; bias on all four projections iff attention_bias), zero-centred
// RMSNorm weights (scale 1 + w), partial rotary (partial_rotary_factor,
// default 0.25), Gated DeltaNet linear attention on the layers layer_types
// names "linear_attention" (default: all but every full_attention_interval-th,
// 4), and the MoE block's shared expert with its sigmoid gate.
void read_hybrid(const ConfigKeys& k, ModelConfig& c, bool moe) {
    c.qk_norm = true;
    c.attention_output_gate = true;
    c.norm_weight_offset = true;
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    c.partial_rotary_factor = k.real("partial_rotary_factor", 0.25, 0.0, 1.0);
    if (const json* rp = k.find("rope_parameters", true); rp && rp->is_object() && rp->contains("partial_rotary_factor"))
        c.partial_rotary_factor = k.real_value((*rp)["partial_rotary_factor"], "rope_parameters.partial_rotary_factor", 0.0, 1.0);
    KVASIR_CHECK(c.partial_rotary_factor > 0.0, ErrorCode::bad_input, "{}: partial_rotary_factor must be > 0", k.source());
    auto& la = c.linear;
    la.conv_kernel = k.integer("linear_conv_kernel_dim", 4, 1, 64);
    la.key_head_dim = k.size("linear_key_head_dim", 1, kMaxDim);
    la.value_head_dim = k.size("linear_value_head_dim", 1, kMaxDim);
    la.key_heads = k.size("linear_num_key_heads", 1, kMaxDim);
    la.value_heads = k.size("linear_num_value_heads", 1, kMaxDim);
    KVASIR_CHECK(la.value_heads % la.key_heads == 0, ErrorCode::bad_input,
                 "{}: linear_num_key_heads ({}) must divide linear_num_value_heads ({})", k.source(), la.key_heads,
                 la.value_heads);
    c.linear_attention_layers.assign(static_cast<std::size_t>(c.num_layers), false);
    if (const json* lt = k.find("layer_types", true)) {
        KVASIR_CHECK(lt->is_array() && static_cast<std::int64_t>(lt->size()) == c.num_layers, ErrorCode::bad_input,
                     "{}: layer_types must list one type per layer ({}), got {}", k.source(), c.num_layers, show_json(*lt));
        for (std::size_t l = 0; l < lt->size(); ++l) {
            const json& t = (*lt)[l];
            KVASIR_CHECK(t.is_string() && (t == "linear_attention" || t == "full_attention"), ErrorCode::bad_input,
                         "{}: layer_types[{}] = {} (expected \"linear_attention\" or \"full_attention\")", k.source(),
                         l, show_json(t));
            c.linear_attention_layers[l] = t == "linear_attention";
        }
    } else {
        const std::int64_t interval = k.integer("full_attention_interval", 4, 1, kMaxLayers);
        for (std::int64_t l = 0; l < c.num_layers; ++l) c.linear_attention_layers[static_cast<std::size_t>(l)] = (l + 1) % interval != 0;
    }
    if (!moe) return;
    RouterConfig& r = c.router;
    r.num_experts = k.size("num_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    c.moe_intermediate_size = k.size("moe_intermediate_size", 1, kMaxDim);
    c.shared_expert_intermediate_size = k.size("shared_expert_intermediate_size", 1, kMaxDim);
    c.shared_expert_gate = true;
}

void read_qwen_moe_block(const ConfigKeys& k, ModelConfig& c) {
    read_qwen_sliding_window(k, c);
    c.router.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    c.router.norm_topk_prob = k.boolean("norm_topk_prob", false);
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.moe_intermediate_size = k.size("moe_intermediate_size", 1, kMaxDim);
    read_qwen_sparse_layers(k, c);
}

void read_dense_mlp(const ConfigKeys& k, ModelConfig& c) {
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), false);
}

}  // namespace kvasir
