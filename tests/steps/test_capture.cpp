// capture + compare (lib/kvasir/audit/capture.hpp, compare_captures in
// audit.hpp): captures written on "different machines" and compared give the
// SAME verdicts, criterion values, pair matrices and drift series as one
// audit of the same nodes (bit for bit: the same computations, the same
// statistics); tampered, truncated and mismatched captures are refused with
// an error naming the file and the problem; ops-only captures (what numpy /
// torch nodes write) are judged on step 1 alone.
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_writer.hpp"
#include "kvasir/report/audit_json.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/capture.hpp"
#include "kvasir/audit/step.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

const fs::path kRoot = KVASIR_SOURCE_DIR;

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               fmt::format("kvasir_capture_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

const Protocol& ci() {
    static const Protocol p = load_protocol((kRoot / "protocols" / "ci.json").string());
    return p;
}
const Model& model(const std::string& name = "qwen3_moe_tiny") {
    static std::map<std::string, Model> cache;
    auto it = cache.find(name);
    if (it == cache.end()) it = cache.emplace(name, Model::open((kRoot / "fixtures" / "models" / name).string())).first;
    return it->second;
}

// Captures `spec` as a node on its own machine would: a fresh backend and a
// fresh cpu-ref authority beside it.
std::string capture(const TempDir& dir, const std::string& spec, const std::vector<std::string>& steps = {},
                    const Model& m = model(), std::optional<std::uint64_t> seed = {}) {
    auto node = create_backend(spec);
    auto auth = create_backend("cpu-ref");
    AuditConfig cfg;
    cfg.protocol = &ci();
    cfg.model = &m;
    cfg.seed = seed;
    const std::string path = dir / (fmt::format("{}.safetensors", std::hash<std::string>{}(spec + fmt::format("{}", steps.size()))));
    const bool is_ref = spec == "cpu-ref";
    write_capture(path, capture_node(cfg, *node, is_ref ? *node : *auth, steps));
    return path;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

template <typename F>
void expect_bad_input(F&& f, const std::string& part) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one containing: " << part;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
}

TEST(CaptureCompare, SameVerdictsAndFiguresAsTheAudit) {
    const std::vector<std::string> specs{"cpu-ref", "cpu", "cpu:acc=f16", "cpu:fault=nan"};
    std::vector<std::unique_ptr<Backend>> nodes;
    for (const auto& s : specs) nodes.push_back(create_backend(s));
    AuditConfig cfg;
    cfg.protocol = &ci();
    cfg.model = &model();
    const AuditRun audit = run_audit(cfg, nodes, 0);

    TempDir dir;
    std::vector<Capture> caps;
    for (const auto& s : specs) caps.push_back(Capture::open(capture(dir, s)));
    std::vector<const Capture*> ptrs;
    for (const Capture& c : caps) ptrs.push_back(&c);
    CompareConfig cc;
    cc.protocol = &ci();
    const AuditRun cmp = compare_captures(cc, ptrs, 0);

    ASSERT_EQ(cmp.report.nodes.size(), audit.report.nodes.size());
    EXPECT_EQ(cmp.step_order, audit.step_order);
    for (std::size_t i = 0; i < specs.size(); ++i) {
        const NodeVerdict& a = audit.report.nodes[i];
        const NodeVerdict& c = cmp.report.nodes[i];
        EXPECT_EQ(c.node, a.node);
        EXPECT_EQ(c.verdict, a.verdict) << a.node;
        EXPECT_EQ(c.capabilities.dump(), a.capabilities.dump()) << a.node;
        for (const Tier t : {Tier::sensitive, Tier::tolerant}) {
            ASSERT_EQ(c.tier(t).size(), a.tier(t).size()) << a.node;
            for (std::size_t k = 0; k < a.tier(t).size(); ++k) {
                EXPECT_EQ(c.tier(t)[k].criterion, a.tier(t)[k].criterion);
                EXPECT_TRUE(same(c.tier(t)[k].value, a.tier(t)[k].value))
                    << a.node << " " << a.tier(t)[k].criterion << ": audit " << a.tier(t)[k].value << ", compare "
                    << c.tier(t)[k].value;
            }
        }
    }
    EXPECT_EQ(exit_code(cmp.report.nodes, Gate::sensitive), exit_code(audit.report.nodes, Gate::sensitive));
    EXPECT_EQ(exit_code(cmp.report.nodes, Gate::tolerant), exit_code(audit.report.nodes, Gate::tolerant));
    // The pair matrices and the drift series, number for number.
    ASSERT_EQ(cmp.report.pairs.size(), audit.report.pairs.size());
    for (std::size_t m = 0; m < audit.report.pairs.size(); ++m) {
        EXPECT_EQ(cmp.report.pairs[m].name, audit.report.pairs[m].name);
        EXPECT_EQ(cmp.report.pairs[m].nodes, audit.report.pairs[m].nodes);
        for (std::size_t a = 0; a < specs.size(); ++a)
            for (std::size_t b = 0; b < specs.size(); ++b) {
                const auto& x = audit.report.pairs[m].cosine[a][b];
                const auto& y = cmp.report.pairs[m].cosine[a][b];
                ASSERT_EQ(x.has_value(), y.has_value());
                if (x) EXPECT_TRUE(same(*x, *y)) << audit.report.pairs[m].name << " " << a << "," << b;
            }
    }
    ASSERT_EQ(cmp.report.drift.size(), audit.report.drift.size());
    for (std::size_t d = 0; d < audit.report.drift.size(); ++d) {
        EXPECT_EQ(cmp.report.drift[d].rel, audit.report.drift[d].rel);
        EXPECT_TRUE(same(cmp.report.drift[d].alpha, audit.report.drift[d].alpha));
    }
    // The compare report is a valid audit report.
    const auto schema = nlohmann::json::parse(read_text_file((kRoot / "protocols" / "report.schema.json").string()));
    const auto violations = schema_violations(schema, nlohmann::json::parse(audit_report_json(cmp.report).dump()));
    for (const auto& v : violations) ADD_FAILURE() << v.path << ": " << v.message;
}

TEST(CaptureCompare, MetadataRecordsWhatWasCaptured) {
    TempDir dir;
    const Capture c = Capture::open(capture(dir, "cpu"));
    EXPECT_EQ(c.node(), "cpu");
    EXPECT_EQ(c.protocol_hash(), ci().content_hash);
    EXPECT_EQ(c.model_fingerprint(), model().fingerprint());
    EXPECT_EQ(c.seed(), ci().seed);
    EXPECT_EQ(c.steps(), (std::vector<std::string>{"ops", "drift", "logits", "decide", "generate", "perplexity",
                                                   "determinism", "invariance"}));
    EXPECT_TRUE(c.errors().empty());
    EXPECT_EQ(c.capabilities()["backend"], "cpu");
    EXPECT_EQ(c.metadata().at("format"), kCaptureFormat);
    EXPECT_EQ(c.metadata().at("authority"), "cpu-ref");
    EXPECT_EQ(c.metadata().at("content_hash").rfind("sha256:", 0), 0u);
    EXPECT_TRUE(c.has("ops.moe.out"));
    EXPECT_TRUE(c.has("ops.moe.shard_combined"));
    EXPECT_TRUE(c.has("ops.router_softmax.ids"));
    EXPECT_TRUE(c.has("logits.logits"));
    EXPECT_EQ(c.view("determinism.run_to_run_max_rel").at(0), 0.0);  // the cpu backend is deterministic
}

TEST(CaptureCompare, TamperedDataIsRefused) {
    TempDir dir;
    const std::string path = capture(dir, "cpu", {"ops"});
    {
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(0, std::ios::end);
        const auto size = static_cast<std::streamoff>(f.tellg());
        f.seekp(size - 5);  // inside the last tensor's bytes
        char b = 0;
        f.seekg(size - 5);
        f.read(&b, 1);
        b = static_cast<char>(b ^ 0x01);
        f.seekp(size - 5);
        f.write(&b, 1);
    }
    expect_bad_input([&] { (void)Capture::open(path); }, "content hash mismatch");
}

TEST(CaptureCompare, TamperedMetadataIsRefused) {
    TempDir dir;
    const std::string path = capture(dir, "cpu:acc=f16", {"ops"});
    // Rewrite the file claiming another node, keeping the old content hash.
    const SafetensorsFile f = SafetensorsFile::open(path);
    std::map<std::string, TensorView> views;
    for (const auto& n : f.names()) views.emplace(n, f.view(n));
    auto meta = f.metadata();
    meta["node"] = "cpu";
    const std::string forged = dir / "forged.safetensors";
    write_safetensors(forged, views, meta);
    expect_bad_input([&] { (void)Capture::open(forged); }, "content hash mismatch");
}

TEST(CaptureCompare, TruncatedOrForeignFilesAreRefused) {
    TempDir dir;
    const std::string path = capture(dir, "cpu", {"ops"});
    fs::resize_file(path, fs::file_size(path) - 100);
    expect_bad_input([&] { (void)Capture::open(path); }, path);
    // A valid safetensors file that is not a capture.
    const std::string model_file = (kRoot / "fixtures/models/qwen3_moe_tiny/model.safetensors").string();
    expect_bad_input([&] { (void)Capture::open(model_file); }, "capture format 'pt'");
}

TEST(CaptureCompare, MismatchedCapturesAreRefusedNamingTheProblem) {
    TempDir dir;
    const Capture ref = Capture::open(capture(dir, "cpu-ref"));
    const Capture other_seed = Capture::open(capture(dir, "cpu", {}, model(), 7));
    const Capture other_model = Capture::open(capture(dir, "cpu:threads=1", {}, model("qwen3_moe_tiny_bf16")));
    const Capture dup = Capture::open(capture(dir, "cpu-ref", {"ops", "drift"}));
    CompareConfig cc;
    cc.protocol = &ci();
    expect_bad_input([&] { (void)compare_captures(cc, {&ref, &other_seed}, 0); }, "seed 7 differs");
    expect_bad_input([&] { (void)compare_captures(cc, {&ref, &other_model}, 0); }, "model fingerprint");
    expect_bad_input([&] { (void)compare_captures(cc, {&ref, &dup}, 0); }, "both capture node 'cpu-ref'");
    // The same capture twice (or a copy of it): a node compared with itself, said so.
    const std::string same = capture(dir, "cpu", {"ops"});
    fs::copy_file(same, dir / "copy.safetensors");
    const Capture a = Capture::open(same), b = Capture::open(dir / "copy.safetensors");
    expect_bad_input([&] { (void)compare_captures(cc, {&ref, &a, &b}, 0); }, "are the same capture");
    expect_bad_input([&] { (void)compare_captures(cc, {&ref, &a, &a}, 0); }, "a node compared with itself");
    const Protocol other = load_protocol((kRoot / "protocols" / "default.json").string());
    cc.protocol = &other;
    expect_bad_input([&] { (void)compare_captures(cc, {&ref}, 0); }, "captured with protocol hash");
}

TEST(CaptureCompare, StepsTheProtocolDoesNotRunAreRefused) {
    // A capture whose (hash-covered, rehashed) metadata names a step the protocol does not have.
    TempDir dir;
    const Capture ref = Capture::open(capture(dir, "cpu-ref"));
    {
        CompareConfig cc;  // --only-steps with a name that is no step at all: the user's input, exit 2 (not 3)
        cc.protocol = &ci();
        cc.only_steps = {"warmup"};
        expect_bad_input([&] { (void)compare_captures(cc, {&ref}, 0); }, "does not run step \"warmup\"");
    }
    const std::string path = capture(dir, "cpu", {"ops"});
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"steps", R"(["ops","tokenize\n"])"},
                                     {"not_captured", R"({"warmup":"no such step"})"}}) {
        const SafetensorsFile f = SafetensorsFile::open(path);
        std::map<std::string, TensorView> views;
        for (const auto& n : f.names()) views.emplace(n, f.view(n));
        CaptureData forged;
        forged.metadata = f.metadata();
        forged.metadata.erase("content_hash");
        forged.metadata[key] = value;
        for (const auto& [n, v] : views) forged.tensors.emplace(n, Tensor::convert(v, v.dtype));
        const std::string out = dir / (key + ".safetensors");
        write_capture(out, forged);  // rehashed: the content hash is valid
        const Capture c = Capture::open(out);
        CompareConfig cc;
        cc.protocol = &ci();
        cc.only_steps = {"ops"};
        expect_bad_input([&] { (void)compare_captures(cc, {&ref, &c}, 0); }, "which protocol 'ci' does not run");
        // One line even for a hostile name (JSON-quoted).
        try {
            (void)compare_captures(cc, {&ref, &c}, 0);
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
        }
    }
}

TEST(CaptureCompare, AReshapedOrRetypedTensorIsRefusedEvenRehashed) {
    // A capture whose tensor bytes are intact but whose shape (or kind) was changed, then rehashed: the content
    // hash is valid, the layout is not what the reference (and the protocol) has.
    TempDir dir;
    const Capture ref = Capture::open(capture(dir, "cpu-ref"));
    const std::string path = capture(dir, "cpu", {"ops"});
    const SafetensorsFile f = SafetensorsFile::open(path);
    std::string victim;
    for (const auto& n : f.names())
        if (victim.empty() && dtype_is_float(f.view(n).dtype) && f.view(n).shape.size() == 2 && f.view(n).shape[0] > 1) victim = n;
    ASSERT_FALSE(victim.empty());
    for (const bool retype : {false, true}) {
        CaptureData forged;
        forged.metadata = f.metadata();
        forged.metadata.erase("content_hash");
        for (const auto& n : f.names()) {
            TensorView v = f.view(n);
            Tensor t = Tensor::convert(v, v.dtype);
            if (n == victim && !retype) {
                const Shape s = v.shape;
                t = Tensor::convert(TensorView{v.dtype, v.data, {s[0] * s[1]}}, v.dtype);  // [a, b] → [a·b], same bytes
            }
            if (n == victim && retype) t = Tensor::convert(v, DType::i32);
            forged.tensors.emplace(n, std::move(t));
        }
        const std::string out = dir / (retype ? "retyped.safetensors" : "reshaped.safetensors");
        write_capture(out, forged);
        const Capture c = Capture::open(out);  // the hash verifies
        CompareConfig cc;
        cc.protocol = &ci();
        cc.only_steps = {"ops"};
        expect_bad_input([&] { (void)compare_captures(cc, {&ref, &c}, 0); },
                         retype ? "ids and values cannot be compared" : "a reshaped tensor, even with a valid content hash");
        try {
            (void)compare_captures(cc, {&ref, &c}, 0);
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(out), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
        }
    }
}

TEST(CaptureCompare, OpsOnlyCapturesAreJudgedOnStepOne) {
    TempDir dir;
    const Capture ref = Capture::open(capture(dir, "cpu-ref"));
    const Capture cpu = Capture::open(capture(dir, "cpu", {"ops"}));
    EXPECT_EQ(cpu.model_fingerprint(), "");  // seeded step 1 does not depend on the model
    EXPECT_FALSE(cpu.has("logits.logits"));
    CompareConfig cc;
    cc.protocol = &ci();
    cc.only_steps = {"ops"};
    const AuditRun r = compare_captures(cc, {&ref, &cpu}, 0);
    EXPECT_EQ(r.step_order, std::vector<std::string>{"ops"});
    ASSERT_EQ(r.report.nodes.size(), 2u);
    EXPECT_EQ(r.report.nodes[1].verdict, Verdict::fit);
    for (const CriterionResult& c : r.report.nodes[1].sensitive) EXPECT_EQ(find_criterion(c.criterion)->step, "ops") << c.criterion;
    // Judged on every step, the missing ones are errors: nothing compared is never a pass.
    cc.only_steps.clear();
    const AuditRun all = compare_captures(cc, {&ref, &cpu}, 0);
    EXPECT_EQ(all.report.nodes[1].verdict, Verdict::error);
    EXPECT_NE(all.report.nodes[1].errors.at("logits").find("not captured"), std::string::npos);
    EXPECT_EQ(exit_code(all.report.nodes, Gate::none), 0);
    EXPECT_EQ(exit_code(all.report.nodes, Gate::tolerant), 1);
}

TEST(CaptureCompare, ANodeFailureIsRecordedInTheCapture) {
    TempDir dir;
    // A NaN in the node's step-1 output: captured as it is, judged an error by compare.
    const Capture ref = Capture::open(capture(dir, "cpu-ref", {"ops"}));
    const Capture bad = Capture::open(capture(dir, "cpu:fault=nan", {"ops"}));
    CompareConfig cc;
    cc.protocol = &ci();
    cc.only_steps = {"ops"};
    const AuditRun r = compare_captures(cc, {&ref, &bad}, 0);
    EXPECT_EQ(r.report.nodes[1].verdict, Verdict::error);
}

}  // namespace

// The shared decisions' encoding (audit/step.cpp): routing sets with dense
// layers, sets of different lengths and a set without a plan round-trip
// bit for bit through a decisions file; a file whose stored rows do not add
// up, or whose weights are integers, is bad input.
// A capture is untrusted: an integer tensor (token ids, choices, routing
// layers) read back from a file may hold anything its dtype can. A value that
// is not a 32-bit integer is the file's error, never an undefined cast (the
// fuzzer found 1.8e28 in a decisions file: tests/fuzz/corpus/decisions).
TEST(CaptureCompare, AnIntegerTensorHoldingANonInt32IsRefused) {
    const Tensor ok = f64_tensor({-2147483648.0, -3, 0, 7, 2147483647.0});
    EXPECT_EQ(int_vector(ok.view()), (std::vector<std::int32_t>{INT32_MIN, -3, 0, 7, INT32_MAX}));
    for (double bad : {1.8e28, 2147483648.0, -2147483649.0, 0.5, std::nan(""), HUGE_VAL})
        expect_bad_input([&] { (void)int_vector(f64_tensor({1, bad}).view()); }, "element 1");
}

TEST(SharedDecisions, RoutingSetsRoundTripThroughAFile) {
    const auto plan = [](std::vector<std::int32_t> ids, std::vector<double> w) {
        const auto rows = static_cast<std::int64_t>(ids.size() / 2);
        Tensor i(DType::i32, {rows, 2}), v(DType::f64, {rows, 2});
        std::copy(ids.begin(), ids.end(), i.as<std::int32_t>());
        std::copy(w.begin(), w.end(), v.as<double>());
        return RoutingPlan{std::move(i), std::move(v)};
    };
    // 3 layers, layer 1 dense; set 1 has no plan on layer 2.
    const std::vector<std::vector<RoutingPlan>> sets = {
        {plan({0, 3, 1, 2}, {0.75, 0.25, 0.5, 0.5}), RoutingPlan{}, plan({2, 1}, {0.875, 0.125})},
        {plan({1, 0}, {0.6, 0.4}), RoutingPlan{}, RoutingPlan{}},
    };
    NamedTensors out;
    save_routing_sets(out, "routing", sets);
    save_tensor_list(out, "hidden", {Tensor::from_f64(std::vector<double>{1.5, -2.0}, {1, 2}), Tensor{}});
    const std::string path = ::testing::TempDir() + "/kvasir-shared.decisions";
    std::map<std::string, TensorView> views;
    for (const auto& [name, t] : out) views.emplace(name, t.view());
    write_safetensors(path, views, {{"format", "kvasir-equiv/decisions/1"}});
    const auto file = open_decisions_file(path);
    const auto back = load_routing_sets(*file, "routing", 3, 2);
    ASSERT_EQ(back.size(), 2u);
    for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t l = 0; l < 3; ++l) {
            ASSERT_EQ(back[s][l].ids.empty(), sets[s][l].ids.empty()) << s << " " << l;
            if (sets[s][l].ids.empty()) continue;
            EXPECT_EQ(back[s][l].ids.shape(), sets[s][l].ids.shape());
            for (std::int64_t i = 0; i < sets[s][l].ids.numel(); ++i) {
                EXPECT_EQ(back[s][l].ids.at(i), sets[s][l].ids.at(i));
                EXPECT_EQ(back[s][l].weights.at(i), sets[s][l].weights.at(i));
            }
        }
    const auto hidden = load_tensor_list(*file, "hidden", 2);
    ASSERT_EQ(hidden.size(), 2u);
    EXPECT_EQ(hidden[0].at(0), 1.5);
    EXPECT_EQ(hidden[0].at(1), -2.0);
    EXPECT_TRUE(hidden[1].empty());

    EXPECT_THROW((void)load_routing_sets(*file, "routing", 3, 1000000000), Error);  // a count the step does not have
    // Rows that claim more than is stored; integer weights.
    NamedTensors bad = out;
    bad.insert_or_assign("routing.0.rows", i32_tensor({2, 2}));
    std::map<std::string, TensorView> bad_views;
    for (const auto& [name, t] : bad) bad_views.emplace(name, t.view());
    write_safetensors(path, bad_views, {});
    EXPECT_THROW((void)load_routing_sets(*open_decisions_file(path), "routing", 3, 2), Error);
    bad = out;
    bad.insert_or_assign("routing.0.weights", Tensor(DType::i32, {3, 2}));
    bad_views.clear();
    for (const auto& [name, t] : bad) bad_views.emplace(name, t.view());
    write_safetensors(path, bad_views, {});
    EXPECT_THROW((void)load_routing_sets(*open_decisions_file(path), "routing", 3, 2), Error);
    fs::remove(path);
}
