// The determinism step's result (audit/step_determinism.cpp): each node's
// repeated forward passes against its own first one.
#pragma once

#include "kvasir/audit/results.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct DeterminismResult final : StepResult {
    struct Entry : NodeEntry {
        std::optional<double> run_to_run_max_rel;  // unset: the node's tensors gave an error first
        std::optional<double> routing_rows_differing;  // summed over the repeats (absent in older captures)
        // Every rerun gave the first run's bits (false when not measured).
        bool bit_identical() const { return run_to_run_max_rel && *run_to_run_max_rel == 0.0; }
        nlohmann::ordered_json to_json() const;
    };
    std::int64_t repeats = 0;
    std::string compared;  // one line: what is compared
    std::vector<Entry> nodes;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
