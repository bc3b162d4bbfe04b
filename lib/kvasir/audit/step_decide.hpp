// Step 4's result (audit/step_decide.cpp): top-1 agreement with router
// authority and without, and each node's own routing against the
// reference's, with the flips at border tokens told from the others.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/metrics/metrics.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvasir {

struct DecisionResult final : StepResult {
    // Flipped expert sets at the reference's border tokens (router gap below
    // `border`) and at the others.
    struct Flips {
        std::int64_t border_tokens = 0, border_flipped = 0, other_flipped = 0;
    };
    struct LayerRouting {
        std::int64_t layer = 0;  // the model layer
        IndexAgreement agreement;
        std::optional<Flips> flips;                // with the reference's router gaps
        std::vector<std::int64_t> flipped_tokens;  // with them: every token whose set flipped
    };
    // The node's own routing against the reference's, over every MoE layer.
    struct Routing {
        std::int64_t rows = 0, exact_matches = 0;
        double exact_match_rate = 0;
        std::vector<LayerRouting> per_moe_layer;
    };
    struct Entry : NodeEntry {
        bool free_running = false;          // its own router and decoding: no pinned run
        std::optional<Fraction> top1_pinned;  // routing pinned by the reference (judged)
        std::optional<Fraction> top1_free;    // each its own router
        // Own routing: its figures, or instead why there are none ("no MoE
        // layers", "not exposed by this node") — never both; neither on a
        // dense model's free-running node.
        std::optional<Routing> routing_free;
        std::optional<std::string> routing_free_note;
        std::optional<Flips> border;  // totals, with the reference's router gaps
        // Where its own routing was measured, the JSON adds the line
        // "routing_pinned": routing under the authority agrees by construction.
        bool routing_pinned = false;
        nlohmann::ordered_json to_json() const;
    };
    // A border token of the reference: its router gap below `border`.
    struct BorderToken {
        std::int64_t token = 0;
        double gap = 0;
    };
    std::string reference;
    std::int64_t moe_layers = 0;
    double border = 0;
    // Per MoE layer (its model layer) the reference's border tokens; unset
    // when it recorded no router gaps.
    std::optional<std::vector<std::pair<std::int64_t, std::vector<BorderToken>>>> border_tokens;
    std::string compared;  // one line: what is compared
    std::vector<Entry> results;
    nlohmann::ordered_json to_json() const override;
};

}  // namespace kvasir
