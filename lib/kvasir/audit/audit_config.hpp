// What an audit run is asked to do — the protocol, the model, the gate, the
// steps (a subset of the protocol's) and who hears about progress — and the
// step selection every command shares. Below the audit driver: the plan
// (audit_plan.hpp), the capture and the steps read it without depending on
// the driver that runs them.
#pragma once

#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/protocol_steps.hpp"  // TokenSequence

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

// Where the audit is, for a progress line: step `step` (1-based index of
// `steps`), node `node` (1-based of `nodes`; 0 = the step is starting). The
// node is the one computing now: reported whenever the step's calls move to
// another node (steps may alternate, e.g. reference then candidate per token).
struct AuditProgress {
    std::string step;
    int step_index = 0, steps = 0;
    std::string node;
    int node_index = 0, nodes = 0;
};

struct AuditConfig {
    const Protocol* protocol = nullptr;  // required
    const Model* model = nullptr;        // required
    Gate gate = Gate::sensitive;
    // Overrides the protocol's seed (seeded op inputs, seeded perturbations).
    // The report records the seed actually used next to the protocol's hash.
    std::optional<std::uint64_t> seed;
    // Called at the start of each step and whenever computing moves to
    // another node. Optional; must not throw.
    std::function<void(const AuditProgress&)> progress;
    // Read the weights the steps will use before the first step (the "load"
    // phase of the timings) unless they exceed half the memory available.
    // Off: weights are read lazily by the first computation that touches
    // them (results are the same either way).
    bool load_first = true;
    // Nodes that were asked for but could not be created (a device that
    // failed to initialise, an OpenCL program that did not build): judged
    // as error, listed after the nodes that ran. Each needs errors set.
    std::vector<NodeInput> failed_nodes;
    // Contrast nodes: shown with their verdict but not gated (exit_code()
    // ignores them) — the cpu:acc=f16 precision-mismatch node the default
    // run shows unless the user names it.
    std::vector<std::string> contrast_nodes;
    // Steps to run and judge (a subset of the protocol's, any order; run in
    // protocol order); empty: every step the protocol runs. The report names
    // them (ProtocolRef::steps_judged); other steps' tolerances are not
    // applied. Error(bad_input) for a step the protocol does not run.
    std::vector<std::string> only_steps;
    // The tokens every token step reads (drift, logits, decide, generate's
    // prompt, perplexity's stream, determinism, invariance) instead of the
    // protocol's streams: a step command's --tokens / --tokens-file / --text
    // (step_view.hpp). In-process runs only: a node process or a capture
    // reads its protocol's streams.
    std::optional<TokenSequence> tokens;
    // The tokenizer.json that decodes generate's continuations and scores
    // the task (a step command's --tokenizer); empty: the one beside the
    // model.
    std::string tokenizer;
    // > 0: a compact capture (capture --compact): the logits step keeps, per
    // position, the top-K log-probabilities with their ids and the
    // log-sum-exp instead of the [T, V] row (metrics/compact.hpp).
    int compact_top_k = 0;
};

// The steps a run asked for (`option` names where: "--steps",
// "--only-steps"), validated against the protocol and put in protocol
// order; empty stays empty (every step). Error(bad_input) "<option>:
// protocol '<id>' does not run step "<name>" (it runs: …)" for a name the
// protocol does not run (unknown names included: they come from the user).
std::vector<std::string> select_steps(const Protocol& protocol, const std::vector<std::string>& asked, const char* option);
// `steps` empty: every step. Otherwise whether `step` is among them.
bool step_selected(const std::vector<std::string>& steps, std::string_view step);
// A tier's tolerances restricted to the criteria of `steps` (empty: all):
// a subset run judges only what it measured.
Tolerances tolerances_of_steps(const Tolerances& tier, const std::vector<std::string>& steps);

}  // namespace kvasir
