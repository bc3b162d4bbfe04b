#include "kvasir/core/tool_info.hpp"

#include "kvasir_git_commit.h"  // generated at build time (cmake/GitCommit.cmake)

namespace kvasir {

nlohmann::ordered_json tool_json() {
    nlohmann::ordered_json j;
    j["name"] = "kvasir-equiv";
    j["version"] = KVASIR_VERSION;
    j["git"] = KVASIR_GIT_COMMIT;
    return j;
}

std::string version_line() { return std::string("kvasir-equiv ") + KVASIR_VERSION + " (git " + KVASIR_GIT_COMMIT + ")"; }

}  // namespace kvasir
