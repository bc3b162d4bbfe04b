// The HTML report (SPEC §6): one self-contained page that people forward
// instead of the JSON. Self-contained means no network at all: no external
// script, stylesheet, font or image, no URL anywhere (the inline SVGs carry
// no xmlns: HTML needs none), and a Content-Security-Policy of
// default-src 'none' so a browser would refuse a request even if one slipped
// in. Inline CSS; a few lines of inline JavaScript sort the tables (click a
// column header) and open every collapsed section before printing — the
// page reads the same without them.
//
// Top to bottom: header (model and fingerprint, protocol id/version/hash,
// reference, seed, gate, tool version and git commit, and the HtmlStamp's
// date and machine); the verdict table (verdict as colour, text and shape;
// gate; worst criterion with value, tolerance and margin; capabilities;
// errors; contrast nodes marked "not gated"); per-op pair heatmaps of max|Δ|
// and 1 − cosine (log colour scale, values in the cells; the headline op
// open, the others collapsed under a one-line summary); drift against depth
// (log-log, √L and L guides) with α per node; the KL distribution per node
// (percentiles min … max, log scale, with the kl_p99 tolerances); top-1 and
// routing agreement; generation (first divergence, the continuation as token
// ids with divergent tokens marked, and decoded where the model has a
// tokenizer.json); perplexity; the task score (a protocol with a task step);
// determinism; invariance; each registered step's section; every criterion
// of every node (collapsible); the tolerances with their `why`. Every step
// section reads the step's typed result (AuditReport::results). A section whose step the report lacks (a compare of
// partial captures) is left out. Colours: verdicts in the Okabe–Ito palette,
// heatmaps in reversed viridis (light = identical, dark = different), plot
// series in colour and marker shape — all readable without colour.
#pragma once

#include "kvasir/audit/results.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace kvasir {

// When and where an HTML page was written, shown in its header; empty
// fields are left out. The caller decides (the CLI: the clock, or
// SOURCE_DATE_EPOCH, and the host name), so the builders stay pure.
struct HtmlStamp {
    std::string date;
    std::string machine;
};

// The audit's (or compare's) page. Pure: the same report and stamp give the
// same bytes. Error(internal) for a pair matrix that is not square.
std::string audit_html(const AuditReport& report, const HtmlStamp& stamp = {});

// A registered step's HTML section (audit/step.hpp register_step), from its
// typed result: the markup inside <section id="step-NAME"> under its
// heading (tables, notes; every text it shows escaped with xml_escape). A
// registered step without one is shown as a table of its JSON entries.
// Error(internal) for a step that has one.
using StepHtmlRenderer = std::string (*)(const StepResult& result);
void register_step_html(const std::string& step, StepHtmlRenderer render);

// The matrix command's page (it judges nothing): header (`model` as
// audit_model_json() writes it plus anything the caller adds, the op
// configuration, tool), the nodes' capabilities, and per op the max|Δ| and
// 1 − cosine heatmaps with a pair table, the shard check and node errors.
std::string matrix_html(const OpsReport& report, const nlohmann::ordered_json& model, const HtmlStamp& stamp = {});

}  // namespace kvasir
