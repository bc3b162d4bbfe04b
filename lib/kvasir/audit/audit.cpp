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
#include "kvasir/steps/node_clock.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>

namespace kvasir {

std::vector<std::string> select_steps(const Protocol& p, const std::vector<std::string>& asked, const char* option) {
    std::vector<std::string> runs;
    for (const std::string& s : protocol_step_names())
        if (p.runs(s)) runs.push_back(s);
    for (const std::string& s : asked)
        KVASIR_CHECK(std::find(runs.begin(), runs.end(), s) != runs.end(), ErrorCode::bad_input,
                     "{}: protocol '{}' does not run step {} (it runs: {})", option, p.id, nlohmann::json(s).dump(),
                     fmt::join(runs, ", "));
    std::vector<std::string> out;
    for (const std::string& s : runs)
        if (std::find(asked.begin(), asked.end(), s) != asked.end()) out.push_back(s);
    return out;
}

bool step_selected(const std::vector<std::string>& steps, std::string_view step) {
    return steps.empty() || std::find(steps.begin(), steps.end(), step) != steps.end();
}

Tolerances tolerances_of_steps(const Tolerances& tier, const std::vector<std::string>& steps) {
    Tolerances out;
    for (const auto& [name, t] : tier) {
        const auto info = find_criterion(name);
        if (info && step_selected(steps, info->step)) out.emplace(name, t);
    }
    return out;
}

namespace detail {

TokenSequence stream_tokens(const TokenStream& s, const Model& model) {
    return {read_token_stream(s, model.path()),
            fmt::format("{}{} [{}, {})", s.text ? "text " : "", s.path, s.offset, s.offset + s.count)};
}

AuditPlan make_audit_plan(const AuditConfig& ac) {
    KVASIR_ASSERT(ac.protocol != nullptr && ac.model != nullptr);
    AuditPlan plan;
    plan.seed = ac.seed.value_or(ac.protocol->seed);
    const std::vector<std::string> only = select_steps(*ac.protocol, ac.only_steps, "--steps");
    for (const Step* s : audit_steps())
        if (step_selected(only, s->name()) && s->plan(ac, plan)) plan.steps.push_back(s->name());
    // What each node's process holds at once: its own outputs and the
    // authority's beside it (two nodes), for the longest token stream.
    const std::pair<const char*, const StepCommon*> forward[] = {
        {"drift", plan.drift ? &*plan.drift : nullptr},       {"logits", plan.logits ? &*plan.logits : nullptr},
        {"decide", plan.decide ? &*plan.decide : nullptr},    {"generate", plan.generate ? &*plan.generate : nullptr},
        {"perplexity", plan.perplexity ? &*plan.perplexity : nullptr}};
    for (const auto& [name, common] : forward)
        if (common != nullptr) check_step_memory(*common, 2, fmt::format("{}: /steps/{}", ac.protocol->source, name));
    return plan;
}

std::optional<std::string> first_non_finite_weight(const Model& model) {
    const auto check = [](const TensorView& v, const std::string& what) -> std::optional<std::string> {
        if (!present(v)) return std::nullopt;
        for (std::int64_t i = 0; i < v.numel(); ++i)
            if (!std::isfinite(v.at(i))) return fmt::format("{} element {} is {}", what, i, v.at(i));
        return std::nullopt;
    };
    if (auto w = check(model.embed(), "the embedding")) return w;
    for (std::int64_t l = 0; l < model.config().num_layers; ++l) {
        const LayerWeights& lw = model.layer(l);
        for (const auto& [v, what] : lw.named_views())
            if (auto w = check(*v, fmt::format("layer {} {}", l, what))) return w;
        for (std::size_t e = 0; e < lw.experts.size(); ++e) {
            const ExpertWeights& x = lw.experts[e];
            for (const auto& [v, what] : {std::pair{&x.gate, "gate_proj"}, std::pair{&x.up, "up_proj"},
                                          std::pair{&x.down, "down_proj"}, std::pair{&x.gate_bias, "gate_proj bias"},
                                          std::pair{&x.up_bias, "up_proj bias"}, std::pair{&x.down_bias, "down_proj bias"}})
                if (auto w = check(*v, fmt::format("layer {} expert {} {}", l, e, what))) return w;
        }
    }
    if (auto w = check(model.final_norm(), "the final norm")) return w;
    if (auto w = check(model.lm_head(), "lm_head")) return w;
    return std::nullopt;
}

void check_reference_finite(const StepOutput& out, const std::string& node, const std::string& step, const Model* model) {
    const std::optional<std::string> where = first_non_finite(out);
    if (!where) return;
    if (model != nullptr)
        if (const auto w = first_non_finite_weight(*model))
            fail(ErrorCode::bad_input,
                 "the model is not finite: {} (the reference {} computes {} in step {}); no candidate is judged against "
                 "a broken model — fix the checkpoint",
                 *w, node, *where, step);
    fail(ErrorCode::bad_input,
         "the reference {} computed a non-finite value from finite inputs in step {}: {}; it cannot be the yardstick "
         "(name another node with --reference)",
         node, step, *where);
}

void compare_step(const Protocol& p, const std::string& name, const std::vector<NodeRecord>& nodes, std::size_t reference,
                  Ledger& led, AuditReport& out) {
    const Step& s = step_named(name);
    const std::size_t n = nodes.size();
    std::vector<bool> present(n, false);
    std::vector<const NodeOutputs*> outs(n);
    for (std::size_t i = 0; i < n; ++i) {
        outs[i] = nodes[i].outputs;
        const bool ran = std::find(nodes[i].steps.begin(), nodes[i].steps.end(), name) != nodes[i].steps.end();
        const auto e = nodes[i].errors.find(name);
        present[i] = ran && e == nodes[i].errors.end();
    }
    if (!present[reference]) {
        const NodeRecord& r = nodes[reference];
        const auto e = r.errors.find(name);
        const std::string why = e != r.errors.end() ? e->second : fmt::format("{} has no step '{}'", r.outputs->origin(), name);
        led.reference_failed(name, why);
        out.steps[name] = nlohmann::ordered_json{{"error", why}};
        return;
    }
    // A fault-injecting node that ran the step: what its fault did there
    // (the verdict tells a fault that never fired from one not caught).
    for (std::size_t i = 0; i < n; ++i)
        if (nodes[i].faults && present[i]) {
            const auto f = nodes[i].faults->find(name);
            led.faults_fired(i, name, f != nodes[i].faults->end() ? f->second : 0);
        }
    std::vector<bool> free(n, false);
    for (std::size_t i = 0; i < n; ++i) {
        free[i] = nodes[i].free_running;
        if (present[i]) continue;
        const auto e = nodes[i].errors.find(name);
        if (const auto nc = nodes[i].not_captured.find(name); e == nodes[i].errors.end() && nc != nodes[i].not_captured.end()) {
            for (const CriterionInfo& c : s.criteria())
                led.not_applicable_for(i, c.name, fmt::format("step {} not captured by this node: {}", name, nc->second));
            continue;
        }
        led.error(i, name, e != nodes[i].errors.end() ? e->second
                                                      : fmt::format("not captured ({} has no step '{}')", nodes[i].outputs->origin(), name));
    }
    // A problem with the reference's own tensors (a capture without them)
    // leaves nothing compared; a candidate's is that candidate's (the step
    // records it).
    if (auto why = as_node_failure([&] { out.steps[name] = s.compare(p, StepNodes{outs, present, reference, free}, led, out); })) {
        led.reference_failed(name, *why);
        out.steps[name] = nlohmann::ordered_json{{"error", *why}};
    }
}

}  // namespace detail

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
    const detail::AuditPlan plan = detail::make_audit_plan(ac);  // every bad input is refused here, before any work

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
