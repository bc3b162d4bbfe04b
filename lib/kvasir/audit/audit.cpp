// The audit driver: ONE loop for audit, capture and compare (step.hpp says
// how a step object splits the work). A step's reference failure, each
// node's own failure, and bugs of this tool are handled here and nowhere
// else (node_failure, core/error.hpp).
#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/capture.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/tensor.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/steps/node_clock.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>

namespace kvasir {


namespace {

// The load phase: read what the steps will use — the whole model when a step
// runs the forward pass, the ops layer when only step 1 uses real weights.
void load_weights(const detail::AuditPlan& plan, const Model& model, RunTimings& t) {
    const bool forward = plan.drift || plan.logits || plan.decide || plan.generate || plan.perplexity ||
                         plan.determinism_tokens || plan.invariance;
    std::vector<std::int64_t> layers;
    if (forward) {
        for (std::int64_t l = 0; l < model.config().num_layers; ++l) layers.push_back(l);
    } else if (plan.ops && plan.ops->model != nullptr) {
        layers.push_back(plan.ops->resolved().layer);
    }
    if (layers.empty()) {
        t.load_note = "no model weights used";
        return;
    }
    std::uint64_t want = 0;
    for (std::int64_t l : layers) want += model.layer_bytes(l);
    const std::uint64_t avail = available_memory_bytes();
    if (avail != 0 && want > avail / 2) {
        t.load_note = fmt::format("skipped: {:.2f} GB of weights, {:.2f} GB available — read lazily by the steps",
                                  static_cast<double>(want) * 1e-9, static_cast<double>(avail) * 1e-9);
        return;
    }
    load_phase(model, layers, forward, t);
}

}  // namespace

nlohmann::ordered_json audit_model_json(const Model& model) {
    nlohmann::ordered_json m;
    m["fingerprint"] = model.fingerprint();
    m["path"] = model.path();
    m["architecture"] = architecture_name(model.config().architecture);
    m["layers"] = model.config().num_layers;
    return m;
}

AuditRun run_audit(const AuditConfig& ac, std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference) {
    KVASIR_ASSERT(ac.protocol != nullptr && ac.model != nullptr);
    KVASIR_ASSERT(reference < nodes.size());
    const Protocol& p = *ac.protocol;
    // Every bad input is refused here, before any work; in this process every node's outputs of a step are held at once.
    const detail::AuditPlan plan = detail::make_audit_plan(ac, std::max<std::size_t>(nodes.size(), 2));

    AuditRun run;
    run.step_order = plan.steps;
    AuditReport& out = run.report;
    out.protocol = protocol_ref(p);
    if (!ac.only_steps.empty()) out.protocol.steps_judged = plan.steps;  // selected, in protocol order
    out.model = audit_model_json(*ac.model);
    out.reference = nodes[reference]->capabilities().node;
    out.seed = plan.seed;
    out.gate = ac.gate;
    std::vector<NodeInput> inputs;
    for (std::size_t i = 0; i < nodes.size(); ++i) inputs.push_back(node_input(nodes[i]->capabilities(), i == reference));
    Ledger led(std::move(inputs), reference);

    RunTimings& timing = run.timings;
    for (const auto& n : nodes) timing.nodes.push_back(n->capabilities().node);
    if (ac.load_first) load_weights(plan, *ac.model, timing);
    else timing.load_note = "off: weights read lazily by the steps";

    int step_index = 0;
    std::string step_name;
    const int step_count = static_cast<int>(plan.steps.size()), node_count = static_cast<int>(nodes.size());
    // Every step runs on the timed decorators (same results): they tell the
    // time spent inside each node and which node is computing.
    NodeClock clock(nodes, [&](std::size_t i) {
        if (ac.progress)
            ac.progress({step_name, step_index, step_count, timing.nodes[i], static_cast<int>(i) + 1, node_count});
    });
    std::vector<std::unique_ptr<Backend>>& timed = clock.timed();
    const StepEnv env{&p, &plan, ac.model};

    for (const std::string& name : plan.steps) {
        ++step_index;
        step_name = name;
        clock.new_phase();
        if (ac.progress) ac.progress({name, step_index, step_count, "", 0, node_count});
        std::vector<double> before(nodes.size());
        for (std::size_t i = 0; i < nodes.size(); ++i) before[i] = clock.seconds(i);
        const auto t0 = std::chrono::steady_clock::now();

        const Step& s = step_named(name);
        // Each step's tensors live until it is compared, then go.
        std::vector<CollectedOutputs> outs;
        std::vector<detail::NodeRecord> recs(nodes.size());
        for (std::size_t i = 0; i < nodes.size(); ++i) outs.emplace_back(timing.nodes[i]);
        std::any decisions;
        if (auto why = as_node_failure([&] { decisions = s.decide(env, *timed[reference]); })) {
            recs[reference].errors[name] = *why;
        } else {
            // The reference first: its decisions are its outputs.
            std::vector<std::size_t> order{reference};
            for (std::size_t i = 0; i < nodes.size(); ++i)
                if (i != reference) order.push_back(i);
            for (std::size_t i : order) {
                StepOutput o;
                const std::optional<std::int64_t> faults_before = nodes[i]->injected_faults();
                if (auto failed = as_node_failure([&] { o = s.collect(env, *timed[i], decisions, i == reference); })) {
                    recs[i].errors[name] = *failed;
                    continue;
                }
                if (faults_before)
                    recs[i].faults = std::map<std::string, std::int64_t>{{name, *nodes[i]->injected_faults() - *faults_before}};
                if (i == reference) detail::check_reference_finite(o, timing.nodes[i], name, ac.model);
                outs[i].add(std::move(o));
                recs[i].steps.push_back(name);
            }
        }
        for (std::size_t i = 0; i < nodes.size(); ++i) recs[i].outputs = &outs[i];
        detail::compare_step(p, name, recs, reference, led, out);

        StepTiming st{name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), {}};
        for (std::size_t i = 0; i < nodes.size(); ++i) st.node_seconds.push_back(clock.seconds(i) - before[i]);
        timing.steps.push_back(std::move(st));
    }

    record_node_counters(nodes, timing);
    run.inputs = led.inputs();
    for (const NodeInput& f : ac.failed_nodes) {
        KVASIR_CHECK(!f.errors.empty(), ErrorCode::internal, "failed node '{}' without an error", f.node);
        run.inputs.push_back(f);
    }
    mark_contrast(run.inputs, ac.contrast_nodes);
    const Tolerances sens = tolerances_of_steps(p.sensitive, out.protocol.steps_judged),
                     tol = tolerances_of_steps(p.tolerant, out.protocol.steps_judged);
    out.nodes = judge(run.inputs, p, &sens, &tol);
    return run;
}

AuditRun compare_captures(const CompareConfig& cc, const std::vector<const Capture*>& caps, std::size_t reference) {
    KVASIR_ASSERT(cc.protocol != nullptr);
    const Protocol& p = *cc.protocol;
    KVASIR_CHECK(!caps.empty(), ErrorCode::bad_input, "compare needs at least one capture");
    KVASIR_CHECK(reference < caps.size(), ErrorCode::bad_input, "reference index {} of {} captures", reference, caps.size());
    // A step name from a file or the command line: unknown names are the input's problem, not a bug.
    const auto runs = [&](const std::string& st) {
        const auto& known = protocol_step_names();
        return std::find(known.begin(), known.end(), st) != known.end() && p.runs(st);
    };
    const std::vector<std::string> only = select_steps(p, cc.only_steps, "--only-steps");
    // They must be captures of the same thing.
    std::string fingerprint;
    std::map<std::string, std::string> names;
    for (std::size_t ci = 0; ci < caps.size(); ++ci) {
        const Capture* c = caps[ci];
        KVASIR_CHECK(c->protocol_hash() == p.content_hash, ErrorCode::bad_input,
                     "{}: captured with protocol hash {}, but {} ({} v{}) has {}", c->path(), c->protocol_hash(), p.source,
                     p.id, p.version, p.content_hash);
        KVASIR_CHECK(c->seed() == caps[0]->seed(), ErrorCode::bad_input, "{}: seed {} differs from {}'s seed {}", c->path(),
                     c->seed(), caps[0]->path(), caps[0]->seed());
        if (!c->model_fingerprint().empty()) {
            if (fingerprint.empty()) fingerprint = c->model_fingerprint();
            KVASIR_CHECK(c->model_fingerprint() == fingerprint, ErrorCode::bad_input,
                         "{}: model fingerprint {} differs from {} (another model was captured)", c->path(),
                         c->model_fingerprint(), fingerprint);
        }
        // Steps the protocol does not have (a forged list: the protocol hash already matched). The name is
        // shown JSON-quoted: it comes from the file.
        for (const std::string& st : c->steps())
            KVASIR_CHECK(runs(st), ErrorCode::bad_input, "{}: captures step {}, which protocol '{}' does not run",
                         c->path(), nlohmann::json(st).dump(), p.id);
        for (const auto& [st, why] : c->not_captured())
            KVASIR_CHECK(runs(st), ErrorCode::bad_input,
                         "{}: declares step {} not captured, which protocol '{}' does not run", c->path(),
                         nlohmann::json(st).dump(), p.id);
        for (std::size_t k = 0; k < ci; ++k)
            KVASIR_CHECK(caps[k]->metadata().at("content_hash") != c->metadata().at("content_hash"), ErrorCode::bad_input,
                         "{} and {} are the same capture (content hash {}): a node compared with itself",
                         caps[k]->path(), c->path(), c->metadata().at("content_hash").substr(0, 19));
        const auto [it, fresh] = names.emplace(c->node(), c->path());
        KVASIR_CHECK(fresh, ErrorCode::bad_input, "{} and {} both capture node '{}'", it->second, c->path(), c->node());
    }
    // Every tensor a candidate shares with the reference has the reference's
    // shape and kind (ids integer, values floating point; the width may
    // differ: f32 against the f64 oracle). The content hash only says the
    // file is as written — a tensor reshaped and rehashed is refused here,
    // naming it, instead of being compared element by element with the wrong
    // layout.
    const Capture& ref_cap = *caps[reference];
    for (std::size_t ci = 0; ci < caps.size(); ++ci) {
        if (ci == reference) continue;
        const Capture& c = *caps[ci];
        for (const std::string& name : c.tensor_names()) {
            if (!ref_cap.has(name)) continue;
            const TensorView a = c.view(name), r = ref_cap.view(name);
            KVASIR_CHECK(a.shape == r.shape, ErrorCode::bad_input,
                         "{}: tensor {} has shape {}, but the reference capture {} has {}: refused (a reshaped tensor, even "
                         "with a valid content hash)",
                         c.path(), nlohmann::json(name).dump(), shape_str(a.shape), ref_cap.path(), shape_str(r.shape));
            KVASIR_CHECK(dtype_is_float(a.dtype) == dtype_is_float(r.dtype), ErrorCode::bad_input,
                         "{}: tensor {} is {}, but the reference capture {} has {}: refused (ids and values cannot be compared)",
                         c.path(), nlohmann::json(name).dump(), dtype_name(a.dtype), ref_cap.path(), dtype_name(r.dtype));
        }
    }

    AuditRun run;
    AuditReport& out = run.report;
    out.protocol = protocol_ref(p);
    out.protocol.steps_judged = only;
    out.model = nlohmann::ordered_json::object();
    out.model["fingerprint"] = fingerprint.empty() ? std::string("none (model-independent captures)") : fingerprint;
    out.model["source"] = "captures";
    out.reference = caps[reference]->node();
    out.seed = caps[0]->seed();
    out.gate = cc.gate;

    std::vector<NodeInput> inputs;
    std::vector<detail::NodeRecord> recs;
    for (const Capture* c : caps) {
        NodeInput n;
        n.node = c->node();
        n.capabilities = c->capabilities();
        inputs.push_back(std::move(n));
        recs.push_back({c, c->steps(), c->errors(), c->not_captured(), c->free_running(), c->faults_injected()});
    }
    Ledger led(std::move(inputs), reference);
    nlohmann::ordered_json sources = nlohmann::ordered_json::array();
    for (const Capture* c : caps) sources.push_back({{"node", c->node()}, {"capture", c->path()}});
    out.steps["captures"] = sources;

    for (const Step* s : audit_steps()) {
        if (!p.runs(s->name()) || !step_selected(only, s->name())) continue;
        run.step_order.push_back(s->name());
        detail::compare_step(p, s->name(), recs, reference, led, out);
    }

    run.inputs = led.inputs();
    for (const NodeInput& f : cc.failed_nodes) {
        KVASIR_CHECK(!f.errors.empty(), ErrorCode::internal, "failed node '{}' without an error", f.node);
        run.inputs.push_back(f);
    }
    mark_contrast(run.inputs, cc.contrast_nodes);
    // Judge only the steps compared: the protocol's tolerances restricted to them.
    const Tolerances sens = tolerances_of_steps(p.sensitive, only), tol = tolerances_of_steps(p.tolerant, only);
    out.nodes = judge(run.inputs, p, &sens, &tol);
    return run;
}

}  // namespace kvasir
