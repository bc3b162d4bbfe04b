// Step 3's result (audit/step_logits.cpp): each node's final logits against
// the reference's, position by position.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/metrics/stats.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct LogitsResult final : StepResult {
    struct Entry : NodeEntry {
        // Full rows on both sides: L∞ and L2 of the logit difference and
        // KL(P_ref ‖ P_cand) per position; the RMS of Δp at the top tokens.
        std::optional<Summary> linf, l2, kl;
        double top_dp_rms = 0;
        // A compact capture on either side (why), and the KL lower bound its
        // top-K gives instead.
        std::optional<std::string> compact;
        std::optional<Summary> kl_lower_bound;
        Summary top_logprob_delta;  // |Δ log p| at the tokens in both top-Ks
        int top_k = 0;
        std::optional<Summary> fingerprint_rel;  // the final hidden states' fingerprints
        bool free_running = false;
        nlohmann::ordered_json to_json() const;
    };
    std::string reference;
    std::int64_t positions = 0;
    std::string compared;  // one line: what is compared
    std::vector<Entry> results;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
