// write_outputs: builds each requested document with its format's writer,
// then writes them atomically.
#include "kvasir/report/writers.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/report/audit_html.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_junit.hpp"
#include "kvasir/report/audit_markdown.hpp"
#include "kvasir/report/cosine_csv.hpp"
#include "kvasir/report/drift_svg.hpp"
#include "kvasir/report/heatmap_svg.hpp"

#include <utility>

namespace kvasir {

// ============================================================================
// Files
// ============================================================================

void write_outputs(const AuditReport& r, const OutputPaths& p, const HtmlStamp& stamp) {
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
    if (!p.html.empty()) files.emplace_back(p.html, audit_html(r, stamp));
    for (const auto& [path, content] : files) write_file_atomic(path, content);
}

}  // namespace kvasir
