// Device-resident weights on the OpenCL node, run for real (PoCL in CI): the
// cache (backend/weight_cache.hpp) changes no bit of any result, a repeated
// weight uploads nothing, a tiny budget evicts least-recently-used and still
// gives the same bits, an oversized weight bypasses it, and an activation
// freed and reallocated at the same address — or a checkpoint unmapped and
// another mapped at the same address — is never served stale.
//
// Weights live where a model's do: in a read-only mapping of a file
// (MappedFile), written here with seeded values.
#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/rng.hpp"
#include "kvasir/model/mapped_file.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../common/ci_skip.hpp"
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace kvasir;
namespace fs = std::filesystem;

namespace {

std::string opencl_absent_reason() {
    for (const BackendStatus& s : list_backends())
        if (s.name == "opencl") return s.available ? std::string() : s.reason;
    return "opencl is not registered";
}

class OpenclResidency : public ::testing::Test {
protected:
    void SetUp() override {
        const std::string why = opencl_absent_reason();
        if (!why.empty()) KVASIR_SKIP_OR_FAIL_IN_CI("no OpenCL device (setup installs PoCL): " << why);
    }
};

fs::path temp_file(const std::string& stem) {
    static int counter = 0;
    return fs::temp_directory_path() / fmt::format("kvasir_residency_{}_{}_{}.bin", ::getpid(), counter++, stem);
}

// Tensors written to one file (64-byte aligned each) and mapped read-only:
// views into the mapping, like a checkpoint's.
class MappedWeights {
public:
    MappedWeights(const std::vector<std::pair<std::string, Tensor>>& tensors) : path_(temp_file("weights")) {
        std::ofstream out(path_, std::ios::binary);
        std::vector<std::size_t> offsets;
        std::size_t at = 0;
        for (const auto& [name, t] : tensors) {
            at = (at + 63) / 64 * 64;
            offsets.push_back(at);
            out.seekp(static_cast<std::streamoff>(at));
            out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
            at += t.nbytes();
        }
        out.close();
        map_ = std::make_unique<MappedFile>(path_.string());
        for (std::size_t i = 0; i < tensors.size(); ++i)
            views_[tensors[i].first] =
                TensorView{tensors[i].second.dtype(), map_->data() + offsets[i], tensors[i].second.shape()};
    }
    ~MappedWeights() {
        map_.reset();
        std::error_code ec;
        fs::remove(path_, ec);
    }
    const TensorView& operator[](const std::string& name) const { return views_.at(name); }
    const void* base() const { return map_->data(); }

private:
    fs::path path_;
    std::unique_ptr<MappedFile> map_;
    std::map<std::string, TensorView> views_;
};

constexpr std::uint64_t kSeed = 4242;

Tensor normal(const char* name, Shape shape, DType dtype, double sd = 1.0) {
    Tensor t = seeded_normal(kSeed, name, std::move(shape), 0, sd);
    return dtype == DType::f32 ? t : Tensor::convert(t, dtype);
}

bool same_bits(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every op of the backend contract, the weights taken from `w`; results in
// call order.
struct OpInputs {
    Tensor x, gate, up, scores, heads, conv_x, q, k, v, a, b;
    RoutingPlan plan;
    OpInputs()
        : x(normal("x", {5, 64}, DType::f32)),
          gate(normal("gate", {5, 96}, DType::f32)),
          up(normal("up", {5, 96}, DType::f32)),
          scores(normal("scores", {5, 40}, DType::f32, 3)),
          heads(normal("heads", {5, 4, 16}, DType::f32)),
          conv_x(normal("conv_x", {5, 48}, DType::f32)),
          q(normal("q", {5, 2, 16}, DType::f32)),
          k(normal("k", {5, 2, 16}, DType::f32)),
          v(normal("v", {5, 4, 8}, DType::f32)),
          a(normal("a", {5, 4}, DType::f32)),
          b(normal("b", {5, 4}, DType::f32)) {
        plan.ids = Tensor(DType::i32, {5, 2});
        plan.weights = Tensor(DType::f32, {5, 2});
        for (std::int64_t t = 0; t < 5; ++t) {
            plan.ids.set(2 * t, static_cast<double>(t % 3));
            plan.ids.set(2 * t + 1, 3);
            plan.weights.set(2 * t, 0.625);
            plan.weights.set(2 * t + 1, 0.375);
        }
    }
};

std::vector<std::pair<std::string, Tensor>> weight_tensors(DType dtype) {
    std::vector<std::pair<std::string, Tensor>> out{
        {"w", normal("w", {72, 64}, dtype, 0.1)},
        {"norm", normal("norm", {64}, dtype)},
        {"conv", normal("conv", {48, 4}, dtype)},
        {"a_log", normal("a_log", {4}, dtype, 0.5)},
        {"dt_bias", normal("dt_bias", {4}, dtype, 0.5)},
    };
    for (int e = 0; e < 4; ++e) {
        out.emplace_back(fmt::format("gate{}", e), normal(fmt::format("gate{}", e).c_str(), {96, 64}, dtype, 0.1));
        out.emplace_back(fmt::format("up{}", e), normal(fmt::format("up{}", e).c_str(), {96, 64}, dtype, 0.1));
        out.emplace_back(fmt::format("down{}", e), normal(fmt::format("down{}", e).c_str(), {64, 96}, dtype, 0.1));
    }
    return out;
}

std::vector<Tensor> run_ops(Backend& n, const OpInputs& in, const MappedWeights& w) {
    std::vector<Tensor> out;
    out.push_back(n.matmul(in.x, w["w"]));
    out.push_back(n.swiglu(in.gate, in.up));
    out.push_back(n.softmax(in.scores));
    out.push_back(n.sigmoid(in.scores));
    out.push_back(n.rmsnorm(in.x, w["norm"], 1e-6));
    const std::int64_t pos[] = {3, 4, 5, 6, 7};
    out.push_back(n.rope(in.heads, pos, RopeParams{}));
    out.push_back(n.causal_conv1d_silu(in.conv_x, w["conv"], nullptr));
    GatedDeltaInputs gd{in.q, in.k, in.v, in.a, in.b, w["a_log"], w["dt_bias"], nullptr};
    GatedDeltaResult r = n.gated_delta_rule(gd);
    out.push_back(std::move(r.out));
    out.push_back(std::move(r.state));
    std::vector<ExpertWeights> experts;
    for (int e = 0; e < 4; ++e)
        experts.push_back({w[fmt::format("gate{}", e)], w[fmt::format("up{}", e)], w[fmt::format("down{}", e)]});
    out.push_back(n.moe_block(in.x, experts, in.plan));
    return out;
}

std::string with(const std::string& base, const std::string& options) {
    return options.empty() ? base : base + (base.find('=') == std::string::npos ? ":" : ",") + options;
}

WeightCacheStats stats_of(const Backend& n) {
    const auto s = n.weight_cache_stats();
    EXPECT_TRUE(s.has_value()) << n.capabilities().node;
    return s.value_or(WeightCacheStats{});
}

}  // namespace

TEST_F(OpenclResidency, CacheOnAndOffGiveTheSameBitsOnEveryOpAndStorage) {
    const OpInputs in;
    for (const DType file_dtype : {DType::f32, DType::bf16}) {
        const MappedWeights w(weight_tensors(file_dtype));
        for (const std::string storage : {"", "storage=f16", "storage=bf16"}) {
            SCOPED_TRACE(fmt::format("weights {}, {}", dtype_name(file_dtype), storage.empty() ? "storage=f32" : storage));
            auto on = create_backend(with("opencl:0", storage));
            auto off = create_backend(with("opencl:0:weight_cache=0", storage));
            const std::vector<Tensor> want = run_ops(*off, in, w);
            const std::vector<Tensor> first = run_ops(*on, in, w);
            const WeightCacheStats s1 = stats_of(*on);
            const std::vector<Tensor> second = run_ops(*on, in, w);  // every weight resident now
            const WeightCacheStats s2 = stats_of(*on);
            ASSERT_EQ(want.size(), first.size());
            for (std::size_t i = 0; i < want.size(); ++i) {
                EXPECT_TRUE(same_bits(want[i], first[i])) << "result " << i << ", first call";
                EXPECT_TRUE(same_bits(want[i], second[i])) << "result " << i << ", resident weights";
            }
            // 1 matmul + norm + conv + A_log + dt_bias + 12 expert matrices.
            EXPECT_EQ(s1.misses, 17u);
            EXPECT_EQ(s1.hits, 0u);
            EXPECT_EQ(s2.misses, 17u);
            EXPECT_EQ(s2.hits, 17u);
            EXPECT_EQ(s2.bytes_uploaded, s1.bytes_uploaded);
            EXPECT_EQ(s2.evictions, 0u);
            const WeightCacheStats so = stats_of(*off);
            EXPECT_EQ(so.budget_bytes, 0u);
            EXPECT_EQ(so.hits + so.misses + so.resident_entries, 0u);
            EXPECT_EQ(so.uncacheable, 17u);
        }
    }
}

TEST_F(OpenclResidency, SecondCallWithTheSameWeightIsAHitAndUploadsNoBytes) {
    const MappedWeights w({{"w", normal("w", {128, 64}, DType::bf16)}});
    const OpInputs in;
    auto n = create_backend("opencl:0");
    const Tensor first = n->matmul(in.x, w["w"]);
    const WeightCacheStats s1 = stats_of(*n);
    EXPECT_EQ(s1.misses, 1u);
    // As the device holds it for matmul: bf16 panels (the kernel widens them, exactly).
    EXPECT_EQ(s1.bytes_uploaded, 128u * 64 * 2);
    EXPECT_EQ(s1.resident_bytes, 128u * 64 * 2);
    const Tensor second = n->matmul(in.x, w["w"]);
    const WeightCacheStats s2 = stats_of(*n);
    EXPECT_EQ(s2.hits, 1u);
    EXPECT_EQ(s2.misses, 1u);
    EXPECT_EQ(s2.bytes_uploaded, s1.bytes_uploaded);
    EXPECT_TRUE(same_bits(first, second));
    // What the node advertises.
    std::string described;
    for (const auto& [k, v] : n->capabilities().extra)
        if (k == "weight_cache") described = v;
    EXPECT_NE(described.find("CL_DEVICE_GLOBAL_MEM_SIZE"), std::string::npos) << described;
    EXPECT_GT(s1.budget_bytes, 0u);
}

TEST_F(OpenclResidency, TinyBudgetEvictsTheLeastRecentlyUsedAndResultsStayIdentical) {
    // Five 256 KiB weights (as f32 on the device) under a 1 MiB budget: four fit.
    // An entry is evicted once cold (not asked for within as many gets as the
    // cache has seen weights); while every resident one is warm, a newcomer is
    // declined (uploaded for the call) — weight_cache.cpp, scan resistance.
    std::vector<std::pair<std::string, Tensor>> t;
    for (const char* name : {"A", "B", "C", "D", "E"}) t.emplace_back(name, normal(name, {1024, 64}, DType::f32, 0.1));
    const MappedWeights w(t);
    const OpInputs in;
    auto on = create_backend("opencl:0:weight_cache=1");
    auto off = create_backend("opencl:0:weight_cache=0");
    EXPECT_EQ(on->capabilities().node, "opencl:0:weight_cache=1");
    const auto check = [&](const char* name) {
        EXPECT_TRUE(same_bits(on->matmul(in.x, w[name]), off->matmul(in.x, w[name]))) << name;
    };
    for (const char* name : {"A", "B", "C", "D"}) check(name);
    EXPECT_EQ(stats_of(*on).evictions, 0u);
    EXPECT_EQ(stats_of(*on).resident_bytes, 1u << 20);
    for (int pass = 0; pass < 2; ++pass)
        for (const char* name : {"A", "C", "D"}) check(name);  // B goes cold: the least recent
    check("E");  // evicts B
    WeightCacheStats s = stats_of(*on);
    EXPECT_EQ(s.evictions, 1u);
    EXPECT_EQ(s.hits, 6u);
    EXPECT_EQ(s.misses, 5u);
    for (const char* name : {"A", "C", "D", "E"}) check(name);
    s = stats_of(*on);
    EXPECT_EQ(s.hits, 10u);  // all four resident
    EXPECT_EQ(s.misses, 5u);
    check("B");  // the evicted one: every resident weight is warm, so B is uploaded for the call only
    s = stats_of(*on);
    EXPECT_EQ(s.misses, 5u);
    EXPECT_EQ(s.declined, 1u);
    EXPECT_EQ(s.evictions, 1u);
    EXPECT_LE(s.resident_bytes, s.budget_bytes);
}

TEST_F(OpenclResidency, AWeightLargerThanTheBudgetBypassesTheCache) {
    const MappedWeights w({{"big", normal("big", {4096, 64}, DType::f32, 0.1)},  // 1 MiB + ... as f32: 1 MiB exactly
                           {"huge", normal("huge", {8192, 64}, DType::f32, 0.1)}});  // 2 MiB
    const OpInputs in;
    auto on = create_backend("opencl:0:weight_cache=1");
    auto off = create_backend("opencl:0:weight_cache=0");
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(on->matmul(in.x, w["huge"]), off->matmul(in.x, w["huge"])));
    WeightCacheStats s = stats_of(*on);
    EXPECT_EQ(s.oversized, 2u);
    EXPECT_EQ(s.hits + s.misses + s.resident_entries, 0u);
    EXPECT_EQ(s.bytes_uploaded, 2u * (8192 * 64 * 4));
    // Exactly the budget still fits.
    EXPECT_TRUE(same_bits(on->matmul(in.x, w["big"]), off->matmul(in.x, w["big"])));
    EXPECT_EQ(stats_of(*on).misses, 1u);
}

// The hazard of an address-keyed cache, written out: a heap buffer passed as
// matmul's second operand, freed, and a new buffer of the same shape with
// other contents allocated at the same address.
TEST_F(OpenclResidency, AnActivationFreedAndReallocatedAtTheSameAddressIsNeverServedStale) {
    const OpInputs in;
    auto on = create_backend("opencl:0");
    auto off = create_backend("opencl:0:weight_cache=0");
    const Shape shape{72, 64};
    const Tensor contents2 = normal("act2", shape, DType::f32);  // made first: no allocation in between below
    auto first = std::make_unique<Tensor>(normal("act1", shape, DType::f32));
    const void* address = first->raw();
    const Tensor y1 = on->matmul(in.x, *first);
    first.reset();
    // The allocator hands the freed block back to the next request of its
    // size; try a few times to make the collision happen, and say whether it did.
    std::vector<std::unique_ptr<Tensor>> tries;
    std::unique_ptr<Tensor> second;
    for (int i = 0; i < 8 && !second; ++i) {
        auto t = std::make_unique<Tensor>(DType::f32, shape);
        if (t->raw() == address) second = std::move(t);
        else tries.push_back(std::move(t));
    }
    const bool collided = second != nullptr;
    if (!second) second = std::move(tries.back());
    std::memcpy(second->raw(), contents2.raw(), contents2.nbytes());
    const Tensor y2 = on->matmul(in.x, *second);
    EXPECT_TRUE(same_bits(y2, off->matmul(in.x, *second)));
    EXPECT_FALSE(same_bits(y1, y2));
    const WeightCacheStats s = stats_of(*on);
    EXPECT_EQ(s.hits + s.misses, 0u);  // heap memory is never looked up
    EXPECT_EQ(s.uncacheable, 2u);
    std::cout << "[ note ] reallocation at the same address: " << (collided ? "yes" : "no (allocator chose another)") << "\n";
}

// The same hazard for a checkpoint: a mapping released and a file of other
// contents mapped again (often at the same address) is a new registration.
TEST_F(OpenclResidency, ARemappedCheckpointIsNeverServedStale) {
    const OpInputs in;
    auto on = create_backend("opencl:0");
    auto off = create_backend("opencl:0:weight_cache=0");
    Tensor y1;
    const void* base = nullptr;
    {
        const MappedWeights w({{"w", normal("w1", {72, 64}, DType::f32)}});
        base = w.base();
        y1 = on->matmul(in.x, w["w"]);
        EXPECT_TRUE(same_bits(y1, on->matmul(in.x, w["w"])));  // a hit
    }
    const MappedWeights w2({{"w", normal("w2", {72, 64}, DType::f32)}});
    const Tensor y2 = on->matmul(in.x, w2["w"]);
    EXPECT_TRUE(same_bits(y2, off->matmul(in.x, w2["w"])));
    EXPECT_FALSE(same_bits(y1, y2));
    const WeightCacheStats s = stats_of(*on);
    EXPECT_EQ(s.misses, 2u);
    EXPECT_EQ(s.hits, 1u);
    std::cout << "[ note ] second mapping at the same address: " << (w2.base() == base ? "yes" : "no") << "\n";
}

TEST_F(OpenclResidency, BadWeightCacheOptionIsBadInput) {
    for (const char* spec : {"opencl:0:weight_cache=-1", "opencl:0:weight_cache=1.5", "opencl:0:weight_cache=lots"}) {
        try {
            create_backend(spec);
            ADD_FAILURE() << spec << " accepted";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << spec;
            EXPECT_NE(std::string(e.what()).find("weight_cache"), std::string::npos) << e.what();
        }
    }
}
