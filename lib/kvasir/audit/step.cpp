#include "kvasir/audit/step.hpp"

#include "kvasir/arch/graph.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/forward.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

namespace kvasir {

// The steps, in protocol order. Each is defined in its own file
// (audit/step_<name>.cpp); adding a step is adding it here.
const Step& ops_step();
const Step& drift_step();
const Step& logits_step();
const Step& decide_step();
const Step& generate_step();
const Step& perplexity_step();
const Step& determinism_step();
const Step& invariance_step();
const Step& task_step();

namespace {
std::vector<const Step*>& step_storage() {
    static std::vector<const Step*> steps{&ops_step(),      &drift_step(),      &logits_step(),
                                          &decide_step(),   &generate_step(),   &perplexity_step(),
                                          &determinism_step(), &invariance_step(), &task_step()};
    return steps;
}
}  // namespace

const std::vector<const Step*>& audit_steps() { return step_storage(); }

void register_step(const Step& step) {
    register_protocol_step(step.name(), step.declared_criteria());
    step_storage().push_back(&step);
}

const Step& step_named(std::string_view name) {
    for (const Step* s : audit_steps())
        if (name == s->name()) return *s;
    fail(ErrorCode::internal, "no step named '{}'", name);
}

std::vector<CriterionInfo> Step::criteria() const {
    std::vector<CriterionInfo> out;
    for (const CriterionInfo& c : criterion_catalog())
        if (c.step == name()) out.push_back(c);
    return out;
}

CollectedOutputs::CollectedOutputs(std::string node) : node_(std::move(node)), origin_("node " + node_) {}

TensorView CollectedOutputs::view(const std::string& tensor) const {
    const auto it = tensors_.find(tensor);
    KVASIR_CHECK(it != tensors_.end(), ErrorCode::bad_input, "{}: no tensor '{}'", origin_, tensor);
    return it->second.view();
}

std::optional<std::string> CollectedOutputs::note(const std::string& key) const {
    const auto it = notes_.find(key);
    if (it == notes_.end()) return std::nullopt;
    return it->second;
}

void CollectedOutputs::add(StepOutput&& out) {
    for (auto& [name, t] : out.tensors) tensors_.insert_or_assign(name, std::move(t));
    for (auto& [k, v] : out.notes) notes_.insert_or_assign(k, std::move(v));
}

Ledger::Ledger(std::vector<NodeInput> inputs, std::size_t reference) : reference_(reference), inputs_(std::move(inputs)) {
    KVASIR_ASSERT(reference_ < inputs_.size());
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
        inputs_[i].is_reference = i == reference_;
        index_[inputs_[i].node] = i;
    }
}

std::size_t Ledger::index_of(const std::string& node) const {
    const auto it = index_.find(node);
    KVASIR_CHECK(it != index_.end(), ErrorCode::internal, "a step reported node '{}' that the audit did not create", node);
    return it->second;
}

void Ledger::measure(std::size_t i, const std::string& step, const std::string& criterion, double value) {
    KVASIR_ASSERT(i < inputs_.size());
    inputs_[i].measurements.push_back({criterion, step, value});
}

void Ledger::measure_rate(std::size_t i, const std::string& step, const std::string& criterion, const Fraction& rate) {
    KVASIR_ASSERT(i < inputs_.size());
    inputs_[i].measurements.push_back({criterion, step, rate.rate, RateCount{rate.successes, rate.n}});
}

void Ledger::localise(std::size_t i, const std::string& step, const std::string& where) {
    KVASIR_ASSERT(i < inputs_.size());
    inputs_[i].localisation[step] = where;
}

void Ledger::faults_fired(std::size_t i, const std::string& step, std::int64_t count) {
    KVASIR_ASSERT(i < inputs_.size());
    auto& f = inputs_[i].faults_fired;
    if (!f) f.emplace();
    (*f)[step] += count;
}

void Ledger::error(std::size_t i, const std::string& step, const std::string& message) {
    KVASIR_ASSERT(i < inputs_.size());
    std::string& e = inputs_[i].errors[step];
    e = e.empty() ? message : e + "; " + message;
}

void Ledger::not_applicable_for(std::size_t i, const std::string& criterion, const std::string& why) {
    KVASIR_CHECK(i < inputs_.size() && i != reference_, ErrorCode::internal, "not_applicable_for: node {} of {}", i,
                 inputs_.size());
    inputs_[i].not_measurable.emplace(criterion, why);
}

void Ledger::not_applicable(const std::string& criterion, const std::string& why) {
    for (NodeInput& in : inputs_) in.not_applicable[criterion] = why;
}

void Ledger::reference_failed(const std::string& step, const std::string& message) {
    for (std::size_t i = 0; i < inputs_.size(); ++i)
        error(i, step, i == reference_ ? message : "not compared: the reference failed: " + message);
}

std::optional<std::string> first_non_finite(const StepOutput& out) {
    for (const auto& [name, t] : out.tensors) {
        if (t.dtype() == DType::i32) continue;
        const TensorView v = t.view();
        for (std::int64_t i = 0; i < v.numel(); ++i) {
            const double x = v.at(i);
            if (!std::isfinite(x)) return fmt::format("{}[{}] = {}", name, i, x);
        }
    }
    return std::nullopt;
}

SelfDelta self_delta(const TensorView& a, const TensorView& b) {
    if (same_bits(a, b)) return {};
    const CompareStats s = compare(a, b);
    if (!finite_parity(s)) return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
    return {s.max_rel, s.max_abs};
}

Tensor i32_tensor(const std::vector<std::int32_t>& v) {
    Tensor t(DType::i32, {static_cast<std::int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(std::int32_t));
    return t;
}

Tensor f64_tensor(const std::vector<double>& v) {
    Tensor t(DType::f64, {static_cast<std::int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(double));
    return t;
}

std::vector<std::int32_t> int_vector(const TensorView& v) {
    std::vector<std::int32_t> out(static_cast<std::size_t>(v.numel()));
    for (std::int64_t i = 0; i < v.numel(); ++i) {
        const double x = v.at(i);  // a capture's tensor: untrusted, never converted out of range
        KVASIR_CHECK(x == std::trunc(x) && x >= -2147483648.0 && x <= 2147483647.0, ErrorCode::bad_input,
                     "an integer tensor holds {} at element {} (not a 32-bit integer)", x, i);
        out[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(x);
    }
    return out;
}

std::vector<double> double_vector(const TensorView& v) {
    std::vector<double> out(static_cast<std::size_t>(v.numel()));
    for (std::int64_t i = 0; i < v.numel(); ++i) out[static_cast<std::size_t>(i)] = v.at(i);
    return out;
}

std::vector<TensorView> numbered(const NodeOutputs& n, const std::string& prefix) {
    std::vector<TensorView> out;
    for (std::size_t l = 0; n.has(prefix + std::to_string(l)); ++l) out.push_back(n.view(prefix + std::to_string(l)));
    return out;
}

NamedTensors Step::save_decisions(const std::any&) const {
    fail(ErrorCode::internal, "step {} does not share its decisions", name());
}

std::any Step::load_decisions(const StepEnv&, const NodeOutputs&) const {
    fail(ErrorCode::internal, "step {} does not share its decisions", name());
}

void save_routing_sets(NamedTensors& out, const std::string& prefix, const std::vector<std::vector<RoutingPlan>>& sets) {
    std::size_t layers = 0;
    for (const auto& set : sets) layers = std::max(layers, set.size());
    out.insert_or_assign(prefix + ".sets", i32_tensor({static_cast<std::int32_t>(sets.size())}));
    for (std::size_t l = 0; l < layers; ++l) {
        std::vector<std::int32_t> rows;  // -1: no plan (a dense layer)
        std::vector<Tensor> ids, weights;
        for (const auto& set : sets) {
            const bool has = l < set.size() && !set[l].ids.empty();
            rows.push_back(has ? static_cast<std::int32_t>(set[l].ids.dim(0)) : -1);
            if (!has) continue;
            ids.push_back(set[l].ids);
            weights.push_back(set[l].weights);
        }
        if (ids.empty()) continue;
        const std::string at = fmt::format("{}.{}", prefix, l);
        out.insert_or_assign(at + ".rows", i32_tensor(rows));
        out.insert_or_assign(at + ".ids", arch::stack_rows(ids));
        out.insert_or_assign(at + ".weights", arch::stack_rows(weights));
    }
}

std::vector<std::vector<RoutingPlan>> load_routing_sets(const NodeOutputs& saved, const std::string& prefix, std::int64_t layers,
                                                        std::size_t expected) {
    const TensorView count_view = saved.view(prefix + ".sets");
    KVASIR_CHECK(count_view.numel() == 1, ErrorCode::bad_input, "{}: {}.sets is not one count", saved.origin(), prefix);
    const std::vector<std::int32_t> count = int_vector(count_view);
    KVASIR_CHECK(count[0] >= 0 && static_cast<std::size_t>(count[0]) == expected, ErrorCode::bad_input,
                 "{}: {} routing sets, the step has {}", saved.origin(), count[0], expected);
    std::vector<std::vector<RoutingPlan>> sets(static_cast<std::size_t>(count[0]), std::vector<RoutingPlan>(static_cast<std::size_t>(layers)));
    for (std::int64_t l = 0; l < layers; ++l) {
        const std::string at = fmt::format("{}.{}", prefix, l);
        if (!saved.has(at + ".rows")) continue;
        const std::vector<std::int32_t> rows = int_vector(saved.view(at + ".rows"));
        const TensorView ids = saved.view(at + ".ids"), weights = saved.view(at + ".weights");
        KVASIR_CHECK(rows.size() == sets.size() && ids.rank() == 2 && ids.dtype == DType::i32 && weights.shape == ids.shape &&
                         dtype_is_float(weights.dtype),
                     ErrorCode::bad_input, "{}: {}: {} row counts for {} sets, ids {}, weights {}", saved.origin(), at, rows.size(),
                     sets.size(), shape_str(ids.shape), shape_str(weights.shape));
        std::int64_t r0 = 0;
        for (std::size_t s = 0; s < sets.size(); ++s) {
            if (rows[s] < 0) continue;
            KVASIR_CHECK(r0 + rows[s] <= ids.dim(0), ErrorCode::bad_input, "{}: {}: the sets' rows exceed the {} stored",
                         saved.origin(), at, ids.dim(0));
            sets[s][static_cast<std::size_t>(l)] = RoutingPlan{arch::leading_rows(ids, r0, rows[s]), arch::leading_rows(weights, r0, rows[s])};
            r0 += rows[s];
        }
        KVASIR_CHECK(r0 == ids.dim(0), ErrorCode::bad_input, "{}: {}: {} rows stored, the sets use {}", saved.origin(), at,
                     ids.dim(0), r0);
    }
    return sets;
}

void save_tensor_list(NamedTensors& out, const std::string& prefix, const std::vector<Tensor>& list) {
    for (std::size_t k = 0; k < list.size(); ++k)
        if (!list[k].empty()) out.insert_or_assign(fmt::format("{}.{}", prefix, k), list[k]);
}

std::vector<Tensor> load_tensor_list(const NodeOutputs& saved, const std::string& prefix, std::size_t count) {
    std::vector<Tensor> list(count);
    for (std::size_t k = 0; k < count; ++k) {
        const std::string name = fmt::format("{}.{}", prefix, k);
        if (!saved.has(name)) continue;
        const TensorView v = saved.view(name);
        list[k] = v.rank() == 0 ? Tensor::convert(v, v.dtype) : arch::leading_rows(v, 0, v.dim(0));
    }
    return list;
}

NamedTensors save_forward_decisions(const std::any& decisions, bool anchors) {
    const ForwardResult& r = *std::any_cast<std::shared_ptr<const ForwardResult>>(decisions);
    NamedTensors out;
    save_routing_sets(out, "routing", {r.routing});
    if (anchors) {
        save_tensor_list(out, "hidden", r.hidden);
        save_tensor_list(out, "mlp_input", r.mlp_input);
    }
    return out;
}

std::any load_forward_decisions(const StepEnv& env, const NodeOutputs& saved, std::int64_t anchor_rows) {
    const std::int64_t layers = env.model->config().num_layers, hidden = env.model->config().hidden_size;
    const bool anchors = anchor_rows > 0;
    auto r = std::make_shared<ForwardResult>();
    r->routing = std::move(load_routing_sets(saved, "routing", layers, 1).front());
    if (anchors) {
        r->hidden = load_tensor_list(saved, "hidden", static_cast<std::size_t>(layers + 1));
        r->mlp_input = load_tensor_list(saved, "mlp_input", static_cast<std::size_t>(layers));
        // Anchors are fed to the node as its layers' inputs: [T, hidden] floats.
        for (const std::vector<Tensor>* list : {&r->hidden, &r->mlp_input})
            for (const Tensor& t : *list)
                KVASIR_CHECK(t.empty() || (t.view().rank() == 2 && t.dim(0) == anchor_rows && t.dim(1) == hidden &&
                                           dtype_is_float(t.dtype())),
                             ErrorCode::bad_input, "{}: an anchor of shape {} {}, the step feeds [{}, {}]", saved.origin(),
                             shape_str(t.shape()), dtype_name(t.dtype()), anchor_rows, hidden);
        KVASIR_CHECK(!r->hidden.empty() && !r->hidden.front().empty(), ErrorCode::bad_input, "{}: no anchors", saved.origin());
    }
    return std::shared_ptr<const ForwardResult>(std::move(r));
}

}  // namespace kvasir
