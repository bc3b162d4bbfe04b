// The forward error bound every matmul test checks against the f64 oracle
// (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1): a dot
// product of length K summed in f32 in any order differs from the exact one
// by at most γ_K(u)·Σ|x·w|, γ_K(u) = K·u / (1 − K·u), u = 2⁻²⁴; plus the
// final rounding of the result and, for narrower storage, the rounding of the
// inputs. Used by the conformance suite (every node) and by the tests that
// only one backend has.
#pragma once

#include "kvasir/core/tensor.hpp"
#include "kvasir/metrics/error_bound.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvasir::test {

constexpr double kU32 = 1.0 / (1 << 24);

// γ_K(u) where it exists (callers keep K·u < 1): metrics/error_bound.hpp.
inline double gamma(std::int64_t k, double u) { return gamma_bound(k, u).value(); }

// Σ_k |x_k·w_k| for every output of x [T, K] · w [N, K]ᵀ, row-major [T, N]:
// the scale of the bound below (metrics/error_bound.hpp). Computed once per
// (x, w), it serves every node given those operands.
inline std::vector<double> abs_products(const Tensor& x, const Tensor& w) { return kvasir::abs_products(x.view(), w.view()).dot.to_f64(); }

// For a product with inner dimension K, result y and oracle yr [T, N], and
// abs_sum = abs_products(x, w), every element:
//   |y − yr| ≤ (input_rel + γ_K(acc_u))·Σ_k |x·w| + out_u·|yr| + abs_err
// input_rel: relative error of the inputs as the node holds them (2u_s + u_s²
// for storage format u_s; 0 for f32), out_u: rounding of the stored result,
// acc_u: unit roundoff of the running sum (f32 unless the node accumulates in
// half), abs_err: what roundings in a subnormal range add beyond the relative
// terms (K·2⁻²⁵ for a half accumulator). Callers keep K·acc_u < 1, where γ_K
// exists.
inline ::testing::AssertionResult matmul_within_bound(std::int64_t K, const std::vector<double>& abs_sum, const Tensor& y,
                                                      const Tensor& yr, double input_rel, double out_u,
                                                      double acc_u = kU32, double abs_err = 0) {
    if (y.shape() != yr.shape() || static_cast<std::size_t>(y.numel()) != abs_sum.size())
        return ::testing::AssertionFailure() << "result, oracle and operands disagree on the shape";
    const std::int64_t N = y.shape().back();
    for (std::int64_t i = 0; i < y.numel(); ++i) {
        const double want = yr.at(i), got = y.at(i);
        const double bound = (input_rel + gamma(K, acc_u)) * abs_sum[static_cast<std::size_t>(i)] + out_u * std::fabs(want) + abs_err;
        if (!(std::fabs(got - want) <= bound))
            return ::testing::AssertionFailure() << "t=" << i / N << " n=" << i % N << " of " << y.numel() / N << "x" << N
                                                 << ", K=" << K << ": |" << got << " − " << want << "| > " << bound;
    }
    return ::testing::AssertionSuccess();
}

// The same for x [T, K], w [N, K].
inline ::testing::AssertionResult matmul_within_bound(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& yr,
                                                      double input_rel, double out_u, double acc_u = kU32,
                                                      double abs_err = 0) {
    return matmul_within_bound(x.shape()[1], abs_products(x, w), y, yr, input_rel, out_u, acc_u, abs_err);
}

}  // namespace kvasir::test
