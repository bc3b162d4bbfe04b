// One file per architecture (lib/kvasir/arch/): moving the model graph out
// of the forward-pass runner changed no bit. fixtures/forward_digests.json
// holds SHA-256 digests of everything forward() returns — every hidden
// state, router logits, routing ids and weights, final hidden, logits — on
// every fixture for cpu-ref (the f64 oracle: plain loops, libm-free inputs,
// the same bits on every x86-64 machine) and cpu:threads=1, computed by the
// code BEFORE the move (commit 69f115c's steps/forward.cpp; regenerate with
// KVASIR_PRINT_DIGESTS=1 ./build/test_arch). Plus: the registry maps each
// fixture to its family, and a configuration the forward pass does not
// implement is refused naming the key, never run.
#include "kvasir/arch/architecture.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

const fs::path kRoot = KVASIR_SOURCE_DIR;
const fs::path kModels = kRoot / "fixtures" / "models";

const std::vector<std::pair<std::string, std::string>>& fixtures() {  // name → reference file with input_ids
    static const std::vector<std::pair<std::string, std::string>> all{
        {"qwen3_moe_tiny", "qwen3_moe_tiny/reference.safetensors"},
        {"qwen3_moe_tiny_bf16", "qwen3_moe_tiny_bf16/reference.safetensors"},
        {"mixtral_tiny", "mixtral_tiny/reference.safetensors"},
        {"qwen2_moe_tiny", "qwen2_moe_tiny/reference.safetensors"},
        {"qwen3_moe_tiny.gguf", "qwen3_moe_tiny/reference.safetensors"},
        {"qwen3_moe_tiny.q8_0.gguf", "qwen3_moe_tiny.q8_0.reference.safetensors"},
    };
    return all;
}

void hash_tensor(std::string& buf, const std::string& name, const Tensor& t) {
    buf += fmt::format("{}|{}|{}|", name, dtype_name(t.dtype()), shape_str(t.shape()));
    if (t.nbytes() > 0) buf.append(static_cast<const char*>(t.raw()), t.nbytes());
}

std::string digest(const ForwardResult& r) {
    std::string buf;
    for (std::size_t k = 0; k < r.hidden.size(); ++k) hash_tensor(buf, fmt::format("hidden.{}", k), r.hidden[k]);
    for (std::size_t l = 0; l < r.router_logits.size(); ++l) {
        hash_tensor(buf, fmt::format("router_logits.{}", l), r.router_logits[l]);
        hash_tensor(buf, fmt::format("routing.{}.ids", l), r.routing[l].ids);
        hash_tensor(buf, fmt::format("routing.{}.weights", l), r.routing[l].weights);
    }
    hash_tensor(buf, "final_hidden", r.final_hidden);
    hash_tensor(buf, "logits", r.logits);
    return sha256_hex(buf);
}

std::vector<std::int32_t> prompt_of(const std::string& reference) {
    const SafetensorsFile f = SafetensorsFile::open((kModels / reference).string());
    const TensorView ids = f.view("input_ids");
    std::vector<std::int32_t> out(static_cast<std::size_t>(ids.numel()));
    for (std::int64_t i = 0; i < ids.numel(); ++i) out[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(ids.at(i));
    return out;
}

}  // namespace

TEST(Architectures, TheMoveOutOfTheRunnerChangedNoBit) {
    const char* print = std::getenv("KVASIR_PRINT_DIGESTS");
    nlohmann::json want;
    if (print == nullptr)
        want = nlohmann::json::parse(read_text_file((kRoot / "fixtures" / "forward_digests.json").string()))["digests"];
    nlohmann::json got;
    for (const auto& [name, reference] : fixtures()) {
        const Model model = Model::open((kModels / name).string());
        const std::vector<std::int32_t> prompt = prompt_of(reference);
        for (const char* node : {"cpu-ref", "cpu:threads=1"}) {
            auto be = create_backend(node);
            // The f32 digests are of the AVX2+FMA kernels; the portable
            // fallback rounds differently (by design), so on a machine
            // without AVX2 only the oracle's digests are compared.
            const bool comparable = std::string(node) == "cpu-ref" ||
                                    be->capabilities().runtime.find("avx2+fma kernels") != std::string::npos;
            ForwardOptions opt;
            opt.keep_mlp_io = true;
            const std::string d = digest(forward(*be, model, prompt, opt));
            got[name][node] = d;
            if (print == nullptr && comparable) {
                ASSERT_TRUE(want.contains(name) && want[name].contains(node)) << name << " " << node;
                EXPECT_EQ(d, want[name][node].get<std::string>()) << name << " on " << node;
            }
        }
    }
    if (print != nullptr) std::cout << got.dump(2) << "\n";
}

TEST(Architectures, EachFixtureHasItsFamily) {
    for (const auto& [name, expect] : std::vector<std::pair<std::string, Architecture>>{
             {"qwen3_moe_tiny", Architecture::qwen3_moe}, {"mixtral_tiny", Architecture::mixtral},
             {"qwen2_moe_tiny", Architecture::qwen2_moe}, {"qwen3_moe_tiny.gguf", Architecture::qwen3_moe}}) {
        const Model m = Model::open((kModels / name).string());
        EXPECT_EQ(arch::architecture_for(m.config()).id(), expect) << name;
    }
    std::vector<Architecture> ids;
    for (const arch::DecoderArchitecture* a : arch::architectures()) ids.push_back(a->id());
    EXPECT_EQ(ids, (std::vector<Architecture>{Architecture::qwen2_moe, Architecture::qwen3_moe, Architecture::mixtral,
                                              Architecture::qwen3_5_moe, Architecture::qwen3_next, Architecture::llama,
                                              Architecture::mistral, Architecture::qwen2, Architecture::qwen3,
                                              Architecture::qwen3_5, Architecture::olmoe, Architecture::gpt_oss,
                                              Architecture::deepseek_v3, Architecture::glm4_moe}));
    for (const auto& [name, expect] : std::vector<std::pair<std::string, Architecture>>{
             {"qwen3_5_moe_tiny", Architecture::qwen3_5_moe}, {"qwen3_next_tiny", Architecture::qwen3_next},
             {"qwen3_5_tiny", Architecture::qwen3_5}, {"llama_tiny", Architecture::llama},
             {"mistral_tiny", Architecture::mistral}, {"qwen2_tiny", Architecture::qwen2}, {"qwen3_tiny", Architecture::qwen3},
             {"olmoe_tiny", Architecture::olmoe}, {"gpt_oss_tiny", Architecture::gpt_oss},
             {"llama_tiny.gguf", Architecture::llama}, {"deepseek_v3_tiny", Architecture::deepseek_v3},
             {"kimi_k2_tiny", Architecture::deepseek_v3}, {"glm4_moe_tiny", Architecture::glm4_moe},
             {"deepseek_v3_tiny.gguf", Architecture::deepseek_v3}, {"qwen3_next_tiny.gguf", Architecture::qwen3_next},
             {"qwen3_5_moe_tiny.gguf", Architecture::qwen3_5_moe}}) {
        const Model m = Model::open((kModels / name).string());
        EXPECT_EQ(arch::architecture_for(m.config()).id(), expect) << name;
    }
}

TEST(Architectures, WhatTheForwardPassDoesNotImplementIsRefusedNamingIt) {
    const Model m = Model::open((kModels / "qwen3_moe_tiny").string());
    const auto refused = [](ModelConfig c, const std::string& part) {
        try {
            (void)arch::architecture_for(c);
            ADD_FAILURE() << "accepted; expected a refusal containing: " << part;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
            EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
        }
    };
    ModelConfig c = m.config();
    c.rope_type = "longrope";
    refused(c, "rope type 'longrope'");
    c = m.config();
    c.sliding_window = 4096;  // qwen3_moe: no fixture checks its window rule
    refused(c, "sliding-window attention (4096) of qwen3_moe");
    c = Model::open((kModels / "qwen2_tiny").string()).config();
    EXPECT_EQ(c.sliding_window, 8);  // qwen2: checked by its fixture
    EXPECT_EQ(arch::architecture_for(c).id(), Architecture::qwen2);
    c = m.config();
    c.rope_type = "llama3";  // accepted on a full rotary ...
    EXPECT_EQ(arch::architecture_for(c).id(), Architecture::qwen3_moe);
    c.partial_rotary_factor = 0.5;  // ... not with partial rotary
    refused(c, "with partial rotary");
    c = Model::open((kModels / "qwen3_5_moe_tiny").string()).config();
    c.rope_type = "longrope";
    refused(c, "rope type 'longrope'");
}
