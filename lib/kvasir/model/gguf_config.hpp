// GGUF → ModelConfig: the readers of llama.cpp's keys that several families
// share (their records' Family::read_gguf). model_config_from_gguf
// (model.hpp) reads what every GGUF has, then the family's reader.
#pragma once

#include "kvasir/model/config.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"

#include <string>

namespace kvasir {

// qwen2moe / qwen3moe / qwen3next / qwen35moe / Mixtral: softmax top-k, dense
// layers (intermediate_size = feed_forward_length, mlp_only_layers) where a
// layer has no router, a shared expert (gated in qwen2moe) when the file has one.
void gguf_softmax_moe_ffn(const GgufFile& file, const GgufModelParams& p, const std::string& path, ModelConfig& c);

}  // namespace kvasir
