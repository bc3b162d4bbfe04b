// The task score (steps/task.hpp): lm-eval's scoring by hand on made-up
// log-likelihoods, its _encode_pair on a real tokenizer, the item file's
// refusals (the trained fixture's scores against transformers:
// test_trained_fixture.cpp).
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/steps/task.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace kvasir;
namespace fs = std::filesystem;

const fs::path kRoot = fs::path(KVASIR_SOURCE_DIR);

std::vector<TaskRequest> reqs(std::initializer_list<std::size_t> chars) {
    std::vector<TaskRequest> r;
    for (const std::size_t b : chars) {
        TaskRequest q;
        q.chars = b;
        r.push_back(q);
    }
    return r;
}

TEST(TaskScore, AccAndAccNormByHand) {
    // Three items. Item 0: ll (−2, −3) gold 0 → acc hit; per character (−2/4, −3/12 = −0.25) → acc_norm picks 1, miss.
    // Item 1: ll (−5, −1, −4) gold 1 → hit; per character (−5, −0.5, −4) → hit.
    // Item 2: a tie (−1, −1) gold 1 → argmax takes the first (0): miss; per character (−1/1, −1/2) → 1, hit.
    const std::vector<TaskItem> items = {{"c", {"x", "y"}, 0}, {"c", {"x", "y", "z"}, 1}, {"c", {"x", "y"}, 1}};
    const std::vector<std::vector<TaskRequest>> r = {reqs({4, 12}), reqs({1, 2, 1}), reqs({1, 2})};
    const TaskScores s = score_task({{-2, -3}, {-5, -1, -4}, {-1, -1}}, items, r);
    EXPECT_EQ(s.chosen, (std::vector<std::int64_t>{0, 1, 0}));
    EXPECT_EQ(s.chosen_norm, (std::vector<std::int64_t>{1, 1, 1}));
    EXPECT_DOUBLE_EQ(s.acc, 2.0 / 3.0);
    EXPECT_DOUBLE_EQ(s.acc_norm, 2.0 / 3.0);
    // lm-eval's stderr: sample standard deviation / √n = √(p(1−p)/(n−1)) = √((2/3)(1/3)/2) = 1/3.
    EXPECT_NEAR(s.acc_stderr, 1.0 / 3.0, 1e-15);
}

TEST(TaskScore, EncodePairMovesTheContextsTrailingSpaceToTheContinuation) {
    const Tokenizer tok = Tokenizer::load((kRoot / "fixtures/tokenizers/qwen2_style.json").string());
    const std::vector<TaskItem> items = {{"The quick brown fox ", {"jumps", "sleeps ovér"}, 0}};
    const auto r = encode_task(tok, items);
    ASSERT_EQ(r.size(), 1u);
    ASSERT_EQ(r[0].size(), 2u);
    // whole = encode("The quick brown fox" + " jumps"), ctx = encode("The quick brown fox").
    const auto ctx = tok.encode("The quick brown fox", false);
    const auto whole = tok.encode("The quick brown fox jumps", false);
    EXPECT_EQ(r[0][0].ids, whole);
    EXPECT_EQ(r[0][0].continuation, whole.size() - ctx.size());
    EXPECT_EQ(std::vector<std::int32_t>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(ctx.size())), ctx);
    EXPECT_EQ(r[0][0].chars, 5u);   // "jumps" as written, without the moved space (lm-eval: len(choice))
    EXPECT_EQ(r[0][1].chars, 11u);  // characters, not the 12 UTF-8 bytes
}

TEST(TaskScore, ComparisonWithTheReferenceByHand) {
    const std::vector<TaskItem> items = {{"c", {"x", "y"}, 0}, {"c", {"x", "y"}, 1}};
    const std::vector<std::vector<TaskRequest>> r = {reqs({1, 1}), reqs({1, 1})};
    const TaskScores ref = score_task({{-1, -2}, {-3, -1}}, items, r);   // chooses 0, 1: acc 1
    const TaskScores cand = score_task({{-1.5, -2}, {-1, -3}}, items, r);  // chooses 0, 0: acc 0.5
    const TaskComparison v = compare_task(ref, cand);
    EXPECT_DOUBLE_EQ(v.acc_ratio, 0.5);
    EXPECT_EQ(v.agree, 1);
    EXPECT_DOUBLE_EQ(v.ll_max_abs_delta, 2.0);  // item 1: |−1 − (−3)|
    // Ratios when the reference scores 0: 1 if the node does too, +inf otherwise.
    const TaskScores zero = score_task({{-2, -1}, {-1, -2}}, items, r);
    EXPECT_DOUBLE_EQ(compare_task(zero, zero).acc_ratio, 1.0);
    EXPECT_TRUE(std::isinf(compare_task(zero, ref).acc_ratio));
    // NaN never passes for a small delta: it sticks.
    const TaskScores nan = score_task({{std::nan(""), -2}, {-3, -1}}, items, r);
    EXPECT_TRUE(std::isnan(compare_task(ref, nan).ll_max_abs_delta));
    EXPECT_THROW(compare_task(ref, score_task({{-1, -2}}, {items[0]}, {r[0]})), Error);
}

void expect_bad(const std::string& jsonl, const std::string& fragment) {
    try {
        (void)parse_task_items(jsonl, "t.jsonl");
        ADD_FAILURE() << "accepted: " << jsonl;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input);
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.what()).rfind("t.jsonl", 0), 0u) << e.what();
    }
}

TEST(TaskItems, ParsedLineByLineAndRefusedNamingTheLine) {
    const auto items = parse_task_items("{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"gold\": 1}\n\n"
                                        "{\"context\": \"d\", \"choices\": [\" e\", \" f\", \" g\"], \"gold\": 0}\n",
                                        "t.jsonl");
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[1].choices.size(), 3u);
    EXPECT_EQ(items[0].gold, 1);
    expect_bad("", "no items");
    expect_bad("{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 2}", "t.jsonl:1: gold 2 is outside the 2 choices");
    expect_bad("\n{\"context\": \"a\", \"choices\": [\"b\"], \"gold\": 0}", "t.jsonl:2: 1 choices");
    expect_bad("{\"context\": \"a\", \"choices\": [\"b\", \"\"], \"gold\": 0}", "choice 1 is empty");
    expect_bad("{\"context\": 3, \"choices\": [\"b\", \"c\"], \"gold\": 0}", "context must be a string");
    expect_bad("{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 0, \"label\": 1}", "unknown key \"label\"");
    expect_bad("not json", "t.jsonl:1: expected one JSON object per line");
    expect_bad("{\"context\": \"a\", \"choices\": [\"b\", \"c\"]}", "\"gold\" must be an integer");
}

}  // namespace
