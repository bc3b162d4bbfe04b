// JSON pieces shared by every report: the tool's identity and a node's
// capabilities. Keys keep insertion order (ordered_json) so reports diff
// cleanly between runs.
#pragma once

#include "kvasir/backend/backend.hpp"

#include <nlohmann/json.hpp>

namespace kvasir {

nlohmann::ordered_json tool_json();  // {"name", "version", "git"}
nlohmann::ordered_json to_json(const Capabilities& caps);

}  // namespace kvasir
