// The check every device node's MoE experts answer to (opencl and cuda/hip
// run a block's experts on device buffers: Backend::expert_ffns overridden,
// issue #38). One body for both test files.
#pragma once

#include "kvasir/backend/registry.hpp"
#include "tests/backend/gpu_emulated_node.hpp"  // create_node
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/rng.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kvasir::test {

// E seeded experts (gate and up [I, H], down [H, I]) of dtype wd in one block
// of memory registered as immutable, as a checkpoint's mapping is (so a
// device node keeps them resident); SwiGLU or gpt-oss's clamped one; with or
// without gpt-oss's biases (gate and up [I], down [H], in the same block).
class SeededExperts {
public:
    SeededExperts(std::uint64_t seed, const std::string& tag, std::int64_t E, std::int64_t H, std::int64_t I, DType wd)
        : e_(E), h_(H), i_(I), wd_(wd), bytes_(make_bytes(seed, tag, E, H, I, wd)), reg_(bytes_.data(), bytes_.size()) {}
    std::vector<ExpertWeights> experts(bool clamped, bool biased = false) const {
        const std::size_t es = dtype_size(wd_), matrix = static_cast<std::size_t>(i_ * h_) * es;
        const std::byte* biases = bytes_.data() + 3 * static_cast<std::size_t>(e_) * matrix;  // gate, up [E, I], down [E, H]
        std::vector<ExpertWeights> out;
        for (std::int64_t e = 0; e < e_; ++e) {
            const std::byte* g = bytes_.data() + static_cast<std::size_t>(e) * matrix;
            ExpertWeights ew{TensorView{wd_, g, {i_, h_}}, TensorView{wd_, g + static_cast<std::size_t>(e_) * matrix, {i_, h_}},
                             TensorView{wd_, g + 2 * static_cast<std::size_t>(e_) * matrix, {h_, i_}}};
            if (clamped) ew.activation = {true, 1.702, 7.0};
            if (biased) {
                const auto at = [&](std::int64_t elements) { return biases + static_cast<std::size_t>(elements) * es; };
                ew.gate_bias = TensorView{wd_, at(e * i_), {i_}};
                ew.up_bias = TensorView{wd_, at((e_ + e) * i_), {i_}};
                ew.down_bias = TensorView{wd_, at(2 * e_ * i_ + e * h_), {h_}};
            }
            out.push_back(ew);
        }
        return out;
    }

private:
    static std::vector<std::byte> make_bytes(std::uint64_t seed, const std::string& tag, std::int64_t E, std::int64_t H,
                                             std::int64_t I, DType wd) {
        std::vector<std::byte> bytes;
        const auto append = [&](const std::string& name, std::int64_t n, double sd) {
            const Tensor w = Tensor::convert(seeded_normal(seed, tag + name, {n}, 0, sd), wd);
            bytes.insert(bytes.end(), static_cast<const std::byte*>(w.raw()), static_cast<const std::byte*>(w.raw()) + w.nbytes());
        };
        for (const char* part : {"gate", "up", "down"})
            for (std::int64_t e = 0; e < E; ++e) append(part + std::to_string(e), I * H, 0.1);
        append("gate_bias", E * I, 0.5);
        append("up_bias", E * I, 0.5);
        append("down_bias", E * H, 0.5);
        return bytes;
    }
    std::int64_t e_, h_, i_;
    DType wd_;
    std::vector<std::byte> bytes_;
    ImmutableRegistration reg_;
};

// Each token routed to ONE expert with weight 1 makes a block's output row
// that expert's FFN row itself (the combine adds 1·y to +0 and rounds to
// storage: exact), so the block is checked against the node's own public
// ops per expert — matmul, swiglu or clamped_swiglu, matmul — bit for bit,
// for f32, bf16 and f16 weights (registered as immutable, as a
// checkpoint's mapping), prefill- and decode-sized. The counters: one
// download per block, of the rows (each expert's slice padded to the
// device's alignment: less than 1 KiB an expert), and on resident weights
// one upload and one download per block. `element_bytes(spec)`: what one
// activation element moves as on that node.
//
// With gpt-oss's biases (clamped SwiGLU): each is added with the node's add,
// as linear() adds it; a node that stores f32 adds them on the device (the
// same counters), a narrower one takes the default's host add (its bits are
// checked, not its traffic).
inline void expect_device_experts_match_their_ops(const std::vector<std::string>& specs,
                                                  const std::function<std::uint64_t(const std::string&)>& element_bytes) {
    const std::int64_t E = 5, H = 96, I = 40;
    for (const DType wd : {DType::f32, DType::bf16, DType::f16}) {
        const SeededExperts seeded(31, "ex/", E, H, I, wd);
        for (const auto [clamped, biased] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
            const std::vector<ExpertWeights> experts = seeded.experts(clamped, biased);
            for (const std::string& spec : specs) {
                auto node = create_node(spec);
                const std::string what =
                    spec + " weights " + dtype_name(wd) + (clamped ? " clamped" : "") + (biased ? " biased" : "");
                const bool on_device = !biased || node->capabilities().storage == DType::f32;
                for (const std::int64_t T : {1, 3, 37}) {
                    const Tensor x = seeded_normal(31, "ex/x" + std::to_string(T), {T, H}, 0, 1);
                    RoutingPlan plan{Tensor(DType::i32, {T, 1}), Tensor(DType::f32, {T, 1})};
                    for (std::int64_t t = 0; t < T; ++t) {
                        plan.ids.as<std::int32_t>()[t] = static_cast<std::int32_t>((t * 3) % E);
                        plan.weights.as<float>()[t] = 1.0f;
                    }
                    const TransferStats before = *node->transfer_stats();
                    const Tensor block = node->moe_block(x, experts, plan);
                    const TransferStats moved = *node->transfer_stats() - before;
                    ASSERT_EQ(block.shape(), Shape({T, H}));
                    for (std::int64_t t = 0; t < T; ++t) {
                        const ExpertWeights& ew = experts[static_cast<std::size_t>((t * 3) % E)];
                        const Tensor xt = Tensor::convert(x.view().row(t), DType::f32);
                        const TensorView xr{DType::f32, xt.raw(), {1, H}};
                        const Tensor g = linear(*node, xr, ew.gate, ew.gate_bias), u = linear(*node, xr, ew.up, ew.up_bias);
                        const Tensor a = clamped ? node->clamped_swiglu(g, u, 1.702, 7.0) : node->swiglu(g, u);
                        const Tensor y = linear(*node, a, ew.down, ew.down_bias);
                        ASSERT_EQ(std::memcmp(y.raw(), block.as<float>() + t * H, static_cast<std::size_t>(H) * 4), 0)
                            << what << " T " << T << " row " << t;
                    }
                    if (!on_device) continue;
                    const std::uint64_t rows_bytes = static_cast<std::uint64_t>(T * H) * element_bytes(spec);
                    EXPECT_EQ(moved.downloads, 1u) << what << " T " << T;
                    EXPECT_GE(moved.download_bytes, rows_bytes) << what << " T " << T;
                    EXPECT_LT(moved.download_bytes, rows_bytes + static_cast<std::uint64_t>(E) * 1024) << what << " T " << T;
                }
                // A block of top-2 routing on resident weights: the rows up once, the outputs down once.
                const Tensor x = seeded_normal(31, "ex/x2", {8, H}, 0, 1);
                RoutingPlan plan{Tensor(DType::i32, {8, 2}), seeded_normal(31, "ex/w2", {8, 2}, 0.4, 0.1)};
                for (std::int64_t t = 0; t < 8; ++t)
                    for (std::int64_t j = 0; j < 2; ++j)
                        plan.ids.as<std::int32_t>()[t * 2 + j] = static_cast<std::int32_t>((t + 2 * j) % E);
                const TransferStats before = *node->transfer_stats();
                (void)node->moe_block(x, experts, plan);
                const TransferStats moved = *node->transfer_stats() - before;
                if (on_device) {
                    EXPECT_EQ(moved.uploads, 1u) << what;
                    EXPECT_EQ(moved.downloads, 1u) << what;
                }
                // A down projection whose K is not the experts' width is refused as the default refuses it.
                std::vector<ExpertWeights> bad = experts;
                bad[0].down = TensorView{wd, bad[0].down.data, {H / 2, I + 8}};
                try {
                    (void)node->moe_block(x, bad, plan);
                    ADD_FAILURE() << what << ": a down projection of K " << I + 8 << " was accepted";
                } catch (const Error& e) {
                    EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
                }
            }
        }
    }
}

}  // namespace kvasir::test
