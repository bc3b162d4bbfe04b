// Step 5's result (audit/step_generate.cpp): each node's greedy continuation
// against the reference's — where it first diverges, and with teacher forcing
// at which steps its own choice differs given the reference's tokens.
#pragma once

#include "kvasir/audit/results.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct GenerationResult final : StepResult {
    struct Entry : NodeEntry {
        std::int64_t first_divergence = -1;  // the first step whose token differs; −1: none
        std::vector<std::int32_t> tokens;
        std::optional<std::string> text;  // decoded (the model's tokenizer.json)
        // Teacher-forced (fed the reference's tokens): the steps where the
        // node's own choice differs. Unset: not teacher-forced (a free-running
        // node captured without the reference's tokens).
        std::optional<std::vector<std::int64_t>> teacher_forced_divergence_steps;
        bool free_running = false;
        // The top-2 logit margins at the first divergence (both captured).
        std::optional<double> ref_margin_at_divergence, cand_margin_at_divergence;
        nlohmann::ordered_json to_json() const;
    };
    std::string reference;
    std::int64_t new_tokens = 0;
    std::vector<std::int32_t> reference_tokens;
    std::optional<std::string> reference_text;
    std::vector<Entry> results;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
