// Internal to the audit driver and the step objects (not a public API): the
// validated per-step configurations of a protocol — each step's plan()
// fills its own entry — so that audit, capture and compare run exactly the
// same thing.
#pragma once

#include "kvasir/audit/audit_config.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/steps/op_delta.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/task.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <any>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {
// Step 3's configuration: the tokens, and whether the authority's routing is
// imposed on every node (the protocol's logits.router_authority).
struct LogitsConfig : StepCommon {
    bool router_authority = true;
};
// Step 5's: the prompt, the tokens to decode and, when there is one, the
// tokenizer that gives every continuation as text too.
struct GenerateConfig : StepCommon {
    int new_tokens = 16;
    std::optional<Tokenizer> tokenizer;
};
}  // namespace kvasir

namespace kvasir::detail {

struct AuditPlan {
    std::uint64_t seed = 0;
    // > 0: a compact capture (AuditConfig::compact_top_k): the steps that
    // keep logit rows keep what metrics/compact.hpp says instead.
    int compact_top_k = 0;
    std::optional<OpsConfig> ops;
    std::optional<StepCommon> drift;
    std::optional<LogitsConfig> logits;
    std::optional<StepCommon> decide;
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
    // What registered steps (step.hpp register_step) planned: step → its own config.
    std::map<std::string, std::any> registered;
    std::vector<std::string> steps;  // protocol order
};

// Every step's configuration, validated (token streams read and checked):
// Error(bad_input) before anything runs — a forward step whose outputs of
// `held` nodes at once (a node process: its own and the authority's; an
// in-process audit: every node's, kept until the step is compared) would not
// fit in the memory available included.
AuditPlan make_audit_plan(const AuditConfig& config, std::size_t held = 2);

// A token stream of the protocol, read and verified — or the run's own
// tokens (AuditConfig::tokens: a step command's) when it has them.
TokenSequence stream_tokens(const AuditConfig& config, const TokenStream& s);

// The common part of a forward step's configuration (steps 2–6).
template <class C>
C token_step(const AuditConfig& ac, std::uint64_t seed, const TokenStream& s) {
    C c;
    c.model = ac.model;
    c.tokens = stream_tokens(ac, s);
    c.seed = seed;
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

