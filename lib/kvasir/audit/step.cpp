#include "kvasir/audit/step.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
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

const std::vector<const Step*>& audit_steps() {
    static const std::vector<const Step*> steps{&ops_step(),      &drift_step(),      &logits_step(),
                                                &decide_step(),   &generate_step(),   &perplexity_step(),
                                                &determinism_step(), &invariance_step(), &task_step()};
    return steps;
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

double worse_max(double a, double b) {
    return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
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
    for (std::int64_t i = 0; i < v.numel(); ++i) out[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v.at(i));
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

}  // namespace kvasir
