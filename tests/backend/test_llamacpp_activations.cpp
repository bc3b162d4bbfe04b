// cpu:qdot=llamacpp (backend/llamacpp_activations.hpp): llama.cpp's activation
// formats on hand-checked blocks, the weight-origin lookup, and the variant's
// matmul = the plain cpu matmul of the converted activations, bit for bit.
// tests/cli/test_llamacpp_node.sh checks the variant against llama.cpp itself.
#include "kvasir/backend/cpu_backends.hpp"
#include "kvasir/backend/llamacpp_activations.hpp"
#include "kvasir/core/dtype.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

namespace kvasir {
namespace {

Tensor row(std::vector<float> v) {
    Tensor t(DType::f32, {1, static_cast<std::int64_t>(v.size())});
    std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
    return t;
}

TEST(LlamaCppActivations, Q8_0BlocksOf32) {
    // Block 0: x_j = (j − 16)/16, amax = 1 → d = f16(1/127), q = round-half-even(127·x).
    // Block 1: all zero → zero.
    std::vector<float> v(64, 0.0f);
    for (int j = 0; j < 32; ++j) v[j] = static_cast<float>(j - 16) / 16.0f;
    const Tensor out = llamacpp_activations(row(v).view(), WeightOrigin::blocks_q8_0);
    const float d = f16_bits_to_f32(f32_to_f16_bits(1.0f / 127.0f));
    std::set<long> levels;
    for (int j = 0; j < 32; ++j) {
        const float q = std::nearbyint(v[j] * 127.0f);
        EXPECT_EQ(out.as<float>()[j], d * q) << j;
        levels.insert(std::lround(out.as<float>()[j] / d));
    }
    EXPECT_EQ(*levels.begin(), -127);  // x_0 = −1 = −amax
    EXPECT_EQ(out.as<float>()[16], 0.0f);
    // 0.5 · 127 = 63.5 → 64 (ties to even), not 63.
    EXPECT_EQ(out.as<float>()[24], d * 64.0f);
    for (int j = 32; j < 64; ++j) EXPECT_EQ(out.as<float>()[j], 0.0f);
}

TEST(LlamaCppActivations, Q8_KBlocksOf256SignedMaximum) {
    // The value of largest magnitude is −2 (first): iscale = −127/−2 = 63.5, d = 1/iscale.
    std::vector<float> v(256, 0.25f);
    v[3] = -2.0f;
    v[7] = 2.0f;  // same magnitude, later: the first one sets the sign
    const Tensor out = llamacpp_activations(row(v).view(), WeightOrigin::superblocks_q8_k);
    const float iscale = -127.f / -2.0f, d = 1 / iscale;
    EXPECT_EQ(out.as<float>()[3], d * -127.0f);
    EXPECT_EQ(out.as<float>()[7], d * 127.0f);
    EXPECT_EQ(out.as<float>()[0], d * std::nearbyint(iscale * 0.25f));  // 15.875 → 16
    EXPECT_FLOAT_EQ(out.as<float>()[3], -2.0f);
    // K not a multiple of the block: an internal error (a weight row always is one).
    EXPECT_THROW((void)llamacpp_activations(row(std::vector<float>(100, 1.0f)).view(), WeightOrigin::superblocks_q8_k), Error);
}

TEST(LlamaCppActivations, F16AndBf16RoundedNoneUnchanged) {
    const std::vector<float> v{1.0f + 1.0f / 4096, 3.14159265f, -1e-8f, 65504.0f};
    const Tensor h = llamacpp_activations(row(v).view(), WeightOrigin::f16);
    const Tensor b = llamacpp_activations(row(v).view(), WeightOrigin::bf16);
    const Tensor n = llamacpp_activations(row(v).view(), WeightOrigin::none);
    for (std::size_t i = 0; i < v.size(); ++i) {
        EXPECT_EQ(h.as<float>()[i], f16_bits_to_f32(f32_to_f16_bits(v[i])));
        EXPECT_EQ(b.as<float>()[i], bf16_bits_to_f32(f32_to_bf16_bits(v[i])));
        EXPECT_EQ(n.as<float>()[i], v[i]);
    }
    EXPECT_EQ(h.as<float>()[0], 1.0f);  // 1 + 2^-12 is a tie below f16's 2^-10 step: to even
}

TEST(LlamaCppActivations, OriginOfAWeightAndTheVariantsMatmul) {
    const Tensor x = seeded_normal(7, "x", {5, 64}, 0.0, 1.0, DType::f32, 1);
    Tensor w = seeded_normal(7, "w", {8, 64}, 0.0, 0.125, DType::f32, 1);
    EXPECT_EQ(weight_origin_of(w.view()), WeightOrigin::none);  // heap memory: never registered
    const Tensor wh = Tensor::convert(w.view(), DType::f16);
    EXPECT_EQ(weight_origin_of(wh.view()), WeightOrigin::f16);
    const ImmutableRegistration reg(w.raw(), w.nbytes(), WeightOrigin::blocks_q8_0);
    EXPECT_EQ(weight_origin_of(w.view()), WeightOrigin::blocks_q8_0);
    auto qdot = make_cpu_backend(BackendSpec::parse("cpu:qdot=llamacpp,threads=1"));
    auto cpu = make_cpu_backend(BackendSpec::parse("cpu:threads=1"));
    EXPECT_EQ(qdot->capabilities().node, "cpu:qdot=llamacpp,threads=1");
    const Tensor a = qdot->matmul(x.view(), w.view());
    const Tensor b = cpu->matmul(llamacpp_activations(x.view(), WeightOrigin::blocks_q8_0).view(), w.view());
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    const Tensor c = cpu->matmul(x.view(), w.view());
    EXPECT_NE(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);  // the quantisation is visible
    // Not with other precision variants: one line, bad input.
    EXPECT_THROW((void)make_cpu_backend(BackendSpec::parse("cpu:qdot=llamacpp,acc=f16")), Error);
    EXPECT_THROW((void)make_cpu_backend(BackendSpec::parse("cpu:qdot=ggml")), Error);
}

}  // namespace
}  // namespace kvasir
