// What audit and compare share: the report options (--json, -o, --junit,
// --markdown, --csv, --svg-heatmap, --svg-drift, --html, --gate) and writing the
// report (files atomically, then the terminal summary or JSON, then the exit
// code from the verdicts).
#pragma once

#include "commands.hpp"

#include "kvasir/audit/verdict.hpp"
#include "kvasir/report/writers.hpp"
#include "kvasir/audit/audit.hpp"

#include <string>
#include <utility>
#include <vector>

namespace kvasir::app {

struct ReportOptions {
    OutputOptions output;
    OutputPaths files;
    std::string gate = "sensitive";
};
void add_report_options(CLI::App& cmd, ReportOptions& options);
// Refuses (exit 2, naming the options) report files that cannot be written:
// one path for two outputs, an existing non-regular file; `more` adds the
// command's own outputs (capture's -o).
void check_report_outputs(const ReportOptions& options, std::vector<std::pair<std::string, std::string>> more = {});
// Writes every requested file (atomically), prints, sets command_exit_code().
void emit_report(const AuditRun& run, const ReportOptions& options);

}  // namespace kvasir::app
