// Terminal rendering of an audit: a header (protocol, model, reference,
// gate), one line per node with its verdict and the criterion that explains
// it, step errors, the headline pair matrices, the drift series and a closing
// line with the counts and the exit code.
#pragma once

#include "kvasir/report/text.hpp"
#include "kvasir/report/writers.hpp"

#include <string>

namespace kvasir {

std::string render_audit_text(const AuditReport& report, const Style& style);

}  // namespace kvasir
