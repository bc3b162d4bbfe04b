// The Markdown report of an audit, for hardware reports.
#pragma once

#include "kvasir/audit/results.hpp"

#include <string>

namespace kvasir {

// Markdown: summary line, a verdict table (node | verdict | worst criterion),
// per-node criterion tables, one pair table per matrix, the drift table.
std::string markdown_report(const AuditReport& report);

}  // namespace kvasir
