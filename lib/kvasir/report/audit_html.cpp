// audit_html and matrix_html (audit_html.hpp): the page skeleton (head,
// CSS, the sorting script), one function per section, and the KL
// percentile plot (the only chart drawn here: the heatmaps and the drift
// plot come from heatmap_svg.cpp and drift_svg.cpp).
#include "kvasir/report/audit_html.hpp"
#include "kvasir/audit/step_decide.hpp"
#include "kvasir/audit/step_determinism.hpp"
#include "kvasir/audit/step_drift.hpp"
#include "kvasir/audit/step_generate.hpp"
#include "kvasir/audit/step_invariance.hpp"
#include "kvasir/audit/step_logits.hpp"
#include "kvasir/audit/step_perplexity.hpp"
#include "kvasir/audit/step_task.hpp"
#include "kvasir/core/nonfinite.hpp"

#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/report/drift_svg.hpp"
#include "kvasir/report/heatmap_svg.hpp"
#include "kvasir/report/text.hpp"
#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <optional>
#include <utility>

namespace kvasir {

using namespace writers_detail;
using Json = nlohmann::ordered_json;

namespace {

std::string h(std::string_view text) { return xml_escape(text); }

// --- reading the free-form step data ------------------------------------------------

const Json* field(const Json& j, const char* key) {
    if (!j.is_object()) return nullptr;
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
}

// A number as the report writes it (json_double: non-finite as "nan", "inf",
// "-inf"); NaN for anything else or absent.
double number(const Json* j) {
    if (j == nullptr) return kNaN;
    if (j->is_number()) return j->get<double>();
    if (j->is_string()) {
        const std::string s = j->get<std::string>();
        if (s == "inf") return std::numeric_limits<double>::infinity();
        if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    return kNaN;
}
double number(const Json& j, const char* key) { return number(field(j, key)); }

std::string text(const Json& j, const char* key) {
    const Json* f = field(j, key);
    return f == nullptr || f->is_null() ? std::string() : scalar_text(*f);
}

// The per-node entries of a step ("results"), or an empty array.
const Json& results(const AuditReport& r, const char* step, const char* key = "results") {
    static const Json empty = Json::array();
    const Json* s = field(r.steps, step);
    const Json* res = s ? field(*s, key) : nullptr;
    return res && res->is_array() ? *res : empty;
}

// --- small pieces of markup -------------------------------------------------------

// A table cell holding a number: right-aligned, monospace, sortable by value.
std::string num_td(double v, const std::string& shown) {
    std::string key;
    if (std::isfinite(v))
        key = shortest(v);
    else if (std::isinf(v))
        key = v > 0 ? "Infinity" : "-Infinity";
    return key.empty() ? fmt::format("<td class=\"num\">{}</td>", h(shown))
                       : fmt::format("<td class=\"num\" data-v=\"{}\">{}</td>", key, h(shown));
}

// A criterion's value cell; a rate adds the evidence it was judged on (its
// counts and confidence bound, format_rate()) on a second line.
std::string value_td(const CriterionResult& c) {
    if (!c.measured) return num_td(c.value, "not measured");
    std::string td = num_td(c.value, format_value(c, c.value));
    const std::string rate = format_rate(c);
    if (!rate.empty()) td.insert(td.size() - 5, "<br/><span class=\"note\">" + h(rate) + "</span>");
    return td;
}

// An SVG document embedded in the page: the namespace declaration dropped
// (HTML needs none, and the page holds no URL), a class and a label added.
std::string embed_svg(const std::string& svg, const std::string& cls, const std::string& label) {
    static const std::string prefix = "<svg xmlns=\"http://www.w3.org/2000/svg\" ";
    KVASIR_CHECK(svg.rfind(prefix, 0) == 0, ErrorCode::internal, "embedded SVG does not start with its namespace declaration");
    return fmt::format("<svg class=\"{}\" role=\"img\" aria-label=\"{}\" {}", cls, h(label), svg.substr(prefix.size()));
}

struct VerdictLook {
    const char* cls;
    const char* colour;
    Marker shape;
};
VerdictLook look(Verdict v) {
    switch (v) {
        case Verdict::reference: return {"v-ref", "#777777", Marker::diamond};
        case Verdict::fit: return {"v-fit", "#009e73", Marker::circle};
        case Verdict::unfit_sensitive: return {"v-us", "#e69f00", Marker::triangle};
        case Verdict::unfit: return {"v-unfit", "#d55e00", Marker::square};
        case Verdict::error: return {"v-err", "#cc79a7", Marker::cross};
    }
    return {"v-err", "#cc79a7", Marker::cross};
}

// A small inline shape (14×14) — the verdict's or a plot series'.
std::string glyph(Marker m, const char* colour) {
    return "<svg class=\"glyph\" width=\"14\" height=\"14\" viewBox=\"0 0 14 14\" aria-hidden=\"true\">" +
           marker_svg(m, 7, 7, 5, colour) + "</svg>";
}

// Verdict as colour, shape and text.
std::string badge(Verdict v) {
    const VerdictLook l = look(v);
    return fmt::format("<span class=\"v {}\">{}{}</span>", l.cls, glyph(l.shape, l.colour), to_string(v));
}

std::string series_key(std::size_t style) {
    return "<svg class=\"glyph\" width=\"26\" height=\"14\" viewBox=\"0 0 26 14\" aria-hidden=\"true\">" +
           fmt::format("<line x1=\"1\" y1=\"7\" x2=\"25\" y2=\"7\" stroke=\"{}\" stroke-width=\"2\"/>", series_colour(style)) +
           marker_svg(series_marker(style), 13, 7, 4, series_colour(style)) + "</svg>";
}

// --- the page ---------------------------------------------------------------------

const char* const kCss = R"(*{box-sizing:border-box}
body{margin:0;padding:18px 28px 40px;font:14px/1.45 "DejaVu Sans",Helvetica,Arial,sans-serif;color:#1b1b1b;background:#fff}
main{max-width:1500px;margin:0 auto}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:18px;margin:28px 0 8px;padding-bottom:3px;border-bottom:2px solid #d5d5d5}
h3{font-size:15px;margin:14px 0 4px}
p{margin:5px 0}
.note{color:#555;font-size:13px}
code,.mono,td.num{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12.5px}
nav{margin:8px 0 4px;font-size:13px}
nav a{margin-right:12px;color:#0b5394}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:1px 14px;margin:8px 0;font-size:13px}
dl.meta dt{color:#555}
dl.meta dd{margin:0;overflow-wrap:anywhere}
.summary{font-size:16px;margin:10px 0 4px}
.warn{font-weight:bold;color:#a02b00}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #cdcdcd;padding:3px 6px;text-align:left;vertical-align:top}
thead th{background:#eeeeee;position:sticky;top:0}
table.sortable thead th{cursor:pointer}
td.num{text-align:right;white-space:nowrap}
td.why{max-width:560px;font-size:12.5px}
td.caps{font-size:12px;color:#333;min-width:190px;max-width:340px}
td.caps .mono{white-space:nowrap}
td.caps .note{font-size:11.5px}
.v{display:inline-flex;align-items:center;gap:4px;font-weight:bold;white-space:nowrap}
.glyph{vertical-align:middle;flex:none}
tr.v-fit{background:#e7f4ef}
tr.v-us{background:#fcf0da}
tr.v-unfit{background:#fbe2d5}
tr.v-err{background:#f6e4ee}
tr.v-fit td:first-child{border-left:6px solid #009e73}
tr.v-us td:first-child{border-left:6px solid #e69f00}
tr.v-unfit td:first-child{border-left:6px solid #d55e00}
tr.v-err td:first-child{border-left:6px solid #cc79a7}
tr.v-ref td:first-child{border-left:6px solid #777777}
.tag{display:inline-block;font-size:11px;border:1px solid #777;border-radius:3px;padding:0 4px;margin-left:6px;color:#333;font-weight:normal}
.fail{font-weight:bold;color:#a02b00}
tr.failrow{background:#fbe2d5}
details{margin:6px 0;border:1px solid #e2e2e2;border-radius:4px;padding:2px 8px}
details[open]{padding-bottom:8px}
summary{cursor:pointer;padding:3px 0}
.figs{display:flex;flex-wrap:wrap;gap:10px 28px;align-items:flex-start}
svg{max-width:100%;height:auto}
.tokens{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px;line-height:1.9}
.tokens span{display:inline-block;min-width:2.8em;padding:0 3px;margin:0 1px;border:1px solid #d0d0d0;border-radius:2px;text-align:right}
.tokens span.d{border:2px solid #1b1b1b;background:#fde725;font-weight:bold;text-decoration:underline}
footer{margin-top:30px;color:#666;font-size:12px;border-top:1px solid #ddd;padding-top:6px}
@media print{body{padding:0}nav{display:none}thead th{position:static}tr,svg,details{break-inside:avoid}
*{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
)";

// Sorting (click a header; numbers by data-v) and opening every <details>
// before printing. No "</" inside: it would end the script element.
const char* const kScript = R"((function(){
function key(c){var v=c.getAttribute('data-v');return v===null?NaN:parseFloat(v);}
document.querySelectorAll('table.sortable thead th').forEach(function(th){
th.title='sort';
th.addEventListener('click',function(){
var tb=th.closest('table').tBodies[0],i=th.cellIndex,rows=Array.prototype.slice.call(tb.rows);
var d=th.getAttribute('data-dir')==='up'?-1:1;th.setAttribute('data-dir',d===1?'up':'down');
rows.sort(function(a,b){var x=a.cells[i],y=b.cells[i];if(!x||!y)return 0;var p=key(x),q=key(y);
if(!isNaN(p)&&!isNaN(q))return p===q?0:d*(p<q?-1:1);return d*x.textContent.localeCompare(y.textContent);});
rows.forEach(function(r){tb.appendChild(r);});});});
window.addEventListener('beforeprint',function(){document.querySelectorAll('details').forEach(function(e){e.open=true;});});
})();
)";

std::string page(const std::string& title, const std::string& body) {
    std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n";
    o += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'\"/>\n";
    o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n<meta name=\"color-scheme\" content=\"light\"/>\n";
    o += "<title>" + h(title) + "</title>\n<style>\n" + kCss + "</style>\n</head>\n<body>\n<main>\n";
    o += body;
    const Json tool = tool_json();
    o += fmt::format("<footer>Written by {} {} (git {}). Every number on this page is in the JSON report (<code>-o</code>) at full precision.</footer>\n",
                     h(text(tool, "name")), h(text(tool, "version")), h(text(tool, "git")));
    o += "</main>\n<script>\n";
    o += kScript;
    o += "</script>\n</body>\n</html>\n";
    return o;
}

void meta_row(std::string& o, const std::string& key, const std::string& value_html) {
    o += fmt::format("<dt>{}</dt><dd>{}</dd>\n", h(key), value_html);
}

void model_rows(std::string& o, const Json& model) {
    if (!model.is_object()) return;
    if (const Json* f = field(model, "fingerprint")) meta_row(o, "model fingerprint", "<code>" + h(scalar_text(*f)) + "</code>");
    for (const auto& [k, v] : model.items())
        if (k != "fingerprint") meta_row(o, "model " + k, v.is_string() ? "<code>" + h(v.get<std::string>()) + "</code>" : h(v.dump()));
}

void stamp_rows(std::string& o, const HtmlStamp& stamp) {
    const Json tool = tool_json();
    meta_row(o, "tool", fmt::format("{} {} (git <code>{}</code>)", h(text(tool, "name")), h(text(tool, "version")), h(text(tool, "git"))));
    if (!stamp.date.empty()) meta_row(o, "written", h(stamp.date));
    if (!stamp.machine.empty()) meta_row(o, "machine", h(stamp.machine));
}

// --- audit sections -----------------------------------------------------------------

// Plot style per candidate node: its position among the judged nodes, so a
// node has one colour and shape in every plot.
std::map<std::string, std::size_t> series_styles(const AuditReport& r) {
    std::map<std::string, std::size_t> styles;
    for (const NodeVerdict& v : r.nodes)
        if (v.verdict != Verdict::reference) styles.emplace(v.node, styles.size());
    return styles;
}
std::size_t style_of(std::map<std::string, std::size_t>& styles, const std::string& node) {
    return styles.emplace(node, styles.size()).first->second;
}

std::string header(const AuditReport& r, const HtmlStamp& stamp) {
    const bool from_captures = r.model.value("source", std::string()) == "captures";
    std::string o = fmt::format("<header>\n<h1>kvasir-equiv {} — is each node equivalent to <code>{}</code>?</h1>\n",
                                from_captures ? "compare" : "audit", h(r.reference));
    std::array<std::size_t, 5> counts{};
    for (const NodeVerdict& v : r.nodes) ++counts[static_cast<std::size_t>(v.verdict)];
    const int code = exit_code(r.nodes, r.gate);
    o += "<p class=\"summary\">";
    for (const Verdict v : {Verdict::fit, Verdict::unfit_sensitive, Verdict::unfit, Verdict::error})
        o += fmt::format("{} {} &#160; ", counts[static_cast<std::size_t>(v)], badge(v));
    o += fmt::format("→ <strong>exit {}</strong> (gate <strong>{}</strong>)</p>\n", code, to_string(r.gate));
    if (std::none_of(r.nodes.begin(), r.nodes.end(), [](const NodeVerdict& v) { return v.verdict != Verdict::reference; }))
        o += "<p class=\"warn\">No node was judged: nothing compared is never a pass.</p>\n";
    o += "<dl class=\"meta\">\n";
    model_rows(o, r.model);
    meta_row(o, "protocol", fmt::format("<code>{}</code> v{} — <code>{}</code>{}", h(r.protocol.id), r.protocol.version,
                                        h(r.protocol.content_hash),
                                        r.protocol.steps_judged.empty()
                                            ? std::string()
                                            : fmt::format(" — steps judged: {} only", h(fmt::format("{}", fmt::join(r.protocol.steps_judged, ", "))))));
    if (!r.protocol.path.empty()) meta_row(o, "protocol file", "<code>" + h(r.protocol.path) + "</code>");
    meta_row(o, "reference", "<code>" + h(r.reference) + "</code>");
    meta_row(o, "seed", fmt::format("{}", r.seed));
    meta_row(o, "gate", fmt::format("{} — exit 0 iff every judged node {}", to_string(r.gate),
                                    r.gate == Gate::sensitive  ? "is fit"
                                    : r.gate == Gate::tolerant ? "is fit or unfit-sensitive"
                                                               : "ran (never fails)"));
    if (const Json* iso = field(r.steps, "isolation")) meta_row(o, "nodes ran", h(text(*iso, "mode")));
    stamp_rows(o, stamp);
    o += "</dl>\n</header>\n";
    o += "<nav><a href=\"#verdicts\">Verdicts</a><a href=\"#pairs\">Backend pairs</a><a href=\"#drift\">Drift</a><a href=\"#logits\">Logits</a>"
         "<a href=\"#decide\">Decisions</a><a href=\"#generate\">Generation</a><a href=\"#perplexity\">Perplexity</a>" +
         std::string(field(r.steps, "task") ? "<a href=\"#task\">Task score</a>" : "") +
         "<a href=\"#determinism\">Determinism</a><a href=\"#invariance\">Invariance</a><a href=\"#criteria\">All criteria</a><a href=\"#tolerances\">Tolerances</a></nav>\n";
    return o;
}

std::string caps_text(const Json& caps, const char* key) {
    const Json* f = field(caps, key);
    if (f == nullptr || f->is_null()) return "?";
    if (f->is_boolean()) return f->get<bool>() ? "yes" : "no";
    return scalar_text(*f);
}

std::string determinism_text(const Json& caps) {
    std::string declared = caps_text(caps, "deterministic");
    const Json* m = field(caps, "determinism_measured");
    std::string measured = "not measured";
    if (m != nullptr && m->is_object()) {
        const Json* bit = field(*m, "bit_identical");
        if (bit != nullptr && bit->is_boolean() && bit->get<bool>())
            measured = "bit-identical";
        else
            measured = "run-to-run max rel " + fmt_sci(number(*m, "run_to_run_max_rel"));
    }
    return fmt::format("{} (declared deterministic: {})", h(measured), h(declared));
}

std::string verdict_section(const AuditReport& r) {
    std::string o = "<section id=\"verdicts\">\n<h2>Verdicts</h2>\n";
    if (const std::vector<std::string> warnings = sample_size_warnings(r.nodes); !warnings.empty()) {
        o += "<div class=\"warnings\"><p><b>Sample sizes too small to decide</b> (rates are judged on a one-sided confidence bound):</p><ul>\n";
        for (const std::string& w : warnings) o += "<li>" + h(w) + "</li>\n";
        o += "</ul></div>\n";
    }
    o += "<p class=\"note\">Each node against the reference, judged on the protocol's two tiers: <b>fit</b> meets the sensitive tier, "
         "<b>unfit-sensitive</b> only the tolerant one (fine for expert workers, not for ranks that decide), <b>unfit</b> neither, "
         "<b>error</b> crashed or produced NaN/Inf. The worst criterion is the one that explains the verdict; the margin is its "
         "distance to the tolerance (positive inside).</p>\n";
    for (const auto& [criterion, why] : not_applicable_criteria(r.nodes))
        o += fmt::format("<p class=\"note\">Not judged: <code>{}</code> does not apply to this model ({}).</p>\n", h(criterion), h(why));
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [why, criteria] : not_measurable_by_reason(v))
            o += fmt::format("<p class=\"note\">Not judged for <b>{}</b>: <code>{}</code> ({}).</p>\n", h(v.node),
                             h(fmt::format("{}", fmt::join(criteria, ", "))), h(why));
    o += "<div class=\"scroll\"><table class=\"sortable verdicts\">\n<thead><tr><th>node</th><th>verdict</th><th>gate</th><th>worst criterion</th>"
         "<th>value</th><th>tolerance</th><th>margin</th><th>device, runtime</th><th>storage / acc. / output, FMA, determinism</th>";
    // The errors column only when some node has one: it is usually empty.
    const bool any_errors = std::any_of(r.nodes.begin(), r.nodes.end(), [](const NodeVerdict& v) { return !v.errors.empty(); });
    o += any_errors ? "<th>errors</th></tr></thead>\n<tbody>\n" : "</tr></thead>\n<tbody>\n";
    for (const NodeVerdict& v : r.nodes) {
        const Json& caps = v.capabilities;
        std::string gate;
        if (v.verdict == Verdict::reference)
            gate = "—";
        else if (v.contrast)
            gate = fmt::format("not gated <span class=\"note\">(contrast; would {})</span>", meets_gate(v, r.gate) ? "pass" : "fail");
        else
            gate = meets_gate(v, r.gate) ? "pass" : "<span class=\"fail\">FAIL</span>";
        o += fmt::format("<tr class=\"{}\"><td><code>{}</code>{}{}</td><td>{}</td><td>{}</td>", look(v.verdict).cls, h(v.node),
                         v.contrast ? "<span class=\"tag\">contrast: shown, not gated</span>" : "",
                         v.floor ? "<span class=\"tag\">the floor of the x_floor tolerances</span>" : "", badge(v.verdict), gate);
        if (v.worst) {
            const CriterionResult& w = *v.worst;
            o += fmt::format("<td><code>{}</code> <span class=\"note\">{}</span></td>", h(w.criterion), to_string(w.tier));
            o += value_td(w);
            o += fmt::format("<td class=\"num\">{} {}</td>", w.direction == Direction::max ? "≤" : "≥", shortest(w.tolerance));
            o += num_td(w.margin, format_margin(w));
        } else {
            o += v.verdict == Verdict::reference ? "<td colspan=\"4\" class=\"note\">the reference: every other node is compared with it</td>"
                                                 : "<td colspan=\"4\" class=\"note\">no criterion</td>";
        }
        o += fmt::format("<td class=\"caps\">{}<div class=\"note\">{}</div></td><td class=\"caps\"><span class=\"mono\">{} / {} / {}</span>, "
                         "FMA {}<div class=\"note\">{}</div></td>",
                         h(caps_text(caps, "device")), h(caps_text(caps, "runtime")), h(caps_text(caps, "storage")),
                         h(caps_text(caps, "accumulation")), h(caps_text(caps, "output")), h(caps_text(caps, "fma")), determinism_text(caps));
        std::string errs;
        for (const auto& [step, msg] : v.errors) errs += fmt::format("{}<b>{}</b>: {}", errs.empty() ? "" : "<br/>", h(step), h(msg));
        if (any_errors) o += "<td class=\"caps\">" + (errs.empty() ? std::string("—") : errs) + "</td>";
        o += "</tr>\n";
    }
    o += "</tbody></table></div>\n";
    std::string where;
    for (const NodeVerdict& v : r.nodes)
        for (const auto& [step, text] : v.localisation) where += "<li><code>" + h(v.node) + "</code>: " + h(text) + "</li>\n";
    if (!where.empty()) o += "<p><b>Where to look</b> (the first layer and block whose local error crosses its yardstick):</p><ul>\n" + where + "</ul>\n";
    o += "</section>\n";
    return o;
}

// Worst off-diagonal max|Δ| and 1 − cos of a matrix (NaN dominates; nullopt
// when nothing was measured).
std::pair<std::optional<double>, std::optional<double>> worst_pair(const PairMatrix& m) {
    std::optional<double> d, c;
    for (std::size_t a = 0; a < m.nodes.size(); ++a)
        for (std::size_t b = 0; b < m.nodes.size(); ++b) {
            if (a == b) continue;
            if (const auto& x = m.max_abs[a][b]) d = !d || std::isnan(*x) || *x > *d ? *x : *d;
            if (const auto& x = m.cosine[a][b]) {
                const double e = std::isnan(*x) ? *x : 1.0 - *x;
                c = !c || std::isnan(e) || e > *c ? e : *c;
            }
        }
    return {d, c};
}

std::string heatmaps(const PairMatrix& m, bool open) {
    check_matrix(m);
    const auto [d, c] = worst_pair(m);
    std::string o = fmt::format("<details class=\"op\"{}><summary><b>{}</b> — {} <span class=\"note\">(largest pair: max|Δ| {}, 1 − cos {})</span></summary>\n",
                                open ? " open=\"open\"" : "", h(m.name), h(m.description), d ? fmt_sci(*d) : "not measured",
                                c ? fmt_sci(std::max(*c, 0.0)) : "not measured");
    o += "<div class=\"figs\">\n";
    o += embed_svg(pair_heatmap_svg(m, PairMetric::max_abs), "heatmap", "max|Δ| heatmap of " + m.name);
    o += embed_svg(pair_heatmap_svg(m, PairMetric::one_minus_cosine), "heatmap", "1 − cosine heatmap of " + m.name);
    o += "</div>\n</details>\n";
    return o;
}

std::string pairs_section(const std::vector<PairMatrix>& pairs, const std::string& intro) {
    if (pairs.empty()) return {};
    std::string o = "<section id=\"pairs\">\n<h2>Backend pairs</h2>\n";
    o += "<p class=\"note\">" + intro +
         " Both metrics are symmetric, so each pair appears once: the row is the earlier node (the reference first), the column the "
         "later. Log colour scale, reversed viridis: light = identical, dark = the largest difference; 0 = bit-identical; <b>NaN</b> (black): non-finite where the other node was finite; n/a: not measured. "
         "Hover a cell for the full-precision value.</p>\n";
    for (std::size_t i = 0; i < pairs.size(); ++i) o += heatmaps(pairs[i], i == 0);
    o += "</section>\n";
    return o;
}

std::string drift_section(const AuditReport& r, std::map<std::string, std::size_t>& styles) {
    if (r.drift.empty()) return {};
    std::vector<std::size_t> style;
    for (const DriftSeries& s : r.drift) style.push_back(style_of(styles, s.node));
    std::string o = "<section id=\"drift\">\n<h2>Drift over depth</h2>\n";
    o += "<p class=\"note\">‖Δh‖/‖h‖ of the residual stream after each layer against the reference (log-log). Guides through the mean "
         "depth-1 drift: dashed ∝ √L (independent rounding errors adding up), dotted ∝ L (errors adding coherently). α is the fitted "
         "exponent.</p>\n";
    o += embed_svg(drift_svg(r.drift, style), "drift", "drift against depth");
    const DriftResult* res = r.result<DriftResult>("drift");
    std::map<std::string, const DriftResult::Entry*> fits;
    if (res != nullptr)
        for (const DriftResult::Entry& e : res->results) fits[e.node] = &e;
    o += fmt::format("<table class=\"sortable\"><thead><tr><th>node</th><th>α</th><th>r²</th><th>depth 1</th><th>last layer</th><th>first layer "
                     "over {}</th></tr></thead><tbody>\n",
                     res == nullptr ? std::string("the step's threshold") : Json(res->threshold).dump());
    for (std::size_t i = 0; i < r.drift.size(); ++i) {
        const DriftSeries& s = r.drift[i];
        const DriftResult::Entry* e = fits.contains(s.node) ? fits[s.node] : nullptr;
        const bool measured = e != nullptr && !e->error;
        const double r2 = measured ? e->fit.r2 : kNaN;
        const double first = measured ? static_cast<double>(e->first_over) : kNaN;
        o += fmt::format("<tr><td>{}<code>{}</code></td>", series_key(style[i]), h(s.node));
        o += num_td(s.alpha, std::isfinite(s.alpha) ? fmt::format("{:.2f}", s.alpha) : shortest(s.alpha));
        o += num_td(r2, std::isnan(r2) ? "—" : fmt::format("{:.3f}", r2));
        o += num_td(s.rel.empty() ? kNaN : s.rel.front(), s.rel.empty() ? "—" : fmt_sci(s.rel.front()));
        o += num_td(s.rel.empty() ? kNaN : s.rel.back(), s.rel.empty() ? "—" : fmt_sci(s.rel.back()));
        o += num_td(first, std::isnan(first) ? "—" : first < 0 ? "none" : fmt::format("layer {:.0f}", first));
        o += "</tr>\n";
    }
    o += "</tbody></table>\n</section>\n";
    return o;
}

// The tolerances of one criterion (by tolerance key), sensitive and tolerant.
struct TolerancePair {
    std::optional<CriterionResult> sensitive, tolerant;
};
std::map<std::string, TolerancePair> tolerances_of(const AuditReport& r) {
    std::map<std::string, TolerancePair> t;
    for (const NodeVerdict& v : r.nodes)
        for (const Tier tier : {Tier::sensitive, Tier::tolerant})
            for (const CriterionResult& c : v.tier(tier)) {
                auto& slot = tier == Tier::sensitive ? t[c.tolerance_from].sensitive : t[c.tolerance_from].tolerant;
                if (!slot) slot = c;
            }
    return t;
}

struct KlSeries {
    std::string node;
    std::size_t style = 0;
    std::array<double, 6> v{};  // min, median, p90, p99, p99.9, max
};

// KL(P_ref ‖ P_cand) per position, as percentiles: one line per node on a
// log axis, the kl_p99 tolerances as horizontal lines.
std::string kl_plot_svg(const std::vector<KlSeries>& series, const std::vector<std::pair<std::string, double>>& lines) {
    static const std::array<const char*, 6> labels = {"min", "median", "p90", "p99", "p99.9", "max"};
    const double left = 78, top = 40, pw = 470, ph = 270;
    std::size_t longest = 10;
    for (const auto& s : series) longest = std::max(longest, s.node.size() + 20);
    for (const auto& l : lines) longest = std::max(longest, l.first.size() + 10);
    const double legend_x = left + pw + 30, width = legend_x + 34 + 7.0 * static_cast<double>(longest);
    const double height = std::max(top + ph + 56, top + 18.0 * static_cast<double>(series.size() + lines.size()) + 20);
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const auto& s : series)
        for (const double v : s.v)
            if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    for (const auto& [label, v] : lines)
        if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    const bool have = hi > 0;
    const double y_lo = have ? std::floor(std::log10(lo)) : -12, y_hi = have ? std::max(std::ceil(std::log10(hi)), y_lo + 1) : 0;
    const auto px = [&](std::size_t i) { return left + pw * (static_cast<double>(i) + 0.5) / 6.0; };
    const auto py = [&](double v) { return top + ph * (y_hi - std::log10(v)) / (y_hi - y_lo); };

    std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
                                "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
                                num(width), num(height), num(width), num(height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(width), num(height));
    o += "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">KL(P_ref ‖ P_cand) over positions (log)</text>\n";
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n", num(left), num(top), num(pw),
                     num(ph));
    const int y_step = (y_hi - y_lo) > 10 ? 2 : 1;
    for (int e = static_cast<int>(y_lo); e <= static_cast<int>(y_hi); e += y_step) {
        const double y = py(std::pow(10.0, e));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(left), num(y), num(left + pw), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{}</text>\n", num(left - 6), num(y + 4), e);
    }
    for (std::size_t i = 0; i < labels.size(); ++i) {
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(px(i)), num(top), num(px(i)), num(top + ph));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(px(i)), num(top + ph + 16), labels[i]);
    }
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">percentile of the positions</text>\n", num(left + pw / 2),
                     num(top + ph + 36));
    o += fmt::format("<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">KL, nats</text>\n", num(top + ph / 2),
                     num(top + ph / 2));
    double legend_y = top + 8;
    for (std::size_t k = 0; k < lines.size(); ++k) {
        const auto& [label, v] = lines[k];
        if (!(std::isfinite(v) && v > 0)) continue;
        const char* dash = k == 0 ? "6,4" : "2,3";
        o += fmt::format("<line class=\"tolerance\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#555555\" stroke-width=\"1.3\" stroke-dasharray=\"{}\"/>",
                         num(left), num(py(v)), num(left + pw), num(py(v)), dash);
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#555555\" stroke-width=\"1.3\" stroke-dasharray=\"{}\"/>",
                         num(legend_x), num(legend_y), num(legend_x + 22), num(legend_y), dash);
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#444444\">{} {}</text>\n", num(legend_x + 28), num(legend_y + 4), h(label), fmt_sci(v));
        legend_y += 18;
    }
    for (const KlSeries& s : series) {
        const char* colour = series_colour(s.style);
        std::string pts, marks;
        std::size_t n = 0;
        for (std::size_t i = 0; i < s.v.size(); ++i) {
            const double v = s.v[i];
            if (!(std::isfinite(v) && v > 0)) continue;
            pts += fmt::format("{},{} ", num(px(i)), num(py(v)));
            ++n;
            marks += marker_svg(series_marker(s.style), px(i), py(v), 3.5, colour, fmt::format("{} {}: {}", s.node, labels[i], shortest(v)));
        }
        if (n > 1) o += fmt::format("<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>", pts, colour);
        o += marks + "\n";
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>", num(legend_x), num(legend_y),
                         num(legend_x + 22), num(legend_y), colour);
        o += marker_svg(series_marker(s.style), legend_x + 11, legend_y, 3.5, colour);
        o += fmt::format("<text x=\"{}\" y=\"{}\">{}{}</text>\n", num(legend_x + 28), num(legend_y + 4), h(s.node),
                         n == 0 ? " (KL 0: identical)" : "");
        legend_y += 18;
    }
    if (!have)
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666666\">no positive KL to plot</text>\n", num(left + pw / 2),
                         num(top + ph / 2));
    o += "</svg>\n";
    return o;
}

std::string error_row(const Json& e, int columns) {
    return fmt::format("<tr class=\"v-err\"><td><code>{}</code></td><td colspan=\"{}\"><span class=\"fail\">error</span>: {}</td></tr>\n",
                       h(text(e, "node")), columns - 1, h(text(e, "error")));
}

std::string error_row(const NodeEntry& e, int columns) {
    return fmt::format("<tr class=\"v-err\"><td><code>{}</code></td><td colspan=\"{}\"><span class=\"fail\">error</span>: {}</td></tr>\n",
                       h(e.node), columns - 1, h(e.error.value_or("")));
}

std::string logits_section(const AuditReport& r, std::map<std::string, std::size_t>& styles) {
    const LogitsResult* res = r.result<LogitsResult>("logits");
    if (res == nullptr || res->results.empty()) return {};
    std::string o = "<section id=\"logits\">\n<h2>Logits</h2>\n";
    o += fmt::format("<p class=\"note\">{} positions, routing pinned by the reference. KL(P_ref ‖ P_cand) per position in nats; "
                     "L∞ and L2 of the logit difference.</p>\n",
                     res->positions);
    std::vector<KlSeries> series;
    std::string rows;
    for (const LogitsResult::Entry& e : res->results) {
        if (e.error) {
            rows += error_row(e, 9);
            continue;
        }
        KlSeries s;
        s.node = e.node;
        s.style = style_of(styles, s.node);
        s.v = e.kl ? std::array<double, 6>{e.kl->min, e.kl->median, e.kl->p90, e.kl->p99, e.kl->p999, e.kl->max}
                   : std::array<double, 6>{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
        rows += fmt::format("<tr><td>{}<code>{}</code></td>", series_key(s.style), h(s.node));
        for (std::size_t i = 1; i < s.v.size(); ++i) rows += num_td(s.v[i], fmt_sci(s.v[i]));
        const double mean = e.kl ? e.kl->mean : kNaN, lm = e.linf ? e.linf->max : kNaN, l2m = e.l2 ? e.l2->max : kNaN;
        rows += num_td(mean, fmt_sci(mean)) + num_td(lm, fmt_sci(lm)) + num_td(l2m, fmt_sci(l2m)) + "</tr>\n";
        series.push_back(std::move(s));
    }
    std::vector<std::pair<std::string, double>> lines;
    const auto tols = tolerances_of(r);
    if (const auto it = tols.find("logits.kl_p99"); it != tols.end()) {
        if (it->second.sensitive) lines.emplace_back("p99 tolerance, sensitive", it->second.sensitive->tolerance);
        if (it->second.tolerant) lines.emplace_back("p99 tolerance, tolerant", it->second.tolerant->tolerance);
    }
    o += embed_svg(kl_plot_svg(series, lines), "kl", "KL divergence percentiles per node");
    o += "<table class=\"sortable\"><thead><tr><th>node</th><th>KL median</th><th>KL p90</th><th>KL p99</th><th>KL p99.9</th><th>KL max</th>"
         "<th>KL mean</th><th>L∞ max</th><th>L2 max</th></tr></thead><tbody>\n" +
         rows + "</tbody></table>\n</section>\n";
    return o;
}

std::string rate_cell(const std::optional<Fraction>& b) {
    if (!b) return "<td class=\"note\">—</td>";
    return fmt::format("<td class=\"num\" data-v=\"{}\">{} <span class=\"note\">({}/{} ± {})</span></td>", std::isfinite(b->rate) ? shortest(b->rate) : "0",
                       fmt_rate(b->rate), b->successes, b->n, fmt_rate(b->sigma));
}

std::string decide_section(const AuditReport& r) {
    const DecisionResult* res = r.result<DecisionResult>("decide");
    if (res == nullptr || res->results.empty()) return {};
    std::string o = "<section id=\"decide\">\n<h2>Decisions: top-1 and routing agreement</h2>\n";
    if (res->moe_layers == 0) {  // a dense model: no router, top-1 only
        o += "<p class=\"note\">No MoE layers: the model has no router, so routing agreement and border tokens do not apply "
             "(not judged). Top-1 agreement of the final logits only.</p>\n";
        o += "<table class=\"sortable\"><thead><tr><th>node</th><th>top-1, router pinned</th><th>top-1, own router</th></tr></thead><tbody>\n";
        for (const DecisionResult::Entry& e : res->results)
            o += e.error ? error_row(e, 3)
                         : fmt::format("<tr><td><code>{}</code></td>", h(e.node)) + rate_cell(e.top1_pinned) + rate_cell(e.top1_free) + "</tr>\n";
        return o + "</tbody></table>\n</section>\n";
    }
    o += fmt::format("<p class=\"note\">{}. {} MoE layers; a border token has its k-th and (k+1)-th router scores within {} of each other, "
                     "where a flip is rounding, not a difference.</p>\n",
                     h(res->compared), res->moe_layers, Json(res->border).dump());
    o += "<table class=\"sortable\"><thead><tr><th>node</th><th>top-1, router pinned</th><th>top-1, own router</th><th>exact expert set, own router</th>"
         "<th>border tokens flipped</th><th>other tokens flipped</th></tr></thead><tbody>\n";
    for (const DecisionResult::Entry& e : res->results) {
        if (e.error) {
            o += error_row(e, 6);
            continue;
        }
        o += fmt::format("<tr><td><code>{}</code></td>", h(e.node));
        o += rate_cell(e.top1_pinned) + rate_cell(e.top1_free);
        if (const auto& rf = e.routing_free) {
            const double rate = rf->exact_match_rate;
            o += fmt::format("<td class=\"num\" data-v=\"{}\">{} <span class=\"note\">({}/{} rows)</span></td>", std::isfinite(rate) ? shortest(rate) : "0",
                             fmt_rate(rate), rf->exact_matches, rf->rows);
        } else {
            o += "<td class=\"note\">" + h(e.routing_free_note.value_or("—")) + "</td>";
        }
        if (const auto& b = e.border)
            o += fmt::format("<td class=\"num\">{} of {}</td><td class=\"num\">{}</td>", b->border_flipped, b->border_tokens, b->other_flipped);
        else
            o += "<td>—</td><td>—</td>";
        o += "</tr>\n";
    }
    o += "</tbody></table>\n</section>\n";
    return o;
}

std::string tokens_html(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& reference) {
    std::string o = "<div class=\"tokens\">";
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        const bool differs = i >= reference.size() || tokens[i] != reference[i];
        o += fmt::format("<span{} title=\"position {}{}\">{}</span>", differs ? " class=\"d\"" : "", i, differs ? ": differs" : "", tokens[i]);
    }
    return o + "</div>";
}

std::string generate_section(const AuditReport& r) {
    const GenerationResult* res = r.result<GenerationResult>("generate");
    if (res == nullptr || res->results.empty()) return {};
    const std::vector<std::int32_t>& ref_tokens = res->reference_tokens;
    std::string o = "<section id=\"generate\">\n<h2>Generation: first divergence</h2>\n";
    o += fmt::format("<p class=\"note\">Greedy continuation of {} new tokens on each node's own router, against the reference's. Shown as "
                     "token ids{}. Tokens that differ from the reference's are boxed, underlined and bold.</p>\n",
                     res->new_tokens,
                     res->reference_text ? " and as text (the model's tokenizer.json)" : " (the model has no tokenizer.json: no decoded text)");
    const auto decoded = [](const std::optional<std::string>& t) {
        return t ? fmt::format("<div class=\"note\">“{}”</div>", h(*t)) : std::string();
    };
    o += "<table><thead><tr><th>node</th><th>first divergence</th><th>teacher-forced divergences</th><th>continuation</th></tr></thead><tbody>\n";
    o += fmt::format("<tr class=\"v-ref\"><td><code>{}</code> <span class=\"note\">reference</span></td><td>—</td><td>—</td><td>{}</td></tr>\n",
                     h(res->reference), tokens_html(ref_tokens, ref_tokens) + decoded(res->reference_text));
    for (const GenerationResult::Entry& e : res->results) {
        if (e.error) {
            o += error_row(e, 4);
            continue;
        }
        const std::int64_t first = e.first_divergence;
        std::string where = first < 0 ? "none" : fmt::format("token {}", first);
        if (first >= 0 && e.ref_margin_at_divergence && e.cand_margin_at_divergence)
            where += fmt::format(" <span class=\"note\">(top-2 logit margin there: reference {}, node {})</span>", fmt_sci(*e.ref_margin_at_divergence),
                                 fmt_sci(*e.cand_margin_at_divergence));
        const std::string forced =
            e.teacher_forced_divergence_steps ? std::to_string(e.teacher_forced_divergence_steps->size()) : std::string();
        o += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>\n", h(e.node), where, forced,
                         tokens_html(e.tokens, ref_tokens) + decoded(e.text));
    }
    o += "</tbody></table>\n</section>\n";
    return o;
}

std::string task_section(const AuditReport& r) {
    const TaskResult* res = r.result<TaskResult>("task");
    if (res == nullptr || res->results.empty()) return {};
    std::string o = "<section id=\"task\">\n<h2>Task score</h2>\n";
    o += fmt::format("<p class=\"note\">{} multiple-choice items scored by log-likelihood (lm-evaluation-harness's acc and acc_norm, "
                     "± the standard error); the reference scores acc {} ± {}, acc_norm {} ± {}.</p>\n",
                     res->items, fmt_fixed(res->reference_acc, 4), fmt_fixed(res->reference_acc_stderr, 4), fmt_fixed(res->reference_acc_norm, 4),
                     fmt_fixed(res->reference_acc_norm_stderr, 4));
    o += "<table class=\"sortable\"><thead><tr><th>node</th><th>acc</th><th>acc_norm</th><th>acc ratio to the reference</th>"
         "<th>same answer as the reference</th><th>max |Δ log-likelihood|</th></tr></thead><tbody>\n";
    for (const TaskResult::Entry& e : res->results) {
        if (e.error) {
            o += error_row(e, 6);
            continue;
        }
        o += fmt::format("<tr><td><code>{}</code></td>", h(e.node)) +
             num_td(e.acc, fmt_fixed(e.acc, 4) + " ± " + fmt_fixed(e.acc_stderr, 4)) +
             num_td(e.acc_norm, fmt_fixed(e.acc_norm, 4) + " ± " + fmt_fixed(e.acc_norm_stderr, 4)) +
             num_td(e.vs.acc_ratio, fmt_fixed(e.vs.acc_ratio, 6)) + num_td(e.agreement(), fmt_fixed(e.agreement(), 4)) +
             num_td(e.vs.ll_max_abs_delta, fmt_sci(e.vs.ll_max_abs_delta)) + "</tr>\n";
    }
    return o + "</tbody></table>\n</section>\n";
}

std::string perplexity_section(const AuditReport& r) {
    const PerplexityResult* res = r.result<PerplexityResult>("perplexity");
    if (res == nullptr || res->results.empty()) return {};
    std::string o = "<section id=\"perplexity\">\n<h2>Perplexity</h2>\n";
    o += fmt::format("<p class=\"note\">{} next-token predictions; the reference's perplexity is {}.{}</p>\n", res->predictions,
                     fmt_general(res->reference_perplexity, 9),
                     r.steps.contains("task") ? "" : " No task score: the protocol has no task step.");
    o += "<table class=\"sortable\"><thead><tr><th>node</th><th>perplexity</th><th>ratio to the reference</th><th>|ratio − 1|</th></tr></thead><tbody>\n";
    for (const PerplexityResult::Entry& e : res->results) {
        if (e.error) {
            o += error_row(e, 4);
            continue;
        }
        o += fmt::format("<tr><td><code>{}</code></td>", h(e.node));
        o += num_td(e.perplexity, fmt_general(e.perplexity, 6)) + num_td(e.ratio, fmt_fixed(e.ratio, 9)) +
             num_td(std::abs(e.ratio - 1), fmt_sci(std::abs(e.ratio - 1))) + "</tr>\n";
    }
    o += "</tbody></table>\n";
    // llama-perplexity --kl-divergence's figures, under its names (metrics/llamacpp_kld.hpp).
    bool any_kld = false;
    for (const PerplexityResult::Entry& e : res->results) any_kld = any_kld || e.llamacpp_kl_divergence.has_value();
    if (any_kld) {
        o += fmt::format("<p class=\"note\">llama-perplexity <code>--kl-divergence</code> statistics against the reference, its "
                         "definitions (base rounding: {}).</p>\n",
                         h(res->kl_divergence_base_rounding.value_or("")));
        o += "<table class=\"sortable\"><thead><tr><th>node</th><th>Mean KLD</th><th>99.0% KLD</th><th>Maximum KLD</th>"
             "<th>RMS Δp</th><th>Same top p</th><th>Mean ln(PPL(Q)/PPL(base))</th></tr></thead><tbody>\n";
        const auto pm = [](const ValueUncertainty& f, double scale, const char* unit) {
            return fmt::format("<td class=\"num\">{} ± {}{}</td>", fmt_general(scale * f.value, 6), fmt_general(scale * f.uncertainty, 2), unit);
        };
        for (const PerplexityResult::Entry& e : res->results) {
            if (!e.llamacpp_kl_divergence) continue;
            const LlamaCppKld& k = *e.llamacpp_kl_divergence;
            o += fmt::format("<tr><td><code>{}</code></td>", h(e.node)) + pm(k.kld, 1, "") +
                 num_td(k.kld_spread.p99, fmt_sci(k.kld_spread.p99)) + num_td(k.kld_spread.max, fmt_sci(k.kld_spread.max)) +
                 pm(k.dp_rms, 100, " %") + pm(k.same_top, 100, " %") + pm(k.ln_ppl_ratio, 1, "") + "</tr>\n";
        }
        o += "</tbody></table>\n";
    }
    o += "</section>\n";
    return o;
}

std::string determinism_section(const AuditReport& r) {
    const DeterminismResult* res = r.result<DeterminismResult>("determinism");
    if (res == nullptr || res->nodes.empty()) return {};
    std::string o = "<section id=\"determinism\">\n<h2>Determinism</h2>\n";
    o += fmt::format("<p class=\"note\">{} runs per node: {}.</p>\n", res->repeats, h(res->compared));
    o += "<table><thead><tr><th>node</th><th>bit-identical</th><th>run-to-run max rel</th><th>routing rows differing</th></tr></thead><tbody>\n";
    for (const DeterminismResult::Entry& e : res->nodes) {
        if (e.error) {
            o += error_row(e, 4);
            continue;
        }
        const double rel = e.run_to_run_max_rel.value_or(kNaN), rows = e.routing_rows_differing.value_or(kNaN);
        o += fmt::format("<tr><td><code>{}</code></td><td>{}</td>", h(e.node), e.bit_identical() ? "yes" : "<span class=\"fail\">no</span>");
        o += num_td(rel, fmt_sci(rel)) + num_td(rows, std::isnan(rows) ? "—" : fmt::format("{:.0f}", rows)) + "</tr>\n";
    }
    o += "</tbody></table>\n</section>\n";
    return o;
}

// A self-comparison cell: "identical" or the guarded max_rel, in red.
std::string self_td(double v) {
    if (v == 0.0) return "<td>identical</td>";
    return fmt::format("<td class=\"num\"><span class=\"fail\">{}</span></td>", std::isnan(v) ? "NaN" : fmt_sci(v));
}

std::string invariance_section(const AuditReport& r) {
    const InvarianceResult* res = r.result<InvarianceResult>("invariance");
    if (res == nullptr || res->nodes.empty()) return {};
    std::string o = "<section id=\"invariance\">\n<h2>Invariance</h2>\n";
    o += fmt::format("<p class=\"note\">Each node against itself ({}): a row alone vs among {} rows; the sequence of {} tokens alone "
                     "vs in a batch of B; one prefill vs token-by-token decode; {} identical requests decoding {} tokens. "
                     "Guarded max rel; identical = the same bits.</p>\n",
                     h(res->compared), res->op_rows, res->tokens, res->repeats, res->decode);
    o += "<table><thead><tr><th>node</th><th>matmul row</th><th>softmax row</th><th>rmsnorm row</th>";
    int columns = 6;
    for (const std::int64_t b : res->batch_sizes) {
        o += fmt::format("<th>B = {}</th>", b);
        ++columns;
    }
    o += "<th>prefill vs decode</th><th>unique outputs (bits / tokens)</th></tr></thead><tbody>\n";
    for (const InvarianceResult::Entry& e : res->nodes) {
        if (e.error) {
            o += error_row(e, columns);
            continue;
        }
        o += fmt::format("<tr><td><code>{}</code></td>", h(e.node));
        for (const char* op : {"matmul", "softmax", "rmsnorm"}) {
            std::optional<double> v;
            if (e.ops)
                for (const auto& [name, rel] : *e.ops)
                    if (name == op) v = rel;
            o += !e.ops ? "<td>—</td>" : self_td(v.value_or(kNaN));
        }
        for (const InvarianceResult::Batch& b : e.batch) o += self_td(b.max_rel);
        o += self_td(e.prefill_decode_max_rel);
        const double bits = e.unique_outputs, tokens = e.unique_token_sequences;
        o += fmt::format("<td class=\"num\">{}{:.0f} / {:.0f} of {}{}</td>", bits == 1.0 ? "" : "<span class=\"fail\">", bits, tokens, e.requests,
                         bits == 1.0 ? "" : "</span>");
        o += "</tr>\n";
    }
    o += "</tbody></table>\n</section>\n";
    return o;
}

std::map<std::string, StepHtmlRenderer>& html_renderers() {
    static std::map<std::string, StepHtmlRenderer> r;
    return r;
}

// A registered step's entries as a table, a column per field they carry
// (its JSON section: what a step without an HTML section of its own shows).
std::string entries_table(const Json& res) {
    std::vector<std::string> columns;
    for (const Json& e : res)
        for (const auto& [key, v] : e.items())
            if (key != "node" && key != "error" && std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
    std::string o = "<table class=\"sortable\"><thead><tr><th>node</th>";
    for (const std::string& c : columns) o += "<th>" + h(c) + "</th>";
    o += "</tr></thead><tbody>\n";
    for (const Json& e : res) {
        if (field(e, "error")) {
            o += error_row(e, static_cast<int>(columns.size()) + 1);
            continue;
        }
        o += fmt::format("<tr><td><code>{}</code></td>", h(text(e, "node")));
        for (const std::string& c : columns) {
            const Json* v = field(e, c.c_str());
            if (v != nullptr && (v->is_number() || (v->is_string() && !std::isnan(number(v)))))
                o += num_td(number(v), fmt_sci(number(v)));
            else
                o += "<td>" + h(v == nullptr ? std::string() : v->is_primitive() ? scalar_text(*v) : v->dump()) + "</td>";
        }
        o += "</tr>\n";
    }
    return o + "</tbody></table>\n";
}

// The steps beyond the built-in ones (registered from their own files:
// audit/step.hpp register_step): each its own section, by its registered
// renderer or as a table of its JSON entries.
std::string registered_step_sections(const AuditReport& r) {
    static const std::set<std::string> own = {"ops",         "drift",      "logits",   "decide",   "generate", "perplexity",
                                              "task",        "determinism", "invariance", "captures", "isolation"};
    std::string o;
    for (const auto& [name, step] : r.steps.items()) {
        if (own.count(name) != 0 || !step.is_object()) continue;
        o += fmt::format("<section id=\"step-{0}\">\n<h2>Step <code>{0}</code></h2>\n<p class=\"note\">reference <code>{1}</code></p>\n",
                         h(name), h(text(step, "reference")));
        const auto render = html_renderers().find(name);
        const auto result = r.results.find(name);
        o += render != html_renderers().end() && result != r.results.end() && result->second != nullptr
                 ? render->second(*result->second)
                 : entries_table(results(r, name.c_str()));
        o += "</section>\n";
    }
    return o;
}

std::string criteria_section(const AuditReport& r) {
    std::string o = "<section id=\"criteria\">\n<h2>Every criterion of every node</h2>\n";
    o += "<p class=\"note\">Both tiers. A criterion measured several times (per layer, per op) is judged on its worst value. Failing rows "
         "say FAIL; the nodes that are not fit are open.</p>\n";
    std::size_t judged = 0;
    for (const NodeVerdict& v : r.nodes) judged += v.verdict != Verdict::reference;
    for (const NodeVerdict& v : r.nodes) {
        if (v.verdict == Verdict::reference) continue;
        std::size_t total = 0, failing = 0;
        for (const Tier t : {Tier::sensitive, Tier::tolerant})
            for (const CriterionResult& c : v.tier(t)) ++total, failing += !c.pass;
        const bool open = v.verdict != Verdict::fit && judged <= 6;
        o += fmt::format("<details class=\"criteria\"{}><summary>{} <code>{}</code>{} — {} criteria, {} failing</summary>\n", open ? " open=\"open\"" : "",
                         badge(v.verdict), h(v.node), v.contrast ? " <span class=\"tag\">contrast: not gated</span>" : "", total, failing);
        o += "<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th>tier</th><th>criterion</th><th>step</th><th>value</th><th>tolerance</th>"
             "<th>result</th><th>margin</th><th>tolerance (when a family's)</th></tr></thead><tbody>\n";
        for (const Tier t : {Tier::sensitive, Tier::tolerant})
            for (const CriterionResult& c : v.tier(t)) {
                o += fmt::format("<tr class=\"crit{}\"><td>{}</td><td><code>{}</code></td><td>{}</td>", c.pass ? "" : " failrow", to_string(t),
                                 h(c.criterion), h(c.step));
                o += value_td(c);
                o += fmt::format("<td class=\"num\">{} {}{}</td>", c.direction == Direction::max ? "≤" : "≥", shortest(c.tolerance),
                                 c.floor ? "<br/><span class=\"note\">" + h(format_floor(c)) + "</span>" : std::string());
                o += c.pass ? "<td>pass</td>" : "<td><span class=\"fail\">FAIL</span></td>";
                o += num_td(c.margin, format_margin(c));
                o += c.tolerance_from == c.criterion ? std::string("<td></td></tr>\n")
                                                     : fmt::format("<td><code>{}</code></td></tr>\n", h(c.tolerance_from));
            }
        o += "</tbody></table></div>\n</details>\n";
    }
    if (judged == 0) o += "<p class=\"warn\">No node was judged.</p>\n";
    o += "</section>\n";
    return o;
}

std::string tolerances_section(const AuditReport& r) {
    const auto tols = tolerances_of(r);
    if (tols.empty()) return {};
    std::string o = "<section id=\"tolerances\">\n<h2>The protocol's tolerances</h2>\n";
    o += fmt::format("<p class=\"note\">Protocol <code>{}</code> v{}, as its criteria recorded them; tolerances live in the protocol file, "
                     "never in code. <b>sensitive</b>: ranks whose output decides (sampling, router authority); <b>tolerant</b>: expert "
                     "workers.</p>\n",
                     h(r.protocol.id), r.protocol.version);
    o += "<div class=\"scroll\"><table class=\"tolerances\"><thead><tr><th>tolerance</th><th>sensitive</th><th>tolerant</th><th>why</th></tr></thead><tbody>\n";
    for (const auto& [key, t] : tols) {
        const auto cell = [](const std::optional<CriterionResult>& c) {
            return c ? fmt::format("<td class=\"num\">{} {}</td>", c->direction == Direction::max ? "≤" : "≥", shortest(c->tolerance))
                     : std::string("<td class=\"note\">—</td>");
        };
        std::string why;
        if (t.sensitive) why += "<b>sensitive</b>: " + h(t.sensitive->why);
        if (t.tolerant && (!t.sensitive || t.tolerant->why != t.sensitive->why))
            why += (why.empty() ? "" : "<br/>") + std::string("<b>tolerant</b>: ") + h(t.tolerant->why);
        o += fmt::format("<tr><td><code>{}</code></td>{}{}<td class=\"why\">{}</td></tr>\n", h(key), cell(t.sensitive), cell(t.tolerant), why);
    }
    o += "</tbody></table></div>\n</section>\n";
    return o;
}

}  // namespace

std::string audit_html(const AuditReport& r, const HtmlStamp& stamp) {
    auto styles = series_styles(r);
    std::string body = header(r, stamp);
    body += verdict_section(r);
    body += pairs_section(r.pairs, "Step 1: every op on every node, every node against every node. The first op is open; click another to see its heatmaps.");
    body += drift_section(r, styles);
    body += logits_section(r, styles);
    body += decide_section(r);
    body += generate_section(r);
    body += perplexity_section(r);
    body += task_section(r);
    body += determinism_section(r);
    body += invariance_section(r);
    body += registered_step_sections(r);
    body += criteria_section(r);
    body += tolerances_section(r);
    const bool from_captures = r.model.value("source", std::string()) == "captures";
    return page(fmt::format("kvasir-equiv {}: {} — {}", from_captures ? "compare" : "audit", r.model.value("path", std::string("model")),
                            r.protocol.id),
                body);
}

void register_step_html(const std::string& step, StepHtmlRenderer render) {
    KVASIR_CHECK(html_renderers().emplace(step, render).second, ErrorCode::internal, "step '{}' has an HTML section already", step);
}

std::string matrix_html(const OpsReport& r, const nlohmann::ordered_json& model, const HtmlStamp& stamp) {
    std::vector<std::string> names;
    for (const Capabilities& c : r.nodes) names.push_back(c.node);
    const std::string reference = r.reference < names.size() ? names[r.reference] : std::string("?");
    std::string body = "<header>\n<h1>kvasir-equiv matrix — backend pairs of one MoE layer</h1>\n";
    body += "<p class=\"note\">Measured, not judged: the matrix command applies no tolerances (<code>audit</code> does).</p>\n<dl class=\"meta\">\n";
    model_rows(body, model);
    meta_row(body, "reference", "<code>" + h(reference) + "</code> (its routing is pinned on every node)");
    const Json cfg = to_json(r.config);
    for (const char* k : {"seed", "tokens", "hidden", "intermediate", "experts", "top_k"})
        if (const Json* f = field(cfg, k)) meta_row(body, k, h(scalar_text(*f)));
    stamp_rows(body, stamp);
    body += "</dl>\n</header>\n";

    body += "<section id=\"nodes\">\n<h2>Nodes</h2>\n<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th>node</th><th>device · runtime</th>"
            "<th>storage / accumulation / output</th><th>FMA</th><th>deterministic (declared)</th><th>errors</th></tr></thead><tbody>\n";
    for (std::size_t i = 0; i < r.nodes.size(); ++i) {
        const Json caps = to_json(r.nodes[i]);
        std::string errs;
        for (const OpResult& op : r.ops)
            if (i < op.errors.size() && !op.errors[i].empty()) errs += fmt::format("{}<b>{}</b>: {}", errs.empty() ? "" : "<br/>", h(op.op), h(op.errors[i]));
        body += fmt::format("<tr{}><td><code>{}</code>{}</td><td class=\"caps\">{} · {}</td><td>{} / {} / {}</td><td>{}</td><td>{}</td><td class=\"caps\">{}</td></tr>\n",
                            i == r.reference ? " class=\"v-ref\"" : "", h(names[i]), i == r.reference ? " <span class=\"tag\">reference</span>" : "",
                            h(caps_text(caps, "device")), h(caps_text(caps, "runtime")), h(caps_text(caps, "storage")), h(caps_text(caps, "accumulation")),
                            h(caps_text(caps, "output")), h(caps_text(caps, "fma")), h(caps_text(caps, "deterministic")), errs.empty() ? "—" : errs);
    }
    body += "</tbody></table></div>\n</section>\n";

    std::vector<PairMatrix> pairs;
    for (const OpResult& op : r.ops) pairs.push_back(pair_matrix(r, op.op));
    body += pairs_section(pairs, "Every node against every node on the layer's real weights.");
    for (const OpResult& op : r.ops) {
        body += fmt::format("<h3>{}: every pair</h3>\n<table class=\"sortable\"><thead><tr><th>candidate</th><th>reference</th><th>max|Δ|</th>"
                            "<th>max rel Δ</th><th>cosine</th></tr></thead><tbody>\n",
                            h(op.op));
        for (std::size_t a = 0; a < names.size(); ++a)
            for (std::size_t b = a + 1; b < names.size(); ++b) {
                const auto& s = a < op.matrix.size() && b < op.matrix[a].size() ? op.matrix[a][b] : std::nullopt;
                body += fmt::format("<tr><td><code>{}</code></td><td><code>{}</code></td>", h(names[b]), h(names[a]));
                body += s ? num_td(s->max_abs, fmt_sci(s->max_abs)) + num_td(s->max_rel, fmt_sci(s->max_rel)) + num_td(s->cosine, fmt_cosine(s->cosine))
                          : std::string("<td colspan=\"3\" class=\"fail\">not measured (error)</td>");
                body += "</tr>\n";
            }
        body += "</tbody></table>\n";
    }
    if (!r.shard_checks.empty()) {
        body += "<section id=\"shards\">\n<h2>Shard check</h2>\n<p class=\"note\">The MoE block split over simulated expert-parallel nodes and "
                "recombined, against the same node computing it whole.</p>\n<table><thead><tr><th>node</th><th>shards</th><th>max|Δ|</th>"
                "<th>max rel Δ</th></tr></thead><tbody>\n";
        for (const ShardCheck& s : r.shard_checks) {
            body += fmt::format("<tr><td><code>{}</code></td><td class=\"num\">{}</td>", h(s.node), s.shards);
            body += s.stats ? num_td(s.stats->max_abs, fmt_sci(s.stats->max_abs)) + num_td(s.stats->max_rel, fmt_sci(s.stats->max_rel))
                            : fmt::format("<td colspan=\"2\" class=\"fail\">{}</td>", h(s.error.empty() ? "not measured" : s.error));
            body += "</tr>\n";
        }
        body += "</tbody></table>\n</section>\n";
    }
    return page(fmt::format("kvasir-equiv matrix: {}", model.value("path", std::string("model"))), body);
}

}  // namespace kvasir
