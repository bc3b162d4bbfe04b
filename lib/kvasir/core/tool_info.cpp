#include "kvasir/core/tool_info.hpp"

#ifndef KVASIR_GIT_COMMIT
#define KVASIR_GIT_COMMIT "unknown"
#endif

namespace kvasir {

nlohmann::ordered_json tool_json() {
    nlohmann::ordered_json j;
    j["name"] = "kvasir-equiv";
    j["version"] = KVASIR_VERSION;
    j["git"] = KVASIR_GIT_COMMIT;
    return j;
}

}  // namespace kvasir
