// A model family is data (model/family.hpp): this file defines one — "toy_llama",
// llama's layer under its own Hugging Face names, its own config key for the
// MLP width and its own names for the MLP tensors — registers it, and loads a
// checkpoint of it written from the llama_tiny fixture. Nothing else in the
// tree knows the toy: parse_model_config, the tensor naming, Model::open and
// the forward pass read its record. The toy's forward pass must give
// llama_tiny's bits, since it is llama_tiny's model under other names.
#include "kvasir/arch/architecture.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/config_keys.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_writer.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

// ---- the toy family: everything about it ---------------------------------------------------------

constexpr auto kToyId = static_cast<Architecture>(200);

void read_toy(const ConfigKeys& k, ModelConfig& c) {
    c.attention_bias = c.attention_out_bias = k.boolean("attention_bias", false);
    c.intermediate_size = k.size("toy_mlp_width", 1, config_bounds::kMaxDim);  // its own key
    c.moe_layers.assign(static_cast<std::size_t>(c.num_layers), false);
}

void name_toy_layer(const ModelConfig& c, std::int64_t layer, LayerTensorNames& n) {
    const std::string p = fmt::format("{}layers.{}.ffn.", c.tensor_prefix, layer);
    n.mlp_gate = p + "w_gate";
    n.mlp_up = p + "w_up";
    n.mlp_down = p + "w_down";
}

const Family kToy{.id = kToyId,
                  .model_type = "toy_llama",
                  .class_prefix = "ToyLlama",
                  .defaults = {.kv_heads = 0, .max_positions = 2048, .rms_eps = 1e-6, .rope_theta = 10000.0},
                  .read = read_toy,
                  .name_layer = name_toy_layer};

// ---- the test ------------------------------------------------------------------------------------

const fs::path kModels = fs::path(KVASIR_SOURCE_DIR) / "fixtures" / "models";

// llama_tiny as a toy_llama checkpoint: its config under the toy's names and key, its
// tensors with the MLP ones renamed.
fs::path write_toy_checkpoint() {
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvasir-toy-family-{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    nlohmann::json cfg = nlohmann::json::parse(read_text_file((kModels / "llama_tiny" / "config.json").string()));
    cfg["model_type"] = "toy_llama";
    cfg["architectures"] = {"ToyLlamaForCausalLM"};
    cfg["toy_mlp_width"] = cfg["intermediate_size"];
    cfg.erase("intermediate_size");
    std::ofstream(dir / "config.json") << cfg.dump(2);
    const SafetensorsFile src = SafetensorsFile::open((kModels / "llama_tiny" / "model.safetensors").string());
    std::map<std::string, TensorView> tensors;
    for (const std::string& name : src.names()) {
        std::string renamed = name;
        for (const auto& [from, to] : {std::pair{".mlp.gate_proj.weight", ".ffn.w_gate"},
                                        std::pair{".mlp.up_proj.weight", ".ffn.w_up"},
                                        std::pair{".mlp.down_proj.weight", ".ffn.w_down"}})
            if (const auto at = renamed.find(from); at != std::string::npos) renamed.replace(at, std::strlen(from), to);
        tensors.emplace(renamed, src.view(name));
    }
    write_safetensors((dir / "model.safetensors").string(), tensors);
    return dir;
}

}  // namespace

TEST(ToyFamily, RegisteredFromOneFileItLoadsAndRunsAsTheModelItRenames) {
    const fs::path dir = write_toy_checkpoint();
    // Unknown before it is registered.
    try {
        (void)Model::open(dir.string());
        ADD_FAILURE() << "a toy_llama checkpoint opened before its family was registered";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("model_type \"toy_llama\" is not a supported architecture"),
                  std::string::npos) << e.what();
    }

    register_family(kToy);
    EXPECT_NE(supported_architectures().find("toy_llama"), std::string::npos);
    EXPECT_STREQ(architecture_name(kToyId), "toy_llama");
    EXPECT_EQ(family_for_class("ToyLlamaForCausalLM"), &kToy);
    EXPECT_EQ(family_for_class("LlamaForCausalLM"), &family_of(Architecture::llama));

    const Model toy = Model::open(dir.string());
    const Model llama = Model::open((kModels / "llama_tiny").string());
    EXPECT_EQ(toy.config().architecture, kToyId);
    EXPECT_EQ(toy.config().intermediate_size, llama.config().intermediate_size);  // read from toy_mlp_width
    EXPECT_EQ(layer_tensor_names(toy.config(), 1).mlp_down, "model.layers.1.ffn.w_down");
    EXPECT_EQ(arch::architecture_for(toy.config()).id(), kToyId);

    // The same model under other names: the same bits, on the oracle and on the cpu node.
    const std::vector<std::int32_t> prompt{1, 17, 203, 5, 99, 42, 7};
    for (const char* node : {"cpu-ref", "cpu:threads=1"}) {
        auto be = create_backend(node);
        const ForwardResult a = forward(*be, toy, prompt, {});
        const ForwardResult b = forward(*be, llama, prompt, {});
        ASSERT_EQ(a.logits.shape(), b.logits.shape()) << node;
        ASSERT_GT(a.logits.nbytes(), 0u);
        EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << node;
        ASSERT_EQ(a.hidden.size(), b.hidden.size());
        for (std::size_t k = 0; k < a.hidden.size(); ++k)
            EXPECT_EQ(std::memcmp(a.hidden[k].raw(), b.hidden[k].raw(), a.hidden[k].nbytes()), 0) << node << " " << k;
    }

    // A family's id, model_type and class prefix are its own.
    for (const Family& clash : {Family{.id = kToyId, .model_type = "other", .class_prefix = "Other", .read = read_toy},
                                Family{.id = static_cast<Architecture>(201), .model_type = "llama",
                                       .class_prefix = "Other", .read = read_toy},
                                Family{.id = static_cast<Architecture>(201), .model_type = "other",
                                       .class_prefix = "ToyLlama", .read = read_toy}}) {
        try {
            register_family(clash);
            ADD_FAILURE() << "registered a family clashing with one already known: " << clash.model_type;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
        }
    }
    fs::remove_all(dir);
}
