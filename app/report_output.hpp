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

namespace kvasir::app {

struct ReportOptions {
    OutputOptions output;
    OutputPaths files;
    std::string gate = "sensitive";
};
void add_report_options(CLI::App& cmd, ReportOptions& options);
// Writes every requested file (atomically), prints, sets command_exit_code().
void emit_report(const AuditRun& run, const ReportOptions& options);

}  // namespace kvasir::app
