// Step 7's result (audit/step_task.cpp): each node's multiple-choice task
// score (lm-evaluation-harness's acc and acc_norm), against the reference's.
#pragma once

#include "kvasir/audit/results.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kvasir {

struct TaskResult final : StepResult {
    struct Entry : NodeEntry {
        double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
        double acc_ratio = 0, acc_norm_ratio = 0;  // to the reference's
        double agreement = 0, agreement_norm = 0;  // fraction of items with the reference's answer
        double ll_max_abs_delta = 0;               // the largest |Δ log-likelihood| of a choice
        nlohmann::ordered_json to_json() const;
    };
    std::string reference;
    std::int64_t items = 0;
    std::string routing;  // one line: who routes
    double reference_acc = 0, reference_acc_stderr = 0, reference_acc_norm = 0, reference_acc_norm_stderr = 0;
    std::vector<Entry> results;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
