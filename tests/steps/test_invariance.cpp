// Batched forward passes (forward_batch: several sequences stacked along the
// rows, attention and linear-attention state per sequence) and the nodes the
// invariance step tells apart:
//   * identity: on a batch-invariant node every sequence of a batch gets
//     exactly the bits forward() gives it alone — on every fixture family,
//     the hybrid ones (Gated DeltaNet state per sequence) included, and on
//     the oracle, the f32 cpu and the OpenCL node (PoCL);
//   * cpu:split_k=shape is batch-variant by construction (split-K below 64
//     rows): its batched bits differ, yet each result stays an f32 matmul
//     within the f32 error bound of the oracle's;
//   * the Decoder over a KV cache reproduces the prefill's bits on cpu-ref.
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/metrics/metrics.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/forward.hpp"
#include "kvasir/steps/protocol_steps.hpp"  // same_bits

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

const fs::path kModels = fs::path(KVASIR_SOURCE_DIR) / "fixtures" / "models";

std::vector<std::int32_t> seq(std::int64_t n, std::int32_t start, std::int64_t vocab) {
    std::vector<std::int32_t> ids;
    for (std::int64_t i = 0; i < n; ++i) ids.push_back(static_cast<std::int32_t>((start + 37 * i) % vocab));
    return ids;
}

bool same_bits(const Tensor& a, const Tensor& b) { return kvasir::same_bits(a.view(), b.view()); }

struct Case {
    std::string fixture, node;
};

class BatchIdentity : public ::testing::TestWithParam<Case> {};

TEST_P(BatchIdentity, EverySequenceOfABatchGetsItsAloneBits) {
    const Model m = Model::open((kModels / GetParam().fixture).string());
    const std::int64_t v = m.config().vocab_size;
    auto node = create_backend(GetParam().node);
    // Lengths 1, 5, 9 and 12: a lone token, sequences shorter and longer
    // than the conv kernel, different positions of the same ids.
    const std::vector<std::vector<std::int32_t>> seqs{seq(9, 3, v), seq(1, 11, v), seq(12, 3, v), seq(5, 40, v)};
    const std::vector<Tensor> batched = forward_batch(*node, m, seqs);
    ASSERT_EQ(batched.size(), seqs.size());
    ForwardOptions opt;
    opt.keep_hidden = false;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
        const Tensor alone = forward(*node, m, seqs[i], opt).logits;
        EXPECT_TRUE(same_bits(alone, batched[i])) << GetParam().fixture << " " << GetParam().node << " sequence " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, BatchIdentity,
    ::testing::Values(Case{"qwen3_moe_tiny", "cpu-ref"}, Case{"qwen3_moe_tiny", "cpu"}, Case{"qwen3_moe_tiny", "opencl:0"},
                      Case{"qwen2_moe_tiny", "cpu"}, Case{"mixtral_tiny", "cpu"}, Case{"qwen3_5_moe_tiny", "cpu-ref"},
                      Case{"qwen3_5_moe_tiny", "cpu"}, Case{"qwen3_next_tiny", "cpu"},
                      // Sliding windows (per-row views of the cache) inside a batch, and the dense hybrid.
                      Case{"mistral_tiny", "cpu"}, Case{"qwen2_tiny", "opencl:0"}, Case{"qwen3_5_tiny", "cpu"},
                      // MLA (its expanded per-head cache, zero-padded values) and the grouped sigmoid router.
                      Case{"deepseek_v3_tiny", "cpu"}, Case{"kimi_k2_tiny", "opencl:0"}, Case{"glm4_moe_tiny", "cpu"}),
    [](const ::testing::TestParamInfo<Case>& info) {
        std::string n = info.param.fixture + "_" + info.param.node;
        for (char& c : n)
            if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
        return n;
    });

TEST(BatchVariance, SplitKByShapeChangesBitsButStaysWithinTheF32Bound) {
    const Model m = Model::open((kModels / "qwen3_moe_tiny").string());
    const std::int64_t v = m.config().vocab_size;
    auto split = create_backend("cpu:split_k=shape");
    auto oracle = create_backend("cpu-ref");
    EXPECT_EQ(split->capabilities().node, "cpu:split_k=shape");
    const std::vector<std::int32_t> mine = seq(16, 5, v);
    std::vector<std::vector<std::int32_t>> seqs;
    for (int j = 0; j < 8; ++j) seqs.push_back(j == 4 ? mine : seq(16, 100 + j, v));  // 128 rows: one pass
    ForwardOptions opt;
    opt.keep_hidden = false;
    const Tensor alone = forward(*split, m, mine, opt).logits;  // 16 rows: split-K
    const Tensor batched = forward_batch(*split, m, seqs)[4];
    EXPECT_FALSE(same_bits(alone, batched));
    const Tensor exact = forward(*oracle, m, mine, opt).logits;
    for (const Tensor* t : {&alone, &batched}) {
        const CompareStats s = compare(exact.view(), t->view());
        EXPECT_TRUE(finite_parity(s));
        EXPECT_LT(s.max_abs, 1e-4);  // the f32 cpu node measures ~1e-5 on this fixture (protocols/README.md)
    }
}

TEST(BatchVariance, SplitKMatmulMeetsTheF32BoundAndIsRefusedWithReducedPrecision) {
    auto split = create_backend("cpu:split_k=shape");
    auto oracle = create_backend("cpu-ref");
    const Tensor x = seeded_normal(7, "x", {3, 1000}, 0.0, 1.0);
    const Tensor w = seeded_normal(7, "w", {17, 1000}, 0.0, 1.0);
    const Tensor y = split->matmul(x, w), exact = oracle->matmul(x, w);
    // |ŷ − y| ≤ γ_K Σ|x||w| with γ_K = K·u/(1 − K·u): the split sums are
    // still K additions in f32 (chunks of 250, then three more).
    const double u = std::ldexp(1.0, -24), gamma = 1000 * u / (1 - 1000 * u);
    for (std::int64_t t = 0; t < 3; ++t)
        for (std::int64_t n = 0; n < 17; ++n) {
            double bound = 0;
            for (std::int64_t k = 0; k < 1000; ++k) bound += std::fabs(x.at(t * 1000 + k) * w.at(n * 1000 + k));
            EXPECT_LE(std::fabs(y.at(t * 17 + n) - exact.at(t * 17 + n)), gamma * bound) << t << "," << n;
        }
    // A row alone and the same row among 64 (one pass) differ in the last bits.
    const Tensor many = seeded_normal(7, "x", {64, 1000}, 0.0, 1.0);
    const Tensor all = split->matmul(many, w);
    const Tensor first = split->matmul(TensorView{DType::f32, many.raw(), {1, 1000}}, w);
    EXPECT_NE(std::memcmp(first.raw(), all.raw(), first.nbytes()), 0);
    EXPECT_THROW(create_backend("cpu:split_k=shape,acc=f16"), Error);
    EXPECT_THROW(create_backend("cpu:split_k=yes"), Error);
}

TEST(BatchVariance, DecodingFromTheCacheGivesTheOraclePrefillBits) {
    for (const char* fixture : {"qwen3_moe_tiny", "qwen3_5_moe_tiny"}) {
        const Model m = Model::open((kModels / fixture).string());
        auto oracle = create_backend("cpu-ref");
        const std::vector<std::int32_t> ids = seq(10, 2, m.config().vocab_size);
        ForwardOptions opt;
        opt.keep_hidden = false;
        const Tensor prefill = forward(*oracle, m, ids, opt).logits;
        Decoder dec(*oracle, m);
        const std::size_t row = prefill.nbytes() / ids.size();
        for (std::size_t t = 0; t < ids.size(); ++t) {
            const Tensor lg = dec.step(std::span<const std::int32_t>(&ids[t], 1));
            EXPECT_EQ(std::memcmp(lg.raw(), static_cast<const std::byte*>(prefill.raw()) + t * row, row), 0)
                << fixture << " position " << t;
        }
    }
}

TEST(ForwardBatch, RefusesNoSequencesAndTokensOutsideTheVocabulary) {
    const Model m = Model::open((kModels / "qwen3_moe_tiny").string());
    auto node = create_backend("cpu");
    EXPECT_THROW(forward_batch(*node, m, std::vector<std::vector<std::int32_t>>{}), Error);
    const std::vector<std::vector<std::int32_t>> bad{{1, 2}, {static_cast<std::int32_t>(m.config().vocab_size)}};
    EXPECT_THROW(forward_batch(*node, m, bad), Error);
}

}  // namespace
