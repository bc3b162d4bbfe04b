// Small vocabulary types that both the model readers and the backends speak:
// how a router scores, how rope pairs its dimensions, and one expert's
// weight views. They live here, below both, so that model/ and backend/
// never include each other (README "Layout").
#pragma once

#include "kvasir/core/tensor.hpp"

#include <cstdint>

namespace kvasir {

enum class RouterScoring : std::uint8_t {
    softmax,  // p = softmax(x·Wᵀ); top-k of p; weights = p (renormalised if norm_topk_prob)
    sigmoid,  // DeepSeek-V3: s = sigmoid(x·Wᵀ); selection on s + bias, weights from s
};
inline const char* router_scoring_name(RouterScoring s) noexcept {  // "softmax", "sigmoid"
    return s == RouterScoring::softmax ? "softmax" : "sigmoid";
}

enum class RopeLayout {
    neox,    // rotate halves: pairs (i, i + d/2)       — Qwen, Mixtral in HF
    normal,  // rotate adjacent pairs: (2i, 2i + 1)     — GPT-J / original llama.cpp
};

// How an expert combines its gate and up projections: SwiGLU, or gpt-oss's
// clamped SwiGLU (Backend::clamped_swiglu) with its alpha and limit.
struct ExpertActivation {
    bool clamped = false;
    double alpha = 1.702, limit = 7.0;
};

// One routed expert's weights, as views into the model's storage.
struct ExpertWeights {
    TensorView gate;  // [I, H]
    TensorView up;    // [I, H]
    TensorView down;  // [H, I]
    // gpt-oss: biases of the three projections ([I], [I], [H]), absent elsewhere.
    // (Default member initialisers: the plain experts are built as {gate, up, down}.)
    TensorView gate_bias{}, up_bias{}, down_bias{};
    ExpertActivation activation{};

    bool has_biases() const { return gate_bias.data != nullptr || up_bias.data != nullptr || down_bias.data != nullptr; }
};

}  // namespace kvasir
