// This tool's identity as every report and capture records it.
#pragma once

#include <nlohmann/json.hpp>

namespace kvasir {

nlohmann::ordered_json tool_json();  // {"name", "version", "git"}

}  // namespace kvasir
