#include "kvasir/metrics/error_bound.hpp"

#include "kvasir/core/error.hpp"

#include <algorithm>
#include <cmath>
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
