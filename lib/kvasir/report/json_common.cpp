#include "kvasir/report/json_common.hpp"

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

nlohmann::ordered_json to_json(const Capabilities& c) {
    nlohmann::ordered_json j;
    j["node"] = c.node;
    j["backend"] = c.backend;
    j["device"] = c.device;
    j["runtime"] = c.runtime;
    j["storage"] = dtype_name(c.storage);
    j["accumulation"] = dtype_name(c.accumulation);
    j["output"] = dtype_name(c.output);
    j["fma"] = c.fma;
    j["threads"] = c.threads;
    j["deterministic"] = c.deterministic;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.extra) extra[k] = v;
    j["extra"] = extra;
    return j;
}

}  // namespace kvasir
