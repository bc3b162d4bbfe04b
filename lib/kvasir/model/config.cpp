#include "kvasir/model/config.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace kvasir {

namespace {

using json = nlohmann::json;

constexpr std::int64_t kMaxDim = std::int64_t{1} << 20;      // any width: hidden, heads, head_dim, vocab, ffn
constexpr std::int64_t kMaxLayers = std::int64_t{1} << 16;
constexpr std::int64_t kMaxExperts = std::int64_t{1} << 16;
constexpr std::int64_t kMaxPositions = std::int64_t{1} << 40;
constexpr double kMaxRopeTheta = 1e12;
constexpr std::uintmax_t kMaxConfigBytes = std::uintmax_t{64} << 20;

struct ArchInfo {
    Architecture arch;
    const char* model_type;
    std::string_view class_prefix;  // of the `architectures` class names, e.g. Qwen3MoeForCausalLM
};
constexpr ArchInfo kArchs[] = {
    {Architecture::qwen2_moe, "qwen2_moe", "Qwen2Moe"},
    {Architecture::qwen3_moe, "qwen3_moe", "Qwen3Moe"},
    {Architecture::mixtral, "mixtral", "Mixtral"},
    {Architecture::deepseek_v3, "deepseek_v3", "DeepseekV3"},
    {Architecture::qwen3_5_moe, "qwen3_5_moe", "Qwen3_5Moe"},
    {Architecture::qwen3_next, "qwen3_next", "Qwen3Next"},
    {Architecture::llama, "llama", "Llama"},
    {Architecture::mistral, "mistral", "Mistral"},
    {Architecture::qwen2, "qwen2", "Qwen2"},
    {Architecture::qwen3, "qwen3", "Qwen3"},
    {Architecture::qwen3_5, "qwen3_5", "Qwen3_5"},
    {Architecture::olmoe, "olmoe", "Olmoe"},
    {Architecture::gpt_oss, "gpt_oss", "GptOss"},
    {Architecture::glm4_moe, "glm4_moe", "Glm4Moe"},
};

// Defaults of the transformers 5.24 config classes (Qwen2MoeConfig,
// Qwen3MoeConfig, MixtralConfig, DeepseekV3Config): a key absent from
// config.json means this value to transformers. Sizes have none here: they
// are required (Keys::size).
struct Defaults {
    std::int64_t kv_heads, max_positions;  // kv_heads 0: None, i.e. num_attention_heads
    double rms_eps, rope_theta;
    bool norm_topk_prob;
};
Defaults defaults_of(Architecture a) {
    switch (a) {
        case Architecture::qwen2_moe:
            return {16, 32768, 1e-6, 10000.0, false};
        case Architecture::qwen3_moe:
            return {4, 32768, 1e-6, 10000.0, false};
        case Architecture::mixtral:  // MixtralConfig.default_theta = 1e6
            return {8, 4096 * 32, 1e-5, 1000000.0, true};
        case Architecture::deepseek_v3:
            return {128, 4096, 1e-6, 10000.0, true};
        case Architecture::qwen3_5_moe:  // Qwen3_5MoeTextConfig (the released 35B-A3B's shape)
            return {2, 32768, 1e-6, 10000.0, true};
        case Architecture::qwen3_next:  // Qwen3NextConfig
            return {2, 32768, 1e-6, 10000.0, true};
        case Architecture::gpt_oss:  // GptOssConfig (gpt-oss-120b's shape; default_theta 150000)
            return {8, 131072, 1e-5, 150000.0, true};
        case Architecture::olmoe:  // OlmoeConfig (OLMoE-1B-7B: 64 experts of 1024, top-8; intermediate = expert width)
            return {16, 4096, 1e-5, 10000.0, false};
        // The dense families: no experts.
        case Architecture::llama:  // LlamaConfig (num_key_value_heads None → num_attention_heads: 0 here)
            return {0, 2048, 1e-6, 10000.0, false};
        case Architecture::mistral:  // MistralConfig
            return {8, 4096 * 32, 1e-6, 10000.0, false};
        case Architecture::qwen2:  // Qwen2Config
            return {32, 32768, 1e-6, 10000.0, false};
        case Architecture::qwen3:  // Qwen3Config
            return {32, 32768, 1e-6, 10000.0, false};
        case Architecture::qwen3_5:  // Qwen3_5TextConfig
            return {4, 32768, 1e-6, 10000.0, false};
        case Architecture::glm4_moe:  // Glm4MoeConfig (GLM-4.5's shape)
            return {8, 131072, 1e-5, 10000.0, true};
    }
    return {};
}

// A JSON value for a message: compact, escaped (so one line), truncated.
std::string show(const json& v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (s.size() > 48) s = s.substr(0, 45) + "...";
    return s;
}

std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    std::replace(s.begin(), s.end(), '\r', ' ');
    return s;
}

// Typed access to the keys of a config.json object; every failure names the
// file and the key.
class Keys {
public:
    Keys(const json& obj, const std::string& source) : obj_(obj), src_(source) {}

    const std::string& source() const { return src_; }

    // The value of `key`, or nullptr when absent. With null_is_absent, a JSON
    // null counts as absent (for keys whose None means "the default" in transformers).
    const json* find(std::string_view key, bool null_is_absent = false) const {
        auto it = obj_.find(key);
        if (it == obj_.end()) return nullptr;
        if (null_is_absent && it->is_null()) return nullptr;
        return &*it;
    }

    std::int64_t integer(std::string_view key, std::int64_t def, std::int64_t lo, std::int64_t hi,
                         bool null_is_absent = false) const {
        const json* v = find(key, null_is_absent);
        return v ? integer_value(*v, key, lo, hi) : def;
    }

    // A size of the model (hidden_size, layers, heads, vocab, FFN and expert
    // widths, expert counts, linear-attention and MLA dims): never guessed.
    // transformers' config classes give each a default (hidden_size 2048,
    // ...) and save_pretrained always writes them, so a config.json without
    // one is a hand-edited or truncated file: refused naming the key, not
    // computed with another model's size.
    std::int64_t size(std::string_view key, std::int64_t lo, std::int64_t hi) const {
        const json* v = find(key);
        if (!v) fail(ErrorCode::bad_input, "{}: required key \"{}\" is missing (a model's sizes are never guessed)", src_, key);
        return integer_value(*v, key, lo, hi);
    }

    std::int64_t integer_value(const json& v, std::string_view key, std::int64_t lo, std::int64_t hi) const {
        if (!v.is_number_integer())
            fail(ErrorCode::bad_input, "{}: {} must be an integer, got {}", src_, key, show(v));
        std::int64_t x = 0;
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(hi))
                fail(ErrorCode::bad_input, "{}: {} = {} is out of range [{}, {}]", src_, key, u, lo, hi);
            x = static_cast<std::int64_t>(u);
        } else {
            x = v.get<std::int64_t>();
        }
        if (x < lo || x > hi) fail(ErrorCode::bad_input, "{}: {} = {} is out of range [{}, {}]", src_, key, x, lo, hi);
        return x;
    }

    // A finite number in (lo, hi] (lo exclusive: every real-valued key here must be positive).
    double real_value(const json& v, std::string_view key, double lo, double hi) const {
        if (!v.is_number()) fail(ErrorCode::bad_input, "{}: {} must be a number, got {}", src_, key, show(v));
        const double x = v.get<double>();
        if (!std::isfinite(x) || !(x > lo) || !(x <= hi))
            fail(ErrorCode::bad_input, "{}: {} = {} is out of range ({}, {}]", src_, key, show(v), lo, hi);
        return x;
    }
    double real(std::string_view key, double def, double lo, double hi) const {
        const json* v = find(key);
        return v ? real_value(*v, key, lo, hi) : def;
    }

    bool boolean(std::string_view key, bool def) const {
        const json* v = find(key);
        if (!v) return def;
        if (!v->is_boolean()) fail(ErrorCode::bad_input, "{}: {} must be true or false, got {}", src_, key, show(*v));
        return v->get<bool>();
    }

    std::string string(std::string_view key, std::string def) const {
        const json* v = find(key);
        if (!v) return def;
        if (!v->is_string()) fail(ErrorCode::bad_input, "{}: {} must be a string, got {}", src_, key, show(*v));
        return v->get<std::string>();
    }

    // An integer that may be written under an alias (transformers' attribute_map:
    // e.g. Qwen3MoeConfig saves num_experts as "num_local_experts").
    std::int64_t integer_aliased(std::string_view key, std::string_view alias, std::int64_t def, std::int64_t lo,
                                 std::int64_t hi) const {
        const json* a = find(key);
        const json* b = find(alias);
        if (a && b) {
            const std::int64_t x = integer_value(*a, key, lo, hi);
            const std::int64_t y = integer_value(*b, alias, lo, hi);
            if (x != y) fail(ErrorCode::bad_input, "{}: {} ({}) and {} ({}) disagree", src_, key, x, alias, y);
            return x;
        }
        if (a) return integer_value(*a, key, lo, hi);
        if (b) return integer_value(*b, alias, lo, hi);
        return def;
    }

    // size() of a key transformers also reads under an alias (attribute_map).
    std::int64_t size_aliased(std::string_view key, std::string_view alias, std::int64_t lo, std::int64_t hi) const {
        if (!find(key) && !find(alias))
            fail(ErrorCode::bad_input, "{}: required key \"{}\" (or \"{}\") is missing (a model's sizes are never guessed)", src_,
                 key, alias);
        return integer_aliased(key, alias, 0, lo, hi);
    }

private:
    const json& obj_;
    const std::string& src_;
};

std::optional<Architecture> arch_from_model_type(std::string_view t) {
    for (const auto& a : kArchs)
        if (t == a.model_type) return a.arch;
    if (t == "qwen3_5_moe_text") return Architecture::qwen3_5_moe;  // Qwen3_5MoeForCausalLM's text-only config
    if (t == "qwen3_5_text") return Architecture::qwen3_5;          // Qwen3_5ForCausalLM's
    // Kimi-K2's checkpoints name their own model_type (remote code) over DeepseekV3ForCausalLM: the same
    // config keys and model (the class name must then say DeepseekV3, checked by the caller).
    if (t == "kimi_k2") return Architecture::deepseek_v3;
    return std::nullopt;
}

std::optional<Architecture> arch_from_class(std::string_view cls) {
    for (const auto& a : kArchs) {
        if (!cls.starts_with(a.class_prefix)) continue;
        const std::string_view rest = cls.substr(a.class_prefix.size());
        if (rest.starts_with("For") || rest == "Model") return a.arch;
    }
    return std::nullopt;
}

Architecture detect_architecture(const Keys& k) {
    const json* mt = k.find("model_type", true);
    const json* archs = k.find("architectures", true);
    std::optional<std::string> cls;
    if (archs) {
        if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
            fail(ErrorCode::bad_input, "{}: architectures must be a non-empty list of class names, got {}",
                 k.source(), show(*archs));
        cls = (*archs)[0].get<std::string>();
    }
    if (mt) {
        if (!mt->is_string()) fail(ErrorCode::bad_input, "{}: model_type must be a string, got {}", k.source(), show(*mt));
        const std::string type = mt->get<std::string>();
        const auto a = arch_from_model_type(type);
        if (!a)
            fail(ErrorCode::bad_input, "{}: model_type {} is not a supported architecture (supported: {})", k.source(),
                 show(*mt), supported_architectures());
        if (cls && arch_from_class(*cls) != a)
            fail(ErrorCode::bad_input, "{}: architectures[0] {} does not match model_type {}", k.source(),
                 show(json(*cls)), show(*mt));
        return *a;
    }
    if (!cls)
        fail(ErrorCode::bad_input, "{}: neither model_type nor architectures is given (supported: {})", k.source(),
             supported_architectures());
    const auto a = arch_from_class(*cls);
    if (!a)
        fail(ErrorCode::bad_input, "{}: architectures[0] {} is not a supported architecture (supported: {})",
             k.source(), show(json(*cls)), supported_architectures());
    return *a;
}

// rope_theta / rope_type as transformers 5.24 standardises them
// (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict): the legacy
// rope_scaling dict wins over rope_parameters; rope_theta comes from that
// dict, else the top-level rope_theta, else the class default.
void read_rope(const Keys& k, double default_theta, ModelConfig& c) {
    const json* params = nullptr;
    std::string_view params_key;
    for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
        const json* v = k.find(key, true);
        if (!v) continue;
        if (!v->is_object()) fail(ErrorCode::bad_input, "{}: {} must be an object, got {}", k.source(), key, show(*v));
        if (v->empty()) continue;
        params = v;
        params_key = key;
        break;
    }
    c.rope_theta = k.real("rope_theta", default_theta, 0.0, kMaxRopeTheta);
    c.rope_type = "default";
    if (!params) return;
    const Keys p(*params, k.source());
    const std::string pk(params_key);
    if (const json* t = p.find("rope_theta", true)) c.rope_theta = k.real_value(*t, pk + ".rope_theta", 0.0, kMaxRopeTheta);
    for (std::string_view key : {"rope_type", "type"}) {
        if (const json* t = p.find(key, true)) {
            if (!t->is_string())
                fail(ErrorCode::bad_input, "{}: {}.{} must be a string, got {}", k.source(), params_key, key, show(*t));
            c.rope_type = one_line(t->get<std::string>().substr(0, 32));
            break;
        }
    }
    if (c.rope_type == "llama3") {
        // transformers' _compute_llama3_parameters reads these four keys (all required there).
        auto& r = c.rope_scaling;
        auto need = [&](std::string_view key) -> const json& {
            const json* v = p.find(key, true);
            if (!v) fail(ErrorCode::bad_input, "{}: {}.{} is required for rope_type llama3", k.source(), params_key, key);
            return *v;
        };
        r.factor = k.real_value(need("factor"), pk + ".factor", 0.0, 1e6);
        r.low_freq_factor = k.real_value(need("low_freq_factor"), pk + ".low_freq_factor", 0.0, 1e6);
        r.high_freq_factor = k.real_value(need("high_freq_factor"), pk + ".high_freq_factor", 0.0, 1e6);
        r.original_max_position_embeddings = static_cast<double>(
            k.integer_value(need("original_max_position_embeddings"), pk + ".original_max_position_embeddings", 1,
                            kMaxPositions));
        KVASIR_CHECK(r.high_freq_factor > r.low_freq_factor, ErrorCode::bad_input,
                     "{}: {}.high_freq_factor ({}) must exceed low_freq_factor ({})", k.source(), params_key,
                     r.high_freq_factor, r.low_freq_factor);
    } else if (c.rope_type == "yarn") {
        // transformers' _compute_yarn_parameters: factor (null: max_position_embeddings /
        // original_max_position_embeddings) and original_max_position_embeddings are read unconditionally;
        // beta_fast / beta_slow default (also when 0 or null) to 32 / 1, truncate to true; attention_factor
        // (else derived from mscale, mscale_all_dim) is the cos/sin scale.
        auto& r = c.rope_scaling;
        const json* orig = p.find("original_max_position_embeddings", true);
        if (!orig) fail(ErrorCode::bad_input, "{}: {}.original_max_position_embeddings is required for rope_type yarn",
                        k.source(), params_key);
        r.original_max_position_embeddings = static_cast<double>(
            k.integer_value(*orig, pk + ".original_max_position_embeddings", 1, kMaxPositions));
        const json* f = p.find("factor");
        if (!f) fail(ErrorCode::bad_input, "{}: {}.factor is required for rope_type yarn", k.source(), params_key);
        r.factor = f->is_null() ? static_cast<double>(k.integer("max_position_embeddings", 0, 1, kMaxPositions)) /
                                      r.original_max_position_embeddings
                                : k.real_value(*f, pk + ".factor", 0.0, 1e6);
        KVASIR_CHECK(r.factor > 0, ErrorCode::bad_input, "{}: {}.factor must be > 0", k.source(), params_key);
        const auto opt_real = [&](std::string_view key, double fallback, double lo, double hi) {
            const json* v = p.find(key, true);
            const double x = v ? k.real_value(*v, pk + "." + std::string(key), lo, hi) : fallback;
            return x == 0.0 ? fallback : x;  // transformers: `... or default`
        };
        r.beta_fast = opt_real("beta_fast", 32.0, 0.0, 1e6);
        r.beta_slow = opt_real("beta_slow", 1.0, 0.0, 1e6);
        if (const json* t = p.find("truncate", true)) {
            KVASIR_CHECK(t->is_boolean(), ErrorCode::bad_input, "{}: {}.truncate must be true or false, got {}", k.source(),
                         params_key, show(*t));
            r.truncate = t->get<bool>();
        }
        if (const json* a = p.find("attention_factor", true))
            r.attention_factor = k.real_value(*a, pk + ".attention_factor", 0.0, 1e6);
        if (const json* m = p.find("mscale", true)) r.mscale = k.real_value(*m, pk + ".mscale", -1e6, 1e6);
        if (const json* m = p.find("mscale_all_dim", true))
            r.mscale_all_dim = k.real_value(*m, pk + ".mscale_all_dim", -1e6, 1e6);
    }
}

// The sigmoid router family (DeepseekV3TopkRouter; Glm4MoeTopkRouter is the same code) with its MoE
// block and layer rule, transformers 5.24: s = sigmoid(logits), selection on s + e_score_correction_bias
// within the topk_group best of n_group groups, weights s renormalised (norm_topk_prob) ×
// routed_scaling_factor; shared_experts = MLP(moe_intermediate_size × n_shared_experts), no gate;
// MoE iff layer >= first_k_dense_replace (DeepseekV3DecoderLayer / Glm4MoeDecoderLayer.__init__).
struct SigmoidRouterDefaults {
    std::int64_t n_group, topk_group;
    double routed_scaling_factor;
    std::int64_t first_k_dense_replace;
};
void read_sigmoid_router(const Keys& k, ModelConfig& c, const SigmoidRouterDefaults& d) {
    RouterConfig& r = c.router;
    const char* arch = architecture_name(c.architecture);
    if (const json* v = k.find("scoring_func", true)) {  // hub configs carry it; transformers hard-codes sigmoid
        KVASIR_CHECK(v->is_string() && v->get<std::string>() == "sigmoid", ErrorCode::bad_input,
                     "{}: scoring_func {} is not supported for {} (sigmoid only)", k.source(), show(*v), arch);
    }
    if (const json* v = k.find("topk_method", true)) {  // DeepSeek-V3 hub configs: "noaux_tc", the rule above
        KVASIR_CHECK(v->is_string() && v->get<std::string>() == "noaux_tc", ErrorCode::unsupported,
                     "{}: topk_method {} is not implemented for {} (transformers runs noaux_tc)", k.source(), show(*v),
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

void read_mlp_only_layers(const Keys& k, ModelConfig& c) {
    const json* v = k.find("mlp_only_layers", true);  // None → [] (Qwen*MoeConfig.__post_init__)
    if (!v) return;
    if (!v->is_array()) fail(ErrorCode::bad_input, "{}: mlp_only_layers must be a list of layer indices, got {}",
                             k.source(), show(*v));
    for (const json& e : *v) c.mlp_only_layers.push_back(k.integer_value(e, "mlp_only_layers", 0, c.num_layers - 1));
}

// Which layers are MoE in the Qwen MoE families (decoder_sparse_step,
// mlp_only_layers). Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer /
// Qwen3NextDecoderLayer.__init__ (transformers 5.24):
//   if (layer_idx not in config.mlp_only_layers) and (
//       config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0):
//       self.mlp = <SparseMoeBlock>  else: self.mlp = <MLP>(intermediate_size=config.intermediate_size)
// Needs router.num_experts and num_layers read first.
void read_qwen_sparse_layers(const Keys& k, ModelConfig& c) {
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
std::int64_t read_sliding_window(const Keys& k, std::int64_t class_default) {
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
bool read_sliding_layer_types(const Keys& k, ModelConfig& c) {
    c.sliding_layers.assign(static_cast<std::size_t>(c.num_layers), false);
    const json* lt = k.find("layer_types", true);
    if (!lt) return false;
    KVASIR_CHECK(lt->is_array() && static_cast<std::int64_t>(lt->size()) == c.num_layers, ErrorCode::bad_input,
                 "{}: layer_types must list one type per layer ({}), got {}", k.source(), c.num_layers, show(*lt));
    for (std::size_t l = 0; l < lt->size(); ++l) {
        const json& t = (*lt)[l];
        KVASIR_CHECK(t.is_string() && (t == "sliding_attention" || t == "full_attention"), ErrorCode::bad_input,
                     "{}: layer_types[{}] = {} (expected \"sliding_attention\" or \"full_attention\")", k.source(), l,
                     show(t));
        c.sliding_layers[l] = t == "sliding_attention";
    }
    return true;
}

void read_qwen_sliding_window(const Keys& k, ModelConfig& c) {
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
void read_hybrid(const Keys& k, ModelConfig& c, bool moe) {
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
                     "{}: layer_types must list one type per layer ({}), got {}", k.source(), c.num_layers, show(*lt));
        for (std::size_t l = 0; l < lt->size(); ++l) {
            const json& t = (*lt)[l];
            KVASIR_CHECK(t.is_string() && (t == "linear_attention" || t == "full_attention"), ErrorCode::bad_input,
                         "{}: layer_types[{}] = {} (expected \"linear_attention\" or \"full_attention\")", k.source(),
                         l, show(t));
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

}  // namespace

// ---------------------------------------------------------------------------

const char* architecture_name(Architecture a) noexcept {
    for (const auto& info : kArchs)
        if (info.arch == a) return info.model_type;
    return "?";
}

std::string_view supported_architectures() noexcept {
    return "qwen2_moe, qwen3_moe, mixtral, qwen3_5_moe, qwen3_next, olmoe, gpt_oss, deepseek_v3, glm4_moe, llama, mistral, "
           "qwen2, qwen3, qwen3_5";
}

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

// qwen3_moe, qwen2_moe: the family's config keys and defaults.
void read_qwen_moe(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    RouterConfig& r = c.router;
    const bool q3 = c.architecture == Architecture::qwen3_moe;
    if (q3) {
        // Qwen3MoeAttention: q/k/v AND o_proj take bias=config.attention_bias; q_norm/k_norm always.
        c.qk_norm = true;
        c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
        // attribute_map {"num_experts": "num_local_experts"}: save_pretrained writes num_local_experts.
        r.num_experts = k.size_aliased("num_experts", "num_local_experts", 1, kMaxExperts);
    } else {
        // Qwen2MoeAttention: q/k/v bias=config.qkv_bias (default True), o_proj none.
        c.attention_bias = k.boolean("qkv_bias", true);
        r.num_experts = k.size("num_experts", 1, kMaxExperts);
        // Qwen2MoeSparseMoeBlock: shared_expert (SwiGLU) × sigmoid(shared_expert_gate(x)).
        c.shared_expert_intermediate_size =
            k.size("shared_expert_intermediate_size", 1, kMaxDim);
        c.shared_expert_gate = true;
    }
    read_qwen_sliding_window(k, c);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    r.norm_topk_prob = k.boolean("norm_topk_prob", d.norm_topk_prob);
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.moe_intermediate_size = k.size("moe_intermediate_size", 1, kMaxDim);
    read_qwen_sparse_layers(k, c);
}

// mixtral: the family's config keys and defaults.
void read_mixtral(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    RouterConfig& r = c.router;
    // attribute_map {"num_experts": "num_local_experts"}.
    r.num_experts = k.size_aliased("num_local_experts", "num_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    // MixtralTopKRouter.forward: router_top_value /= router_top_value.sum(...) unconditionally.
    r.norm_topk_prob = true;
    // MixtralExperts: intermediate_dim = config.intermediate_size; no dense layers.
    c.moe_intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.intermediate_size = 0;
    c.sliding_window = read_sliding_window(k, 0);  // MixtralConfig default None = full attention
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);        // MixtralDecoderLayer
}

// qwen3_5_moe: the family's config keys and defaults.
void read_qwen3_5_moe(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    RouterConfig& r = c.router;
    read_hybrid(k, c, true);
    // Qwen3_5MoeTopKRouter renormalises the top-k unconditionally; every
    // layer's MLP is the sparse MoE block (Qwen3_5MoeDecoderLayer).
    r.norm_topk_prob = true;
    c.intermediate_size = 0;
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);
}

// qwen3_next: the family's config keys and defaults.
void read_qwen3_next(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    RouterConfig& r = c.router;
    read_hybrid(k, c, true);
    r.norm_topk_prob = k.boolean("norm_topk_prob", true);
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    read_qwen_sparse_layers(k, c);  // Qwen3NextDecoderLayer: the qwen3_moe rule
}

// llama, mistral, qwen2, qwen3: the family's config keys and defaults.
void read_dense_standard(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    const std::string& source = c.source;
    // LlamaAttention / MistralAttention / Qwen2Attention / Qwen3Attention (transformers 5.24):
    //  llama: q/k/v/o bias = attention_bias (default false); mlp_bias refused (not modelled);
    //  mistral: no biases; sliding_window (None = full) on every layer;
    //  qwen2: q/k/v bias always, o_proj none; qwen3: q/k/v/o bias = attention_bias, q/k norm always;
    //  the Qwen ones slide only with use_sliding_window, on the layer_types "sliding_attention" layers.
    const Architecture a = c.architecture;
    if (a == Architecture::llama) {
        c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
        KVASIR_CHECK(!k.boolean("mlp_bias", false), ErrorCode::unsupported,
                     "{}: mlp_bias true (biases on the MLP projections) is not implemented", source);
    } else if (a == Architecture::qwen2) {
        c.attention_bias = true;
    } else if (a == Architecture::qwen3) {
        c.qk_norm = true;
        c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    }
    if (a == Architecture::mistral)
        c.sliding_window = read_sliding_window(k, 4096);  // MistralConfig default 4096; null = full attention
    else if (a != Architecture::llama)
        read_qwen_sliding_window(k, c);
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), false);
}

// gpt_oss: the family's config keys and defaults.
void read_gpt_oss(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
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

// olmoe: the family's config keys and defaults.
void read_olmoe(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    RouterConfig& r = c.router;
    const std::string& source = c.source;
    // OlmoeAttention (transformers 5.24): q_norm over hidden_size and k_norm over (hidden/heads)·kv
    // applied to the whole projections before the split into heads; q/k/v/o bias = attention_bias;
    // clip_qkv (clamping q, k, v) is not modelled. OlmoeTopKRouter: softmax over all experts, top-k,
    // renormalised only with norm_topk_prob (default false). OlmoeExperts: intermediate_size wide.
    c.qk_norm = c.qk_norm_full = true;
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    if (const json* v = k.find("clip_qkv", true))
        fail(ErrorCode::unsupported, "{}: clip_qkv {} (clamping q, k and v) is not implemented", source, show(*v));
    KVASIR_CHECK(c.head_dim * c.num_heads == c.hidden_size, ErrorCode::unsupported,
                 "{}: head_dim {} × num_attention_heads {} != hidden_size {} (OlmoeAttention's q_norm is "
                 "hidden_size wide)", source, c.head_dim, c.num_heads, c.hidden_size);
    r.num_experts = k.size_aliased("num_experts", "num_local_experts", 1, kMaxExperts);
    r.top_k = k.size("num_experts_per_tok", 1, kMaxExperts);
    r.norm_topk_prob = k.boolean("norm_topk_prob", d.norm_topk_prob);
    c.moe_intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.intermediate_size = 0;
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), true);  // OlmoeDecoderLayer: every layer
}

// qwen3_5: the family's config keys and defaults.
void read_qwen3_5(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    read_hybrid(k, c, false);  // Qwen3_5DecoderLayer: the hybrid mixers, a dense MLP on every layer
    c.intermediate_size = k.size("intermediate_size", 1, kMaxDim);
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), false);
}

// deepseek_v3: the family's config keys and defaults.
void read_deepseek_v3(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    // DeepseekV3Attention: q_a_proj, kv_a_proj_with_mqa and o_proj take bias=attention_bias
    // (q_b_proj, kv_b_proj, q_proj never).
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    read_sigmoid_router(k, c, {8, 4, 2.5, 3});
}

// glm4_moe: the family's config keys and defaults.
void read_glm4_moe(const Keys& k, [[maybe_unused]] const Defaults& d, ModelConfig& c) {
    // Glm4MoeAttention (transformers 5.24): q/k/v bias = attention_bias, o_proj none; per-head q/k
    // RMSNorm iff use_qk_norm; rope on the first head_dim·partial_rotary_factor dims (default 0.5,
    // Glm4MoeConfig.__post_init__), rotate_half within them. Glm4MoeTopkRouter = DeepseekV3TopkRouter.
    c.attention_bias = k.boolean("attention_bias", false);
    c.qk_norm = k.boolean("use_qk_norm", false);
    c.partial_rotary_factor = k.real("partial_rotary_factor", 0.5, 0.0, 1.0);
    if (const json* rp = k.find("rope_parameters", true); rp && rp->is_object() && rp->contains("partial_rotary_factor"))
        c.partial_rotary_factor =
            k.real_value((*rp)["partial_rotary_factor"], "rope_parameters.partial_rotary_factor", 0.0, 1.0);
    read_sigmoid_router(k, c, {1, 1, 1.0, 1});
}

// The config reader of each family (the per-architecture part of parse_model_config).
using FamilyReader = void (*)(const Keys&, const Defaults&, ModelConfig&);
FamilyReader family_reader(Architecture a) {
    switch (a) {
        case Architecture::qwen3_moe: return read_qwen_moe;
        case Architecture::qwen2_moe: return read_qwen_moe;
        case Architecture::mixtral: return read_mixtral;
        case Architecture::qwen3_5_moe: return read_qwen3_5_moe;
        case Architecture::qwen3_next: return read_qwen3_next;
        case Architecture::llama: return read_dense_standard;
        case Architecture::mistral: return read_dense_standard;
        case Architecture::qwen2: return read_dense_standard;
        case Architecture::qwen3: return read_dense_standard;
        case Architecture::gpt_oss: return read_gpt_oss;
        case Architecture::olmoe: return read_olmoe;
        case Architecture::qwen3_5: return read_qwen3_5;
        case Architecture::deepseek_v3: return read_deepseek_v3;
        case Architecture::glm4_moe: return read_glm4_moe;
    }
    fail(ErrorCode::internal, "no config reader for architecture {}", static_cast<int>(a));
}

}  // namespace

ModelConfig parse_model_config(std::string_view text, const std::string& source) {
    json j;
    try {
        j = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
        fail(ErrorCode::bad_input, "{}: invalid JSON: {}", source, one_line(e.what()));
    }
    KVASIR_CHECK(j.is_object(), ErrorCode::bad_input, "{}: the top level must be a JSON object, got {}", source,
                 j.type_name());
    ModelConfig c;
    c.source = source;
    c.architecture = detect_architecture(Keys(j, source));
    // The multimodal wrapper (Qwen3_5MoeForConditionalGeneration): the text
    // model's config is text_config, its tensors model.language_model.*.
    const json* body = &j;
    std::string keys_source = source;
    if ((c.architecture == Architecture::qwen3_5_moe || c.architecture == Architecture::qwen3_5) &&
        j.contains("text_config")) {
        KVASIR_CHECK(j["text_config"].is_object(), ErrorCode::bad_input, "{}: text_config must be an object", source);
        body = &j["text_config"];
        keys_source = source + " text_config";
        c.multimodal_wrapper = true;
        c.tensor_prefix = "model.language_model.";
    }
    const Keys k(*body, keys_source);
    const Defaults d = defaults_of(c.architecture);
    const bool deepseek = c.architecture == Architecture::deepseek_v3;

    // --- common ------------------------------------------------------------------
    c.hidden_size = k.size("hidden_size", 1, kMaxDim);
    c.num_layers = k.size("num_hidden_layers", 1, kMaxLayers);
    c.num_heads = k.size("num_attention_heads", 1, kMaxDim);
    // None → num_attention_heads (MixtralConfig / DeepseekV3Config.__post_init__).
    {
        const json* v = k.find("num_key_value_heads");
        c.num_kv_heads = !v ? (d.kv_heads == 0 ? c.num_heads : d.kv_heads) : v->is_null() ? c.num_heads
                                                         : k.integer_value(*v, "num_key_value_heads", 1, kMaxDim);
    }
    if (deepseek) {
        // MLA (DeepseekV3Attention): q·k runs over qk_nope_head_dim + qk_rope_head_dim (DeepseekV3Config.qk_head_dim);
        // keys and values are expanded per head from the latent, so there are num_attention_heads of each.
        auto& m = c.mla;
        m.qk_nope_head_dim = k.size("qk_nope_head_dim", 0, kMaxDim);
        m.qk_rope_head_dim = k.size("qk_rope_head_dim", 1, kMaxDim);
        m.v_head_dim = k.size("v_head_dim", 1, kMaxDim);
        m.kv_lora_rank = k.size("kv_lora_rank", 1, kMaxDim);
        const json* q = k.find("q_lora_rank");  // null: plain q_proj (DeepseekV3Attention.q_proj)
        KVASIR_CHECK(q != nullptr, ErrorCode::bad_input, "{}: q_lora_rank is required (null for a plain q_proj)", source);
        m.q_lora_rank = q->is_null() ? 0 : k.integer_value(*q, "q_lora_rank", 1, kMaxDim);
        m.rope_interleave = k.boolean("rope_interleave", true);
        c.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
        KVASIR_CHECK(c.num_kv_heads == c.num_heads, ErrorCode::unsupported,
                     "{}: num_key_value_heads {} != num_attention_heads {} is not implemented for MLA (transformers "
                     "expands the latent to every head)", source, c.num_kv_heads, c.num_heads);
    } else if (const json* v = k.find("head_dim", true)) {
        c.head_dim = k.integer_value(*v, "head_dim", 1, kMaxDim);
    } else if (c.architecture == Architecture::qwen3_5_moe || c.architecture == Architecture::qwen3_next ||
               c.architecture == Architecture::qwen3_5) {
        c.head_dim = 256;  // a field of Qwen3_5MoeTextConfig / Qwen3NextConfig, default 256
    } else if (c.architecture == Architecture::gpt_oss && !k.find("head_dim")) {
        c.head_dim = 64;  // GptOssConfig.head_dim (an explicit null: hidden_size // num_attention_heads, below)
    } else {
        // getattr(config, "head_dim", None) or hidden_size // num_attention_heads
        KVASIR_CHECK(c.hidden_size % c.num_heads == 0, ErrorCode::bad_input,
                     "{}: head_dim is not given and hidden_size ({}) is not divisible by num_attention_heads ({})",
                     source, c.hidden_size, c.num_heads);
        c.head_dim = c.hidden_size / c.num_heads;
    }
    read_rope(k, d.rope_theta, c);
    if (c.architecture == Architecture::gpt_oss && !k.find("rope_parameters", true) && !k.find("rope_scaling", true)) {
        // GptOssConfig.__post_init__'s rope when none is given.
        c.rope_type = "yarn";
        c.rope_scaling.factor = 32.0;
        c.rope_scaling.beta_fast = 32.0;
        c.rope_scaling.beta_slow = 1.0;
        c.rope_scaling.truncate = false;
        c.rope_scaling.original_max_position_embeddings = 4096.0;
    }
    c.rms_norm_eps = k.real("rms_norm_eps", d.rms_eps, 0.0, 0.5);
    c.hidden_act = k.string("hidden_act", "silu");
    KVASIR_CHECK(c.hidden_act == "silu", ErrorCode::unsupported,
                 "{}: hidden_act \"{}\" is not supported (the experts are SwiGLU: silu only)", source,
                 one_line(c.hidden_act.substr(0, 32)));
    c.vocab_size = k.size("vocab_size", 1, kMaxDim);
    c.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
    c.max_position_embeddings = k.integer("max_position_embeddings", d.max_positions, 1, kMaxPositions);

    // --- per architecture ------------------------------------------------------------
    family_reader(c.architecture)(k, d, c);
    validate_model_config(c);
    return c;
}

ModelConfig load_model_config(const std::string& dir_or_file) {
    namespace fs = std::filesystem;
    std::string path = dir_or_file;
    if (check_input_path(path, InputKind::file_or_directory)) path = (fs::path(dir_or_file) / "config.json").string();
    return parse_model_config(read_text_file(path, kMaxConfigBytes), path);
}

void validate_model_config(const ModelConfig& c) {
    const std::string& s = c.source;
    auto dim = [&](std::int64_t v, const char* key, std::int64_t lo, std::int64_t hi) {
        KVASIR_CHECK(v >= lo && v <= hi, ErrorCode::bad_input, "{}: {} = {} is out of range [{}, {}]", s, key, v, lo,
                     hi);
    };
    dim(c.hidden_size, "hidden_size", 1, kMaxDim);
    dim(c.num_layers, "num_hidden_layers", 1, kMaxLayers);
    dim(c.num_heads, "num_attention_heads", 1, kMaxDim);
    dim(c.num_kv_heads, "num_key_value_heads", 1, kMaxDim);
    dim(c.head_dim, "head_dim", 1, kMaxDim);
    dim(c.vocab_size, "vocab_size", 1, kMaxDim);
    dim(c.max_position_embeddings, "max_position_embeddings", 1, kMaxPositions);
    dim(c.sliding_window, "sliding_window", 0, kMaxPositions);
    KVASIR_CHECK(c.num_heads % c.num_kv_heads == 0, ErrorCode::bad_input,
                 "{}: num_key_value_heads ({}) must divide num_attention_heads ({})", s, c.num_kv_heads, c.num_heads);
    KVASIR_CHECK(c.head_dim % 2 == 0, ErrorCode::bad_input, "{}: head_dim ({}) must be even for rotary embeddings", s,
                 c.head_dim);
    if (c.has_mla()) {
        const auto& m = c.mla;
        dim(m.kv_lora_rank, "kv_lora_rank", 1, kMaxDim);
        dim(m.q_lora_rank, "q_lora_rank", 0, kMaxDim);
        dim(m.v_head_dim, "v_head_dim", 1, kMaxDim);
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

    KVASIR_CHECK(static_cast<std::int64_t>(c.moe_layers.size()) == c.num_layers, ErrorCode::bad_input,
                 "{}: {} MoE-layer flags for num_hidden_layers = {}", s, c.moe_layers.size(), c.num_layers);
    const bool any_moe = c.num_moe_layers() > 0;
    const bool any_dense = c.num_moe_layers() < c.num_layers;
    dim(c.intermediate_size, "intermediate_size", any_dense ? 1 : 0, kMaxDim);
    dim(c.moe_intermediate_size, "moe_intermediate_size", any_moe ? 1 : 0, kMaxDim);
    dim(c.shared_expert_intermediate_size, "shared_expert_intermediate_size", 0, kMaxDim);
    KVASIR_CHECK(!c.shared_expert_gate || c.shared_expert_intermediate_size > 0, ErrorCode::bad_input,
                 "{}: a shared_expert_gate needs shared_expert_intermediate_size > 0", s);
    for (std::int64_t l : c.mlp_only_layers) dim(l, "mlp_only_layers", 0, c.num_layers - 1);
    KVASIR_CHECK(c.linear_attention_layers.empty() ||
                     static_cast<std::int64_t>(c.linear_attention_layers.size()) == c.num_layers,
                 ErrorCode::bad_input, "{}: {} layer types for num_hidden_layers = {}", s, c.linear_attention_layers.size(),
                 c.num_layers);
    if (!c.linear_attention_layers.empty()) {
        dim(c.linear.conv_kernel, "linear_conv_kernel_dim", 1, 64);
        dim(c.linear.key_heads, "linear_num_key_heads", 1, kMaxDim);
        dim(c.linear.value_heads, "linear_num_value_heads", 1, kMaxDim);
        dim(c.linear.key_head_dim, "linear_key_head_dim", 1, kMaxDim);
        dim(c.linear.value_head_dim, "linear_value_head_dim", 1, kMaxDim);
    }
    const double rotary = static_cast<double>(c.head_dim) * c.partial_rotary_factor;
    KVASIR_CHECK(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0 && rotary == std::floor(rotary) &&
                     static_cast<std::int64_t>(rotary) % 2 == 0,
                 ErrorCode::bad_input, "{}: partial_rotary_factor {} × head_dim {} is not an even number of dimensions", s,
                 c.partial_rotary_factor, c.head_dim);

    KVASIR_CHECK(c.sliding_layers.empty() || static_cast<std::int64_t>(c.sliding_layers.size()) == c.num_layers,
                 ErrorCode::bad_input, "{}: {} sliding-layer flags for num_hidden_layers = {}", s, c.sliding_layers.size(),
                 c.num_layers);
    const RouterConfig& r = c.router;
    if (!any_moe) return;  // a dense model (or every layer dense): no router is used
    const char* experts_key = c.architecture == Architecture::mixtral ? "num_local_experts"
                              : r.scoring == RouterScoring::sigmoid    ? "n_routed_experts"
                                                                       : "num_experts";
    dim(r.num_experts, experts_key, 1, kMaxExperts);
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

LayerTensorNames layer_tensor_names(const ModelConfig& c, std::int64_t layer) {
    const bool moe = c.is_moe(layer);  // also checks the range
    const std::string p = fmt::format("{}layers.{}.", c.tensor_prefix, layer);
    LayerTensorNames n;
    n.input_norm = p + "input_layernorm.weight";
    n.post_attention_norm = p + "post_attention_layernorm.weight";
    if (c.is_linear_attention(layer)) {
        // Gated DeltaNet (Qwen3_5MoeGatedDeltaNet / Qwen3NextGatedDeltaNet).
        const std::string a = p + "linear_attn.";
        if (c.architecture == Architecture::qwen3_next) {
            n.in_proj_qkvz = a + "in_proj_qkvz.weight";
            n.in_proj_ba = a + "in_proj_ba.weight";
        } else {
            n.in_proj_qkv = a + "in_proj_qkv.weight";
            n.in_proj_z = a + "in_proj_z.weight";
            n.in_proj_b = a + "in_proj_b.weight";
            n.in_proj_a = a + "in_proj_a.weight";
        }
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
    if (!moe) {
        n.mlp_gate = p + "mlp.gate_proj.weight";
        n.mlp_up = p + "mlp.up_proj.weight";
        n.mlp_down = p + "mlp.down_proj.weight";
        return n;
    }
    const auto experts = static_cast<std::size_t>(c.num_experts());
    n.experts.resize(experts);
    if (c.architecture == Architecture::mixtral) {
        const std::string m = p + "block_sparse_moe.";
        n.router = m + "gate.weight";
        for (std::size_t e = 0; e < experts; ++e) {
            n.experts[e].gate = fmt::format("{}experts.{}.w1.weight", m, e);
            n.experts[e].up = fmt::format("{}experts.{}.w3.weight", m, e);
            n.experts[e].down = fmt::format("{}experts.{}.w2.weight", m, e);
        }
        return n;
    }
    const std::string m = p + "mlp.";
    if (c.architecture == Architecture::gpt_oss) {
        n.experts.clear();
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
        return n;
    }
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
