// Forward error bounds of dot products (Higham, "Accuracy and Stability of
// Numerical Algorithms", §3.1): a sum of K products computed in floating
// point with unit roundoff u, in ANY order, FMA or not, differs from the
// exact one by at most γ_K(u)·Σ|x_k·w_k|, γ_K(u) = K·u / (1 − K·u). One home
// for the audit's bound criteria (step 1, audit/step_ops.cpp) and for the
// tests that check every backend's matmul against the f64 oracle
// (tests/backend/matmul_bound.hpp).
#pragma once

#include "kvasir/core/tensor.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kvasir {

// γ_K(u); nullopt where K·u >= 1 (no bound exists).
std::optional<double> gamma_bound(std::int64_t k, double u);

// Higham & Mary's probabilistic γ̃_K(λ) = exp(λ·√K·u + K·u²/(1 − u)) − 1
// (SIAM J. Sci. Comput. 41(5), 2019, Thm 3.1): the bound holds for each
// output with probability >= 1 − 2·exp(−λ²(1 − u)²/2) when the rounding
// errors are independent and mean zero. Never above γ_K where that exists.
double probabilistic_gamma(std::int64_t k, double u, double lambda);

// The scales of the bound of y = x·wᵀ (x [T, K], w [N, K]), in f64:
// Σ_k |x_tk·w_nk| [T, N], and Σ_k |x_tk| [T], Σ_k |w_nk| [N] (these two
// scale the absolute error a rounding in the subnormal range adds).
struct AbsProducts {
    Tensor dot, x, w;
};
AbsProducts abs_products(const TensorView& x, const TensorView& w);

// Unit roundoff u and subnormal-range absolute error η (half the smallest
// subnormal: gradual underflow, as IEEE 754 rounds) of a format named as
// capabilities name them (f64, f32, tf32, f16, bf16); nullopt for one this
// tool has no bound for. TF32 keeps f32's exponent range. max: the largest
// finite value.
struct FormatUnits {
    double u = 0, eta = 0, max = 0;
};
std::optional<FormatUnits> format_units(std::string_view name);

// The formats a node computes a row-wise op in: its inputs are f32 values
// rounded to `storage` (exact when storage is f32 or wider), reductions and
// element-wise arithmetic run in `accumulation` or wider, intermediates a
// kernel keeps in storage are rounded to it, the result to `output`.
struct OpFormats {
    FormatUnits storage, accumulation, output;
};

// The inputs of an op are f32 values; a node rounds them to its storage
// format (nothing when storage holds f32 or wider): u of one rounded input,
// product = 2u + u² of a product of two, eta absolutely in the subnormal range.
struct InputRounding {
    double u = 0, product = 0, eta = 0;
};
InputRounding input_rounding(const OpFormats& f);

// Relative error allowed to one elementary function (exp, sqrt, rsqrt,
// division) of the accumulation format: 4 ulp = 8u. Above what every
// platform this tool runs on promises (OpenCL 1.2 full profile f32: exp and
// sqrt <= 3 ulp, rsqrt <= 2, division <= 2.5; CUDA expf 2 ulp; glibc and
// correctly rounded IEEE operations <= 1 ulp). A kernel built with native_
// or fast-math intrinsics may leave it: that is a node promising less.
constexpr double kElementaryUlps = 4.0;

// Relative error of SiLU evaluated in a format of unit roundoff u, as
// g / (1 + exp(−g)) or g·σ(g): exp and the division at kElementaryUlps, the
// 1 + and the product: (1 + 8u)²(1 + u)² − 1.
double silu_evaluation_error(double u);

// RMSNorm y_j = x_j·s_j / sqrt(Σ_k x_k²/K + eps) over rows of K: the
// relative bound ρ_j with |ŷ_j − y_j| <= ρ_j·|y_j| (+ the output's η) for
// a node of formats f, whose sum of the K squares errs by at most
// `sum_gamma` relatively (γ_K(u_acc), or its probabilistic form — the terms
// are positive, so the sum's error is relative). scale_cond_j =
// |w_j| / |1 + w_j| for a scale the node forms as 1 + w from the stored w
// (the (1 + w) convention: the addition conditions it), else 0.
// min_mean_square: the row's Σx²/K + eps (the subnormal terms are relative
// to it). Derivation in metrics/error_bound.cpp.
double rmsnorm_relative_bound(const OpFormats& f, double sum_gamma, double scale_cond, double min_mean_square);
// The whole bound of one RMSNorm element: ρ·|y| (rho from
// rmsnorm_relative_bound) plus what gradual underflow adds absolutely —
// x_j or the scale rounded to a subnormal of storage (η_s·(|s_j| + √(K·msq))
// / √msq, as |x_j| <= √(K·msq)), the last product's and the output's η.
double rmsnorm_element_bound(const OpFormats& f, double rho, double y, double abs_scale, std::int64_t k, double mean_square);

// Softmax of one row of K (max-subtracted): each element's absolute bound
// |ŷ_j − y_j| for a node of formats f whose sum of the K exponentials errs
// by at most `sum_gamma` relatively, from the exact row y (in practice the
// f64 oracle's), its maximum x_max and log Σ_k exp(x_k − x_max) = log_sum:
// every element's input is recovered as x_j = x_max + log(y_j) + log_sum.
// Writes K bounds into `bound`; +inf where the formats bound nothing (the
// sum's error reaches the sum). `input_error` (empty, or K values): the node's
// inputs are themselves computed, each within input_error[j] of the exact
// x_j (attention's scores).
void softmax_row_bounds(const OpFormats& f, double sum_gamma, std::span<const double> y, double x_max, double log_sum,
                        std::span<double> bound, std::span<const double> input_error = {});

}  // namespace kvasir
