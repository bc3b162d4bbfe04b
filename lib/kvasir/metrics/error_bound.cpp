#include "kvasir/metrics/error_bound.hpp"

#include "kvasir/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvasir {

std::optional<double> gamma_bound(std::int64_t k, double u) {
    const double ku = static_cast<double>(k) * u;
    if (!(ku < 1.0)) return std::nullopt;
    return ku / (1.0 - ku);
}

double probabilistic_gamma(std::int64_t k, double u, double lambda) {
    const double kd = static_cast<double>(k);
    const double p = std::expm1(lambda * std::sqrt(kd) * u + kd * u * u / (1.0 - u));
    const std::optional<double> g = gamma_bound(k, u);
    return g ? std::min(*g, p) : p;
}

AbsProducts abs_products(const TensorView& x, const TensorView& w) {
    KVASIR_CHECK(x.rank() == 2 && w.rank() == 2 && x.shape[1] == w.shape[1], ErrorCode::bad_input,
                 "abs_products: x {} and w {} are not [T, K] and [N, K]", shape_str(x.shape), shape_str(w.shape));
    const std::int64_t T = x.shape[0], K = x.shape[1], N = w.shape[0];
    AbsProducts out{Tensor(DType::f64, {T, N}), Tensor(DType::f64, {T}), Tensor(DType::f64, {N})};
    double* o = out.dot.as<double>();
    std::vector<double> xs(static_cast<std::size_t>(K)), ws(static_cast<std::size_t>(N * K));
    for (std::int64_t i = 0; i < N * K; ++i) ws[static_cast<std::size_t>(i)] = std::fabs(w.at(i));
    for (std::int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (std::int64_t k = 0; k < K; ++k) acc += ws[static_cast<std::size_t>(n * K + k)];
        out.w.as<double>()[n] = acc;
    }
    for (std::int64_t t = 0; t < T; ++t) {
        double sx = 0;
        for (std::int64_t k = 0; k < K; ++k) sx += xs[static_cast<std::size_t>(k)] = std::fabs(x.at(t * K + k));
        out.x.as<double>()[t] = sx;
        for (std::int64_t n = 0; n < N; ++n) {
            double acc = 0;
            const double* wr = ws.data() + n * K;
            for (std::int64_t k = 0; k < K; ++k) acc += xs[static_cast<std::size_t>(k)] * wr[k];
            o[t * N + n] = acc;
        }
    }
    return out;
}

}  // namespace kvasir

namespace kvasir {

std::optional<FormatUnits> format_units(std::string_view n) {
    if (n == "f64") return FormatUnits{std::ldexp(1.0, -53), std::ldexp(1.0, -1075), std::numeric_limits<double>::max()};
    const double f32_max = std::numeric_limits<float>::max();
    if (n == "f32") return FormatUnits{std::ldexp(1.0, -24), std::ldexp(1.0, -150), f32_max};
    if (n == "tf32") return FormatUnits{std::ldexp(1.0, -11), std::ldexp(1.0, -150), f32_max};
    if (n == "f16") return FormatUnits{std::ldexp(1.0, -11), std::ldexp(1.0, -25), 65504.0};
    if (n == "bf16") return FormatUnits{std::ldexp(1.0, -8), std::ldexp(1.0, -134), std::ldexp(255.0, 120)};
    return std::nullopt;
}

InputRounding input_rounding(const OpFormats& f) {
    if (!(f.storage.u > std::ldexp(1.0, -24))) return {};  // storage f32 or wider holds the inputs exactly
    const double u = f.storage.u;
    return {u, 2.0 * u + u * u, f.storage.eta};
}

double silu_evaluation_error(double u) {
    const double e = kElementaryUlps * 2.0 * u;
    return (1.0 + e) * (1.0 + e) * (1.0 + u) * (1.0 + u) - 1.0;
}

namespace {

// An intermediate rounded to storage: exact when storage is at least as wide
// as the arithmetic that made it.
double intermediate_rounding(const OpFormats& f) { return f.storage.u > f.accumulation.u ? f.storage.u : 0.0; }

}  // namespace

// Every rounding is a factor (1 + δ), |δ| <= u, with gradual underflow's
// absolute η where a value can be subnormal; a product of factors each
// within [1 − a, 1 + a] deviates from 1 by at most Π(1 + a) − 1. With
// u_in the inputs' rounding to storage (0 when storage holds f32), u_e the
// arithmetic's, e_f = 8u_e an elementary function's, u_o the output's:
//   Σ x̂_k² = Σ x_k²·(1 + θ),  |θ| <= α = (1 + u_in)²(1 + γ) − 1
//     (squares and sum of positive terms: the sum's error is relative;
//      subnormal squares and x's rounding near underflow add at most
//      (η_e + 2η_s·√msq + η_s²)/msq relative to the mean square msq);
//   m̂ = (ŝ/K + eps)(two roundings, eps's own included) = m(1 + ψ), |ψ| <= β;
//   1/sqrt(m̂) = m^{-1/2}(1 + ψ)^{-1/2}(sqrt and division or rsqrt: (1 + e_f)²);
//   ŷ = x̂·inv·ŝ (two products (1 + u_e)²), the scale ŝ = w(1 + u_in), or
//   for the (1 + w) convention fl_s(fl(1 + fl_s(w))) = (1 + w)(1 + c·u_in)
//   (1 + u_e)(1 + u_in), c = |w|/|1 + w|; then the output (1 + u_o).
double rmsnorm_relative_bound(const OpFormats& f, double sum_gamma, double scale_cond, double min_mean_square) {
    if (!(sum_gamma >= 0 && sum_gamma < 1) || !(min_mean_square > 0) || !(scale_cond >= 0) || !std::isfinite(scale_cond))
        return INFINITY;
    const double uin = input_rounding(f).u, ue = f.accumulation.u, ef = kElementaryUlps * 2.0 * ue, uo = f.output.u;
    const double msq = min_mean_square;
    const double sub = (f.accumulation.eta + 2.0 * f.storage.eta * std::sqrt(msq) + f.storage.eta * f.storage.eta) / msq;
    const double alpha = (1 + uin) * (1 + uin) * (1 + sum_gamma) - 1 + sub;
    const double beta = (1 + alpha) * (1 + ue) * (1 + ue) - 1;
    if (!(beta < 1)) return INFINITY;
    const double up = (1 + uin) / std::sqrt(1 - beta) * (1 + ef) * (1 + ef) * (1 + ue) * (1 + ue) * (1 + uin) *
                      (1 + scale_cond * uin) * (1 + ue) * (1 + uo);
    return up - 1;
}

double rmsnorm_element_bound(const OpFormats& f, double rho, double y, double abs_scale, std::int64_t k, double mean_square) {
    if (!std::isfinite(rho) || !(mean_square > 0)) return INFINITY;
    const double eta_in = input_rounding(f).eta;
    const double r = std::sqrt(mean_square);
    const double sub_in = eta_in * (abs_scale + std::sqrt(static_cast<double>(k) * mean_square)) / r * (1 + rho) * 2;
    return rho * std::fabs(y) + sub_in + 2 * f.accumulation.eta + f.output.eta;
}

// Per element j of the row, with d_j = x_j − x_max <= 0, a_j = |x_j| + |x_max|:
//   d̂_j = fl(x̂_j − x̂_max) errs by Δ_j <= [u_in·a_j(1 + u_e) + 2η_s + 2u_e·|d_j|](1 + u_e)
//     (the inputs' rounding, the subtraction, and an exp taken as
//      exp2(d·log2 e), whose argument product rounds once more);
//   ê_j = e^{d_j}·e^{±Δ_j}(1 ± e_f)(1 ± u_i) ± η (u_i: rounded to storage);
//   Ẑ = Σ ê_k (1 ± γ) ± K·η_e; relative to the exact Z >= 1 (its largest term is
//     e⁰), within [L(1 − e_f)(1 − u_i)(1 − γ), U(1 + e_f)(1 + u_i)(1 + γ)] ∓ K·η',
//     U = Σ_k y_k e^{Δ_k}, L = Σ_k y_k e^{−Δ_k};
//   ŷ_j = ê_j / Ẑ (a division, or a reciprocal and a product: (1 ± e_f)(1 ± u_e)),
//     rounded to the output (1 ± u_o) ± η_o.
//
// Computed inputs x̂_j = x_j + e_j, |e_j| <= E_j (input_error): softmax is
// shift-invariant, so the exact softmax of x̂ is y_j·e^{e_j} / Σ_k y_k e^{e_k},
// which is the same form with Δ_j grown by E_j; and the subtraction now
// rounds |x̂_j − m̂| <= |d_j| + E_j + max_k E_k (the computed max m̂ is within
// max E of x_max).
void softmax_row_bounds(const OpFormats& f, double sum_gamma, std::span<const double> y, double x_max, double log_sum,
                        std::span<double> bound, std::span<const double> input_error) {
    KVASIR_CHECK(y.size() == bound.size(), ErrorCode::internal, "softmax_row_bounds: {} values, {} bounds", y.size(), bound.size());
    KVASIR_CHECK(input_error.empty() || input_error.size() == y.size(), ErrorCode::internal,
                 "softmax_row_bounds: {} values, {} input errors", y.size(), input_error.size());
    const auto err = [&](std::size_t j) { return input_error.empty() ? 0.0 : input_error[j]; };
    double err_max = 0;
    for (std::size_t j = 0; j < input_error.size(); ++j) err_max = std::max(err_max, input_error[j]);
    if (!std::isfinite(err_max)) {
        std::fill(bound.begin(), bound.end(), INFINITY);
        return;
    }
    const double uin = input_rounding(f).u, ui = intermediate_rounding(f), ue = f.accumulation.u, uo = f.output.u;
    const double ef = kElementaryUlps * 2.0 * ue;
    const double eta_e = std::max(f.accumulation.eta, ui > 0 ? f.storage.eta : 0.0), eta_o = f.output.eta;
    const double eta_in = uin > 0 ? f.storage.eta : 0.0;  // x or the max rounded to a subnormal
    const auto K = static_cast<double>(y.size());
    std::vector<double> delta(y.size(), 0.0);
    double U = 0, L = 0;
    bool finite = std::isfinite(x_max) && std::isfinite(log_sum) && sum_gamma >= 0 && sum_gamma < 1;
    for (std::size_t j = 0; finite && j < y.size(); ++j) {
        if (!(y[j] >= 0) || !std::isfinite(y[j])) finite = false;
        if (!(y[j] > 0)) continue;  // below f64's range: only the absolute terms
        const double d = std::min(0.0, std::log(y[j]) + log_sum);
        const double a = std::fabs(x_max + d) + std::fabs(x_max) + err(j) + err_max;
        delta[j] = (uin * a * (1 + ue) + 2 * eta_in + 2 * ue * (std::fabs(d) + err(j) + err_max)) * (1 + ue) + err(j);
        U += y[j] * std::exp(delta[j]);
        L += y[j] * std::exp(-delta[j]);
    }
    const double absz = K * (eta_e * (1 + sum_gamma) + f.accumulation.eta);
    const double z_hi = U * (1 + ef) * (1 + ui) * (1 + sum_gamma) + absz;
    const double z_lo = L * (1 - ef) * (1 - ui) * (1 - sum_gamma) - absz;
    if (!finite || !(z_lo > 0)) {
        std::fill(bound.begin(), bound.end(), INFINITY);
        return;
    }
    const double div_hi = (1 + ef) * (1 + ue) * (1 + uo), div_lo = (1 - ef) * (1 - ue) * (1 - uo);
    for (std::size_t j = 0; j < y.size(); ++j) {
        const double hi = (y[j] * std::exp(delta[j]) * (1 + ef) * (1 + ui) + eta_e) / z_lo * div_hi + eta_o;
        const double lo = (y[j] * std::exp(-delta[j]) * (1 - ef) * (1 - ui) - eta_e) / z_hi * div_lo - eta_o;
        bound[j] = std::max(hi - y[j], y[j] - lo);
    }
}

}  // namespace kvasir
