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

}  // namespace kvasir
