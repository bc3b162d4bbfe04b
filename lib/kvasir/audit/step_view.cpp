#include "kvasir/audit/step_view.hpp"

#include "kvasir/audit/audit_config.hpp"
#include "kvasir/core/canonical_json.hpp"
#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kvasir {

Protocol view_protocol(const Protocol& base, const StepView& view, const TokenSequence& tokens) {
    const auto& names = protocol_step_names();
    KVASIR_CHECK(std::find(names.begin(), names.end(), view.step) != names.end(), ErrorCode::internal,
                 "no protocol step '{}' to view", view.step);
    Protocol p = base;
    for (const std::string& s : names) p.enabled(s) = false;
    p.enabled(view.step) = true;
    std::vector<std::string> steps{view.step};
    if (view.repeat) {
        p.determinism.enabled = true;
        p.determinism.repeats = 2;
        steps.emplace_back("determinism");
    }
    if (view.configure) view.configure(p);
    p.sensitive = tolerances_of_steps(base.sensitive, steps);
    p.tolerant = tolerances_of_steps(base.tolerant, steps);
    for (Tolerances* tier : {&p.sensitive, &p.tolerant})
        if (const auto t = tier->find("generate.first_divergence_min"); t != tier->end() && t->second.value > static_cast<double>(p.generate.n)) {
            t->second.value = static_cast<double>(p.generate.n);
            t->second.why += fmt::format(" (capped at the view's {} new tokens)", p.generate.n);
        }
    p.id = view.step;
    p.version = 1;
    p.description = "kvasir-equiv " + view.step + ": the audit's " + view.step + " step, as the command line asked";
    p.document = nlohmann::json{{"view", view.step},
                                {"repeat", view.repeat},
                                {"of", {{"id", base.id}, {"version", base.version}, {"content_hash", base.content_hash}}},
                                {"tokens", {{"count", tokens.ids.size()}, {"source", tokens.source}}},
                                {"settings", view.settings.is_null() ? nlohmann::json::object() : view.settings}};
    p.content_hash = content_hash(p.document);
    return p;
}

AuditRun run_view(const Protocol& protocol, const Model& model, const TokenSequence& tokens,
                  std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference, Gate gate, std::uint64_t seed,
                  const std::string& tokenizer) {
    AuditConfig ac;
    ac.protocol = &protocol;
    ac.model = &model;
    ac.gate = gate;
    ac.seed = seed;
    ac.tokens = tokens;
    ac.tokenizer = tokenizer;
    return run_audit(ac, nodes, reference);
}

}  // namespace kvasir
