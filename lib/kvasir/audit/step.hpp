// A protocol step is ONE object (SPEC §2): its name, its criteria, how it
// reads its protocol section, what it computes on one node given the
// authority's decisions, and a pure comparison of what nodes computed.
//
//   plan     reads the step's protocol section into the AuditPlan (validated:
//            Error(bad_input) before anything runs)
//   decide   the authority's part, computed once per audit: routing plans,
//            anchors, reference tokens (opaque to everyone but the step; a
//            step that shares them writes them for the other node
//            processes, which read them instead: save/load_decisions)
//   collect  what one node computes, given those decisions: named tensors,
//            exactly the capture format's names (protocols/CAPTURE.md)
//   compare  pure: every node's tensors (from memory or from capture files)
//            → measurements per candidate, pair matrices, drift series and
//            the step's typed result (a StepResult, declared next to the
//            step in audit/step_<name>.hpp), which every report reads and
//            whose to_json() is the step's section of the JSON report
//
// The three commands are then one driver (audit.cpp): audit = decide +
// collect on every node + compare (in this process, or each node in a child
// process that writes a capture); capture = decide + collect + write;
// compare = read + compare. A new step is one file: its Step, its protocol
// section (read by its plan() from Protocol::section), its criteria
// (declared_criteria), its typed result and its register_step() call (and a
// text and an HTML section where report/step_text.hpp and
// report/audit_html.hpp register them; without one the HTML report shows
// the step's JSON entries as a table).
//
// One failure policy, everywhere (node_failure, core/error.hpp):
// kvasir::Error other than internal and std::bad_alloc are the NODE's
// failure (its verdict becomes error, the audit goes on); Error(internal),
// std::logic_error and anything else are bugs of this tool and propagate
// (exit 3).
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/tensor.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/verdict.hpp"
#include "kvasir/audit/results.hpp"

#include <any>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

class Model;
struct AuditConfig;
namespace detail {
struct AuditPlan;
}

using NamedTensors = std::map<std::string, Tensor>;

// What one node produced in one step: tensors under their capture names, and
// notes — short strings a capture keeps in its metadata (e.g. "ops_inputs").
struct StepOutput {
    NamedTensors tensors;
    std::map<std::string, std::string> notes;
};

// One node's outputs as compare() reads them: a capture file or a live
// node's collection in memory.
class NodeOutputs {
public:
    virtual ~NodeOutputs() = default;
    virtual const std::string& node() const = 0;
    // For messages: the capture's path, or "node <name>".
    virtual const std::string& origin() const = 0;
    virtual bool has(const std::string& tensor) const = 0;
    // Error(bad_input) "<origin>: no tensor '<name>'" when absent.
    virtual TensorView view(const std::string& tensor) const = 0;
    virtual std::optional<std::string> note(const std::string& key) const = 0;
};

// A live node's collection (every step's tensors and notes, merged).
class CollectedOutputs final : public NodeOutputs {
public:
    explicit CollectedOutputs(std::string node);
    const std::string& node() const override { return node_; }
    const std::string& origin() const override { return origin_; }
    bool has(const std::string& tensor) const override { return tensors_.count(tensor) != 0; }
    TensorView view(const std::string& tensor) const override;
    std::optional<std::string> note(const std::string& key) const override;
    void add(StepOutput&& out);
    const NamedTensors& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& notes() const { return notes_; }

private:
    std::string node_, origin_;
    NamedTensors tensors_;
    std::map<std::string, std::string> notes_;
};

// Per-node accumulation of measurements and errors: the verdict's inputs.
class Ledger {
public:
    Ledger(std::vector<NodeInput> inputs, std::size_t reference);
    std::size_t reference() const { return reference_; }
    std::size_t size() const { return inputs_.size(); }
    // Error(internal) for a node the audit did not create.
    std::size_t index_of(const std::string& node) const;
    void measure(std::size_t i, const std::string& step, const std::string& criterion, double value);
    // A fault-injecting node corrupted `count` op outputs in `step`
    // (NodeInput::faults_fired).
    void faults_fired(std::size_t i, const std::string& step, std::int64_t count);
    // Where step `step` locates node i's error first (one line, for the
    // verdict: NodeInput::localisation).
    void localise(std::size_t i, const std::string& step, const std::string& where);
    // A rate criterion: its value and the counts it is judged on.
    void measure_rate(std::size_t i, const std::string& step, const std::string& criterion, const Fraction& rate);
    void error(std::size_t i, const std::string& step, const std::string& message);
    // `criterion` does not apply to the audited model (why: "no MoE layers"):
    // for every node, unjudged unless measured (verdict.hpp). A step decides
    // it from the reference's outputs only.
    void not_applicable(const std::string& criterion, const std::string& why);
    // `criterion` cannot be measured on candidate i, by what the node is (a
    // free-running external node has no pinned outputs; a step its writer
    // declared not captured): not judged for that node only, listed with why
    // (NodeInput::not_measurable).
    void not_applicable_for(std::size_t i, const std::string& criterion, const std::string& why);
    // The reference failed a step: nothing was compared.
    void reference_failed(const std::string& step, const std::string& message);
    const std::vector<NodeInput>& inputs() const { return inputs_; }

private:
    std::size_t reference_;
    std::vector<NodeInput> inputs_;
    std::map<std::string, std::size_t> index_;
};

// Where a step runs. plan and model are null in compare (captures carry no
// model): compare() reads only the protocol and the tensors.
struct StepEnv {
    const Protocol* protocol = nullptr;
    const detail::AuditPlan* plan = nullptr;
    const Model* model = nullptr;
};

// compare()'s inputs: every node's outputs (node order of the report) and
// which of them took part (collected the step without error).
struct StepNodes {
    const std::vector<const NodeOutputs*>& nodes;
    const std::vector<bool>& present;
    std::size_t reference;
    // Per node: it ran its own router and decoding (capability authority
    // "none"): its logits are free-running, it has no pinned outputs.
    const std::vector<bool>& free_running;
};

class Step {
public:
    virtual ~Step() = default;
    virtual const char* name() const = 0;
    // The catalogue's criteria this step measures (protocol.hpp).
    std::vector<CriterionInfo> criteria() const;
    // The criteria a registered step brings to the catalogue (register_step);
    // the built-in steps' are in the catalogue already.
    virtual std::vector<CriterionInfo> declared_criteria() const { return {}; }
    // Reads the step's protocol section into `plan`; false when the protocol
    // does not run it. Error(bad_input) for a bad section.
    virtual bool plan(const AuditConfig& config, detail::AuditPlan& plan) const = 0;
    // The authority's decisions. Throws what the authority throws.
    virtual std::any decide(const StepEnv& env, Backend& authority) const = 0;
    // What `node` computes given `decisions`; `self`: the node IS the
    // authority (its outputs come from the decisions, not computed twice).
    virtual StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const = 0;
    // Decisions shared between processes (capture --decisions-out/-in: the
    // isolated audit's reference process decides once, the other node
    // processes read them instead of running the authority again). A step
    // that shares writes what collect needs of its decisions on a node other
    // than the authority as named tensors, and reads them back (the same
    // bits). A step that does not (its decisions are cheap or are the
    // authority itself) decides in every process.
    virtual bool shares_decisions() const { return false; }
    virtual NamedTensors save_decisions(const std::any& decisions) const;
    virtual std::any load_decisions(const StepEnv& env, const NodeOutputs& saved) const;
    // Pure: the measurements of every present candidate into `ledger`
    // (per-candidate problems, e.g. a shape mismatch, are that node's error),
    // pair matrices / drift into `report`, and the step's typed result
    // (never null; the driver stores it in AuditReport::results and its
    // to_json() in AuditReport::steps).
    virtual std::shared_ptr<const StepResult> compare(const Protocol& protocol, const StepNodes& in, Ledger& ledger,
                                                      AuditReport& report) const = 0;
};

// Encodings of shared decisions (Step::save_decisions): a list of routing
// sets — one plan per layer each (empty for dense layers), e.g. one set per
// task request — as per-layer concatenations "<prefix>.<l>.ids", ".weights"
// and the rows of each set ".rows"; a list of tensors as "<prefix>.<k>"
// (an empty tensor: absent). The loaders copy out of `saved` and check
// every size against it and the count of sets against `expected` (what the
// step's plan has) before allocating: Error(bad_input) for a file that does
// not fit.
void save_routing_sets(NamedTensors& out, const std::string& prefix, const std::vector<std::vector<RoutingPlan>>& sets);
std::vector<std::vector<RoutingPlan>> load_routing_sets(const NodeOutputs& saved, const std::string& prefix, std::int64_t layers,
                                                        std::size_t expected);
void save_tensor_list(NamedTensors& out, const std::string& prefix, const std::vector<Tensor>& list);
std::vector<Tensor> load_tensor_list(const NodeOutputs& saved, const std::string& prefix, std::size_t count);

// The shared decisions of a step whose authority runs one forward pass
// (drift, logits, decide: a std::shared_ptr<const ForwardResult>): its
// routing, and with anchors its hidden states and MLP inputs (drift's; read
// back with anchor_rows > 0, each [anchor_rows, hidden]).
NamedTensors save_forward_decisions(const std::any& decisions, bool anchors);
std::any load_forward_decisions(const StepEnv& env, const NodeOutputs& saved, std::int64_t anchor_rows);

// A step whose authority's decisions are one forward pass (drift, logits,
// decide: a std::shared_ptr<const ForwardResult>), shared between processes
// as save_forward_decisions writes them. A step that keeps anchors (drift:
// the authority's hidden states) says how many rows each has.
class ForwardPassStep : public Step {
public:
    bool shares_decisions() const override { return true; }
    NamedTensors save_decisions(const std::any& decisions) const override {
        return save_forward_decisions(decisions, keeps_anchors());
    }
    std::any load_decisions(const StepEnv& env, const NodeOutputs& saved) const override {
        return load_forward_decisions(env, saved, keeps_anchors() ? anchor_rows(env) : 0);
    }

protected:
    virtual bool keeps_anchors() const { return false; }
    virtual std::int64_t anchor_rows(const StepEnv&) const { return 0; }
};

// Every step, in protocol order: the built-in ones, then the registered ones.
const std::vector<const Step*>& audit_steps();
// A step beyond the built-in ones, from its own file: its name becomes a
// protocol section (read by its plan() from Protocol::section), its
// declared_criteria() join the catalogue, and the audit, capture and compare
// run it like any other (tests/steps/test_audit.cpp `ToyStep`). `step` must
// outlive every audit (a static). Error(internal) for a name or criterion
// already known.
void register_step(const Step& step);
// Error(internal) for an unknown name.
const Step& step_named(std::string_view name);

// Tensors of `out` that hold a NaN or Inf: "<name>[<flat index>] = nan".
// Empty when every float tensor is finite (integer tensors are skipped).
std::optional<std::string> first_non_finite(const StepOutput& out);

// --- small helpers the step files share ---------------------------------------

Tensor i32_tensor(const std::vector<std::int32_t>& v);
Tensor f64_tensor(const std::vector<double>& v);
std::vector<std::int32_t> int_vector(const TensorView& v);
std::vector<double> double_vector(const TensorView& v);
// A node against ITSELF (determinism, invariance): the guarded max_rel and
// max|Δ| of b against a, from one comparison; both 0 when bit-identical,
// NaN when their non-finite patterns differ.
struct SelfDelta {
    double max_rel = 0, max_abs = 0;
};
SelfDelta self_delta(const TensorView& a, const TensorView& b);
inline double self_max_rel(const TensorView& a, const TensorView& b) { return self_delta(a, b).max_rel; }
// "<prefix>0", "<prefix>1", … until the first absent one.
std::vector<TensorView> numbered(const NodeOutputs& n, const std::string& prefix);

// compare()'s loop: body(i) → node i's Entry (a NodeEntry) for every present
// candidate; a problem of that candidate's tensors (Error other than
// internal, e.g. a shape that differs from the reference's) becomes its error
// of `step`, its entry holding only the node and that error.
template <class Entry, class F>
std::vector<Entry> for_each_candidate(const StepNodes& in, Ledger& led, const char* step, F&& body) {
    std::vector<Entry> results;
    for (std::size_t i = 0; i < in.nodes.size(); ++i) {
        if (i == in.reference || !in.present[i]) continue;
        Entry entry;
        if (auto why = as_node_failure([&] { entry = body(i); })) {
            led.error(i, step, *why);
            entry = Entry{};
            entry.error = *why;
        }
        entry.node = in.nodes[i]->node();
        results.push_back(std::move(entry));
    }
    return results;
}

// compare()'s loop for the steps that compare each node with ITSELF
// (determinism, invariance): body(i, entry) for every present node, the
// reference included (measured and reported; the verdict does not judge the
// reference), entry starting with its node; a problem of that node's tensors
// becomes its error of `step`, kept in its entry beside what body filled.
template <class Entry, class F>
std::vector<Entry> for_each_node_itself(const StepNodes& in, Ledger& led, const char* step, F&& body) {
    std::vector<Entry> results;
    for (std::size_t i = 0; i < in.nodes.size(); ++i) {
        if (!in.present[i]) continue;
        Entry entry;
        entry.node = in.nodes[i]->node();
        if (auto why = as_node_failure([&] { body(i, entry); })) {
            led.error(i, step, *why);
            entry.error = *why;
        }
        results.push_back(std::move(entry));
    }
    return results;
}

// A list of entries as a JSON array (Entry::to_json each).
template <class Entry>
nlohmann::ordered_json entries_json(const std::vector<Entry>& entries) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const Entry& e : entries) a.push_back(e.to_json());
    return a;
}

}  // namespace kvasir

