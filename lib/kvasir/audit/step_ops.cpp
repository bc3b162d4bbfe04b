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
#include "kvasir/audit/step_ops.hpp"

#include "kvasir/backend/forwarding.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/metrics/error_bound.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <fmt/ranges.h>

#include <cmath>
#include <functional>
#include <limits>
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
// reduction of K terms errs by at most gamma(K) relatively — the node's own
// rounding, or (with the reference's formats) the oracle's.
// gamma(K): the worst-case γ_K(u), or Higham & Mary's probabilistic γ̃_K
// (bound_violations); worst(K) the worst case either way (an op whose
// probabilistic figure needs its own treatment: moe_bounds).
struct Gamma {
    double u = 0;
    bool probable = false;
    double lambda = 0;
    double worst(std::int64_t k) const { return gamma_bound(k, u).value_or(INFINITY); }
    double operator()(std::int64_t k) const { return probable ? probabilistic_gamma(k, u, lambda) : worst(k); }
};
using ElementBounds = std::function<void(const OpFormats& f, const Gamma& gamma, std::vector<double>& out)>;

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
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const double gk = gamma(K);
        const InputRounding in = input_rounding(f);
        const double uo = f.output.u, kd = static_cast<double>(K), r = in.product, eta_s = in.eta;
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
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const std::int64_t cols = yr.dim(-1), rows = mx.numel();
        const double g = gamma(cols);
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
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const std::int64_t cols = yr.dim(-1), rows = ms.numel();
        const double g = gamma(cols);
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
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const double gk = gamma(K);
        const InputRounding in = input_rounding(f);
        const double us = in.u, uo = f.output.u, kd = static_cast<double>(K), r = in.product, eta_s = in.eta;
        const double eps = silu_evaluation_error(f.accumulation.u);
        constexpr double lipschitz = 1.1;
        for (std::int64_t x = 0; x < S.numel(); ++x) {
            double dz = (r + gk * (1.0 + r)) * S.at(x) + eta_s * (1.0 + r) * (1.0 + gk) * A.at(x) +
                        kd * eta_s * eta_s * (1.0 + gk) + kd * f.accumulation.eta;
            dz += us * (std::fabs(z.at(x)) + dz) + eta_s;  // z kept in storage (0 when that is f32)
            const double y = std::fabs(yr.at(x));
            out[static_cast<std::size_t>(x)] +=
                (1.0 + uo) * ((1.0 + eps) * lipschitz * dz + eps * y + 4.0 * f.accumulation.eta) + uo * y + f.output.eta;
        }
    };
}

// The MoE block, routing and combine weights pinned by the authority:
// per token and routed slot j (expert e_j, weight c_j), g = G·x and
// u = U·x over H terms, h = silu(g)·u, d = D·h over I terms, y = Σ_j c_j·d_j
// over k. Any composition that rounds no worse than the node's formats
// (Backend::moe_block's, a fused kernel keeping intermediates wider) —
// every rounding a factor (1 + δ), |δ| <= u, plus η in the subnormal range:
// (a) g, u as matmul_bounds: |ĝ − g| <= a·Sg + z, a = r + γ_H(1 + r),
//     z = η_s(1 + r)(1 + γ_H)·A + H·η_s²(1 + γ_H) + H·η_acc (A: the largest
//     Σ|x| + Σ|G_i|); kept in the output format, G' = (1 + u_o)(a·Sg + z) +
//     u_o|g| + η_o = a1·Sg + u_o|g| + z1, and G' <= a2·Sg + z1, a2 = a1 + u_o
//     (|g| <= Sg); U' likewise.
// (b) h: SiLU is 1.0998-Lipschitz and |silu(g)| <= |g|; evaluating it errs
//     by ε_s = (1 + 8u)²(1 + u)² − 1 relatively (u = u_acc; exp and the
//     division at kElementaryUlps) plus κ_s absolutely: 4η_acc, and where
//     exp(−g) overflows the accumulation format (g < −L, L = ln max) the
//     exact |silu(g)| <= (L + 1)·e^{−(L − 1)}; the product with û and the
//     output rounding make ε' = (1 + ε_s)(1 + u_acc)(1 + u_o) − 1:
//       |ĥ − h| <= 1.1G'(|u| + U') + |s|U' + ε'(|s| + 1.1G')(|u| + U')
//                  + κ'(|u| + U') + η',  κ' = κ_s(1 + u_acc)(1 + u_o),
//                  η' = η_acc(1 + u_o) + η_o,
//     which expands into the six terms op_delta.cpp moe_bound_data keeps:
//       Eh <= (1+ε')a1·V0 + (1+ε')u_o·V1 + ε'·V2 + 1.1(1+ε')a2²·V3
//             + [1.1(1+ε')z1(1 + a2) + κ'(1 + u_o + a1)]·V4
//             + [1.1(1+ε')z1² + κ'z1 + η']·V5
//     (V0 = 1.1·Sg|u| + |s|Su, V1 = (1.1|g| + |s|)|u|, V2 = |h|, V3 = Sg·Su,
//     V4 = Sg + Su, V5 = 1; 1.1|u| + |s| <= 1.1·V4 and |u| <= Su fold the
//     rest into V4).
// (c) d: I products of D̂ and ĥ in any order:
//       |d̂ − d| <= (1 + r)(1 + γ_I)·|D|·Eh + [r + γ_I(1 + r)]·|D|·|h|
//                  + η_s(1 + r)(1 + γ_I)(Σ|ĥ| + Σ_i|D_mi|) + I·η_s²(1 + γ_I) + I·η_acc,
//     Σ|ĥ| <= Σ|h| + ΣEh; kept in the output format: E'd = (1 + u_o)·that + u_o|d| + η_o.
// (d) the combine: each weight read in at worst r_c = max(u_c, u_o), the k
//     products summed in the combine format u_c (the accumulation's, at
//     least f32 below f64: Backend::moe_block sums in f32 or f64) in any
//     order, the result rounded to the output:
//       |ŷ − y| <= (1 + u_o)[(1 + r_c)(1 + γ_k)·Σ_j|c_j|E'd_j
//                  + (r_c + γ_k(1 + r_c))·Σ_j|c_j||d_j|] + u_o|y| + η_o.
// Every Σ_j |c_j|·(…) is linear in the terms moe_bound_data carried through
// |D| and the combine (ops.moe.abs_terms, abs_sums, abs_combine, abs_weights,
// dims). The probabilistic figure propagates the reductions' roundings as
// one martingale instead (below, with ops.moe.sq_terms).
ElementBounds moe_bounds(const TensorView& P, const TensorView& Q, const TensorView& Cd, const TensorView& W, const TensorView& SQ,
                         const TensorView& yr, std::int64_t H, std::int64_t I, std::int64_t k, double amax) {
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const InputRounding in = input_rounding(f);
        const double ua = f.accumulation.u, uo = f.output.u, r = in.product, eta_s = in.eta;
        const double eta_a = f.accumulation.eta, eta_o = f.output.eta, hd = static_cast<double>(H), id = static_cast<double>(I);
        const double uc = ua <= std::ldexp(1.0, -53) ? ua : std::max(ua, std::ldexp(1.0, -24));
        const double rc = std::max(uc, uo);
        const double eps_s = silu_evaluation_error(ua);
        const double eps = (1 + eps_s) * (1 + ua) * (1 + uo) - 1;
        const double L = std::log(f.accumulation.max > 0 ? f.accumulation.max : std::numeric_limits<float>::max());
        const double kappa = ((L + 1) * std::exp(-(L - 1)) + 4 * eta_a) * (1 + ua) * (1 + uo);
        const double eta_h = eta_a * (1 + uo) + eta_o;
        const std::int64_t T = W.numel();
        // The worst-case bound with the three reductions' γ (H, I, k terms) given, added into b.
        const auto worst = [&](double gH, double gI, double gk, std::vector<double>& b) {
            // (a)
            const double a = r + gH * (1 + r);
            const double z = eta_s * (1 + r) * (1 + gH) * amax + hd * eta_s * eta_s * (1 + gH) + hd * eta_a;
            const double a1 = (1 + uo) * a, z1 = (1 + uo) * z + eta_o, a2 = a1 + uo;
            // (b)
            const double coef[6] = {(1 + eps) * a1,
                                    (1 + eps) * uo,
                                    eps,
                                    1.1 * (1 + eps) * a2 * a2,
                                    1.1 * (1 + eps) * z1 * (1 + a2) + kappa * (1 + uo + a1),
                                    1.1 * (1 + eps) * z1 * z1 + kappa * z1 + eta_h};
            for (std::int64_t t = 0; t < T; ++t) {
                double qe = 0;  // Σ_j |c_j| Σ_i Eh
                for (int bb = 0; bb < 6; ++bb) qe += coef[bb] * Q.at(t * 6 + bb);
                const double q_h = Q.at(t * 6 + 2), wsum = W.at(t);
                for (std::int64_t m = 0; m < H; ++m) {
                    const auto at = [&](int bb) { return P.at((bb * T + t) * H + m); };
                    double pe = 0;  // Σ_j |c_j| (|D|·Eh)_m
                    for (int bb = 0; bb < 6; ++bb) pe += coef[bb] * at(bb);
                    const double cd = Cd.at(t * H + m);
                    // (c), weighted by |c_j| and summed over j
                    const double ed = (1 + r) * (1 + gI) * pe + (r + gI * (1 + r)) * at(2) +
                                      eta_s * (1 + r) * (1 + gI) * (q_h + qe + at(5)) + (id * eta_s * eta_s * (1 + gI) + id * eta_a) * wsum;
                    const double ed_out = (1 + uo) * ed + uo * cd + eta_o * wsum;
                    // (d)
                    const double y = std::fabs(yr.at(t * H + m));
                    b[static_cast<std::size_t>(t * H + m)] +=
                        (1 + uo) * ((1 + rc) * (1 + gk) * ed_out + (rc + gk * (1 + rc)) * cd) + uo * y + eta_o;
                }
            }
        };
        const double gH = gamma.worst(H), gI = gamma.worst(I), gk = gamma_bound(k, uc).value_or(INFINITY);
        if (!gamma.probable) {
            worst(gH, gI, gk, out);
            return;
        }
        // The probabilistic figure (Higham & Mary's model: every rounding of the three reductions
        // independent and mean zero, bounded by u): at first order their joint error at y_m is a
        // martingale Σ c·δ whose coefficients are bounded by the exact run — a gate/up rounding by
        // |c_j·D_mi|·1.1|u_i|·Sg_i (resp. |s_i|·Su_i), at most 2H of them per row; a down rounding
        // by |c_j|·Σ_i|D_mi·h_i|, 2I of them; a combine rounding by Σ_j|c_j·d_jm|, 2k + 1 — so by
        // Azuma–Hoeffding |Σ c·δ| <= λ·sqrt(Σ b²) but with probability 2·exp(−λ²/2) (the same λ
        // as every probabilistic figure here). The rest stays worst-case: the bound without the
        // reductions' γ (storage, SiLU, intermediate and output roundings), those γ terms' factors
        // from the other roundings (ω = (1 + u_max)^32 − 1 of them), and every term of second or
        // higher order in the γ's (the second difference W(2γ) − 2W(γ) + W(0) of the worst-case
        // bound, a polynomial with nonnegative coefficients, exceeds them).
        std::vector<double> w0(out.size(), 0.0), w1(out.size(), 0.0), w2(out.size(), 0.0);
        worst(0.0, 0.0, 0.0, w0);
        worst(gH, gI, gk, w1);
        worst(2 * gH, 2 * gI, 2 * gk, w2);
        const double omega = std::pow(1 + std::max({uo, r, eps, rc, ua}), 32) - 1;
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t m = 0; m < H; ++m) {
                const auto x = static_cast<std::size_t>(t * H + m);
                const double cd = Cd.at(t * H + m);
                const double var = 2 * hd * ua * ua * SQ.at(t * H + m) + 2 * id * ua * ua * SQ.at((T + t) * H + m) +
                                   (2 * static_cast<double>(k) + 1) * uc * uc * cd * cd;
                const double prob = w0[x] + gamma.lambda * std::sqrt(var) + omega * (w1[x] - w0[x]) + (w2[x] - 2 * w1[x] + w0[x]);
                out[x] += std::min(prob, w1[x]);
            }
    };
}

// Causal GQA attention over a cache (attention, and attention_sinks with a
// window and a sink logit per head), any composition or fused kernel that
// rounds no worse than the node's formats. Per row (t, h):
// (a) the scores: x_j = scale·(q·k_j), a dot product of D terms of inputs
//     rounded to storage (r, γ_D, subnormal terms as matmul_bounds), times
//     the scale (itself rounded, at worst to f32 or storage), rounded in the
//     accumulation and the output format: θ = (1 + max(u_o, u_f32))(1 + u_acc)(1 + u_o) − 1,
//       |x̂_j − x_j| <= E_j = [(1 + θ)a + θ]·A_j + (1 + θ)(η_s(1 + r)(1 + γ_D)·A_in
//                         + scale·D(η_s²(1 + γ_D) + η_acc)) + η_acc(1 + u_o) + η_o,
//     a = r + γ_D(1 + r), A_j = scale·Σ|q·k_j| >= |x_j|; a masked key is
//     −inf exactly and the sink logit an input (E = 0: the softmax bound
//     rounds its inputs to storage itself).
// (b) the probabilities: metrics/error_bound.hpp softmax_row_bounds over
//     the S + 1 columns with the computed inputs' E_j: |p̂_j − p_j| <= P_j.
// (c) the output: o_d = Σ_j p_j·v_jd, S products in any order:
//       |ô_d − o_d| <= (1 + r)(1 + γ_S)·Σ_j P_j|v_jd| + [r + γ_S(1 + r)]·Σ_j p_j|v_jd|
//                      + η_s(1 + r)(1 + γ_S)(Σ_j(p_j + P_j) + Σ_j|v_jd|) + S(η_s²(1 + γ_S) + η_acc),
//     then the output rounding (1 + u_o)·that + u_o|o_d| + η_o.
// From the reference's ops.<op>.probs, abs_dot, row_max, log_sum, abs_in,
// abs_v and dims (op_delta.cpp attention_bound_data).
ElementBounds attention_bounds(const TensorView& probs, const TensorView& dot, const TensorView& mx, const TensorView& ls, const TensorView& ain,
                               const TensorView& av, const TensorView& yr, std::int64_t D, std::int64_t S, double scale) {
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const InputRounding in = input_rounding(f);
        const double ua = f.accumulation.u, uo = f.output.u, r = in.product, eta_s = in.eta;
        const double eta_a = f.accumulation.eta, eta_o = f.output.eta, dd = static_cast<double>(D), sd = static_cast<double>(S);
        const double gD = gamma(D), gS = gamma(S), gC = gamma(S + 1);
        const double a = r + gD * (1 + r);
        const double theta = (1 + std::max(uo, std::ldexp(1.0, -24))) * (1 + ua) * (1 + uo) - 1;
        const std::int64_t C = S + 1, rows = mx.numel(), nh = probs.dim(1), rep = nh / av.dim(0);
        std::vector<double> y(static_cast<std::size_t>(C)), e(y.size()), pb(y.size());
        for (std::int64_t row = 0; row < rows; ++row) {
            const std::int64_t h = row % nh, g = h / rep;
            for (std::int64_t j = 0; j < C; ++j) {
                const auto jj = static_cast<std::size_t>(j);
                y[jj] = probs.at(row * C + j);
                const double A = dot.at(row * C + j);
                e[jj] = j < S && A > 0 ? ((1 + theta) * a + theta) * A +
                                             (1 + theta) * (eta_s * (1 + r) * (1 + gD) * ain.at(row) + scale * dd * (eta_s * eta_s * (1 + gD) + eta_a)) +
                                             eta_a * (1 + uo) + eta_o
                                       : 0.0;
            }
            softmax_row_bounds(f, gC, y, mx.at(row), ls.at(row), pb, e);
            double sp = 0;
            for (std::int64_t j = 0; j < S; ++j) sp += y[static_cast<std::size_t>(j)] + pb[static_cast<std::size_t>(j)];
            for (std::int64_t d = 0; d < D; ++d) {
                double sev = 0, spv = 0, sv = 0;
                for (std::int64_t j = 0; j < S; ++j) {
                    const double v = av.at((g * S + j) * D + d);
                    sev += pb[static_cast<std::size_t>(j)] * v;
                    spv += y[static_cast<std::size_t>(j)] * v;
                    sv += v;
                }
                const double eo = (1 + r) * (1 + gS) * sev + (r + gS * (1 + r)) * spv + eta_s * (1 + r) * (1 + gS) * (sp + sv) +
                                  sd * (eta_s * eta_s * (1 + gS) + eta_a);
                const std::int64_t x = row * D + d;  // [T, nh·D], head-major: row (t, h) is t·nh + h
                out[static_cast<std::size_t>(x)] += (1 + uo) * eo + uo * std::fabs(yr.at(x)) + eta_o;
            }
        }
    };
}

// The gated delta rule (linear_attention.hpp), per value head h and state
// column j, token after token. With ‖k‖ <= 1 (l2-normalised) and 0 < β < 1
// the update S ← decay·(I − β·k·kᵀ)·S + β·k·vᵀ is non-expansive in every
// column (I − βkkᵀ has eigenvalues 1 and 1 − β‖k‖², so norm <= 1 while
// β‖k‖² <= 2), so a column's error e = ‖Ŝ[:, j] − S[:, j]‖₂ grows by what each
// step adds and never multiplies. Per (t, h), from the raw inputs (every
// rounding (1 + δ), |δ| <= u, plus η; storage rounding of inputs u_s; the
// arithmetic, the state and the rank-1 update at u_e = u_acc or finer;
// elementary functions e_f = 8u_e):
//   q̂, k̂: metrics rmsnorm_relative_bound on (Σx² + eps)/dk (ρ_k; q also
//     × 1/√dk computed: ρ_q = (1 + ρ)(1 + e_f)(1 + u_e)² − 1), plus α = 4η_e
//     + 2η_s absolutely per element; ‖k̂‖ <= ‖k‖(1 + ρ_k) + √dk·α;
//   decay = exp(−exp(A_log)·softplus(a + dt_bias)): the sum's inputs and
//     rounding Δz, softplus 1-Lipschitz (+ e^{−20} where the threshold
//     switches, + its exp and log1p), exp(A_log) with A_log rounded, the
//     product, then exp: Δdecay = decay·(e^{Δg}(1 + e_f) − 1);
//   β = sigmoid(b): b rounded (σ' <= 1/4) and its exp, 1 + and division.
// Column step (s: the column before the decay, exact; e its node error):
//   e1 = (decay + Δdec)(1 + u_e)·e + ((decay + Δdec)(1 + u_e) − decay)·‖s‖
//   the new column's error, from Ŝ' − S' = (I − β̂k̂k̂ᵀ)·e1 + k̂β̂(v̂ − v)
//     − k̂β̂((k̂ − k)ᵀs1 + ρ_m) + (k̂β̂ − kβ)(v − m) + the roundings of δ and the update:
//   e' <= e1 + ‖k̂‖β̂|Δv| + ‖k̂‖β̂(ρ_kΣ|s1·k| + α√dk‖s1‖ + ρ_m) + ‖k̂β̂ − kβ‖·|v − m| + r_δ + r_upd,
//   ρ_m = γ_dk·Σ|ŝ1||k̂| (m's own sum); the output o_j = Σ_i S'_ij·q_i:
//   |ô − o| <= e'‖q̂‖ + ρ_qΣ|S'q| + α√dk‖S'‖ + γ_dk·Σ|Ŝ'||q̂|, then rounded to the output.
// From the reference's ops.gated_delta.cols, heads, params, dims
// (op_delta.cpp gated_delta_bound_data: the oracle's own trace). The
// recurrent state is taken as kept at the accumulation format or wider (f32
// in transformers and every kvasir kernel): a node rounding it to a coarser
// storage promises less than this bound.
ElementBounds gated_delta_bounds(const TensorView& cols, const TensorView& heads, const TensorView& params, const TensorView& yr,
                                 std::int64_t dk) {
    return [=](const OpFormats& f, const Gamma& gamma, std::vector<double>& out) {
        const InputRounding in = input_rounding(f);
        const double us = in.u, eta_s = in.eta;
        const double ue = f.accumulation.u, ef = kElementaryUlps * 2.0 * ue, uo = f.output.u;
        const double eta_e = f.accumulation.eta, eta_o = f.output.eta;
        const double g = gamma(dk), sdk = std::sqrt(static_cast<double>(dk)), kdk = static_cast<double>(dk);
        constexpr double eps = 1e-6;
        const double alpha = 4 * eta_e + 2 * eta_s;
        const double ue2 = (1 + ue) * (1 + ue) - 1;
        const double eps_sig = (1 + ef) * (1 + ef) * (1 + ue) / (1 - ef) - 1;
        const std::int64_t T = heads.dim(0), nv = heads.dim(1), dv = cols.dim(2);
        std::vector<double> err(static_cast<std::size_t>(dv));
        for (std::int64_t h = 0; h < nv; ++h) {
            const double a_log = params.at(h * 2), dt = params.at(h * 2 + 1), E = std::exp(a_log);
            const double eps_E = std::exp(us * std::fabs(a_log) + eta_s) * (1 + ef) - 1;
            for (std::int64_t j = 0; j < dv; ++j)
                err[static_cast<std::size_t>(j)] = us * cols.at(((0 * nv + h) * dv + j) * 6) + sdk * eta_s;  // the state read in
            for (std::int64_t t = 0; t < T; ++t) {
                const std::int64_t th = t * nv + h;
                const double nq2 = heads.at(th * 4), nk2 = heads.at(th * 4 + 1), a = heads.at(th * 4 + 2), b = heads.at(th * 4 + 3);
                const double rho_k = rmsnorm_relative_bound(f, g, 0.0, (nk2 + eps) / kdk);
                const double rho_q = (1 + rmsnorm_relative_bound(f, g, 0.0, (nq2 + eps) / kdk)) * (1 + ef) * (1 + ue) * (1 + ue) - 1;
                const double nk = std::sqrt(nk2 / (nk2 + eps)), nq = std::sqrt(nq2 / (nq2 + eps)) / sdk;
                const double nkh = nk * (1 + rho_k) + sdk * alpha, nqh = nq * (1 + rho_q) + sdk * alpha, dkn = rho_k * nk + sdk * alpha;
                // decay
                const double z = a + dt, sp = z > 20 ? z : std::log1p(std::exp(z)), gg = -E * sp, decay = std::exp(gg);
                const double dz = (us * (std::fabs(a) + std::fabs(dt)) + 2 * eta_s) * (1 + ue) + ue * std::fabs(z) + eta_e;
                const double dsp = dz + std::exp(-20.0) + ef + ef * (sp + dz);
                const double dg = E * (1 + eps_E) * (1 + ue) * dsp + std::fabs(gg) * ((1 + eps_E) * (1 + ue) - 1) + eta_e;
                const double ddec = decay * (std::exp(dg) * (1 + ef) - 1) + eta_e, dec_hi = decay + ddec;
                // beta
                const double beta = 1 / (1 + std::exp(-b)), db = us * std::fabs(b) + eta_s;
                const double dbeta = db / 4 + (beta + db / 4) * eps_sig + eta_e, beta_hi = beta + dbeta;
                const double dkb = dkn * beta_hi + nk * dbeta;  // ‖k̂β̂ − kβ‖
                const bool contracts = std::isfinite(rho_k) && std::isfinite(rho_q) && std::isfinite(dg) && beta_hi * nkh * nkh <= 2;
                for (std::int64_t j = 0; j < dv; ++j) {
                    const std::int64_t c = (th * dv + j) * 6;
                    const double s_prev = cols.at(c), s1k = cols.at(c + 1), v = cols.at(c + 2), m = cols.at(c + 3), snew = cols.at(c + 4),
                                 snq = cols.at(c + 5);
                    double& e = err[static_cast<std::size_t>(j)];
                    const std::int64_t x = th * dv + j;
                    if (!contracts || !std::isfinite(e)) {
                        e = INFINITY;
                        out[static_cast<std::size_t>(x)] = INFINITY;
                        continue;
                    }
                    const double s1 = decay * s_prev;
                    const double e1 = dec_hi * (1 + ue) * e + (dec_hi * (1 + ue) - decay) * s_prev;
                    const double s1h = dec_hi * (1 + ue) * (s_prev + e);
                    const double rho_m = g * ((1 + rho_k) * (s1k + e1 * nk) + alpha * sdk * (s1 + e1));
                    const double kds = rho_k * s1k + alpha * sdk * s1;
                    const double dvv = us * std::fabs(v) + eta_s;
                    const double dm = e1 * nkh + kds + rho_m;
                    const double vm = std::fabs(v - m), vmh = vm + dvv + dm;
                    const double delta_hi = beta_hi * vmh * (1 + ue2);
                    const double r_delta = nkh * beta_hi * vmh * ue2;
                    const double r_upd = ue * (1 + ue) * nkh * delta_hi + ue * (1 + ue) * (s1h + nkh * delta_hi) + 2 * sdk * eta_e;
                    e = e1 + nkh * beta_hi * dvv + nkh * beta_hi * (kds + rho_m) + dkb * vm + r_delta + r_upd;
                    const double eo = e * nqh + rho_q * snq + alpha * sdk * snew + g * ((1 + rho_q) * (snq + e * nq) + alpha * sdk * (snew + e));
                    out[static_cast<std::size_t>(x)] += (1 + uo) * eo + uo * std::fabs(yr.at(x)) + eta_o;
                }
            }
        }
    };
}

// One op's rigorous bound, read from the reference's outputs: its longest
// reduction K (whether a node's formats bound it at all) and its element
// bounds.
struct BoundOp {
    std::string op;
    std::int64_t K = 0;
    ElementBounds bounds;
};

// Reads the bound data the reference kept for each op (ops.<op>.<name>,
// op_delta.cpp): one reader per op. An op without them (a capture from before
// its bound) has none. Error(bad_input) for data that do not fit the op's
// output.
class BoundReader {
public:
    explicit BoundReader(const NodeOutputs& reference) : ref(reference) {}
    // In report order.
    std::vector<BoundOp> all() const {
        std::vector<BoundOp> ops;
        for (const std::optional<BoundOp>& op : {matmul(), softmax(), rmsnorm(), causal_conv1d(), moe(), gated_delta(),
                                                 attention("attention"), attention("attention_sinks")})
            if (op) ops.push_back(*op);
        return ops;
    }

private:
    const NodeOutputs& ref;

    bool has_all(const char* op, std::initializer_list<const char*> names) const {
        for (const char* n : names)
            if (!ref.has(fmt::format("ops.{}.{}", op, n))) return false;
        return true;
    }
    TensorView data(const char* op, const char* name) const { return ref.view(fmt::format("ops.{}.{}", op, name)); }
    void shapes_fit(const char* op, const TensorView& y, std::initializer_list<std::pair<const char*, Shape>> want) const {
        for (const auto& [name, shape] : want) {
            const std::string key = fmt::format("ops.{}.{}", op, name);
            KVASIR_CHECK(ref.view(key).shape == shape, ErrorCode::bad_input, "{}: {} has shape {}, not {} for ops.{}.out {}",
                         ref.origin(), key, shape_str(ref.view(key).shape), shape_str(shape), op, shape_str(y.shape));
        }
    }
    std::optional<BoundOp> matmul() const;
    std::optional<BoundOp> softmax() const;
    std::optional<BoundOp> rmsnorm() const;
    std::optional<BoundOp> causal_conv1d() const;
    std::optional<BoundOp> moe() const;
    std::optional<BoundOp> gated_delta() const;
    std::optional<BoundOp> attention(const char* op) const;  // attention, attention_sinks
};

std::optional<BoundOp> BoundReader::matmul() const {
    if (!ref.has("ops.matmul.abs_dot") || !ref.has("ops.matmul.out")) return std::nullopt;
    const auto k_note = ref.note("ops_matmul_k");
    std::int64_t K = 0;
    if (k_note) K = std::strtoll(k_note->c_str(), nullptr, 10);
    KVASIR_CHECK(K > 0 && K <= (std::int64_t{1} << 24), ErrorCode::bad_input, "{}: ops_matmul_k {} is not an inner dimension",
                 ref.origin(), k_note.value_or("(absent)"));
    const TensorView yr = ref.view("ops.matmul.out");
    KVASIR_CHECK(yr.shape.size() == 2, ErrorCode::bad_input, "{}: ops.matmul.out {} is not [T, N]", ref.origin(), shape_str(yr.shape));
    shapes_fit("matmul", yr, {{"abs_dot", yr.shape}, {"abs_x", Shape{yr.shape[0]}}, {"abs_w", Shape{yr.shape[1]}}});
    return BoundOp{"matmul", K, matmul_bounds(ref.view("ops.matmul.abs_dot"), yr, ref.view("ops.matmul.abs_x"),
                                              ref.view("ops.matmul.abs_w"), K)};
}

std::optional<BoundOp> BoundReader::softmax() const {
    if (!has_all("softmax", {"out", "row_max", "log_sum"})) return std::nullopt;
    const TensorView yr = data("softmax", "out");
    KVASIR_CHECK(yr.rank() >= 1 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.softmax.out is empty", ref.origin());
    const std::int64_t cols = yr.dim(-1), rows = yr.numel() / cols;
    shapes_fit("softmax", yr, {{"row_max", Shape{rows}}, {"log_sum", Shape{rows}}});
    return BoundOp{"softmax", cols, softmax_bounds(yr, data("softmax", "row_max"), data("softmax", "log_sum"))};
}

std::optional<BoundOp> BoundReader::rmsnorm() const {
    if (!has_all("rmsnorm", {"out", "mean_square", "scale_cond", "abs_scale"})) return std::nullopt;
    const TensorView yr = data("rmsnorm", "out");
    KVASIR_CHECK(yr.rank() >= 1 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.rmsnorm.out is empty", ref.origin());
    const std::int64_t cols = yr.dim(-1), rows = yr.numel() / cols;
    shapes_fit("rmsnorm", yr, {{"mean_square", Shape{rows}}, {"scale_cond", Shape{cols}}, {"abs_scale", Shape{cols}}});
    return BoundOp{"rmsnorm", cols,
                   rmsnorm_bounds(yr, data("rmsnorm", "mean_square"), data("rmsnorm", "scale_cond"), data("rmsnorm", "abs_scale"))};
}

std::optional<BoundOp> BoundReader::causal_conv1d() const {
    if (!has_all("causal_conv1d", {"out", "pre", "abs_dot", "abs_in", "kernel"})) return std::nullopt;
    const TensorView yr = data("causal_conv1d", "out");
    KVASIR_CHECK(yr.rank() == 2 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.causal_conv1d.out {} is not [T, C]", ref.origin(),
                 shape_str(yr.shape));
    shapes_fit("causal_conv1d", yr, {{"pre", yr.shape}, {"abs_dot", yr.shape}, {"abs_in", yr.shape}, {"kernel", Shape{1}}});
    const double kk = data("causal_conv1d", "kernel").at(0);
    KVASIR_CHECK(kk >= 1 && kk <= 1024 && kk == std::floor(kk), ErrorCode::bad_input, "{}: ops.causal_conv1d.kernel {} is not a kernel size",
                 ref.origin(), kk);
    const auto K = static_cast<std::int64_t>(kk);
    return BoundOp{"causal_conv1d", K,
                   conv_bounds(data("causal_conv1d", "abs_dot"), data("causal_conv1d", "pre"), data("causal_conv1d", "abs_in"), yr, K)};
}

std::optional<BoundOp> BoundReader::moe() const {
    if (!has_all("moe", {"out", "abs_terms", "abs_sums", "abs_combine", "abs_weights", "dims", "sq_terms"})) return std::nullopt;
    const TensorView yr = data("moe", "out"), dims = data("moe", "dims");
    KVASIR_CHECK(yr.rank() == 2 && yr.numel() > 0, ErrorCode::bad_input, "{}: ops.moe.out {} is not [T, H]", ref.origin(),
                 shape_str(yr.shape));
    const std::int64_t T = yr.shape[0], H = yr.shape[1];
    shapes_fit("moe", yr, {{"abs_terms", Shape{6, T, H}}, {"abs_sums", Shape{T, 6}}, {"abs_combine", yr.shape}, {"abs_weights", Shape{T}},
                           {"dims", Shape{4}}, {"sq_terms", Shape{2, T, H}}});
    const auto dim = [&](std::int64_t i, double lo, double hi) {
        const double v = dims.at(i);
        KVASIR_CHECK(v >= lo && v <= hi && v == std::floor(v), ErrorCode::bad_input, "{}: ops.moe.dims[{}] = {} is outside {}..{}",
                     ref.origin(), i, v, lo, hi);
        return static_cast<std::int64_t>(v);
    };
    KVASIR_CHECK(dim(0, 1, 1 << 20) == H, ErrorCode::bad_input, "{}: ops.moe.dims[0] is not ops.moe.out's width {}", ref.origin(), H);
    const std::int64_t I = dim(1, 1, 1 << 20), k = dim(2, 1, 1024);
    const double amax = dims.at(3);
    KVASIR_CHECK(std::isfinite(amax) && amax >= 0, ErrorCode::bad_input, "{}: ops.moe.dims[3] = {} is not a magnitude", ref.origin(), amax);
    // The longest reduction decides whether a node's formats bound it at all.
    return BoundOp{"moe", std::max(H, I),
                   moe_bounds(data("moe", "abs_terms"), data("moe", "abs_sums"), data("moe", "abs_combine"), data("moe", "abs_weights"),
                              data("moe", "sq_terms"), yr, H, I, k, amax)};
}

std::optional<BoundOp> BoundReader::gated_delta() const {
    if (!has_all("gated_delta", {"out", "cols", "heads", "params", "dims"})) return std::nullopt;
    const TensorView yr = data("gated_delta", "out"), cols = data("gated_delta", "cols"), dims = data("gated_delta", "dims");
    KVASIR_CHECK(yr.rank() == 3 && yr.numel() > 0 && dims.numel() == 1, ErrorCode::bad_input,
                 "{}: ops.gated_delta.out {} is not [T, nv, dv] (or dims is not [1])", ref.origin(), shape_str(yr.shape));
    const std::int64_t T = yr.shape[0], nv = yr.shape[1], dv = yr.shape[2];
    const double dkd = dims.at(0);
    KVASIR_CHECK(dkd >= 1 && dkd <= (1 << 20) && dkd == std::floor(dkd), ErrorCode::bad_input, "{}: ops.gated_delta.dims[0] = {} is not a head dim",
                 ref.origin(), dkd);
    shapes_fit("gated_delta", yr, {{"cols", Shape{T, nv, dv, 6}}, {"heads", Shape{T, nv, 4}}, {"params", Shape{nv, 2}}});
    const auto dk = static_cast<std::int64_t>(dkd);
    return BoundOp{"gated_delta", dk, gated_delta_bounds(cols, data("gated_delta", "heads"), data("gated_delta", "params"), yr, dk)};
}

std::optional<BoundOp> BoundReader::attention(const char* op) const {
    if (!has_all(op, {"out", "probs", "abs_dot", "row_max", "log_sum", "abs_in", "abs_v", "dims"})) return std::nullopt;
    const TensorView yr = data(op, "out"), pr = data(op, "probs"), dims = data(op, "dims"), av = data(op, "abs_v");
    KVASIR_CHECK(pr.rank() == 3 && av.rank() == 3 && dims.numel() == 3, ErrorCode::bad_input,
                 "{}: ops.{}.probs {}, abs_v {}, dims {} are not [T, nh, S+1], [nkv, S, D], [3]", ref.origin(), op, shape_str(pr.shape),
                 shape_str(av.shape), shape_str(dims.shape));
    const std::int64_t T = pr.shape[0], nh = pr.shape[1], S = pr.shape[2] - 1, nkv = av.shape[0], D = av.shape[2];
    KVASIR_CHECK(S >= 1 && nkv >= 1 && nh % nkv == 0 && av.shape[1] == S && dims.at(0) == static_cast<double>(D) &&
                     dims.at(1) == static_cast<double>(S) && std::isfinite(dims.at(2)) && dims.at(2) > 0,
                 ErrorCode::bad_input, "{}: ops.{}'s bound data disagree: probs {}, abs_v {}, dims [{}, {}, {}]", ref.origin(), op,
                 shape_str(pr.shape), shape_str(av.shape), dims.at(0), dims.at(1), dims.at(2));
    shapes_fit(op, yr, {{"abs_dot", pr.shape}, {"row_max", Shape{T, nh}}, {"log_sum", Shape{T, nh}}, {"abs_in", Shape{T, nh}}});
    KVASIR_CHECK(yr.shape == (Shape{T, nh * D}), ErrorCode::bad_input, "{}: ops.{}.out {} is not [{}, {}]", ref.origin(), op,
                 shape_str(yr.shape), T, nh * D);
    return BoundOp{op, std::max(D, S + 1),
                   attention_bounds(pr, data(op, "abs_dot"), data(op, "row_max"), data(op, "log_sum"), data(op, "abs_in"), av, yr, D, S,
                                    dims.at(2))};
}

// A node's output y of `op` against its bound at `gamma` (the worst case or
// the probabilistic one) plus the oracle's own share `ref_bound`: the count
// of elements outside (NaN is outside), and into `out` gamma(K), that count,
// the largest |Δ| / bound and the first element outside.
std::int64_t count_violations(const BoundOp& op, const OpFormats& f, const Gamma& gamma, std::vector<double> bound,
                              const TensorView& y, const TensorView& yr, nlohmann::ordered_json& out) {
    op.bounds(f, gamma, bound);
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
    out = {{"gamma", json_double(gamma(op.K))}, {"violations", violations}, {"worst_fraction_of_bound", json_double(worst)}};
    if (first >= 0) out["first"] = first;
    return violations;
}

// Rigorous a-priori bounds, element by element, of the ops that have one:
// matmul, softmax, rmsnorm, causal_conv1d, moe, gated_delta, attention and
// attention_sinks (the derivations beside each bound above and in
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
    const std::vector<BoundOp> ops = BoundReader(ref).all();
    if (ops.empty()) return nullptr;
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    struct Count {
        std::int64_t worst = 0, probable = 0;
        int measured = 0;
        std::vector<std::string> why;
    };
    std::vector<Count> counts(in.nodes.size());
    for (const BoundOp& op : ops) {
        const TensorView yr = ref.view("ops." + op.op + ".out");
        nlohmann::ordered_json o{{"op", op.op}, {"k", op.K}, {"lambda", kProbLambda}, {"results", nlohmann::ordered_json::array()}};
        // The oracle's own share of every bound, at its formats and worst-case γ_K.
        std::string ref_why;
        const bool matmul = op.op == "matmul" || op.op == "moe";  // a matmul's input format (cuBLAS TF32) applies
        const std::optional<OpFormats> fr = op_formats(led.inputs()[in.reference].capabilities, matmul, ref_why);
        std::vector<double> ref_bound(static_cast<std::size_t>(yr.numel()), 0.0);
        const std::optional<double> g_ref = fr ? gamma_bound(op.K, fr->accumulation.u) : std::nullopt;
        if (fr && g_ref) op.bounds(*fr, Gamma{fr->accumulation.u, false, 0.0}, ref_bound);
        for (std::size_t i = 0; i < in.nodes.size(); ++i) {
            if (i == in.reference || !in.present[i] || !in.nodes[i]->has("ops." + op.op + ".out")) continue;
            std::string why;
            const std::optional<OpFormats> f = op_formats(led.inputs()[i].capabilities, matmul, why);
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
                const Gamma gamma{f->accumulation.u, probable, kProbLambda};
                nlohmann::ordered_json b;
                (probable ? counts[i].probable : counts[i].worst) += count_violations(op, *f, gamma, ref_bound, y, yr, b);
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
        // Beside a candidate the authority only decides (routing, the MoE
        // input): its outputs and bound data are the authority's own capture's.
        const OpsReport r = run_op_delta(*env.plan->ops, nodes, 0, &keep, self ? ReferenceRole::full : ReferenceRole::decides_only);
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

    std::shared_ptr<const StepResult> compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport& out) const override {
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
        auto res = std::make_shared<OpsStepResult>();
        res->report = std::move(r);
        for (const NodeOutputs* o : in.nodes) res->nodes.push_back(o->node());
        res->bounds = std::move(bounds);
        return res;
    }
};

}  // namespace

nlohmann::ordered_json OpsStepResult::to_json() const {
    nlohmann::ordered_json j = kvasir::to_json(report);
    j["nodes"] = nodes;  // capabilities are in each node's verdict
    if (!bounds.is_null()) j["bounds"] = bounds;
    return j;
}

const Step& ops_step() {
    static const OpsAudit s;
    return s;
}

}  // namespace kvasir
