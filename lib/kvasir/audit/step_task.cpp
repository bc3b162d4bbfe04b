// Step 6's task score as an audit step (steps/task.hpp explains the scoring;
// the task command is this step's view: step_view.hpp): the protocol's JSONL
// items (sha256-pinned) tokenized by the model's own tokenizer.json (or the
// run's --tokenizer), every (item, choice) request one forward pass with the
// authority's routing imposed (unless the protocol's task.router_authority
// is false), scored with lm-eval's acc / acc_norm.
//
// Tensors (each node carries the task's shape, so compare needs no plan and
// a capture is self-contained): task.ll [R] f64 (every choice's
// log-likelihood, items in order, choices in order), task.choices [I] i32
// (choices per item), task.gold [I] i32, task.chars [R] i32 (characters of
// each choice: acc_norm's divisor).
//
// Criteria: task.acc_ratio_min (the node's acc / the reference's),
// task.agreement_min (items whose acc answer is the reference's: a rate,
// judged on its confidence bound), task.ll_max_abs_delta_max (optional).
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/audit/step_task.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/core/sha256.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/model/model.hpp"

#include <cmath>
#include <memory>

namespace kvasir {

namespace {

// The task's shape and scores from one node's tensors.
struct TaskView {
    std::vector<TaskItem> items;
    std::vector<std::vector<TaskRequest>> requests;
    std::vector<std::vector<double>> ll;
};

TaskView read_view(const NodeOutputs& n) {
    const std::vector<double> ll = double_vector(n.view("task.ll"));
    const std::vector<std::int32_t> choices = int_vector(n.view("task.choices")), gold = int_vector(n.view("task.gold")),
                                    chars = int_vector(n.view("task.chars"));
    KVASIR_CHECK(choices.size() == gold.size() && ll.size() == chars.size() && !choices.empty(), ErrorCode::bad_input,
                 "{}: task tensors of inconsistent sizes", n.origin());
    TaskView v;
    std::size_t k = 0;
    for (std::size_t i = 0; i < choices.size(); ++i) {
        KVASIR_CHECK(choices[i] >= 2 && k + static_cast<std::size_t>(choices[i]) <= ll.size() && gold[i] >= 0 &&
                         gold[i] < choices[i],
                     ErrorCode::bad_input, "{}: task item {}: {} choices, gold {}", n.origin(), i, choices[i], gold[i]);
        TaskItem it;
        it.gold = gold[i];
        it.choices.resize(static_cast<std::size_t>(choices[i]));
        std::vector<TaskRequest> rs;
        std::vector<double> lls;
        for (std::int32_t c = 0; c < choices[i]; ++c, ++k) {
            KVASIR_CHECK(chars[k] >= 1, ErrorCode::bad_input, "{}: task choice {} has {} characters", n.origin(), k, chars[k]);
            TaskRequest r;
            r.chars = static_cast<std::size_t>(chars[k]);
            rs.push_back(r);
            lls.push_back(ll[k]);
        }
        v.items.push_back(std::move(it));
        v.requests.push_back(std::move(rs));
        v.ll.push_back(std::move(lls));
    }
    KVASIR_CHECK(k == ll.size(), ErrorCode::bad_input, "{}: task.ll holds {} values for {} choices", n.origin(), ll.size(), k);
    return v;
}

class TaskAudit final : public Step {
public:
    const char* name() const override { return "task"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        const TaskStep& t = ac.protocol->task;
        if (!t.enabled) return false;
        const std::string text = read_text_file(t.resolved_path);
        const std::string actual = sha256_hex(text);
        KVASIR_CHECK(actual == t.sha256, ErrorCode::bad_input,
                     "{}: sha256 is {}, the protocol pins {} (the task items changed: update the protocol)", t.resolved_path,
                     actual, t.sha256);
        plan.task = make_task_config(*ac.model, text, t.path, load_tokenizer_for(ac.model->path(), ac.tokenizer));
        plan.task->seed = plan.seed;
        plan.task->router_authority = t.router_authority;
        plan.task->validate();
        return true;
    }

    std::any decide(const StepEnv& env, Backend& authority) const override {
        return std::make_shared<const TaskPass>(run_task_passes(authority, *env.plan->task, nullptr));
    }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        const TaskConfig& c = *env.plan->task;
        const auto& ref = *std::any_cast<std::shared_ptr<const TaskPass>>(decisions);
        const TaskPass own = self ? TaskPass{} : run_task_passes(node, c, c.router_authority ? &ref : nullptr);
        const TaskPass& p = self ? ref : own;
        std::vector<double> ll;
        std::vector<std::int32_t> choices, gold, chars;
        for (std::size_t i = 0; i < c.items.size(); ++i) {
            choices.push_back(static_cast<std::int32_t>(c.items[i].choices.size()));
            gold.push_back(static_cast<std::int32_t>(c.items[i].gold));
            for (std::size_t k = 0; k < c.requests[i].size(); ++k) {
                ll.push_back(p.ll[i][k]);
                chars.push_back(static_cast<std::int32_t>(c.requests[i][k].chars));
            }
        }
        StepOutput out;
        out.tensors.emplace("task.ll", f64_tensor(ll));
        out.tensors.emplace("task.choices", i32_tensor(choices));
        out.tensors.emplace("task.gold", i32_tensor(gold));
        out.tensors.emplace("task.chars", i32_tensor(chars));
        return out;
    }

    bool shares_decisions() const override { return true; }
    NamedTensors save_decisions(const std::any& d) const override {
        NamedTensors out;
        save_routing_sets(out, "routing", std::any_cast<std::shared_ptr<const TaskPass>>(d)->routing);
        return out;
    }
    std::any load_decisions(const StepEnv& env, const NodeOutputs& saved) const override {
        auto p = std::make_shared<TaskPass>();
        std::size_t requests = 0;
        for (const auto& rs : env.plan->task->requests) requests += rs.size();
        p->routing = load_routing_sets(saved, "routing", env.model->config().num_layers, requests);
        return std::shared_ptr<const TaskPass>(std::move(p));
    }

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport&) const override {
        const TaskView rv = read_view(*in.nodes[in.reference]);
        const TaskScores rs = score_task(rv.ll, rv.items, rv.requests);
        const std::size_t n = rv.items.size();
        auto r = std::make_shared<TaskResult>();
        r->reference = in.nodes[in.reference]->node();
        r->items = static_cast<std::int64_t>(n);
        r->routing = p.task.router_authority ? "pinned by the reference per request (router authority)"
                                             : "each node runs its own router (no authority)";
        r->reference_acc = rs.acc;
        r->reference_acc_stderr = rs.acc_stderr;
        r->reference_acc_norm = rs.acc_norm;
        r->reference_acc_norm_stderr = rs.acc_norm_stderr;
        r->results = for_each_candidate<TaskResult::Entry>(in, led, "task", [&](std::size_t i) {
            const NodeOutputs& c = *in.nodes[i];
            const TaskView cv = read_view(c);
            KVASIR_CHECK(cv.ll.size() == n, ErrorCode::bad_input, "{}: {} task items, the reference has {}", c.origin(), cv.ll.size(), n);
            for (std::size_t k = 0; k < n; ++k)
                KVASIR_CHECK(cv.items[k].gold == rv.items[k].gold && cv.ll[k].size() == rv.ll[k].size(), ErrorCode::bad_input,
                             "{}: task item {} differs from the reference's (choices or gold)", c.origin(), k);
            const TaskScores s = score_task(cv.ll, cv.items, cv.requests);
            const TaskComparison v = compare_task(rs, s);
            led.measure(i, "task", "task.acc_ratio_min", v.acc_ratio);
            led.measure_rate(i, "task", "task.agreement_min", binomial(v.agree, static_cast<std::int64_t>(n)));
            led.measure(i, "task", "task.ll_max_abs_delta_max", v.ll_max_abs_delta);
            TaskResult::Entry e;
            e.acc = s.acc;
            e.acc_stderr = s.acc_stderr;
            e.acc_norm = s.acc_norm;
            e.acc_norm_stderr = s.acc_norm_stderr;
            e.vs = v;
            e.items = static_cast<std::int64_t>(n);
            return e;
        });
        return r;
    }
};

}  // namespace

nlohmann::ordered_json TaskResult::Entry::to_json() const {
    return json_with({{"acc", json_double(acc)}, {"acc_stderr", json_double(acc_stderr)}, {"acc_norm", json_double(acc_norm)},
                 {"acc_norm_stderr", json_double(acc_norm_stderr)}, {"acc_ratio", json_double(vs.acc_ratio)},
                 {"acc_norm_ratio", json_double(vs.acc_norm_ratio)}, {"agreement", json_double(agreement())},
                 {"agreement_norm", json_double(agreement_norm())}, {"ll_max_abs_delta", json_double(vs.ll_max_abs_delta)}});
}

nlohmann::ordered_json TaskResult::to_json() const {
    return {{"reference", reference}, {"items", items}, {"routing", routing}, {"reference_acc", json_double(reference_acc)},
            {"reference_acc_stderr", json_double(reference_acc_stderr)}, {"reference_acc_norm", json_double(reference_acc_norm)},
            {"reference_acc_norm_stderr", json_double(reference_acc_norm_stderr)}, {"results", entries_json(results)}};
}

const Step& task_step() {
    static const TaskAudit s;
    return s;
}

}  // namespace kvasir
