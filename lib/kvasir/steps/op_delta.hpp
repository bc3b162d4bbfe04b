// Protocol step 1 — per-op delta.
//
// Every op runs on every node with the same seeded inputs; each node is
// compared with the reference and every pair of nodes with each other (the
// backend-pair matrices of a hardware report). The MoE block runs with
// routing pinned by the reference node (router authority), and the shard
// check splits it across N simulated expert-parallel nodes on the *same*
// backend: regrouping the weighted sum must change it only by accumulation
// order (~1e-16 relative on the f64 oracle).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/model/model.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

struct OpsConfig {
    std::uint64_t seed = 20261129;
    std::int64_t tokens = 16;
    std::int64_t hidden = 2048;        // model width (Qwen3-30B-A3B: 2048)
    std::int64_t intermediate = 768;   // expert FFN width (Qwen3-30B-A3B: 768)
    std::int64_t experts = 16;         // experts instantiated for the moe op
    std::int64_t top_k = 8;
    std::int64_t vocab = 4096;         // softmax row width
    std::int64_t heads = 8;
    std::int64_t head_dim = 128;
    std::int64_t position_offset = 0;  // rope positions start here
    double rope_theta = 1e6;
    double rms_eps = 1e-6;
    int shards = 4;                    // simulated nodes in the shard check
    std::vector<std::string> ops;      // empty: all

    // Real weights: with a model, the shapes come from its config and layer
    // `layer` supplies the weights — matmul uses expert 0's gate matrix,
    // rmsnorm the post-attention norm, rope the model's head_dim and theta,
    // the router its real router matrix and scoring (only the router op that
    // matches the model's scoring runs), moe the real routed experts (the
    // part an expert-parallel worker computes; a shared expert stays on the
    // backbone and is not part of this block). Activations stay
    // seeded: a seeded N(0,1) hidden state is passed through the layer's own
    // post-attention RMSNorm on the reference, which gives the MoE input its
    // real statistics (every MoE input is such a norm's output).
    const Model* model = nullptr;
    std::int64_t layer = -1;

    // Throws Error(bad_input) naming the first bad field.
    void validate() const;
    // With a model: the config with the model's shapes filled in.
    OpsConfig resolved() const;
};

// Ops in the order they are run and reported.
const std::vector<std::string>& all_op_names();

struct OpResult {
    std::string op;
    std::string inputs;                      // one line: shapes and input distributions
    Shape output_shape;
    std::vector<std::string> errors;         // per node; empty string when the node ran
    // matrix[a][b]: node b as candidate against node a as reference (a != b).
    std::vector<std::vector<std::optional<CompareStats>>> matrix;
    // Router ops: agreement of the chosen expert ids, same layout.
    std::vector<std::vector<std::optional<IndexAgreement>>> id_matrix;
};

struct ShardCheck {
    std::string node;
    int shards = 0;
    std::optional<CompareStats> stats;  // sharded+combined vs monolithic, same node
    std::string error;
};

struct OpsReport {
    OpsConfig config;
    std::vector<Capabilities> nodes;
    std::size_t reference = 0;  // index into nodes
    std::vector<OpResult> ops;
    std::vector<ShardCheck> shard_checks;
};

// Runs step 1. A node that throws on an op is recorded as an error for that
// op and the others go on. `nodes[reference]` is the reference.
// `outputs` (optional) receives every node's raw outputs, per node index:
// "ops.<op>.out" (the compared value), "ops.<op>.ids" (router ops) and
// "ops.moe.shard_combined" (the shard check's recombined block) — what a
// capture stores (protocols/CAPTURE.md).
using OpsOutputs = std::vector<std::map<std::string, Tensor>>;
// What the run asks of the reference: everything (it runs every op and, with
// outputs, its entry also gets what the a-priori error bounds need), or only
// its decisions — the MoE op's routing and a model layer's MoE input — for a
// run that keeps only a candidate's outputs (a node's capture, audit/step_ops):
// then no op runs on the reference and its row of the report stays empty.
enum class ReferenceRole : std::uint8_t { full, decides_only };
OpsReport run_op_delta(const OpsConfig& config, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference,
                       OpsOutputs* outputs = nullptr, ReferenceRole role = ReferenceRole::full);

// The pair matrices of one op from the nodes' outputs (nullopt: the node did
// not produce it): what run_op_delta does after running the op, exposed for
// compare. `errors` (one per node) is completed with comparison failures.
OpResult op_result_from_outputs(const std::string& op, const std::string& inputs,
                                const std::vector<std::optional<TensorView>>& values,
                                const std::vector<std::optional<TensorView>>& ids, std::vector<std::string> errors);

nlohmann::ordered_json to_json(const OpsConfig& config);
nlohmann::ordered_json to_json(const OpsReport& report);

}  // namespace kvasir
