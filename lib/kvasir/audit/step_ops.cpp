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

#include <fmt/ranges.h>

#include <functional>
#include <memory>

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

// A node's formats for one op from its capabilities (storage, accumulation,
// output — at least as coarse as storage; a matmul that rounds its inputs to another format than its storage,
// cuBLAS TF32, says so in extra.matmul_input_format); nullopt, with why, for
// formats this tool has no bound for.
std::optional<OpFormats> op_formats(const nlohmann::ordered_json& caps, bool matmul, std::string& why) {
    const auto field = [&](const char* key) { return caps.is_object() && caps.contains(key) ? caps[key] : nlohmann::ordered_json(); };
    nlohmann::ordered_json storage = field("storage");
    if (const auto extra = field("extra"); matmul && extra.is_object() && extra.contains("matmul_input_format"))
        storage = extra["matmul_input_format"];
    const auto units = [](const nlohmann::ordered_json& n) {
        return n.is_string() ? format_units(n.get<std::string>()) : std::nullopt;
    };
    const auto fs = units(storage), fa = units(field("accumulation")), fo = units(field("output")), fk = units(field("storage"));
    if (!fs || !fa || !fo || !fk) {
        why = fmt::format("no a-priori bound for formats storage {}, accumulation {}, output {}", storage.dump(),
                          field("accumulation").dump(), field("output").dump());
        return std::nullopt;
    }
    // A node keeps its results in its storage format (cpu's storage variants
    // round every op's output to it inside f32 tensors): the output rounding
    // is the coarser of the two — never tighter than the node's real one.
    const FormatUnits out{std::max(fo->u, fk->u), std::max(fo->eta, fk->eta)};
    return OpFormats{*fs, *fa, out};
}

// One op's a-priori bound, element by element, for a node of formats f whose
// reduction of K terms errs by at most g relatively — the node's own
// rounding, or (with the reference's formats) the oracle's.
using ElementBounds = std::function<void(const OpFormats& f, double g, std::vector<double>& out)>;

// matmul (Higham §3.1): the node's inputs are the f32 seeded/model operands
// rounded to its storage format (|x̂ŵ − xw| <= r·|xw|, r = 2u_s + u_s², 0 for
// f32 or wider), summed in ANY order by its accumulator (γ_K(u_acc)·Σ|x̂ŵ|,
// FMA or not) and rounded to its output format (u_out):
//   |ŷ − y| <= [r + γ_K(u_acc)(1 + r)](1 + u_out)·S + u_out·|y| + A,
// S = Σ_k |x_k w_k| (ops.matmul.abs_dot, from the reference). A covers what
// the relative model misses in the subnormal range (Higham §2.1: rounding
// there errs by up to η = half the smallest subnormal, absolutely): inputs
// η_s·(1 + r)(1 + γ)(Σ|x| + Σ|w|) + K·η_s², every product K·η_acc, the
// output η_out (ops.matmul.abs_x / abs_w); ~1e-8 of the bound for f16
// storage, ~1e-40 for f32.
ElementBounds matmul_bounds(const TensorView& S, const TensorView& yr, const TensorView& AX, const TensorView& AW, std::int64_t K) {
    return [=](const OpFormats& f, double gk, std::vector<double>& out) {
        const bool rounded = f.storage.u > std::ldexp(1.0, -24);
        const double us = f.storage.u, uo = f.output.u, kd = static_cast<double>(K);
        const double r = rounded ? 2.0 * us + us * us : 0.0, eta_s = rounded ? f.storage.eta : 0.0;
        const double scale = (r + gk * (1.0 + r)) * (1.0 + uo);
        const double subnormal = eta_s * (1.0 + r) * (1.0 + gk) * (1.0 + uo);
        const double floor_abs = (kd * eta_s * eta_s * (1.0 + gk) + kd * f.accumulation.eta) * (1.0 + uo) + f.output.eta;
        const std::int64_t N = S.shape[1];
        for (std::int64_t x = 0; x < S.numel(); ++x)
            out[static_cast<std::size_t>(x)] +=
                scale * S.at(x) + uo * std::fabs(yr.at(x)) + subnormal * (AX.at(x / N) + AW.at(x % N)) + floor_abs;
    };
}

// softmax, row by row (metrics/error_bound.hpp softmax_row_bounds), from
// the reference's output and each row's max and log Σ exp (ops.softmax.row_max,
// log_sum).
ElementBounds softmax_bounds(const TensorView& yr, const TensorView& mx, const TensorView& ls) {
    return [=](const OpFormats& f, double g, std::vector<double>& out) {
        const std::int64_t cols = yr.dim(-1), rows = mx.numel();
        std::vector<double> y(static_cast<std::size_t>(cols)), b(y.size());
        for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t c = 0; c < cols; ++c) y[static_cast<std::size_t>(c)] = yr.at(r * cols + c);
            softmax_row_bounds(f, g, y, mx.at(r), ls.at(r), b);
            for (std::int64_t c = 0; c < cols; ++c) out[static_cast<std::size_t>(r * cols + c)] += b[static_cast<std::size_t>(c)];
        }
    };
}

// rmsnorm (metrics/error_bound.hpp rmsnorm_relative_bound and
// rmsnorm_element_bound), from each row's mean square and each column's scale
// condition and magnitude (ops.rmsnorm.mean_square, scale_cond, abs_scale).
ElementBounds rmsnorm_bounds(const TensorView& yr, const TensorView& ms, const TensorView& cond, const TensorView& scale) {
    return [=](const OpFormats& f, double g, std::vector<double>& out) {
        const std::int64_t cols = yr.dim(-1), rows = ms.numel();
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t c = 0; c < cols; ++c) {
                const double rho = rmsnorm_relative_bound(f, g, cond.at(c), ms.at(r));
                out[static_cast<std::size_t>(r * cols + c)] += rmsnorm_element_bound(f, rho, yr.at(r * cols + c), scale.at(c), cols, ms.at(r));
            }
    };
}

// causal_conv1d with SiLU, y = silu(z), z = Σ_j w_j·x_j over the K taps.
// The sum as a dot product (Higham §3.1, as matmul_bounds): the inputs
// rounded to storage (r), summed in any order (γ_K(u_acc)), what gradual
// underflow adds (η terms, from Σ(|w| + |x|)):
//   Δz <= [r + γ(1 + r)]·S + η_s(1 + r)(1 + γ)·A + K·η_s²(1 + γ) + K·η_acc,
// then, for a node that keeps z in a rounded storage format, its rounding
// u_s(|z| + Δz) + η_s. SiLU is 1.0998-Lipschitz (its derivative lies in
// [−0.0998, 1.0998]), so the exact silu of the node's ẑ is within 1.1·Δz of
// y; evaluating it (exp, 1 +, division, the product with ẑ) errs by at most
// ε = (1 + 8u)²(1 + u)² − 1 relatively (kElementaryUlps for exp and the
// division, u = u_acc) plus 4·η_acc absolutely; the output rounds by u_out:
//   |ŷ − y| <= (1 + u_out)·[(1 + ε)·1.1·Δz + ε·|y| + 4η_acc] + u_out·|y| + η_out.
// S, z and A from the reference (ops.causal_conv1d.abs_dot, pre, abs_in).
ElementBounds conv_bounds(const TensorView& S, const TensorView& z, const TensorView& A, const TensorView& yr, std::int64_t K) {
    return [=](const OpFormats& f, double gk, std::vector<double>& out) {
        const bool rounded = f.storage.u > std::ldexp(1.0, -24);
        const double us = f.storage.u, ua = f.accumulation.u, uo = f.output.u, kd = static_cast<double>(K);
        const double r = rounded ? 2.0 * us + us * us : 0.0, eta_s = rounded ? f.storage.eta : 0.0;
        const double e1 = kElementaryUlps * 2.0 * ua;
        const double eps = (1.0 + e1) * (1.0 + e1) * (1.0 + ua) * (1.0 + ua) - 1.0;
        constexpr double lipschitz = 1.1;
        for (std::int64_t x = 0; x < S.numel(); ++x) {
            double dz = (r + gk * (1.0 + r)) * S.at(x) + eta_s * (1.0 + r) * (1.0 + gk) * A.at(x) +
                        kd * eta_s * eta_s * (1.0 + gk) + kd * f.accumulation.eta;
            if (rounded) dz += us * (std::fabs(z.at(x)) + dz) + eta_s;
            const double y = std::fabs(yr.at(x));
            out[static_cast<std::size_t>(x)] +=
                (1.0 + uo) * ((1.0 + eps) * lipschitz * dz + eps * y + 4.0 * f.accumulation.eta) + uo * y + f.output.eta;
        }
    };
}

// Rigorous a-priori bounds, element by element, of the ops that have one:
// matmul, softmax, rmsnorm and causal_conv1d (the derivations beside each bound above and in
// metrics/error_bound.cpp). Each element of a node is checked against its
// bound plus the oracle's own (the same formula at the reference's formats,
// an f64 oracle's ~1e-13 of it): a correct node never exceeds the sum,
// whatever its reduction order; one element outside is a wrong result (a
// flipped bit, a broken kernel), however small against the statistical
// tolerances. The bound is evaluated at the oracle's value in place of the
// exact one; the difference is second order (the node's bound times the
// oracle's relative error), covered by a relative 1e-9 added to every bound.
// Measured as "bound.violations_max", summed over the ops. The worst-case γ_K
// of a sum is loose by ~√K for real sums, so a second figure,
// "bound.probable_violations_max", replaces the node's γ_K(u_acc) by Higham &
// Mary's probabilistic γ̃_K(λ) = exp(λ·√K·u + K·u²/(1 − u)) − 1 (SIAM J. Sci.
// Comput. 41(5), 2019, Thm 3.1: it holds for each output with probability
// >= 1 − 2·exp(−λ²(1 − u)²/2) when the rounding errors are independent and
// mean zero, as round-to-nearest f32 sums are). At λ = 8 an element outside
// it has a chance below 2.6e-14 of being honest rounding (below 3.2e-10 over
// a 12288-element product): still proof for an audit, ~5× tighter at
// K = 2048. The element-wise roundings and elementary functions keep their
// worst case in both. An op whose formats give no bound (an f16 running sum
// of K >= 2048 terms, a format this tool does not know) is listed as not
// measurable for that node, with why.
nlohmann::ordered_json bound_violations(const StepNodes& in, Ledger& led) {
    const NodeOutputs& ref = *in.nodes[in.reference];
    struct Op {
        std::string op;
        std::int64_t K = 0;
        ElementBounds bounds;
    };
    std::vector<Op> ops;
    const auto shapes_fit = [&](const char* op, const TensorView& y, std::initializer_list<std::pair<const char*, Shape>> want) {
        for (const auto& [name, shape] : want) {
            const std::string key = fmt::format("ops.{}.{}", op, name);
            KVASIR_CHECK(ref.view(key).shape == shape, ErrorCode::bad_input, "{}: {} has shape {}, not {} for ops.{}.out {}",
                         ref.origin(), key, shape_str(ref.view(key).shape), shape_str(shape), op, shape_str(y.shape));
        }
    };
    if (ref.has("ops.matmul.abs_dot") && ref.has("ops.matmul.out")) {  // absent in a capture from before the bound
        const auto k_note = ref.note("ops_matmul_k");
        std::int64_t K = 0;
        if (k_note) K = std::strtoll(k_note->c_str(), nullptr, 10);
        KVASIR_CHECK(K > 0 && K <= (std::int64_t{1} << 24), ErrorCode::bad_input, "{}: ops_matmul_k {} is not an inner dimension",
                     ref.origin(), k_note.value_or("(absent)"));
        const TensorView yr = ref.view("ops.matmul.out");
        KVASIR_CHECK(yr.shape.size() == 2, ErrorCode::bad_input, "{}: ops.matmul.out {} is not [T, N]", ref.origin(), shape_str(yr.shape));
        shapes_fit("matmul", yr, {{"abs_dot", yr.shape}, {"abs_x", Shape{yr.shape[0]}}, {"abs_w", Shape{yr.shape[1]}}});
        ops.push_back({"matmul", K, matmul_bounds(ref.view("ops.matmul.abs_dot"), yr, ref.view("ops.matmul.abs_x"),
                                                  ref.view("ops.matmul.abs_w"), K)});
    }
    const auto has_all = [&](const char* op, std::initializer_list<const char*> names) {
        for (const char* n : names)
            if (!ref.has(fmt::format("ops.{}.{}", op, n))) return false;
        return true;
    };
    const auto data = [&](const char* op, const char* name) { return ref.view(fmt::format("ops.{}.{}", op, name)); };
    if (has_all("softmax", {"out", "row_max", "log_sum"})) {
        const TensorView yr = data("softmax", "out");
        KVASIR_CHECK(yr.rank() >= 1 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.softmax.out is empty", ref.origin());
        const std::int64_t cols = yr.dim(-1), rows = yr.numel() / cols;
        shapes_fit("softmax", yr, {{"row_max", Shape{rows}}, {"log_sum", Shape{rows}}});
        ops.push_back({"softmax", cols, softmax_bounds(yr, data("softmax", "row_max"), data("softmax", "log_sum"))});
    }
    if (has_all("rmsnorm", {"out", "mean_square", "scale_cond", "abs_scale"})) {
        const TensorView yr = data("rmsnorm", "out");
        KVASIR_CHECK(yr.rank() >= 1 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.rmsnorm.out is empty", ref.origin());
        const std::int64_t cols = yr.dim(-1), rows = yr.numel() / cols;
        shapes_fit("rmsnorm", yr, {{"mean_square", Shape{rows}}, {"scale_cond", Shape{cols}}, {"abs_scale", Shape{cols}}});
        ops.push_back({"rmsnorm", cols,
                       rmsnorm_bounds(yr, data("rmsnorm", "mean_square"), data("rmsnorm", "scale_cond"), data("rmsnorm", "abs_scale"))});
    }
    if (has_all("causal_conv1d", {"out", "pre", "abs_dot", "abs_in", "kernel"})) {
        const TensorView yr = data("causal_conv1d", "out");
        KVASIR_CHECK(yr.rank() == 2 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.causal_conv1d.out {} is not [T, C]", ref.origin(),
                     shape_str(yr.shape));
        shapes_fit("causal_conv1d", yr, {{"pre", yr.shape}, {"abs_dot", yr.shape}, {"abs_in", yr.shape}, {"kernel", Shape{1}}});
        const double kk = data("causal_conv1d", "kernel").at(0);
        KVASIR_CHECK(kk >= 1 && kk <= 1024 && kk == std::floor(kk), ErrorCode::bad_input, "{}: ops.causal_conv1d.kernel {} is not a kernel size",
                     ref.origin(), kk);
        const auto K = static_cast<std::int64_t>(kk);
        ops.push_back({"causal_conv1d", K,
                       conv_bounds(data("causal_conv1d", "abs_dot"), data("causal_conv1d", "pre"), data("causal_conv1d", "abs_in"), yr, K)});
    }
    if (ops.empty()) return nullptr;
    std::string ref_why;
    const std::optional<OpFormats> fr = op_formats(led.inputs()[in.reference].capabilities, false, ref_why);
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    struct Count {
        std::int64_t worst = 0, probable = 0;
        int measured = 0;
        std::vector<std::string> why;
    };
    std::vector<Count> counts(in.nodes.size());
    for (const Op& op : ops) {
        const TensorView yr = ref.view("ops." + op.op + ".out");
        nlohmann::ordered_json o{{"op", op.op}, {"k", op.K}, {"lambda", kProbLambda}, {"results", nlohmann::ordered_json::array()}};
        // The oracle's own share of every bound, at its formats and worst-case γ_K.
        std::vector<double> ref_bound(static_cast<std::size_t>(yr.numel()), 0.0);
        const std::optional<double> g_ref = fr ? gamma_bound(op.K, fr->accumulation.u) : std::nullopt;
        if (fr && g_ref) op.bounds(*fr, *g_ref, ref_bound);
        for (std::size_t i = 0; i < in.nodes.size(); ++i) {
            if (i == in.reference || !in.present[i] || !in.nodes[i]->has("ops." + op.op + ".out")) continue;
            std::string why;
            const std::optional<OpFormats> f = op_formats(led.inputs()[i].capabilities, op.op == "matmul", why);
            const std::optional<double> g = f ? gamma_bound(op.K, f->accumulation.u) : std::nullopt;
            if (f && !g)
                why = fmt::format("no a-priori {} bound: K·u = {} x {:.3g} >= 1 for a {} running sum", op.op, op.K, f->accumulation.u,
                                  led.inputs()[i].capabilities.value("accumulation", "?"));
            if (!fr || !g_ref) why = fmt::format("no a-priori {} bound for the reference: {}", op.op, ref_why.empty() ? "K·u >= 1" : ref_why);
            if (!why.empty()) {
                counts[i].why.push_back(why);
                o["results"].push_back({{"node", in.nodes[i]->node()}, {"not_measurable", why}});
                continue;
            }
            const TensorView y = in.nodes[i]->view("ops." + op.op + ".out");
            KVASIR_CHECK(y.shape == yr.shape, ErrorCode::bad_input, "{}: ops.{}.out has shape {}, the reference's {}",
                         in.nodes[i]->origin(), op.op, shape_str(y.shape), shape_str(yr.shape));
            nlohmann::ordered_json e{{"node", in.nodes[i]->node()}, {"elements", y.numel()}};
            for (const bool probable : {false, true}) {
                const double gk = probable ? probabilistic_gamma(op.K, f->accumulation.u, kProbLambda) : *g;
                std::vector<double> bound = ref_bound;
                op.bounds(*f, gk, bound);
                std::int64_t violations = 0, first = -1;
                double worst = 0;  // the largest |Δ| / bound
                for (std::int64_t x = 0; x < y.numel(); ++x) {
                    const double bd = bound[static_cast<std::size_t>(x)] * (1.0 + 1e-9);
                    const double d = std::fabs(y.at(x) - yr.at(x));
                    if (!(d <= bd)) {  // NaN is a violation
                        if (first < 0) first = x;
                        ++violations;
                    }
                    if (bd > 0 && std::isfinite(bd)) worst = std::max(worst, d / bd);
                }
                (probable ? counts[i].probable : counts[i].worst) += violations;
                nlohmann::ordered_json b{{"gamma", json_double(gk)}, {"violations", violations}, {"worst_fraction_of_bound", json_double(worst)}};
                if (first >= 0) b["first"] = first;
                e[probable ? "probabilistic" : "worst_case"] = std::move(b);
            }
            ++counts[i].measured;
            o["results"].push_back(std::move(e));
        }
        j.push_back(std::move(o));
    }
    for (std::size_t i = 0; i < in.nodes.size(); ++i) {
        const Count& c = counts[i];
        if (c.measured > 0) {
            led.measure(i, "ops", "bound.violations_max", static_cast<double>(c.worst));
            led.measure(i, "ops", "bound.probable_violations_max", static_cast<double>(c.probable));
        } else if (!c.why.empty()) {
            const std::string why = fmt::format("{}", fmt::join(c.why, "; "));
            led.not_applicable_for(i, "bound.violations_max", why);
            led.not_applicable_for(i, "bound.probable_violations_max", why);
        }
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
        if (!bounds.is_null()) j["bounds"] = std::move(bounds);
        return j;
    }
};

}  // namespace

const Step& ops_step() {
    static const OpsAudit s;
    return s;
}

}  // namespace kvasir
