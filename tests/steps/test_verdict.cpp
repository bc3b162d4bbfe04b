// The verdict machinery of `audit`, independent of the steps that measure:
//  * the protocol content hash survives reformatting (SHA-256, canonical
//    JSON and the schema validator are tested in tests/core/);
//  * the shipped protocols: each parses, validates against
//    protocols/protocol.schema.json with the C++ validator, and its token
//    streams match their pinned sha256;
//  * bad protocol files refused with "<file>: <JSON pointer>: <problem>" —
//    unknown keys, missing tolerances, wrong types and the cross-field rules —
//    and, where a schema can say it, refused by the schema at the same pointer;
//  * verdict classes from synthetic measurements (fit, unfit-sensitive,
//    unfit, error, reference), NaN/Inf never passing, a missing measurement
//    failing, per-op tolerances overriding their family, margins and the
//    tightest passing tolerance, exit codes for every gate incl. zero nodes;
//  * the fault-injection backend: each fault really perturbs what it says
//    and nothing else.
#include "kvasir/backend/cpu_backends.hpp"
#include "kvasir/backend/fault.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

namespace fs = std::filesystem;
using namespace kvasir;
using nlohmann::json;

namespace {

const fs::path kProtocols = fs::path(KVASIR_SOURCE_DIR) / "protocols";
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

json read_json(const fs::path& p) { return json::parse(read_text_file(p.string())); }

// Expect Error(bad_input) whose message starts with `prefix` and contains `part`.
template <typename F>
void expect_bad_input(F&& f, const std::string& prefix, const std::string& part) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one starting with: " << prefix;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind(prefix, 0), 0u) << "message: " << msg << "\nexpected prefix: " << prefix;
        EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nexpected to contain: " << part;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
}

}  // namespace

// --- content hash of a protocol -----------------------------------------------------
// (SHA-256 and canonical JSON themselves: tests/core/test_sha256.cpp,
// test_canonical_json.cpp.)

TEST(ContentHash, ShippedProtocolReformattedKeepsItsHash) {
    const Protocol p = load_protocol((kProtocols / "default.json").string());
    // Rewrite the same document with another indent and reversed key order
    // at the top level; the hash must not move.
    const json doc = read_json(kProtocols / "default.json");
    std::string text = "{";
    std::vector<std::string> keys;
    for (const auto& [k, v] : doc.items()) keys.push_back(k);
    for (auto it = keys.rbegin(); it != keys.rend(); ++it)
        text += (it == keys.rbegin() ? "\n" : ",\n") + json(*it).dump() + ":   " + doc[*it].dump(7);
    text += "\n}\n";
    const fs::path dir = fs::temp_directory_path() / ("kvasir_hash_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    write_file_atomic((dir / "reformatted.json").string(), text);
    const Protocol q = load_protocol((dir / "reformatted.json").string());
    EXPECT_EQ(p.content_hash, q.content_hash);
    EXPECT_EQ(p.content_hash.size(), 7u + 64u);
    // A changed tolerance moves it.
    json changed = doc;
    changed["tiers"]["sensitive"]["logits.kl_p99"]["value"] = 2e-6;
    EXPECT_NE(parse_protocol(changed, "x", dir.string()).content_hash, p.content_hash);
    fs::remove_all(dir);
}

// --- shipped protocols -------------------------------------------------------------

class ShippedProtocol : public ::testing::TestWithParam<std::string> {};

TEST_P(ShippedProtocol, ParsesValidatesAndPinsItsTokens) {
    const fs::path path = kProtocols / (GetParam() + ".json");
    const Protocol p = load_protocol(path.string());
    EXPECT_EQ(p.id, GetParam());
    EXPECT_GE(p.version, 1);
    const json schema = read_json(kProtocols / "protocol.schema.json");
    const auto v = schema_violations(schema, read_json(path));
    for (const auto& x : v) ADD_FAILURE() << x.path << ": " << x.message;
    // Every step — the task score wherever the protocol's model has a tokenizer to score it with.
    const bool has_tokenizer = !tokenizer_path_for(p.model_resolved).empty();
    for (const std::string& step : protocol_step_names())
        EXPECT_EQ(p.runs(step), step != "task" || has_tokenizer) << step;
    // Every required criterion in both tiers, each with a one-line why.
    for (const Tier t : {Tier::sensitive, Tier::tolerant})
        for (const CriterionInfo& c : criterion_catalog()) {
            if (!c.required || !p.runs(c.step)) continue;
            ASSERT_EQ(p.tier(t).count(c.name), 1u) << to_string(t) << " " << c.name;
            EXPECT_FALSE(p.tier(t).at(c.name).why.empty());
        }
    for (const TokenStream* s : {&p.drift.tokens, &p.logits.tokens, &p.decide.tokens, &p.generate.prompt, &p.perplexity.tokens}) {
        const auto ids = read_token_stream(*s, p.model_resolved);
        EXPECT_EQ(static_cast<std::int64_t>(ids.size()), s->count);
    }
    EXPECT_TRUE(fs::exists(p.model_resolved)) << p.model_resolved;
    const OpsConfig ops = p.ops_config();
    EXPECT_NO_THROW(ops.validate());
    EXPECT_EQ(ops.seed, p.seed);
}

INSTANTIATE_TEST_SUITE_P(Protocols, ShippedProtocol, ::testing::Values("default", "ci", "strict", "relative", "trained"));

TEST(Protocol, ReadmeDocumentsEveryCriterion) {
    const std::string readme = read_text_file((kProtocols / "README.md").string());
    for (const CriterionInfo& c : criterion_catalog()) EXPECT_NE(readme.find("`" + c.name + "`"), std::string::npos) << c.name;
    // The tolerances are calibrated, and the evidence is there (tables with margins per seed and fixture).
    EXPECT_NE(readme.find("## Calibration"), std::string::npos);
    EXPECT_NE(readme.find("smallest margin"), std::string::npos);
    for (const char* f : {"default.json", "ci.json", "strict.json"})
        EXPECT_EQ(read_text_file((kProtocols / f).string()).find("PROVISIONAL"), std::string::npos) << f;
}

TEST(Protocol, TokenStreamWithWrongHashIsRefused) {
    Protocol p = load_protocol((kProtocols / "ci.json").string());
    TokenStream s = p.logits.tokens;
    s.sha256 = std::string(64, '0');
    expect_bad_input([&] { read_token_stream(s); }, s.resolved_path + ": sha256 is ", "the protocol pins 000");
    s = p.logits.tokens;
    s.offset = 380;
    s.count = 10;
    expect_bad_input([&] { read_token_stream(s); }, s.resolved_path + ": holds 384 tokens", "from offset 380");
}

TEST(Protocol, TextTokenStreamsAreTheModelTokenizersIds) {
    // A "model" folder holding only a tokenizer.json is enough for the stream
    // (the ids meet the model's vocabulary when a step validates them).
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvasir-text-stream-{}", ::getpid());
    fs::create_directories(dir);
    fs::copy_file(fs::path(KVASIR_SOURCE_DIR) / "fixtures/tokenizers/llama3_style.json", dir / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    const std::string text = "The quick brown fox — Привет, мир! 日本語 1234";
    write_file_atomic((dir / "t.txt").string(), text);
    const std::vector<std::int32_t> all = Tokenizer::load((dir / "tokenizer.json").string()).encode(text);
    ASSERT_GT(all.size(), 8u);
    TokenStream s;
    s.path = s.resolved_path = (dir / "t.txt").string();
    s.sha256 = sha256_hex(text);
    s.text = true;
    s.offset = 0;  // BOS included: the template's <|begin_of_text|>
    s.count = static_cast<std::int64_t>(all.size());
    EXPECT_EQ(read_token_stream(s, dir.string()), all);
    s.offset = 3;
    s.count = 4;
    EXPECT_EQ(read_token_stream(s, dir.string()), std::vector<std::int32_t>(all.begin() + 3, all.begin() + 7));
    s.count = static_cast<std::int64_t>(all.size());
    expect_bad_input([&] { read_token_stream(s, dir.string()); }, s.resolved_path + fmt::format(": holds {} tokens", all.size()),
                     "from offset 3");
    fs::remove(dir / "tokenizer.json");
    expect_bad_input([&] { read_token_stream(s, dir.string()); }, "no tokenizer.json beside", "--tokenizer");
    fs::remove_all(dir);
    // "format" in a protocol: "ids" or "text", nothing else.
    json doc = read_json(kProtocols / "ci.json");
    doc["steps"]["logits"]["tokens"]["format"] = "text";
    EXPECT_TRUE(parse_protocol(doc, "p.json", kProtocols.string()).logits.tokens.text);
    doc["steps"]["logits"]["tokens"]["format"] = "words";
    expect_bad_input([&] { (void)parse_protocol(doc, "p.json", kProtocols.string()); }, "p.json",
                     "/steps/logits/tokens/format: expected \"ids\" or \"text\"");
}

// --- bad protocols ------------------------------------------------------------------

struct BadCase {
    const char* name;
    std::function<void(json&)> mutate;
    const char* pointer;   // where the problem is
    const char* problem;   // a part of the message
    bool schema_catches;   // a JSON Schema can express this rule
};

class BadProtocol : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadProtocol, RefusedWithThePointer) {
    const BadCase& c = GetParam();
    json doc = read_json(kProtocols / "default.json");
    c.mutate(doc);
    expect_bad_input([&] { parse_protocol(doc, "protocols/x.json", kProtocols.string()); },
                     std::string("protocols/x.json: ") + c.pointer + ": ", c.problem);
    const auto v = schema_violations(read_json(kProtocols / "protocol.schema.json"), doc);
    if (c.schema_catches) {
        ASSERT_FALSE(v.empty()) << "the schema accepts case " << c.name;
        bool at = false;
        for (const auto& x : v) at = at || x.path == c.pointer;
        EXPECT_TRUE(at) << "schema reports " << v.front().path << ": " << v.front().message;
    } else {
        EXPECT_TRUE(v.empty()) << "cross-field rule unexpectedly caught by the schema: " << v.front().path;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadProtocol,
    ::testing::Values(
        BadCase{"unknown_top_key", [](json& d) { d["extra"] = 1; }, "/extra", "unknown key", true},
        BadCase{"unknown_nested_key", [](json& d) { d["steps"]["ops"]["shapez"] = d["steps"]["ops"]["shapes"]; },
                "/steps/ops/shapez", "unknown key (allowed here:", true},
        BadCase{"unknown_tolerance_key", [](json& d) { d["tiers"]["sensitive"]["logits.kl_p99"]["valeu"] = 1; },
                "/tiers/sensitive/logits.kl_p99/valeu", "unknown key", true},
        BadCase{"missing_tolerance", [](json& d) { d["tiers"]["sensitive"].erase("logits.kl_p99"); }, "/tiers/sensitive",
                "missing tolerance 'logits.kl_p99' (required while step 'logits' runs)", false},
        BadCase{"tolerance_value_string", [](json& d) { d["tiers"]["sensitive"]["logits.kl_p99"]["value"] = "1e-6"; },
                "/tiers/sensitive/logits.kl_p99/value", "expected a number, got string", true},
        BadCase{"tolerance_without_why", [](json& d) { d["tiers"]["tolerant"]["determinism"].erase("why"); },
                "/tiers/tolerant/determinism", "missing key 'why'", true},
        BadCase{"why_two_lines", [](json& d) { d["tiers"]["tolerant"]["determinism"]["why"] = "a\nb"; },
                "/tiers/tolerant/determinism/why", "one line", true},
        BadCase{"missing_step_key", [](json& d) { d["steps"]["generate"].erase("n"); }, "/steps/generate", "missing key 'n'", true},
        BadCase{"count_not_integer", [](json& d) { d["steps"]["logits"]["tokens"]["count"] = 64.5; },
                "/steps/logits/tokens/count", "expected an integer, got number 64.5", true},
        BadCase{"bad_sha256", [](json& d) { d["steps"]["drift"]["tokens"]["sha256"] = "E4B1"; }, "/steps/drift/tokens/sha256",
                "64 lowercase hex", true},
        BadCase{"drift_threshold_zero", [](json& d) { d["steps"]["drift"]["threshold"] = 0; }, "/steps/drift/threshold",
                "must be a finite number > 0", true},
        BadCase{"decide_border_negative", [](json& d) { d["steps"]["decide"]["border"] = -1e-3; }, "/steps/decide/border",
                "must be a finite number > 0", true},
        BadCase{"logits_authority_string", [](json& d) { d["steps"]["logits"]["router_authority"] = "no"; },
                "/steps/logits/router_authority", "expected a boolean, got string", true},
        BadCase{"logits_border", [](json& d) { d["steps"]["logits"]["border"] = 1e-3; }, "/steps/logits/border", "unknown key", true},
        BadCase{"unknown_criterion", [](json& d) { d["tiers"]["tolerant"]["logits.kl99"] = {{"value", 1}, {"why", "x"}}; },
                "/tiers/tolerant/logits.kl99", "unknown criterion", true},
        BadCase{"unknown_op_criterion", [](json& d) { d["tiers"]["tolerant"]["ops.gemm.max_rel"] = {{"value", 1}, {"why", "x"}}; },
                "/tiers/tolerant/ops.gemm.max_rel", "unknown criterion", true},
        BadCase{"cosine_above_one", [](json& d) { d["tiers"]["tolerant"]["ops.cosine_min"]["value"] = 1.5; },
                "/tiers/tolerant/ops.cosine_min/value", "must be in [0, 1]", true},
        BadCase{"negative_magnitude", [](json& d) { d["tiers"]["tolerant"]["shard.max_rel"]["value"] = -1; },
                "/tiers/tolerant/shard.max_rel/value", "must be >= 0", true},
        BadCase{"sensitive_looser", [](json& d) { d["tiers"]["sensitive"]["ops.cosine_min"]["value"] = 0.99; },
                "/tiers/sensitive/ops.cosine_min/value", "looser than the tolerant tier's 0.999", false},
        BadCase{"step_not_run", [](json& d) { d["steps"].erase("generate"); }, "/tiers/sensitive/generate.first_divergence_min",
                "step 'generate' is not run by this protocol", false},
        BadCase{"divergence_beyond_n", [](json& d) { d["tiers"]["sensitive"]["generate.first_divergence_min"]["value"] = 33; },
                "/tiers/sensitive/generate.first_divergence_min/value", "exceeds /steps/generate/n = 32", false},
        BadCase{"divergences_without_teacher_forcing",
                [](json& d) { d["tiers"]["tolerant"]["generate.divergences_max"] = {{"value", 2}, {"why", "x"}}; },
                "/tiers/tolerant/generate.divergences_max", "needs /steps/generate/teacher_forcing = true", false},
        BadCase{"per_op_for_op_not_run",
                [](json& d) {
                    d["steps"]["ops"]["ops"] = json::array({"matmul", "moe"});
                    d["tiers"]["tolerant"]["ops.softmax.max_rel"] = {{"value", 1}, {"why", "x"}};
                },
                "/tiers/tolerant/ops.softmax.max_rel", "op 'softmax' is not among /steps/ops/ops", false},
        BadCase{"unknown_op", [](json& d) { d["steps"]["ops"]["ops"][1] = "gemm"; }, "/steps/ops/ops/1", "unknown op 'gemm'", true},
        BadCase{"wrong_format", [](json& d) { d["format"] = "kvasir-equiv/protocol/2"; }, "/format", "not a supported format", true},
        BadCase{"tiers_not_object", [](json& d) { d["tiers"]["tolerant"] = json::array(); }, "/tiers/tolerant",
                "expected an object, got array", true},
        BadCase{"count_integer_wrong_type", [](json& d) { d["tiers"]["tolerant"]["generate.first_divergence_min"]["value"] = 2.5; },
                "/tiers/tolerant/generate.first_divergence_min/value", "expected an integer", true},
        BadCase{"top_k_above_experts", [](json& d) { d["steps"]["ops"]["shapes"]["top_k"] = 17; }, "/steps/ops/shapes/top_k",
                "exceeds experts = 16", false},
        BadCase{"perplexity_score_unknown", [](json& d) { d["steps"]["perplexity"]["score"] = "first_half"; },
                "/steps/perplexity/score", "must be \"all\" or \"second_half\"", true},
        BadCase{"kl_divergence_rounding_unknown",
                [](json& d) { d["steps"]["perplexity"]["kl_divergence"] = {{"base_rounding", "u8"}}; },
                "/steps/perplexity/kl_divergence/base_rounding", "must be \"exact\" or \"llamacpp-u16\"", true},
        BadCase{"kl_divergence_unknown_key",
                [](json& d) { d["steps"]["perplexity"]["kl_divergence"] = {{"base_rounding", "exact"}, {"cut", 16}}; },
                "/steps/perplexity/kl_divergence/cut", "unknown key", true},
        BadCase{"x_floor_on_a_rate", [](json& d) { d["tiers"]["sensitive"]["decide.top1_agreement_min"]["x_floor"] = 10; },
                "/tiers/sensitive/decide.top1_agreement_min/x_floor", "error magnitudes and cosines only", true},
        BadCase{"x_floor_below_one", [](json& d) { d["tiers"]["sensitive"]["logits.kl_p99"]["x_floor"] = 0.5; },
                "/tiers/sensitive/logits.kl_p99/x_floor", "must be in [1, 1e12]", true},
        BadCase{"x_floor_sensitive_looser",
                [](json& d) {
                    d["tiers"]["sensitive"]["logits.kl_p99"]["x_floor"] = 100;
                    d["tiers"]["tolerant"]["logits.kl_p99"]["x_floor"] = 10;
                },
                "/tiers/sensitive/logits.kl_p99/x_floor", "looser than the tolerant tier's 10", false},
        BadCase{"floor_is_the_reference",
                [](json& d) {
                    d["floor"] = "cpu-ref";
                    d["tiers"]["sensitive"]["logits.kl_p99"]["x_floor"] = 100;
                },
                "/floor", "the floor node 'cpu-ref' is the reference", false},
        BadCase{"statistics_confidence_half", [](json& d) { d["statistics"]["confidence"] = 0.5; }, "/statistics/confidence",
                "must be in (0.5, 0.999999]", true},
        BadCase{"statistics_interval_unknown", [](json& d) { d["statistics"]["interval"] = "agresti-coull"; }, "/statistics/interval",
                "expected \"wilson\" or \"clopper-pearson\"", true},
        BadCase{"second_half_tiny_window",
                [](json& d) {
                    d["steps"]["perplexity"]["score"] = "second_half";
                    d["steps"]["perplexity"]["context"] = 3;
                },
                "/steps/perplexity/context", "at least 4 tokens", false}),
    [](const ::testing::TestParamInfo<BadCase>& param_info) { return std::string(param_info.param.name); });

// A fuzz-style pass over the parser in the normal build (the libFuzzer
// build has no audit library): 4000 seeded mutations of the shipped
// protocols — a value replaced by another type, a huge, negative, NaN-like
// or fractional number, a key deleted or added, at every depth — each either
// parses or is refused with Error(bad_input) whose one-line message starts
// with the source; nothing else escapes.
TEST(Protocol, SeededMutationsParseOrAreRefusedAsBadInput) {
    std::vector<json> bases;
    for (const char* name : {"default", "ci", "strict", "relative"}) bases.push_back(read_json(kProtocols / (std::string(name) + ".json")));
    const SeededStream rng(20261202, "tests/protocol-mutations");
    std::uint64_t draw = 0;
    const auto next = [&](std::uint64_t n) { return rng.bits(draw++) % n; };
    const std::vector<json> values = {nullptr, true, -1, 0, 1, 0.5, 1.5, -1e308, 1e308, 1e-320, 18446744073709551615u,
                                      "", "x", "cpu-ref", "wilson", json::array(), json::array({1, 2}), json::object(),
                                      json::object({{"value", 1}, {"why", "w"}, {"x_floor", 10}})};
    int parsed = 0, refused = 0;
    for (int iter = 0; iter < 4000; ++iter) {
        json doc = bases[next(bases.size())];
        const int edits = 1 + static_cast<int>(next(3));
        for (int e = 0; e < edits; ++e) {
            // Walk to a random node.
            json* at = &doc;
            for (int depth = 0; depth < 6 && (at->is_object() || at->is_array()) && !at->empty() && next(4) != 0; ++depth) {
                const std::size_t k = next(at->size());
                if (at->is_object()) {
                    auto it = at->begin();
                    std::advance(it, static_cast<std::ptrdiff_t>(k));
                    at = &it.value();
                } else {
                    at = &(*at)[k];
                }
            }
            switch (next(3)) {
                case 0: *at = values[next(values.size())]; break;
                case 1:
                    if (at->is_object() && !at->empty()) {
                        auto it = at->begin();
                        std::advance(it, static_cast<std::ptrdiff_t>(next(at->size())));
                        at->erase(it);
                    }
                    break;
                default:
                    if (at->is_object()) (*at)[fmt::format("k{}", next(4))] = values[next(values.size())];
                    else if (at->is_number()) *at = at->get<double>() * (next(2) != 0 ? -1.0 : 1e300);
                    break;
            }
        }
        try {
            (void)parse_protocol(doc, "mut.json", kProtocols.string());
            ++parsed;
        } catch (const Error& err) {
            ASSERT_EQ(err.code(), ErrorCode::bad_input) << err.what() << "\n" << doc.dump();
            ASSERT_EQ(std::string(err.what()).rfind("mut.json: ", 0), 0u) << err.what();
            ASSERT_EQ(std::string(err.what()).find('\n'), std::string::npos) << err.what();
            ++refused;
        } catch (const std::exception& other) {
            FAIL() << "not an Error: " << other.what() << "\n" << doc.dump();
        }
    }
    EXPECT_GT(refused, 1000);
    EXPECT_GT(parsed, 10);  // some mutations are harmless (a why string, a tolerance within range)
}

TEST(Protocol, FileLevelProblems) {
    const fs::path dir = fs::temp_directory_path() / ("kvasir_badproto_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string dup = (dir / "dup.json").string();
    write_file_atomic(dup, R"({"tiers": {"sensitive": {"determinism": {"value": 0, "why": "a", "value": 1}}}})");
    expect_bad_input([&] { load_protocol(dup); }, dup + ": /tiers/sensitive/determinism/value: ", "duplicate key");
    const std::string broken = (dir / "broken.json").string();
    write_file_atomic(broken, "{\"id\": \"x\",\n  ");
    expect_bad_input([&] { load_protocol(broken); }, broken + ": invalid JSON: ", "parse error");
    const std::string missing = (dir / "missing.json").string();
    expect_bad_input([&] { load_protocol(missing); }, missing + ": no such file or directory", "");
    fs::remove_all(dir);
}

// --- verdicts ----------------------------------------------------------------------------

namespace {

Tolerances sensitive_tols() {
    return {{"logits.kl_p99", {1e-6, "s"}},
            {"decide.top1_agreement_min", {0.99, "s"}},
            {"ops.max_rel", {1e-2, "s"}},
            {"ops.softmax.max_rel", {1e-1, "softmax is allowed more"}},
            {"determinism", {0, "s"}},
            {"generate.first_divergence_min", {32, "s"}}};
}
Tolerances tolerant_tols() {
    return {{"logits.kl_p99", {1e-2, "t"}},
            {"decide.top1_agreement_min", {0.9, "t"}},
            {"ops.max_rel", {1e2, "t"}},
            {"determinism", {1e-2, "t"}},
            {"generate.first_divergence_min", {8, "t"}}};
}

NodeInput good_node(const std::string& name = "cpu") {
    NodeInput n;
    n.node = name;
    n.capabilities = {{"node", name}, {"accumulation", "f32"}};
    n.measurements = {{"logits.kl_p99", "logits", 1e-9},
                      {"decide.top1_agreement_min", "decide", 1.0, RateCount{1000, 1000}},
                      {"ops.matmul.max_rel", "ops", 1e-3},
                      {"ops.moe.max_rel", "ops", 9e-4},
                      {"ops.softmax.max_rel", "ops", 5e-2},
                      {"determinism", "determinism", 0},
                      {"generate.first_divergence_min", "generate", 32}};
    return n;
}

// A rate keeps its trials: its successes follow the value.
void set(NodeInput& n, const std::string& criterion, double value) {
    for (auto& m : n.measurements)
        if (m.criterion == criterion) {
            m.value = value;
            if (m.count && std::isfinite(value))
                m.count->successes = std::llround(value * static_cast<double>(m.count->trials));
        }
}

const CriterionResult* find(const std::vector<CriterionResult>& rs, const std::string& name) {
    for (const auto& r : rs)
        if (r.criterion == name) return &r;
    return nullptr;
}

}  // namespace

TEST(Verdict, Fit) {
    const NodeVerdict v = judge_node(good_node(), sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::fit);
    EXPECT_TRUE(v.errors.empty());
    for (const auto& r : v.sensitive) EXPECT_TRUE(r.pass) << describe(r);
    // Per-op figures are judged individually; softmax against its own tolerance.
    const CriterionResult* sm = find(v.sensitive, "ops.softmax.max_rel");
    ASSERT_NE(sm, nullptr);
    EXPECT_EQ(sm->tolerance_from, "ops.softmax.max_rel");
    EXPECT_DOUBLE_EQ(sm->tolerance, 1e-1);
    const CriterionResult* mm = find(v.sensitive, "ops.matmul.max_rel");
    ASSERT_NE(mm, nullptr);
    EXPECT_EQ(mm->tolerance_from, "ops.max_rel");
    // In the tolerant tier softmax has no tolerance of its own: the family judges it.
    EXPECT_EQ(find(v.tolerant, "ops.softmax.max_rel")->tolerance_from, "ops.max_rel");
    // Worst: the decade-scaled criterion with the least margin — softmax,
    // 5e-2 against its own 1e-1: log10(2) decades inside (matmul sits 1 decade
    // inside; generate.first_divergence_min, at 0 tokens of margin, is linear
    // and does not compete while everything passes).
    ASSERT_TRUE(v.worst.has_value());
    EXPECT_EQ(v.worst->criterion, "ops.softmax.max_rel");
    EXPECT_NEAR(v.worst->margin, std::log10(2.0), 1e-12);
    EXPECT_NEAR(mm->margin, 1.0, 1e-12);
    EXPECT_EQ(v.capabilities["determinism_measured"]["bit_identical"], true);
}

TEST(Verdict, UnfitSensitiveIsNotRejected) {
    NodeInput n = good_node("cpu:acc=f16");
    set(n, "logits.kl_p99", 1e-5);  // outside 1e-6 (sensitive), inside 1e-2 (tolerant)
    const NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::unfit_sensitive);
    ASSERT_TRUE(v.worst.has_value());
    EXPECT_EQ(v.worst->criterion, "logits.kl_p99");
    EXPECT_EQ(v.worst->tier, Tier::sensitive);
    EXPECT_NEAR(v.worst->margin, -1.0, 1e-12);
    EXPECT_DOUBLE_EQ(v.worst->tightest_passing, 1e-5);
    EXPECT_TRUE(find(v.tolerant, "logits.kl_p99")->pass);
}

TEST(Verdict, UnfitWhenATolerantCriterionFails) {
    NodeInput n = good_node("cpu:fault=perturb,fault_size=1e-1");
    set(n, "decide.top1_agreement_min", 0.5);
    const NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::unfit);
    ASSERT_TRUE(v.worst.has_value());
    EXPECT_EQ(v.worst->criterion, "decide.top1_agreement_min");
    EXPECT_EQ(v.worst->tier, Tier::tolerant);
    // complement_log margin of the rate's lower bound (500 of 1000, Wilson 95 %): log10((1 − 0.9) / (1 − lower)).
    const double lower = binomial_lower_bound(500, 1000, 0.95, BinomialBound::wilson);
    EXPECT_NEAR(lower, 0.474, 1e-3);
    EXPECT_NEAR(v.worst->margin, std::log10(0.1 / (1.0 - lower)), 1e-12);
}

TEST(Verdict, StepErrorIsError) {
    NodeInput n = good_node("opencl:0");
    n.errors["logits"] = "clEnqueueNDRangeKernel failed: CL_OUT_OF_RESOURCES";
    const NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::error);
    EXPECT_EQ(v.errors.at("logits"), "clEnqueueNDRangeKernel failed: CL_OUT_OF_RESOURCES");
}

TEST(Verdict, NaNAndInfAreErrorsAndNeverPass) {
    for (const double bad : {kNaN, kInf, -kInf}) {
        NodeInput n = good_node("cpu:fault=nan");
        set(n, "logits.kl_p99", bad);
        const NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
        EXPECT_EQ(v.verdict, Verdict::error) << bad;
        ASSERT_EQ(v.errors.count("logits"), 1u);
        EXPECT_NE(v.errors.at("logits").find("non-finite where the reference had none"), std::string::npos);
        for (const auto* tier : {&v.sensitive, &v.tolerant}) {
            const CriterionResult* r = find(*tier, "logits.kl_p99");
            ASSERT_NE(r, nullptr);
            EXPECT_FALSE(r->pass);  // -inf too, although it is "below" every tolerance
        }
        ASSERT_TRUE(v.worst.has_value());
        EXPECT_EQ(v.worst->criterion, "logits.kl_p99");
    }
    // The primitive itself: NaN on either side fails both directions.
    const Tolerance t{1.0, "x"};
    EXPECT_FALSE(judge_criterion("logits.kl_p99", "logits", kNaN, t, "logits.kl_p99", Tier::tolerant).pass);
    EXPECT_FALSE(judge_criterion("ops.cosine_min", "ops", kNaN, Tolerance{0.5, "x"}, "ops.cosine_min", Tier::tolerant).pass);
    EXPECT_FALSE(judge_criterion("logits.kl_p99", "logits", 0.0, Tolerance{kNaN, "x"}, "logits.kl_p99", Tier::tolerant).pass);
    EXPECT_TRUE(std::isnan(judge_criterion("logits.kl_p99", "logits", kNaN, t, "logits.kl_p99", Tier::tolerant).tightest_passing));
}

TEST(Verdict, MissingMeasurementFails) {
    NodeInput n = good_node();
    n.measurements.erase(std::remove_if(n.measurements.begin(), n.measurements.end(),
                                        [](const Measurement& m) { return m.criterion == "generate.first_divergence_min"; }),
                         n.measurements.end());
    const NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::unfit);  // fails the tolerant tier too: nothing compared is never a pass
    const CriterionResult* r = find(v.tolerant, "generate.first_divergence_min");
    ASSERT_NE(r, nullptr);
    EXPECT_FALSE(r->measured);
    EXPECT_FALSE(r->pass);
    EXPECT_TRUE(std::isnan(r->value));
    EXPECT_EQ(describe(*r), "generate.first_divergence_min not measured (tolerance >= 8)");
    // A family tolerance with no op measured at all is missing too.
    NodeInput no_ops = good_node();
    no_ops.measurements.erase(std::remove_if(no_ops.measurements.begin(), no_ops.measurements.end(),
                                             [](const Measurement& m) { return m.step == "ops"; }),
                              no_ops.measurements.end());
    const NodeVerdict w = judge_node(no_ops, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(w.verdict, Verdict::unfit);
    ASSERT_NE(find(w.tolerant, "ops.max_rel"), nullptr);
    EXPECT_FALSE(find(w.tolerant, "ops.max_rel")->measured);
    // ... and so is the per-op override when its op was not measured.
    ASSERT_NE(find(w.sensitive, "ops.softmax.max_rel"), nullptr);
    EXPECT_FALSE(find(w.sensitive, "ops.softmax.max_rel")->measured);
}

TEST(Verdict, RepeatedMeasurementsAreJudgedOnTheWorst) {
    NodeInput n = good_node();
    n.measurements.push_back({"logits.kl_p99", "logits", 5e-6});  // worse than 1e-9
    n.measurements.push_back({"logits.kl_p99", "logits", 1e-12});
    NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_DOUBLE_EQ(find(v.sensitive, "logits.kl_p99")->value, 5e-6);
    EXPECT_EQ(v.verdict, Verdict::unfit_sensitive);
    n.measurements.push_back({"decide.top1_agreement_min", "decide", 0.95, RateCount{950, 1000}});  // min direction: smaller is worse
    v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_DOUBLE_EQ(find(v.sensitive, "decide.top1_agreement_min")->value, 0.95);
}

TEST(Verdict, ReferenceIsReportedNotJudged) {
    NodeInput n = good_node("cpu-ref");
    n.is_reference = true;
    set(n, "logits.kl_p99", kNaN);  // ignored: the reference is not judged
    const NodeVerdict v = judge_node(n, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::reference);
    EXPECT_TRUE(v.sensitive.empty());
    EXPECT_TRUE(v.tolerant.empty());
    EXPECT_FALSE(v.worst.has_value());
    EXPECT_TRUE(v.errors.empty());
    EXPECT_EQ(v.capabilities["node"], "cpu-ref");
}

TEST(Verdict, UnknownMeasurementIsLoud) {
    NodeInput n = good_node();
    n.measurements.push_back({"logits.kl99", "logits", 0});
    try {
        judge_node(n, sensitive_tols(), tolerant_tols());
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::internal);
        EXPECT_NE(std::string(e.what()).find("'logits.kl99'"), std::string::npos);
    }
}

TEST(Verdict, Margins) {
    const auto m = [](const char* c, double v, double t) {
        return judge_criterion(c, "s", v, Tolerance{t, "w"}, c, Tier::sensitive);
    };
    // log scale, direction max: decades inside.
    EXPECT_NEAR(m("logits.kl_p99", 1e-9, 1e-6).margin, 3.0, 1e-12);
    EXPECT_NEAR(m("logits.kl_p99", 1e-4, 1e-6).margin, -2.0, 1e-12);
    EXPECT_EQ(m("determinism", 0, 0).margin, kInf);  // bit-identical: exactly as required
    EXPECT_TRUE(m("determinism", 0, 0).pass);
    EXPECT_EQ(m("determinism", 1e-7, 0).margin, -kInf);
    EXPECT_FALSE(m("determinism", 1e-7, 0).pass);
    // complement_log, direction min: decades of 1 − x.
    EXPECT_NEAR(m("ops.cosine_min", 1 - 1e-7, 1 - 1e-5).margin, 2.0, 1e-6);
    EXPECT_EQ(m("ops.cosine_min", 1.0, 0.99999).margin, kInf);
    EXPECT_NEAR(m("ops.cosine_min", 0.999, 0.99999).margin, -2.0, 1e-6);
    // linear: tokens.
    EXPECT_DOUBLE_EQ(m("generate.first_divergence_min", 20, 8).margin, 12);
    EXPECT_DOUBLE_EQ(m("generate.first_divergence_min", 3, 8).margin, -5);
    EXPECT_DOUBLE_EQ(m("drift.alpha_max", 0.5, 1.5).margin, 1.0);
    // margin >= 0 exactly when it passes; the tightest passing tolerance is the value.
    for (const double v : {1e-12, 1e-6, 1e-3}) {
        const CriterionResult r = m("logits.kl_p99", v, 1e-6);
        EXPECT_EQ(r.pass, r.margin >= 0);
        EXPECT_EQ(r.tightest_passing, v);
        EXPECT_TRUE(m("logits.kl_p99", v, r.tightest_passing).pass);
    }
    EXPECT_EQ(describe(m("logits.kl_p99", 1e-4, 1e-6)), "logits.kl_p99 1.00e-04 > 1.00e-06 (-2 decades)");
}

TEST(Verdict, ExitCodes) {
    NodeInput ref = good_node("cpu-ref");
    ref.is_reference = true;
    NodeInput f16 = good_node("cpu:acc=f16");
    set(f16, "logits.kl_p99", 1e-5);
    NodeInput bad = good_node("cpu:fault=perturb");
    set(bad, "logits.kl_p99", 1.0);
    NodeInput err = good_node("cpu:fault=nan");
    set(err, "decide.top1_agreement_min", kNaN);
    const auto v = [&](std::initializer_list<const NodeInput*> ns) {
        std::vector<NodeVerdict> out;
        for (const NodeInput* n : ns) out.push_back(judge_node(*n, sensitive_tols(), tolerant_tols()));
        return out;
    };
    const NodeInput fit = good_node();
    ASSERT_EQ(v({&f16})[0].verdict, Verdict::unfit_sensitive);
    ASSERT_EQ(v({&bad})[0].verdict, Verdict::unfit);
    ASSERT_EQ(v({&err})[0].verdict, Verdict::error);

    EXPECT_EQ(exit_code(v({&ref, &fit}), Gate::sensitive), 0);
    EXPECT_EQ(exit_code(v({&ref, &fit, &f16}), Gate::sensitive), 1);
    EXPECT_EQ(exit_code(v({&ref, &fit, &f16}), Gate::tolerant), 0);
    EXPECT_EQ(exit_code(v({&ref, &fit, &f16}), Gate::none), 0);
    EXPECT_EQ(exit_code(v({&ref, &fit, &bad}), Gate::tolerant), 1);
    EXPECT_EQ(exit_code(v({&ref, &fit, &bad}), Gate::none), 0);
    EXPECT_EQ(exit_code(v({&ref, &fit, &err}), Gate::sensitive), 1);
    EXPECT_EQ(exit_code(v({&ref, &fit, &err}), Gate::tolerant), 1);  // error nodes fail every gate but none
    EXPECT_EQ(exit_code(v({&ref, &fit, &err}), Gate::none), 0);
    // Nothing compared is never a pass, under every gate.
    for (const Gate g : {Gate::sensitive, Gate::tolerant, Gate::none}) {
        EXPECT_EQ(exit_code({}, g), 1) << to_string(g);
        EXPECT_EQ(exit_code(v({&ref}), g), 1) << to_string(g);
    }
    // A reference that failed a step fails the real gates.
    NodeInput broken_ref = ref;
    broken_ref.errors["logits"] = "oracle crashed";
    EXPECT_EQ(exit_code(v({&broken_ref, &fit}), Gate::tolerant), 1);
    EXPECT_EQ(exit_code(v({&broken_ref, &fit}), Gate::none), 0);

    EXPECT_EQ(parse_gate("tolerant"), Gate::tolerant);
    expect_bad_input([] { parse_gate("strict"); }, "gate 'strict': ", "sensitive, tolerant or none");
}

TEST(Verdict, JudgedAgainstAShippedProtocol) {
    // Figures in the ranges the README gives for an f32 node are fit under the
    // default protocol; the f16-accumulation figures are unfit-sensitive.
    const Protocol p = load_protocol((kProtocols / "default.json").string());
    NodeInput f32;
    f32.node = "cpu";
    f32.measurements = {{"ops.max_rel", "ops", 9.8e-4},           {"ops.cosine_min", "ops", 1 - 1.1e-13},
                        {"shard.max_rel", "ops", 9.1e-5},         {"drift.final_rel", "drift", 2e-6},
                        {"drift.alpha_max", "drift", 0.6},        {"logits.kl_p99", "logits", 1e-10}, {"logits.kl_lower_p99", "logits", 1e-10},
                        {"logits.linf_max", "logits", 1e-5},      {"decide.top1_agreement_min", "decide", 1.0, RateCount{320, 320}},
                        {"logits.top_logprob_delta_max", "logits", 9e-6}, {"logits.fingerprint_max_rel", "logits", 5e-7},
                        {"decide.routing_agreement_min", "decide", 1.0, RateCount{960, 960}}, {"generate.first_divergence_min", "generate", 32},
                        {"perplexity.ratio_max", "perplexity", 1e-7}, {"determinism", "determinism", 0},
                        {"invariance.ops_max_rel", "invariance", 0}, {"invariance.batch_max_rel", "invariance", 0},
                        {"invariance.prefill_decode_max_rel", "invariance", 6.5e-4},
                        {"invariance.repeat_unique_max", "invariance", 1},
                        {"bound.violations_max", "ops", 0},       {"bound.probable_violations_max", "ops", 0},
                        {"router.flips_max", "ops", 0},           {"decide.routing_clear_flips_max", "decide", 0}};
    EXPECT_EQ(judge_node(f32, p).verdict, Verdict::fit);
    NodeInput f16 = f32;
    f16.node = "cpu:acc=f16";
    set(f16, "ops.max_rel", 25.7);
    set(f16, "ops.cosine_min", 1 - 6.1e-5);
    set(f16, "shard.max_rel", 2e-4);
    set(f16, "drift.final_rel", 1e-2);
    set(f16, "logits.kl_p99", 1e-4);
    set(f16, "logits.kl_lower_p99", 1e-4);
    set(f16, "logits.linf_max", 5e-2);
    set(f16, "logits.top_logprob_delta_max", 7e-2);
    set(f16, "logits.fingerprint_max_rel", 5.4e-3);
    const NodeVerdict v = judge_node(f16, p);
    EXPECT_EQ(v.verdict, Verdict::unfit_sensitive);
    ASSERT_TRUE(v.worst.has_value());
    // Furthest outside: 1−cos 6.1e-5 against 1e-8 is 3.8 decades, max_rel 25.7 against 0.03 is 2.9.
    EXPECT_EQ(v.worst->criterion, "ops.cosine_min");
}

// Rates are judged on a one-sided confidence bound, not on the point value (verdict.hpp).
TEST(Verdict, RatesAreJudgedOnTheirConfidenceBound) {
    const Tolerance t99{0.99, "s"};
    const auto judge = [&](std::int64_t k, std::int64_t n, const Protocol::Statistics& st = {}, const Tolerance& tol = {0.99, "s"}) {
        return judge_criterion("decide.top1_agreement_min", "decide", static_cast<double>(k) / static_cast<double>(n), tol,
                               "decide.top1_agreement_min", Tier::sensitive, RateCount{k, n}, st);
    };
    using D = RateJudgement::Decision;
    // 64 of 64 agree: the point value 1 would pass, but 64 trials show only n/(n+z²) = 0.9594 (Wilson, 95 %).
    CriterionResult r = judge(64, 64);
    ASSERT_TRUE(r.rate.has_value());
    EXPECT_FALSE(r.pass);
    EXPECT_EQ(r.rate->decision, D::undecided);
    const double z2 = 1.6448536269514722 * 1.6448536269514722;
    EXPECT_NEAR(r.rate->lower, 64.0 / (64.0 + z2), 1e-12);
    EXPECT_EQ(r.rate->upper, 1.0);
    EXPECT_EQ(r.rate->trials_to_show, 268);
    EXPECT_EQ(r.rate->trials_to_decide, 268);
    EXPECT_LT(r.margin, 0);  // of the lower bound: margin > 0 iff shown
    EXPECT_NE(describe(r).find("64/64"), std::string::npos) << describe(r);
    EXPECT_NE(describe(r).find("undecided, 268 trials"), std::string::npos) << describe(r);
    // 320 of 320: shown.
    r = judge(320, 320);
    EXPECT_TRUE(r.pass);
    EXPECT_EQ(r.rate->decision, D::shown);
    EXPECT_NEAR(r.tightest_passing, 320.0 / (320.0 + z2), 1e-12);
    EXPECT_NEAR(r.margin, std::log10(0.01 / (1.0 - 320.0 / (320.0 + z2))), 1e-9);
    // 319 of 320 (99.7 %): neither shown nor refuted; 300 of 320 (93.75 %): shown to miss.
    EXPECT_EQ(judge(319, 320).rate->decision, D::undecided);
    EXPECT_FALSE(judge(319, 320).pass);
    r = judge(300, 320);
    EXPECT_EQ(r.rate->decision, D::refuted);
    EXPECT_LT(r.rate->upper, 0.99);
    EXPECT_NE(describe(r).find("shown to miss"), std::string::npos) << describe(r);
    // Few trials do not fail a node on noise: 61 of 64 (95.3 %) shows >= 0.85 (the tolerant tier's figure).
    r = judge(61, 64, {}, Tolerance{0.85, "t"});
    EXPECT_TRUE(r.pass);
    EXPECT_EQ(r.rate->decision, D::shown);
    // Clopper–Pearson: the lower bound of n of n is (1 − c)^(1/n): 299 of 299 shows 0.99, 298 of 298 does not.
    const Protocol::Statistics cp{0.95, BinomialBound::clopper_pearson};
    EXPECT_NEAR(judge(299, 299, cp).rate->lower, std::pow(0.05, 1.0 / 299.0), 1e-10);
    EXPECT_TRUE(judge(299, 299, cp).pass);
    EXPECT_FALSE(judge(298, 298, cp).pass);
    // A higher confidence needs more trials: 320 of 320 at 99 % (z = 2.326) shows only 0.9834.
    EXPECT_FALSE(judge(320, 320, Protocol::Statistics{0.99, BinomialBound::wilson}).pass);
    // A tolerance of 1 is a count: every trial must agree, whatever n.
    r = judge(5, 5, {}, Tolerance{1.0, "every one"});
    EXPECT_TRUE(r.pass);
    EXPECT_EQ(r.rate->decision, D::exact);
    EXPECT_FALSE(judge(319, 320, {}, Tolerance{1.0, "every one"}).pass);
    // The JSON carries the evidence.
    const nlohmann::ordered_json j = to_json(judge(64, 64));
    EXPECT_EQ(j["rate"]["successes"], 64);
    EXPECT_EQ(j["rate"]["trials"], 64);
    EXPECT_EQ(j["rate"]["decision"], "undecided");
    EXPECT_EQ(j["rate"]["interval"], "wilson");
    EXPECT_EQ(j["rate"]["trials_to_show"], 268);
    // A rate without its trials cannot be bounded: a bug of the producer, loud.
    EXPECT_THROW((void)judge_criterion("decide.top1_agreement_min", "decide", 1.0, t99, "decide.top1_agreement_min", Tier::sensitive),
                 Error);
    NodeInput bare = good_node();
    for (auto& m : bare.measurements) m.count.reset();
    EXPECT_THROW((void)judge_node(bare, sensitive_tols(), tolerant_tols()), Error);
}

// x_floor tolerances: a multiple of the floor node's own value, measured in
// the same run; the absolute value where there is nothing to scale.
TEST(Verdict, FloorRelativeTolerances) {
    Protocol p = load_protocol((kProtocols / "relative.json").string());
    ASSERT_TRUE(p.uses_floor());
    EXPECT_EQ(p.floor, "cpu");
    EXPECT_EQ(*p.sensitive.at("logits.linf_max").x_floor, 30.0);
    EXPECT_EQ(*p.sensitive.at("logits.kl_p99").x_floor, 1000.0);
    const Tolerance lin = p.sensitive.at("logits.linf_max");
    const auto judge = [&](double value, const FloorValues* floor) {
        return judge_criterion("logits.linf_max", "logits", value, lin, "logits.linf_max", Tier::sensitive, std::nullopt, {}, floor,
                               "cpu");
    };
    // The floor measured 2e-4 (a deep model's honest f32 logits): tolerance 30 × 2e-4 = 6e-3.
    const FloorValues f{"cpu", {{"logits.linf_max", 2e-4}, {"ops.cosine_min", 1 - 1e-12}, {"logits.kl_p99", 0.0}}};
    CriterionResult r = judge(5e-3, &f);
    EXPECT_TRUE(r.pass);
    EXPECT_DOUBLE_EQ(r.tolerance, 6e-3);
    ASSERT_TRUE(r.floor.has_value());
    EXPECT_TRUE(r.floor->relative);
    EXPECT_EQ(r.floor->floor_value, 2e-4);
    EXPECT_NE(describe(r).find("30 x floor cpu 2.00e-04"), std::string::npos) << describe(r);
    EXPECT_FALSE(judge(7e-3, &f).pass);
    // Cosines on 1 − x: 1000 × 1e-12 → 1 − 1e-9.
    const CriterionResult c = judge_criterion("ops.cosine_min", "ops", 1 - 5e-10, p.sensitive.at("ops.cosine_min"), "ops.cosine_min",
                                              Tier::sensitive, std::nullopt, {}, &f, "cpu");
    EXPECT_TRUE(c.pass);
    EXPECT_NEAR(1 - c.tolerance, 1e-9, 1e-13);  // 1 − (1 − 1e-12) is 1e-12 to ~1e-16 absolute, ×1000
    // A floor of 0 (bit-identical to the reference) scales nothing: the absolute value, said so.
    const CriterionResult z = judge_criterion("logits.kl_p99", "logits", 5e-7, p.sensitive.at("logits.kl_p99"), "logits.kl_p99",
                                              Tier::sensitive, std::nullopt, {}, &f, "cpu");
    EXPECT_EQ(z.tolerance, p.sensitive.at("logits.kl_p99").value);
    EXPECT_FALSE(z.floor->relative);
    EXPECT_NE(z.floor->why.find("bit-identical"), std::string::npos) << z.floor->why;
    // No floor node in the run: the absolute value.
    r = judge(5e-3, nullptr);
    EXPECT_EQ(r.tolerance, lin.value);
    EXPECT_FALSE(r.pass);
    EXPECT_EQ(r.floor->node, "cpu");
    EXPECT_EQ(r.floor->why, "the floor node cpu is not in this run: the absolute fallback");
    // judge(): the floor node's worst values scale every other node; the floor itself is not judged by them.
    NodeInput floor_node, other;
    floor_node.node = "cpu";
    other.node = "opencl:0";
    for (NodeInput* n : {&floor_node, &other}) n->measurements = {{"logits.linf_max", "logits", 2e-4}, {"logits.kl_p99", "logits", 1e-9}};
    other.measurements[0].value = 3e-3;  // 15 × the floor
    Tolerances sens{{"logits.linf_max", lin}, {"logits.kl_p99", p.sensitive.at("logits.kl_p99")}};
    Tolerances tol{{"logits.linf_max", p.tolerant.at("logits.linf_max")}, {"logits.kl_p99", p.tolerant.at("logits.kl_p99")}};
    const std::vector<NodeVerdict> vs = kvasir::judge({floor_node, other}, p, &sens, &tol);
    EXPECT_TRUE(vs[0].floor);
    EXPECT_EQ(vs[0].verdict, Verdict::fit);
    EXPECT_EQ(vs[0].not_measurable.count("logits.linf_max"), 1u);
    EXPECT_EQ(std::count_if(vs[0].sensitive.begin(), vs[0].sensitive.end(), [](const CriterionResult& x) { return x.floor.has_value(); }), 0);
    EXPECT_EQ(vs[1].verdict, Verdict::fit);
    const CriterionResult* l = find(vs[1].sensitive, "logits.linf_max");
    ASSERT_NE(l, nullptr);
    EXPECT_DOUBLE_EQ(l->tolerance, 6e-3);
    EXPECT_EQ(to_json(vs[1])["criteria"]["sensitive"][1]["floor"]["node"], "cpu");
    EXPECT_EQ(to_json(vs[0])["floor"], true);
}

TEST(Verdict, TooFewTrialsAreWarnedAboutOncePerCriterion) {
    NodeInput a = good_node("cpu"), b = good_node("opencl");
    for (NodeInput* n : {&a, &b})
        for (auto& m : n->measurements)
            if (m.count) m.count = RateCount{64, 64};
    const std::vector<NodeVerdict> vs = {judge_node(a, sensitive_tols(), tolerant_tols()),
                                         judge_node(b, sensitive_tols(), tolerant_tols())};
    EXPECT_EQ(vs[0].verdict, Verdict::unfit_sensitive);  // 64 of 64 cannot show 0.99
    const std::vector<std::string> w = sample_size_warnings(vs);
    ASSERT_EQ(w.size(), 1u);  // the tolerant tier's 0.9 needs 25: 64 suffice
    EXPECT_NE(w[0].find("decide.top1_agreement_min (sensitive): 64 trials cannot show >= 0.99"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("needs 268"), std::string::npos) << w[0];
    // Enough trials: no warning, fit.
    const std::vector<NodeVerdict> ok = {judge_node(good_node(), sensitive_tols(), tolerant_tols())};
    EXPECT_EQ(ok[0].verdict, Verdict::fit);
    EXPECT_TRUE(sample_size_warnings(ok).empty());
}

TEST(Verdict, Json) {
    NodeInput n = good_node("cpu:acc=f16");
    set(n, "logits.kl_p99", kNaN);
    const nlohmann::ordered_json j = to_json(judge_node(n, sensitive_tols(), tolerant_tols()));
    std::vector<std::string> keys;
    for (const auto& [k, v] : j.items()) keys.push_back(k);
    EXPECT_EQ(keys, (std::vector<std::string>{"node", "verdict", "capabilities", "worst", "errors", "criteria",
                                              "not_applicable", "not_measurable"}));
    EXPECT_EQ(j["verdict"], "error");
    EXPECT_EQ(j["worst"]["value"], "nan");  // never null: a NaN is shown as such
    EXPECT_EQ(j["worst"]["pass"], false);
    EXPECT_TRUE(j["not_applicable"].is_object() && j["not_applicable"].empty());
}

TEST(Verdict, ACriterionThatDoesNotApplyToTheModelIsNotJudgedUnlessMeasured) {
    Tolerances sens = sensitive_tols(), tol = tolerant_tols();
    sens.emplace("decide.routing_agreement_min", Tolerance{0.99, "s"});
    tol.emplace("decide.routing_agreement_min", Tolerance{0.9, "t"});
    // Unmeasured and not declared inapplicable: a failed criterion (nothing compared is never a pass).
    NodeVerdict v = judge_node(good_node(), sens, tol);
    EXPECT_EQ(v.verdict, Verdict::unfit);
    ASSERT_TRUE(v.worst.has_value());
    EXPECT_EQ(v.worst->criterion, "decide.routing_agreement_min");
    EXPECT_FALSE(v.worst->measured);
    // A dense model: the decide step declares routing agreement inapplicable → not judged, listed with its reason.
    NodeInput dense = good_node();
    dense.not_applicable["decide.routing_agreement_min"] = "no MoE layers";
    v = judge_node(dense, sens, tol);
    EXPECT_EQ(v.verdict, Verdict::fit);
    EXPECT_EQ(find(v.sensitive, "decide.routing_agreement_min"), nullptr);
    EXPECT_EQ(find(v.tolerant, "decide.routing_agreement_min"), nullptr);
    EXPECT_EQ(v.not_applicable.at("decide.routing_agreement_min"), "no MoE layers");
    EXPECT_EQ(to_json(v)["not_applicable"]["decide.routing_agreement_min"], "no MoE layers");
    EXPECT_EQ(not_applicable_criteria({v}).size(), 1u);
    // Measured anyway: judged as usual (inapplicability never hides a figure).
    dense.measurements.push_back({"decide.routing_agreement_min", "decide", 0.5, RateCount{50, 100}});
    v = judge_node(dense, sens, tol);
    EXPECT_EQ(v.verdict, Verdict::unfit);
    ASSERT_NE(find(v.tolerant, "decide.routing_agreement_min"), nullptr);
    EXPECT_FALSE(find(v.tolerant, "decide.routing_agreement_min")->pass);
    // Family tolerances (ops.*) are never skipped this way.
    NodeInput no_ops = good_node();
    no_ops.measurements.erase(std::remove_if(no_ops.measurements.begin(), no_ops.measurements.end(),
                                             [](const Measurement& m) { return m.criterion.rfind("ops.", 0) == 0; }),
                              no_ops.measurements.end());
    no_ops.not_applicable["ops.max_rel"] = "claimed";
    EXPECT_EQ(judge_node(no_ops, sensitive_tols(), tolerant_tols()).verdict, Verdict::unfit);
}

TEST(Verdict, NotMeasurableOnOneNodeIsListedNotJudgedNeverPassed) {
    // A free-running external node (llama.cpp) without step 1: the ops family and its per-op keys are not
    // measurable on it; what it did measure is judged as usual.
    NodeInput ext = good_node("llama.cpp");
    ext.measurements.erase(std::remove_if(ext.measurements.begin(), ext.measurements.end(),
                                          [](const Measurement& m) { return m.criterion.rfind("ops.", 0) == 0; }),
                           ext.measurements.end());
    ext.not_measurable["ops.max_rel"] = "step ops not captured by this node";
    NodeVerdict v = judge_node(ext, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::fit);
    for (const auto* tier : {&v.sensitive, &v.tolerant})
        for (const CriterionResult& r : *tier) EXPECT_NE(r.criterion.rfind("ops.", 0), 0u) << r.criterion;
    EXPECT_EQ(to_json(v)["not_measurable"]["ops.max_rel"], "step ops not captured by this node");
    EXPECT_EQ(not_measurable_by_reason(v).at("step ops not captured by this node"), std::vector<std::string>{"ops.max_rel"});
    EXPECT_TRUE(not_applicable_criteria({v}).empty());  // not a property of the model
    // A judged figure still counts: a logit delta between the tiers makes it unfit-sensitive.
    set(ext, "logits.kl_p99", 1e-3);
    EXPECT_EQ(judge_node(ext, sensitive_tols(), tolerant_tols()).verdict, Verdict::unfit_sensitive);
    // Measured per-op figures are judged even so (the declaration never hides a figure).
    set(ext, "logits.kl_p99", 1e-9);
    ext.measurements.push_back({"ops.matmul.max_rel", "ops", 1e3});
    EXPECT_EQ(judge_node(ext, sensitive_tols(), tolerant_tols()).verdict, Verdict::unfit);
    // Everything not measurable: nothing judged is an error, not a pass.
    NodeInput nothing;
    nothing.node = "empty";
    for (const Tolerances& tols : {sensitive_tols(), tolerant_tols()})
        for (const auto& [key, t] : tols) nothing.not_measurable[key] = "not captured";
    v = judge_node(nothing, sensitive_tols(), tolerant_tols());
    EXPECT_EQ(v.verdict, Verdict::error);
    EXPECT_NE(v.errors.at("verdict").find("no criterion could be judged"), std::string::npos);
}

// --- fault injection -------------------------------------------------------------------

namespace {

Tensor normal(const char* name, Shape shape, double sd = 1.0) {
    return seeded_normal(20261129, name, std::move(shape), 0.0, sd, DType::f32, 1);
}

std::unique_ptr<Backend> cpu1() { return make_cpu_backend(BackendSpec::parse("cpu:threads=1")); }
std::unique_ptr<Backend> faulty(const std::string& opts) { return make_cpu_with_fault(BackendSpec::parse("cpu:threads=1," + opts)); }

bool bit_equal(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST(Fault, SpecParsingAndNodeName) {
    auto plain = make_cpu_with_fault(BackendSpec::parse("cpu"));
    EXPECT_EQ(plain->capabilities().node, "cpu");
    EXPECT_EQ(dynamic_cast<FaultBackend*>(plain.get()), nullptr);

    auto p = make_cpu_with_fault(BackendSpec::parse("cpu:fault=perturb,fault_size=1e-3"));
    EXPECT_EQ(p->capabilities().node, "cpu:fault=perturb,fault_size=1e-3");
    const auto& extra = p->capabilities().extra;
    ASSERT_FALSE(extra.empty());
    EXPECT_EQ(extra.back().first, "fault");
    auto* fb = dynamic_cast<FaultBackend*>(p.get());
    ASSERT_NE(fb, nullptr);
    EXPECT_EQ(fb->fault().kind, FaultKind::perturb);
    EXPECT_DOUBLE_EQ(fb->fault().size, 1e-3);

    auto f16 = make_cpu_with_fault(BackendSpec::parse("cpu:acc=f16,fault=nan"));
    EXPECT_EQ(f16->capabilities().node, "cpu:acc=f16,fault=nan");
    EXPECT_EQ(f16->capabilities().accumulation, DType::f16);

    BackendSpec rest;
    const FaultSpec f = parse_fault_spec(BackendSpec::parse("cpu:acc=f16,fault=route,fault_token=3"), &rest);
    EXPECT_EQ(f.kind, FaultKind::route);
    EXPECT_EQ(f.token, 3);
    EXPECT_EQ(rest.canonical(), "cpu:acc=f16");

    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu:fault=bogus")); }, "backend 'cpu:fault=bogus': ",
                     "perturb, nan, route, bitflip, segv, hang, oom or internal");
    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu:fault_size=1e-3")); }, "backend 'cpu:fault_size=1e-3': ",
                     "without fault=");
    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu:fault=perturb,fault_size=2")); }, "backend ", "(0, 1]");
    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu:fault=perturb,fault_token=1")); }, "backend ",
                     "'fault_token' does not apply to fault=perturb");
    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu:fault=nan,fault_op=gemm")); }, "backend ", "fault_op must be");
    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu:fault=bitflip,fault_bit=x")); }, "backend ", "fault_bit");
    expect_bad_input([] { make_cpu_with_fault(BackendSpec::parse("cpu-ref:fault=nan")); }, "backend 'cpu-ref:fault=nan': ",
                     "cpu only");
}

TEST(Fault, PerturbHasExactlyTheRequestedRelativeSize) {
    const Tensor x = normal("x", {16, 256});
    const Tensor w = normal("w", {64, 256}, 1.0 / 16);
    const Tensor clean = cpu1()->matmul(x, w);
    for (const double size : {1e-3, 1e-1}) {
        auto f = faulty(fmt::format("fault=perturb,fault_size={}", size));
        const Tensor y = f->matmul(x, w);
        const CompareStats s = compare(clean, y);
        EXPECT_NEAR(s.max_rel, size, size * 1e-3) << size;  // ±size per element, up to f32 rounding
        EXPECT_NEAR(s.nmse, size * size, size * size * 1e-2);  // every element moved by exactly `size`
        EXPECT_FALSE(s.bit_identical);
        // Deterministic: a second node with the same spec injects the same noise.
        EXPECT_TRUE(bit_equal(y, faulty(fmt::format("fault=perturb,fault_size={}", size))->matmul(x, w)));
    }
    // Another seed, other signs.
    EXPECT_FALSE(bit_equal(faulty("fault=perturb,fault_seed=1")->matmul(x, w), faulty("fault=perturb,fault_seed=2")->matmul(x, w)));
    // Ops other than the target are untouched.
    const Tensor g = normal("g", {4, 64});
    EXPECT_TRUE(bit_equal(cpu1()->softmax(g), faulty("fault=perturb")->softmax(g)));
}

TEST(Fault, PerturbReachesTheExpertMatmulsOfTheMoeBlock) {
    const std::int64_t h = 32, inter = 16, e = 4;
    std::vector<Tensor> store;
    std::vector<ExpertWeights> experts;
    for (std::int64_t i = 0; i < e; ++i) {
        store.push_back(normal(fmt::format("g{}", i).c_str(), {inter, h}, 0.2));
        store.push_back(normal(fmt::format("u{}", i).c_str(), {inter, h}, 0.2));
        store.push_back(normal(fmt::format("d{}", i).c_str(), {h, inter}, 0.2));
    }
    for (std::int64_t i = 0; i < e; ++i) experts.push_back({store[3 * i].view(), store[3 * i + 1].view(), store[3 * i + 2].view()});
    const Tensor x = normal("x", {3, h});
    RoutingPlan plan{Tensor(DType::i32, {3, 2}), Tensor(DType::f32, {3, 2})};
    const int ids[6] = {0, 1, 2, 3, 1, 2};
    for (int i = 0; i < 6; ++i) {
        plan.ids.as<std::int32_t>()[i] = ids[i];
        plan.weights.set(i, 0.5);
    }
    const Tensor clean = cpu1()->moe_block(x, experts, plan);
    const CompareStats s = compare(clean, faulty("fault=perturb,fault_size=1e-2")->moe_block(x, experts, plan));
    EXPECT_FALSE(s.bit_identical);
    EXPECT_GT(s.max_rel, 1e-3);
    // A fault aimed elsewhere leaves the block bit-identical.
    EXPECT_TRUE(bit_equal(clean, faulty("fault=perturb,fault_op=softmax")->moe_block(x, experts, plan)));
}

TEST(Fault, NanAppearsAtOneElementOfOneCall) {
    const Tensor x = normal("x", {8, 32});
    const Tensor w = normal("w", {16, 32});
    auto f = faulty("fault=nan,fault_call=1,fault_index=5");
    const Tensor clean = cpu1()->matmul(x, w);
    const Tensor first = f->matmul(x, w);
    EXPECT_TRUE(bit_equal(clean, first));  // call 0 untouched
    const Tensor second = f->matmul(x, w);
    std::int64_t nans = 0;
    for (std::int64_t i = 0; i < second.numel(); ++i)
        if (std::isnan(second.at(i))) {
            ++nans;
            EXPECT_EQ(i, 5);
        } else {
            EXPECT_EQ(second.at(i), clean.at(i));
        }
    EXPECT_EQ(nans, 1);
    EXPECT_TRUE(bit_equal(clean, f->matmul(x, w)));  // one-shot
    const CompareStats s = compare(clean, second);
    EXPECT_EQ(s.nonfinite_mismatch, 1);
    EXPECT_FALSE(within(s.max_rel, 1e300));  // a poisoned comparison passes nothing
    ASSERT_EQ(dynamic_cast<FaultBackend*>(f.get())->injections().size(), 1u);
}

TEST(Fault, RouteChangesExactlyOneRowToItsNextExpert) {
    const Tensor logits = normal("router", {12, 16});
    RouterParams rp;
    rp.top_k = 4;
    const RouterOutput clean = cpu1()->route(logits, rp);
    auto f = faulty("fault=route,fault_token=3");
    const RouterOutput bad = f->route(logits, rp);
    const IndexAgreement a = compare_indices(clean.ids, bad.ids);
    EXPECT_EQ(a.rows, 12);
    EXPECT_EQ(a.exact_matches, 11);
    // The changed row is token 3, its last choice replaced by the (k+1)-th.
    RouterParams rp5 = rp;
    rp5.top_k = 5;
    const RouterOutput five = cpu1()->route(logits, rp5);
    for (std::int64_t t = 0; t < 12; ++t)
        for (std::int64_t j = 0; j < 4; ++j) {
            const std::int32_t want = (t == 3 && j == 3) ? five.ids.as<std::int32_t>()[t * 5 + 4] : clean.ids.as<std::int32_t>()[t * 4 + j];
            EXPECT_EQ(bad.ids.as<std::int32_t>()[t * 4 + j], want) << t << "," << j;
            if (t != 3) {
                EXPECT_EQ(bad.weights.at(t * 4 + j), clean.weights.at(t * 4 + j));
            }
        }
    double sum = 0;
    for (std::int64_t j = 0; j < 4; ++j) sum += bad.weights.at(3 * 4 + j);
    EXPECT_NEAR(sum, 1.0, 1e-6);  // still renormalised
    // Only call 0 is faulted.
    EXPECT_EQ(compare_indices(clean.ids, f->route(logits, rp).ids).exact_matches, 12);
    RouterParams all = rp;
    all.top_k = 16;
    expect_bad_input([&] { faulty("fault=route")->route(logits, all); }, "fault=route: top-16 of 16", "no (k+1)-th");
}

TEST(Fault, BitflipChangesOneWeightOnACopy) {
    const Tensor x = normal("x", {8, 32});
    const Tensor w = normal("w", {16, 32});
    const Tensor w_before = w;
    auto f = faulty("fault=bitflip,fault_index=37");
    const Tensor y = f->matmul(x, w);
    EXPECT_TRUE(bit_equal(w, w_before));  // the caller's weights are never written
    // Same result as a clean matmul with that one bit flipped by hand.
    Tensor flipped = w;
    std::uint32_t u;
    std::memcpy(&u, flipped.as<float>() + 37, 4);
    u ^= 1u << 22;  // default: top mantissa bit of f32
    std::memcpy(flipped.as<float>() + 37, &u, 4);
    EXPECT_NE(flipped.at(37), w.at(37));
    const auto clean = cpu1();
    EXPECT_TRUE(bit_equal(y, clean->matmul(x, flipped)));
    // Only output column 37 / K = 1 reads that weight.
    const Tensor ref = clean->matmul(x, w);
    for (std::int64_t t = 0; t < 8; ++t)
        for (std::int64_t n = 0; n < 16; ++n) {
            if (n == 1) {
                EXPECT_NE(y.at(t * 16 + n), ref.at(t * 16 + n));
            } else {
                EXPECT_EQ(y.at(t * 16 + n), ref.at(t * 16 + n));
            }
        }
    // Persistent corruption of that memory; other weights untouched.
    EXPECT_TRUE(bit_equal(f->matmul(x, w), y));
    const Tensor w2 = normal("w2", {16, 32});
    EXPECT_TRUE(bit_equal(f->matmul(x, w2), clean->matmul(x, w2)));
    expect_bad_input([&] { faulty("fault=bitflip,fault_bit=40")->matmul(x, w); }, "fault=bitflip: bit 40", "32-bit f32");
}
