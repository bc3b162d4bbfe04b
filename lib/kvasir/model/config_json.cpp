// parse_model_config / load_model_config (config.hpp): the keys every family
// shares, then the family's own reader (model/families/*.cpp).
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/config.hpp"
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

namespace kvasir {

namespace {

using json = nlohmann::json;
using namespace config_bounds;

constexpr std::uintmax_t kMaxConfigBytes = std::uintmax_t{64} << 20;

std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    std::replace(s.begin(), s.end(), '\r', ' ');
    return s;
}


const Family& detect_family(const ConfigKeys& k) {
    const json* mt = k.find("model_type", true);
    const json* archs = k.find("architectures", true);
    std::optional<std::string> cls;
    if (archs) {
        if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
            fail(ErrorCode::bad_input, "{}: architectures must be a non-empty list of class names, got {}",
                 k.source(), show_json(*archs));
        cls = (*archs)[0].get<std::string>();
    }
    if (mt) {
        if (!mt->is_string()) fail(ErrorCode::bad_input, "{}: model_type must be a string, got {}", k.source(), show_json(*mt));
        const std::string type = mt->get<std::string>();
        const Family* a = family_for_model_type(type);
        if (a == nullptr)
            fail(ErrorCode::bad_input, "{}: model_type {} is not a supported architecture (supported: {})", k.source(),
                 show_json(*mt), supported_architectures());
        if (cls && family_for_class(*cls) != a)
            fail(ErrorCode::bad_input, "{}: architectures[0] {} does not match model_type {}", k.source(),
                 show_json(json(*cls)), show_json(*mt));
        return *a;
    }
    if (!cls)
        fail(ErrorCode::bad_input, "{}: neither model_type nor architectures is given (supported: {})", k.source(),
             supported_architectures());
    const Family* a = family_for_class(*cls);
    if (a == nullptr)
        fail(ErrorCode::bad_input, "{}: architectures[0] {} is not a supported architecture (supported: {})",
             k.source(), show_json(json(*cls)), supported_architectures());
    return *a;
}

// rope_theta / rope_type as transformers 5.24 standardises them
// (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict): the legacy
// rope_scaling dict wins over rope_parameters; rope_theta comes from that
// dict, else the top-level rope_theta, else the class default.
void read_rope(const ConfigKeys& k, double default_theta, ModelConfig& c) {
    const json* params = nullptr;
    std::string_view params_key;
    for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
        const json* v = k.find(key, true);
        if (!v) continue;
        if (!v->is_object()) fail(ErrorCode::bad_input, "{}: {} must be an object, got {}", k.source(), key, show_json(*v));
        if (v->empty()) continue;
        params = v;
        params_key = key;
        break;
    }
    c.rope_theta = k.real("rope_theta", default_theta, 0.0, kMaxRopeTheta);
    c.rope_type = "default";
    if (!params) return;
    const ConfigKeys p(*params, k.source());
    const std::string pk(params_key);
    if (const json* t = p.find("rope_theta", true)) c.rope_theta = k.real_value(*t, pk + ".rope_theta", 0.0, kMaxRopeTheta);
    for (std::string_view key : {"rope_type", "type"}) {
        if (const json* t = p.find(key, true)) {
            if (!t->is_string())
                fail(ErrorCode::bad_input, "{}: {}.{} must be a string, got {}", k.source(), params_key, key, show_json(*t));
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
                         params_key, show_json(*t));
            r.truncate = t->get<bool>();
        }
        if (const json* a = p.find("attention_factor", true))
            r.attention_factor = k.real_value(*a, pk + ".attention_factor", 0.0, 1e6);
        if (const json* m = p.find("mscale", true)) r.mscale = k.real_value(*m, pk + ".mscale", -1e6, 1e6);
        if (const json* m = p.find("mscale_all_dim", true))
            r.mscale_all_dim = k.real_value(*m, pk + ".mscale_all_dim", -1e6, 1e6);
    }
}

// MLA (DeepseekV3Attention): q·k runs over qk_nope_head_dim + qk_rope_head_dim (DeepseekV3Config.qk_head_dim);
// keys and values are expanded per head from the latent, so there are num_attention_heads of each.
void read_mla(const ConfigKeys& k, ModelConfig& c) {
    auto& m = c.mla;
    m.qk_nope_head_dim = k.size("qk_nope_head_dim", 0, kMaxDim);
    m.qk_rope_head_dim = k.size("qk_rope_head_dim", 1, kMaxDim);
    m.v_head_dim = k.size("v_head_dim", 1, kMaxDim);
    m.kv_lora_rank = k.size("kv_lora_rank", 1, kMaxDim);
    const json* q = k.find("q_lora_rank");  // null: plain q_proj (DeepseekV3Attention.q_proj)
    KVASIR_CHECK(q != nullptr, ErrorCode::bad_input, "{}: q_lora_rank is required (null for a plain q_proj)", c.source);
    m.q_lora_rank = q->is_null() ? 0 : k.integer_value(*q, "q_lora_rank", 1, kMaxDim);
    m.rope_interleave = k.boolean("rope_interleave", true);
    c.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
    KVASIR_CHECK(c.num_kv_heads == c.num_heads, ErrorCode::unsupported,
                 "{}: num_key_value_heads {} != num_attention_heads {} is not implemented for MLA (transformers "
                 "expands the latent to every head)", c.source, c.num_kv_heads, c.num_heads);
}

// head_dim: the key, else the config class's field default, else
// getattr(config, "head_dim", None) or hidden_size // num_attention_heads.
void read_head_dim(const ConfigKeys& k, const FamilyDefaults& d, ModelConfig& c) {
    if (const json* v = k.find("head_dim", true)) {
        c.head_dim = k.integer_value(*v, "head_dim", 1, kMaxDim);
    } else if (d.head_dim > 0) {
        c.head_dim = d.head_dim;
    } else {
        KVASIR_CHECK(c.hidden_size % c.num_heads == 0, ErrorCode::bad_input,
                     "{}: head_dim is not given and hidden_size ({}) is not divisible by num_attention_heads ({})",
                     c.source, c.hidden_size, c.num_heads);
        c.head_dim = c.hidden_size / c.num_heads;
    }
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
    const Family& family = detect_family(ConfigKeys(j, source));
    c.architecture = family.id;
    // The multimodal wrapper (Qwen3_5MoeForConditionalGeneration): the text
    // model's config is text_config, its tensors model.language_model.*.
    const json* body = &j;
    std::string keys_source = source;
    if (family.text_config_wrapper && j.contains("text_config")) {
        KVASIR_CHECK(j["text_config"].is_object(), ErrorCode::bad_input, "{}: text_config must be an object", source);
        body = &j["text_config"];
        keys_source = source + " text_config";
        c.multimodal_wrapper = true;
        c.tensor_prefix = "model.language_model.";
    }
    const ConfigKeys k(*body, keys_source);
    const FamilyDefaults& d = family.defaults;

    // --- the keys every family shares ------------------------------------------------
    c.hidden_size = k.size("hidden_size", 1, kMaxDim);
    c.num_layers = k.size("num_hidden_layers", 1, kMaxLayers);
    c.num_heads = k.size("num_attention_heads", 1, kMaxDim);
    // None → num_attention_heads (MixtralConfig / DeepseekV3Config.__post_init__).
    {
        const json* v = k.find("num_key_value_heads");
        c.num_kv_heads = !v ? (d.kv_heads == 0 ? c.num_heads : d.kv_heads) : v->is_null() ? c.num_heads
                                                         : k.integer_value(*v, "num_key_value_heads", 1, kMaxDim);
    }
    if (family.layer == LayerKind::mla)
        read_mla(k, c);
    else
        read_head_dim(k, d, c);
    read_rope(k, d.rope_theta, c);
    c.rms_norm_eps = k.real("rms_norm_eps", d.rms_eps, 0.0, 0.5);
    c.hidden_act = k.string("hidden_act", "silu");
    KVASIR_CHECK(c.hidden_act == "silu", ErrorCode::unsupported,
                 "{}: hidden_act \"{}\" is not supported (the experts are SwiGLU: silu only)", source,
                 one_line(c.hidden_act.substr(0, 32)));
    c.vocab_size = k.size("vocab_size", 1, kMaxDim);
    c.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
    c.max_position_embeddings = k.integer("max_position_embeddings", d.max_positions, 1, kMaxPositions);

    // --- the family's own ------------------------------------------------------------
    family.read(k, c);
    validate_model_config(c);
    return c;
}

ModelConfig load_model_config(const std::string& dir_or_file) {
    namespace fs = std::filesystem;
    std::string path = dir_or_file;
    if (check_input_path(path, InputKind::file_or_directory)) path = (fs::path(dir_or_file) / "config.json").string();
    return parse_model_config(read_text_file(path, kMaxConfigBytes), path);
}

}  // namespace kvasir
