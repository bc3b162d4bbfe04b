// The checks every device node's resident results answer to (core/tensor.hpp,
// issue #38: inside a DeviceResidency scope an op's result stays on the
// device). One body for the OpenCL tests (PoCL in CI) and the CUDA/HIP ones
// (a GPU when there is one).
#pragma once

#include "kvasir/backend/registry.hpp"
#include "tests/backend/gpu_emulated_node.hpp"  // create_node
#include "tests/backend/device_experts_check.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/rng.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvasir::test {

inline bool same_tensor_bits(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Hand-counted: x [4, 64] goes up once and the weights (immutable, as a
// checkpoint's mapping) once each; y = matmul(x, w), n = rmsnorm(y, g),
// s = add(y, n), m = mul(s, y), z = scale(m, 0.125) run on the device's own
// results — five launches, nothing read back until the host reads z (one
// read of 4·32 elements of `element_bytes(spec)` each); the intermediates
// are never read at all. The bits are those of the same chain outside the
// scope (every result read back after its op). x goes up without a wait:
// the read is the host's one wait for the device.
inline void expect_resident_chain_reads_back_once(const std::vector<std::string>& specs,
                                                  const std::function<std::uint64_t(const std::string&)>& element_bytes) {
    const Tensor x = seeded_normal(29, "r/x", {4, 64}, 0, 1);
    std::vector<float> w(32 * 64), g(32);
    const Tensor ws = seeded_normal(29, "r/w", {32, 64}, 0, 0.1), gs = seeded_normal(29, "r/g", {32}, 1, 0.1);
    std::memcpy(w.data(), ws.raw(), ws.nbytes());
    std::memcpy(g.data(), gs.raw(), gs.nbytes());
    const ImmutableRegistration rw(w.data(), w.size() * sizeof(float)), rg(g.data(), g.size() * sizeof(float));
    const TensorView wv{DType::f32, w.data(), {32, 64}}, gv{DType::f32, g.data(), {32}};
    for (const std::string& spec : specs) {
        SCOPED_TRACE(spec);
        auto be = create_node(spec);
        const auto chain = [&] {
            const Tensor y = be->matmul(x, wv);
            const Tensor n = be->rmsnorm(y, gv, 1e-6);
            const Tensor s = be->add(y, n);
            const Tensor m = be->mul(s, y);
            return be->scale(m, 0.125);
        };
        const Tensor host = chain();  // outside any scope: read back op by op; the weights now resident
        const TransferStats before = *be->transfer_stats();
        Tensor z;
        {
            const DeviceResidency scope;
            z = chain();
            ASSERT_NE(z.device(), nullptr);
            const TransferStats inside = *be->transfer_stats() - before;
            EXPECT_EQ(inside.downloads, 0u) << "a result came back to the host before it was read";
            EXPECT_EQ(inside.uploads, 1u) << "only x goes up (the weights are resident)";
            EXPECT_EQ(inside.launches, 5u);
            EXPECT_EQ(inside.syncs, 0u) << "the host waited for the device before it read anything";
        }
        EXPECT_TRUE(same_tensor_bits(z, host));
        const TransferStats after = *be->transfer_stats() - before;
        EXPECT_EQ(after.downloads, 1u);
        EXPECT_EQ(after.download_bytes, 4u * 32 * element_bytes(spec));
        EXPECT_EQ(after.syncs, 1u) << "the read is the one wait";
    }
}

// Rows r0 … r0+7 of a resident result as the next op's input — a part at an
// offset of 12-byte rows (mostly unaligned) and of 256-byte ones — taken
// where it is: no read back, one upload (w, a heap tensor), the bits of the
// same rows uploaded from the host.
inline void expect_resident_parts_read_in_place(const std::string& spec) {
    auto be = create_node(spec);
    for (const std::int64_t cols : {3, 64}) {
        const Tensor x = seeded_normal(31, "p/x", {40, cols}, 0, 1);
        const Tensor w = seeded_normal(31, "p/w", {cols, cols}, 0, 0.1);
        for (const std::int64_t r0 : {0, 1, 3, 16, 32}) {
            SCOPED_TRACE(fmt::format("cols {} r0 {}", cols, r0));
            const Tensor host_y = be->matmul(x, w);
            const TensorView host_rows{DType::f32, static_cast<const float*>(host_y.raw()) + r0 * cols, {8, cols}};
            const Tensor want = be->matmul(host_rows, w);
            const DeviceResidency scope;
            const Tensor y = be->matmul(x, w);
            const TensorView row = TensorView(y).row(r0);
            const TensorView part{DType::f32, nullptr, {8, cols}, row.device, row.device_offset};
            const TransferStats before = *be->transfer_stats();
            const Tensor got = be->matmul(part, w);
            const TransferStats moved = *be->transfer_stats() - before;
            EXPECT_EQ(moved.uploads, 1u) << "only w (a heap tensor) goes up";
            EXPECT_EQ(moved.downloads, 0u);
            EXPECT_TRUE(same_tensor_bits(got, want));
        }
    }
}

// A device result holds what it needs of its node (queue or stream,
// counters, pool): read after the node is gone, it gives the bits of the
// same op read back at once. Handed to another node (`other`, another
// storage format: not that node's result), it is read on the host and
// uploaded as any host tensor, with the bits that tensor gives there.
inline void expect_results_outlive_their_node(const std::string& spec, const std::string& other) {
    const Tensor x = seeded_normal(47, "o/x", {5, 48}, 0, 1);
    const Tensor w = seeded_normal(47, "o/w", {40, 48}, 0, 0.1);
    Tensor kept, host;
    {
        auto be = create_node(spec);
        host = be->matmul(x, w);
        const DeviceResidency scope;
        kept = be->matmul(x, w);
        ASSERT_NE(kept.device(), nullptr);
        ASSERT_FALSE(kept.device()->fetched());
    }
    EXPECT_TRUE(same_tensor_bits(kept, host));
    auto second = create_node(other);
    const Tensor want = second->softmax(host);
    const DeviceResidency scope;
    auto first = create_node(spec);
    const Tensor resident = first->matmul(x, w);
    EXPECT_TRUE(same_tensor_bits(second->softmax(resident), want));
}

// add / mul / scale of `be` against Backend's host defaults (f64, rounded to
// f32 then storage) on host operands and on resident ones, with values that
// round, overflow (3e38 + 3e38) and cancel exactly (1 + −1 = +0). A node runs
// add on the device only where the default would read its operands exactly
// as they stand there; elsewhere it must fall back and still match.
inline void expect_combine_ops_match_the_defaults(
    const std::vector<std::string>& specs,
    const std::function<std::unique_ptr<Backend>(const std::string&)>& make = [](const std::string& s) {
        return create_node(s);
    }) {
    Tensor a = seeded_normal(37, "e/a", {7, 33}, 0, 3), b = seeded_normal(37, "e/b", {7, 33}, 0, 3);
    a.set(0, 3.0e38);
    b.set(0, 3.0e38);
    a.set(1, 1.0);
    b.set(1, -1.0);
    struct Defaults final : Backend {  // Backend's add/mul/scale, with a node's capabilities
        explicit Defaults(Capabilities c) : caps(std::move(c)) {}
        Capabilities caps;
        const Capabilities& capabilities() const override { return caps; }
        Tensor matmul(const TensorView&, const TensorView&) override { return {}; }
        Tensor swiglu(const TensorView&, const TensorView&) override { return {}; }
        Tensor softmax(const TensorView&) override { return {}; }
        Tensor sigmoid(const TensorView&) override { return {}; }
        Tensor rmsnorm(const TensorView&, const TensorView&, double) override { return {}; }
        Tensor rope(const TensorView&, std::span<const std::int64_t>, const RopeParams&) override { return {}; }
    };
    for (const std::string& spec : specs) {
        SCOPED_TRACE(spec);
        auto be = make(spec);
        Defaults host(be->capabilities());
        const auto in_storage = [&](const Tensor& t) { return Tensor::convert(Tensor::convert(t, host.caps.storage), DType::f32); };
        const Tensor sa = in_storage(a), sb = in_storage(b);
        EXPECT_TRUE(same_tensor_bits(be->mul(a, b), host.mul(a, b)));
        EXPECT_TRUE(same_tensor_bits(be->scale(a, 0.1), host.scale(a, 0.1)));
        EXPECT_TRUE(same_tensor_bits(be->add(a, b), host.add(a, b)));
        EXPECT_TRUE(same_tensor_bits(be->add(sa, sb), host.add(sa, sb)));
        if (!be->transfer_stats()) continue;  // a host node (the emulation) has no device results
        const DeviceResidency scope;
        const Tensor ra = be->scale(sa, 1.0), rb = be->scale(sb, 1.0);  // resident, the bits of sa / sb
        ASSERT_NE(ra.device(), nullptr);
        EXPECT_TRUE(same_tensor_bits(be->add(ra, rb), host.add(sa, sb)));
        EXPECT_TRUE(same_tensor_bits(be->mul(ra, rb), host.mul(sa, sb)));
        EXPECT_TRUE(same_tensor_bits(be->scale(ra, -0.3), host.scale(sa, -0.3)));
    }
}

// copy_columns (also strided), last_rows, join_columns (also with zero
// parts) and repeat_columns (the forward pass's data movement: Gated
// DeltaNet's q | k | v and conv history, gated attention's query | gate, a
// partial rope's parts, a shared expert's gate, MLA's per-head keys)
// give the default's bits (a host copy, Backend's) on the node's own results
// inside a DeviceResidency scope — and, on a device node, stay there: no
// read, no upload, one launch per block moved (a zero fill — last_rows'
// missing history, join_columns' zero parts — counts as one). Outside a scope, on host tensors, the
// default's bits too. Ragged sizes: 5 rows of 37 columns, blocks at odd offsets.
inline void expect_data_movement_matches_the_defaults(
    const std::vector<std::string>& specs,
    const std::function<std::unique_ptr<Backend>(const std::string&)>& make = [](const std::string& s) {
        return create_node(s);
    }) {
    auto host = create_node("cpu-ref");  // Backend's defaults
    const Tensor x = seeded_normal(38, "dm/x", {5, 37}, 0, 2), p = seeded_normal(38, "dm/p", {3, 37}, 0, 2);
    const Tensor one = seeded_normal(38, "dm/one", {2, 37}, 0, 2), g = seeded_normal(38, "dm/g", {5, 1}, 0, 1);
    const Tensor b = seeded_normal(38, "dm/b", {5, 11}, 0, 2);
    for (const std::string& spec : specs) {
        SCOPED_TRACE(spec);
        auto be = make(spec);
        const bool device = be->transfer_stats().has_value();
        // The node's storage format: what its results hold.
        const auto stored = [&](const Tensor& t) {
            return Tensor::convert(Tensor::convert(t, be->capabilities().storage), DType::f32);
        };
        const Tensor sx = stored(x), sp = stored(p), sone = stored(one), sg = stored(g), sb = stored(b);
        const TensorView spv = sp.view();
        EXPECT_TRUE(same_tensor_bits(be->copy_columns(x, 3, 17), host->copy_columns(x, 3, 17)));
        EXPECT_TRUE(same_tensor_bits(be->last_rows(&spv, sone, 3), host->last_rows(&spv, sone, 3)));
        const DeviceResidency scope;
        const Tensor rx = be->scale(sx, 1.0), rp = be->scale(sp, 1.0), rone = be->scale(sone, 1.0), rg = be->scale(sg, 1.0),
                     rb = be->scale(sb, 1.0);  // resident (on a device node), the bits of sx ...
        const TensorView rpv = rp.view();
        struct Case {
            const char* what;
            std::function<Tensor(Backend&, bool)> run;  // bool: the node's own results, or host copies
            std::uint64_t launches;
        };
        const std::vector<Case> cases{
            {"copy_columns 3..20", [&](Backend& n, bool own) { return n.copy_columns(own ? rx : sx, 3, 17); }, 1},
            {"copy_columns all", [&](Backend& n, bool own) { return n.copy_columns(own ? rx : sx, 0, 37); }, 1},
            {"last_rows 3 of prev + 2", [&](Backend& n, bool own) { return n.last_rows(own ? &rpv : &spv, own ? rone : sone, 3); }, 2},
            {"last_rows 3 of prev + 5", [&](Backend& n, bool own) { return n.last_rows(own ? &rpv : &spv, own ? rx : sx, 3); }, 1},
            {"last_rows 3 of zeros + 2", [&](Backend& n, bool own) { return n.last_rows(nullptr, own ? rone : sone, 3); }, 2},
            {"join_columns 37 + 11 + 37",
             [&](Backend& n, bool own) {
                 const TensorView parts[] = {own ? rx.view() : sx.view(), own ? rb.view() : sb.view(), own ? rx.view() : sx.view()};
                 return n.join_columns(parts);
             },
             3},
            {"repeat_columns 1 column 9 times", [&](Backend& n, bool own) { return n.repeat_columns(own ? rg : sg, 9); }, 1},
            {"repeat_columns 11 columns 3 times", [&](Backend& n, bool own) { return n.repeat_columns(own ? rb : sb, 3); }, 1},
            {"copy_columns every 2nd from 1", [&](Backend& n, bool own) { return n.copy_columns(own ? rx : sx, 1, 18, 2); }, 1},
            {"copy_columns every 3rd from 0", [&](Backend& n, bool own) { return n.copy_columns(own ? rx : sx, 0, 13, 3); }, 1},
            {"join_columns 37 + zeros 4 + 11",
             [&](Backend& n, bool own) {
                 const TensorView parts[] = {own ? rx.view() : sx.view(), TensorView{DType::f32, nullptr, {5, 4}},
                                             own ? rb.view() : sb.view()};
                 return n.join_columns(parts);
             },
             3},
        };
        for (const Case& c : cases) {
            const TransferStats before = device ? *be->transfer_stats() : TransferStats{};
            const Tensor got = c.run(*be, true);
            const TransferStats moved = device ? *be->transfer_stats() - before : TransferStats{};
            const Tensor want = c.run(*host, false);
            EXPECT_TRUE(same_tensor_bits(got, want)) << c.what;
            if (!device) continue;
            EXPECT_NE(got.device(), nullptr) << c.what;
            EXPECT_EQ(moved.downloads, 0u) << c.what;
            EXPECT_EQ(moved.uploads, 0u) << c.what;
            EXPECT_EQ(moved.launches, c.launches) << c.what;
        }
    }
}

// A MoE block inside a DeviceResidency scope (gather, experts and combine on
// the device) against the same node's block outside one (the default's
// gather and combine on the host): the same bits for f32 and bf16 weights,
// SwiGLU and the clamped one, T 1/3/37 of top-2 routing with uneven weights
// (a token routed twice to one expert among them), with and without an
// expert filter, on host and on resident input; and nothing read back — one
// upload (the plan's table) besides x when x is on the host.
inline void expect_resident_moe_block_matches_host(
    const std::vector<std::string>& specs,
    const std::function<std::unique_ptr<Backend>(const std::string&)>& make = [](const std::string& s) {
        return create_node(s);
    }) {
    const std::int64_t E = 6, H = 64, I = 24;
    for (const DType wd : {DType::f32, DType::bf16}) {
        const SeededExperts seeded(43, "rm/", E, H, I, wd);
        for (const auto [clamped, biased] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
            const std::vector<ExpertWeights> experts = seeded.experts(clamped, biased);
            const std::vector<bool> filter{true, false, true, true, false, true};
            for (const std::string& spec : specs) {
                auto node = make(spec);
                // Else an emulation (host tensors, no counters), or biases a narrower storage adds on the host.
                const bool device = node->transfer_stats().has_value() && (!biased || node->capabilities().storage == DType::f32);
                const auto stats = [&] { return device ? *node->transfer_stats() : TransferStats{}; };
                for (const std::int64_t T : {1, 3, 37}) {
                    const Tensor x = seeded_normal(43, "rm/x" + std::to_string(T), {T, H}, 0, 1);
                    RoutingPlan plan{Tensor(DType::i32, {T, 2}), seeded_normal(43, "rm/w" + std::to_string(T), {T, 2}, 0.5, 0.2)};
                    for (std::int64_t t = 0; t < T; ++t)
                        for (std::int64_t j = 0; j < 2; ++j)
                            plan.ids.as<std::int32_t>()[t * 2 + j] = static_cast<std::int32_t>(t == 2 ? 4 : (t * 5 + 3 * j) % E);
                    for (const std::vector<bool>* f : {static_cast<const std::vector<bool>*>(nullptr), &filter}) {
                        const std::string what = fmt::format("{} weights {}{}{} T {}{}", spec, dtype_name(wd),
                                                             clamped ? " clamped" : "", biased ? " biased" : "", T,
                                                             f ? " filtered" : "");
                        const Tensor host = node->moe_block(x, experts, plan, f);
                        const DeviceResidency scope;
                        const TransferStats before = stats();
                        const Tensor here = node->moe_block(x, experts, plan, f);
                        const TransferStats moved = stats() - before;
                        EXPECT_TRUE(same_tensor_bits(here, host)) << what;
                        if (!device) continue;
                        EXPECT_NE(here.device(), nullptr) << what;
                        EXPECT_EQ(moved.downloads, 0u) << what;
                        EXPECT_EQ(moved.uploads, 2u) << what << ": x and the plan's table";
                        const Tensor xr = node->scale(x, 1.0);  // x resident (its storage rounding: the block's too)
                        const TransferStats before2 = stats();
                        const Tensor again = node->moe_block(xr, experts, plan, f);
                        EXPECT_EQ((stats() - before2).uploads, 1u) << what << ": the table alone";
                        EXPECT_TRUE(same_tensor_bits(again, host)) << what;
                    }
                }
                // A down projection that does not give the hidden size is refused inside the scope too.
                std::vector<ExpertWeights> bad = experts;
                for (auto& ew : bad) ew.down = TensorView{wd, ew.down.data, {H / 2, I}};
                const Tensor x = seeded_normal(43, "rm/xb", {4, H}, 0, 1);
                RoutingPlan plan{Tensor(DType::i32, {4, 1}), Tensor(DType::f32, {4, 1})};
                for (std::int64_t t = 0; t < 4; ++t) plan.weights.as<float>()[t] = 1.0f;
                const DeviceResidency scope;
                try {
                    (void)node->moe_block(x, bad, plan);
                    ADD_FAILURE() << spec << ": experts giving " << H / 2 << " columns for a hidden size of " << H << " were accepted";
                } catch (const Error& e) {
                    EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
                }
            }
        }
    }
}

// The traffic of two matmuls x [4, 64] · w [32, 64] on a weight in immutable
// memory, hand-counted: the first call uploads x and w, allocates those two
// and the output, launches one kernel and reads 4·32 elements back; the
// weight is then resident, so the second uploads x alone, into the buffer the
// node's pool kept, and writes into another: nothing allocated. `bytes`: one
// element as the node moves it; `waits`: the host waits of a call when the
// node promises their number (uploads that never wait), else 0 for "at least one".
inline void expect_two_matmuls_counted(Backend& node, std::uint64_t bytes, std::uint64_t waits) {
    const Tensor x = seeded_normal(23, "t/x", {4, 64}, 0, 1);
    const Tensor ws = seeded_normal(23, "t/w", {32, 64}, 0, 0.1);
    std::vector<float> w(32 * 64);
    std::memcpy(w.data(), ws.raw(), ws.nbytes());
    const ImmutableRegistration reg(w.data(), w.size() * sizeof(float));
    const TensorView wv{DType::f32, w.data(), {32, 64}};
    const TransferStats zero = *node.transfer_stats();
    EXPECT_EQ(zero.uploads + zero.downloads + zero.launches + zero.allocations + zero.syncs, 0u);
    (void)node.matmul(x, wv);
    const TransferStats first = *node.transfer_stats();
    EXPECT_EQ(first.uploads, 2u);
    EXPECT_EQ(first.upload_bytes, (4u * 64 + 32u * 64) * bytes);
    EXPECT_EQ(first.allocations, 3u);
    EXPECT_EQ(first.launches, 1u);
    EXPECT_EQ(first.downloads, 1u);
    EXPECT_EQ(first.download_bytes, 4u * 32 * bytes);
    if (waits > 0) EXPECT_EQ(first.syncs, waits); else EXPECT_GE(first.syncs, 1u);
    (void)node.matmul(x, wv);
    const TransferStats second = *node.transfer_stats() - first;
    EXPECT_EQ(second.uploads, 1u) << "the resident weight was uploaded again";
    EXPECT_EQ(second.upload_bytes, 4u * 64 * bytes);
    EXPECT_EQ(second.allocations, 0u) << "x and the output did not come from the pool";
    EXPECT_EQ(second.launches, 1u);
    EXPECT_EQ(second.downloads, 1u);
    EXPECT_EQ(second.download_bytes, 4u * 32 * bytes);
    if (waits > 0) EXPECT_EQ(second.syncs, waits);
}

}  // namespace kvasir::test
