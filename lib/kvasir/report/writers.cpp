// The report model's constructors (pair matrices from step data, the
// protocol reference) and write_outputs, which builds each requested document
// with its format's writer and then writes them atomically.
#include "kvasir/report/writers.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_junit.hpp"
#include "kvasir/report/audit_markdown.hpp"
#include "kvasir/report/cosine_csv.hpp"
#include "kvasir/report/drift_svg.hpp"
#include "kvasir/report/heatmap_svg.hpp"

#include <utility>

namespace kvasir {

// ============================================================================
// Pair matrices
// ============================================================================

PairMatrix pair_matrix(std::string name, std::string description, std::vector<std::string> nodes,
                       const std::vector<std::vector<std::optional<CompareStats>>>& stats) {
    const std::size_t n = nodes.size();
    KVASIR_CHECK(stats.size() == n, ErrorCode::internal, "pair matrix '{}': {} rows for {} nodes", name, stats.size(), n);
    PairMatrix m;
    m.name = std::move(name);
    m.description = std::move(description);
    m.nodes = std::move(nodes);
    m.max_abs.assign(n, std::vector<std::optional<double>>(n));
    m.cosine.assign(n, std::vector<std::optional<double>>(n));
    for (std::size_t a = 0; a < n; ++a) {
        KVASIR_CHECK(stats[a].size() == n, ErrorCode::internal, "pair matrix '{}': row {} has {} entries for {} nodes", m.name,
                     a, stats[a].size(), n);
        for (std::size_t b = 0; b < n; ++b) {
            if (a == b) {
                m.max_abs[a][b] = 0.0;
                m.cosine[a][b] = 1.0;
            } else if (stats[a][b]) {
                m.max_abs[a][b] = stats[a][b]->max_abs;
                m.cosine[a][b] = stats[a][b]->cosine;
            }
        }
    }
    return m;
}

PairMatrix pair_matrix(const OpsReport& report, const std::string& op) {
    for (const OpResult& r : report.ops)
        if (r.op == op) {
            std::vector<std::string> nodes;
            for (const Capabilities& c : report.nodes) nodes.push_back(c.node);
            return pair_matrix(op, r.inputs, std::move(nodes), r.matrix);
        }
    fail(ErrorCode::internal, "step 1 report has no op '{}'", op);
}

ProtocolRef protocol_ref(const Protocol& p) { return ProtocolRef{p.id, p.version, p.content_hash, p.source}; }

// ============================================================================
// Files
// ============================================================================

void write_outputs(const AuditReport& r, const OutputPaths& p) {
    std::vector<std::pair<std::string, std::string>> files;  // (path, content): build everything first
    if (!p.json.empty()) files.emplace_back(p.json, audit_report_json(r).dump(2) + "\n");
    if (!p.junit.empty()) files.emplace_back(p.junit, junit_xml(r));
    if (!p.markdown.empty()) files.emplace_back(p.markdown, markdown_report(r));
    if ((!p.csv.empty() || !p.heatmap_svg.empty()) && r.pairs.empty())
        fail(ErrorCode::bad_input, "{}: no pair matrix to write (the audit compared no pair of nodes)",
             p.csv.empty() ? p.heatmap_svg : p.csv);
    if (!p.csv.empty()) files.emplace_back(p.csv, cosine_csv(r.pairs.front()));
    if (!p.heatmap_svg.empty()) files.emplace_back(p.heatmap_svg, heatmap_svg(r.pairs.front()));
    if (!p.drift_svg.empty()) files.emplace_back(p.drift_svg, drift_svg(r.drift));
    for (const auto& [path, content] : files) write_file_atomic(path, content);
}

}  // namespace kvasir
