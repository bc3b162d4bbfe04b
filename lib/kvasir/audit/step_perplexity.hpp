// Step 6's result (audit/step_perplexity.cpp): perplexity of every node over
// the protocol's token stream, against the reference's.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/metrics/llamacpp_kld.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct PerplexityResult final : StepResult {
    struct Entry : NodeEntry {
        double mean_nll = 0, perplexity = 0;
        double delta = 0;              // perplexity − the reference's
        double ratio = 0;              // perplexity / the reference's
        double nll_max_abs_delta = 0;  // the largest per-prediction |ΔNLL| (NaN-sticky)
        bool free_running = false;     // its own router in every window
        // llama-perplexity --kl-divergence's statistics against the reference.
        std::optional<LlamaCppKld> llamacpp_kl_divergence;
        nlohmann::ordered_json to_json() const;
    };
    std::string reference;
    std::int64_t predictions = 0, context = 0;
    std::string scored, routing;  // one line each: which predictions count, who routes
    double reference_mean_nll = 0, reference_perplexity = 0;
    std::optional<std::string> kl_divergence_base_rounding;  // with kl_divergence
    std::vector<Entry> results;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
