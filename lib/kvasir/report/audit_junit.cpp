// junit_xml (audit_junit.hpp): one suite per node, one testcase per judged
// criterion per tier, failures tied to the gate.
#include "kvasir/report/audit_junit.hpp"

#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace kvasir {

using namespace writers_detail;

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
        // A contrast node is reported like any other, but never fails the run.
        const bool gated = r.gate != Gate::none && !v.contrast;
        if (v.contrast) s.properties.emplace_back("contrast", "shown, not gated");

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
                               gated ? msg : (v.contrast ? "not gated (contrast node): " : "not gated (--gate none): ") + msg, msg});
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
                        jc.message = v.contrast ? "not gated (contrast node): " + describe(c)
                                                : fmt::format("not gated (--gate {}): {}", to_string(r.gate), describe(c));
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

}  // namespace kvasir
