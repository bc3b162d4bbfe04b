#include "kvasir/report/writers.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/report/json_common.hpp"
#include "kvasir/report/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace kvasir {

// ============================================================================
// Pair matrices
// ============================================================================

PairMatrix pair_matrix(std::string name, std::string description, std::vector<std::string> nodes,
                       const std::vector<std::vector<std::optional<CompareStats>>>& stats) {
    const std::size_t n = nodes.size();
    KVASIR_CHECK(stats.size() == n, ErrorCode::internal, "pair matrix '{}': {} rows for {} nodes", name, stats.size(), n);
    PairMatrix m;
    m.name = std::move(name);
    m.description = std::move(description);
    m.nodes = std::move(nodes);
    m.max_abs.assign(n, std::vector<std::optional<double>>(n));
    m.cosine.assign(n, std::vector<std::optional<double>>(n));
    for (std::size_t a = 0; a < n; ++a) {
        KVASIR_CHECK(stats[a].size() == n, ErrorCode::internal, "pair matrix '{}': row {} has {} entries for {} nodes", m.name,
                     a, stats[a].size(), n);
        for (std::size_t b = 0; b < n; ++b) {
            if (a == b) {
                m.max_abs[a][b] = 0.0;
                m.cosine[a][b] = 1.0;
            } else if (stats[a][b]) {
                m.max_abs[a][b] = stats[a][b]->max_abs;
                m.cosine[a][b] = stats[a][b]->cosine;
            }
        }
    }
    return m;
}

PairMatrix pair_matrix(const OpsReport& report, const std::string& op) {
    for (const OpResult& r : report.ops)
        if (r.op == op) {
            std::vector<std::string> nodes;
            for (const Capabilities& c : report.nodes) nodes.push_back(c.node);
            return pair_matrix(op, r.inputs, std::move(nodes), r.matrix);
        }
    fail(ErrorCode::internal, "step 1 report has no op '{}'", op);
}

ProtocolRef protocol_ref(const Protocol& p) { return ProtocolRef{p.id, p.version, p.content_hash, p.source}; }

// ============================================================================
// JSON
// ============================================================================

namespace {

nlohmann::ordered_json matrix_json(const std::vector<std::vector<std::optional<double>>>& m) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& row : m) {
        nlohmann::ordered_json r = nlohmann::ordered_json::array();
        for (const auto& x : row) r.push_back(x ? json_double(*x) : nlohmann::ordered_json(nullptr));
        rows.push_back(r);
    }
    return rows;
}

void check_matrix(const PairMatrix& m) {
    const std::size_t n = m.nodes.size();
    bool ok = m.max_abs.size() == n && m.cosine.size() == n;
    for (std::size_t i = 0; ok && i < n; ++i) ok = m.max_abs[i].size() == n && m.cosine[i].size() == n;
    KVASIR_CHECK(ok, ErrorCode::internal, "pair matrix '{}' is not {}×{} over its nodes", m.name, n, n);
}

}  // namespace

nlohmann::ordered_json audit_report_json(const AuditReport& r) {
    KVASIR_CHECK(r.model.is_object() && r.model.contains("fingerprint") && r.model["fingerprint"].is_string(), ErrorCode::internal,
                 "audit report: model must hold a string \"fingerprint\"");
    nlohmann::ordered_json j;
    j["schema"] = kAuditReportSchema;
    j["tool"] = tool_json();
    nlohmann::ordered_json proto;
    proto["id"] = r.protocol.id;
    proto["version"] = r.protocol.version;
    proto["content_hash"] = r.protocol.content_hash;
    proto["path"] = r.protocol.path;
    j["protocol"] = proto;
    j["model"] = r.model;
    j["reference"] = r.reference;
    j["seed"] = r.seed;
    j["gate"] = to_string(r.gate);
    j["exit_code"] = exit_code(r.nodes, r.gate);

    nlohmann::ordered_json summary;
    std::size_t judged = 0;
    std::array<std::size_t, 4> counts{};  // fit, unfit-sensitive, unfit, error
    for (const NodeVerdict& v : r.nodes) {
        if (v.verdict == Verdict::reference) continue;
        ++judged;
        ++counts[static_cast<std::size_t>(v.verdict) - 1];
    }
    summary["nodes"] = r.nodes.size();
    summary["judged"] = judged;
    summary["fit"] = counts[0];
    summary["unfit-sensitive"] = counts[1];
    summary["unfit"] = counts[2];
    summary["error"] = counts[3];
    j["summary"] = summary;

    nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
    for (const NodeVerdict& v : r.nodes) nodes.push_back(to_json(v));
    j["nodes"] = nodes;

    nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
    for (const PairMatrix& m : r.pairs) {
        check_matrix(m);
        nlohmann::ordered_json p;
        p["name"] = m.name;
        p["description"] = m.description;
        p["nodes"] = m.nodes;
        p["max_abs"] = matrix_json(m.max_abs);
        p["cosine"] = matrix_json(m.cosine);
        pairs.push_back(p);
    }
    j["pairs"] = pairs;

    nlohmann::ordered_json drift = nlohmann::ordered_json::array();
    for (const DriftSeries& s : r.drift) {
        nlohmann::ordered_json d;
        d["node"] = s.node;
        nlohmann::ordered_json depth = nlohmann::ordered_json::array(), rel = nlohmann::ordered_json::array();
        for (std::size_t i = 0; i < s.rel.size(); ++i) {
            depth.push_back(i + 1);
            rel.push_back(json_double(s.rel[i]));
        }
        d["depth"] = depth;
        d["rel"] = rel;
        d["alpha"] = json_double(s.alpha);
        drift.push_back(d);
    }
    j["drift"] = drift;
    j["steps"] = r.steps.is_object() ? r.steps : nlohmann::ordered_json::object();
    return j;
}

// ============================================================================
// XML / JUnit
// ============================================================================

std::string xml_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default:
                if (u < 0x20 && c != '\t' && c != '\n' && c != '\r')
                    out += "\xEF\xBF\xBD";  // U+FFFD: XML 1.0 forbids these characters even escaped
                else
                    out += c;
        }
    }
    return out;
}

namespace {

struct JCase {
    std::string name;
    std::string classname;
    enum Kind { pass, failure, error, skipped } kind = pass;
    std::string message;
    std::string detail;
};

struct JSuite {
    std::string name;
    std::vector<std::pair<std::string, std::string>> properties;
    std::vector<JCase> cases;
    std::size_t count(JCase::Kind k) const {
        return static_cast<std::size_t>(std::count_if(cases.begin(), cases.end(), [&](const JCase& c) { return c.kind == k; }));
    }
};

bool tier_gated(Tier t, Gate g) { return g == Gate::sensitive || (g == Gate::tolerant && t == Tier::tolerant); }

std::string criterion_detail(const CriterionResult& r) {
    return fmt::format("{}\nstep: {}\ntolerance from: {}\nwhy: {}", describe(r), r.step, r.tolerance_from, r.why);
}

std::string scalar_text(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::vector<JSuite> junit_suites(const AuditReport& r) {
    std::vector<JSuite> suites;
    std::size_t judged = 0;
    for (const NodeVerdict& v : r.nodes) {
        JSuite s;
        s.name = v.node;
        s.properties.emplace_back("verdict", to_string(v.verdict));
        s.properties.emplace_back("gate", to_string(r.gate));
        s.properties.emplace_back("protocol", fmt::format("{} v{} {}", r.protocol.id, r.protocol.version, r.protocol.content_hash));
        if (v.capabilities.is_object())
            for (const auto& [k, val] : v.capabilities.items())
                if (!val.is_structured()) s.properties.emplace_back("capabilities." + k, scalar_text(val));
        const std::string classname = "kvasir-equiv." + v.node;
        const bool gated = r.gate != Gate::none;

        if (v.verdict == Verdict::reference) {
            s.cases.push_back({"reference", classname, JCase::pass, "", "reference node: reported, not judged"});
            for (const auto& [step, msg] : v.errors)
                s.cases.push_back({"run: " + step, classname, gated ? JCase::error : JCase::skipped,
                                   gated ? "reference failed: " + msg : "not gated (--gate none): reference failed: " + msg, msg});
            suites.push_back(std::move(s));
            continue;
        }
        ++judged;
        const bool node_error = v.verdict == Verdict::error;
        for (const auto& [step, msg] : v.errors)
            s.cases.push_back({"run: " + step, classname, gated ? JCase::error : JCase::skipped,
                               gated ? msg : "not gated (--gate none): " + msg, msg});
        for (const Tier t : {Tier::sensitive, Tier::tolerant}) {
            for (const CriterionResult& c : v.tier(t)) {
                JCase jc{fmt::format("{}: {}", to_string(t), c.criterion), classname, JCase::pass, "", criterion_detail(c)};
                if (!c.pass) {
                    const bool nonfinite = c.measured && !std::isfinite(c.value);
                    // Under a gate, a node that is "error" fails it whatever
                    // tier a criterion belongs to; its non-finite values are
                    // errors, not tolerance failures.
                    const bool counts = gated && (tier_gated(t, r.gate) || (node_error && nonfinite));
                    if (!counts) {
                        jc.kind = JCase::skipped;
                        jc.message = fmt::format("not gated (--gate {}): {}", to_string(r.gate), describe(c));
                    } else if (nonfinite) {
                        jc.kind = JCase::error;
                        jc.message = describe(c) + " (non-finite where the reference had none)";
                    } else {
                        jc.kind = JCase::failure;
                        jc.message = c.measured ? describe(c) : describe(c) + ": nothing compared is never a pass";
                    }
                }
                s.cases.push_back(std::move(jc));
            }
        }
        suites.push_back(std::move(s));
    }
    if (judged == 0) {
        JSuite s;
        s.name = "audit";
        s.cases.push_back({"audit: nodes judged", "kvasir-equiv.audit", JCase::failure,
                           "no node was judged: nothing compared is never a pass", ""});
        suites.push_back(std::move(s));
    }
    return suites;
}

}  // namespace

std::string junit_xml(const AuditReport& r) {
    const std::vector<JSuite> suites = junit_suites(r);
    std::size_t tests = 0, failures = 0, errors = 0, skipped = 0;
    for (const JSuite& s : suites) {
        tests += s.cases.size();
        failures += s.count(JCase::failure);
        errors += s.count(JCase::error);
        skipped += s.count(JCase::skipped);
    }
    std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out += fmt::format("<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n",
                       xml_escape(fmt::format("kvasir-equiv audit ({} v{}, gate {})", r.protocol.id, r.protocol.version,
                                              to_string(r.gate))),
                       tests, failures, errors, skipped);
    std::size_t id = 0;
    for (const JSuite& s : suites) {
        out += fmt::format("  <testsuite id=\"{}\" name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n", id++,
                           xml_escape(s.name), s.cases.size(), s.count(JCase::failure), s.count(JCase::error),
                           s.count(JCase::skipped));
        if (!s.properties.empty()) {
            out += "    <properties>\n";
            for (const auto& [k, v] : s.properties)
                out += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", xml_escape(k), xml_escape(v));
            out += "    </properties>\n";
        }
        for (const JCase& c : s.cases) {
            out += fmt::format("    <testcase name=\"{}\" classname=\"{}\"", xml_escape(c.name), xml_escape(c.classname));
            if (c.kind == JCase::pass && c.detail.empty()) {
                out += "/>\n";
                continue;
            }
            out += ">\n";
            const char* tag = c.kind == JCase::failure ? "failure" : c.kind == JCase::error ? "error" : c.kind == JCase::skipped ? "skipped" : nullptr;
            if (tag != nullptr) {
                const char* type = c.kind == JCase::failure ? "tolerance" : c.kind == JCase::error ? "error" : "not-gated";
                out += fmt::format("      <{} message=\"{}\" type=\"{}\">{}</{}>\n", tag, xml_escape(c.message), type,
                                   xml_escape(c.detail), tag);
            }
            if (c.kind == JCase::pass) out += fmt::format("      <system-out>{}</system-out>\n", xml_escape(c.detail));
            out += "    </testcase>\n";
        }
        out += "  </testsuite>\n";
    }
    out += "</testsuites>\n";
    return out;
}

// ============================================================================
// Markdown and CSV
// ============================================================================

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

std::string csv_field(std::string_view s) {
    if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
    std::string out = "\"";
    for (const char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

std::string shortest(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return fmt::format("{}", x);  // shortest round-trip form
}

}  // namespace

std::string markdown_report(const AuditReport& r) {
    const bool from_captures = r.model.value("source", std::string()) == "captures";
    std::string out = from_captures ? "# kvasir-equiv compare\n\n" : "# kvasir-equiv audit\n\n";
    const int code = exit_code(r.nodes, r.gate);
    out += fmt::format("Protocol `{}` v{} (`{}`), reference `{}`, seed {}, gate **{}** → exit code **{}**.\n\n", r.protocol.id,
                       r.protocol.version, r.protocol.content_hash, r.reference, r.seed, to_string(r.gate), code);
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
        out += fmt::format("| {} | {} | {} | {} | {} |\n", md(v.node), to_string(v.verdict), md(v.worst ? describe(*v.worst) : "—"),
                           md(acc), md(errs.empty() ? "—" : errs));
    }

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

std::string cosine_csv(const PairMatrix& m) {
    check_matrix(m);
    std::string out = "node";
    for (const auto& n : m.nodes) out += "," + csv_field(n);
    out += "\r\n";  // RFC 4180 line ends
    for (std::size_t a = 0; a < m.nodes.size(); ++a) {
        out += csv_field(m.nodes[a]);
        for (std::size_t b = 0; b < m.nodes.size(); ++b) out += "," + (m.cosine[a][b] ? shortest(*m.cosine[a][b]) : std::string());
        out += "\r\n";
    }
    return out;
}

// ============================================================================
// SVG
// ============================================================================

namespace {

struct Rgb {
    double r, g, b;
};

// Sequential ramp green → pale yellow → orange → red over s ∈ [0, 1].
Rgb ramp(double s) {
    static const std::array<std::pair<double, Rgb>, 4> stops = {{{0.0, {26, 150, 65}},
                                                                  {0.5, {255, 255, 191}},
                                                                  {0.75, {253, 174, 97}},
                                                                  {1.0, {215, 25, 28}}}};
    s = std::clamp(s, 0.0, 1.0);
    for (std::size_t i = 1; i < stops.size(); ++i)
        if (s <= stops[i].first) {
            const double t = (s - stops[i - 1].first) / (stops[i].first - stops[i - 1].first);
            const Rgb& a = stops[i - 1].second;
            const Rgb& b = stops[i].second;
            return {a.r + t * (b.r - a.r), a.g + t * (b.g - a.g), a.b + t * (b.b - a.b)};
        }
    return stops.back().second;
}

std::string hex(const Rgb& c) {
    return fmt::format("#{:02x}{:02x}{:02x}", static_cast<int>(std::lround(c.r)), static_cast<int>(std::lround(c.g)),
                       static_cast<int>(std::lround(c.b)));
}

// Readable text colour over a fill (relative luminance, sRGB weights).
const char* ink(const Rgb& c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b > 140 ? "#000000" : "#ffffff"; }

constexpr double kLogFloor = -16;  // 1 − cos below 1e-16 is f64 round-off: drawn as "identical"

// log10(1 − cos) mapped to [0, 1].
double heat(double cosine) {
    const double d = 1.0 - cosine;
    const double t = d <= 0 ? kLogFloor : std::clamp(std::log10(d), kLogFloor, 0.0);
    return (t - kLogFloor) / -kLogFloor;
}

std::string num(double x) { return fmt::format("{:.2f}", x); }

}  // namespace

std::string heatmap_svg(const PairMatrix& m) {
    check_matrix(m);
    const std::size_t n = m.nodes.size();
    const double cw = 118, ch = 46;  // cell size
    std::size_t longest = 4;
    for (const auto& s : m.nodes) longest = std::max(longest, s.size());
    const double char_w = 6.6;  // 11px monospace
    const double left = 20 + char_w * static_cast<double>(longest);
    const double top = 70 + 0.72 * char_w * static_cast<double>(longest);  // column labels rotated −45°
    const double grid_w = cw * static_cast<double>(n), grid_h = ch * static_cast<double>(n);
    const double bar_x = left + grid_w + 30, bar_h = std::max(160.0, grid_h), bar_w = 16;
    const double width = bar_x + bar_w + 90, height = std::max(top + grid_h, top + bar_h) + 40;

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\" font-size=\"11\">\n",
        num(width), num(height), num(width), num(height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(width), num(height));
    o += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">cosine of backend pairs — {}</text>\n",
                     xml_escape(m.name));
    o += fmt::format("<text x=\"10\" y=\"38\" fill=\"#444444\">{}</text>\n", xml_escape(m.description));
    o += "<text x=\"10\" y=\"54\" fill=\"#444444\">rows: reference, columns: candidate; colour: log10(1 − cosine)</text>\n";

    for (std::size_t b = 0; b < n; ++b) {
        const double x = left + cw * (static_cast<double>(b) + 0.5);
        o += fmt::format("<text class=\"col-label\" x=\"{}\" y=\"{}\" transform=\"rotate(-45 {} {})\">{}</text>\n", num(x),
                         num(top - 8), num(x), num(top - 8), xml_escape(m.nodes[b]));
    }
    for (std::size_t a = 0; a < n; ++a) {
        const double y = top + ch * static_cast<double>(a);
        o += fmt::format("<text class=\"row-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(left - 8),
                         num(y + ch / 2 + 4), xml_escape(m.nodes[a]));
        for (std::size_t b = 0; b < n; ++b) {
            const double x = left + cw * static_cast<double>(b);
            const double cx = x + cw / 2;
            if (a == b) {
                o += fmt::format("<rect class=\"diag\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f0f0f0\" stroke=\"#ffffff\"/>\n",
                                 num(x), num(y), num(cw), num(ch));
                o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#999999\">—</text>\n", num(cx), num(y + ch / 2 + 4));
                continue;
            }
            const auto& c = m.cosine[a][b];
            const auto& d = m.max_abs[a][b];
            Rgb fill{200, 200, 200};
            std::string line1 = "not measured", line2;
            if (c && !std::isnan(*c)) {
                fill = ramp(heat(*c));
                line1 = fmt_cosine(*c);
                line2 = d ? "max|Δ| " + fmt_sci(*d) : "";
            } else if (c) {
                line1 = "nan";
            }
            o += fmt::format("<rect class=\"cell\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\">"
                             "<title>{} vs {}: cosine {}, max|Δ| {}</title></rect>\n",
                             num(x), num(y), num(cw), num(ch), hex(fill), xml_escape(m.nodes[b]), xml_escape(m.nodes[a]),
                             c ? shortest(*c) : "not measured", d ? shortest(*d) : "not measured");
            o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n", num(cx),
                             num(y + (line2.empty() ? ch / 2 + 4 : ch / 2 - 3)), ink(fill), xml_escape(line1));
            if (!line2.empty())
                o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{}\">{}</text>\n", num(cx),
                                 num(y + ch / 2 + 11), ink(fill), xml_escape(line2));
        }
    }

    // Colour bar: 1 − cos from 1 (top, red) down to 1e-16 (bottom, green).
    o += "<defs><linearGradient id=\"heat\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
    for (int i = 0; i <= 16; ++i) {
        const double s = i / 16.0;
        o += fmt::format("<stop offset=\"{}\" stop-color=\"{}\"/>", num(s), hex(ramp(s)));
    }
    o += "</linearGradient></defs>\n";
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#heat)\" stroke=\"#666666\"/>\n", num(bar_x),
                     num(top), num(bar_w), num(bar_h));
    o += fmt::format("<text x=\"{}\" y=\"{}\">1 − cos</text>\n", num(bar_x - 10), num(top - 8));
    for (int e = 0; e >= -16; e -= 4) {
        const double y = top + bar_h * (static_cast<double>(-e) / 16.0);
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#666666\"/>", num(bar_x + bar_w), num(y),
                         num(bar_x + bar_w + 4), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(bar_x + bar_w + 7), num(y + 4),
                         e == 0 ? std::string("1") : fmt::format("1e{}", e));
    }
    o += "</svg>\n";
    return o;
}

std::string drift_svg(const std::vector<DriftSeries>& series) {
    static const std::array<const char*, 10> palette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    const double left = 80, top = 50, pw = 560, ph = 360, bottom_pad = 60;
    std::size_t longest = 10;
    for (const auto& s : series) longest = std::max(longest, s.node.size());
    const double legend_w = 60 + 6.6 * static_cast<double>(longest + 14);
    const double width = left + pw + 30 + legend_w, height = top + ph + bottom_pad;

    std::size_t depth = 1;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto& s : series) {
        depth = std::max(depth, s.rel.size());
        for (const double v : s.rel)
            if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    }
    // Guides anchored at the geometric mean of the depth-1 values.
    double log_sum = 0;
    int anchors = 0;
    for (const auto& s : series)
        if (!s.rel.empty() && std::isfinite(s.rel[0]) && s.rel[0] > 0) log_sum += std::log10(s.rel[0]), ++anchors;
    const bool have_data = std::isfinite(lo);
    const double anchor = anchors > 0 ? std::pow(10.0, log_sum / anchors) : 0;
    const double x_max = std::log10(static_cast<double>(std::max<std::size_t>(depth, 2)));
    if (anchors > 0) hi = std::max(hi, anchor * static_cast<double>(std::max<std::size_t>(depth, 2)));  // room for the L guide
    const double y_lo = have_data ? std::floor(std::log10(lo)) : -8, y_hi = have_data ? std::max(std::ceil(std::log10(hi)), y_lo + 1) : 0;
    const auto px = [&](double depth_l) { return left + pw * std::log10(depth_l) / x_max; };
    const auto py = [&](double v) { return top + ph * (y_hi - std::log10(v)) / (y_hi - y_lo); };

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
        num(width), num(height), num(width), num(height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(width), num(height));
    o += "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">residual-stream drift vs depth (log-log)</text>\n";
    o += fmt::format("<defs><clipPath id=\"plot\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath></defs>\n", num(left),
                     num(top), num(pw), num(ph));
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n", num(left), num(top),
                     num(pw), num(ph));

    // y: one gridline per decade (every other decade when there are many).
    const int y_step = (y_hi - y_lo) > 10 ? 2 : 1;
    for (int e = static_cast<int>(y_lo); e <= static_cast<int>(y_hi); e += y_step) {
        const double y = py(std::pow(10.0, e));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(left), num(y), num(left + pw), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{}</text>\n", num(left - 6), num(y + 4), e);
    }
    // x: every depth up to 12, then 1-2-5 per decade.
    std::vector<std::size_t> xt;
    if (depth <= 12) {
        for (std::size_t l = 1; l <= std::max<std::size_t>(depth, 2); ++l) xt.push_back(l);
    } else {
        for (std::size_t dec = 1; dec <= depth; dec *= 10)
            for (const std::size_t k : {1, 2, 5})
                if (k * dec <= depth) xt.push_back(k * dec);
        if (xt.back() != depth) xt.push_back(depth);
    }
    for (const std::size_t l : xt) {
        const double x = px(static_cast<double>(l));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(x), num(top), num(x), num(top + ph));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(x), num(top + ph + 16), l);
    }
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">depth L (layers)</text>\n", num(left + pw / 2), num(top + ph + 38));
    o += fmt::format("<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">‖Δh‖ / ‖h‖</text>\n",
                     num(top + ph / 2), num(top + ph / 2));

    if (anchors > 0) {
        const double l_end = static_cast<double>(std::max<std::size_t>(depth, 2));
        const std::array<std::pair<double, const char*>, 2> guides = {{{0.5, "∝ √L"}, {1.0, "∝ L"}}};
        for (const auto& [power, label] : guides) {
            std::string pts;
            for (int i = 0; i <= 32; ++i) {
                const double l = std::pow(l_end, i / 32.0);
                pts += fmt::format("{},{} ", num(px(l)), num(py(anchor * std::pow(l, power))));
            }
            o += fmt::format("<polyline class=\"guide\" points=\"{}\" fill=\"none\" stroke=\"#888888\" stroke-width=\"1.2\" "
                             "stroke-dasharray=\"{}\" clip-path=\"url(#plot)\"/>\n",
                             pts, power < 1 ? "6,4" : "2,3");
            const double ly = std::clamp(py(anchor * std::pow(l_end, power)), top + 10, top + ph - 4);
            o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#666666\">{}</text>\n", num(left + pw - 4),
                             num(ly - 4), label);
        }
    }

    double legend_y = top + 8;
    const double legend_x = left + pw + 30;
    for (std::size_t i = 0; i < series.size(); ++i) {
        const DriftSeries& s = series[i];
        const char* colour = palette[i % palette.size()];
        std::string pts, dots;
        std::size_t plotted = 0;
        // A gap where a value cannot sit on a log axis: separate polylines.
        const auto flush = [&]() {
            if (plotted > 1) o += fmt::format("<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, colour);
            pts.clear();
            plotted = 0;
        };
        bool any = false;
        for (std::size_t l = 0; l < s.rel.size(); ++l) {
            const double v = s.rel[l];
            if (!(std::isfinite(v) && v > 0)) {
                flush();
                continue;
            }
            any = true;
            const double x = px(static_cast<double>(l + 1)), y = py(v);
            pts += fmt::format("{},{} ", num(x), num(y));
            ++plotted;
            dots += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"><title>{} L{}: {}</title></circle>", num(x), num(y), colour,
                                xml_escape(s.node), l + 1, shortest(v));
        }
        flush();
        o += dots + "\n";
        const std::string alpha = std::isfinite(s.alpha) ? fmt::format("α = {:.2f}", s.alpha) : "α = " + shortest(s.alpha);
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>", num(legend_x), num(legend_y),
                         num(legend_x + 22), num(legend_y), colour);
        o += fmt::format("<text x=\"{}\" y=\"{}\">{}  {}{}</text>\n", num(legend_x + 28), num(legend_y + 4), xml_escape(s.node), alpha,
                         any ? "" : " (identical: no drift)");
        legend_y += 18;
    }
    if (anchors > 0) {
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#666666\">guides through the mean depth-1 drift:</text>\n", num(legend_x),
                         num(legend_y + 12));
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#666666\">dashed ∝ √L (incoherent), dotted ∝ L (coherent)</text>\n",
                         num(legend_x), num(legend_y + 28));
    }
    if (!have_data)
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666666\">no positive drift to plot</text>\n",
                         num(left + pw / 2), num(top + ph / 2));
    o += "</svg>\n";
    return o;
}

// ============================================================================
// Files
// ============================================================================

void write_outputs(const AuditReport& r, const OutputPaths& p) {
    std::vector<std::pair<std::string, std::string>> files;  // (path, content): build everything first
    if (!p.json.empty()) files.emplace_back(p.json, audit_report_json(r).dump(2) + "\n");
    if (!p.junit.empty()) files.emplace_back(p.junit, junit_xml(r));
    if (!p.markdown.empty()) files.emplace_back(p.markdown, markdown_report(r));
    if ((!p.csv.empty() || !p.heatmap_svg.empty()) && r.pairs.empty())
        fail(ErrorCode::bad_input, "{}: no pair matrix to write (the audit compared no pair of nodes)",
             p.csv.empty() ? p.heatmap_svg : p.csv);
    if (!p.csv.empty()) files.emplace_back(p.csv, cosine_csv(r.pairs.front()));
    if (!p.heatmap_svg.empty()) files.emplace_back(p.heatmap_svg, heatmap_svg(r.pairs.front()));
    if (!p.drift_svg.empty()) files.emplace_back(p.drift_svg, drift_svg(r.drift));
    for (const auto& [path, content] : files) write_file_atomic(path, content);
}

}  // namespace kvasir
