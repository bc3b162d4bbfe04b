// Terminal rendering of step 1 (per-op delta): per op the backend-pair
// matrices of max|Δ| and cosine, then the shard check.
#pragma once

#include "kvasir/report/text.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <string>

namespace kvasir {

std::string render_ops_text(const OpsReport& report, const Style& style);

}  // namespace kvasir
