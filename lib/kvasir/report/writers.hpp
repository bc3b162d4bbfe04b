// Audit outputs (SPEC §6): write_outputs(), from the report model every
// format is built from (AuditReport, audit/results.hpp: report/ only reads
// results). The formats
// have a header each: the versioned JSON report (audit_json.hpp), JUnit XML
// for CI (audit_junit.hpp), Markdown for hardware reports
// (audit_markdown.hpp), the cosine pair matrix as CSV (cosine_csv.hpp), an SVG
// heatmap of that matrix (heatmap_svg.hpp), an SVG plot of drift against
// depth (drift_svg.hpp) and one self-contained HTML page with all of it
// (audit_html.hpp).
//
// Every builder returns the document as a string and is pure (no clock, no
// environment): the same AuditReport gives the same bytes, so reports diff
// cleanly and tests compare exactly. The HTML page's date and machine are
// inputs (HtmlStamp) like the report itself, never read by the builder. write_outputs() writes each requested
// file with write_file_atomic() (temp file in the same folder, fsync,
// rename): an audit killed mid-way leaves every previous output intact and
// no partial file in its place.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/report/audit_html.hpp"  // HtmlStamp

#include <string>

namespace kvasir {

// Files to write; an empty path is skipped.
struct OutputPaths {
    std::string json;
    std::string junit;
    std::string markdown;
    std::string csv;          // cosine matrix of pairs.front()
    std::string heatmap_svg;  // of pairs.front()
    std::string drift_svg;
    std::string html;         // the self-contained HTML report
};

// Builds every requested document first, then writes each atomically (so a
// builder error writes nothing). A csv/heatmap request with no pair matrix is
// Error(bad_input). Write failures are Error(bad_input) naming the path.
void write_outputs(const AuditReport& report, const OutputPaths& paths, const HtmlStamp& stamp = {});

}  // namespace kvasir
