// Terminal rendering of protocol steps 2–6: one block per step with a
// header line (model, tokens, reference, how routing was decided), a table
// per candidate or one row per candidate, and the self non-determinism
// table when the step ran with repeat. Tables only (TextTable); colour via
// Style (red for errors and non-bit-identical repeats, yellow for flips and
// divergences, never needed to read the figures).
#pragma once

#include "kvasir/report/text.hpp"
#include "kvasir/steps/decide.hpp"
#include "kvasir/steps/drift.hpp"
#include "kvasir/steps/generate.hpp"
#include "kvasir/steps/logits.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/task.hpp"

#include <string>
#include <vector>

namespace kvasir {

std::string render_drift_text(const DriftReport& report, const Style& style);
std::string render_logits_text(const LogitsReport& report, const Style& style);
std::string render_decide_text(const DecideReport& report, const Style& style);
std::string render_generate_text(const GenerateReport& report, const Style& style);
std::string render_perplexity_text(const PerplexityReport& report, const Style& style);
std::string render_task_text(const TaskReport& report, const Style& style);

// The self non-determinism table ("" when `checks` is empty).
std::string render_self_checks_text(const std::vector<SelfCheck>& checks, const Style& style);

}  // namespace kvasir
