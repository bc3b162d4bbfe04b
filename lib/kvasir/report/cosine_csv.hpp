// The headline cosine pair matrix as CSV, for spreadsheets and scripts.
#pragma once

#include "kvasir/audit/results.hpp"

#include <string>

namespace kvasir {

// The cosine matrix as CSV (RFC 4180): header "node,<node>...", one row per
// reference node; values in shortest round-trip form, "nan"/"inf", empty
// where not measured. Fields holding ',', '"' or a line break are quoted
// (node specs such as "cpu:acc=f16,storage=bf16" contain commas).
std::string cosine_csv(const PairMatrix& m);

}  // namespace kvasir
