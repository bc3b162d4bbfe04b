// Step 1 as an audit step: per-op delta (steps/op_delta.hpp computes it).
//
// The ops' inputs are seeded and every node regenerates them; what comes
// from the authority is the MoE op's routing and, with real weights, the
// real-statistics MoE input (the authority's own post-attention RMSNorm).
// So the authority is the decision: its ops run again beside each node —
// cheap next to the forward steps, and exactly what a capture on another
// machine does.
//
// Tensors: ops.<op>.out (the compared value), ops.<op>.ids (router ops),
// ops.moe.shard_combined (the node's own sharded-then-recombined block).
// Notes: ops_inputs (op → one line of inputs), ops_errors (op → the node's
// failure of that op; "shard" for the shard check): one failing op does not
// hide the others.
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/backend/forwarding.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/error_bound.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <memory>
#include <tuple>

namespace kvasir {

namespace {

nlohmann::json note_object(const NodeOutputs& n, const std::string& key) {
    const auto text = n.note(key);
    if (!text) return nlohmann::json::object();
    nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
}

// λ of the probabilistic bound (see bound_violations).
constexpr double kProbLambda = 8.0;

// Unit roundoff u and subnormal-range absolute error η (half the smallest
// subnormal) of a format a node names in its capabilities; nullopt for one
// this tool has no bound for. TF32 keeps f32's exponent range.
struct FormatUnits {
    double u, eta;
};
std::optional<FormatUnits> format_units(const nlohmann::ordered_json& name) {
    if (!name.is_string()) return std::nullopt;
    const std::string n = name.get<std::string>();
    if (n == "f64") return FormatUnits{std::ldexp(1.0, -53), std::ldexp(1.0, -1075)};
    if (n == "f32") return FormatUnits{std::ldexp(1.0, -24), std::ldexp(1.0, -150)};
    if (n == "tf32") return FormatUnits{std::ldexp(1.0, -11), std::ldexp(1.0, -150)};
    if (n == "f16") return FormatUnits{std::ldexp(1.0, -11), std::ldexp(1.0, -25)};
    if (n == "bf16") return FormatUnits{std::ldexp(1.0, -8), std::ldexp(1.0, -134)};
    return std::nullopt;
}

// Rigorous a-priori bound of matmul, element by element (Higham §3.1): the
// node's inputs are the f32 seeded/model operands rounded to its storage
// format (|x̂ŵ − xw| <= r·|xw|, r = 2u_s + u_s², 0 for f32 or wider), summed
// in ANY order by its accumulator (γ_K(u_acc)·Σ|x̂ŵ|, FMA or not) and
// rounded to its output format (u_out); the f64 oracle adds γ_K(2⁻⁵³)·Σ|xw|:
//   |ŷ − y_ref| <= [r + γ_K(u_acc)(1 + r)](1 + u_out)·S + u_out·|y_ref| + γ_K(2⁻⁵³)·S + A,
// S = Σ_k |x_k w_k| (ops.matmul.abs_dot, from the reference). A covers what
// the relative model misses in the subnormal range (Higham §2.1: rounding
// there errs by up to η = half the smallest subnormal, absolutely): inputs
// η_s·(1 + r)(1 + γ)(Σ|x| + Σ|w|) + K·η_s², every product K·η_acc, the
// output η_out (ops.matmul.abs_x / abs_w); ~1e-8 of the bound for f16
// storage, ~1e-40 for f32. A correct node
// never exceeds it whatever its reduction order; one element outside is a
// wrong result (a flipped bit, a broken kernel), however small against the
// statistical tolerances. Measured as "bound.violations_max". The
// worst-case γ_K is loose by ~√K for real sums, so a second figure,
// "bound.probable_violations_max", replaces γ_K(u_acc) by Higham & Mary's
// probabilistic γ̃_K(λ) = exp(λ·√K·u + K·u²/(1 − u)) − 1 (SIAM J. Sci.
// Comput. 41(5), 2019, Thm 3.1: it holds for each output with probability
// >= 1 − 2·exp(−λ²(1 − u)²/2) when the rounding errors are independent and
// mean zero, as round-to-nearest f32 sums of random-signed terms are). At
// λ = 8 an element outside it has a chance below 2.6e-14 of being honest
// rounding (below 3.2e-10 over a 12288-element product): still proof for an
// audit, ~5× tighter at K = 2048. A node whose
// formats give no bound (an f16 running sum of K >= 2048 terms, a format
// this tool does not know) is listed as not measurable, with why.
nlohmann::ordered_json bound_violations(const StepNodes& in, Ledger& led) {
    const NodeOutputs& ref = *in.nodes[in.reference];
    if (!ref.has("ops.matmul.abs_dot") || !ref.has("ops.matmul.out")) return nullptr;  // a capture from before the bound
    const auto k_note = ref.note("ops_matmul_k");
    std::int64_t K = 0;
    if (k_note) K = std::strtoll(k_note->c_str(), nullptr, 10);
    KVASIR_CHECK(K > 0 && K <= (std::int64_t{1} << 24), ErrorCode::bad_input, "{}: ops_matmul_k {} is not an inner dimension",
                 ref.origin(), k_note.value_or("(absent)"));
    const TensorView S = ref.view("ops.matmul.abs_dot"), yr = ref.view("ops.matmul.out");
    const TensorView AX = ref.view("ops.matmul.abs_x"), AW = ref.view("ops.matmul.abs_w");
    KVASIR_CHECK(S.shape == yr.shape && S.shape.size() == 2 && AX.shape == Shape{S.shape[0]} && AW.shape == Shape{S.shape[1]},
                 ErrorCode::bad_input, "{}: ops.matmul.abs_dot {}, abs_x {}, abs_w {} do not fit ops.matmul.out {}", ref.origin(),
                 shape_str(S.shape), shape_str(AX.shape), shape_str(AW.shape), shape_str(yr.shape));
    const std::int64_t N = S.shape[1];
    const double g_ref = *gamma_bound(K, std::ldexp(1.0, -53));
    nlohmann::ordered_json j{{"op", "matmul"}, {"k", K}, {"lambda", kProbLambda}, {"results", nlohmann::ordered_json::array()}};
    for (std::size_t i = 0; i < in.nodes.size(); ++i) {
        if (i == in.reference || !in.present[i] || !in.nodes[i]->has("ops.matmul.out")) continue;
        const nlohmann::ordered_json& caps = led.inputs()[i].capabilities;
        const auto field = [&](const char* key) { return caps.is_object() && caps.contains(key) ? caps[key] : nlohmann::ordered_json(); };
        // A node whose matmul rounds its inputs to another format than its
        // storage (cuBLAS TF32) says so in extra.matmul_input_format.
        nlohmann::ordered_json input_format = field("storage");
        if (const auto extra = field("extra"); extra.is_object() && extra.contains("matmul_input_format"))
            input_format = extra["matmul_input_format"];
        const auto fs = format_units(input_format), fa = format_units(field("accumulation")), fo = format_units(field("output"));
        std::string why;
        if (!fs || !fa || !fo)
            why = fmt::format("no a-priori matmul bound for formats storage {}, accumulation {}, output {}", input_format.dump(),
                              field("accumulation").dump(), field("output").dump());
        const std::optional<double> g = fa ? gamma_bound(K, fa->u) : std::nullopt;
        if (why.empty() && !g)
            why = fmt::format("no a-priori matmul bound: K·u = {} x {:.3g} >= 1 for a {} running sum", K, fa->u,
                              field("accumulation").get<std::string>());
        if (!why.empty()) {
            led.not_applicable_for(i, "bound.violations_max", why);
            led.not_applicable_for(i, "bound.probable_violations_max", why);
            j["results"].push_back({{"node", in.nodes[i]->node()}, {"not_measurable", why}});
            continue;
        }
        const TensorView y = in.nodes[i]->view("ops.matmul.out");
        KVASIR_CHECK(y.shape == yr.shape, ErrorCode::bad_input, "{}: ops.matmul.out has shape {}, the reference's {}",
                     in.nodes[i]->origin(), shape_str(y.shape), shape_str(yr.shape));
        // The operands are f32: storage f32 or wider holds them exactly.
        const bool rounded = fs->u > std::ldexp(1.0, -24);
        const double us = fs->u, ua = fa->u, uo = fo->u;
        const double r = rounded ? 2.0 * us + us * us : 0.0, eta_s = rounded ? fs->eta : 0.0;
        const double kd = static_cast<double>(K);
        const double g_prob = probabilistic_gamma(K, ua, kProbLambda);
        nlohmann::ordered_json e{{"node", in.nodes[i]->node()}, {"elements", y.numel()}};
        for (const auto& [criterion, gk, key] : {std::tuple{"bound.violations_max", *g, "worst_case"},
                                                 std::tuple{"bound.probable_violations_max", g_prob, "probabilistic"}}) {
            const double scale = (r + gk * (1.0 + r)) * (1.0 + uo) + g_ref;
            const double subnormal = eta_s * (1.0 + r) * (1.0 + gk) * (1.0 + uo);
            const double floor_abs = (kd * eta_s * eta_s * (1.0 + gk) + kd * fa->eta) * (1.0 + uo) + fo->eta;
            std::int64_t violations = 0, first = -1;
            double worst = 0;  // the largest |Δ| / bound
            for (std::int64_t x = 0; x < y.numel(); ++x) {
                const double bound = scale * S.at(x) + uo * std::fabs(yr.at(x)) + subnormal * (AX.at(x / N) + AW.at(x % N)) + floor_abs;
                const double d = std::fabs(y.at(x) - yr.at(x));
                if (!(d <= bound)) {  // NaN is a violation
                    if (first < 0) first = x;
                    ++violations;
                }
                if (bound > 0) worst = std::max(worst, d / bound);
            }
            led.measure(i, "ops", criterion, static_cast<double>(violations));
            nlohmann::ordered_json b{{"gamma", json_double(gk)}, {"violations", violations}, {"worst_fraction_of_bound", json_double(worst)}};
            if (first >= 0) b["first"] = first;
            e[key] = std::move(b);
        }
        j["results"].push_back(std::move(e));
    }
    return j;
}

class OpsAudit final : public Step {
public:
    const char* name() const override { return "ops"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        const Protocol& p = *ac.protocol;
        if (!p.ops.enabled) return false;
        OpsConfig oc = p.ops_config();
        oc.seed = plan.seed;
        if (p.ops.weights == "model") {
            oc.model = ac.model;
            oc.layer = p.ops.layer;
            // The protocol must fit the model — refused here, naming the JSON
            // path, before any step runs (not as the reference's error later).
            const ModelConfig& m = ac.model->config();
            KVASIR_CHECK(oc.layer >= 0 && oc.layer < m.num_layers, ErrorCode::bad_input,
                         "{}: /steps/ops/layer: {} is outside 0..{} of {} (the model has {} layers)", p.source, oc.layer,
                         m.num_layers - 1, ac.model->path(), m.num_layers);
            try {
                (void)oc.resolved();
            } catch (const Error& e) {
                if (e.code() != ErrorCode::bad_input) throw;
                fail(ErrorCode::bad_input, "{}: /steps/ops: {}", p.source, e.what());
            }
        }
        oc.validate();
        plan.ops = oc;
        return true;
    }

    std::any decide(const StepEnv&, Backend& authority) const override { return &authority; }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        Backend& authority = *std::any_cast<Backend*>(decisions);
        std::vector<std::unique_ptr<Backend>> nodes;
        if (!self) nodes.push_back(std::make_unique<ForwardingBackend>(authority));
        nodes.push_back(std::make_unique<ForwardingBackend>(node));
        const std::size_t me = nodes.size() - 1;
        OpsOutputs keep;
        const OpsReport r = run_op_delta(*env.plan->ops, nodes, 0, &keep);
        StepOutput out;
        nlohmann::ordered_json inputs = nlohmann::ordered_json::object(), errors = nlohmann::ordered_json::object();
        for (const OpResult& op : r.ops) {
            inputs[op.op] = op.inputs;
            if (!op.errors[me].empty()) errors[op.op] = op.errors[me];
        }
        for (const ShardCheck& s : r.shard_checks)
            if (s.node == node.capabilities().node && !s.error.empty() && !errors.contains("moe")) errors["shard"] = s.error;
        if (me < keep.size()) out.tensors = std::move(keep[me]);
        // The inner dimension of matmul, for its error bound (compare has no model).
        if (out.tensors.count("ops.matmul.abs_dot") != 0) out.notes["ops_matmul_k"] = std::to_string(env.plan->ops->resolved().hidden);
        out.notes["ops_inputs"] = inputs.dump();
        if (!errors.empty()) out.notes["ops_errors"] = errors.dump();
        return out;
    }

    nlohmann::ordered_json compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport& out) const override {
        const std::size_t n = in.nodes.size(), ref = in.reference;
        const NodeOutputs& refn = *in.nodes[ref];
        OpsReport r;
        r.reference = ref;
        r.config = p.ops_config();
        for (const NodeOutputs* o : in.nodes) {
            Capabilities c;
            c.node = o->node();
            r.nodes.push_back(c);
        }
        std::vector<nlohmann::json> errors(n);
        for (std::size_t i = 0; i < n; ++i)
            if (in.present[i]) errors[i] = note_object(*in.nodes[i], "ops_errors");
        const nlohmann::json ref_inputs = note_object(refn, "ops_inputs");
        for (const std::string& op : all_op_names()) {
            bool any = false;
            std::vector<std::optional<TensorView>> values(n), ids(n);
            std::vector<std::string> errs(n);
            for (std::size_t i = 0; i < n; ++i) {
                if (!in.present[i]) continue;
                if (errors[i].contains(op) && errors[i][op].is_string()) {
                    errs[i] = errors[i][op].get<std::string>();
                    any = true;
                }
                if (!in.nodes[i]->has("ops." + op + ".out")) continue;
                any = true;
                values[i] = in.nodes[i]->view("ops." + op + ".out");
                if (in.nodes[i]->has("ops." + op + ".ids")) ids[i] = in.nodes[i]->view("ops." + op + ".ids");
            }
            if (!any) continue;
            const std::string inputs =
                ref_inputs.contains(op) && ref_inputs[op].is_string() ? ref_inputs[op].get<std::string>() : "from captures";
            for (std::size_t i = 0; i < n; ++i)
                if (in.present[i] && !values[i] && errs[i].empty()) errs[i] = "not captured";
            r.ops.push_back(op_result_from_outputs(op, inputs, values, ids, std::move(errs)));
        }
        for (std::size_t i = 0; i < n; ++i) {
            if (!in.present[i]) continue;
            const NodeOutputs& o = *in.nodes[i];
            ShardCheck sc;
            sc.node = o.node();
            sc.shards = static_cast<int>(p.ops.shards);
            if (errors[i].contains("shard") && errors[i]["shard"].is_string()) {
                sc.error = errors[i]["shard"].get<std::string>();
            } else if (o.has("ops.moe.shard_combined") && o.has("ops.moe.out")) {
                sc.stats = kvasir::compare(o.view("ops.moe.out"), o.view("ops.moe.shard_combined"));
            } else {
                continue;
            }
            r.shard_checks.push_back(std::move(sc));
        }
        // Measurements: every candidate against the reference, op by op.
        for (const OpResult& op : r.ops) {
            for (std::size_t i = 0; i < n; ++i) {
                if (!in.present[i]) continue;
                if (!op.errors[i].empty()) led.error(i, "ops", op.op + ": " + op.errors[i]);
                if (i != ref && !op.errors[ref].empty())
                    led.error(i, "ops", op.op + ": not compared: the reference failed: " + op.errors[ref]);
                if (i == ref || !op.matrix[ref][i]) continue;
                led.measure(i, "ops", "ops." + op.op + ".max_rel", op.matrix[ref][i]->max_rel);
                led.measure(i, "ops", "ops." + op.op + ".cosine_min", op.matrix[ref][i]->cosine);
            }
        }
        // Router ops: rows whose expert set differs, summed over them.
        std::vector<std::optional<std::int64_t>> flips(n);
        for (const OpResult& op : r.ops)
            for (std::size_t i = 0; i < n; ++i)
                if (i != ref && in.present[i] && ref < op.id_matrix.size() && i < op.id_matrix[ref].size() && op.id_matrix[ref][i]) {
                    const IndexAgreement& a = *op.id_matrix[ref][i];
                    flips[i] = flips[i].value_or(0) + (a.rows - a.exact_matches);
                }
        for (std::size_t i = 0; i < n; ++i)
            if (flips[i]) led.measure(i, "ops", "router.flips_max", static_cast<double>(*flips[i]));
        nlohmann::ordered_json bounds = bound_violations(in, led);
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
        nlohmann::ordered_json j = to_json(r);
        nlohmann::ordered_json names = nlohmann::ordered_json::array();
        for (const NodeOutputs* o : in.nodes) names.push_back(o->node());
        j["nodes"] = names;  // capabilities are in each node's verdict
        if (!bounds.is_null()) j["bound"] = std::move(bounds);
        return j;
    }
};

}  // namespace

const Step& ops_step() {
    static const OpsAudit s;
    return s;
}

}  // namespace kvasir
