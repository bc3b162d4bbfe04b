// The trained fixtures (scripts/train_fixture.py): fixtures/models/qwen3_moe_trained
// and fixtures/models/qwen3_5_moe_trained (--arch qwen3_5_moe, the hybrid: Gated
// DeltaNet + gated attention; same tokenizer, held-out text and cloze task). For
// each: its tokenizer, text perplexity and cloze task score as the tool computes
// them, against what Hugging Face tokenizers and transformers computed
// (text_reference.json): ids identical, cpu-ref's perplexity, every choice's
// log-likelihood and the accuracies equal transformers' float64 to ≤ 1e-9
// relative (the answers exactly), cpu's float32 close to transformers'
// float32.
#include "kvasir/audit/step_view.hpp"
#include "kvasir/backend/cpu_backends.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/tokenizer.hpp"
#include "kvasir/steps/forward.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/task.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace kvasir;
namespace fs = std::filesystem;

const fs::path kRoot = fs::path(KVASIR_SOURCE_DIR);

// One fixture per test instance: the folder, its text_reference.json and its model, loaded once.
struct Fixture {
    fs::path dir;
    nlohmann::json reference;
    Model model;
};

const Fixture& fixture(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Fixture>> cache;
    auto& f = cache[name];
    if (!f) {
        const fs::path dir = kRoot / "fixtures/models" / name;
        f = std::make_unique<Fixture>(Fixture{
            dir, nlohmann::json::parse(read_text_file((dir / "text_reference.json").string())),
            Model::open(dir.string())});
    }
    return *f;
}

class TrainedFixture : public ::testing::TestWithParam<std::string> {
protected:
    const Fixture& fx() const { return fixture(GetParam()); }
    const fs::path& dir() const { return fx().dir; }
    const nlohmann::json& reference() const { return fx().reference; }
    const Model& model() const { return fx().model; }
};

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

std::vector<std::unique_ptr<Backend>> nodes() {
    std::vector<std::unique_ptr<Backend>> n;
    n.push_back(make_cpu_ref_backend(BackendSpec::parse("cpu-ref")));
    n.push_back(make_cpu_backend(BackendSpec::parse("cpu")));
    return n;
}

TEST_P(TrainedFixture, TokenizerGivesTokenizersIdsForTheHeldOutText) {
    const nlohmann::json& p = reference().at("perplexity");
    const std::string text = read_text_file((kRoot / p.at("text_file").get<std::string>()).string());
    const Tokenizer tok = load_tokenizer_for(dir().string());
    EXPECT_EQ(tok.encode(text), p.at("token_ids").get<std::vector<std::int32_t>>());
    EXPECT_EQ(tok.vocab_size(), model().config().vocab_size);
}

TEST_P(TrainedFixture, PerplexityEqualsTransformersFloat64) {
    const nlohmann::json& p = reference().at("perplexity");
    for (const std::int64_t context : {64, 128}) {
        SCOPED_TRACE(context);
        const nlohmann::json& want = p.at("contexts").at(std::to_string(context));
        // `kvasir-equiv perplexity --context C` on the held-out text's ids: the audit's perplexity step.
        const TokenSequence tokens{p.at("token_ids").get<std::vector<std::int32_t>>(), "held-out text"};
        const Protocol view = view_protocol(load_protocol((kRoot / "protocols/default.json").string()),
                                            StepView{"perplexity", false, {}, [context](Protocol& pr) { pr.perplexity.context = context; }},
                                            tokens);
        auto n = nodes();
        const nlohmann::ordered_json r =
            run_view(view, model(), tokens, n, 0, Gate::none, 1).report.steps.at("perplexity");
        const auto num = [](const nlohmann::ordered_json& v) { return v.get<double>(); };
        const double ref_ppl = num(r["reference_perplexity"]), cpu_ppl = num(r["results"][0]["perplexity"]);
        EXPECT_EQ(r["predictions"].get<std::int64_t>(), want.at("n_predictions").get<std::int64_t>());
        EXPECT_LE(rel(num(r["reference_mean_nll"]), want.at("f64").at("mean_nll").get<double>()), 1e-9);
        EXPECT_LE(rel(ref_ppl, want.at("f64").at("perplexity").get<double>()), 1e-9);
        // cpu (f32) against transformers' float32: both f32 arithmetic, different reduction orders.
        EXPECT_LE(rel(num(r["results"][0]["mean_nll"]), want.at("f32").at("mean_nll").get<double>()), 1e-5);
        // A trained model: far below the vocabulary size (a uniform guess scores exactly V).
        EXPECT_LT(ref_ppl, 0.1 * static_cast<double>(model().config().vocab_size));
        // The measured differences, for the record (test XML and stdout).
        const double d64 = rel(ref_ppl, want.at("f64").at("perplexity").get<double>());
        const double d32 = rel(cpu_ppl, want.at("f32").at("perplexity").get<double>());
        RecordProperty("ppl" + std::to_string(context) + "_rel_cpu_ref_vs_f64", std::to_string(d64));
        RecordProperty("ppl" + std::to_string(context) + "_rel_cpu_vs_f32", std::to_string(d32));
        std::printf("%s context %lld: perplexity cpu-ref %.10g (rel vs transformers f64 %.3e), cpu %.10g (rel vs "
                    "f32 %.3e)\n", GetParam().c_str(), static_cast<long long>(context), ref_ppl, d64, cpu_ppl, d32);
    }
}

TEST_P(TrainedFixture, ClozeTaskEqualsTransformersFloat64) {
    const nlohmann::json& t = reference().at("cloze");
    const Tokenizer tok = load_tokenizer_for(dir().string());
    TaskConfig c = make_task_config(model(), (kRoot / t.at("task_file").get<std::string>()).string(), tok);
    const nlohmann::json& items = t.at("items");
    ASSERT_EQ(c.items.size(), items.size());
    // lm-eval's _encode_pair, request by request.
    for (std::size_t i = 0; i < items.size(); ++i) {
        const auto ctx = items[i].at("ctx_ids").get<std::vector<std::int32_t>>();
        for (std::size_t k = 0; k < c.requests[i].size(); ++k) {
            auto whole = ctx;
            const auto cont = items[i].at("choices").at(k).at("cont_ids").get<std::vector<std::int32_t>>();
            whole.insert(whole.end(), cont.begin(), cont.end());
            ASSERT_EQ(c.requests[i][k].ids, whole) << "item " << i << " choice " << k;
            ASSERT_EQ(c.requests[i][k].continuation, cont.size());
            ASSERT_EQ(c.requests[i][k].chars, items[i].at("choices").at(k).at("n_chars").get<std::size_t>());
        }
    }
    // The passes and scoring the audit's task step runs (its view, the task command, compares what
    // score_task gives; the figures per choice are checked here).
    auto n = nodes();
    const TaskPass ref = run_task_passes(*n[0], c, nullptr);
    const TaskScores s = score_task(ref.ll, c.items, c.requests);
    const TaskScores s32 = score_task(run_task_passes(*n[1], c, &ref).ll, c.items, c.requests);
    double worst = 0, worst32 = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
        for (std::size_t k = 0; k < s.ll[i].size(); ++k) {
            const nlohmann::json& ch = items[i].at("choices").at(k);
            worst = std::max(worst, rel(s.ll[i][k], ch.at("ll_f64").get<double>()));
            worst32 = std::max(worst32, rel(s32.ll[i][k], ch.at("ll_f32").get<double>()));
        }
        EXPECT_EQ(s.chosen[i], items[i].at("pred_f64").get<std::int64_t>()) << "item " << i;
        EXPECT_EQ(s.chosen_norm[i], items[i].at("pred_norm_f64").get<std::int64_t>()) << "item " << i;
    }
    EXPECT_LE(worst, 1e-9) << "largest relative |Δ ll| of cpu-ref against transformers float64";
    EXPECT_LE(worst32, 1e-5) << "largest relative |Δ ll| of cpu against transformers float32";
    RecordProperty("cloze_ll_max_rel_cpu_ref_vs_f64", std::to_string(worst));
    RecordProperty("cloze_ll_max_rel_cpu_vs_f32", std::to_string(worst32));
    std::printf("%s cloze: max rel |Δ ll| cpu-ref vs transformers f64 %.3e, cpu vs f32 %.3e; acc %.4f acc_norm %.4f\n",
                GetParam().c_str(), worst, worst32, s.acc, s.acc_norm);
    EXPECT_DOUBLE_EQ(s.acc, t.at("f64").at("acc").get<double>());
    EXPECT_DOUBLE_EQ(s.acc_norm, t.at("f64").at("acc_norm").get<double>());
    EXPECT_NEAR(s.acc_stderr, t.at("f64").at("acc_stderr").get<double>(), 1e-15);
    // Clearly above chance (1 / choices), by more than 3 standard errors.
    const double chance = 1.0 / static_cast<double>(c.items.front().choices.size());
    EXPECT_GT(s.acc - chance, 3 * s.acc_stderr);
    // The f32 node against the reference: same answers on (nearly) every item.
    EXPECT_GE(compare_task(s, s32).agree, static_cast<std::int64_t>(items.size()) - 2);
}

// The task step shares each item's context among its choices (the KV cache,
// Decoder mark / rewind). Against scoring every request in one full forward
// pass: cpu-ref within 1e-12 relative (its decode and prefill sum in the same
// order up to the f64 rounding of the cache), cpu within f32's reordering;
// the routing returned per request covers all its rows, and a node pinned to
// the authority's routing replays it row for row.
TEST_P(TrainedFixture, SharedContextScoringEqualsOnePassPerRequest) {
    const Tokenizer tok = load_tokenizer_for(dir().string());
    TaskConfig c = make_task_config(model(), (kRoot / reference().at("cloze").at("task_file").get<std::string>()).string(), tok);
    c.items.resize(24);
    c.requests.resize(24);
    auto n = nodes();
    const TaskPass ref = run_task_passes(*n[0], c, nullptr);
    const TaskPass cpu = run_task_passes(*n[1], c, &ref);
    double worst_ref = 0, worst_cpu = 0;
    std::size_t k = 0;
    for (std::size_t i = 0; i < c.requests.size(); ++i)
        for (std::size_t j = 0; j < c.requests[i].size(); ++j, ++k) {
            const TaskRequest& r = c.requests[i][j];
            const std::span<const std::int32_t> in(r.ids.data(), r.ids.size() - 1);
            double one[2];
            for (int b = 0; b < 2; ++b) {
                ForwardOptions opt;
                opt.keep_hidden = false;
                if (b == 1) opt.routing = &ref.routing[k];
                const ForwardResult fr = forward(*n[static_cast<std::size_t>(b)], model(), in, opt);
                const std::vector<double> nll = token_nll(fr.logits, std::span<const std::int32_t>(r.ids).subspan(1));
                one[b] = 0;
                for (std::size_t t = nll.size() - r.continuation; t < nll.size(); ++t) one[b] -= nll[t];
            }
            worst_ref = std::max(worst_ref, rel(ref.ll[i][j], one[0]));
            worst_cpu = std::max(worst_cpu, rel(cpu.ll[i][j], one[1]));
            for (std::size_t l = 0; l < ref.routing[k].size(); ++l)
                if (model().config().is_moe(static_cast<std::int64_t>(l))) {
                    ASSERT_EQ(ref.routing[k][l].ids.dim(0), static_cast<std::int64_t>(in.size())) << "request " << k;
                    ASSERT_EQ(cpu.routing[k][l].ids.nbytes(), ref.routing[k][l].ids.nbytes());
                    EXPECT_EQ(std::memcmp(cpu.routing[k][l].ids.raw(), ref.routing[k][l].ids.raw(), ref.routing[k][l].ids.nbytes()), 0)
                        << "the pinned node's routing is the authority's";
                }
        }
    std::printf("%s shared-context scoring vs one pass per request: max rel |Δ ll| cpu-ref %.3e, cpu %.3e\n",
                GetParam().c_str(), worst_ref, worst_cpu);
    EXPECT_LE(worst_ref, 1e-12);
    EXPECT_LE(worst_cpu, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainedFixture,
                         ::testing::Values("qwen3_moe_trained", "qwen3_5_moe_trained"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
