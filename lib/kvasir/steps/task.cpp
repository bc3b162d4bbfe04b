#include "kvasir/steps/task.hpp"

#include "kvasir/arch/graph.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvasir {

namespace {

constexpr std::size_t kMaxItems = 100000;
constexpr std::size_t kMaxChoices = 64;
constexpr std::size_t kMaxString = 64u << 10;

std::size_t argmax_first(const std::vector<double>& v) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < v.size(); ++i)
        if (v[i] > v[best] || (std::isnan(v[i]) && !std::isnan(v[best]))) best = i;  // numpy: NaN is the max
    return best;
}

double stderr_of(double p, std::size_t n) { return n > 1 ? std::sqrt(p * (1 - p) / static_cast<double>(n - 1)) : 0.0; }

}  // namespace

std::vector<TaskItem> parse_task_items(std::string_view text, const std::string& source) {
    std::vector<TaskItem> items;
    std::size_t line_no = 0;
    for (std::size_t pos = 0; pos <= text.size();) {
        const std::size_t nl = std::min(text.find('\n', pos), text.size());
        const std::string_view line = text.substr(pos, nl - pos);
        pos = nl + 1;
        ++line_no;
        if (std::all_of(line.begin(), line.end(), is_ascii_space)) {
            if (nl == text.size()) break;
            continue;
        }
        const auto bad = [&](const std::string& what) { fail(ErrorCode::bad_input, "{}:{}: {}", source, line_no, what); };
        KVASIR_CHECK(items.size() < kMaxItems, ErrorCode::bad_input, "{}:{}: more than {} items", source, line_no, kMaxItems);
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) bad("expected one JSON object per line");
        for (const auto& item : j.items())
            if (item.key() != "context" && item.key() != "choices" && item.key() != "gold")
                bad(fmt::format("unknown key \"{}\" (an item has context, choices and gold)", item.key()));
        const auto str = [&](const nlohmann::json& v, const std::string& what) {
            if (!v.is_string()) bad(fmt::format("{} must be a string", what));
            const std::string& s = v.get_ref<const std::string&>();
            if (s.size() > kMaxString) bad(fmt::format("{} is {} bytes (at most {})", what, s.size(), kMaxString));
            if (first_invalid_utf8(s)) bad(fmt::format("{} is not valid UTF-8", what));
            return s;
        };
        TaskItem it;
        if (!j.contains("context")) bad("no \"context\"");
        it.context = str(j["context"], "context");
        if (!j.contains("choices") || !j["choices"].is_array()) bad("\"choices\" must be an array of strings");
        const auto& ch = j["choices"];
        if (ch.size() < 2 || ch.size() > kMaxChoices) bad(fmt::format("{} choices (2 … {})", ch.size(), kMaxChoices));
        for (std::size_t c = 0; c < ch.size(); ++c) {
            it.choices.push_back(str(ch[c], fmt::format("choice {}", c)));
            if (it.choices.back().empty()) bad(fmt::format("choice {} is empty", c));
        }
        if (!j.contains("gold") || !j["gold"].is_number_integer()) bad("\"gold\" must be an integer index into choices");
        const auto g = j["gold"].get<std::int64_t>();
        if (g < 0 || g >= static_cast<std::int64_t>(it.choices.size()))
            bad(fmt::format("gold {} is outside the {} choices", g, it.choices.size()));
        it.gold = g;
        items.push_back(std::move(it));
        if (nl == text.size()) break;
    }
    KVASIR_CHECK(!items.empty(), ErrorCode::bad_input, "{}: no items", source);
    return items;
}

std::vector<std::vector<TaskRequest>> encode_task(const Tokenizer& tok, const std::vector<TaskItem>& items) {
    std::vector<std::vector<TaskRequest>> out;
    out.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
        const TaskItem& it = items[i];
        // lm-eval _encode_pair: the context's trailing whitespace goes with the continuation.
        std::size_t k = it.context.size();
        while (k > 0 && is_ascii_space(it.context[k - 1])) --k;
        const std::string context = it.context.substr(0, k), moved = it.context.substr(k);
        const std::vector<std::int32_t> ctx = tok.encode(context, false);  // the same for every choice
        std::vector<TaskRequest> reqs;
        for (std::size_t c = 0; c < it.choices.size(); ++c) {
            const std::vector<std::int32_t> whole = tok.encode(context + moved + it.choices[c], false);
            KVASIR_CHECK(whole.size() > ctx.size() && !ctx.empty(), ErrorCode::bad_input,
                         "task item {} choice {}: {} (lm-eval scores a continuation after a non-empty context)", i, c,
                         ctx.empty() ? "the context gives no tokens" : "the choice gives no tokens of its own");
            TaskRequest r;
            r.continuation = whole.size() - ctx.size();
            r.ids = whole;
            r.chars = static_cast<std::size_t>(std::count_if(it.choices[c].begin(), it.choices[c].end(),
                                                            [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; }));
            reqs.push_back(std::move(r));
        }
        out.push_back(std::move(reqs));
    }
    return out;
}

void TaskConfig::validate() const {
    StepCommon::validate();
    KVASIR_CHECK(!items.empty() && items.size() == requests.size(), ErrorCode::bad_input, "task {}: items and requests disagree",
                 source);
    const std::int64_t vocab = model->config().vocab_size;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        KVASIR_CHECK(requests[i].size() == items[i].choices.size(), ErrorCode::bad_input, "task {}: item {} choices disagree", source, i);
        for (const TaskRequest& r : requests[i])
            for (const std::int32_t id : r.ids)
                KVASIR_CHECK(id >= 0 && id < vocab, ErrorCode::bad_input,
                             "task {}: item {} gives token {}, outside the vocabulary [0, {}) of {} (is the tokenizer this model's?)",
                             source, i, id, vocab, model->path());
    }
}

TaskConfig make_task_config(const Model& model, const std::string& items_path, const Tokenizer& tokenizer) {
    return make_task_config(model, read_text_file(items_path), items_path, tokenizer);
}

TaskConfig make_task_config(const Model& model, const std::string& text, const std::string& items_path,
                            const Tokenizer& tokenizer) {
    TaskConfig c;
    c.model = &model;
    c.items = parse_task_items(text, items_path);
    c.requests = encode_task(tokenizer, c.items);
    c.source = fmt::format("{} (sha256 {}, {} items, tokenizer {})", items_path, sha256_hex(text), c.items.size(), tokenizer.source());
    const TaskRequest* longest = nullptr;
    for (const auto& rs : c.requests)
        for (const TaskRequest& r : rs)
            if (!longest || r.ids.size() > longest->ids.size()) longest = &r;
    c.tokens.ids = longest->ids;
    c.tokens.source = "the longest task request of " + c.source;
    return c;
}

TaskScores score_task(const std::vector<std::vector<double>>& ll, const std::vector<TaskItem>& items,
                      const std::vector<std::vector<TaskRequest>>& requests) {
    KVASIR_ASSERT(ll.size() == items.size() && requests.size() == items.size());
    TaskScores s;
    s.ll = ll;
    std::size_t hit = 0, hit_norm = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
        std::vector<double> norm(ll[i].size());
        for (std::size_t c = 0; c < ll[i].size(); ++c) norm[c] = ll[i][c] / static_cast<double>(requests[i][c].chars);
        const auto a = static_cast<std::int64_t>(argmax_first(ll[i])), b = static_cast<std::int64_t>(argmax_first(norm));
        s.chosen.push_back(a);
        s.chosen_norm.push_back(b);
        hit += a == items[i].gold;
        hit_norm += b == items[i].gold;
    }
    const auto n = items.size();
    s.acc = static_cast<double>(hit) / static_cast<double>(n);
    s.acc_norm = static_cast<double>(hit_norm) / static_cast<double>(n);
    s.acc_stderr = stderr_of(s.acc, n);
    s.acc_norm_stderr = stderr_of(s.acc_norm, n);
    return s;
}

namespace {

// Rows [r0, r0 + n) of every MoE layer's plan (dense layers stay empty).
std::vector<RoutingPlan> plan_rows(const ModelConfig& mc, const std::vector<RoutingPlan>& plan, std::int64_t r0, std::int64_t n) {
    std::vector<RoutingPlan> out(plan.size());
    for (std::size_t l = 0; l < plan.size(); ++l)
        if (mc.is_moe(static_cast<std::int64_t>(l))) {
            KVASIR_CHECK(plan[l].ids.view().rank() == 2 && plan[l].weights.shape() == plan[l].ids.shape() &&
                             r0 + n <= plan[l].ids.dim(0),
                         ErrorCode::bad_input, "task: the authority's routing of layer {} has {} rows, rows [{}, {}) asked", l,
                         plan[l].ids.view().rank() == 2 ? plan[l].ids.dim(0) : 0, r0, r0 + n);
            out[l] = RoutingPlan{arch::leading_rows(plan[l].ids, r0, n), arch::leading_rows(plan[l].weights, r0, n)};
        }
    return out;
}

// Each MoE layer's plan of `a` followed by the rows of `b`.
std::vector<RoutingPlan> plan_concat(const ModelConfig& mc, const std::vector<RoutingPlan>& a, const std::vector<RoutingPlan>& b) {
    std::vector<RoutingPlan> out(b.size());
    for (std::size_t l = 0; l < b.size(); ++l)
        if (mc.is_moe(static_cast<std::int64_t>(l)))
            out[l] = a.empty() ? b[l]
                               : RoutingPlan{arch::stack_rows({a[l].ids, b[l].ids}), arch::stack_rows({a[l].weights, b[l].weights})};
    return out;
}

}  // namespace

TaskPass run_task_passes(Backend& be, const TaskConfig& c, const TaskPass* authority) {
    // The choices of an item share their context: its tokens run once into
    // the KV cache, then each choice's own tokens run from there (Decoder
    // mark / rewind), as a serving node with prefix caching scores them.
    // Every scored position (the last context token's onwards) is in a
    // choice's own step. A node that is prefill/decode-identical gives the
    // bits of scoring each request in one pass.
    const ModelConfig& mc = c.model->config();
    TaskPass p;
    Decoder dec(be, *c.model);
    std::size_t k = 0;
    for (const auto& rs : c.requests) {
        std::size_t common = rs.front().ids.size() - 1 - rs.front().continuation;
        for (const TaskRequest& r : rs) {
            common = std::min(common, r.ids.size() - 1 - r.continuation);
            std::size_t same = 0;
            while (same < common && r.ids[same] == rs.front().ids[same]) ++same;
            common = same;
        }
        const auto prefix_rows = static_cast<std::int64_t>(common);
        dec.reset();
        std::vector<RoutingPlan> prefix_routing;
        if (common > 0) {
            std::vector<RoutingPlan> pin;
            if (authority != nullptr) pin = plan_rows(mc, authority->routing.at(k), 0, prefix_rows);
            // No position of the prefix is scored: its logits are not computed.
            dec.advance(std::span<const std::int32_t>(rs.front().ids.data(), common), authority != nullptr ? &pin : nullptr);
            prefix_routing = dec.last_routing();
        }
        const Decoder::Mark at = dec.mark();
        std::vector<double> lls;
        for (const TaskRequest& r : rs) {
            dec.rewind(at);
            const auto rows = static_cast<std::int64_t>(r.ids.size() - 1) - prefix_rows;
            std::vector<RoutingPlan> pin;
            if (authority != nullptr) pin = plan_rows(mc, authority->routing.at(k), prefix_rows, rows);
            const Tensor logits = dec.step(std::span<const std::int32_t>(r.ids.data() + common, static_cast<std::size_t>(rows)),
                                           authority != nullptr ? &pin : nullptr);
            const std::vector<double> nll = token_nll(logits, std::span<const std::int32_t>(r.ids).subspan(common + 1));
            double sum = 0;
            for (std::size_t t = nll.size() - r.continuation; t < nll.size(); ++t) sum -= nll[t];
            lls.push_back(sum);
            p.routing.push_back(plan_concat(mc, prefix_routing, dec.last_routing()));
            ++k;
        }
        p.ll.push_back(std::move(lls));
    }
    return p;
}

TaskComparison compare_task(const TaskScores& ref, const TaskScores& cand) {
    KVASIR_CHECK(ref.ll.size() == cand.ll.size(), ErrorCode::bad_input, "task scores of {} and {} items", ref.ll.size(),
                 cand.ll.size());
    const auto ratio = [](double a, double r) { return r > 0 ? a / r : a > 0 ? std::numeric_limits<double>::infinity() : 1.0; };
    TaskComparison t;
    t.acc_ratio = ratio(cand.acc, ref.acc);
    t.acc_norm_ratio = ratio(cand.acc_norm, ref.acc_norm);
    for (std::size_t k = 0; k < ref.ll.size(); ++k) {
        KVASIR_CHECK(ref.ll[k].size() == cand.ll[k].size(), ErrorCode::bad_input, "task item {}: {} and {} choices", k,
                     ref.ll[k].size(), cand.ll[k].size());
        t.agree += cand.chosen[k] == ref.chosen[k];
        t.agree_norm += cand.chosen_norm[k] == ref.chosen_norm[k];
        for (std::size_t c = 0; c < ref.ll[k].size(); ++c) {
            t.ll_max_abs_delta = nan_max(t.ll_max_abs_delta, std::fabs(cand.ll[k][c] - ref.ll[k][c]));
        }
    }
    return t;
}

}  // namespace kvasir
