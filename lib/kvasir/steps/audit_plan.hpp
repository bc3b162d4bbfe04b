// Internal to the audit and capture implementations (not a public API): the
// validated per-step configurations of a protocol, shared so that capture
// runs exactly what the audit runs.
#pragma once

#include "kvasir/steps/audit.hpp"
#include "kvasir/steps/decide.hpp"
#include "kvasir/steps/drift.hpp"
#include "kvasir/steps/generate.hpp"
#include "kvasir/steps/logits.hpp"
#include "kvasir/steps/op_delta.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <optional>
#include <string>
#include <vector>

namespace kvasir::detail {

struct AuditPlan {
    std::uint64_t seed = 0;
    std::optional<OpsConfig> ops;
    std::optional<DriftConfig> drift;
    std::optional<LogitsConfig> logits;
    std::optional<DecideConfig> decide;
    std::optional<GenerateConfig> generate;
    std::optional<PerplexityConfig> perplexity;
    std::optional<TokenSequence> determinism_tokens;
    int repeats = 0;
    std::vector<std::string> steps;  // protocol order
};

// Every step's configuration, validated (token streams read and checked):
// Error(bad_input) before anything runs.
AuditPlan make_audit_plan(const AuditConfig& config);

// The determinism measurement of one node: the full forward pass (own router)
// run `repeats` times; the largest guarded max_rel of runs 2…R against run 1
// over logits, final hidden and every hidden state (0 = bit-identical; NaN
// when the non-finite patterns differ). `routing_rows` (optional) receives the
// (layer, token) rows whose expert sets differed between runs.
double determinism_of(Backend& node, const Model& model, const std::vector<std::int32_t>& ids, int repeats,
                      std::int64_t* routing_rows = nullptr);

}  // namespace kvasir::detail
