#include "kvasir/steps/audit.hpp"
#include "kvasir/steps/audit_plan.hpp"
#include "kvasir/steps/capture.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/steps/decide.hpp"
#include "kvasir/steps/drift.hpp"
#include "kvasir/steps/forward.hpp"
#include "kvasir/steps/generate.hpp"
#include "kvasir/steps/logits.hpp"
#include "kvasir/steps/op_delta.hpp"
#include "kvasir/steps/perplexity.hpp"
#include "kvasir/steps/protocol_steps.hpp"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <cmath>
#include <limits>
#include <map>

namespace kvasir {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Guarded max_rel of b against a (0 when bit-identical; NaN when their
// non-finite patterns differ).
double run_to_run_rel(const Tensor& a, const Tensor& b) {
    if (same_bits(a.view(), b.view())) return 0.0;
    const CompareStats s = compare(a.view(), b.view());
    return finite_parity(s) ? s.max_rel : kNaN;
}

TokenSequence stream_tokens(const TokenStream& s) {
    return {read_token_stream(s), fmt::format("{} [{}, {})", s.path, s.offset, s.offset + s.count)};
}

// NaN-sticky maximum.
double worse_max(double a, double b) { return (std::isnan(a) || std::isnan(b)) ? kNaN : std::max(a, b); }

template <class C>
C token_step(const AuditConfig& ac, std::uint64_t seed, const TokenStream& s) {
    C c;
    c.model = ac.model;
    c.tokens = stream_tokens(s);
    c.seed = seed;
    c.repeat = false;  // self non-determinism is the determinism step's business
    return c;
}

}  // namespace

namespace detail {

AuditPlan make_audit_plan(const AuditConfig& ac) {
    const Protocol& p = *ac.protocol;
    AuditPlan plan;
    plan.seed = ac.seed.value_or(p.seed);
    if (p.ops.enabled) {
        OpsConfig oc = p.ops_config();
        oc.seed = plan.seed;
        if (p.ops.weights == "model") {
            oc.model = ac.model;
            oc.layer = p.ops.layer;
        }
        oc.validate();
        plan.ops = oc;
        plan.steps.push_back("ops");
    }
    if (p.drift.enabled) {
        plan.drift = token_step<DriftConfig>(ac, plan.seed, p.drift.tokens);
        plan.drift->validate();
        plan.steps.push_back("drift");
    }
    if (p.logits.enabled) {
        plan.logits = token_step<LogitsConfig>(ac, plan.seed, p.logits.tokens);
        plan.logits->router_authority = true;
        plan.logits->validate();
        plan.steps.push_back("logits");
    }
    if (p.decide.enabled) {
        plan.decide = token_step<DecideConfig>(ac, plan.seed, p.decide.tokens);
        plan.decide->validate();
        plan.steps.push_back("decide");
    }
    if (p.generate.enabled) {
        plan.generate = token_step<GenerateConfig>(ac, plan.seed, p.generate.prompt);
        plan.generate->new_tokens = static_cast<int>(p.generate.n);
        plan.generate->validate();
        plan.steps.push_back("generate");
    }
    if (p.perplexity.enabled) {
        plan.perplexity = token_step<PerplexityConfig>(ac, plan.seed, p.perplexity.tokens);
        plan.perplexity->context = p.perplexity.context;
        plan.perplexity->router_authority = true;
        plan.perplexity->validate();
        plan.steps.push_back("perplexity");
    }
    if (p.determinism.enabled) {
        // The longest forward any token step runs (the logits stream when
        // there is one): determinism is measured on the work the audit does.
        const TokenStream* s = p.logits.enabled ? &p.logits.tokens
                               : p.drift.enabled ? &p.drift.tokens
                               : p.decide.enabled ? &p.decide.tokens
                                                  : nullptr;
        StepCommon c;
        c.model = ac.model;
        c.tokens = s ? stream_tokens(*s) : seeded_tokens(plan.seed, 16, ac.model->config().vocab_size);
        c.validate();
        plan.determinism_tokens = c.tokens;
        plan.repeats = p.determinism.repeats;
        plan.steps.push_back("determinism");
    }
    return plan;
}

double determinism_of(Backend& node, const Model& model, const std::vector<std::int32_t>& ids, int repeats,
                      std::int64_t* routing_rows) {
    const ForwardResult first = forward(node, model, ids);
    double worst = 0;
    std::int64_t rows = 0;
    for (int r = 1; r < repeats; ++r) {
        const ForwardResult again = forward(node, model, ids);
        worst = worse_max(worst, run_to_run_rel(first.logits, again.logits));
        worst = worse_max(worst, run_to_run_rel(first.final_hidden, again.final_hidden));
        for (std::size_t k = 0; k < first.hidden.size() && k < again.hidden.size(); ++k)
            worst = worse_max(worst, run_to_run_rel(first.hidden[k], again.hidden[k]));
        rows += run_to_run_delta(first, again).routing_rows_differing;
    }
    if (routing_rows != nullptr) *routing_rows = rows;
    return worst;
}

}  // namespace detail

namespace {

using detail::AuditPlan;

// Per-node accumulation of measurements and errors.
class Ledger {
public:
    Ledger(const std::vector<std::unique_ptr<Backend>>& nodes, std::size_t reference) : reference_(reference) {
        for (std::size_t i = 0; i < nodes.size(); ++i) inputs_.push_back(node_input(nodes[i]->capabilities(), i == reference));
        for (std::size_t i = 0; i < nodes.size(); ++i) index_[inputs_[i].node] = i;
    }
    Ledger(std::vector<NodeInput> inputs, std::size_t reference) : reference_(reference), inputs_(std::move(inputs)) {
        for (std::size_t i = 0; i < inputs_.size(); ++i) {
            inputs_[i].is_reference = i == reference;
            index_[inputs_[i].node] = i;
        }
    }
    std::size_t index_of(const std::string& node) const {
        const auto it = index_.find(node);
        KVASIR_CHECK(it != index_.end(), ErrorCode::internal, "a step reported node '{}' that the audit did not create", node);
        return it->second;
    }
    void measure(std::size_t i, const std::string& step, const std::string& criterion, double value) {
        inputs_[i].measurements.push_back({criterion, step, value});
    }
    void error(std::size_t i, const std::string& step, const std::string& message) {
        std::string& e = inputs_[i].errors[step];
        e = e.empty() ? message : e + "; " + message;
    }
    // The reference failed a step: nothing was compared.
    void reference_failed(const std::string& step, const std::string& message) {
        for (std::size_t i = 0; i < inputs_.size(); ++i)
            error(i, step, i == reference_ ? message : "not compared: the reference failed: " + message);
    }
    std::vector<NodeInput>& inputs() { return inputs_; }

private:
    std::size_t reference_;
    std::vector<NodeInput> inputs_;
    std::map<std::string, std::size_t> index_;
};

void take_ops(const OpsReport& r, Ledger& led, AuditReport& out) {
    const std::size_t ref = r.reference;
    for (const OpResult& op : r.ops) {
        for (std::size_t i = 0; i < r.nodes.size(); ++i) {
            if (!op.errors[i].empty()) led.error(i, "ops", op.op + ": " + op.errors[i]);
            if (i != ref && !op.errors[ref].empty())
                led.error(i, "ops", op.op + ": not compared: the reference failed: " + op.errors[ref]);
            if (i == ref || !op.matrix[ref][i]) continue;
            led.measure(i, "ops", "ops." + op.op + ".max_rel", op.matrix[ref][i]->max_rel);
            led.measure(i, "ops", "ops." + op.op + ".cosine_min", op.matrix[ref][i]->cosine);
        }
    }
    for (const ShardCheck& s : r.shard_checks) {
        const std::size_t i = led.index_of(s.node);
        if (!s.error.empty()) led.error(i, "ops", "shard check: " + s.error);
        if (s.stats) led.measure(i, "ops", "shard.max_rel", s.stats->max_rel);
    }
    // The MoE block first: it is the headline matrix (CSV, heatmap).
    for (const OpResult& op : r.ops)
        if (op.op == "moe") out.pairs.push_back(pair_matrix(r, op.op));
    for (const OpResult& op : r.ops)
        if (op.op != "moe") out.pairs.push_back(pair_matrix(r, op.op));
}

// α for the verdict: see the header.
double drift_alpha(const NodeDrift& d) {
    if (d.fit.points_used >= 2) return d.fit.alpha;  // NaN only if the fit itself failed
    for (const LayerDrift& l : d.layers)
        if (!std::isfinite(l.free_rel)) return kNaN;
    return 0.0;
}

void take_drift(const DriftReport& r, Ledger& led, AuditReport& out) {
    for (const NodeDrift& d : r.results) {
        const std::size_t i = led.index_of(d.node);
        if (!d.error.empty()) {
            led.error(i, "drift", d.error);
            continue;
        }
        DriftSeries s{d.node, {}, drift_alpha(d)};
        for (const LayerDrift& l : d.layers) s.rel.push_back(l.free_rel);
        led.measure(i, "drift", "drift.final_rel", d.layers.empty() ? kNaN : d.layers.back().free_rel);
        led.measure(i, "drift", "drift.alpha_max", s.alpha);
        out.drift.push_back(std::move(s));
    }
}

void take_logits(const LogitsReport& r, Ledger& led) {
    for (const NodeLogits& n : r.results) {
        const std::size_t i = led.index_of(n.node);
        if (!n.error.empty()) {
            led.error(i, "logits", n.error);
            continue;
        }
        led.measure(i, "logits", "logits.kl_p99", n.kl.p99);
        led.measure(i, "logits", "logits.linf_max", n.linf.max);
    }
}

void take_decide(const DecideReport& r, Ledger& led) {
    for (const NodeDecide& n : r.results) {
        const std::size_t i = led.index_of(n.node);
        if (!n.error.empty()) {
            led.error(i, "decide", n.error);
            continue;
        }
        led.measure(i, "decide", "decide.top1_agreement_min", n.top1_pinned.rate);
        if (n.routing_free.rows > 0) led.measure(i, "decide", "decide.routing_agreement_min", n.routing_free.exact_match_rate);
    }
}

void take_generate(const GenerateReport& r, const Protocol& p, Ledger& led) {
    for (const NodeGenerate& n : r.results) {
        const std::size_t i = led.index_of(n.node);
        if (!n.error.empty()) {
            led.error(i, "generate", n.error);
            continue;
        }
        const double first = n.first_divergence < 0 ? static_cast<double>(r.config.new_tokens)
                                                    : static_cast<double>(n.first_divergence);
        led.measure(i, "generate", "generate.first_divergence_min", first);
        if (p.generate.teacher_forcing)
            led.measure(i, "generate", "generate.divergences_max", static_cast<double>(n.divergences));
    }
}

void take_perplexity(const PerplexityReport& r, Ledger& led) {
    for (const NodePerplexity& n : r.results) {
        const std::size_t i = led.index_of(n.node);
        if (!n.error.empty()) {
            led.error(i, "perplexity", n.error);
            continue;
        }
        if (n.reference) continue;
        led.measure(i, "perplexity", "perplexity.ratio_max", std::abs(n.ratio - 1.0));
    }
}

nlohmann::ordered_json run_determinism(const AuditPlan& plan, const AuditConfig& ac, std::vector<std::unique_ptr<Backend>>& nodes,
                                       Ledger& led) {
    nlohmann::ordered_json j;
    j["tokens_source"] = plan.determinism_tokens->source;
    j["token_count"] = plan.determinism_tokens->ids.size();
    j["repeats"] = plan.repeats;
    j["compared"] = "logits, final hidden and every hidden state of the full forward (own router), runs 2..R vs run 1";
    nlohmann::ordered_json per = nlohmann::ordered_json::array();
    const auto& ids = plan.determinism_tokens->ids;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        nlohmann::ordered_json nj;
        nj["node"] = nodes[i]->capabilities().node;
        try {
            std::int64_t routing_rows = 0;
            const double worst = detail::determinism_of(*nodes[i], *ac.model, ids, plan.repeats, &routing_rows);
            led.measure(i, "determinism", "determinism", worst);
            nj["bit_identical"] = worst == 0.0;
            nj["run_to_run_max_rel"] = json_double(worst);
            nj["routing_rows_differing"] = routing_rows;
        } catch (const Error& e) {
            if (e.code() == ErrorCode::internal) throw;
            led.error(i, "determinism", e.what());  // each node against its own first run: no one else is affected
            nj["error"] = e.what();
        }
        per.push_back(std::move(nj));
    }
    j["nodes"] = std::move(per);
    return j;
}

// Bytes of memory the kernel could hand out now (MemAvailable), 0 when unknown.
std::uint64_t available_memory() {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    std::uint64_t kib = 0;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024;
    return 0;
}

// The load phase: read what the steps will use — the whole model when a step
// runs the forward pass, the ops layer when only step 1 uses real weights.
void load_weights(const AuditPlan& plan, const Model& model, RunTimings& t) {
    const bool forward = plan.drift || plan.logits || plan.decide || plan.generate || plan.perplexity ||
                         plan.determinism_tokens;
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
    const std::uint64_t avail = available_memory();
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
    const AuditPlan plan = detail::make_audit_plan(ac);  // every bad input is refused here, before any work

    AuditRun run;
    run.step_order = plan.steps;
    AuditReport& out = run.report;
    out.protocol = protocol_ref(p);
    out.model = audit_model_json(*ac.model);
    out.reference = nodes[reference]->capabilities().node;
    out.seed = plan.seed;
    out.gate = ac.gate;
    Ledger led(nodes, reference);

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
    // Runs one step; a failure of the reference (the runners record the
    // candidates' own failures) is recorded, anything internal propagates.
    auto step = [&](const std::string& name, auto&& body) {
        ++step_index;
        step_name = name;
        clock.new_phase();
        if (ac.progress) ac.progress({name, step_index, step_count, "", 0, node_count});
        std::vector<double> before(nodes.size());
        for (std::size_t i = 0; i < nodes.size(); ++i) before[i] = clock.seconds(i);
        const auto t0 = std::chrono::steady_clock::now();
        try {
            body();
        } catch (const Error& e) {
            if (e.code() == ErrorCode::internal) throw;
            led.reference_failed(name, e.what());
            out.steps[name] = nlohmann::ordered_json{{"error", e.what()}};
        }
        StepTiming st{name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), {}};
        for (std::size_t i = 0; i < nodes.size(); ++i) st.node_seconds.push_back(clock.seconds(i) - before[i]);
        timing.steps.push_back(std::move(st));
    };

    if (plan.ops) step("ops", [&] {
            const OpsReport r = run_op_delta(*plan.ops, timed, reference);
            take_ops(r, led, out);
            out.steps["ops"] = to_json(r);
        });
    if (plan.drift) step("drift", [&] {
            const DriftReport r = run_drift(*plan.drift, timed, reference);
            take_drift(r, led, out);
            out.steps["drift"] = to_json(r);
        });
    if (plan.logits) step("logits", [&] {
            const LogitsReport r = run_logits(*plan.logits, timed, reference);
            take_logits(r, led);
            out.steps["logits"] = to_json(r);
        });
    if (plan.decide) step("decide", [&] {
            const DecideReport r = run_decide(*plan.decide, timed, reference);
            take_decide(r, led);
            out.steps["decide"] = to_json(r);
        });
    if (plan.generate) step("generate", [&] {
            const GenerateReport r = run_generate(*plan.generate, timed, reference);
            take_generate(r, p, led);
            out.steps["generate"] = to_json(r);
        });
    if (plan.perplexity) step("perplexity", [&] {
            const PerplexityReport r = run_perplexity(*plan.perplexity, timed, reference);
            take_perplexity(r, led);
            out.steps["perplexity"] = to_json(r);
        });
    // Determinism records each node's own failure itself (nobody else is
    // affected); only Error(internal) leaves it.
    if (plan.determinism_tokens)
        step("determinism", [&] { out.steps["determinism"] = run_determinism(plan, ac, timed, led); });

    run.inputs = led.inputs();
    for (const NodeInput& f : ac.failed_nodes) {
        KVASIR_CHECK(!f.errors.empty(), ErrorCode::internal, "failed node '{}' without an error", f.node);
        run.inputs.push_back(f);
    }
    out.nodes = judge(run.inputs, p);
    return run;
}

namespace {

bool wants_step(const CompareConfig& c, const std::string& step) {
    if (!c.protocol->runs(step)) return false;
    return c.only_steps.empty() || std::find(c.only_steps.begin(), c.only_steps.end(), step) != c.only_steps.end();
}

// "drift.hidden.<l>" for l = 0 … until absent.
std::vector<TensorView> numbered(const Capture& c, const std::string& prefix) {
    std::vector<TensorView> out;
    for (std::size_t l = 0; c.has(prefix + std::to_string(l)); ++l) out.push_back(c.view(prefix + std::to_string(l)));
    return out;
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

Capabilities capabilities_named(const std::string& node) {
    Capabilities c;
    c.node = node;
    return c;
}

}  // namespace

AuditRun compare_captures(const CompareConfig& cc, const std::vector<const Capture*>& caps, std::size_t reference) {
    KVASIR_ASSERT(cc.protocol != nullptr);
    const Protocol& p = *cc.protocol;
    KVASIR_CHECK(!caps.empty(), ErrorCode::bad_input, "compare needs at least one capture");
    KVASIR_CHECK(reference < caps.size(), ErrorCode::bad_input, "reference index {} of {} captures", reference, caps.size());
    for (const std::string& s : cc.only_steps)
        KVASIR_CHECK(p.runs(s), ErrorCode::bad_input, "--only-steps: protocol '{}' does not run step '{}'", p.id, s);
    // They must be captures of the same thing.
    std::string fingerprint;
    std::map<std::string, std::string> names;
    for (const Capture* c : caps) {
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
        const auto [it, fresh] = names.emplace(c->node(), c->path());
        KVASIR_CHECK(fresh, ErrorCode::bad_input, "{} and {} both capture node '{}'", it->second, c->path(), c->node());
    }

    AuditRun run;
    AuditReport& out = run.report;
    out.protocol = protocol_ref(p);
    out.model = nlohmann::ordered_json::object();
    out.model["fingerprint"] = fingerprint.empty() ? std::string("none (model-independent captures)") : fingerprint;
    out.model["source"] = "captures";
    out.reference = caps[reference]->node();
    out.seed = caps[0]->seed();
    out.gate = cc.gate;

    std::vector<NodeInput> inputs;
    for (const Capture* c : caps) {
        NodeInput n;
        n.node = c->node();
        n.capabilities = c->capabilities();
        inputs.push_back(std::move(n));
    }
    Ledger led(std::move(inputs), reference);
    const std::size_t n = caps.size();
    const Capture& ref = *caps[reference];
    nlohmann::ordered_json sources = nlohmann::ordered_json::array();
    for (const Capture* c : caps) sources.push_back({{"node", c->node()}, {"capture", c->path()}});
    out.steps["captures"] = sources;

    // Which captures took part in a step; the others get their error.
    auto present = [&](const std::string& step) {
        std::vector<bool> ok(n, false);
        for (std::size_t i = 0; i < n; ++i) {
            const Capture& c = *caps[i];
            if (const auto e = c.errors().find(step); e != c.errors().end())
                led.error(i, step, e->second);
            else if (!c.has_step(step))
                led.error(i, step, fmt::format("not captured ({} has no step '{}')", c.path(), step));
            ok[i] = c.has_step(step);
        }
        if (!ok[reference]) led.reference_failed(step, fmt::format("the reference capture {} has no step '{}'", ref.path(), step));
        return ok;
    };
    auto step = [&](const std::string& name, auto&& body) {
        if (!wants_step(cc, name)) return;
        run.step_order.push_back(name);
        const std::vector<bool> ok = present(name);
        if (!ok[reference]) return;
        try {
            body(ok);
        } catch (const Error& e) {
            if (e.code() == ErrorCode::internal) throw;
            led.reference_failed(name, e.what());
        }
    };

    step("ops", [&](const std::vector<bool>& ok) {
        OpsReport r;
        r.reference = reference;
        for (const Capture* c : caps) r.nodes.push_back(capabilities_named(c->node()));
        for (const std::string& op : all_op_names()) {
            bool any = false;
            std::vector<std::optional<TensorView>> values(n), ids(n);
            std::vector<std::string> errors(n);
            for (std::size_t i = 0; i < n; ++i) {
                if (!ok[i] || !caps[i]->has("ops." + op + ".out")) continue;
                any = true;
                values[i] = caps[i]->view("ops." + op + ".out");
                if (caps[i]->has("ops." + op + ".ids")) ids[i] = caps[i]->view("ops." + op + ".ids");
            }
            if (!any) continue;
            std::string op_inputs = "from captures";
            const auto& meta = ref.metadata();
            if (const auto m = meta.find("ops_inputs"); m != meta.end()) {
                const auto j = nlohmann::json::parse(m->second, nullptr, false);
                if (j.is_object() && j.contains(op) && j[op].is_string()) op_inputs = j[op].get<std::string>();
            }
            for (std::size_t i = 0; i < n; ++i)
                if (ok[i] && !values[i]) errors[i] = "not captured";
            r.ops.push_back(op_result_from_outputs(op, op_inputs, values, ids, std::move(errors)));
        }
        for (std::size_t i = 0; i < n; ++i) {
            if (!ok[i] || !caps[i]->has("ops.moe.shard_combined") || !caps[i]->has("ops.moe.out")) continue;
            ShardCheck sc;
            sc.node = caps[i]->node();
            sc.shards = static_cast<int>(p.ops.shards);
            sc.stats = compare(caps[i]->view("ops.moe.out"), caps[i]->view("ops.moe.shard_combined"));
            r.shard_checks.push_back(std::move(sc));
        }
        take_ops(r, led, out);
    });

    step("drift", [&](const std::vector<bool>& ok) {
        const std::vector<TensorView> rh = numbered(ref, "drift.hidden.");
        KVASIR_CHECK(rh.size() >= 2, ErrorCode::bad_input, "{}: drift step without hidden states", ref.path());
        DriftReport r;
        for (std::size_t i = 0; i < n; ++i) {
            if (i == reference || !ok[i]) continue;
            NodeDrift nd;
            nd.node = caps[i]->node();
            try {
                const std::vector<TensorView> ch = numbered(*caps[i], "drift.hidden.");
                KVASIR_CHECK(ch.size() == rh.size(), ErrorCode::bad_input, "{}: {} hidden states, the reference has {}",
                             caps[i]->path(), ch.size(), rh.size());
                std::vector<double> depth, delta;
                for (std::size_t k = 1; k < rh.size(); ++k) {
                    LayerDrift ld;
                    ld.layer = static_cast<std::int64_t>(k) - 1;
                    ld.free_rel = relative_l2(rh[k], ch[k]);
                    depth.push_back(static_cast<double>(k));
                    delta.push_back(ld.free_rel);
                    nd.layers.push_back(ld);
                }
                nd.fit = fit_power_law(depth, delta);
            } catch (const Error& e) {
                if (e.code() == ErrorCode::internal) throw;
                nd = NodeDrift{};
                nd.node = caps[i]->node();
                nd.error = e.what();
            }
            r.results.push_back(std::move(nd));
        }
        take_drift(r, led, out);
    });

    step("logits", [&](const std::vector<bool>& ok) {
        const TensorView rl = ref.view("logits.logits");
        LogitsReport r;
        for (std::size_t i = 0; i < n; ++i) {
            if (i == reference || !ok[i]) continue;
            NodeLogits nl;
            nl.node = caps[i]->node();
            try {
                nl.positions = logit_divergence(rl, caps[i]->view("logits.logits"));
                nl.linf = summarize(nl.positions.linf);
                nl.kl = summarize(nl.positions.kl);
            } catch (const Error& e) {
                if (e.code() == ErrorCode::internal) throw;
                nl = NodeLogits{};
                nl.node = caps[i]->node();
                nl.error = e.what();
            }
            r.results.push_back(std::move(nl));
        }
        take_logits(r, led);
    });

    step("decide", [&](const std::vector<bool>& ok) {
        const TensorView rl = ref.view("decide.pinned.logits");
        const std::vector<TensorView> rids = numbered(ref, "decide.free.ids.");
        DecideReport r;
        for (std::size_t i = 0; i < n; ++i) {
            if (i == reference || !ok[i]) continue;
            NodeDecide nd;
            nd.node = caps[i]->node();
            try {
                nd.top1_pinned = top1_agreement(rl, caps[i]->view("decide.pinned.logits"));
                const std::vector<TensorView> cids = numbered(*caps[i], "decide.free.ids.");
                KVASIR_CHECK(cids.size() == rids.size(), ErrorCode::bad_input, "{}: routing of {} MoE layers, the reference has {}",
                             caps[i]->path(), cids.size(), rids.size());
                for (std::size_t l = 0; l < rids.size(); ++l) {
                    const IndexAgreement a = compare_indices(rids[l], cids[l]);
                    nd.routing_free.rows += a.rows;
                    nd.routing_free.exact_matches += a.exact_matches;
                }
                if (nd.routing_free.rows > 0)
                    nd.routing_free.exact_match_rate =
                        static_cast<double>(nd.routing_free.exact_matches) / static_cast<double>(nd.routing_free.rows);
            } catch (const Error& e) {
                if (e.code() == ErrorCode::internal) throw;
                nd = NodeDecide{};
                nd.node = caps[i]->node();
                nd.error = e.what();
            }
            r.results.push_back(std::move(nd));
        }
        take_decide(r, led);
    });

    step("generate", [&](const std::vector<bool>& ok) {
        const std::vector<std::int32_t> rt = int_vector(ref.view("generate.tokens"));
        GenerateReport r;
        r.config.new_tokens = static_cast<int>(p.generate.n);
        for (std::size_t i = 0; i < n; ++i) {
            if (i == reference || !ok[i]) continue;
            NodeGenerate ng;
            ng.node = caps[i]->node();
            try {
                const std::vector<std::int32_t> ct = int_vector(caps[i]->view("generate.tokens"));
                const std::vector<std::int32_t> pinned = int_vector(caps[i]->view("generate.pinned_own"));
                KVASIR_CHECK(ct.size() == rt.size() && pinned.size() == rt.size(), ErrorCode::bad_input,
                             "{}: {} generated tokens, the reference has {}", caps[i]->path(), ct.size(), rt.size());
                ng.first_divergence = first_divergence(rt, ct);
                for (std::size_t s = 0; s < rt.size(); ++s) ng.divergences += pinned[s] != rt[s];
            } catch (const Error& e) {
                if (e.code() == ErrorCode::internal) throw;
                ng = NodeGenerate{};
                ng.node = caps[i]->node();
                ng.error = e.what();
            }
            r.results.push_back(std::move(ng));
        }
        take_generate(r, p, led);
    });

    step("perplexity", [&](const std::vector<bool>& ok) {
        const std::vector<double> rn = double_vector(ref.view("perplexity.nll"));
        const double ref_ppl = perplexity_from_nll(rn);
        PerplexityReport r;
        for (std::size_t i = 0; i < n; ++i) {
            if (i == reference || !ok[i]) continue;
            NodePerplexity np;
            np.node = caps[i]->node();
            try {
                const std::vector<double> cn = double_vector(caps[i]->view("perplexity.nll"));
                KVASIR_CHECK(cn.size() == rn.size(), ErrorCode::bad_input, "{}: {} predictions, the reference has {}",
                             caps[i]->path(), cn.size(), rn.size());
                np.perplexity = perplexity_from_nll(cn);
                np.ratio = np.perplexity / ref_ppl;
            } catch (const Error& e) {
                if (e.code() == ErrorCode::internal) throw;
                np = NodePerplexity{};
                np.node = caps[i]->node();
                np.error = e.what();
            }
            r.results.push_back(std::move(np));
        }
        take_perplexity(r, led);
    });

    step("determinism", [&](const std::vector<bool>& ok) {
        for (std::size_t i = 0; i < n; ++i)
            if (ok[i]) led.measure(i, "determinism", "determinism", caps[i]->view("determinism.run_to_run_max_rel").at(0));
    });

    run.inputs = led.inputs();
    // Judge only the steps compared: the protocol's tolerances restricted to them.
    Tolerances sens, tol;
    for (const auto& [tier_out, tier_in] : {std::pair{&sens, &p.sensitive}, std::pair{&tol, &p.tolerant}})
        for (const auto& [name, t] : *tier_in) {
            const auto info = find_criterion(name);
            if (info && wants_step(cc, info->step)) tier_out->emplace(name, t);
        }
    for (const NodeInput& in : run.inputs) out.nodes.push_back(judge_node(in, sens, tol));
    return run;
}

}  // namespace kvasir
