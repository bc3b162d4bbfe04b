// What an audit produced (SPEC §6), as every report format reads it: the
// verdicts, the backend-pair matrices, the drift series and the per-step
// data. The audit layer writes it; report/ only reads it.
#pragma once

#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

// A backend-pair matrix: entry [a][b] is node b as candidate against node a
// as reference. nullopt = not measured (a node errored); the diagonal is
// max_abs 0, cosine 1 by definition (a node against itself).
struct PairMatrix {
    std::string name;         // what was compared: "moe", "matmul", "logits"
    std::string description;  // one line: shapes / inputs
    std::vector<std::string> nodes;
    std::vector<std::vector<std::optional<double>>> max_abs;
    std::vector<std::vector<std::optional<double>>> cosine;
};

// From step 1's data: the op's matrix of CompareStats. Error(internal) when
// the report has no such op.
PairMatrix pair_matrix(const OpsReport& report, const std::string& op);
// From any square matrix of comparisons (same layout as OpResult::matrix).
// Error(internal) when it is not nodes.size() × nodes.size().
PairMatrix pair_matrix(std::string name, std::string description, std::vector<std::string> nodes,
                       const std::vector<std::vector<std::optional<CompareStats>>>& stats);

// Step 2's series for one node: rel[i] is the normwise relative delta of the
// residual stream after layer i+1 (depth i+1); alpha the fitted exponent.
struct DriftSeries {
    std::string node;
    std::vector<double> rel;
    double alpha = 0;
};

struct ProtocolRef {
    std::string id;
    std::int64_t version = 0;
    std::string content_hash;  // "sha256:<64 hex>"
    std::string path;          // the file it was read from
    // The steps judged when a run asked for a subset (audit --steps, compare
    // --only-steps), in protocol order; empty: every step the protocol runs.
    std::vector<std::string> steps_judged;
    // A step command's view protocol (step_view.hpp): its document — the
    // step, the base protocol, the tokens, the settings. Null otherwise.
    nlohmann::ordered_json view;
};
ProtocolRef protocol_ref(const Protocol& p);

// A step's typed result (Step::compare): what it measured, as the step
// defines it next to itself (audit/step_<name>.hpp for the built-in steps).
// Every report reads it typed — the HTML report by its fields — and to_json()
// is its section of the JSON report, the one schema wherever it appears.
struct StepResult {
    virtual ~StepResult() = default;
    virtual nlohmann::ordered_json to_json() const = 0;
};

// One node's entry of a step's comparison: its figures, or instead the error
// its tensors gave ({"node", "error"} in the JSON).
struct NodeEntry {
    std::string node;
    std::optional<std::string> error;
    // {"node", "error"} for an entry holding an error; else {"node"} and then
    // the members of `figures` (an object), in their order. (A self-compared
    // step's entry, determinism's, keeps the figures measured before its
    // error: its own to_json.)
    nlohmann::ordered_json json_with(const nlohmann::ordered_json& figures) const;
};

struct AuditReport {
    ProtocolRef protocol;
    nlohmann::ordered_json model = nlohmann::ordered_json::object();  // must hold "fingerprint" (string)
    std::string reference;  // node spec of the reference
    std::uint64_t seed = 0;
    Gate gate = Gate::sensitive;
    std::vector<NodeVerdict> nodes;
    std::vector<PairMatrix> pairs;  // pairs.front() is the headline matrix (CSV, heatmap)
    std::vector<DriftSeries> drift;
    // Each step's section of the JSON report: its result's to_json(), or
    // {"error"} where the reference failed it.
    nlohmann::ordered_json steps = nlohmann::ordered_json::object();
    // Each compared step's typed result (absent where the reference failed it).
    std::map<std::string, std::shared_ptr<const StepResult>> results;
    // Step `step`'s result as its type R; null when the step did not run,
    // failed on the reference or is not an R.
    template <class R>
    const R* result(const std::string& step) const {
        const auto it = results.find(step);
        return it == results.end() ? nullptr : dynamic_cast<const R*>(it->second.get());
    }
};

}  // namespace kvasir
