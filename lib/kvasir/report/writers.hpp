// Audit outputs (SPEC §6): the report model every format is built from
// (AuditReport, pair matrices, drift series) and write_outputs(). The formats
// have a header each: the versioned JSON report (audit_json.hpp), JUnit XML
// for CI (audit_junit.hpp), Markdown for hardware reports
// (audit_markdown.hpp), the cosine pair matrix as CSV (cosine_csv.hpp), an SVG
// heatmap of that matrix (heatmap_svg.hpp) and an SVG plot of drift against
// depth (drift_svg.hpp).
//
// Every builder returns the document as a string and is pure (no clock, no
// environment): the same AuditReport gives the same bytes, so reports diff
// cleanly and tests compare exactly. write_outputs() writes each requested
// file with write_file_atomic() (temp file in the same folder, fsync,
// rename): an audit killed mid-way leaves every previous output intact and
// no partial file in its place.
#pragma once

#include "kvasir/metrics/metrics.hpp"
#include "kvasir/report/protocol.hpp"
#include "kvasir/report/verdict.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
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
};
ProtocolRef protocol_ref(const Protocol& p);

struct AuditReport {
    ProtocolRef protocol;
    nlohmann::ordered_json model = nlohmann::ordered_json::object();  // must hold "fingerprint" (string)
    std::string reference;  // node spec of the reference
    std::uint64_t seed = 0;
    Gate gate = Gate::sensitive;
    std::vector<NodeVerdict> nodes;
    std::vector<PairMatrix> pairs;  // pairs.front() is the headline matrix (CSV, heatmap)
    std::vector<DriftSeries> drift;
    nlohmann::ordered_json steps = nlohmann::ordered_json::object();  // free-form per-step data
};

// Files to write; an empty path is skipped.
struct OutputPaths {
    std::string json;
    std::string junit;
    std::string markdown;
    std::string csv;          // cosine matrix of pairs.front()
    std::string heatmap_svg;  // of pairs.front()
    std::string drift_svg;
};
// Builds every requested document first, then writes each atomically (so a
// builder error writes nothing). A csv/heatmap request with no pair matrix is
// Error(bad_input). Write failures are Error(bad_input) naming the path.
void write_outputs(const AuditReport& report, const OutputPaths& paths);

}  // namespace kvasir
