// Terminal rendering of one step's section of an audit report — what a step
// command (kvasir-equiv drift, logits, …: audit/step_view.hpp) prints under
// the verdicts: the step's figures per node, read from the step's typed
// result (AuditReport::results, audit/step_<name>.hpp), and the determinism step's
// table when the view ran with --repeat. Tables only (TextTable); colour via
// Style, never needed to read the figures.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/report/text.hpp"

#include <string>

namespace kvasir {

// "" for a step the report does not hold or that has no text section.
std::string render_step_text(const AuditReport& report, const std::string& step, const Style& style);

// A registered step's text section (audit/step.hpp register_step): from its
// typed result (the one its compare() returned). Error(internal) for a step
// that has one.
using StepTextRenderer = std::string (*)(const StepResult& result, const Style& style);
void register_step_text(const std::string& step, StepTextRenderer render);

}  // namespace kvasir
