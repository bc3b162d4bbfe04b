// Markdown tables of backend pairs, the form engineers paste into hardware
// reports: one row per unordered pair of nodes.
#pragma once

#include "kvasir/steps/op_delta.hpp"

#include <string>

namespace kvasir {

// | backend pair | max abs Δ | cosine | for one op of a report (throws
// Error(internal) if the report does not hold that op).
std::string pair_table_markdown(const OpsReport& report, const std::string& op);

}  // namespace kvasir
