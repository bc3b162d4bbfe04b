// Step 1's result (audit/step_ops.cpp): every op on seeded inputs, each
// node's output against every other's (the backend-pair matrices), the shard
// checks and the rigorous-bound violations.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <string>
#include <vector>

namespace kvasir {

struct OpsStepResult final : StepResult {
    OpsReport report;                // per op: inputs, the pair matrices, errors; the shard checks
    std::vector<std::string> nodes;  // the report's node order (capabilities are in each verdict)
    // Per node, the op outputs outside their rigorous error bound (null:
    // no op carries a bound). Kept as the JSON bound_violations writes: no
    // report reads it but the JSON one.
    nlohmann::ordered_json bounds;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
