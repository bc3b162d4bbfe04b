// A node's capabilities as every report and capture records them (kept out
// of backend.hpp, which the GPU compilers also read).
#pragma once

#include "kvasir/backend/backend.hpp"

#include <nlohmann/json.hpp>

namespace kvasir {

nlohmann::ordered_json to_json(const Capabilities& caps);

}  // namespace kvasir
