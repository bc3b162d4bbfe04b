// Audit outputs (SPEC §6): the versioned JSON report, JUnit XML for CI,
// Markdown for hardware reports, the cosine pair matrix as CSV, an SVG
// heatmap of that matrix and an SVG plot of drift against depth.
//
// Every builder returns the document as a string and is pure (no clock, no
// environment): the same AuditReport gives the same bytes, so reports diff
// cleanly and tests compare exactly. write_outputs() writes each requested
// file with write_file_atomic() (temp file in the same folder, fsync,
// rename): an audit killed mid-way leaves every previous output intact and
// no partial file in its place.
//
// JSON report "kvasir-equiv/audit/1" (protocols/report.schema.json), keys in
// this order:
//   schema, tool {name, version, git},
//   protocol {id, version, content_hash, path},
//   model {fingerprint, ...free-form: path, architecture...},
//   reference, seed, gate, exit_code,
//   summary {nodes, judged, fit, unfit-sensitive, unfit, error},
//   nodes [to_json(NodeVerdict)...]          (verdict.hpp)
//   pairs [{name, description, nodes, max_abs[][], cosine[][]}...]
//   drift [{node, depth[], rel[], alpha}...]
//   steps {...free-form per-step data...}
// Doubles go through json_double(): NaN/±Inf become "nan"/"inf"/"-inf"
// (never null, which would hide a failure); null in a matrix means "not
// measured" (the node errored on that comparison).
//
// JUnit XML: <testsuites> with one <testsuite> per node (properties: the
// verdict and the capabilities) and one <testcase> per judged criterion per
// tier (name "<tier>: <criterion>"), plus one per step error. What fails is
// tied to the gate so that the file and the exit code never disagree:
//   * a failing criterion of a gated tier → <failure message="...">, an
//     unmeasured one too ("nothing compared is never a pass");
//   * a non-finite value or a step error → <error message="...">;
//   * a failing criterion of a tier the gate does not cover (sensitive
//     criteria under --gate tolerant; everything under --gate none) →
//     <skipped message="not gated: ...">;
//   * zero judged nodes → a testcase "audit: nodes judged" with a failure.
// Invariant (tested): failures + errors > 0  ⇔  exit_code(nodes, gate) == 1.
// The reference node's suite holds one passing testcase "reference" (plus an
// <error> per step error of the reference when gated).
#pragma once

#include "kvasir/metrics/metrics.hpp"
#include "kvasir/report/protocol.hpp"
#include "kvasir/report/verdict.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

inline constexpr const char* kAuditReportSchema = "kvasir-equiv/audit/1";

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

// The JSON report (see the top of this file). Error(internal) when model has
// no string "fingerprint" or a pair matrix is not square over its nodes.
nlohmann::ordered_json audit_report_json(const AuditReport& report);

// JUnit XML (see the top of this file), UTF-8, XML-escaped throughout.
std::string junit_xml(const AuditReport& report);

// Markdown: summary line, a verdict table (node | verdict | worst criterion),
// per-node criterion tables, one pair table per matrix, the drift table.
std::string markdown_report(const AuditReport& report);

// The cosine matrix as CSV (RFC 4180): header "node,<node>...", one row per
// reference node; values in shortest round-trip form, "nan"/"inf", empty
// where not measured. Fields holding ',', '"' or a line break are quoted
// (node specs such as "cpu:acc=f16,storage=bf16" contain commas).
std::string cosine_csv(const PairMatrix& m);

// SVG heatmap of the cosine matrix: an n×n grid, rows = reference node,
// columns = candidate; each off-diagonal cell (class="cell") is coloured by
// log10(1 − cosine) clamped to [1e-16, 1] (green: identical to the last bit
// of f64; yellow: 1e-8; red: 1 − cos ≥ 1e-1) and labelled with the cosine
// and max|Δ|; diagonal cells have class="diag"; not-measured cells are grey.
// A colour bar gives the scale.
std::string heatmap_svg(const PairMatrix& m);

// SVG plot of drift against depth, log-log axes, one polyline per node
// (class="series") with its alpha in the legend, and two guides
// (class="guide") through the geometric mean of the depth-1 values:
// ∝ √L (incoherent growth) and ∝ L (coherent growth). Values that are not
// finite and positive cannot sit on a log axis: they are left out (a gap)
// and the legend says "identical" for a series with no positive value.
std::string drift_svg(const std::vector<DriftSeries>& series);

// Minimal XML text/attribute escaping: & < > " '. Control characters other
// than tab/LF/CR (not allowed in XML 1.0) become U+FFFD.
std::string xml_escape(std::string_view text);

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
