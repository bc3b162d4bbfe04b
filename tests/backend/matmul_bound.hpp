// The forward error bound every matmul test checks against the f64 oracle
// (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1): a dot
// product of length K summed in f32 in any order differs from the exact one
// by at most γ_K(u)·Σ|x·w|, γ_K(u) = K·u / (1 − K·u), u = 2⁻²⁴; plus the
// final rounding of the result and, for narrower storage, the rounding of the
// inputs. Shared by the cpu, OpenCL and GPU backend tests.
#pragma once

#include "kvasir/core/tensor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace kvasir::test {

constexpr double kU32 = 1.0 / (1 << 24);

inline double gamma(std::int64_t k, double u) { return static_cast<double>(k) * u / (1.0 - static_cast<double>(k) * u); }

// For x [T, K], w [N, K], result y and oracle yr [T, N], every element:
//   |y − yr| ≤ (input_rel + γ_K(u32))·Σ_k |x·w| + out_u·|yr|
// input_rel: relative error of the inputs as the node holds them (2u_s + u_s²
// for storage format u_s; 0 for f32), out_u: rounding of the stored result.
inline ::testing::AssertionResult matmul_within_bound(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& yr,
                                                      double input_rel, double out_u) {
    if (y.shape() != yr.shape()) return ::testing::AssertionFailure() << "result and oracle shapes differ";
    const std::int64_t T = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t n = 0; n < N; ++n) {
            double abs_sum = 0;
            for (std::int64_t k = 0; k < K; ++k) abs_sum += std::fabs(x.at(t * K + k) * w.at(n * K + k));
            const double want = yr.at(t * N + n), got = y.at(t * N + n);
            const double bound = (input_rel + gamma(K, kU32)) * abs_sum + out_u * std::fabs(want);
            if (!(std::fabs(got - want) <= bound))
                return ::testing::AssertionFailure() << "t=" << t << " n=" << n << " T=" << T << " N=" << N << " K=" << K
                                                     << ": |" << got << " − " << want << "| > " << bound;
        }
    return ::testing::AssertionSuccess();
}

}  // namespace kvasir::test
