// The versioned JSON report of an audit, "kvasir-equiv/audit/1"
// (protocols/report.schema.json); keys in this order:
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
#pragma once

#include "kvasir/audit/results.hpp"

#include <nlohmann/json.hpp>

namespace kvasir {

inline constexpr const char* kAuditReportSchema = "kvasir-equiv/audit/1";

// The JSON report (see the top of this file). Error(internal) when model has
// no string "fingerprint" or a pair matrix is not square over its nodes.
nlohmann::ordered_json audit_report_json(const AuditReport& report);

}  // namespace kvasir
