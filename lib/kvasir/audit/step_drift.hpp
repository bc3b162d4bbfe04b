// Step 2's result (audit/step_drift.cpp): each node's residual stream after
// every layer against the reference's — free-running (accumulated) and
// re-anchored (local), per block — the growth exponent, and where the error
// first crosses its yardstick.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/metrics/stats.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct DriftResult final : StepResult {
    struct Layer {
        std::int64_t layer = 0, depth = 0;  // depth = layer + 1
        double free_rel = 0, free_max_abs = 0, free_cosine = 0;  // free-running
        std::optional<double> anchored_rel, anchored_max_abs;    // fed the reference's input
        // Each block of the re-anchored layer alone (‖Δ‖₂/‖ref‖₂).
        std::optional<double> attention_block_rel, mlp_block_rel;
    };
    // The first block whose local delta crosses its yardstick.
    struct Localisation {
        std::int64_t layer = 0;
        std::string block;
        double delta = 0, yardstick = 0;
        std::string rule;  // the threshold, or the multiple of the floor node's delta
    };
    struct Entry : NodeEntry {
        double embedding_rel = 0;  // the embedding gather: exact widening, 0 unless a backend rounds it
        std::vector<Layer> layers;
        PowerFit fit;
        double alpha = 0;  // as drift.alpha_max judges it: 0 when nothing grew
        std::int64_t first_over = -1, first_over_local = -1;  // the first layer over the threshold; −1: none
        std::optional<Localisation> localisation;
        nlohmann::ordered_json to_json() const;
    };
    std::string reference;
    double threshold = 0;
    std::string compared;  // one line: what is compared
    // The floor node whose block deltas × x_floor are the localisation's
    // yardstick (drift.final_rel written relative to a floor that ran).
    struct Floor {
        std::string node;
        double x_floor = 0;
    };
    std::optional<Floor> localisation_floor;
    std::vector<Entry> results;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
