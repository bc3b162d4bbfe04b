// HF config.json → ModelConfig, checked against the committed fixtures (the
// values scripts/make_fixtures.py gave transformers, written out by hand
// here) and against the tensors those fixtures' model.safetensors hold.
#include "kvasir/core/error.hpp"
#include "kvasir/model/config.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/rope_frequencies.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using kvasir::Architecture;
using kvasir::Error;
using kvasir::ErrorCode;
using kvasir::LayerTensorNames;
using kvasir::TensorSpec;
using kvasir::layer_tensor_names;
using kvasir::layer_tensor_specs;
using kvasir::model_tensor_names;
using kvasir::ModelConfig;
using kvasir::RouterScoring;
using kvasir::Shape;
using json = nlohmann::json;
namespace fs = std::filesystem;

// A config.json as save_pretrained writes it: every size present
// (ConfigKeys::size: never guessed), the config class's default filled in where
// `text` leaves one out — for the tests about other keys. The values are
// transformers 5.24's defaults (Qwen3MoeConfig, Qwen2MoeConfig, ...).
std::string sized(const std::string& text) {
    json j = json::parse(text);
    std::string type = j.value("model_type", "");
    if (type.empty() && j.contains("architectures") && j["architectures"][0] == "MixtralForCausalLM") type = "mixtral";
    json s;
    if (type == "qwen3_moe")
        s = {{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 6144}, {"num_hidden_layers", 24},
             {"num_attention_heads", 32}, {"num_experts", 128}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 768}};
    else if (type == "qwen2_moe")
        s = {{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5632}, {"num_hidden_layers", 24},
             {"num_attention_heads", 16}, {"num_experts", 60}, {"num_experts_per_tok", 4}, {"moe_intermediate_size", 1408},
             {"shared_expert_intermediate_size", 5632}};
    else if (type == "mixtral")
        s = {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 14336}, {"num_hidden_layers", 32},
             {"num_attention_heads", 32}, {"num_local_experts", 8}, {"num_experts_per_tok", 2}};
    else if (type == "deepseek_v3")
        s = {{"vocab_size", 129280}, {"hidden_size", 7168}, {"intermediate_size", 18432}, {"num_hidden_layers", 61},
             {"num_attention_heads", 128}, {"n_routed_experts", 256}, {"num_experts_per_tok", 8},
             {"moe_intermediate_size", 2048}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
             {"kv_lora_rank", 512}, {"q_lora_rank", 1536}};
    else if (type == "qwen3_5_moe_text" || type == "qwen3_5_moe")
        s = {{"vocab_size", 248320}, {"hidden_size", 2048}, {"num_hidden_layers", 40}, {"num_attention_heads", 16},
             {"num_experts", 256}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 512},
             {"shared_expert_intermediate_size", 512}, {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128},
             {"linear_num_key_heads", 16}, {"linear_num_value_heads", 32}};
    else if (type == "qwen3_next")
        s = {{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5632}, {"num_hidden_layers", 48},
             {"num_attention_heads", 16}, {"num_experts", 512}, {"num_experts_per_tok", 10}, {"moe_intermediate_size", 512},
             {"shared_expert_intermediate_size", 512}, {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128},
             {"linear_num_key_heads", 16}, {"linear_num_value_heads", 32}};
    else if (type == "gpt_oss")
        s = {{"vocab_size", 201088}, {"hidden_size", 2880}, {"intermediate_size", 2880}, {"num_hidden_layers", 36},
             {"num_attention_heads", 64}, {"num_local_experts", 128}, {"num_experts_per_tok", 4}};
    else if (type == "qwen2" || type == "qwen3")
        s = {{"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 22016}, {"num_hidden_layers", 32},
             {"num_attention_heads", 32}};
    else if (type == "llama" || type == "mistral")
        s = {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", type == "llama" ? 11008 : 14336},
             {"num_hidden_layers", 32}, {"num_attention_heads", 32}};
    json* body = j.contains("text_config") && j["text_config"].is_object() ? &j["text_config"] : &j;
    for (const auto& [k, v] : s.items())
        if (!body->contains(k)) (*body)[k] = v;
    return j.dump();
}

const std::string kModels = std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/";

// ---------------------------------------------------------------------------
// A minimal safetensors header reader (8-byte little-endian length + JSON), so
// this test does not depend on the real reader.
// ---------------------------------------------------------------------------
struct HeaderEntry {
    std::string dtype;
    Shape shape;
    std::uint64_t begin = 0, end = 0;
};
struct Header {
    std::map<std::string, HeaderEntry> tensors;
    std::uint64_t data_start = 0;
};

Header read_header(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    unsigned char len[8] = {};
    in.read(reinterpret_cast<char*>(len), 8);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    EXPECT_LT(n, 100u << 20) << path;
    std::string text(n, '\0');
    in.read(text.data(), static_cast<std::streamsize>(n));
    const json j = json::parse(text);
    Header h;
    h.data_start = 8 + n;
    for (const auto& [name, v] : j.items()) {
        if (name == "__metadata__") continue;
        HeaderEntry e;
        e.dtype = v.at("dtype").get<std::string>();
        for (const auto& d : v.at("shape")) e.shape.push_back(d.get<std::int64_t>());
        e.begin = v.at("data_offsets").at(0).get<std::uint64_t>();
        e.end = v.at("data_offsets").at(1).get<std::uint64_t>();
        h.tensors.emplace(name, std::move(e));
    }
    return h;
}

std::vector<std::int32_t> read_i32(const std::string& path, const std::string& name) {
    const Header h = read_header(path);
    const HeaderEntry& e = h.tensors.at(name);
    EXPECT_EQ(e.dtype, "I32");
    std::ifstream in(path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(h.data_start + e.begin));
    std::vector<std::int32_t> out((e.end - e.begin) / 4);
    in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(e.end - e.begin));
    return out;
}

// ---------------------------------------------------------------------------
// What make_fixtures.py configured, by hand.
// ---------------------------------------------------------------------------
struct Expected {
    std::string dir;
    std::string dtype;  // of every weight in model.safetensors
    Architecture arch;
    std::int64_t hidden, layers, heads, kv_heads, head_dim;
    double rope_theta, eps;
    bool qk_norm, qkv_bias, o_bias;
    std::int64_t vocab;
    bool tied;
    std::int64_t experts, top_k;
    bool norm_topk;
    std::int64_t moe_ff, dense_ff, shared_ff;
    bool shared_gate;
    std::int64_t sparse_step;
    std::vector<std::int64_t> mlp_only;
    std::vector<bool> moe;
};

const std::vector<Expected>& fixtures() {
    static const std::vector<Expected> all = {
        {"qwen3_moe_tiny", "F32", Architecture::qwen3_moe, 96, 4, 4, 2, 32, 1e6, 1e-6, true, false, false, 384, false,
         8, 2, true, 64, 192, 0, false, 1, {2}, {true, true, false, true}},
        {"qwen3_moe_tiny_bf16", "BF16", Architecture::qwen3_moe, 96, 4, 4, 2, 32, 1e6, 1e-6, true, false, false, 384,
         false, 8, 2, true, 64, 192, 0, false, 1, {2}, {true, true, false, true}},
        {"mixtral_tiny", "F32", Architecture::mixtral, 64, 3, 4, 2, 16, 5e5, 1e-5, false, false, false, 320, false, 6,
         2, true, 96, 0, 0, false, 1, {}, {true, true, true}},
        {"qwen2_moe_tiny", "F32", Architecture::qwen2_moe, 64, 4, 4, 2, 16, 1e4, 1e-6, false, true, false, 352, true, 8,
         4, false, 32, 128, 96, true, 2, {}, {false, true, false, true}},
    };
    return all;
}

class FixtureConfig : public ::testing::TestWithParam<Expected> {};

TEST_P(FixtureConfig, EveryFieldMatchesTheScript) {
    const Expected& x = GetParam();
    const ModelConfig c = kvasir::load_model_config(kModels + x.dir);
    EXPECT_EQ(c.source, kModels + x.dir + "/config.json");
    EXPECT_EQ(c.architecture, x.arch);
    EXPECT_EQ(c.hidden_size, x.hidden);
    EXPECT_EQ(c.num_layers, x.layers);
    EXPECT_EQ(c.num_heads, x.heads);
    EXPECT_EQ(c.num_kv_heads, x.kv_heads);
    EXPECT_EQ(c.head_dim, x.head_dim);
    EXPECT_EQ(c.rope_theta, x.rope_theta);
    EXPECT_EQ(c.rope_type, "default");
    EXPECT_EQ(c.rms_norm_eps, x.eps);
    EXPECT_EQ(c.hidden_act, "silu");
    EXPECT_EQ(c.qk_norm, x.qk_norm);
    EXPECT_EQ(c.attention_bias, x.qkv_bias);
    EXPECT_EQ(c.attention_out_bias, x.o_bias);
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(c.max_position_embeddings, 1024);
    EXPECT_EQ(c.vocab_size, x.vocab);
    EXPECT_EQ(c.tie_word_embeddings, x.tied);
    EXPECT_EQ(c.num_experts(), x.experts);
    EXPECT_EQ(c.top_k(), x.top_k);
    EXPECT_EQ(c.norm_topk_prob(), x.norm_topk);
    EXPECT_EQ(c.moe_intermediate_size, x.moe_ff);
    EXPECT_EQ(c.intermediate_size, x.dense_ff);
    EXPECT_EQ(c.shared_expert_intermediate_size, x.shared_ff);
    EXPECT_EQ(c.has_shared_expert(), x.shared_ff > 0);
    EXPECT_EQ(c.shared_expert_gate, x.shared_gate);
    EXPECT_EQ(c.decoder_sparse_step, x.sparse_step);
    EXPECT_EQ(c.mlp_only_layers, x.mlp_only);
    EXPECT_EQ(c.moe_layers, x.moe);
    // Router: plain softmax top-k.
    EXPECT_EQ(c.router.scoring, RouterScoring::softmax);
    EXPECT_FALSE(c.router.score_correction_bias);
    EXPECT_EQ(c.router.n_group, 1);
    EXPECT_EQ(c.router.topk_group, 1);
    EXPECT_EQ(c.router.routed_scaling_factor, 1.0);
    std::int64_t moe = 0;
    for (std::int64_t l = 0; l < x.layers; ++l) {
        EXPECT_EQ(c.is_moe(l), x.moe[static_cast<std::size_t>(l)]) << "layer " << l;
        moe += x.moe[static_cast<std::size_t>(l)] ? 1 : 0;
    }
    EXPECT_EQ(c.num_moe_layers(), moe);
    EXPECT_THROW((void)c.is_moe(x.layers), Error);
    EXPECT_THROW((void)c.is_moe(-1), Error);
}

// The MoE layers transformers built (saved by the script as `moe_layers`)
// are the ones our rule picks.
TEST_P(FixtureConfig, MoeLayersAgreeWithTransformers) {
    const Expected& x = GetParam();
    const ModelConfig c = kvasir::load_model_config(kModels + x.dir);
    const std::vector<std::int32_t> hf = read_i32(kModels + x.dir + "/reference.safetensors", "moe_layers");
    std::vector<std::int32_t> ours;
    for (std::int64_t l = 0; l < c.num_layers; ++l)
        if (c.is_moe(l)) ours.push_back(static_cast<std::int32_t>(l));
    EXPECT_EQ(ours, hf);
}

// Layer 0's names all exist in the checkpoint, and in fact the specs of all
// layers plus the globals are exactly the checkpoint's tensors, with shapes.
TEST_P(FixtureConfig, TensorNamesAreTheCheckpointsTensors) {
    const Expected& x = GetParam();
    const ModelConfig c = kvasir::load_model_config(kModels + x.dir);
    const Header h = read_header(kModels + x.dir + "/model.safetensors");

    for (const kvasir::TensorSpec& t : kvasir::layer_tensor_specs(c, 0))
        EXPECT_TRUE(h.tensors.count(t.name)) << "layer 0 tensor " << t.name << " missing from " << x.dir;

    std::set<std::string> listed;
    auto check = [&](const std::vector<kvasir::TensorSpec>& specs) {
        for (const kvasir::TensorSpec& t : specs) {
            EXPECT_TRUE(listed.insert(t.name).second) << "listed twice: " << t.name;
            auto it = h.tensors.find(t.name);
            if (it == h.tensors.end()) {
                ADD_FAILURE() << t.name << " missing from " << x.dir;
                continue;
            }
            EXPECT_EQ(it->second.shape, t.shape) << t.name;
            EXPECT_EQ(it->second.dtype, x.dtype) << t.name;
        }
    };
    check(kvasir::model_tensor_specs(c));
    for (std::int64_t l = 0; l < c.num_layers; ++l) check(kvasir::layer_tensor_specs(c, l));
    for (const auto& [name, e] : h.tensors) EXPECT_TRUE(listed.count(name)) << "not described: " << name;
    EXPECT_EQ(listed.size(), h.tensors.size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureConfig, ::testing::ValuesIn(fixtures()),
                         [](const ::testing::TestParamInfo<Expected>& i) { return i.param.dir; });

TEST(ConfigNames, PerArchitectureNamingScheme) {
    const ModelConfig q3 = kvasir::load_model_config(kModels + "qwen3_moe_tiny");
    const kvasir::LayerTensorNames a = kvasir::layer_tensor_names(q3, 0);
    EXPECT_EQ(a.q_proj, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(a.q_norm, "model.layers.0.self_attn.q_norm.weight");
    EXPECT_EQ(a.k_norm, "model.layers.0.self_attn.k_norm.weight");
    EXPECT_EQ(a.q_bias, "");
    EXPECT_EQ(a.router, "model.layers.0.mlp.gate.weight");
    ASSERT_EQ(a.experts.size(), 8u);
    EXPECT_EQ(a.experts[7].gate, "model.layers.0.mlp.experts.7.gate_proj.weight");
    EXPECT_EQ(a.experts[7].up, "model.layers.0.mlp.experts.7.up_proj.weight");
    EXPECT_EQ(a.experts[7].down, "model.layers.0.mlp.experts.7.down_proj.weight");
    EXPECT_EQ(a.mlp_gate, "");
    const kvasir::LayerTensorNames dense = kvasir::layer_tensor_names(q3, 2);
    EXPECT_EQ(dense.mlp_gate, "model.layers.2.mlp.gate_proj.weight");
    EXPECT_EQ(dense.mlp_down, "model.layers.2.mlp.down_proj.weight");
    EXPECT_TRUE(dense.experts.empty());
    EXPECT_EQ(dense.router, "");
    EXPECT_EQ(kvasir::model_tensor_names(q3).lm_head, "lm_head.weight");

    const ModelConfig mx = kvasir::load_model_config(kModels + "mixtral_tiny");
    const kvasir::LayerTensorNames m = kvasir::layer_tensor_names(mx, 1);
    EXPECT_EQ(m.router, "model.layers.1.block_sparse_moe.gate.weight");
    EXPECT_EQ(m.experts[5].gate, "model.layers.1.block_sparse_moe.experts.5.w1.weight");
    EXPECT_EQ(m.experts[5].up, "model.layers.1.block_sparse_moe.experts.5.w3.weight");
    EXPECT_EQ(m.experts[5].down, "model.layers.1.block_sparse_moe.experts.5.w2.weight");
    EXPECT_EQ(m.q_norm, "");

    const ModelConfig q2 = kvasir::load_model_config(kModels + "qwen2_moe_tiny");
    const kvasir::LayerTensorNames s = kvasir::layer_tensor_names(q2, 1);
    EXPECT_EQ(s.q_bias, "model.layers.1.self_attn.q_proj.bias");
    EXPECT_EQ(s.v_bias, "model.layers.1.self_attn.v_proj.bias");
    EXPECT_EQ(s.o_bias, "");
    EXPECT_EQ(s.shared_gate, "model.layers.1.mlp.shared_expert.gate_proj.weight");
    EXPECT_EQ(s.shared_down, "model.layers.1.mlp.shared_expert.down_proj.weight");
    EXPECT_EQ(s.shared_expert_gate, "model.layers.1.mlp.shared_expert_gate.weight");
    EXPECT_EQ(kvasir::model_tensor_names(q2).lm_head, "model.embed_tokens.weight");  // tied
    EXPECT_THROW((void)kvasir::layer_tensor_names(q2, 4), Error);
}

// ---------------------------------------------------------------------------
// Other configs: real-world shapes, legacy keys, defaults, DeepSeek router.
// ---------------------------------------------------------------------------
TEST(ConfigParse, LegacyQwen15MoeConfig) {
    // Qwen1.5-MoE-A2.7B's config.json (transformers 4.x: top-level rope_theta, no qkv_bias key).
    const char* text = R"({
      "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
      "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
      "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
      "num_experts_per_tok": 4, "norm_topk_prob": false, "decoder_sparse_step": 1, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "max_position_embeddings": 8192, "vocab_size": 151936, "tie_word_embeddings": false,
      "use_sliding_window": false, "sliding_window": 32768, "hidden_act": "silu", "torch_dtype": "bfloat16"})";
    const ModelConfig c = kvasir::parse_model_config(text, "qwen15/config.json");
    EXPECT_EQ(c.architecture, Architecture::qwen2_moe);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_TRUE(c.attention_bias);  // Qwen2MoeConfig.qkv_bias defaults to True
    EXPECT_FALSE(c.attention_out_bias);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
    EXPECT_EQ(c.num_moe_layers(), 24);
    EXPECT_TRUE(c.shared_expert_gate);
    EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
}

TEST(ConfigParse, Mixtral8x7bConfig) {
    const char* text = R"({
      "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
      "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-05, "rope_theta": 1e6,
      "sliding_window": null, "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": false})";
    const ModelConfig c = kvasir::parse_model_config(text, "mixtral/config.json");
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.moe_intermediate_size, 14336);
    EXPECT_EQ(c.intermediate_size, 0);
    EXPECT_TRUE(c.norm_topk_prob());
    EXPECT_EQ(c.num_moe_layers(), 32);
    EXPECT_EQ(c.sliding_window, 0);
}

TEST(ConfigParse, MissingSizesAreRefusedOtherKeysTakeTheTransformersDefaults) {
    // A size is never guessed: each one left out of a full config is refused naming it (transformers would
    // take its config class's default, e.g. hidden_size 2048 — another model's width).
    const json full = json::parse(sized(R"({"model_type": "qwen3_moe"})"));
    const auto expect_error = [](const json& j, std::initializer_list<std::string> needles) {
        try {
            (void)kvasir::parse_model_config(j.dump(), "min/config.json");
            ADD_FAILURE() << "accepted: " << j.dump();
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
            for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
        }
    };
    for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
                            "moe_intermediate_size", "num_experts_per_tok"}) {
        json j = full;
        j.erase(key);
        expect_error(j, {std::string("required key \"") + key + "\" is missing"});
    }
    json no_experts = full;
    no_experts.erase("num_experts");
    expect_error(no_experts, {"required key \"num_experts\" (or \"num_local_experts\") is missing"});
    // The rest takes the defaults of Qwen3MoeConfig.
    const ModelConfig c = kvasir::parse_model_config(full.dump(), "min/config.json");
    EXPECT_EQ(c.hidden_size, 2048);
    EXPECT_EQ(c.num_kv_heads, 4);
    EXPECT_EQ(c.head_dim, 64);  // hidden_size / num_attention_heads
    EXPECT_FALSE(c.norm_topk_prob());
    EXPECT_EQ(c.rope_theta, 10000.0);
    EXPECT_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_EQ(c.num_moe_layers(), 24);

    // No model_type: the architecture comes from `architectures`.
    const ModelConfig m = kvasir::parse_model_config(sized(R"({"architectures": ["MixtralForCausalLM"]})"), "a/config.json");
    EXPECT_EQ(m.architecture, Architecture::mixtral);
    EXPECT_EQ(m.rope_theta, 1e6);  // MixtralConfig.default_theta
    EXPECT_EQ(m.rms_norm_eps, 1e-5);
}

TEST(ConfigParse, SparseStepAndMlpOnlyLayersCombine) {
    // (l+1) % 3 == 0 → layers 2, 5; mlp_only_layers removes 5.
    const ModelConfig c = kvasir::parse_model_config(
        sized(R"({"model_type": "qwen2_moe", "num_hidden_layers": 7, "decoder_sparse_step": 3, "mlp_only_layers": [5, 0]})"),
        "s/config.json");
    EXPECT_EQ(c.moe_layers, (std::vector<bool>{false, false, true, false, false, false, false}));
}

TEST(ConfigParse, RopeParametersWinOverTopLevelRopeTheta) {
    const ModelConfig c = kvasir::parse_model_config(
        sized(R"({"model_type": "qwen3_moe", "rope_theta": 5.0, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 7.0}})"),
        "r/config.json");
    EXPECT_EQ(c.rope_theta, 7.0);
    EXPECT_EQ(c.rope_type, "dynamic");
    const ModelConfig d = kvasir::parse_model_config(
        sized(R"({"model_type": "qwen3_moe", "rope_theta": 5.0, "rope_scaling": {"type": "linear", "factor": 2.0}})"),
        "r/config.json");
    EXPECT_EQ(d.rope_theta, 5.0);
    EXPECT_EQ(d.rope_type, "linear");
}

TEST(ConfigParse, DeepSeekV3MlaRouterAndLayers) {
    // deepseek-ai/DeepSeek-V3 config.json (abridged to the keys that matter here).
    const char* text = R"({
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
      "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
      "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
      "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
      "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096, "type": "yarn"},
      "rope_theta": 10000, "tie_word_embeddings": false, "vocab_size": 129280})";
    const ModelConfig c = kvasir::parse_model_config(text, "dsv3/config.json");
    EXPECT_EQ(c.architecture, Architecture::deepseek_v3);
    EXPECT_EQ(c.router.scoring, RouterScoring::sigmoid);
    EXPECT_TRUE(c.router.score_correction_bias);
    EXPECT_EQ(c.router.num_experts, 256);
    EXPECT_EQ(c.router.top_k, 8);
    EXPECT_EQ(c.router.n_group, 8);
    EXPECT_EQ(c.router.topk_group, 4);
    EXPECT_EQ(c.router.routed_scaling_factor, 2.5);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
    EXPECT_FALSE(c.shared_expert_gate);
    EXPECT_EQ(c.rope_type, "yarn");
    EXPECT_FALSE(c.is_moe(2));
    EXPECT_TRUE(c.is_moe(3));
    EXPECT_EQ(c.num_moe_layers(), 58);
    // MLA: q·k over 128 + 64, values 128, rope on the last 64 dims; the softmax scale 192^-1/2 · m², m =
    // 0.1·1·ln 40 + 1 (yarn_get_mscale(40, mscale_all_dim 1)); the cos/sin factor m(40,1)/m(40,1) = 1.
    ASSERT_TRUE(c.has_mla());
    EXPECT_EQ(c.mla.q_lora_rank, 1536);
    EXPECT_EQ(c.mla.kv_lora_rank, 512);
    EXPECT_EQ(c.head_dim, 192);
    EXPECT_EQ(c.rotary_dims(), 64);
    EXPECT_EQ(c.value_head_dim(), 128);
    EXPECT_EQ(c.attention_width(), 192);
    EXPECT_TRUE(c.mla.rope_interleave);
    const double m = 0.1 * std::log(40.0) + 1.0;
    EXPECT_DOUBLE_EQ(kvasir::attention_scale(c), m * m / std::sqrt(192.0));
    EXPECT_DOUBLE_EQ(kvasir::rope_attention_factor(c), 1.0);
    EXPECT_EQ(kvasir::rope_inverse_frequencies(c).size(), 32u);
    const kvasir::LayerTensorNames n = kvasir::layer_tensor_names(c, 3);
    EXPECT_EQ(n.router, "model.layers.3.mlp.gate.weight");
    EXPECT_EQ(n.router_bias, "model.layers.3.mlp.gate.e_score_correction_bias");
    EXPECT_EQ(n.experts[255].down, "model.layers.3.mlp.experts.255.down_proj.weight");
    EXPECT_EQ(n.shared_up, "model.layers.3.mlp.shared_experts.up_proj.weight");
    EXPECT_EQ(n.shared_expert_gate, "");
    EXPECT_EQ(n.q_proj, "");  // q-LoRA instead
    EXPECT_EQ(n.k_proj, "");
    EXPECT_EQ(n.q_a_proj, "model.layers.3.self_attn.q_a_proj.weight");
    EXPECT_EQ(n.q_a_norm, "model.layers.3.self_attn.q_a_layernorm.weight");
    EXPECT_EQ(n.kv_a_proj, "model.layers.3.self_attn.kv_a_proj_with_mqa.weight");
    EXPECT_EQ(n.kv_b_proj, "model.layers.3.self_attn.kv_b_proj.weight");
    const kvasir::LayerTensorNames d = kvasir::layer_tensor_names(c, 0);
    EXPECT_EQ(d.mlp_up, "model.layers.0.mlp.up_proj.weight");
    const auto specs = kvasir::layer_tensor_specs(c, 3);
    EXPECT_EQ(specs.size(), 2u + 7u + 2u + 3u * 256u + 3u);  // norms, MLA (3 + 3 + o), router + bias, experts, shared
    const auto shape_of = [&](const std::string& name) {
        for (const auto& t : specs)
            if (t.name == name) return t.shape;
        return kvasir::Shape{};
    };
    EXPECT_EQ(shape_of(n.q_b_proj), (kvasir::Shape{128 * 192, 1536}));
    EXPECT_EQ(shape_of(n.kv_a_proj), (kvasir::Shape{512 + 64, 7168}));
    EXPECT_EQ(shape_of(n.kv_b_proj), (kvasir::Shape{128 * (128 + 128), 512}));
    EXPECT_EQ(shape_of(n.o_proj), (kvasir::Shape{7168, 128 * 128}));
}

TEST(ConfigParse, KimiK2IsDeepSeekV3WithoutQLoraOrGroups) {
    // moonshotai/Kimi-K2-Instruct config.json (abridged).
    const char* text = R"({
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
      "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384,
      "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
      "num_experts_per_tok": 8, "first_k_dense_replace": 1, "norm_topk_prob": true, "scoring_func": "sigmoid",
      "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
      "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096, "type": "yarn"},
      "rope_theta": 50000.0, "vocab_size": 163840})";
    // Kimi's own model_type (remote code over DeepseekV3ForCausalLM): read as deepseek_v3.
    const ModelConfig c = kvasir::parse_model_config(text, "kimi/config.json");
    EXPECT_EQ(c.architecture, Architecture::deepseek_v3);
    EXPECT_EQ(c.router.n_group, 1);
    EXPECT_EQ(c.router.num_experts, 384);
    EXPECT_EQ(c.router.routed_scaling_factor, 2.827);
    EXPECT_EQ(c.mla.q_lora_rank, 1536);
    EXPECT_EQ(c.first_k_dense_replace, 1);
    // Without q-LoRA (Kimi-K2-style tiny fixtures, DeepSeek-V2-Lite): a plain q_proj.
    json j = json::parse(text);
    j["q_lora_rank"] = nullptr;
    const ModelConfig p = kvasir::parse_model_config(j.dump(), "kimi/config.json");
    EXPECT_EQ(p.mla.q_lora_rank, 0);
    const kvasir::LayerTensorNames n = kvasir::layer_tensor_names(p, 1);
    EXPECT_EQ(n.q_proj, "model.layers.1.self_attn.q_proj.weight");
    EXPECT_EQ(n.q_a_proj, "");
}

TEST(ConfigParse, Glm45GqaPartialRotarySigmoidRouter) {
    // zai-org/GLM-4.5 config.json (abridged).
    const char* text = R"({
      "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": true,
      "first_k_dense_replace": 3, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
      "intermediate_size": 12288, "max_position_embeddings": 131072, "moe_intermediate_size": 1536,
      "n_group": 1, "n_routed_experts": 160, "n_shared_experts": 1, "norm_topk_prob": true,
      "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 92, "num_key_value_heads": 8,
      "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
      "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 1, "use_qk_norm": true,
      "vocab_size": 151552})";
    const ModelConfig c = kvasir::parse_model_config(text, "glm/config.json");
    EXPECT_EQ(c.architecture, Architecture::glm4_moe);
    EXPECT_FALSE(c.has_mla());
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.rotary_dims(), 64);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_TRUE(c.attention_bias);
    EXPECT_FALSE(c.attention_out_bias);  // Glm4MoeAttention.o_proj has no bias
    EXPECT_EQ(c.router.scoring, RouterScoring::sigmoid);
    EXPECT_TRUE(c.router.score_correction_bias);
    EXPECT_EQ(c.router.num_experts, 160);
    EXPECT_EQ(c.router.routed_scaling_factor, 2.5);
    EXPECT_EQ(c.shared_expert_intermediate_size, 1536);
    EXPECT_EQ(c.num_moe_layers(), 89);
    EXPECT_FALSE(c.is_moe(2));
    const kvasir::LayerTensorNames n = kvasir::layer_tensor_names(c, 3);
    EXPECT_EQ(n.q_bias, "model.layers.3.self_attn.q_proj.bias");
    EXPECT_EQ(n.o_bias, "");
    EXPECT_EQ(n.q_norm, "model.layers.3.self_attn.q_norm.weight");
    EXPECT_EQ(n.router_bias, "model.layers.3.mlp.gate.e_score_correction_bias");
    EXPECT_EQ(n.shared_down, "model.layers.3.mlp.shared_experts.down_proj.weight");
    // The defaults of Glm4MoeConfig: partial rotary 0.5, groups 1/1, scaling 1, one dense layer, no q/k norm.
    json j = json::parse(text);
    for (const char* key : {"partial_rotary_factor", "n_group", "topk_group", "routed_scaling_factor",
                            "first_k_dense_replace", "use_qk_norm", "attention_bias"})
        j.erase(key);
    const ModelConfig d = kvasir::parse_model_config(j.dump(), "glm/config.json");
    EXPECT_EQ(d.partial_rotary_factor, 0.5);
    EXPECT_EQ(d.router.n_group, 1);
    EXPECT_EQ(d.router.routed_scaling_factor, 1.0);
    EXPECT_EQ(d.first_k_dense_replace, 1);
    EXPECT_FALSE(d.qk_norm);
    EXPECT_FALSE(d.attention_bias);
}

// ---------------------------------------------------------------------------
// Errors: Error(bad_input), one line, "SOURCE: ..." naming the key.
// ---------------------------------------------------------------------------
json base_config() {
    std::ifstream in(kModels + "qwen3_moe_tiny/config.json");
    return json::parse(in);
}

void expect_error(const std::string& text, std::initializer_list<std::string> needles,
                  ErrorCode code = ErrorCode::bad_input) {
    const std::string src = "bad/config.json";
    try {
        (void)kvasir::parse_model_config(text, src);
        ADD_FAILURE() << "no error for: " << text.substr(0, 200);
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.code(), code) << msg;
        EXPECT_EQ(msg.rfind(src + ": ", 0), 0u) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    }
}

void expect_error(const json& j, std::initializer_list<std::string> needles, ErrorCode code = ErrorCode::bad_input) {
    expect_error(j.dump(), needles, code);
}

json with(const char* key, json value) {
    json j = base_config();
    j[key] = std::move(value);
    return j;
}

TEST(ConfigErrors, UnknownArchitectureListsTheSupportedOnes) {
    json j = base_config();
    j["model_type"] = "falcon";
    j["architectures"] = {"FalconForCausalLM"};
    expect_error(j, {"model_type", "\"falcon\"", "qwen2_moe, qwen3_moe, mixtral", "llama, mistral, qwen2, qwen3"});
    j.erase("model_type");
    expect_error(j, {"architectures", "FalconForCausalLM", "qwen2_moe, qwen3_moe, mixtral"});
    j.erase("architectures");
    expect_error(j, {"model_type", "qwen2_moe, qwen3_moe, mixtral"});
    expect_error(with("architectures", {"MixtralForCausalLM"}), {"architectures", "does not match model_type"});
    expect_error(with("model_type", 3), {"model_type must be a string"});
}

TEST(ConfigErrors, BadValuesNameTheKey) {
    expect_error(with("hidden_size", -5), {"hidden_size", "out of range"});
    expect_error(with("hidden_size", 0), {"hidden_size"});
    expect_error(with("hidden_size", "96"), {"hidden_size must be an integer", "\"96\""});
    expect_error(with("hidden_size", 96.5), {"hidden_size must be an integer"});
    expect_error(with("hidden_size", std::int64_t{1} << 30), {"hidden_size", "out of range"});
    expect_error(with("hidden_size", std::uint64_t{18446744073709551615u}), {"hidden_size", "out of range"});
    expect_error(with("hidden_size", nullptr), {"hidden_size must be an integer, got null"});
    expect_error(with("num_hidden_layers", 0), {"num_hidden_layers"});
    expect_error(with("num_key_value_heads", 3), {"num_key_value_heads (3) must divide num_attention_heads (4)"});
    expect_error(with("num_experts_per_tok", 9), {"num_experts_per_tok (9)", "num_experts = 8"});
    expect_error(with("num_experts_per_tok", 0), {"num_experts_per_tok"});
    expect_error(with("num_local_experts", 0), {"num_local_experts"});
    expect_error(with("head_dim", 31), {"head_dim (31) must be even"});
    expect_error(with("vocab_size", std::int64_t{1} << 21), {"vocab_size"});
    expect_error(with("rms_norm_eps", 0), {"rms_norm_eps"});
    expect_error(with("rms_norm_eps", "1e-6"), {"rms_norm_eps must be a number"});
    expect_error(with("decoder_sparse_step", 0), {"decoder_sparse_step"});
    expect_error(with("mlp_only_layers", {7}), {"mlp_only_layers = 7", "out of range [0, 3]"});
    expect_error(with("mlp_only_layers", {-1}), {"mlp_only_layers"});
    expect_error(with("mlp_only_layers", "2"), {"mlp_only_layers must be a list"});
    expect_error(with("tie_word_embeddings", 1), {"tie_word_embeddings must be true or false"});
    expect_error(with("norm_topk_prob", "yes"), {"norm_topk_prob"});
    expect_error(with("moe_intermediate_size", 0), {"moe_intermediate_size"});
    expect_error(with("max_position_embeddings", -1), {"max_position_embeddings"});
    expect_error(with("hidden_act", "gelu"), {"hidden_act", "gelu"}, ErrorCode::unsupported);
    {
        json j = base_config();
        j["rope_parameters"]["rope_theta"] = -1.0;
        expect_error(j, {"rope_parameters.rope_theta", "out of range"});
        j["rope_parameters"] = 5;
        expect_error(j, {"rope_parameters must be an object"});
    }
    {
        json j = base_config();  // both spellings of the expert count, disagreeing
        j["num_experts"] = 4;
        expect_error(j, {"num_experts (4) and num_local_experts (8) disagree"});
        j["num_experts"] = 8;
        EXPECT_EQ(kvasir::parse_model_config(j.dump(), "ok/config.json").num_experts(), 8);
    }
    {
        json j = base_config();  // no head_dim and hidden not divisible by heads
        j.erase("head_dim");
        j["num_attention_heads"] = 5;
        j["num_key_value_heads"] = 5;
        expect_error(j, {"head_dim is not given", "hidden_size (96)", "num_attention_heads (5)"});
    }
}

TEST(ConfigErrors, DeepSeekGroupsMustFit) {
    const std::string base = R"({"model_type": "deepseek_v3", "n_routed_experts": 64, "num_experts_per_tok": 6,
                                 "num_hidden_layers": 4, )";
    expect_error(sized(base + R"("n_group": 5, "topk_group": 2})"), {"n_group (5) must divide n_routed_experts (64)"});
    expect_error(sized(base + R"("n_group": 8, "topk_group": 9})"), {"topk_group (9)"});
    expect_error(sized(base + R"("n_group": 16, "topk_group": 1})"),
                 {"num_experts_per_tok (6) exceeds", "topk_group (1) groups of 4"});
    expect_error(sized(base + R"("n_group": 64, "topk_group": 1})"), {"fewer than 2 experts per group"});
    expect_error(sized(base + R"("n_group": 8, "topk_group": 4, "scoring_func": "softmax"})"), {"scoring_func", "softmax"});
    expect_error(sized(base + R"("n_group": 8, "topk_group": 4, "routed_scaling_factor": 0})"), {"routed_scaling_factor"});
    expect_error(sized(base + R"("n_group": 8, "topk_group": 4, "first_k_dense_replace": 5})"),
                 {"first_k_dense_replace = 5", "out of range [0, 4]"});
    // MLA: q_lora_rank must be given (null = a plain q_proj); one kv head per head.
    json no_q = json::parse(sized(base + R"("n_group": 8, "topk_group": 4})"));
    no_q.erase("q_lora_rank");
    expect_error(no_q.dump(), {"q_lora_rank is required"});
    expect_error(sized(base + R"("n_group": 8, "topk_group": 4, "num_key_value_heads": 16})"),
                 {"num_key_value_heads 16 != num_attention_heads 128", "MLA"}, ErrorCode::unsupported);
    expect_error(sized(base + R"("n_group": 8, "topk_group": 4, "qk_rope_head_dim": 7, "qk_nope_head_dim": 127})"),
                 {"even qk_rope_head_dim (7)"});
    expect_error(sized(base + R"("n_group": 8, "topk_group": 4, "topk_method": "group_limited_greedy"})"),
                 {"topk_method \"group_limited_greedy\""}, ErrorCode::unsupported);
    const ModelConfig ok = kvasir::parse_model_config(sized(base + R"("n_group": 8, "topk_group": 4, "first_k_dense_replace": 1})"),
                                                      "ok/config.json");
    EXPECT_EQ(ok.moe_layers, (std::vector<bool>{false, true, true, true}));
}

TEST(ConfigErrors, MalformedJson) {
    expect_error(std::string("{\"model_type\": \"qwen3_moe\",\n"), {"invalid JSON"});
    expect_error(std::string("[1, 2]"), {"top level must be a JSON object", "array"});
    expect_error(std::string("\"qwen3_moe\""), {"top level must be a JSON object"});
    expect_error(std::string("{\"model_type\": \"qwen3\xff_moe\"}"), {"invalid JSON"});
    expect_error(std::string(""), {"invalid JSON"});
}

class TempDir {
public:
    TempDir() {
        std::string tmpl = (fs::temp_directory_path() / "kvasir_test_config_XXXXXX").string();
        path_ = ::mkdtemp(tmpl.data());
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

TEST(ConfigErrors, FilesAndFolders) {
    TempDir tmp;
    ASSERT_FALSE(tmp.path().empty());
    // A folder without config.json.
    try {
        (void)kvasir::load_model_config(tmp.path());
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find(tmp.path() + "/config.json: no such file"), std::string::npos) << e.what();
    }
    // A bad value in a file: the message names the file path and the key.
    {
        std::ofstream out(tmp.path() + "/config.json");
        json j = base_config();
        j["num_experts_per_tok"] = 100;
        out << j.dump(2);
    }
    for (const std::string& arg : {tmp.path(), tmp.path() + "/config.json"}) {
        try {
            (void)kvasir::load_model_config(arg);
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(e.code(), ErrorCode::bad_input);
            EXPECT_EQ(msg.rfind(tmp.path() + "/config.json: num_experts_per_tok", 0), 0u) << msg;
        }
    }
    EXPECT_THROW((void)kvasir::load_model_config(tmp.path() + "/nope.json"), Error);
}

TEST(ConfigValidate, ConfigsBuiltElsewhereAreChecked) {
    ModelConfig c = kvasir::load_model_config(kModels + "qwen3_moe_tiny");
    EXPECT_NO_THROW(kvasir::validate_model_config(c));
    c.source = "model.gguf";
    c.router.top_k = 9;
    try {
        kvasir::validate_model_config(c);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("model.gguf: num_experts_per_tok (9)", 0), 0u) << e.what();
    }
    c.router.top_k = 2;
    c.moe_layers.pop_back();
    EXPECT_THROW(kvasir::validate_model_config(c), Error);
}

}  // namespace

// --- the hybrid families (issue #23): configs as transformers 5.24 writes them ---

namespace {

// A Qwen3_5MoeConfig as save_pretrained writes it: the multimodal wrapper,
// the text model under text_config (vision_config trimmed to what we read).
const char* kQwen35Wrapper = R"({
  "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
  "image_token_id": 248056,
  "text_config": {"model_type": "qwen3_5_moe_text", "vocab_size": 384, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts_per_tok": 4, "num_experts": 16,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": true},
    "rms_norm_eps": 1e-06, "tie_word_embeddings": false},
  "vision_config": {"depth": 1, "hidden_size": 16}
})";

}  // namespace

TEST(ConfigHybrid, Qwen35MoeWrapperReadsTheTextConfigAndEveryHybridKey) {
    const ModelConfig c = kvasir::parse_model_config(kQwen35Wrapper, "q35/config.json");
    EXPECT_EQ(c.architecture, Architecture::qwen3_5_moe);
    EXPECT_TRUE(c.multimodal_wrapper);
    EXPECT_EQ(c.tensor_prefix, "model.language_model.");
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.num_layers, 4);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.rope_theta, 1e7);
    EXPECT_EQ(c.partial_rotary_factor, 0.25);
    EXPECT_TRUE(c.attention_output_gate);
    EXPECT_TRUE(c.norm_weight_offset);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_EQ(c.linear_attention_layers, (std::vector<bool>{true, true, true, false}));
    EXPECT_EQ(c.linear.conv_dim(), 2 * 2 * 8 + 4 * 8);
    EXPECT_EQ(c.moe_layers, (std::vector<bool>{true, true, true, true}));  // every layer's MLP is the MoE block
    EXPECT_EQ(c.num_experts(), 16);
    EXPECT_EQ(c.top_k(), 4);
    EXPECT_TRUE(c.norm_topk_prob());  // Qwen3_5MoeTopKRouter renormalises unconditionally
    EXPECT_EQ(c.shared_expert_intermediate_size, 32);
    EXPECT_TRUE(c.shared_expert_gate);
    // Tensor names under the wrapper's prefix; a linear layer has no self_attn.
    const LayerTensorNames lin = layer_tensor_names(c, 0);
    EXPECT_EQ(lin.in_proj_qkv, "model.language_model.layers.0.linear_attn.in_proj_qkv.weight");
    EXPECT_EQ(lin.a_log, "model.language_model.layers.0.linear_attn.A_log");
    EXPECT_TRUE(lin.q_proj.empty());
    const LayerTensorNames full = layer_tensor_names(c, 3);
    EXPECT_EQ(full.q_proj, "model.language_model.layers.3.self_attn.q_proj.weight");
    EXPECT_TRUE(full.in_proj_qkv.empty());
    EXPECT_EQ(model_tensor_names(c).embed, "model.language_model.embed_tokens.weight");
    EXPECT_EQ(model_tensor_names(c).lm_head, "lm_head.weight");
    // Shapes: q_proj yields query and gate; the conv is depthwise [C, 1, K].
    std::map<std::string, Shape> specs;
    for (const TensorSpec& s : layer_tensor_specs(c, 3)) specs[s.name] = s.shape;
    EXPECT_EQ(specs.at(full.q_proj), (Shape{2 * 4 * 16, 64}));
    for (const TensorSpec& s : layer_tensor_specs(c, 0)) specs[s.name] = s.shape;
    EXPECT_EQ(specs.at(lin.conv1d), (Shape{32 + 32, 1, 4}));
    EXPECT_EQ(specs.at(lin.out_proj), (Shape{64, 32}));
    // Fused experts: two tensors per layer instead of 3·E.
    ModelConfig fused = c;
    fused.fused_experts = true;
    const LayerTensorNames fn = layer_tensor_names(fused, 1);
    EXPECT_TRUE(fn.experts.empty());
    EXPECT_EQ(fn.fused_gate_up, "model.language_model.layers.1.mlp.experts.gate_up_proj");
    for (const TensorSpec& s : layer_tensor_specs(fused, 1)) specs[s.name] = s.shape;
    EXPECT_EQ(specs.at(fn.fused_gate_up), (Shape{16, 64, 64}));
    EXPECT_EQ(specs.at(fn.fused_down), (Shape{16, 64, 32}));
}

TEST(ConfigHybrid, TextOnlyQwen35AndQwen3NextAndTheirDefaults) {
    const ModelConfig t = kvasir::parse_model_config(
        sized(R"({"model_type": "qwen3_5_moe_text", "num_hidden_layers": 8, "full_attention_interval": 4})"), "t/config.json");
    EXPECT_EQ(t.architecture, Architecture::qwen3_5_moe);
    EXPECT_FALSE(t.multimodal_wrapper);
    EXPECT_EQ(t.tensor_prefix, "model.");
    // Qwen3_5MoeTextConfig defaults (the released 35B-A3B): 256 experts of 512, top-8, head_dim 256.
    EXPECT_EQ(t.num_experts(), 256);
    EXPECT_EQ(t.top_k(), 8);
    EXPECT_EQ(t.moe_intermediate_size, 512);
    EXPECT_EQ(t.head_dim, 256);
    EXPECT_EQ(t.vocab_size, 248320);
    EXPECT_EQ(t.partial_rotary_factor, 0.25);
    // full_attention_interval 4: layers 3 and 7 are full attention.
    EXPECT_EQ(t.linear_attention_layers, (std::vector<bool>{true, true, true, false, true, true, true, false}));

    const ModelConfig n = kvasir::parse_model_config(
        sized(R"({"model_type": "qwen3_next", "num_hidden_layers": 4, "mlp_only_layers": [1], "norm_topk_prob": false})"),
        "n/config.json");
    EXPECT_EQ(n.architecture, Architecture::qwen3_next);
    EXPECT_EQ(n.moe_layers, (std::vector<bool>{true, false, true, true}));
    EXPECT_FALSE(n.norm_topk_prob());
    EXPECT_EQ(n.num_experts(), 512);  // Qwen3NextConfig defaults
    EXPECT_EQ(n.top_k(), 10);
    EXPECT_EQ(layer_tensor_names(n, 0).in_proj_qkvz, "model.layers.0.linear_attn.in_proj_qkvz.weight");
    EXPECT_EQ(layer_tensor_names(n, 1).mlp_gate, "model.layers.1.mlp.gate_proj.weight");
}

TEST(ConfigHybrid, BadHybridConfigsAreRefusedNamingTheKey) {
    const auto refused = [](const std::string& text, const std::string& part) {
        try {
            (void)kvasir::parse_model_config(text.find("text_config\": 7") != std::string::npos ? text : sized(text), "bad/config.json");
            ADD_FAILURE() << "accepted: " << text;
        } catch (const kvasir::Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
            EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
        }
    };
    refused(R"({"model_type": "qwen3_5_moe_text", "num_hidden_layers": 2, "layer_types": ["full_attention"]})",
            "layer_types must list one type per layer (2)");
    refused(R"({"model_type": "qwen3_5_moe_text", "num_hidden_layers": 1, "layer_types": ["mamba"]})", "layer_types[0]");
    refused(R"({"model_type": "qwen3_5_moe_text", "linear_num_key_heads": 3, "linear_num_value_heads": 4})",
            "linear_num_key_heads (3) must divide linear_num_value_heads (4)");
    refused(R"({"model_type": "qwen3_5_moe_text", "head_dim": 16, "partial_rotary_factor": 0.3})",
            "partial_rotary_factor");
    refused(R"({"model_type": "qwen3_5_moe", "text_config": 7})", "text_config must be an object");
}

// ---------------------------------------------------------------------------
// Dense decoders: llama (llama3 rope scaling), mistral, qwen2, qwen3.
// ---------------------------------------------------------------------------
namespace {

const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "attention_bias": false,
  "mlp_bias": false, "tie_word_embeddings": false, "hidden_act": "silu", "torch_dtype": "bfloat16",
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";

}  // namespace

TEST(ConfigParse, Llama31With3RopeScalingIsDense) {
    // meta-llama/Llama-3.1-8B's config.json (transformers 4.x keys).
    const kvasir::ModelConfig c = kvasir::parse_model_config(kLlama31_8B, "llama31/config.json");
    EXPECT_EQ(c.architecture, Architecture::llama);
    EXPECT_EQ(c.head_dim, 128);  // hidden / heads
    EXPECT_EQ(c.num_kv_heads, 8);
    EXPECT_EQ(c.rope_theta, 500000.0);
    EXPECT_EQ(c.rope_type, "llama3");
    EXPECT_EQ(c.rope_scaling.factor, 8.0);
    EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
    EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192.0);
    EXPECT_EQ(c.intermediate_size, 14336);
    EXPECT_FALSE(c.has_moe());
    EXPECT_EQ(c.num_moe_layers(), 0);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.sliding_window, 0);
    for (std::int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.attention_window(l), 0);
    const LayerTensorNames n = kvasir::layer_tensor_names(c, 3);
    EXPECT_EQ(n.mlp_gate, "model.layers.3.mlp.gate_proj.weight");  // a dense MLP, no router, no biases
    EXPECT_TRUE(n.router.empty());
    EXPECT_TRUE(n.q_bias.empty());
    EXPECT_TRUE(n.q_norm.empty());
}

TEST(ConfigErrors, Llama3RopeScalingNeedsItsKeysAndMlpBiasIsRefused) {
    json j = json::parse(kLlama31_8B);
    j["rope_scaling"].erase("low_freq_factor");
    expect_error(j, {"rope_scaling.low_freq_factor is required for rope_type llama3"});
    j = json::parse(kLlama31_8B);
    j["rope_scaling"]["high_freq_factor"] = 0.5;
    expect_error(j, {"high_freq_factor (0.5) must exceed low_freq_factor (1)"});
    j = json::parse(kLlama31_8B);
    j["rope_scaling"]["factor"] = "8";
    expect_error(j, {"rope_scaling.factor"});
    j = json::parse(kLlama31_8B);
    j["mlp_bias"] = true;
    expect_error(j, {"mlp_bias true"}, ErrorCode::unsupported);
}

TEST(ConfigParse, MistralSlidesOnEveryLayerQwen2OnTheLayersItsConfigNames) {
    // mistralai/Mistral-7B-v0.1: sliding_window 4096, no layer_types → every layer.
    const kvasir::ModelConfig m = kvasir::parse_model_config(sized(R"({
      "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
      "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
      "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false})"),
                                                              "mistral/config.json");
    EXPECT_EQ(m.architecture, Architecture::mistral);
    EXPECT_FALSE(m.attention_bias);
    for (std::int64_t l = 0; l < m.num_layers; ++l) EXPECT_EQ(m.attention_window(l), 4096) << l;
    // Mistral-7B-v0.3 and later: sliding_window null → full attention.
    const kvasir::ModelConfig m3 = kvasir::parse_model_config(
        sized(R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": null})"), "m3/config.json");
    EXPECT_EQ(m3.attention_window(0), 0);

    // Qwen2.5-7B: use_sliding_window false → full attention everywhere, whatever sliding_window says.
    const char* qwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
      "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
      "vocab_size": 152064, "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": false,
      "max_window_layers": 28, "tie_word_embeddings": false})";
    const kvasir::ModelConfig q = kvasir::parse_model_config(qwen25, "qwen25/config.json");
    EXPECT_EQ(q.architecture, Architecture::qwen2);
    EXPECT_TRUE(q.attention_bias);        // Qwen2Attention: q/k/v bias always
    EXPECT_FALSE(q.attention_out_bias);   // o_proj none
    EXPECT_EQ(q.head_dim, 128);
    EXPECT_EQ(q.sliding_window, 0);
    // use_sliding_window true, no layer_types: the layers >= max_window_layers slide (Qwen2Config's rule).
    json j = json::parse(qwen25);
    j["use_sliding_window"] = true;
    j["sliding_window"] = 64;
    j["num_hidden_layers"] = 4;
    j["max_window_layers"] = 2;
    const kvasir::ModelConfig s = kvasir::parse_model_config(j.dump(), "s/config.json");
    EXPECT_EQ(s.attention_window(0), 0);
    EXPECT_EQ(s.attention_window(1), 0);
    EXPECT_EQ(s.attention_window(2), 64);
    EXPECT_EQ(s.attention_window(3), 64);
    // layer_types, when present, decide (transformers writes them to config.json).
    j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
    const kvasir::ModelConfig t = kvasir::parse_model_config(j.dump(), "t/config.json");
    EXPECT_EQ(t.attention_window(0), 64);
    EXPECT_EQ(t.attention_window(1), 0);
    EXPECT_EQ(t.attention_window(2), 64);
    EXPECT_EQ(t.attention_window(3), 0);
    j["layer_types"] = {"sliding_attention", "full_attention"};
    expect_error(j, {"layer_types must list one type per layer (4)"});
    j["layer_types"] = {"sliding_attention", "full_attention", "linear_attention", "full_attention"};
    expect_error(j, {"layer_types[2]", "linear_attention"});
}

TEST(ConfigParse, Qwen3DenseHasQkNormAndItsOwnHeadDim) {
    // Qwen/Qwen3-8B (abridged): head_dim 128 given explicitly, q/k norm always.
    const kvasir::ModelConfig c = kvasir::parse_model_config(sized(R"({
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
      "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
      "vocab_size": 151936, "rope_theta": 1000000, "attention_bias": false, "use_sliding_window": false,
      "sliding_window": null, "max_window_layers": 36, "tie_word_embeddings": false})"),
                                                              "qwen3/config.json");
    EXPECT_EQ(c.architecture, Architecture::qwen3);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_FALSE(c.has_moe());
    EXPECT_EQ(c.sliding_window, 0);
    const kvasir::ModelConfig b = kvasir::parse_model_config(sized(R"({"model_type": "qwen3", "attention_bias": true})"), "b/config.json");
    EXPECT_TRUE(b.attention_bias);
    EXPECT_TRUE(b.attention_out_bias);  // Qwen3Attention: o_proj bias = attention_bias too
}

TEST(RopeFrequencies, Llama3ScalingByHandOnEachBranch) {
    // llama_tiny's rope: theta 5e5, 16 rotary dims, factor 8, low/high freq factor 1/4, original context 64:
    // low_freq_wavelen = 64/1 = 64, high_freq_wavelen = 64/4 = 16.
    kvasir::ModelConfig c;
    c.head_dim = 16;
    c.rope_theta = 500000.0;
    EXPECT_TRUE(kvasir::rope_inverse_frequencies(c).empty());  // default rope: every node computes theta^(-2i/d)
    c.rope_type = "llama3";
    c.rope_scaling = {8.0, 1.0, 4.0, 64.0};
    const std::vector<double> f = kvasir::rope_inverse_frequencies(c);
    ASSERT_EQ(f.size(), 8u);
    // Pair 0: inv 1, wavelength 2π < 16 → unchanged.
    EXPECT_EQ(f[0], 1.0);
    // Pair 1: inv = 5e5^(-1/8) = 0.193928..., wavelength 2π/inv = 32.399 in [16, 64] → smoothed with
    // s = (64/wavelength − 1)/3; (1 − s)·inv/8 + s·inv.
    const double inv1 = std::pow(500000.0, -0.125);
    EXPECT_NEAR(inv1, 0.19392, 1e-5);
    const double s = (64.0 * inv1 / (2 * std::numbers::pi) - 1.0) / 3.0;
    EXPECT_NEAR(s, 0.32509, 1e-5);
    EXPECT_NEAR(f[1], inv1 * (1.0 - s) / 8.0 + s * inv1, 1e-16);
    EXPECT_NEAR(f[1], 0.079403, 1e-6);
    // Pairs 2..7: wavelength > 64 → divided by 8 (pair 2: 5e5^(-1/4)/8 = 0.0047008).
    EXPECT_NEAR(f[2], 0.0047008, 1e-7);
    for (int i = 2; i < 8; ++i) EXPECT_DOUBLE_EQ(f[static_cast<std::size_t>(i)], std::pow(500000.0, -2.0 * i / 16.0) / 8.0) << i;
    c.rope_type = "longrope";
    EXPECT_THROW((void)kvasir::rope_inverse_frequencies(c), Error);
}

TEST(RopeFrequencies, YarnAsGptOssUsesIt) {
    // GptOssConfig's rope: yarn, theta 1.5e5, factor 32, beta_fast 32, beta_slow 1, truncate false,
    // original context 4096; head_dim 64. Correction range by hand: low = 64·ln(4096/(32·2π)) / (2 ln 1.5e5)
    // = 8.093, high = 64·ln(4096/2π) / (2 ln 1.5e5) = 17.398: pairs ≤ 8 keep theta^(−2i/64), pairs ≥ 18 are
    // divided by 32, the ones between blend with ramp (i − low)/(high − low).
    const kvasir::ModelConfig c = kvasir::parse_model_config(sized(R"({"model_type": "qwen3_moe", "head_dim": 64,
      "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}})"),
                                                             "yarn/config.json");
    ASSERT_EQ(c.rope_type, "yarn");
    const std::vector<double> f = kvasir::rope_inverse_frequencies(c);
    ASSERT_EQ(f.size(), 32u);
    const auto p = [](int i) { return std::pow(150000.0, -2.0 * i / 64.0); };
    const double low = 64 * std::log(4096 / (32 * 2 * std::numbers::pi)) / (2 * std::log(150000.0));
    const double high = 64 * std::log(4096 / (2 * std::numbers::pi)) / (2 * std::log(150000.0));
    EXPECT_NEAR(low, 8.093, 1e-3);
    EXPECT_NEAR(high, 17.398, 1e-3);
    EXPECT_EQ(f[0], 1.0);
    for (int i : {1, 5, 8}) EXPECT_DOUBLE_EQ(f[static_cast<std::size_t>(i)], p(i)) << i;
    for (int i : {18, 25, 31}) EXPECT_DOUBLE_EQ(f[static_cast<std::size_t>(i)], p(i) / 32) << i;
    const double r9 = (9 - low) / (high - low);
    EXPECT_NEAR(f[9], p(9) * (r9 / 32 + (1 - r9)), 1e-17);
    // transformers' own float32 values (ROPE_INIT_FUNCTIONS["yarn"] on GptOssConfig(head_dim=64)).
    const std::vector<std::pair<int, double>> hf{{5, 0.15532298386096954}, {8, 0.05081327259540558},
                                                 {9, 0.031705696135759354}, {10, 0.019334999844431877},
                                                 {12, 0.006794959306716919}, {20, 1.818833698052913e-05},
                                                 {31, 3.023511396804679e-07}};
    for (const auto& [i, v] : hf) EXPECT_NEAR(f[static_cast<std::size_t>(i)] / v, 1.0, 1e-6) << i;
    // attention_factor: 0.1·ln 32 + 1 (transformers: 1.3465735902799727).
    EXPECT_NEAR(kvasir::rope_attention_factor(c), 1.3465735902799727, 1e-15);
    // truncate (the default): low floored to 8, high ceiled to 18.
    kvasir::ModelConfig t = c;
    t.rope_scaling.truncate = true;
    const std::vector<double> ft = kvasir::rope_inverse_frequencies(t);
    EXPECT_NEAR(ft[9], p(9) * ((1.0 / 10) / 32 + (1 - 1.0 / 10)), 1e-17);
    // attention_factor given, and DeepSeek's mscale / mscale_all_dim form.
    t.rope_scaling.attention_factor = 1.5;
    EXPECT_EQ(kvasir::rope_attention_factor(t), 1.5);
    kvasir::ModelConfig d = c;
    d.rope_scaling.mscale = 1.0;
    d.rope_scaling.mscale_all_dim = 0.5;
    EXPECT_NEAR(kvasir::rope_attention_factor(d), (0.1 * std::log(32.0) + 1) / (0.05 * std::log(32.0) + 1), 1e-15);
    EXPECT_EQ(kvasir::rope_attention_factor(kvasir::parse_model_config(sized(R"({"model_type": "qwen3_moe"})"), "x")), 1.0);
}

TEST(ConfigErrors, YarnNeedsItsKeys) {
    expect_error(sized(R"({"model_type": "qwen3_moe", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})"),
                 {"original_max_position_embeddings is required for rope_type yarn"});
    expect_error(sized(R"({"model_type": "qwen3_moe", "rope_parameters": {"rope_type": "yarn",
                    "original_max_position_embeddings": 4096}})"), {"factor is required for rope_type yarn"});
    expect_error(sized(R"({"model_type": "qwen3_moe", "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 4096, "truncate": 1}})"), {"truncate must be true or false"});
}

TEST(ConfigParse, OlmoeNormsTheWholeProjectionAndDoesNotRenormalise) {
    // allenai/OLMoE-1B-7B-0924's config.json (abridged).
    const char* text = R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048,
      "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
      "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": false, "clip_qkv": null, "rope_theta": 10000.0,
      "rms_norm_eps": 1e-05, "vocab_size": 50304, "tie_word_embeddings": false})";
    const kvasir::ModelConfig c = kvasir::parse_model_config(text, "olmoe/config.json");
    EXPECT_EQ(c.architecture, Architecture::olmoe);
    EXPECT_TRUE(c.qk_norm && c.qk_norm_full);
    EXPECT_EQ(c.q_norm_dim(), 2048);  // nh·D
    EXPECT_EQ(c.k_norm_dim(), 2048);  // nkv·D
    EXPECT_EQ(c.num_experts(), 64);
    EXPECT_EQ(c.top_k(), 8);
    EXPECT_FALSE(c.norm_topk_prob());
    EXPECT_EQ(c.moe_intermediate_size, 1024);
    EXPECT_EQ(c.num_moe_layers(), 16);
    EXPECT_FALSE(c.has_shared_expert());
    json j = json::parse(text);
    j["clip_qkv"] = 8.0;
    expect_error(j, {"clip_qkv 8"}, ErrorCode::unsupported);
    j = json::parse(text);
    j["head_dim"] = 64;  // 64 × 16 != 2048: OlmoeAttention's q_norm would not fit
    expect_error(j, {"head_dim 64", "hidden_size 2048"}, ErrorCode::unsupported);
}

TEST(ConfigParse, GptOssDefaultsAndLayout) {
    // openai/gpt-oss-20b's config.json (abridged; its quantization_config names MXFP4).
    const char* text = R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
      "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
      "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
      "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                       "rope_type": "yarn", "truncate": false}, "rope_theta": 150000, "swiglu_limit": 7.0,
      "attention_bias": true, "vocab_size": 201088, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
      "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}})";
    const kvasir::ModelConfig c = kvasir::parse_model_config(text, "oss/config.json");
    EXPECT_EQ(c.architecture, Architecture::gpt_oss);
    EXPECT_TRUE(c.attention_sinks && c.clamped_swiglu);
    const LayerTensorNames n = kvasir::layer_tensor_names(c, 0);
    EXPECT_EQ(n.router_logit_bias, "model.layers.0.mlp.router.bias");
    EXPECT_EQ(n.oss_gate_up_bias, "model.layers.0.mlp.experts.gate_up_proj_bias");
    EXPECT_EQ(n.sinks, "model.layers.0.self_attn.sinks");
    EXPECT_TRUE(c.attention_bias && c.attention_out_bias);
    EXPECT_EQ(c.swiglu_alpha, 1.702);
    EXPECT_EQ(c.swiglu_limit, 7.0);
    EXPECT_EQ(c.rope_type, "yarn");
    EXPECT_EQ(c.rope_theta, 150000.0);
    EXPECT_FALSE(c.rope_scaling.truncate);
    EXPECT_EQ(c.num_experts(), 32);
    EXPECT_EQ(c.top_k(), 4);
    EXPECT_TRUE(c.norm_topk_prob());  // softmax over the top-k logits
    EXPECT_EQ(c.moe_intermediate_size, 2880);
    EXPECT_EQ(c.num_moe_layers(), 24);
    EXPECT_EQ(c.attention_window(0), 128);
    EXPECT_EQ(c.attention_window(1), 0);
    EXPECT_EQ(c.attention_window(22), 128);
    // Without layer_types, rope or head_dim: GptOssConfig's defaults (even layers slide, yarn 32, head_dim 64).
    const kvasir::ModelConfig d = kvasir::parse_model_config(sized(R"({"model_type": "gpt_oss", "num_hidden_layers": 3})"), "d");
    EXPECT_EQ(d.head_dim, 64);
    EXPECT_EQ(d.rope_type, "yarn");
    EXPECT_EQ(d.rope_scaling.factor, 32.0);
    EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 4096.0);
    EXPECT_FALSE(d.rope_scaling.truncate);
    EXPECT_EQ(d.rope_theta, 150000.0);
    EXPECT_EQ(d.attention_window(0), 128);
    EXPECT_EQ(d.attention_window(1), 0);
    EXPECT_EQ(d.attention_window(2), 128);
    json j = json::parse(text);
    j["layer_types"] = {"sliding_attention"};
    expect_error(j, {"layer_types must list one type per layer (24)"});
    j = json::parse(text);
    j["swiglu_limit"] = 0;
    expect_error(j, {"swiglu_limit"});
}

// The defaults in the family records (model/families/*.cpp) against the config classes themselves:
// fixtures/config_defaults.json holds, for each family, a config.json giving only the sizes and what
// transformers 5.24 resolves from it (scripts/make_config_defaults.py). Every built-in family is there.
TEST(ConfigDefaults, EachFamilysRecordGivesItsConfigClasssDefaults) {
    const json ref = json::parse(std::ifstream(std::string(KVASIR_SOURCE_DIR) + "/fixtures/config_defaults.json"));
    std::set<Architecture> seen;
    for (const auto& [type, family] : ref["families"].items()) {
        SCOPED_TRACE(type);
        const ModelConfig c = kvasir::parse_model_config(family["config"].dump(), type + "/config.json");
        seen.insert(c.architecture);
        const json& t = family["transformers"];
        EXPECT_EQ(c.num_kv_heads, t["num_key_value_heads"].get<std::int64_t>());
        EXPECT_EQ(c.head_dim, t["head_dim"].get<std::int64_t>());
        EXPECT_EQ(c.max_position_embeddings, t["max_position_embeddings"].get<std::int64_t>());
        EXPECT_EQ(c.rms_norm_eps, t["rms_norm_eps"].get<double>());
        EXPECT_EQ(c.rope_theta, t["rope_theta"].get<double>());
        EXPECT_EQ(c.rope_type, t["rope_type"].get<std::string>());
        EXPECT_EQ(c.partial_rotary_factor, t["partial_rotary_factor"].get<double>());
        EXPECT_EQ(c.tie_word_embeddings, t["tie_word_embeddings"].get<bool>());
        EXPECT_EQ(c.sliding_window, t["sliding_window"].get<std::int64_t>());
    }
    std::set<Architecture> all;
    for (const kvasir::Family* f : kvasir::all_families()) all.insert(f->id);
    EXPECT_EQ(seen, all);
}
