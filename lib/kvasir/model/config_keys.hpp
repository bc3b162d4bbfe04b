// Typed, bounded access to the keys of a Hugging Face config.json, and the
// readers of key groups several families share (sliding windows, the Qwen
// MoE layer rule, the hybrid stack, the sigmoid router). The family files
// (model/families/*.cpp) and parse_model_config read configs through these;
// every failure names the file and the key.
#pragma once

#include "kvasir/core/error.hpp"
#include "kvasir/model/config.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvasir {

// A JSON value for a message: compact, escaped (so one line), truncated.
std::string show_json(const nlohmann::json& v);

// Typed access to the keys of a config.json object; every failure names the
// file and the key.
class ConfigKeys {
public:
    ConfigKeys(const nlohmann::json& obj, const std::string& source) : obj_(obj), src_(source) {}

    const std::string& source() const { return src_; }

    // The value of `key`, or nullptr when absent. With null_is_absent, a JSON
    // null counts as absent (for keys whose None means "the default" in transformers).
    const nlohmann::json* find(std::string_view key, bool null_is_absent = false) const {
        auto it = obj_.find(key);
        if (it == obj_.end()) return nullptr;
        if (null_is_absent && it->is_null()) return nullptr;
        return &*it;
    }

    std::int64_t integer(std::string_view key, std::int64_t def, std::int64_t lo, std::int64_t hi,
                         bool null_is_absent = false) const {
        const nlohmann::json* v = find(key, null_is_absent);
        return v ? integer_value(*v, key, lo, hi) : def;
    }

    // A size of the model (hidden_size, layers, heads, vocab, FFN and expert
    // widths, expert counts, linear-attention and MLA dims): never guessed.
    // transformers' config classes give each a default (hidden_size 2048,
    // ...) and save_pretrained always writes them, so a config.json without
    // one is a hand-edited or truncated file: refused naming the key, not
    // computed with another model's size.
    std::int64_t size(std::string_view key, std::int64_t lo, std::int64_t hi) const {
        const nlohmann::json* v = find(key);
        if (!v) fail(ErrorCode::bad_input, "{}: required key \"{}\" is missing (a model's sizes are never guessed)", src_, key);
        return integer_value(*v, key, lo, hi);
    }

    std::int64_t integer_value(const nlohmann::json& v, std::string_view key, std::int64_t lo, std::int64_t hi) const {
        if (!v.is_number_integer())
            fail(ErrorCode::bad_input, "{}: {} must be an integer, got {}", src_, key, show_json(v));
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
    double real_value(const nlohmann::json& v, std::string_view key, double lo, double hi) const {
        if (!v.is_number()) fail(ErrorCode::bad_input, "{}: {} must be a number, got {}", src_, key, show_json(v));
        const double x = v.get<double>();
        if (!std::isfinite(x) || !(x > lo) || !(x <= hi))
            fail(ErrorCode::bad_input, "{}: {} = {} is out of range ({}, {}]", src_, key, show_json(v), lo, hi);
        return x;
    }
    double real(std::string_view key, double def, double lo, double hi) const {
        const nlohmann::json* v = find(key);
        return v ? real_value(*v, key, lo, hi) : def;
    }

    bool boolean(std::string_view key, bool def) const {
        const nlohmann::json* v = find(key);
        if (!v) return def;
        if (!v->is_boolean()) fail(ErrorCode::bad_input, "{}: {} must be true or false, got {}", src_, key, show_json(*v));
        return v->get<bool>();
    }

    std::string string(std::string_view key, std::string def) const {
        const nlohmann::json* v = find(key);
        if (!v) return def;
        if (!v->is_string()) fail(ErrorCode::bad_input, "{}: {} must be a string, got {}", src_, key, show_json(*v));
        return v->get<std::string>();
    }

    // An integer that may be written under an alias (transformers' attribute_map:
    // e.g. Qwen3MoeConfig saves num_experts as "num_local_experts").
    std::int64_t integer_aliased(std::string_view key, std::string_view alias, std::int64_t def, std::int64_t lo,
                                 std::int64_t hi) const {
        const nlohmann::json* a = find(key);
        const nlohmann::json* b = find(alias);
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
    const nlohmann::json& obj_;
    const std::string& src_;
};

// The sigmoid router (DeepseekV3TopkRouter; Glm4MoeTopkRouter is the same
// code) with its MoE block and layer rule, the class defaults of its keys.
struct SigmoidRouterDefaults {
    std::int64_t n_group, topk_group;
    double routed_scaling_factor;
    std::int64_t first_k_dense_replace;
};
void read_sigmoid_router(const ConfigKeys& k, ModelConfig& c, const SigmoidRouterDefaults& d);
// Which layers are MoE in the Qwen MoE families (decoder_sparse_step,
// mlp_only_layers). Needs router.num_experts and num_layers read first.
void read_qwen_sparse_layers(const ConfigKeys& k, ModelConfig& c);
// sliding_window as the config classes hold it: absent → the class default,
// null → no sliding window (0), else the number of keys.
std::int64_t read_sliding_window(const ConfigKeys& k, std::int64_t class_default);
// c.sliding_layers from layer_types ("sliding_attention" / "full_attention",
// one per layer) when the config has them (true); all false when it has none.
bool read_sliding_layer_types(const ConfigKeys& k, ModelConfig& c);
// Sliding-window attention as the Qwen configs resolve it (use_sliding_window,
// layer_types, max_window_layers).
void read_qwen_sliding_window(const ConfigKeys& k, ModelConfig& c);
// What the hybrid families (qwen3_5_moe, qwen3_next, qwen3_5) share: gated
// full attention, zero-centred norms, partial rotary, the Gated DeltaNet
// layers; with `moe`, the MoE block's sizes and its gated shared expert.
void read_hybrid(const ConfigKeys& k, ModelConfig& c, bool moe);
// The Qwen MoE block after its expert count (qwen2_moe, qwen3_moe): the
// sliding rule, top-k, norm_topk_prob (default false in both config classes),
// the dense and expert widths, which layers are MoE.
void read_qwen_moe_block(const ConfigKeys& k, ModelConfig& c);
// A dense SwiGLU MLP (intermediate_size) on every layer.
void read_dense_mlp(const ConfigKeys& k, ModelConfig& c);

}  // namespace kvasir
