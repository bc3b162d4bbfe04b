// markdown_report (audit_markdown.hpp): verdicts, per-node criteria, backend
// pairs and drift as Markdown tables.
#include "kvasir/report/audit_markdown.hpp"

#include "kvasir/report/text.hpp"
#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace kvasir {

using namespace writers_detail;

namespace {

std::string md(std::string_view s) {  // a table cell: pipes escaped, one line
    std::string out;
    for (const char c : s) {
        if (c == '|')
            out += "\\|";
        else if (c == '\n' || c == '\r')
            out += ' ';
        else
            out += c;
    }
    return out;
}

std::string opt_sci(const std::optional<double>& x) { return x ? fmt_sci(*x) : "not measured"; }
std::string opt_cos(const std::optional<double>& x) { return x ? fmt_cosine(*x) : "not measured"; }

}  // namespace

std::string markdown_report(const AuditReport& r) {
    const bool from_captures = r.model.value("source", std::string()) == "captures";
    std::string out = from_captures ? "# kvasir-equiv compare\n\n" : "# kvasir-equiv audit\n\n";
    const int code = exit_code(r.nodes, r.gate);
    out += fmt::format("Protocol `{}` v{} (`{}`){}, reference `{}`, seed {}, gate **{}** → exit code **{}**.\n\n", r.protocol.id,
                       r.protocol.version, r.protocol.content_hash,
                       r.protocol.steps_judged.empty()
                           ? std::string()
                           : fmt::format(", steps judged: {} only", fmt::join(r.protocol.steps_judged, ", ")),
                       r.reference, r.seed, to_string(r.gate), code);
    if (r.model.is_object() && r.model.contains("fingerprint"))
        out += fmt::format("Model fingerprint `{}`{}.\n\n", scalar_text(r.model["fingerprint"]),
                           r.model.contains("path") ? fmt::format(" (`{}`)", scalar_text(r.model["path"])) : "");

    out += "## Verdicts\n\n";
    if (std::none_of(r.nodes.begin(), r.nodes.end(), [](const NodeVerdict& v) { return v.verdict != Verdict::reference; }))
        out += "**No node was judged: nothing compared is never a pass.**\n\n";
    out += "| node | verdict | worst criterion | accumulation | errors |\n|---|---|---|---|---|\n";
    for (const NodeVerdict& v : r.nodes) {
        std::string errs;
        for (const auto& [step, msg] : v.errors) errs += (errs.empty() ? "" : "; ") + step + ": " + msg;
        const std::string acc = v.capabilities.is_object() && v.capabilities.contains("accumulation")
                                    ? scalar_text(v.capabilities["accumulation"])
                                    : "";
        out += fmt::format("| {} | {} | {} | {} | {} |\n", md(v.floor ? v.node + " (floor)" : v.node), std::string(to_string(v.verdict)) + (v.contrast ? " (contrast, not gated)" : ""), md(v.worst ? describe(*v.worst) : "—"),
                           md(acc), md(errs.empty() ? "—" : errs));
    }

    for (const auto& [criterion, why] : not_applicable_criteria(r.nodes))
        out += fmt::format("\nNot judged: `{}` does not apply to this model ({}).\n", criterion, md(why));
    for (const std::string& w : sample_size_warnings(r.nodes)) out += fmt::format("\nWarning (sample size): {}.\n", md(w));
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [step, where] : v.localisation) out += fmt::format("\nWhere to look for `{}`: {}.\n", md(v.node), md(where));
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [why, criteria] : not_measurable_by_reason(v))
            out += fmt::format("\nNot judged for {}: `{}` ({}).\n", md(v.node), fmt::join(criteria, "`, `"), md(why));

    for (const NodeVerdict& v : r.nodes) {
        if (v.verdict == Verdict::reference) continue;
        out += fmt::format("\n### {} — {}\n\n| tier | criterion | value | tolerance | pass | margin |\n|---|---|---|---|---|---|\n",
                           md(v.node), to_string(v.verdict));
        for (const Tier t : {Tier::sensitive, Tier::tolerant})
            for (const CriterionResult& c : v.tier(t)) {
                const std::string value = c.measured ? shortest(c.value) : "not measured";
                const std::string margin = std::isnan(c.margin) ? "—" : fmt::format("{:+.3g} {}", c.margin, margin_unit(c.scale));
                out += fmt::format("| {} | {} | {} | {} {} | {} | {} |\n", to_string(t), md(c.criterion), value,
                                   c.direction == Direction::max ? "≤" : "≥", shortest(c.tolerance), c.pass ? "yes" : "**no**",
                                   margin);
            }
    }

    if (!r.pairs.empty()) out += "\n## Backend pairs\n";
    for (const PairMatrix& m : r.pairs) {
        out += fmt::format("\n**{}** — {}\n\n| backend pair | max abs Δ | cosine |\n|---|---|---|\n", md(m.name), md(m.description));
        for (std::size_t a = 0; a < m.nodes.size(); ++a)
            for (std::size_t b = a + 1; b < m.nodes.size(); ++b)
                out += fmt::format("| {} vs {} | {} | {} |\n", md(m.nodes[b]), md(m.nodes[a]), opt_sci(m.max_abs[a][b]),
                                   opt_cos(m.cosine[a][b]));
    }

    if (!r.drift.empty()) {
        std::size_t depth = 0;
        for (const DriftSeries& s : r.drift) depth = std::max(depth, s.rel.size());
        out += "\n## Drift over depth\n\n| node | α |";
        for (std::size_t l = 1; l <= depth; ++l) out += fmt::format(" L{} |", l);
        out += "\n|---|---|";
        for (std::size_t l = 1; l <= depth; ++l) out += "---|";
        out += "\n";
        for (const DriftSeries& s : r.drift) {
            out += fmt::format("| {} | {} |", md(s.node), std::isfinite(s.alpha) ? fmt::format("{:.3f}", s.alpha) : shortest(s.alpha));
            for (std::size_t l = 0; l < depth; ++l) out += " " + (l < s.rel.size() ? fmt_sci(s.rel[l]) : std::string("")) + " |";
            out += "\n";
        }
    }
    return out;
}

}  // namespace kvasir
