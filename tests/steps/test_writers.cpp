// The audit's outputs, built from a synthetic audit (a reference and one node
// of every verdict class; pair matrices with a not-measured and a NaN entry;
// drift series with a zero):
//  * JSON report: validates against protocols/report.schema.json with the C++
//    validator (and the validator is shown not to be vacuous), and with the
//    Python `jsonschema` package via scripts/validate_report.py — skipped
//    VISIBLY (GTEST_SKIP) when python3 or jsonschema is missing;
//  * JUnit XML: well-formed by this file's own minimal XML checker (tags
//    balanced, attributes quoted and unique, entities valid, one root), its
//    counters equal to the testcases it holds, and failures+errors > 0
//    exactly when the exit code is 1, for every gate; also parsed by Python's
//    xml.etree (a real XML parser) via scripts/validate_report.py --junit,
//    skipped visibly without python3;
//  * Markdown, CSV (shape, RFC 4180 quoting of node specs with commas), SVG
//    heatmap (well-formed, one class="cell" per ordered pair) and SVG drift
//    plot (one series per node, two guides);
//  * atomic writes: a writer process killed (SIGKILL) in the middle of
//    writing the report leaves the previous report byte-for-byte intact.
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_junit.hpp"
#include "kvasir/report/audit_markdown.hpp"
#include "kvasir/report/cosine_csv.hpp"
#include "kvasir/report/drift_svg.hpp"
#include "kvasir/report/heatmap_svg.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/report/writers.hpp"
#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace kvasir;
using nlohmann::json;

namespace {

const fs::path kRoot = fs::path(KVASIR_SOURCE_DIR);
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A scratch folder per test, removed at the end.
struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               fmt::format("kvasir_writers_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

Tolerances sens() {
    return {{"logits.kl_p99", {1e-6, "f32 vs f64 is 1e-12..1e-9"}},
            {"ops.max_rel", {1e-2, "one decade over f32"}},
            {"determinism", {0, "bit-identical"}}};
}
Tolerances tol() {
    return {{"logits.kl_p99", {1e-2, "visible change"}}, {"ops.max_rel", {1e2, "gross"}}, {"determinism", {1e-2, "atomics"}}};
}

NodeInput node(const std::string& name, double kl, double ops, bool reference = false) {
    NodeInput n;
    n.node = name;
    n.is_reference = reference;
    n.capabilities = {{"node", name}, {"backend", name.substr(0, name.find(':'))}, {"device", "test <host> & \"co\""},
                      {"runtime", "r"}, {"storage", "f32"}, {"accumulation", name.find("f16") != std::string::npos ? "f16" : "f32"},
                      {"output", "f32"}, {"fma", true}, {"threads", 2}, {"deterministic", true},
                      {"extra", json::object()}};
    n.measurements = {{"logits.kl_p99", "logits", kl}, {"ops.matmul.max_rel", "ops", ops}, {"ops.moe.max_rel", "ops", ops / 2},
                      {"determinism", "determinism", 0}};
    return n;
}

// ref, fit, unfit-sensitive, unfit, error (NaN + a step error).
std::vector<NodeVerdict> verdicts() {
    std::vector<NodeInput> in = {node("cpu-ref", 0, 0, true), node("cpu", 1e-10, 1e-3), node("cpu:acc=f16,storage=bf16", 1e-5, 20),
                                 node("cpu:fault=perturb,fault_size=1e-1", 1.0, 0.1), node("cpu:fault=nan", kNaN, 1e-3)};
    in.back().errors["generate"] = "threw: <boom> & \"quotes\"";
    std::vector<NodeVerdict> out;
    for (const auto& n : in) out.push_back(judge_node(n, sens(), tol()));
    return out;
}

PairMatrix matrix(const std::vector<std::string>& nodes) {
    PairMatrix m;
    m.name = "moe";
    m.description = "x[16,2048] <router-pinned> & experts";
    m.nodes = nodes;
    const std::size_t n = nodes.size();
    m.max_abs.assign(n, std::vector<std::optional<double>>(n));
    m.cosine.assign(n, std::vector<std::optional<double>>(n));
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = 0; b < n; ++b) {
            if (a == b) {
                m.max_abs[a][b] = 0.0;
                m.cosine[a][b] = 1.0;
                continue;
            }
            const double d = std::pow(10.0, -13.0 + 2.5 * static_cast<double>(std::max(a, b)));  // 1e-10 … 1e-3
            m.max_abs[a][b] = d * 100;
            m.cosine[a][b] = 1.0 - d;
        }
    m.cosine[0][4] = kNaN;  // the NaN node
    m.max_abs[0][4] = kNaN;
    m.cosine[4][0].reset();  // not measured
    m.max_abs[4][0].reset();
    return m;
}

AuditReport report(Gate gate = Gate::sensitive) {
    AuditReport r;
    r.protocol = {"default", 1, "sha256:" + std::string(64, 'a'), "protocols/default.json"};
    r.model = {{"fingerprint", "0123456789abcdef0123456789abcdef"}, {"path", "fixtures/models/qwen3_moe_tiny"}};
    r.reference = "cpu-ref";
    r.seed = 20261129;
    r.gate = gate;
    r.nodes = verdicts();
    std::vector<std::string> names;
    for (const auto& v : r.nodes) names.push_back(v.node);
    r.pairs = {matrix(names)};
    r.drift = {{"cpu", {1e-7, 1.5e-7, 1.7e-7, 2.1e-7}, 0.52},
               {"cpu:acc=f16,storage=bf16", {1e-3, 2.1e-3, 2.9e-3, 4.2e-3}, 1.01},
               {"cpu:fault=nan", {0, 0, 0, 0}, 0}};
    r.steps = {{"note", "free-form"}};
    return r;
}

json schema(const char* name) { return json::parse(read_text_file((kRoot / "protocols" / name).string())); }

// --- a minimal XML 1.0 well-formedness checker --------------------------------------
// Enough for what kvasir writes (no DTD, no CDATA, no processing instructions
// other than the declaration): elements balance, names are XML names,
// attribute values are quoted, unique, and free of '<'; every '&' starts a
// predefined or numeric entity; one root element; nothing but whitespace
// outside it. Returns "" when well-formed, else the first problem.
std::string xml_problem(const std::string& s) {
    std::size_t i = 0;
    const auto name_at = [&](std::size_t& p) {
        const std::size_t start = p;
        while (p < s.size() && (std::isalnum(static_cast<unsigned char>(s[p])) || s[p] == '_' || s[p] == ':' || s[p] == '-' ||
                                s[p] == '.'))
            ++p;
        if (p == start || std::isdigit(static_cast<unsigned char>(s[start])) || s[start] == '-' || s[start] == '.') return std::string();
        return s.substr(start, p - start);
    };
    const auto entities_ok = [&](const std::string& text) {
        static const std::regex ent("^&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9A-Fa-f]+);");
        for (std::size_t k = 0; k < text.size(); ++k)
            if (text[k] == '&' && !std::regex_search(text.substr(k, 12), ent)) return false;
        return true;
    };
    if (s.rfind("<?xml", 0) == 0) {
        i = s.find("?>");
        if (i == std::string::npos) return "unterminated XML declaration";
        i += 2;
    }
    std::vector<std::string> stack;
    int roots = 0;
    while (i < s.size()) {
        const std::size_t lt = s.find('<', i);
        const std::string text = s.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
        if (!entities_ok(text)) return "bad entity in text near: " + text.substr(0, 40);
        if (text.find('>') != std::string::npos && stack.empty()) return "stray '>' outside the root";
        if (stack.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos) return "text outside the root: " + text.substr(0, 40);
        if (lt == std::string::npos) break;
        i = lt + 1;
        if (s.compare(i, 3, "!--") == 0) {
            const std::size_t end = s.find("-->", i);
            if (end == std::string::npos) return "unterminated comment";
            i = end + 3;
            continue;
        }
        if (i < s.size() && s[i] == '/') {
            ++i;
            const std::string n = name_at(i);
            while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
            if (i >= s.size() || s[i] != '>') return "malformed end tag </" + n;
            ++i;
            if (stack.empty() || stack.back() != n) return "end tag </" + n + "> does not match <" + (stack.empty() ? "" : stack.back()) + ">";
            stack.pop_back();
            continue;
        }
        const std::string n = name_at(i);
        if (n.empty()) return "bad element name at byte " + std::to_string(i);
        if (stack.empty() && ++roots > 1) return "more than one root element";
        std::set<std::string> attrs;
        while (true) {
            const std::size_t before = i;
            while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
            if (i >= s.size()) return "unterminated tag <" + n;
            if (s[i] == '>' || s.compare(i, 2, "/>") == 0) break;
            if (i == before) return "attributes of <" + n + "> not separated by space";
            const std::string a = name_at(i);
            if (a.empty()) return "bad attribute name in <" + n + ">";
            if (!attrs.insert(a).second) return "duplicate attribute " + a + " in <" + n + ">";
            if (i >= s.size() || s[i] != '=') return "attribute " + a + " without '='";
            ++i;
            if (i >= s.size() || (s[i] != '"' && s[i] != '\'')) return "unquoted attribute " + a;
            const char q = s[i++];
            const std::size_t end = s.find(q, i);
            if (end == std::string::npos) return "unterminated attribute " + a;
            const std::string value = s.substr(i, end - i);
            if (value.find('<') != std::string::npos) return "'<' in attribute " + a;
            if (!entities_ok(value)) return "bad entity in attribute " + a;
            i = end + 1;
        }
        if (s[i] == '>') {
            stack.push_back(n);
            ++i;
        } else {
            i += 2;  // empty element
        }
    }
    if (!stack.empty()) return "unclosed <" + stack.back() + ">";
    if (roots != 1) return "no root element";
    return "";
}

std::size_t count(const std::string& s, const std::string& needle) {
    std::size_t n = 0;
    for (std::size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size())) ++n;
    return n;
}

std::string attr(const std::string& xml, const std::string& tag, const std::string& name) {
    const std::regex re("<" + tag + "\\b[^>]*\\b" + name + "=\"([^\"]*)\"");
    std::smatch m;
    return std::regex_search(xml, m, re) ? m[1].str() : "";
}

// Runs a command; returns its exit status and stdout+stderr.
std::pair<int, std::string> run(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    if (p == nullptr) return {-1, ""};
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int st = ::pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

bool have_python() { return run("python3 -c 'import xml.etree.ElementTree'").first == 0; }

// RFC 4180 record splitter (quoted fields may hold commas and doubled quotes).
std::vector<std::vector<std::string>> parse_csv(const std::string& s) {
    std::vector<std::vector<std::string>> rows(1);
    std::string field;
    bool quoted = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if (quoted) {
            if (c == '"' && i + 1 < s.size() && s[i + 1] == '"') field += '"', ++i;
            else if (c == '"') quoted = false;
            else field += c;
        } else if (c == '"') {
            quoted = true;
        } else if (c == ',') {
            rows.back().push_back(field), field.clear();
        } else if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') {
            rows.back().push_back(field), field.clear();
            rows.emplace_back();
            ++i;
        } else {
            field += c;
        }
    }
    if (rows.back().empty() && field.empty()) rows.pop_back();
    return rows;
}

}  // namespace

// --- JSON ---------------------------------------------------------------------------

TEST(ReportJson, ValidatesAgainstTheShippedSchema) {
    const AuditReport r = report();
    const nlohmann::ordered_json j = audit_report_json(r);
    const json doc = json::parse(j.dump());
    const auto v = schema_violations(schema("report.schema.json"), doc);
    for (const auto& x : v) ADD_FAILURE() << x.path << ": " << x.message;

    std::vector<std::string> keys;
    for (const auto& [k, val] : j.items()) keys.push_back(k);
    EXPECT_EQ(keys, (std::vector<std::string>{"schema", "tool", "protocol", "model", "reference", "seed", "gate", "exit_code",
                                              "summary", "nodes", "pairs", "drift", "steps"}));
    EXPECT_EQ(j["schema"], "kvasir-equiv/audit/1");
    EXPECT_EQ(j["exit_code"], 1);
    EXPECT_EQ(j["summary"]["judged"], 4);
    for (const char* k : {"fit", "unfit-sensitive", "unfit", "error"}) EXPECT_EQ(j["summary"][k], 1) << k;
    std::vector<std::string> got;
    for (const auto& n : j["nodes"]) got.push_back(n["verdict"]);
    EXPECT_EQ(got, (std::vector<std::string>{"reference", "fit", "unfit-sensitive", "unfit", "error"}));
    EXPECT_EQ(j["pairs"][0]["cosine"][0][4], "nan");
    EXPECT_TRUE(j["pairs"][0]["cosine"][4][0].is_null());
    EXPECT_EQ(j["pairs"][0]["cosine"].size(), 5u);
    EXPECT_EQ(j["drift"][0]["depth"], json::array({1, 2, 3, 4}));
    // Stable: the same report gives the same bytes.
    EXPECT_EQ(j.dump(), audit_report_json(report()).dump());
}

TEST(ReportJson, SchemaIsNotVacuous) {
    const json good = json::parse(audit_report_json(report()).dump());
    const json s = schema("report.schema.json");
    ASSERT_TRUE(schema_violations(s, good).empty());
    const auto broken = [&](auto&& mutate, const std::string& where) {
        json d = good;
        mutate(d);
        const auto v = schema_violations(s, d);
        bool at = false;
        for (const auto& x : v) at = at || x.path == where;
        EXPECT_TRUE(at) << "no violation at " << where << (v.empty() ? " (none at all)" : ", first at " + v.front().path);
    };
    broken([](json& d) { d.erase("nodes"); }, "");
    broken([](json& d) { d["nodes"][1]["verdict"] = "maybe"; }, "/nodes/1/verdict");
    broken([](json& d) { d["nodes"][1]["criteria"]["sensitive"][0]["value"] = "NaN"; }, "/nodes/1/criteria/sensitive/0/value");
    broken([](json& d) { d["nodes"][1]["criteria"]["sensitive"][0].erase("margin"); }, "/nodes/1/criteria/sensitive/0");
    broken([](json& d) { d["protocol"]["content_hash"] = "md5:abc"; }, "/protocol/content_hash");
    broken([](json& d) { d["pairs"][0]["cosine"][1][2] = true; }, "/pairs/0/cosine/1/2");
    broken([](json& d) { d["surprise"] = 1; }, "/surprise");
    broken([](json& d) { d["model"].erase("fingerprint"); }, "/model");
}

TEST(ReportJson, ModelFingerprintRequired) {
    AuditReport r = report();
    r.model = {{"path", "x"}};
    EXPECT_THROW(audit_report_json(r), Error);
}

TEST(ReportJson, PythonJsonschemaAgrees) {
    if (!have_python()) GTEST_SKIP() << "python3 not available: the independent jsonschema check did NOT run";
    TempDir dir;
    const std::string file = dir / "report.json";
    write_outputs(report(), OutputPaths{file, "", "", "", "", ""});
    const auto [rc, out] = run(fmt::format("python3 {} {}", (kRoot / "scripts" / "validate_report.py").string(), file));
    if (rc == 77) GTEST_SKIP() << "Python jsonschema not installed: the independent check did NOT run (" << out << ")";
    EXPECT_EQ(rc, 0) << out;
    const auto [rc2, out2] = run(fmt::format("python3 {} --check-schemas", (kRoot / "scripts" / "validate_report.py").string()));
    EXPECT_EQ(rc2, 0) << out2;
    // And it is not vacuous either: a broken report is refused.
    json bad = json::parse(read_text_file(file));
    bad["nodes"][0]["verdict"] = "maybe";
    write_file_atomic(file, bad.dump());
    EXPECT_EQ(run(fmt::format("python3 {} {}", (kRoot / "scripts" / "validate_report.py").string(), file)).first, 1);
}

// --- JUnit ----------------------------------------------------------------------------

TEST(JUnit, WellFormedAndCountsRight) {
    const std::string x = junit_xml(report());
    EXPECT_EQ(xml_problem(x), "");
    // Counters equal what the file holds.
    EXPECT_EQ(std::stoul(attr(x, "testsuites", "tests")), count(x, "<testcase "));
    EXPECT_EQ(std::stoul(attr(x, "testsuites", "failures")), count(x, "<failure "));
    EXPECT_EQ(std::stoul(attr(x, "testsuites", "errors")), count(x, "<error "));
    EXPECT_EQ(std::stoul(attr(x, "testsuites", "skipped")), count(x, "<skipped "));
    EXPECT_EQ(count(x, "<testsuite "), 5u);  // one per node
    // A testcase per node per criterion and tier: 4 judged nodes × 2 tiers ×
    // 4 criteria (ops.max_rel is judged per op: matmul and moe), + the
    // reference's, + the error node's two errors (its generate step threw; its
    // logits step measured a NaN).
    EXPECT_EQ(count(x, "<testcase "), 4u * 8u + 1u + 2u);
    EXPECT_NE(x.find("<testcase name=\"run: generate\""), std::string::npos);
    EXPECT_NE(x.find("<testcase name=\"run: logits\""), std::string::npos);
    // Hostile text is escaped.
    EXPECT_NE(x.find("threw: &lt;boom&gt; &amp; &quot;quotes&quot;"), std::string::npos);
    EXPECT_EQ(x.find("<boom>"), std::string::npos);
}

TEST(JUnit, FailuresMatchTheExitCodeForEveryGate) {
    for (const Gate g : {Gate::sensitive, Gate::tolerant, Gate::none}) {
        AuditReport r = report(g);
        // Subsets: all nodes; ref + fit; ref + fit + unfit-sensitive; ref only.
        const std::vector<NodeVerdict> all = r.nodes;
        for (const std::vector<std::size_t>& pick : std::vector<std::vector<std::size_t>>{{0, 1, 2, 3, 4}, {0, 1}, {0, 1, 2}, {0, 1, 4}, {0}}) {
            r.nodes.clear();
            for (const std::size_t i : pick) r.nodes.push_back(all[i]);
            const std::string x = junit_xml(r);
            ASSERT_EQ(xml_problem(x), "") << to_string(g);
            const unsigned long bad = std::stoul(attr(x, "testsuites", "failures")) + std::stoul(attr(x, "testsuites", "errors"));
            EXPECT_EQ(bad > 0, exit_code(r.nodes, g) == 1) << "gate " << to_string(g) << ", " << pick.size() << " nodes";
        }
    }
    // The error node's NaN is an <error>, its unmeasured nothing is not.
    const std::string x = junit_xml(report(Gate::tolerant));
    EXPECT_NE(x.find("<error message=\"logits.kl_p99 nan"), std::string::npos);
    EXPECT_NE(x.find("<skipped message=\"not gated (--gate tolerant)"), std::string::npos);
}

TEST(JUnit, PythonXmlParserAccepts) {
    if (!have_python()) GTEST_SKIP() << "python3 not available: the xml.etree check did NOT run";
    TempDir dir;
    for (const Gate g : {Gate::sensitive, Gate::none}) {
        const std::string file = dir / "junit.xml";
        write_outputs(report(g), OutputPaths{"", file, "", "", "", ""});
        const auto [rc, out] = run(fmt::format("python3 {} --junit {}", (kRoot / "scripts" / "validate_report.py").string(), file));
        EXPECT_EQ(rc, 0) << out;
        const std::string x = read_text_file(file);
        EXPECT_NE(out.find(fmt::format("tests={} failures={} errors={} skipped={}", attr(x, "testsuites", "tests"),
                                       attr(x, "testsuites", "failures"), attr(x, "testsuites", "errors"),
                                       attr(x, "testsuites", "skipped"))),
                  std::string::npos)
            << out;
    }
}

TEST(Xml, CheckerIsNotVacuous) {
    EXPECT_EQ(xml_problem("<a><b x=\"1\"/>t &amp; u</a>"), "");
    EXPECT_NE(xml_problem("<a><b></a></b>"), "");
    EXPECT_NE(xml_problem("<a x=\"1\" x=\"2\"/>"), "");
    EXPECT_NE(xml_problem("<a>&nope;</a>"), "");
    EXPECT_NE(xml_problem("<a x=1/>"), "");
    EXPECT_NE(xml_problem("<a/><b/>"), "");
    EXPECT_NE(xml_problem("<a>"), "");
    EXPECT_EQ(xml_escape("a<b>&\"c'\x01"), "a&lt;b&gt;&amp;&quot;c&apos;\xEF\xBF\xBD");
}

// --- Markdown / CSV / SVG --------------------------------------------------------------

TEST(Markdown, SummaryAndPairTables) {
    const std::string md = markdown_report(report());
    EXPECT_NE(md.find("gate **sensitive** → exit code **1**"), std::string::npos);
    for (const char* v : {"| cpu | fit |", "| cpu:acc=f16,storage=bf16 | unfit-sensitive |",
                          "| cpu:fault=perturb,fault_size=1e-1 | unfit |", "| cpu:fault=nan | error |", "| cpu-ref | reference |"})
        EXPECT_NE(md.find(v), std::string::npos) << v;
    EXPECT_EQ(count(md, " vs "), 10u);  // 5·4/2 unordered pairs
    EXPECT_NE(md.find("| cpu:fault=nan vs cpu-ref | nan | nan |"), std::string::npos);
    EXPECT_NE(md.find("## Drift over depth"), std::string::npos);
}

TEST(Csv, CosineMatrixShapeAndQuoting) {
    const AuditReport r = report();
    const auto rows = parse_csv(cosine_csv(r.pairs.front()));
    ASSERT_EQ(rows.size(), 6u);
    for (const auto& row : rows) EXPECT_EQ(row.size(), 6u);
    EXPECT_EQ(rows[0][0], "node");
    EXPECT_EQ(rows[0][3], "cpu:acc=f16,storage=bf16");  // quoted in the file, one field here
    EXPECT_EQ(rows[3][0], "cpu:acc=f16,storage=bf16");
    EXPECT_EQ(rows[2][2], "1");                          // diagonal
    EXPECT_EQ(rows[1][5], "nan");
    EXPECT_EQ(rows[5][1], "");                           // not measured
    EXPECT_DOUBLE_EQ(std::stod(rows[2][3]), *r.pairs.front().cosine[1][2]);  // round-trips exactly
}

TEST(Svg, HeatmapWellFormedOneCellPerPair) {
    const AuditReport r = report();
    const std::string svg = heatmap_svg(r.pairs.front());
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_EQ(xml_problem(svg), "");
    const std::size_t n = r.pairs.front().nodes.size();
    EXPECT_EQ(count(svg, "class=\"cell\""), n * (n - 1));
    EXPECT_EQ(count(svg, "class=\"diag\""), n);
    EXPECT_NE(svg.find("cpu:acc=f16,storage=bf16"), std::string::npos);
    EXPECT_NE(svg.find("&lt;router-pinned&gt; &amp; experts"), std::string::npos);
    // Colour follows log10(1 − cos): the identical pair is the ramp's green end
    // only when 1 − cos ≤ 1e-16; here the closest pair (1e-10) is already lighter.
    PairMatrix two;
    two.name = "t";
    two.nodes = {"a", "b"};
    two.max_abs = {{0.0, 0.0}, {0.0, 0.0}};
    two.cosine = {{1.0, 1.0}, {1.0 - 1e-2, 1.0}};
    const std::string s2 = heatmap_svg(two);
    EXPECT_NE(s2.find("fill=\"#1a9641\""), std::string::npos);  // cos = 1: green
    // 1 − cos = 1e-2: s = 14/16 = 0.875, halfway between the orange (253,174,97)
    // and red (215,25,28) stops: (234, 99.5, 62.5) → #ea643f.
    EXPECT_NE(s2.find("fill=\"#ea643f\""), std::string::npos);
}

TEST(Svg, DriftPlotWellFormedWithGuides) {
    const AuditReport r = report();
    const std::string svg = drift_svg(r.drift);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_EQ(xml_problem(svg), "");
    EXPECT_EQ(count(svg, "class=\"series\""), 2u);  // the all-zero series has nothing to draw on log axes
    EXPECT_EQ(count(svg, "class=\"guide\""), 2u);
    EXPECT_NE(svg.find("∝ √L"), std::string::npos);
    EXPECT_NE(svg.find("(identical: no drift)"), std::string::npos);
    EXPECT_NE(svg.find("α = 0.52"), std::string::npos);
    const std::string empty = drift_svg({});
    EXPECT_EQ(xml_problem(empty), "");
    EXPECT_NE(empty.find("no positive drift to plot"), std::string::npos);
}

// --- files ------------------------------------------------------------------------------

TEST(WriteOutputs, EveryFileWrittenAsBuilt) {
    TempDir dir;
    const AuditReport r = report();
    const OutputPaths p{dir / "r.json", dir / "r.xml", dir / "r.md", dir / "r.csv", dir / "heat.svg", dir / "drift.svg"};
    write_outputs(r, p);
    EXPECT_EQ(read_text_file(p.json), audit_report_json(r).dump(2) + "\n");
    EXPECT_EQ(read_text_file(p.junit), junit_xml(r));
    EXPECT_EQ(read_text_file(p.markdown), markdown_report(r));
    EXPECT_EQ(read_text_file(p.csv), cosine_csv(r.pairs.front()));
    EXPECT_EQ(read_text_file(p.heatmap_svg), heatmap_svg(r.pairs.front()));
    EXPECT_EQ(read_text_file(p.drift_svg), drift_svg(r.drift));
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++files;
    EXPECT_EQ(files, 6u);  // no temporary left behind
    // No pair matrix: refused before anything is written.
    AuditReport none = r;
    none.pairs.clear();
    EXPECT_THROW(write_outputs(none, OutputPaths{dir / "x.json", "", "", dir / "x.csv", "", ""}), Error);
    EXPECT_FALSE(fs::exists(dir / "x.json"));
    // An unwritable folder is bad input naming the path.
    try {
        write_outputs(r, OutputPaths{dir / "no/such/dir/r.json", "", "", "", "", ""});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("no/such/dir/r.json"), std::string::npos);
    }
}

TEST(WriteOutputs, KilledMidWriteLeavesThePreviousReportIntact) {
    TempDir dir;
    const std::string target = dir / "report.json";
    const std::string previous = "{\"previous\": \"report\"}\n";
    write_file_atomic(target, previous);

    // A report of several hundred KiB (a large free-form steps section).
    AuditReport big = report();
    std::string blob(400 * 1024, 'x');
    big.steps = {{"blob", blob}};
    const std::size_t limit = 64 * 1024;

    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // The file-size limit stops the write after `limit` bytes: the kernel
        // raises SIGXFSZ at the first write past it, and the handler turns that
        // into SIGKILL — the process dies in the middle of writing the
        // temporary file, deterministically, with no timing involved.
        struct sigaction sa {};
        sa.sa_handler = [](int) { ::raise(SIGKILL); };
        ::sigaction(SIGXFSZ, &sa, nullptr);
        struct rlimit rl {limit, limit};
        ::setrlimit(RLIMIT_FSIZE, &rl);
        try {
            write_outputs(big, OutputPaths{target, "", "", "", "", ""});
        } catch (...) {
        }
        ::_exit(0);  // not reached when the kill works
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer was not killed (status " << status << ")";
    EXPECT_EQ(WTERMSIG(status), SIGKILL);

    EXPECT_EQ(read_text_file(target), previous);  // byte for byte
    // What the dead process left: at most its hidden temporary, partial and
    // never renamed over the report.
    std::size_t partials = 0;
    for (const auto& e : fs::directory_iterator(dir.path)) {
        const std::string name = e.path().filename().string();
        if (name == "report.json") continue;
        EXPECT_EQ(name.rfind(".report.json.tmp-", 0), 0u) << name;
        EXPECT_EQ(fs::file_size(e.path()), limit) << "the kill came mid-write";
        ++partials;
    }
    EXPECT_EQ(partials, 1u);
    // The next successful write replaces the report whole.
    write_outputs(big, OutputPaths{target, "", "", "", "", ""});
    EXPECT_EQ(read_text_file(target), audit_report_json(big).dump(2) + "\n");
}
