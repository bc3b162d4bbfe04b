#include "kvasir/backend/router_perturbed.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"

#include <fmt/format.h>

#include <cmath>
#include <utility>

namespace kvasir {

RouterPerturbedBackend::RouterPerturbedBackend(std::unique_ptr<Backend> inner, double eps, std::uint64_t seed,
                                               std::int64_t moe_layers)
    : detail::OwnedInner{std::move(inner)},
      ForwardingBackend(*OwnedInner::inner),
      eps_(eps),
      seed_(seed),
      moe_layers_(moe_layers),
      caps_(OwnedInner::inner->capabilities()) {
    KVASIR_CHECK(std::isfinite(eps) && eps >= 0, ErrorCode::bad_input, "--perturb-router must be ≥ 0, got {}", eps);
    KVASIR_CHECK(moe_layers >= 1, ErrorCode::bad_input, "--perturb-router needs a model with MoE layers");
    caps_.extra.emplace_back("perturb_router", fmt::format("{}", eps));
}

RouterOutput RouterPerturbedBackend::route(const TensorView& logits, const RouterParams& params) {
    // Noise in f64, then rounded once to the dtype the backend produced its
    // logits in: the inner router sees a tensor it could have produced itself.
    const std::int64_t layer = calls_++ % moe_layers_;
    const Tensor noise = seeded_uniform(seed_, fmt::format("decide/perturb-router/{}", layer), logits.shape, -eps_, eps_, DType::f64, 1);
    Tensor noisy(logits.dtype, logits.shape);
    for (std::int64_t i = 0; i < logits.numel(); ++i) noisy.set(i, logits.at(i) + noise.at(i));
    return ForwardingBackend::route(noisy, params);
}

}  // namespace kvasir
