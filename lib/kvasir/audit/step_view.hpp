// A step command (kvasir-equiv drift, logits, …) is a VIEW of the audit:
// its options become a protocol that runs that one step — the shipped
// protocol's statistics, floor and tolerances for it, the command's own
// settings in the step's section — and the audit runs it in this process
// through the same plan / decide / collect / compare as `audit --steps <s>`.
// There is one implementation per step and one JSON form of its result: the
// step's section of the audit report.
//
// The view protocol's document records what the command asked for
// ({"view", "of": the base protocol's id/version/hash, "settings"}), and its
// content hash is of that document: a view's report never claims the base
// protocol's hash.
#pragma once

#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/protocol.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvasir {

struct StepView {
    std::string step;              // a step of the protocol format: "drift", "logits", …
    bool repeat = false;           // also the determinism step: every node run twice on the same tokens
    nlohmann::json settings;       // the command's settings as given (recorded in the view's document: what
                                   // configure sets must be here, so that the content hash names it)
    // Sets the step's section of the view protocol from the command's
    // options (threshold, n, context, …); optional.
    std::function<void(Protocol&)> configure;
    // The step reads a token stream (the command's --tokens, --text, … or the
    // model's reference prompt); false: it reads its own items (task).
    bool reads_tokens = true;
    // The base protocol when the command names none: protocols/default.json,
    // or (false) protocols/trained.json, the protocol whose tolerances
    // include a task's.
    bool default_base = true;
};

// `base` with only the view's step (and determinism with repeat) running,
// configured by view.configure, its tolerances restricted to those steps,
// id "<step>" and the view's document ({"view", "repeat", "of", "tokens":
// {count, source}, "settings"}) and hash. A first-divergence tolerance above
// the view's generate.n is capped at n (no node can do better than no
// divergence in n). Error(internal) for a step the protocol format does not
// have.
Protocol view_protocol(const Protocol& base, const StepView& view, const TokenSequence& tokens);

// The audit of `protocol` (a view_protocol) on `nodes` in this process, every
// token step reading `tokens`; `tokenizer` (empty: the one beside the model)
// decodes generate's continuations and scores the task.
AuditRun run_view(const Protocol& protocol, const Model& model, const TokenSequence& tokens,
                  std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference, Gate gate, std::uint64_t seed,
                  const std::string& tokenizer = {});

}  // namespace kvasir
