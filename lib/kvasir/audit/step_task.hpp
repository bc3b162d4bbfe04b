// Step 7's result (audit/step_task.cpp): each node's multiple-choice task
// score (lm-evaluation-harness's acc and acc_norm), against the reference's.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/steps/task.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kvasir {

struct TaskResult final : StepResult {
    struct Entry : NodeEntry {
        double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
        // Against the reference: acc and acc_norm ratios, the items with its
        // answer (agree, agree_norm), the largest |Δ log-likelihood| of a choice.
        TaskComparison vs;
        std::int64_t items = 0;
        // The fraction of the items with the reference's answer (acc, acc_norm).
        double agreement() const { return static_cast<double>(vs.agree) / static_cast<double>(items); }
        double agreement_norm() const { return static_cast<double>(vs.agree_norm) / static_cast<double>(items); }
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
