#include "kvasir/audit/audit_config.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace kvasir {

std::vector<std::string> select_steps(const Protocol& p, const std::vector<std::string>& asked, const char* option) {
    std::vector<std::string> runs;
    for (const std::string& s : protocol_step_names())
        if (p.runs(s)) runs.push_back(s);
    for (const std::string& s : asked)
        KVASIR_CHECK(std::find(runs.begin(), runs.end(), s) != runs.end(), ErrorCode::bad_input,
                     "{}: protocol '{}' does not run step {} (it runs: {})", option, p.id, nlohmann::json(s).dump(),
                     fmt::join(runs, ", "));
    std::vector<std::string> out;
    for (const std::string& s : runs)
        if (std::find(asked.begin(), asked.end(), s) != asked.end()) out.push_back(s);
    return out;
}

bool step_selected(const std::vector<std::string>& steps, std::string_view step) {
    return steps.empty() || std::find(steps.begin(), steps.end(), step) != steps.end();
}

Tolerances tolerances_of_steps(const Tolerances& tier, const std::vector<std::string>& steps) {
    Tolerances out;
    for (const auto& [name, t] : tier) {
        const auto info = find_criterion(name);
        if (info && step_selected(steps, info->step)) out.emplace(name, t);
    }
    return out;
}

}  // namespace kvasir
