// Issue #41 item 2: a new step is one file plus its test. The toy step below
// — the rmsnorm of seeded rows on every node, compared by its guarded max
// relative delta — is registered from this file alone: its protocol section
// (read and validated by its plan), its criterion (declared_criteria: the
// catalogue, the tiers and the verdicts take it), its text section. The
// audit plans, collects, compares and judges it like a built-in step; capture
// + compare give the same section from files; the reports render it (text,
// JSON, Markdown's criteria, its own HTML section).
#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/capture.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_logits.hpp"
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/audit_html.hpp"
#include "kvasir/report/writers_common.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_markdown.hpp"
#include "kvasir/report/step_text.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <any>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace kvasir;
using Json = nlohmann::ordered_json;

namespace {

// ---- the step: everything about it is here --------------------------------------

struct NormConfig {
    std::int64_t rows = 0;
};
constexpr std::int64_t kWidth = 64;

// Its typed result: what the reports read; to_json() is its JSON section.
struct NormResult final : StepResult {
    struct Entry : NodeEntry {
        double max_rel = 0;
        Json to_json() const { return json_with({{"max_rel", json_double(max_rel)}}); }
    };
    std::string reference;
    std::vector<Entry> results;
    Json to_json() const override { return Json{{"reference", reference}, {"results", entries_json(results)}}; }
};

class NormStep final : public Step {
public:
    const char* name() const override { return "toy_norm"; }

    std::vector<CriterionInfo> declared_criteria() const override {
        return {{"toy_norm.max_rel", "toy_norm", Direction::max, MarginScale::log, false, true,
                 "toy step: guarded max relative delta of the rmsnorm of seeded rows"}};
    }

    // Section {"rows": N}: N seeded rows of width 64.
    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        if (!ac.protocol->runs(name())) return false;
        const nlohmann::json& s = ac.protocol->section(name());
        const bool ok = s.size() == 1 && s.contains("rows") && s["rows"].is_number_integer() && s["rows"].get<std::int64_t>() >= 1 &&
                        s["rows"].get<std::int64_t>() <= 4096;
        KVASIR_CHECK(ok, ErrorCode::bad_input, "{}: /steps/toy_norm: expected {{\"rows\": 1..4096}}, got {}", ac.protocol->source,
                     s.dump());
        plan.registered[name()] = NormConfig{s["rows"].get<std::int64_t>()};
        return true;
    }

    std::any decide(const StepEnv&, Backend&) const override { return {}; }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any&, bool) const override {
        const auto c = std::any_cast<NormConfig>(env.plan->registered.at(name()));
        const Tensor x = seeded_normal(env.plan->seed, "toy/x", {c.rows, kWidth}, 0.0, 1.0);
        const Tensor w = seeded_normal(env.plan->seed, "toy/w", {kWidth}, 1.0, 0.1);
        StepOutput out;
        out.tensors.emplace("toy_norm.out", node.rmsnorm(x.view(), w.view(), 1e-6));
        return out;
    }

    std::shared_ptr<const StepResult> compare(const Protocol&, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const NodeOutputs& ref = *in.nodes[in.reference];
        auto r = std::make_shared<NormResult>();
        r->reference = ref.node();
        r->results = for_each_candidate<NormResult::Entry>(in, led, name(), [&](std::size_t i) {
            NormResult::Entry e;
            e.max_rel = kvasir::compare(ref.view("toy_norm.out"), in.nodes[i]->view("toy_norm.out")).max_rel;
            led.measure(i, name(), "toy_norm.max_rel", e.max_rel);
            return e;
        });
        return r;
    }
};

std::string norm_text(const StepResult& r, const Style&) {
    std::string out = "\nToy norm step\n";
    for (const NormResult::Entry& e : dynamic_cast<const NormResult&>(r).results) out += fmt::format("  {}  max_rel {}\n", e.node, e.max_rel);
    return out;
}

// Its HTML section, from its typed result (registered in the test below,
// after the page has shown the step without one).
std::string norm_html(const StepResult& r) {
    std::string o = "<table class=\"toy\"><thead><tr><th>node</th><th>guarded max rel of the norm</th></tr></thead><tbody>\n";
    for (const NormResult::Entry& e : dynamic_cast<const NormResult&>(r).results)
        o += fmt::format("<tr><td><code>{}</code></td><td class=\"num\">{}</td></tr>\n", xml_escape(e.node), fmt_sci(e.max_rel));
    return o + "</tbody></table>\n";
}

const NormStep& norm_step() {
    static const NormStep step;
    static const bool registered = [] {
        register_step(step);
        register_step_text(step.name(), norm_text);
        return true;
    }();
    (void)registered;
    return step;
}

// ---- its test ---------------------------------------------------------------------

const fs::path kRoot = fs::path(KVASIR_SOURCE_DIR);

const Model& fixture() {
    static const Model m = Model::open((kRoot / "fixtures/models/qwen3_moe_tiny").string());
    return m;
}

// ci.json's logits step (a built-in beside the toy) and the toy step with its tolerances.
nlohmann::json toy_document(const nlohmann::json& section) {
    nlohmann::json doc = nlohmann::json::parse(read_text_file((kRoot / "protocols/ci.json").string()));
    for (auto it = doc["steps"].begin(); it != doc["steps"].end();) it = it.key() == "logits" ? std::next(it) : doc["steps"].erase(it);
    for (const char* tier : {"sensitive", "tolerant"})
        for (auto it = doc["tiers"][tier].begin(); it != doc["tiers"][tier].end();)
            it = it.key().rfind("logits.", 0) == 0 ? std::next(it) : doc["tiers"][tier].erase(it);
    doc["steps"]["toy_norm"] = section;
    doc["tiers"]["sensitive"]["toy_norm.max_rel"] = {{"value", 1e-5}, {"why", "f32 rounding of one norm"}};
    doc["tiers"]["tolerant"]["toy_norm.max_rel"] = {{"value", 1e-1}, {"why", "half-precision accumulation of one norm"}};
    return doc;
}

Protocol toy_protocol() { return parse_protocol(toy_document({{"rows", 8}}), "ci.json + toy_norm", (kRoot / "protocols").string()); }

const CriterionResult* criterion_of(const NodeVerdict& v, const std::string& name) {
    for (const CriterionResult& c : v.tier(Tier::sensitive))
        if (c.criterion == name) return &c;
    return nullptr;
}

TEST(ToyStep, RegisteredFromOneFileItIsPlannedCollectedComparedJudgedCapturedAndRendered) {
    norm_step();
    // Registered: a protocol section, a criterion of the catalogue.
    const auto& names = protocol_step_names();
    EXPECT_EQ(names.back(), "toy_norm");
    ASSERT_TRUE(find_criterion("toy_norm.max_rel").has_value());
    EXPECT_EQ(find_criterion("toy_norm.max_rel")->step, "toy_norm");
    EXPECT_EQ(step_named("toy_norm").criteria().size(), 1u);
    const Protocol p = toy_protocol();
    EXPECT_TRUE(p.runs("toy_norm"));

    // Planned, collected, compared, judged: in-process audit.
    const std::vector<std::string> specs{"cpu-ref", "cpu", "cpu:acc=f16"};
    std::vector<std::unique_ptr<Backend>> nodes;
    for (const auto& s : specs) nodes.push_back(create_backend(s));
    AuditConfig cfg;
    cfg.protocol = &p;
    cfg.model = &fixture();
    const AuditRun run = run_audit(cfg, nodes, 0);
    EXPECT_EQ(run.step_order, (std::vector<std::string>{"logits", "toy_norm"}));
    const Json& section = run.report.steps.at("toy_norm");
    ASSERT_EQ(section.at("results").size(), 2u);
    const double cpu = section["results"][0]["max_rel"], f16 = section["results"][1]["max_rel"];
    EXPECT_LT(cpu, 1e-6);  // f32 rounding of a 64-wide norm
    EXPECT_GT(f16, 1e-4);  // an f16 accumulator's
    // The typed result the reports read, and the section it writes.
    const NormResult* typed = run.report.result<NormResult>("toy_norm");
    ASSERT_NE(typed, nullptr);
    ASSERT_EQ(typed->results.size(), 2u);
    EXPECT_EQ(typed->results[0].node, "cpu");
    EXPECT_EQ(typed->results[1].max_rel, f16);
    EXPECT_EQ(typed->to_json().dump(), section.dump());
    EXPECT_EQ(run.report.result<LogitsResult>("toy_norm"), nullptr);  // not of that type
    const CriterionResult* c_cpu = criterion_of(run.report.nodes[1], "toy_norm.max_rel");
    const CriterionResult* c_f16 = criterion_of(run.report.nodes[2], "toy_norm.max_rel");
    ASSERT_NE(c_cpu, nullptr);
    ASSERT_NE(c_f16, nullptr);
    EXPECT_TRUE(c_cpu->pass);
    EXPECT_FALSE(c_f16->pass);
    EXPECT_EQ(c_f16->value, f16);
    EXPECT_NE(run.report.nodes[2].verdict, Verdict::fit);

    // Captured and compared from files: the same section and verdicts.
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvasir-toy-{}", ::getpid());
    fs::create_directories(dir);
    std::vector<Capture> caps;
    for (std::size_t i = 0; i < specs.size(); ++i) {
        const std::string path = (dir / fmt::format("{}.safetensors", i)).string();
        write_capture(path, capture_node(cfg, *nodes[i], *nodes[0]));
        caps.push_back(Capture::open(path));
    }
    std::vector<const Capture*> ptrs;
    for (const Capture& c : caps) ptrs.push_back(&c);
    CompareConfig cc;
    cc.protocol = &p;
    const AuditRun cmp = compare_captures(cc, ptrs, 0);
    EXPECT_EQ(cmp.report.steps.at("toy_norm").dump(), section.dump());
    for (std::size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(cmp.report.nodes[i].verdict, run.report.nodes[i].verdict) << specs[i];
    fs::remove_all(dir);

    // Rendered: its text section, the report's JSON, the criterion in the Markdown report.
    const std::string text = render_step_text(run.report, "toy_norm", Style{});
    EXPECT_NE(text.find("Toy norm step"), std::string::npos);
    EXPECT_NE(text.find("cpu:acc=f16"), std::string::npos);
    EXPECT_EQ(audit_report_json(run.report)["steps"]["toy_norm"].dump(), section.dump());
    EXPECT_NE(markdown_report(run.report).find("toy_norm.max_rel"), std::string::npos);
    // The HTML report: a section of its own, a row per candidate with its figure.
    const auto toy_section = [&run] {  // "" when the page has none
        const std::string html = audit_html(run.report);
        const std::size_t at = html.find("<section id=\"step-toy_norm\">");
        return at == std::string::npos ? std::string() : html.substr(at, html.find("</section>", at) - at);
    };
    const std::string sec = toy_section();
    ASSERT_FALSE(sec.empty());
    EXPECT_NE(sec.find("<th>max_rel</th>"), std::string::npos) << sec;
    EXPECT_NE(sec.find("<code>cpu:acc=f16</code>"), std::string::npos) << sec;
    EXPECT_NE(sec.find(fmt_sci(f16)), std::string::npos) << sec;
    // With an HTML section of its own, registered from its file: that section, from its typed result.
    register_step_html(norm_step().name(), norm_html);
    const std::string sec2 = toy_section();
    ASSERT_FALSE(sec2.empty());
    EXPECT_EQ(sec2.find("<th>max_rel</th>"), std::string::npos) << sec2;
    EXPECT_NE(sec2.find("<th>guarded max rel of the norm</th>"), std::string::npos) << sec2;
    EXPECT_NE(sec2.find(fmt::format("<tr><td><code>cpu:acc=f16</code></td><td class=\"num\">{}</td></tr>", fmt_sci(f16))), std::string::npos)
        << sec2;
    EXPECT_THROW(register_step_html(norm_step().name(), norm_html), Error);  // one section per step

    // Its section is its own to validate, its criterion required like any other.
    EXPECT_THROW((void)run_audit([&] {
        AuditConfig bad = cfg;
        static Protocol q;
        q = parse_protocol(toy_document({{"rows", 0}}), "toy rows 0", (kRoot / "protocols").string());
        bad.protocol = &q;
        return bad;
    }(), nodes, 0), Error);
    nlohmann::json missing = toy_document({{"rows", 8}});
    missing["tiers"]["tolerant"].erase("toy_norm.max_rel");
    try {
        (void)parse_protocol(missing, "toy without its tolerance", (kRoot / "protocols").string());
        ADD_FAILURE() << "a required criterion of a registered step was not required";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("missing tolerance 'toy_norm.max_rel'"), std::string::npos) << e.what();
    }
}

}  // namespace
