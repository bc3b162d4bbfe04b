#include "kvasir/backend/llamacpp_activations.hpp"

#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvasir {

namespace {

void q8_0_row(float* x, std::int64_t k) {
    for (std::int64_t b = 0; b < k; b += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
        const float d = f16_bits_to_f32(f32_to_f16_bits(amax / 127.f));
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < 32; ++j) {
            const float q = std::nearbyint(x[b + j] * id);  // _mm256_round_ps(_MM_ROUND_NEAREST): ties to even
            x[b + j] = d * q;
        }
    }
}

void q8_k_row(float* x, std::int64_t k) {
    for (std::int64_t b = 0; b < k; b += 256) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; ++j)
            if (const float ax = std::fabs(x[b + j]); ax > amax) {
                amax = ax;
                max = x[b + j];
            }
        if (amax == 0.0f) {
            std::fill(x + b, x + b + 256, 0.0f);
            continue;
        }
        const float iscale = -127.f / max;
        const float d = 1 / iscale;
        // llama.cpp compiles nearest_int(iscale * x) with the product contracted into the adder's FMA
        // (-O3 -march=native, GCC's default -ffp-contract=fast): the exact product is rounded once.
        for (int j = 0; j < 256; ++j)
            x[b + j] = d * static_cast<float>(std::min(127, ggml_nearest_int_of_product(iscale, x[b + j])));
    }
}

}  // namespace

WeightOrigin weight_origin_of(const TensorView& w) {
    if (w.dtype == DType::f16) return WeightOrigin::f16;
    if (w.dtype == DType::bf16) return WeightOrigin::bf16;
    const auto span = find_immutable(w.data, static_cast<std::size_t>(w.numel()) * dtype_size(w.dtype));
    return span ? span->origin : WeightOrigin::none;
}

Tensor llamacpp_activations(const TensorView& x, WeightOrigin origin) {
    Tensor out = Tensor::convert(x, DType::f32);
    const std::int64_t k = x.rank() == 0 ? 1 : x.dim(-1);
    const std::int64_t rows = k == 0 ? 0 : out.numel() / k;
    float* p = out.as<float>();
    switch (origin) {
        case WeightOrigin::none: break;
        case WeightOrigin::f16:
            for (std::int64_t i = 0; i < out.numel(); ++i) p[i] = f16_bits_to_f32(f32_to_f16_bits(p[i]));
            break;
        case WeightOrigin::bf16:
            for (std::int64_t i = 0; i < out.numel(); ++i) p[i] = bf16_bits_to_f32(f32_to_bf16_bits(p[i]));
            break;
        case WeightOrigin::blocks_q8_0:
        case WeightOrigin::superblocks_q8_k: {
            const std::int64_t block = origin == WeightOrigin::blocks_q8_0 ? 32 : 256;
            KVASIR_CHECK(k % block == 0, ErrorCode::internal, "llama.cpp activations: K = {} is not a multiple of {}", k,
                         block);
            for (std::int64_t r = 0; r < rows; ++r) (block == 32 ? q8_0_row : q8_k_row)(p + r * k, k);
            break;
        }
    }
    return out;
}

}  // namespace kvasir
