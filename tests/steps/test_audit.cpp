// The audit end to end (lib/kvasir/audit/audit.hpp) with the SHIPPED ci
// protocol on the transformers-made fixture: every verdict class produced by
// a real node, the exit code of every gate, the report valid against the
// shipped schema, a node that throws (candidate and reference), a node that
// is not deterministic, a node that could not be created, bad input refused
// before any work, progress reporting.
//
// Nodes and why each gets its verdict (measured, protocols/README.md):
//   cpu                         fit: f32, every criterion inside the sensitive tier
//   cpu:acc=f16                 unfit-sensitive: f16 accumulation is ~1e-2 per op
//   cpu:fault=perturb,size=0.1  unfit: 10% on every matmul output is a different model
//   cpu:fault=nan               error: a NaN where the reference has none
//   cpu:fault=route (all, all)  unfit: every token's k-th expert swapped for the (k+1)-th
//   flaky (test decorator)      unfit-sensitive: last-bit noise, run to run
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/report/audit_text.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_writer.hpp"
#include "kvasir/audit/step_view.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <memory>
#include <set>
#include <string>

namespace fs = std::filesystem;
using namespace kvasir;
using nlohmann::json;

namespace {

const fs::path kRoot = KVASIR_SOURCE_DIR;

// Forwards every op to a real backend, with a hook on matmul outputs and an
// optional failure: the misbehaving devices of the tests.
class Decorated final : public Backend {
public:
    Decorated(std::unique_ptr<Backend> inner, std::string name) : inner_(std::move(inner)), caps_(inner_->capabilities()) {
        caps_.node = std::move(name);
    }
    std::function<void(Tensor&, std::int64_t call)> on_matmul;
    std::int64_t throw_from_call = -1;  // matmul calls from this one on throw Error(backend_failure)

    const Capabilities& capabilities() const override { return caps_; }
    Tensor matmul(const TensorView& x, const TensorView& w) override {
        const std::int64_t call = calls_++;
        if (throw_from_call >= 0 && call >= throw_from_call)
            fail(ErrorCode::backend_failure, "{}: device lost (test fault) at matmul call {}", caps_.node, call);
        Tensor y = inner_->matmul(x, w);
        if (on_matmul) on_matmul(y, call);
        return y;
    }
    Tensor swiglu(const TensorView& g, const TensorView& u) override { return inner_->swiglu(g, u); }
    Tensor clamped_swiglu(const TensorView& g, const TensorView& u, double a, double l) override {
        return inner_->clamped_swiglu(g, u, a, l);
    }
    Tensor softmax(const TensorView& x) override { return inner_->softmax(x); }
    Tensor sigmoid(const TensorView& x) override { return inner_->sigmoid(x); }
    Tensor rmsnorm(const TensorView& x, const TensorView& w, double eps) override { return inner_->rmsnorm(x, w, eps); }
    Tensor rope(const TensorView& x, std::span<const std::int64_t> p, const RopeParams& r) override {
        return inner_->rope(x, p, r);
    }
    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* h) override {
        return inner_->causal_conv1d_silu(x, w, h);
    }
    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override { return inner_->gated_delta_rule(in); }

private:
    std::unique_ptr<Backend> inner_;
    Capabilities caps_;
    std::int64_t calls_ = 0;
};

// Flips the lowest mantissa bit of element 0 of the output of about half
// the matmul calls, chosen by a hash of the call number (not periodic, so a
// second run of the same forward pass flips a different set): f32-sized
// noise that differs from one run to the next.
std::unique_ptr<Backend> flaky_node() {
    auto d = std::make_unique<Decorated>(create_backend("cpu"), "flaky");
    d->on_matmul = [](Tensor& y, std::int64_t call) {
        std::uint64_t h = static_cast<std::uint64_t>(call) + 0x9e3779b97f4a7c15ull;  // splitmix64 finaliser
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
        if ((h & 1u) != 0 && y.numel() > 0 && y.dtype() == DType::f32) {
            std::uint32_t u;
            std::memcpy(&u, y.raw(), 4);
            u ^= 1u;
            std::memcpy(y.raw(), &u, 4);
        }
    };
    return d;
}

std::unique_ptr<Backend> dying_node(const std::string& inner, const std::string& name, std::int64_t from_call) {
    auto d = std::make_unique<Decorated>(create_backend(inner), name);
    d->throw_from_call = from_call;
    return d;
}

const Protocol& ci_protocol() {
    static const Protocol p = load_protocol((kRoot / "protocols" / "ci.json").string());
    return p;
}
const Model& fixture() {
    static const Model m = Model::open((kRoot / "fixtures" / "models" / "qwen3_moe_tiny").string());
    return m;
}

AuditRun audit(std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference = 0, AuditConfig cfg = {}) {
    cfg.protocol = &ci_protocol();
    cfg.model = &fixture();
    return run_audit(cfg, nodes, reference);
}

const NodeVerdict& verdict_of(const AuditRun& run, const std::string& node) {
    for (const NodeVerdict& v : run.report.nodes)
        if (v.node == node) return v;
    throw std::runtime_error("no node " + node);
}

// The one big audit the verdict-class tests share (≈ 5 s).
class AuditClasses : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        std::vector<std::unique_ptr<Backend>> nodes;
        for (const char* s : {"cpu-ref", "cpu", "cpu:acc=f16", "cpu:fault=perturb,fault_size=0.1", "cpu:fault=nan",
                              "cpu:fault=route,fault_call=all,fault_token=all"})
            nodes.push_back(create_backend(s));
        nodes.push_back(flaky_node());
        run_ = new AuditRun(audit(nodes));
    }
    static void TearDownTestSuite() {
        delete run_;
        run_ = nullptr;
    }
    static AuditRun* run_;
};
AuditRun* AuditClasses::run_ = nullptr;

TEST_F(AuditClasses, EveryVerdictClassFromARealNode) {
    EXPECT_EQ(verdict_of(*run_, "cpu-ref").verdict, Verdict::reference);
    EXPECT_EQ(verdict_of(*run_, "cpu").verdict, Verdict::fit);
    EXPECT_EQ(verdict_of(*run_, "cpu:acc=f16").verdict, Verdict::unfit_sensitive);
    EXPECT_EQ(verdict_of(*run_, "cpu:fault=perturb,fault_size=0.1").verdict, Verdict::unfit);
    EXPECT_EQ(verdict_of(*run_, "cpu:fault=nan").verdict, Verdict::error);
    EXPECT_EQ(verdict_of(*run_, "cpu:fault=route,fault_call=all,fault_token=all").verdict, Verdict::unfit);
    EXPECT_EQ(verdict_of(*run_, "flaky").verdict, Verdict::unfit_sensitive);
    EXPECT_EQ(run_->step_order, (std::vector<std::string>{"ops", "drift", "logits", "decide", "generate", "perplexity",
                                                          "determinism", "invariance"}));
}

TEST_F(AuditClasses, AFitNodeHasEveryCriterionMeasuredAndPassing) {
    const NodeVerdict& v = verdict_of(*run_, "cpu");
    for (const Tier tier : {Tier::sensitive, Tier::tolerant}) {
        ASSERT_FALSE(v.tier(tier).empty());
        for (const CriterionResult& c : v.tier(tier)) {
            EXPECT_TRUE(c.measured) << to_string(tier) << " " << c.criterion;
            EXPECT_TRUE(c.pass) << describe(c);
            EXPECT_TRUE(std::isfinite(c.value)) << describe(c);
        }
        // Every tolerance of the tier is judged (nothing silently skipped).
        for (const auto& [name, tol] : ci_protocol().tier(tier)) {
            const bool present = std::any_of(v.tier(tier).begin(), v.tier(tier).end(),
                                             [&](const CriterionResult& c) { return c.tolerance_from == name; });
            EXPECT_TRUE(present) << name;
        }
    }
    EXPECT_TRUE(v.errors.empty());
    EXPECT_EQ(v.capabilities["determinism_measured"]["bit_identical"], true);
}

TEST_F(AuditClasses, WhyEachFaultyNodeFails) {
    // f16 accumulation: inside the tolerant tier, outside the sensitive one on the logits.
    const NodeVerdict& f16 = verdict_of(*run_, "cpu:acc=f16");
    for (const CriterionResult& c : f16.tolerant) EXPECT_TRUE(c.pass) << describe(c);
    const auto kl = std::find_if(f16.sensitive.begin(), f16.sensitive.end(),
                                 [](const CriterionResult& c) { return c.criterion == "logits.kl_p99"; });
    ASSERT_NE(kl, f16.sensitive.end());
    EXPECT_FALSE(kl->pass);
    EXPECT_GT(kl->value, 1e-6);
    // The NaN: recorded as the step error that caused it.
    const NodeVerdict& nan = verdict_of(*run_, "cpu:fault=nan");
    ASSERT_TRUE(nan.errors.count("ops"));
    EXPECT_NE(nan.errors.at("ops").find("non-finite"), std::string::npos) << nan.errors.at("ops");
    // Routing swapped everywhere: routing agreement without authority collapses.
    const NodeVerdict& route = verdict_of(*run_, "cpu:fault=route,fault_call=all,fault_token=all");
    const auto ra = std::find_if(route.tolerant.begin(), route.tolerant.end(),
                                 [](const CriterionResult& c) { return c.criterion == "decide.routing_agreement_min"; });
    ASSERT_NE(ra, route.tolerant.end());
    EXPECT_FALSE(ra->pass);
    EXPECT_LT(ra->value, 0.5);
    // Run-to-run noise: the sensitive tier demands bit-identical replay —
    // the determinism step and the invariance step's repeated requests both
    // see it, and the tolerant tier lets it pass.
    const NodeVerdict& flaky = verdict_of(*run_, "flaky");
    const auto criterion = [&](const char* name) {
        const auto it = std::find_if(flaky.sensitive.begin(), flaky.sensitive.end(),
                                     [&](const CriterionResult& c) { return c.criterion == name; });
        EXPECT_NE(it, flaky.sensitive.end()) << name;
        return *it;
    };
    const CriterionResult det = criterion("determinism");
    EXPECT_FALSE(det.pass);
    EXPECT_GT(det.value, 0.0);
    EXPECT_LT(det.value, 1e-3);
    const CriterionResult rep = criterion("invariance.repeat_unique_max");
    EXPECT_FALSE(rep.pass);
    EXPECT_GT(rep.value, 1.0);  // identical requests, outputs with different bits
    for (const CriterionResult& c : flaky.tolerant) EXPECT_TRUE(c.pass) << describe(c);
    EXPECT_EQ(flaky.capabilities["determinism_measured"]["bit_identical"], false);
}

// Invariance: each node against itself. The f32 cpu and the f64 oracle give
// a row, a sequence and a request the same bits whatever company they keep
// (measured: their kernels' reduction order depends on neither the row
// count nor the batch); f16 accumulation too (one running sum per element).
TEST_F(AuditClasses, InvarianceOfBatchAndRepeatOnTheCpuNodes) {
    const json& inv = run_->report.steps.at("invariance");
    for (const auto& n : inv.at("nodes")) {
        const std::string node = n.at("node");
        if (node != "cpu-ref" && node != "cpu" && node != "cpu:acc=f16") continue;
        for (const auto& [op, v] : n.at("ops").items()) EXPECT_EQ(v, 0.0) << node << " " << op;
        ASSERT_EQ(n.at("batch").size(), ci_protocol().invariance.batch_sizes.size());
        for (const auto& b : n.at("batch")) EXPECT_EQ(b.at("bit_identical"), true) << node << " B=" << b.at("B");
        EXPECT_EQ(n.at("repeat").at("unique_outputs"), 1.0) << node;
        EXPECT_EQ(n.at("repeat").at("unique_token_sequences"), 1.0) << node;
    }
    // The oracle is also prefill/decode invariant: its sums run in sequence,
    // so the masked keys' exact zeros, added after the unmasked ones, change
    // nothing.
    for (const auto& n : inv.at("nodes"))
        if (n.at("node") == "cpu-ref") EXPECT_EQ(n.at("prefill_decode").at("bit_identical"), true);
}

TEST_F(AuditClasses, ExitCodePerGate) {
    const std::vector<NodeVerdict>& all = run_->report.nodes;
    EXPECT_EQ(exit_code(all, Gate::sensitive), 1);
    EXPECT_EQ(exit_code(all, Gate::tolerant), 1);  // unfit and error nodes
    EXPECT_EQ(exit_code(all, Gate::none), 0);
    auto only = [&](std::initializer_list<const char*> names) {
        std::vector<NodeVerdict> out;
        for (const char* n : names) out.push_back(verdict_of(*run_, n));
        return out;
    };
    EXPECT_EQ(exit_code(only({"cpu-ref", "cpu"}), Gate::sensitive), 0);
    EXPECT_EQ(exit_code(only({"cpu-ref", "cpu", "cpu:acc=f16"}), Gate::sensitive), 1);
    EXPECT_EQ(exit_code(only({"cpu-ref", "cpu", "cpu:acc=f16"}), Gate::tolerant), 0);
    EXPECT_EQ(exit_code(only({"cpu-ref", "cpu:fault=nan"}), Gate::tolerant), 1);
    EXPECT_EQ(exit_code(only({"cpu-ref"}), Gate::none), 1);  // nothing compared is never a pass
}

TEST_F(AuditClasses, ReportValidAgainstTheShippedSchemaWithEverySection) {
    const json doc = json::parse(audit_report_json(run_->report).dump());
    const json schema = json::parse(read_text_file((kRoot / "protocols" / "report.schema.json").string()));
    const auto violations = schema_violations(schema, doc);
    for (const auto& v : violations) ADD_FAILURE() << v.path << ": " << v.message;
    EXPECT_EQ(doc["schema"], "kvasir-equiv/audit/1");
    EXPECT_EQ(doc["protocol"]["content_hash"], ci_protocol().content_hash);
    EXPECT_EQ(doc["model"]["fingerprint"], fixture().fingerprint());
    EXPECT_EQ(doc["exit_code"], 1);
    EXPECT_EQ(doc["nodes"].size(), 7u);
    ASSERT_FALSE(doc["pairs"].empty());
    EXPECT_EQ(doc["pairs"][0]["name"], "moe");  // the headline matrix
    EXPECT_EQ(doc["pairs"][0]["nodes"].size(), 7u);
    EXPECT_EQ(doc["drift"].size(), 6u);  // every candidate that ran the drift step
    for (const char* s : {"ops", "drift", "logits", "decide", "generate", "perplexity", "determinism", "invariance"})
        EXPECT_TRUE(doc["steps"].contains(s)) << s;
    // A terminal rendering names every node with its verdict.
    const std::string text = render_audit_text(run_->report, Style{});
    for (const NodeVerdict& v : run_->report.nodes) EXPECT_NE(text.find(v.node), std::string::npos) << v.node;
    EXPECT_NE(text.find("unfit-sensitive"), std::string::npos);
    EXPECT_NE(text.find("→ exit 1 (gate sensitive)"), std::string::npos);
}

TEST(Audit, ACandidateThatThrowsIsAnErrorAndTheOthersAreStillJudged) {
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu-ref"));
    nodes.push_back(dying_node("cpu", "dies", 3));
    nodes.push_back(create_backend("cpu"));
    const AuditRun run = audit(nodes);
    const NodeVerdict& dies = verdict_of(run, "dies");
    EXPECT_EQ(dies.verdict, Verdict::error);
    // It died in step 1 and in every later step that calls matmul.
    for (const char* step : {"ops", "drift", "logits", "decide", "generate", "perplexity", "determinism"}) {
        ASSERT_TRUE(dies.errors.count(step)) << step;
        EXPECT_NE(dies.errors.at(step).find("device lost"), std::string::npos) << dies.errors.at(step);
    }
    EXPECT_EQ(verdict_of(run, "cpu").verdict, Verdict::fit);
    EXPECT_EQ(exit_code(run.report.nodes, Gate::sensitive), 1);
    EXPECT_EQ(exit_code(run.report.nodes, Gate::none), 0);
}

TEST(Audit, AReferenceThatThrowsLeavesNothingComparedAndFails) {
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(dying_node("cpu-ref", "dying-ref", 0));
    nodes.push_back(create_backend("cpu"));
    const AuditRun run = audit(nodes);
    EXPECT_EQ(verdict_of(run, "dying-ref").verdict, Verdict::reference);
    const NodeVerdict& cpu = verdict_of(run, "cpu");
    EXPECT_EQ(cpu.verdict, Verdict::error);
    ASSERT_TRUE(cpu.errors.count("logits"));
    EXPECT_NE(cpu.errors.at("logits").find("not compared: the reference failed"), std::string::npos);
    EXPECT_EQ(exit_code(run.report.nodes, Gate::sensitive), 1);
    EXPECT_EQ(exit_code(run.report.nodes, Gate::tolerant), 1);
}

TEST(Audit, ANodeThatCouldNotBeCreatedIsAnError) {
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu-ref"));
    nodes.push_back(create_backend("cpu"));
    AuditConfig cfg;
    NodeInput failed;
    failed.node = "opencl:7";
    failed.capabilities["node"] = "opencl:7";
    failed.errors["create"] = "clCreateContext: CL_OUT_OF_RESOURCES";
    cfg.failed_nodes.push_back(failed);
    const AuditRun run = audit(nodes, 0, cfg);
    ASSERT_EQ(run.report.nodes.size(), 3u);
    EXPECT_EQ(verdict_of(run, "opencl:7").verdict, Verdict::error);
    EXPECT_EQ(verdict_of(run, "cpu").verdict, Verdict::fit);
    EXPECT_EQ(exit_code(run.report.nodes, Gate::sensitive), 1);
}

TEST(Audit, BadInputIsRefusedBeforeAnyStepRuns) {
    // The ci protocol with a token stream whose pinned hash does not match.
    json doc = json::parse(read_text_file((kRoot / "protocols" / "ci.json").string()));
    doc["steps"]["logits"]["tokens"]["sha256"] = std::string(64, '0');
    const Protocol p = parse_protocol(doc, "tampered.json", (kRoot / "protocols").string());
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu-ref"));
    nodes.push_back(create_backend("cpu"));
    int started = 0;
    AuditConfig cfg;
    cfg.protocol = &p;
    cfg.model = &fixture();
    cfg.progress = [&](const AuditProgress&) { ++started; };
    try {
        (void)run_audit(cfg, nodes, 0);
        ADD_FAILURE() << "a tampered token stream was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("sha256"), std::string::npos) << e.what();
    }
    EXPECT_EQ(started, 0);  // refused before any step began
}

TEST(Audit, ProgressNamesEveryStepInOrderAndEveryNodeInsideEachStep) {
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu-ref"));
    nodes.push_back(create_backend("cpu"));
    std::vector<std::string> steps;
    std::map<std::string, std::set<std::string>> nodes_seen;
    AuditConfig cfg;
    cfg.progress = [&](const AuditProgress& p) {
        EXPECT_EQ(p.steps, 8);
        ASSERT_GE(p.step_index, 1);
        ASSERT_LE(p.step_index, 8);
        if (p.node.empty()) {
            EXPECT_EQ(p.node_index, 0);
            steps.push_back(p.step);  // a step starts
            EXPECT_EQ(static_cast<int>(steps.size()), p.step_index);
            return;
        }
        ASSERT_FALSE(steps.empty());
        EXPECT_EQ(p.step, steps.back());  // node lines belong to the running step
        EXPECT_EQ(p.nodes, 2);
        EXPECT_EQ(p.node, p.node_index == 1 ? "cpu-ref" : "cpu");
        nodes_seen[p.step].insert(p.node);
    };
    const AuditRun run = audit(nodes, 0, cfg);
    const std::vector<std::string> order{"ops",        "drift",       "logits",    "decide",
                                         "generate",   "perplexity",  "determinism", "invariance"};
    EXPECT_EQ(steps, order);
    for (const std::string& s : order) EXPECT_EQ(nodes_seen[s], (std::set<std::string>{"cpu-ref", "cpu"})) << s;

    // The timings: one row per step, the seconds inside the nodes never more
    // than the step's wall time, every node computed in every step, and the
    // load phase read the fixture's weights (all of them: it runs forwards).
    const RunTimings& t = run.timings;
    EXPECT_EQ(t.nodes, (std::vector<std::string>{"cpu-ref", "cpu"}));
    ASSERT_EQ(t.steps.size(), order.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
        EXPECT_EQ(t.steps[i].step, order[i]);
        ASSERT_EQ(t.steps[i].node_seconds.size(), 2u);
        double inside = 0;
        for (double v : t.steps[i].node_seconds) {
            EXPECT_GT(v, 0.0) << order[i];
            inside += v;
        }
        EXPECT_LE(inside, t.steps[i].wall) << order[i];
    }
    ASSERT_TRUE(t.loaded) << t.load_note;
    std::uint64_t weights = 0;
    for (std::int64_t l = 0; l < fixture().config().num_layers; ++l) weights += fixture().layer_bytes(l);
    EXPECT_GT(t.load_bytes, weights);  // the layers plus embedding, final norm and lm_head
    EXPECT_LE(t.load_bytes, std::filesystem::file_size(kRoot / "fixtures/models/qwen3_moe_tiny/model.safetensors"));
}

TEST(Audit, TheSeedOverrideChangesStepOneInputsAndIsRecorded) {
    std::vector<std::unique_ptr<Backend>> a, b;
    for (auto* v : {&a, &b}) {
        v->push_back(create_backend("cpu-ref"));
        v->push_back(create_backend("cpu"));
    }
    AuditConfig cfg;
    cfg.seed = 7;
    const AuditRun r7 = audit(a, 0, cfg);
    const AuditRun rp = audit(b);
    EXPECT_EQ(r7.report.seed, 7u);
    EXPECT_EQ(rp.report.seed, ci_protocol().seed);
    // Different seeded inputs → different step-1 figures; same protocol hash.
    EXPECT_NE(r7.report.pairs[0].max_abs[0][1], rp.report.pairs[0].max_abs[0][1]);
    EXPECT_EQ(r7.report.protocol.content_hash, rp.report.protocol.content_hash);
}

}  // namespace

// --- the step objects and the one failure policy (issue: a step is one object) ---

TEST(AuditSteps, OneObjectPerProtocolStepInProtocolOrderWithTheCatalogueCriteria) {
    std::vector<std::string> names;
    for (const Step* s : audit_steps()) names.push_back(s->name());
    EXPECT_EQ(names, protocol_step_names());
    std::set<std::string> claimed;
    for (const Step* s : audit_steps()) {
        EXPECT_FALSE(s->criteria().empty()) << s->name();
        for (const CriterionInfo& c : s->criteria()) {
            EXPECT_EQ(c.step, s->name());
            claimed.insert(c.name);
        }
        EXPECT_EQ(&step_named(s->name()), s);
    }
    for (const CriterionInfo& c : criterion_catalog()) EXPECT_TRUE(claimed.count(c.name)) << c.name << " has no step";
    EXPECT_THROW(step_named("no-such-step"), Error);
}

// A NodeOutputs whose tensors are a bug (std::logic_error), for the policy.
class BuggyOutputs final : public NodeOutputs {
public:
    explicit BuggyOutputs(std::string node) : node_(std::move(node)) {}
    const std::string& node() const override { return node_; }
    const std::string& origin() const override { return node_; }
    bool has(const std::string&) const override { return true; }
    TensorView view(const std::string&) const override { throw std::logic_error("a bug reading tensors"); }
    std::optional<std::string> note(const std::string&) const override { return std::nullopt; }

private:
    std::string node_;
};

TEST(AuditSteps, ABugInsideCompareIsNotANodeErrorItPropagates) {
    // compare_step is the one loop compare and audit share: a bug of this
    // tool (std::logic_error, Error(internal)) must leave it, not become a
    // node's "error" verdict.
    BuggyOutputs ref("cpu-ref"), cand("cpu");
    std::vector<detail::NodeRecord> recs{{&ref, {"logits"}, {}}, {&cand, {"logits"}, {}}};
    std::vector<NodeInput> inputs(2);
    inputs[0].node = "cpu-ref";
    inputs[1].node = "cpu";
    Ledger led(inputs, 0);
    AuditReport report;
    EXPECT_THROW(detail::compare_step(ci_protocol(), "logits", recs, 0, led, report), std::logic_error);
}

TEST(AuditSteps, AKvasirInternalErrorInsideAStepEndsTheAuditNotTheNode) {
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu-ref"));
    nodes.push_back(create_backend("cpu:fault=internal,fault_call=3"));
    try {
        (void)audit(nodes);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::internal);
        EXPECT_NE(std::string(e.what()).find("fault=internal"), std::string::npos) << e.what();
    }
}

TEST(AuditSteps, ContrastNodesAreShownButNotGated) {
    std::vector<std::unique_ptr<Backend>> nodes;
    for (const char* s : {"cpu-ref", "cpu", "cpu:acc=f16"}) nodes.push_back(create_backend(s));
    AuditConfig cfg;
    cfg.contrast_nodes = {"cpu:acc=f16"};
    const AuditRun run = audit(nodes, 0, cfg);
    const NodeVerdict& f16 = verdict_of(run, "cpu:acc=f16");
    EXPECT_TRUE(f16.contrast);
    EXPECT_EQ(f16.verdict, Verdict::unfit_sensitive);  // still judged and shown
    EXPECT_FALSE(verdict_of(run, "cpu").contrast);
    EXPECT_EQ(exit_code(run.report.nodes, Gate::sensitive), 0);
    EXPECT_EQ(audit_report_json(run.report)["nodes"][2]["contrast"], true);
    // Gated when not a contrast: the same node fails the sensitive gate.
    std::vector<NodeVerdict> gated = run.report.nodes;
    for (NodeVerdict& v : gated) v.contrast = false;
    EXPECT_EQ(exit_code(gated, Gate::sensitive), 1);
    // Only contrast nodes besides the reference: nothing gated, never a pass.
    std::vector<NodeVerdict> only{run.report.nodes[0], run.report.nodes[2]};
    EXPECT_EQ(exit_code(only, Gate::sensitive), 1);
    EXPECT_NE(render_audit_text(run.report, Style{}).find("shown as a contrast, not gated"), std::string::npos);
}

// The fixture with one weight made NaN: layer 1, expert 2, down_proj.
struct NanModel {
    fs::path dir;
    NanModel() {
        dir = fs::temp_directory_path() / fmt::format("kvasir_nan_model_{}", ::getpid());
        fs::remove_all(dir);
        fs::create_directories(dir);
        const fs::path src = kRoot / "fixtures" / "models" / "qwen3_moe_tiny";
        fs::copy_file(src / "config.json", dir / "config.json");
        const SafetensorsFile f = SafetensorsFile::open((src / "model.safetensors").string());
        std::map<std::string, Tensor> owned;
        std::map<std::string, TensorView> views;
        for (const std::string& name : f.names()) {
            Tensor t = Tensor::convert(f.view(name), f.view(name).dtype);
            if (name == "model.layers.1.mlp.experts.2.down_proj.weight") t.set(17, std::nan(""));
            views.emplace(name, t.view());
            owned.emplace(name, std::move(t));
        }
        write_safetensors((dir / "model.safetensors").string(), views, {});
    }
    ~NanModel() { fs::remove_all(dir); }
};

TEST(AuditSteps, ANonFiniteModelIsBadInputNamingTheLayerAndTensorNotEveryCandidatesFault) {
    const NanModel nan;
    const Model m = Model::open(nan.dir.string());
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu-ref"));
    nodes.push_back(create_backend("cpu"));
    AuditConfig cfg;
    cfg.protocol = &ci_protocol();
    cfg.model = &m;
    try {
        (void)run_audit(cfg, nodes, 0);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("layer 1 expert 2 down_proj element 17 is nan"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("the reference cpu-ref"), std::string::npos) << e.what();
    }
    EXPECT_EQ(detail::first_non_finite_weight(fixture()), std::nullopt);  // the clean fixture passes
}

TEST(AuditSteps, AReferenceThatComputesNaNFromFiniteWeightsIsBadInputNamingItsTensor) {
    std::vector<std::unique_ptr<Backend>> nodes;
    nodes.push_back(create_backend("cpu:fault=nan"));
    nodes.push_back(create_backend("cpu"));
    try {
        (void)audit(nodes, 0);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("non-finite value from finite inputs in step ops: ops.matmul.out["), std::string::npos)
            << e.what();
    }
}

// Issue #18: every fault variant caught, or said why not; bound violations
// zero for every correct node. Step 1 only (the ci protocol's op shapes,
// K = 512), over three seeds.
namespace {

// A protocol document reduced to the steps `kept` names and their tolerances.
nlohmann::json reduced_to(nlohmann::json doc, const std::set<std::string>& kept) {
    for (auto it = doc["steps"].begin(); it != doc["steps"].end();) it = kept.count(it.key()) ? std::next(it) : doc["steps"].erase(it);
    for (const char* tier : {"sensitive", "tolerant"})
        for (auto it = doc["tiers"][tier].begin(); it != doc["tiers"][tier].end();) {
            const auto info = find_criterion(it.key());
            it = info && kept.count(info->step) ? std::next(it) : doc["tiers"][tier].erase(it);
        }
    return doc;
}

// The ci protocol with one step and its tolerances only.
Protocol ci_protocol_with_only(const std::string& step) {
    return parse_protocol(reduced_to(ci_protocol().document, {step}), "ci.json (" + step + " only)", (kRoot / "protocols").string());
}
Protocol ops_only_protocol() { return ci_protocol_with_only("ops"); }

// opencl:0 joins a node list where this machine has an OpenCL device.
void add_opencl_if_present(std::vector<std::string>& names) {
    const auto backends = list_backends();
    if (std::any_of(backends.begin(), backends.end(), [](const BackendStatus& b) { return b.name == "opencl" && b.available; }))
        names.push_back("opencl:0");
}

// One in-process audit of the fixture under protocol p on the nodes named.
AuditRun audit_fixture_on(const Protocol& p, std::initializer_list<const char*> names) {
    std::vector<std::unique_ptr<Backend>> nodes;
    for (const char* s : names) nodes.push_back(create_backend(s));
    AuditConfig cfg;
    cfg.protocol = &p;
    cfg.model = &fixture();
    return run_audit(cfg, nodes, 0);
}

const CriterionResult* criterion_of(const NodeVerdict& v, Tier t, const std::string& name) {
    for (const CriterionResult& c : v.tier(t))
        if (c.criterion == name) return &c;
    return nullptr;
}

}  // namespace

TEST(FaultVariants, BoundViolationsAreZeroForCorrectNodesAndCatchTheBitflip) {
    const Protocol p = ops_only_protocol();
    for (const std::uint64_t seed : {1u, 2u, 3u}) {
        std::vector<std::unique_ptr<Backend>> nodes;
        std::vector<std::string> names{"cpu-ref", "cpu", "cpu:storage=bf16", "cpu:storage=f16", "cpu:threads=1",
                                       "cpu:fault=bitflip", "cpu:fault=bitflip,fault_index=77", "cpu:acc=f16",
                                       "cpu:fault=perturb,fault_size=1e-4,fault_op=softmax",
                                       "cpu:fault=perturb,fault_size=1e-4,fault_op=rmsnorm",
                                       "cpu:fault=perturb,fault_size=1e-4,fault_op=causal_conv1d",
                                       "cpu:fault=perturb,fault_size=1e-4,fault_op=causal_attention",
                                       "cpu:fault=perturb,fault_size=1e-4,fault_op=gated_delta",
                                       "cpu:fault=perturb,fault_size=1e-2,fault_op=moe_block"};
        add_opencl_if_present(names);
        for (const std::string& s : names) nodes.push_back(create_backend(s));
        AuditConfig cfg;
        cfg.protocol = &p;
        cfg.model = &fixture();
        cfg.seed = seed;
        const AuditRun run = run_audit(cfg, nodes, 0);
        for (const char* ok : {"cpu", "cpu:storage=bf16", "cpu:storage=f16", "cpu:threads=1", "opencl:0"}) {
            if (std::find(names.begin(), names.end(), ok) == names.end()) continue;
            const NodeVerdict& v = verdict_of(run, ok);
            // The worst-case bound in both tiers, the probabilistic one in the sensitive tier.
            for (const auto& [tier, c] : {std::pair{Tier::tolerant, "bound.violations_max"}, std::pair{Tier::sensitive, "bound.violations_max"},
                                          std::pair{Tier::sensitive, "bound.probable_violations_max"}}) {
                const CriterionResult* r = criterion_of(v, tier, c);
                ASSERT_NE(r, nullptr) << ok << " " << c;
                EXPECT_TRUE(r->measured) << ok << " " << c;
                EXPECT_EQ(r->value, 0.0) << ok << " seed " << seed << ": " << describe(*r);
            }
            EXPECT_EQ(v.verdict, std::string(ok).find("storage") == std::string::npos ? Verdict::fit : v.verdict) << ok;
        }
        // A flipped top mantissa bit of one weight: inside the worst-case γ_K bound (the bound is
        // ~√K loose), outside the probabilistic one — caught for the authority ranks.
        for (const char* flip : {"cpu:fault=bitflip", "cpu:fault=bitflip,fault_index=77"}) {
            const NodeVerdict& v = verdict_of(run, flip);
            const CriterionResult* prob = criterion_of(v, Tier::sensitive, "bound.probable_violations_max");
            ASSERT_NE(prob, nullptr);
            EXPECT_GT(prob->value, 0.0) << flip << " seed " << seed;
            // At K = 512 the flip often leaves the worst-case bound too: then unfit in every tier.
            EXPECT_TRUE(v.verdict == Verdict::unfit_sensitive || v.verdict == Verdict::unfit) << flip << " seed " << seed;
            EXPECT_GE(v.capabilities["faults_fired"]["ops"].get<int>(), 1) << v.capabilities.dump();
        }
        // Every bounded op is in the report, each correct node at 0 violations of it (the conv's
        // own bound included: f16 accumulation has one at K = 4 taps and is measured there).
        std::set<std::string> bounded;
        for (const auto& o : run.report.steps.at("ops").at("bounds")) {
            bounded.insert(o.at("op").get<std::string>());
            for (const auto& e : o.at("results")) {
                const std::string node = e.at("node").get<std::string>();
                if (node.find("fault") != std::string::npos) continue;
                if (e.contains("not_measurable")) {
                    EXPECT_TRUE(node == "cpu:acc=f16" && o.at("op") != "causal_conv1d") << node << " " << o.at("op") << " " << e.dump();
                    continue;
                }
                EXPECT_EQ(e.at("worst_case").at("violations").get<int>(), 0) << node << " " << o.at("op");
                EXPECT_EQ(e.at("probabilistic").at("violations").get<int>(), 0) << node << " " << o.at("op");
                EXPECT_LT(e.at("worst_case").at("worst_fraction_of_bound").get<double>(), 1.0) << node << " " << o.at("op");
            }
        }
        EXPECT_EQ(bounded, (std::set<std::string>{"matmul", "softmax", "rmsnorm", "causal_conv1d", "moe", "gated_delta", "attention",
                                                  "attention_sinks"}));
        // A broken softmax, rmsnorm, conv, attention or delta-rule kernel (every element off by 1e-4 relative, 1680
        // units of f32 rounding) leaves their bounds (γ_K + ~26u at K = 1024 and 512; the conv's ~1.1·γ_4·Σ|wx| +
        // 18u|y|; attention's γ_64 of the scores through softmax and P·V, ~4e-5 of |o|; the delta rule's column errors
        // carried through the non-expansive recurrence, ~3e-5 of |o|): unfit in every tier. The MoE block's bound
        // compounds three worst-case stages (~2e-3 of |y| here: a 1e-4 error sits at 0.02 of it), so its broken kernel is
        // off by 1e-2.
        for (const auto& [op, size] : {std::pair{"softmax", "1e-4"}, std::pair{"rmsnorm", "1e-4"}, std::pair{"causal_conv1d", "1e-4"},
                                       std::pair{"causal_attention", "1e-4"}, std::pair{"gated_delta", "1e-4"},
                                       std::pair{"moe_block", "1e-2"}}) {
            const NodeVerdict& v = verdict_of(run, fmt::format("cpu:fault=perturb,fault_op={},fault_size={}", op, size));
            const CriterionResult* r = criterion_of(v, Tier::tolerant, "bound.violations_max");
            ASSERT_NE(r, nullptr) << op;
            EXPECT_GT(r->value, 0.0) << op << " seed " << seed << ": " << describe(*r);
            EXPECT_EQ(v.verdict, Verdict::unfit) << op << " seed " << seed;
        }
        // An f16 running sum of K = 512 terms has no a-priori bound (K·u = 0.25 < 1 has one: it is judged).
        const NodeVerdict& f16 = verdict_of(run, "cpu:acc=f16");
        const CriterionResult* b = criterion_of(f16, Tier::tolerant, "bound.violations_max");
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(b->value, 0.0) << describe(*b);
    }
}

// A corrupted expert weight that every statistical criterion passes: at the
// protocol's default seed, one weight of the first routed expert's down
// projection (matmul call 3 of step 1) with its top mantissa bit flipped (the
// default bitflip: up to ±50 %) or its second exponent bit (× 4 or / 4). The
// MoE block's error moves far less than its cosine and max_rel tolerances
// notice, but output elements leave the probabilistic a-priori bound of the
// block (audit/step_ops.cpp moe_bounds: the reductions' roundings as one
// martingale): unfit for the sensitive ranks on that proof alone. A flip of
// bit 25 (× 16) leaves the worst-case bound too: unfit in both tiers.
TEST(FaultVariants, AFlippedExpertWeightIsCaughtByTheMoeBoundWhereTheStatisticsPassIt) {
    const Protocol p = ops_only_protocol();
    const AuditRun run = audit_fixture_on(p, {"cpu-ref", "cpu", "cpu:fault=bitflip,fault_call=3", "cpu:fault=bitflip,fault_call=3,fault_bit=24",
                                              "cpu:fault=bitflip,fault_call=3,fault_bit=25"});
    EXPECT_EQ(verdict_of(run, "cpu").verdict, Verdict::fit);
    const auto moe_bound = [&](const std::string& node) {
        for (const auto& o : run.report.steps.at("ops").at("bounds"))
            if (o.at("op") == "moe")
                for (const auto& e : o.at("results"))
                    if (e.at("node") == node) return e;
        throw std::runtime_error("no moe bound for " + node);
    };
    EXPECT_EQ(moe_bound("cpu").at("probabilistic").at("violations").get<int>(), 0);
    for (const std::string flip : {"cpu:fault=bitflip,fault_call=3", "cpu:fault=bitflip,fault_bit=24,fault_call=3"}) {
        const NodeVerdict& v = verdict_of(run, flip);
        EXPECT_EQ(v.verdict, Verdict::unfit_sensitive) << flip;
        EXPECT_GE(v.capabilities["faults_fired"]["ops"].get<int>(), 1) << v.capabilities.dump();  // the block and its shard check read it
        for (Tier t : {Tier::sensitive, Tier::tolerant})
            for (const CriterionResult& c : v.tier(t))
                if (c.criterion != "bound.probable_violations_max") EXPECT_TRUE(c.pass) << flip << ": " << describe(c);
        EXPECT_GT(moe_bound(flip).at("probabilistic").at("violations").get<int>(), 0) << moe_bound(flip).dump();
        EXPECT_EQ(moe_bound(flip).at("worst_case").at("violations").get<int>(), 0) << moe_bound(flip).dump();
    }
    // The correct node sits far inside the probabilistic bound (measured 2.5e-3 of it).
    EXPECT_LT(moe_bound("cpu").at("probabilistic").at("worst_fraction_of_bound").get<double>(), 0.05);
    const std::string x16 = "cpu:fault=bitflip,fault_bit=25,fault_call=3";
    EXPECT_EQ(verdict_of(run, x16).verdict, Verdict::unfit);
    EXPECT_GT(moe_bound(x16).at("worst_case").at("violations").get<int>(), 0) << moe_bound(x16).dump();
}

// The bounds with the models' own weights (step 1's "weights": "model"):
// the real-statistics matmul input and expert weights, the layer's own
// post-attention norm — Qwen3.5's scale formed as 1 + w by the node — on a
// MoE and a dense first layer, two seeds: every correct node and variant 0
// violations; a perturbed rmsnorm (every element 1e-4 off) caught.
TEST(FaultVariants, BoundViolationsAreZeroWithTheModelsOwnWeights) {
    nlohmann::json doc = ops_only_protocol().document;
    doc["steps"]["ops"]["weights"] = "model";
    doc["steps"]["ops"]["layer"] = 0;
    for (const char* name : {"qwen3_5_moe_tiny", "llama_tiny"}) {
        const Model m = Model::open((kRoot / "fixtures" / "models" / name).string());
        nlohmann::json d = doc;
        if (!m.config().is_moe(0)) {
            auto& ops = d["steps"]["ops"]["ops"];
            for (auto it = ops.begin(); it != ops.end();)
                it = (*it == "router_softmax" || *it == "router_sigmoid" || *it == "moe") ? ops.erase(it) : std::next(it);
        }
        const Protocol p = parse_protocol(d, std::string("ci.json (ops, model weights) on ") + name, (kRoot / "protocols").string());
        for (const std::uint64_t seed : {1u, 2u}) {
            std::vector<std::unique_ptr<Backend>> nodes;
            std::vector<std::string> names{"cpu-ref", "cpu", "cpu:storage=bf16", "cpu:storage=f16", "cpu:acc=f16",
                                           "cpu:fault=perturb,fault_size=1e-4,fault_op=rmsnorm"};
            add_opencl_if_present(names);
            for (const std::string& s : names) nodes.push_back(create_backend(s));
            AuditConfig cfg;
            cfg.protocol = &p;
            cfg.model = &m;
            cfg.seed = seed;
            const AuditRun run = run_audit(cfg, nodes, 0);
            for (const char* ok : {"cpu", "cpu:storage=bf16", "cpu:storage=f16", "cpu:acc=f16", "opencl:0"}) {
                if (std::find(names.begin(), names.end(), ok) == names.end()) continue;
                for (const char* c : {"bound.violations_max", "bound.probable_violations_max"}) {
                    const CriterionResult* r = criterion_of(verdict_of(run, ok), Tier::sensitive, c);
                    ASSERT_NE(r, nullptr) << ok << " " << c;
                    EXPECT_TRUE(r->measured) << name << " " << ok << " " << c;
                    EXPECT_EQ(r->value, 0.0) << name << " " << ok << " seed " << seed << ": " << describe(*r);
                }
            }
            const CriterionResult* r =
                criterion_of(verdict_of(run, "cpu:fault=perturb,fault_op=rmsnorm,fault_size=1e-4"), Tier::tolerant, "bound.violations_max");
            ASSERT_NE(r, nullptr);
            EXPECT_GT(r->value, 0.0) << name << " seed " << seed;
        }
    }
}

TEST(FaultVariants, TheRouteFaultFailsRouterAuthoritiesAndAFaultThatNeverFiredIsNoFit) {
    const Protocol p = ops_only_protocol();
    const AuditRun run = audit_fixture_on(p, {"cpu-ref", "cpu", "cpu:fault=route", "cpu:fault=nan,fault_call=100000"});
    EXPECT_EQ(verdict_of(run, "cpu").verdict, Verdict::fit);
    const CriterionResult* cpu_flips = criterion_of(verdict_of(run, "cpu"), Tier::sensitive, "router.flips_max");
    ASSERT_NE(cpu_flips, nullptr);
    EXPECT_EQ(cpu_flips->value, 0.0);
    // One token's k-th expert swapped in the first route() call (step 1's router op): one flip.
    const NodeVerdict& route = verdict_of(run, "cpu:fault=route");
    EXPECT_EQ(route.verdict, Verdict::unfit_sensitive);
    ASSERT_TRUE(route.worst.has_value());
    EXPECT_EQ(route.worst->criterion, "router.flips_max");
    EXPECT_EQ(route.worst->value, 1.0);
    // fault_call beyond the run: never fired, so it is not a clean fit but an error that says so.
    const NodeVerdict& never = verdict_of(run, "cpu:fault=nan,fault_call=100000");
    EXPECT_EQ(never.verdict, Verdict::error);
    ASSERT_TRUE(never.errors.count("fault"));
    EXPECT_NE(never.errors.at("fault").find("never fired"), std::string::npos) << never.errors.at("fault");
    EXPECT_EQ(never.capabilities["faults_fired"]["ops"], 0);
}

// Issue #18 item 6: a failing drift names the first layer and block whose
// local (re-anchored) delta crosses its yardstick — a fault in the MLP's
// activation is found in the MLP / experts block, one in attention's softmax
// in the attention block, both at layer 0 where they first act.
TEST(FaultVariants, DriftNamesTheLayerAndBlockOfTheFault) {
    const Protocol p = ci_protocol_with_only("drift");
    const AuditRun run = audit_fixture_on(p, {"cpu-ref", "cpu", "cpu:fault=perturb,fault_size=1e-2,fault_op=swiglu",
                                              "cpu:fault=perturb,fault_size=1e-2,fault_op=softmax"});
    EXPECT_EQ(verdict_of(run, "cpu").verdict, Verdict::fit);
    EXPECT_TRUE(verdict_of(run, "cpu").localisation.empty());  // nothing failed: nothing to locate
    const NodeVerdict& mlp = verdict_of(run, "cpu:fault=perturb,fault_op=swiglu,fault_size=1e-2");
    const NodeVerdict& att = verdict_of(run, "cpu:fault=perturb,fault_op=softmax,fault_size=1e-2");
    for (const NodeVerdict* v : {&mlp, &att}) {
        EXPECT_NE(v->verdict, Verdict::fit) << v->node;
        ASSERT_EQ(v->localisation.count("drift"), 1u) << v->node;
        EXPECT_NE(v->localisation.at("drift").find("at layer 0,"), std::string::npos) << v->localisation.at("drift");
    }
    EXPECT_NE(mlp.localisation.at("drift").find("MLP / experts block"), std::string::npos) << mlp.localisation.at("drift");
    EXPECT_NE(att.localisation.at("drift").find("attention block"), std::string::npos) << att.localisation.at("drift");
    // The per-layer block deltas are in the step's JSON for every node.
    const json& res = run.report.steps.at("drift").at("results");
    ASSERT_EQ(res.size(), 3u);
    for (const json& e : res) {
        ASSERT_FALSE(e["layers"].empty());
        EXPECT_TRUE(e["layers"][0].contains("attention_block_rel")) << e.dump();
        EXPECT_TRUE(e["layers"][0].contains("mlp_block_rel")) << e.dump();
    }
}

// Issue #41: a step command is a view of the audit (step_view.hpp). On the
// tokens of ci.json's stream, `kvasir-equiv <step>` (view_protocol + run_view)
// and `audit --steps <step>` give the same step section byte for byte, the
// same drift series and the same judged figures — for a node that barely
// moves (cpu) and one that drifts (f16 accumulation).
TEST(StepView, EachViewGivesTheAuditStepsFigures) {
    for (const std::string step : {"drift", "logits", "decide"}) {
        SCOPED_TRACE(step);
        const Protocol only = ci_protocol_with_only(step);
        const AuditRun audited = audit_fixture_on(only, {"cpu-ref", "cpu", "cpu:acc=f16"});
        const TokenStream& stream = step == "drift" ? only.drift.tokens : step == "logits" ? only.logits.tokens : only.decide.tokens;
        const TokenSequence tokens{read_token_stream(stream, fixture().path()), "ci.json's stream"};
        const Protocol view = view_protocol(ci_protocol(), StepView{step, false, {}, {}}, tokens);
        EXPECT_EQ(view.id, step);
        EXPECT_NE(view.content_hash, ci_protocol().content_hash);  // a view never claims the base protocol's hash
        const auto names = [](const Tolerances& t) {
            std::vector<std::string> out;
            for (const auto& [name, tol] : t) out.push_back(name + "=" + std::to_string(tol.value));
            return out;
        };
        EXPECT_EQ(names(view.sensitive), names(tolerances_of_steps(ci_protocol().sensitive, {step})));
        std::vector<std::unique_ptr<Backend>> nodes;
        for (const char* s : {"cpu-ref", "cpu", "cpu:acc=f16"}) nodes.push_back(create_backend(s));
        const AuditRun viewed = run_view(view, fixture(), tokens, nodes, 0, Gate::sensitive, only.seed);
        EXPECT_EQ(viewed.step_order, std::vector<std::string>{step});
        EXPECT_EQ(viewed.report.steps.at(step).dump(), audited.report.steps.at(step).dump());
        ASSERT_EQ(viewed.report.drift.size(), audited.report.drift.size());
        for (std::size_t i = 0; i < viewed.report.drift.size(); ++i) {
            EXPECT_EQ(viewed.report.drift[i].rel, audited.report.drift[i].rel);
            EXPECT_EQ(viewed.report.drift[i].alpha, audited.report.drift[i].alpha);
        }
        ASSERT_EQ(viewed.report.nodes.size(), 3u);
        for (std::size_t i = 0; i < 3; ++i) {
            const NodeVerdict &v = viewed.report.nodes[i], &a = audited.report.nodes[i];
            EXPECT_EQ(v.verdict, a.verdict) << v.node;
            ASSERT_EQ(v.sensitive.size(), a.sensitive.size()) << v.node;
            for (std::size_t c = 0; c < v.sensitive.size(); ++c) {
                EXPECT_EQ(v.sensitive[c].criterion, a.sensitive[c].criterion);
                EXPECT_EQ(nlohmann::json(v.sensitive[c].value).dump(), nlohmann::json(a.sensitive[c].value).dump());
            }
        }
        if (step == "drift") {  // both candidates move, and f16 accumulation crosses the threshold where cpu does not
            const auto& res = viewed.report.steps.at("drift").at("results");
            EXPECT_EQ(res[0]["first_over"], -1);
            EXPECT_GE(res[1]["first_over"].get<int>(), 0);
            // `drift --threshold 0.5` (the protocol's drift.threshold): nothing crosses it.
            const Protocol loose = view_protocol(ci_protocol(), StepView{step, false, {{"threshold", 0.5}}, [](Protocol& v) { v.drift.threshold = 0.5; }}, tokens);
            const AuditRun lr = run_view(loose, fixture(), tokens, nodes, 0, Gate::sensitive, only.seed);
            EXPECT_EQ(lr.report.steps.at("drift")["threshold"], 0.5);
            EXPECT_EQ(lr.report.steps.at("drift")["results"][1]["first_over"], -1);
            EXPECT_NE(loose.content_hash, view.content_hash);
        }
    }
}

// The task step inside an audit: trained.json's task (and generate) alone, on
// a 100-item slice of its cloze file (pinned by its own sha256). The f32 node
// fits the task, bf16 storage fails the sensitive tier on the choices'
// log-likelihoods (it chooses the same answers), the report carries the
// scores, and generate's continuations decoded by the model's tokenizer.
TEST(TaskStep, JudgesTheTaskScoreAndItsLogLikelihoods) {
    const fs::path tmp = fs::temp_directory_path() / fmt::format("kvasir-task-step-{}", ::getpid());
    fs::create_directories(tmp);
    const std::string all = read_text_file((kRoot / "fixtures/tasks/qwen3_moe_trained_cloze.jsonl").string());
    std::string slice;
    std::size_t pos = 0;
    // 100 items: a perfect agreement of n/n shows the sensitive 0.97 on its 95 % Wilson bound from n = 88.
    for (int i = 0; i < 100; ++i) {
        const std::size_t nl = all.find('\n', pos);
        slice += all.substr(pos, nl + 1 - pos);
        pos = nl + 1;
    }
    write_file_atomic((tmp / "items.jsonl").string(), slice);
    nlohmann::json doc = reduced_to(load_protocol((kRoot / "protocols/trained.json").string()).document, {"task", "generate"});
    doc["steps"]["task"]["items"] = {{"path", (tmp / "items.jsonl").string()}, {"sha256", sha256_hex(slice)}};
    const Protocol p = parse_protocol(doc, "trained.json (task only)", (kRoot / "protocols").string());
    const Model m = Model::open((kRoot / "fixtures/models/qwen3_moe_trained").string());
    std::vector<std::unique_ptr<Backend>> nodes;
    for (const char* s : {"cpu-ref", "cpu", "cpu:storage=bf16"}) nodes.push_back(create_backend(s));
    AuditConfig cfg;
    cfg.protocol = &p;
    cfg.model = &m;
    const AuditRun run = run_audit(cfg, nodes, 0);
    EXPECT_EQ(verdict_of(run, "cpu").verdict, Verdict::fit);
    const NodeVerdict& bf16 = verdict_of(run, "cpu:storage=bf16");
    EXPECT_EQ(bf16.verdict, Verdict::unfit_sensitive);
    // generate: every continuation also as the tokenizer decodes it.
    const Tokenizer tok = load_tokenizer_for(m.path());
    const nlohmann::ordered_json& gen = run.report.steps.at("generate");
    EXPECT_EQ(gen.at("reference_text").get<std::string>(), tok.decode(gen.at("reference_tokens").get<std::vector<std::int32_t>>()));
    for (const auto& e : gen.at("results"))
        EXPECT_EQ(e.at("text").get<std::string>(), tok.decode(e.at("tokens").get<std::vector<std::int32_t>>()));
    const CriterionResult* ll = criterion_of(bf16, Tier::sensitive, "task.ll_max_abs_delta_max");
    ASSERT_NE(ll, nullptr);
    EXPECT_FALSE(ll->pass);
    const CriterionResult* agree = criterion_of(bf16, Tier::sensitive, "task.agreement_min");
    ASSERT_NE(agree, nullptr);
    EXPECT_EQ(agree->value, 1.0);  // the same 100 answers
    const nlohmann::ordered_json& task = run.report.steps.at("task");
    EXPECT_EQ(task.at("items").get<int>(), 100);
    EXPECT_GT(task.at("reference_acc").get<double>(), 0.0);
    // `kvasir-equiv task --items …` is this step's view: the same section, figure for figure.
    const std::string items = (tmp / "items.jsonl").string();
    const Protocol view = view_protocol(p, StepView{"task", false, {}, [&](Protocol& v) {
                                                        v.task.path = v.task.resolved_path = items;
                                                        v.task.sha256 = sha256_hex(slice);
                                                    }},
                                        TokenSequence{{}, "none"});
    const AuditRun viewed = run_view(view, m, TokenSequence{{}, "none"}, nodes, 0, Gate::none, p.seed);
    EXPECT_EQ(viewed.report.steps.at("task").dump(), task.dump());
    // A sha256 that is not the file's is refused before anything runs.
    doc["steps"]["task"]["items"]["sha256"] = std::string(64, '0');
    const Protocol bad = parse_protocol(doc, "trained.json (task only)", (kRoot / "protocols").string());
    cfg.protocol = &bad;
    try {
        (void)run_audit(cfg, nodes, 0);
        ADD_FAILURE() << "a wrong items sha256 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the task items changed"), std::string::npos) << e.what();
    }
    fs::remove_all(tmp);
}

// bf16 storage on the hybrid family (issue #23): the same node and the same
// tolerances (default.json's logits and decide steps), two hybrid models.
// On the trained qwen3_5_moe_trained, whose distributions are peaked like a
// real model's, bf16 storage is unfit-sensitive and passes every tolerant
// criterion (on these id streams L-inf 0.215 vs 1; on trained.json's text
// streams 0.095, KL p99 4.9e-4 vs 0.03, routing 0.9906 vs 0.8); on the
// random-weight qwen3_5_tiny it moves the logits by 2.0 (KL p99 0.084) and
// is unfit. The random weights amplify the rounding
// (the f32 node's own L-inf is ~10x larger there too), so the tolerant
// threshold stays and the random fixture's unfit verdict is what that model
// measures.
TEST(HybridBf16, TolerantOnTheTrainedHybridUnfitOnTheRandomOne) {
    const Protocol p = parse_protocol(reduced_to(load_protocol((kRoot / "protocols/default.json").string()).document,
                                                 {"logits", "decide"}),
                                      "default.json (logits, decide)", (kRoot / "protocols").string());
    const auto run_on = [&](const char* model) {
        const Model m = Model::open((kRoot / "fixtures/models" / model).string());
        std::vector<std::unique_ptr<Backend>> nodes;
        for (const char* s : {"cpu-ref", "cpu", "cpu:storage=bf16"}) nodes.push_back(create_backend(s));
        AuditConfig cfg;
        cfg.protocol = &p;
        cfg.model = &m;
        return run_audit(cfg, nodes, 0);
    };
    // The bf16 node's tolerant criterion c on a run, present.
    const auto tolerant = [](const AuditRun& run, const char* c) {
        const CriterionResult* r = criterion_of(verdict_of(run, "cpu:storage=bf16"), Tier::tolerant, c);
        EXPECT_NE(r, nullptr) << c;
        return r != nullptr ? *r : CriterionResult{};
    };
    const AuditRun trained = run_on("qwen3_5_moe_trained");
    const AuditRun random = run_on("qwen3_5_tiny");
    EXPECT_EQ(verdict_of(trained, "cpu").verdict, Verdict::fit);
    EXPECT_EQ(verdict_of(random, "cpu").verdict, Verdict::fit);
    EXPECT_EQ(verdict_of(trained, "cpu:storage=bf16").verdict, Verdict::unfit_sensitive);
    EXPECT_EQ(verdict_of(random, "cpu:storage=bf16").verdict, Verdict::unfit);
    const CriterionResult linf = tolerant(trained, "logits.linf_max"), kl = tolerant(trained, "logits.kl_p99");
    EXPECT_TRUE(linf.pass);
    EXPECT_LT(linf.value, 0.35);  // half a decade inside the tolerant 1
    EXPECT_LT(kl.value, 3e-3);    // a decade inside the tolerant 0.03
    const CriterionResult rkl = tolerant(random, "logits.kl_p99");
    EXPECT_FALSE(rkl.pass);
    // The amplification is the model's: the f32 node moves the random model's logits more too.
    const CriterionResult* cpu_t = criterion_of(verdict_of(trained, "cpu"), Tier::sensitive, "logits.linf_max");
    const CriterionResult* cpu_r = criterion_of(verdict_of(random, "cpu"), Tier::sensitive, "logits.linf_max");
    ASSERT_TRUE(cpu_t && cpu_r);
    std::printf("logits.linf_max: trained cpu %.3g bf16 %.3g; random cpu %.3g bf16 %.3g; bf16 kl_p99 trained %.3g random %.3g\n",
                cpu_t->value, linf.value, cpu_r->value, tolerant(random, "logits.linf_max").value, kl.value, rkl.value);
    EXPECT_GT(cpu_r->value, 3 * cpu_t->value);
}
