// This tool's identity as every report and capture records it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvasir {

nlohmann::ordered_json tool_json();  // {"name", "version", "git"}: git = HEAD at build time (cmake/GitCommit.cmake)
std::string version_line();          // "kvasir-equiv 0.1.0 (git 1a2b3c4d5e6f)"

}  // namespace kvasir
