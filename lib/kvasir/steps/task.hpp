// Protocol step 6, task level: a multiple-choice task scored by
// log-likelihood — the "eval score" beside perplexity — with
// lm-evaluation-harness's definitions, so a node's figure reads like the
// numbers model cards print.
//
// Items: a JSONL file, one object per line {"context": str, "choices": [str,
// …], "gold": int} (blank lines ignored). Each (context, choice) is encoded
// as lm-eval's `_encode_pair` does: trailing whitespace of the context moves
// to the front of the continuation; whole = encode(context + continuation),
// ctx = encode(context), the continuation's tokens = whole[len(ctx):] (no
// special tokens added, as lm-eval's loglikelihood requests). One forward
// pass over (whole)[:-1] from an empty cache; the choice's log-likelihood is
// the f64 sum of log softmax(logits[t])[whole[t+1]] over the continuation's
// positions. Per node:
//   acc       = mean over items of [argmax_i ll_i == gold]
//   acc_norm  = the same with ll_i / (characters of choice i: lm-eval divides by
//               len(choice), a Python string's length in code points)
//   stderr    = sample standard deviation / √n  = √(p(1 − p) / (n − 1))
// argmax takes the first of equal values (numpy's). Against the reference:
// accuracy ratios (MLPerf's "≥ 99 % of the reference accuracy"), the share
// of items where the node chose the reference's answer (agreement; rates
// with confidence bounds in an audit), and the largest |Δ ll| of any choice.
//
// Routing is pinned by the reference (router authority) per pass by
// default, as in perplexity.
#pragma once

#include "kvasir/model/tokenizer.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

struct TaskItem {
    std::string context;
    std::vector<std::string> choices;
    std::int64_t gold = 0;
};

// Parses the JSONL item file. Untrusted: at most 100 000 items, 2 … 64
// choices each, every string ≤ 64 KiB of valid UTF-8, gold in range;
// Error(bad_input) "<source>:<line>: …" otherwise, and for unknown keys.
std::vector<TaskItem> parse_task_items(std::string_view jsonl, const std::string& source);

// One (context, choice) request as scored: `ids` = the whole sequence,
// `continuation` = how many of its last ids are the choice's.
struct TaskRequest {
    std::vector<std::int32_t> ids;
    std::size_t continuation = 0;
    std::size_t chars = 0;  // Unicode code points of the choice as written (acc_norm)
};
// lm-eval's _encode_pair for every choice of every item (items × choices).
// Error(bad_input) naming the item when a continuation gives no tokens.
std::vector<std::vector<TaskRequest>> encode_task(const Tokenizer& tokenizer, const std::vector<TaskItem>& items);

struct TaskConfig : StepCommon {
    std::vector<TaskItem> items;
    std::vector<std::vector<TaskRequest>> requests;  // encode_task(items)
    std::string source;          // "FILE (sha256 …, N items)"
    bool router_authority = true;
    void validate() const;       // items and requests agree; ids within the vocabulary; StepCommon::validate
};

// Builds a config from an item file (read here) and a tokenizer; tokens (for
// StepCommon and the memory estimate) is the longest request. The second
// form takes the file's text already read (an audit checks its sha256 first).
TaskConfig make_task_config(const Model& model, const std::string& items_path, const Tokenizer& tokenizer);
TaskConfig make_task_config(const Model& model, const std::string& items_text, const std::string& items_path,
                            const Tokenizer& tokenizer);

// One node's scores.
struct TaskScores {
    std::vector<std::vector<double>> ll;  // per item, per choice
    std::vector<std::int64_t> chosen, chosen_norm;
    double acc = 0, acc_norm = 0, acc_stderr = 0, acc_norm_stderr = 0;
};
// Scores from log-likelihoods (pure, for tests and compare).
TaskScores score_task(const std::vector<std::vector<double>>& ll, const std::vector<TaskItem>& items,
                      const std::vector<std::vector<TaskRequest>>& requests);

// A node's scores against the reference's (pure; the audit step judges
// through it): accuracy ratios (1 when both are 0, +inf
// when only the reference's is), the items whose chosen answer is the
// reference's, and the largest |ll − ll_ref| over every choice (NaN-sticky).
// Error(bad_input) when the two were scored on different tasks.
struct TaskComparison {
    double acc_ratio = 1, acc_norm_ratio = 1;
    std::int64_t agree = 0, agree_norm = 0;
    double ll_max_abs_delta = 0;
};
TaskComparison compare_task(const TaskScores& reference, const TaskScores& candidate);

// The passes on one node; `authority` (the reference's routing per request,
// items × choices flattened) pins its routing, or null.
struct TaskPass {
    std::vector<std::vector<double>> ll;
    std::vector<std::vector<RoutingPlan>> routing;  // per request, in order
};
TaskPass run_task_passes(Backend& backend, const TaskConfig& config, const TaskPass* authority);

}  // namespace kvasir
