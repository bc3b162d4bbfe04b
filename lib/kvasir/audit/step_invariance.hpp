// The invariance step's result (audit/step_invariance.cpp): each node against
// ITSELF — a row alone vs in a batch of rows, a sequence alone vs among
// batchmates, one prefill vs token-by-token decode, repeated requests.
#pragma once

#include "kvasir/audit/results.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvasir {

struct InvarianceResult final : StepResult {
    struct Batch {
        double batch_size = 0;       // B
        double max_rel = 0, max_abs = 0;  // guarded, the sequence alone vs at slot B/2 of B
        bool bit_identical() const { return max_rel == 0.0; }
    };
    struct Entry : NodeEntry {
        // Per op ("matmul", "softmax", "rmsnorm"): guarded max_rel of a row
        // alone vs among op_rows rows. Unset: not measurable on the node (it
        // runs whole graphs).
        std::optional<std::vector<std::pair<std::string, double>>> ops;
        std::vector<Batch> batch;
        // Counts and positions are doubles as the capture stores them (f64
        // tensors) and the JSON has always written them.
        double prefill_decode_max_rel = 0, prefill_decode_max_abs = 0;
        double first_differing_position = -1;  // of prefill vs decode; −1: none
        double unique_outputs = 0, unique_token_sequences = 0;  // among `requests` identical requests
        std::int64_t requests = 0;                             // the JSON's repeat.of
        nlohmann::ordered_json to_json() const;
    };
    std::int64_t tokens = 0;
    std::vector<std::int64_t> batch_sizes;
    std::int64_t op_rows = 0, repeats = 0, decode = 0;
    std::string compared;  // one line: what is compared
    std::vector<Entry> nodes;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
