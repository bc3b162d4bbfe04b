// Terminal rendering of an audit: a header (protocol, model, reference,
// gate), one line per node with its verdict and the criterion that explains
// it, step errors, the headline pair matrices, the drift series and a closing
// line with the counts and the exit code.
#pragma once

#include "kvasir/report/text.hpp"
#include "kvasir/audit/results.hpp"
#include "kvasir/steps/node_clock.hpp"

#include <string>

namespace kvasir {

std::string render_audit_text(const AuditReport& report, const Style& style);

// --timings: the load phase (bytes, seconds, GB/s), then one row per step —
// wall seconds, seconds inside each node, and "other" (the step's own work:
// comparing, statistics, bookkeeping = wall − Σ nodes) — and a total row;
// then one line per node with a weight cache: hits, misses, evictions,
// bypasses, bytes uploaded, what is resident of the budget.
std::string render_timings(const RunTimings& t);

}  // namespace kvasir
