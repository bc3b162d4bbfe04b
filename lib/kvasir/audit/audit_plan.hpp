// Internal to the audit driver and the step objects (not a public API): the
// validated per-step configurations of a protocol — each step's plan()
// fills its own entry — so that audit, capture and compare run exactly the
// same thing.
#pragma once

#include "kvasir/audit/audit_config.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/steps/decide.hpp"
#include "kvasir/steps/drift.hpp"
#include "kvasir/steps/generate.hpp"
#include "kvasir/steps/logits.hpp"
#include "kvasir/steps/op_delta.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/task.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <map>
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
    std::optional<TaskConfig> task;
    std::optional<TokenSequence> determinism_tokens;
    int repeats = 0;
    struct Invariance {
        TokenSequence tokens;
        std::vector<std::int64_t> batch_sizes;
        std::int64_t op_rows = 0;
        int repeats = 0;
        std::int64_t decode = 0;
    };
    std::optional<Invariance> invariance;
    std::vector<std::string> steps;  // protocol order
};

// Every step's configuration, validated (token streams read and checked):
// Error(bad_input) before anything runs.
AuditPlan make_audit_plan(const AuditConfig& config);

// A token stream of the protocol, read and verified.
TokenSequence stream_tokens(const TokenStream& s, const Model& model);

// The common part of a forward step's configuration (steps 2–6).
template <class C>
C token_step(const AuditConfig& ac, std::uint64_t seed, const TokenStream& s) {
    C c;
    c.model = ac.model;
    c.tokens = stream_tokens(s, *ac.model);
    c.seed = seed;
    c.repeat = false;  // self non-determinism is the determinism step's business
    return c;
}

// One node as the compare loop sees it: its outputs, the steps it collected,
// the steps it failed (step → one-line reason), the steps its writer says it
// cannot provide (step → why; external runtimes) and whether it ran free
// (its own router and decoding: Capture::free_running).
struct NodeRecord {
    const NodeOutputs* outputs = nullptr;
    std::vector<std::string> steps;
    std::map<std::string, std::string> errors;
    std::map<std::string, std::string> not_captured;
    bool free_running = false;
    // A fault-injecting node: step → op outputs its fault corrupted in it.
    std::optional<std::map<std::string, std::int64_t>> faults;
};

// Step `name` compared over `nodes` into the ledger and the report: a node
// that failed or lacks the step is that node's error — unless its writer
// declared the step not captured, then the step's criteria are not judged
// for that node (listed with the reason); a reference that did leaves
// nothing compared ("not compared: the reference failed").
void compare_step(const Protocol& protocol, const std::string& name, const std::vector<NodeRecord>& nodes,
                  std::size_t reference, Ledger& ledger, AuditReport& report);

// The first weight of `model` holding NaN/Inf: "layer 2 expert 5 down_proj
// element 17 is nan"; nullopt when every weight is finite. Reads every
// weight: called only once the reference's output is already non-finite.
std::optional<std::string> first_non_finite_weight(const Model& model);

// The reference's output of a step holds NaN/Inf: the yardstick is broken
// and no candidate can be judged. Error(bad_input) naming the model's first
// non-finite weight (layer and tensor), else the reference's output tensor.
// Returns when `out` is finite.
void check_reference_finite(const StepOutput& out, const std::string& node, const std::string& step, const Model* model);

}  // namespace kvasir::detail

