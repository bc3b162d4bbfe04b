// The shared weight cache (backend/weight_cache.hpp) on its own, with a fake
// device whose "buffers" record what was uploaded: what it keeps, what it
// never keeps, LRU order, the budget, and the counters. The OpenCL node's
// use of it runs for real in test_opencl_residency.cpp.
#include "kvasir/backend/registry.hpp"
#include "kvasir/backend/weight_cache.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

using namespace kvasir;

namespace {

// A "device buffer": a copy of the host bytes made at upload.
struct FakeBuffer {
    std::vector<float> values;
};

// Weights in immutable memory: one registered host arena of `n` floats.
struct Arena {
    explicit Arena(std::size_t n) : values(n) {
        for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
        reg = ImmutableRegistration(values.data(), values.size() * sizeof(float));
    }
    TensorView view(std::size_t offset, Shape shape) const {
        return TensorView{DType::f32, values.data() + offset, std::move(shape)};
    }
    std::vector<float> values;
    ImmutableRegistration reg;
};

struct Device {
    int uploads = 0;
    std::shared_ptr<const FakeBuffer> get(WeightCache<FakeBuffer>& cache, const TensorView& w, DType format = DType::f32) {
        const std::uint64_t bytes = static_cast<std::uint64_t>(w.numel()) * 4;
        return cache.get(w, format, bytes, [&] {
            ++uploads;
            const float* p = static_cast<const float*>(w.data);
            return FakeBuffer{std::vector<float>(p, p + w.numel())};
        });
    }
};

constexpr std::uint64_t kKiB = 1024;

}  // namespace

TEST(WeightCache, SecondCallIsAHitAndUploadsNothing) {
    const Arena arena(1024);
    WeightCache<FakeBuffer> cache(64 * kKiB);
    Device dev;
    const TensorView w = arena.view(0, {16, 16});
    const auto first = dev.get(cache, w);
    const WeightCacheStats after_first = cache.stats();
    const auto second = dev.get(cache, w);
    const WeightCacheStats s = cache.stats();
    EXPECT_EQ(first.get(), second.get());
    EXPECT_EQ(dev.uploads, 1);
    EXPECT_EQ(s.misses, 1u);
    EXPECT_EQ(s.hits, 1u);
    EXPECT_EQ(s.bytes_uploaded, after_first.bytes_uploaded);  // the hit uploaded no byte
    EXPECT_EQ(s.bytes_uploaded, 16u * 16 * 4);
    EXPECT_EQ(s.resident_bytes, 16u * 16 * 4);
    EXPECT_EQ(s.resident_entries, 1u);
}

TEST(WeightCache, KeyIsOffsetShapeDtypeAndDeviceFormat) {
    const Arena arena(1024);
    WeightCache<FakeBuffer> cache(64 * kKiB);
    Device dev;
    dev.get(cache, arena.view(0, {16, 16}));
    dev.get(cache, arena.view(256, {16, 16}));          // another offset
    dev.get(cache, arena.view(0, {8, 32}));             // same bytes, another shape
    dev.get(cache, arena.view(0, {16, 16}), DType::f16);  // same view, another device format
    TensorView as_i32 = arena.view(0, {16, 16});
    as_i32.dtype = DType::i32;
    dev.get(cache, as_i32);  // same bytes read as another dtype
    EXPECT_EQ(dev.uploads, 5);
    EXPECT_EQ(cache.stats().misses, 5u);
    EXPECT_EQ(cache.stats().hits, 0u);
    dev.get(cache, arena.view(256, {16, 16}));
    EXPECT_EQ(cache.stats().hits, 1u);
}

TEST(WeightCache, HeapMemoryIsNeverCachedSoAReusedAddressIsNeverStale) {
    WeightCache<FakeBuffer> cache(64 * kKiB);
    Device dev;
    // An activation: freed, and its address handed to other contents.
    std::vector<float> buffer(64, 1.0f);
    const TensorView a{DType::f32, buffer.data(), {8, 8}};
    EXPECT_EQ(dev.get(cache, a)->values[0], 1.0f);
    std::fill(buffer.begin(), buffer.end(), 2.0f);  // same address, same shape, new contents
    EXPECT_EQ(dev.get(cache, a)->values[0], 2.0f);
    const WeightCacheStats s = cache.stats();
    EXPECT_EQ(s.uncacheable, 2u);
    EXPECT_EQ(s.hits + s.misses, 0u);
    EXPECT_EQ(s.resident_entries, 0u);
    EXPECT_EQ(s.bytes_uploaded, 2u * 64 * 4);
}

TEST(WeightCache, ARegistrationEndedAndRemadeAtTheSameAddressIsAMiss) {
    std::vector<float> bytes(64, 1.0f);
    WeightCache<FakeBuffer> cache(64 * kKiB);
    Device dev;
    const TensorView w{DType::f32, bytes.data(), {64}};
    {
        const ImmutableRegistration mapped(bytes.data(), bytes.size() * 4);
        EXPECT_EQ(dev.get(cache, w)->values[0], 1.0f);
        EXPECT_EQ(dev.get(cache, w)->values[0], 1.0f);  // a hit
    }
    std::fill(bytes.begin(), bytes.end(), 3.0f);  // "unmapped, another file mapped at the address"
    const ImmutableRegistration remapped(bytes.data(), bytes.size() * 4);
    EXPECT_EQ(dev.get(cache, w)->values[0], 3.0f);
    EXPECT_EQ(cache.stats().misses, 2u);
    EXPECT_EQ(cache.stats().hits, 1u);
}

TEST(WeightCache, LeastRecentlyUsedIsEvictedFirstOnceCold) {
    const Arena arena(4096);
    WeightCache<FakeBuffer> cache(3 * kKiB);  // room for three 1 KiB weights
    Device dev;
    const TensorView a = arena.view(0, {256}), b = arena.view(256, {256}), c = arena.view(512, {256}),
                     d = arena.view(768, {256});
    dev.get(cache, a);
    dev.get(cache, b);
    dev.get(cache, c);
    for (int i = 0; i < 3; ++i) {
        dev.get(cache, a);
        dev.get(cache, c);
    }  // b is the least recent, and cold: not asked for within the last 4 gets (4 weights seen)
    dev.get(cache, d);  // evicts b
    EXPECT_EQ(cache.stats().evictions, 1u);
    EXPECT_EQ(cache.stats().declined, 0u);
    EXPECT_EQ(cache.stats().resident_bytes, 3 * kKiB);
    const int uploads = dev.uploads;
    dev.get(cache, a);
    dev.get(cache, c);
    dev.get(cache, d);
    EXPECT_EQ(dev.uploads, uploads);  // all three still resident
    dev.get(cache, b);                // every resident one is warm: b is uploaded for this call only
    EXPECT_EQ(dev.uploads, uploads + 1);
    EXPECT_EQ(cache.stats().declined, 1u);
    EXPECT_EQ(cache.stats().evictions, 1u);
    dev.get(cache, a);
    EXPECT_EQ(dev.uploads, uploads + 1);  // ... and nothing was evicted for it
    EXPECT_LE(cache.stats().resident_bytes, cache.stats().budget_bytes);
}

// Forward passes ask for every weight in the same order: five weights, room
// for three. LRU would evict each just before it is needed again (no hit
// ever); the cache keeps its three and declines the other two, every pass.
TEST(WeightCache, APassLargerThanTheBudgetKeepsItsResidentShareHitting) {
    const Arena arena(8192);
    WeightCache<FakeBuffer> cache(3 * kKiB);
    Device dev;
    std::vector<TensorView> w;
    for (int i = 0; i < 5; ++i) w.push_back(arena.view(static_cast<std::size_t>(256 * i), {256}));
    for (int pass = 0; pass < 4; ++pass)
        for (const TensorView& v : w) EXPECT_EQ(dev.get(cache, v)->values[0], static_cast<const float*>(v.data)[0]);
    const WeightCacheStats s = cache.stats();
    EXPECT_EQ(s.misses, 3u);
    EXPECT_EQ(s.hits, 9u);
    EXPECT_EQ(s.declined, 8u);
    EXPECT_EQ(s.evictions, 0u);
    EXPECT_EQ(dev.uploads, 11);
}

// Another model (or step) takes over: the old weights go cold within a pass
// over the new ones and are evicted; the new ones are then resident.
TEST(WeightCache, WeightsNobodyAsksForAnyMoreMakeRoom) {
    const Arena arena(8192);
    WeightCache<FakeBuffer> cache(3 * kKiB);
    Device dev;
    std::vector<TensorView> old_w, new_w;
    for (int i = 0; i < 3; ++i) old_w.push_back(arena.view(static_cast<std::size_t>(256 * i), {256}));
    for (int i = 3; i < 6; ++i) new_w.push_back(arena.view(static_cast<std::size_t>(256 * i), {256}));
    for (int pass = 0; pass < 2; ++pass)
        for (const TensorView& v : old_w) dev.get(cache, v);
    for (int pass = 0; pass < 3; ++pass)
        for (const TensorView& v : new_w) dev.get(cache, v);
    const WeightCacheStats s = cache.stats();
    EXPECT_EQ(s.evictions, 3u);  // every old weight, once cold
    EXPECT_EQ(s.resident_entries, 3u);
    const int uploads = dev.uploads;
    for (const TensorView& v : new_w) dev.get(cache, v);
    EXPECT_EQ(dev.uploads, uploads);  // the new ones are resident
}

TEST(WeightCache, AnEvictedEntryStaysValidWhileItsUserHoldsIt) {
    const Arena arena(1024);
    WeightCache<FakeBuffer> cache(1 * kKiB);
    Device dev;
    const auto held = dev.get(cache, arena.view(0, {256}));
    dev.get(cache, arena.view(256, {256}));  // the first is still warm: declined
    dev.get(cache, arena.view(256, {256}));  // now it is cold: evicted
    EXPECT_EQ(cache.stats().evictions, 1u);
    EXPECT_EQ(held->values[5], 5.0f);
}

TEST(WeightCache, AWeightLargerThanTheBudgetBypassesWithoutFlushing) {
    const Arena arena(4096);
    WeightCache<FakeBuffer> cache(2 * kKiB);
    Device dev;
    dev.get(cache, arena.view(0, {256}));
    dev.get(cache, arena.view(0, {1024}));  // 4 KiB > budget
    dev.get(cache, arena.view(0, {1024}));
    const WeightCacheStats s = cache.stats();
    EXPECT_EQ(s.oversized, 2u);
    EXPECT_EQ(s.evictions, 0u);
    EXPECT_EQ(s.resident_bytes, 1 * kKiB);
    EXPECT_EQ(dev.uploads, 3);
    dev.get(cache, arena.view(0, {256}));
    EXPECT_EQ(cache.stats().hits, 1u);
}

TEST(WeightCache, BudgetZeroIsOff) {
    const Arena arena(1024);
    WeightCache<FakeBuffer> cache(0);
    Device dev;
    dev.get(cache, arena.view(0, {256}));
    dev.get(cache, arena.view(0, {256}));
    EXPECT_EQ(dev.uploads, 2);
    EXPECT_EQ(cache.stats().uncacheable, 2u);
    EXPECT_EQ(cache.stats().resident_entries, 0u);
}

TEST(WeightCache, AFailedUploadKeepsNothing) {
    const Arena arena(1024);
    WeightCache<FakeBuffer> cache(64 * kKiB);
    EXPECT_THROW(cache.get(arena.view(0, {16}), DType::f32, 64, []() -> FakeBuffer { throw Error(ErrorCode::backend_failure, "no memory"); }),
                 Error);
    EXPECT_EQ(cache.stats().resident_entries, 0u);
    EXPECT_EQ(cache.stats().misses, 0u);
    Device dev;
    dev.get(cache, arena.view(0, {16}));
    EXPECT_EQ(dev.uploads, 1);
}

TEST(WeightCache, OptionIsWholeMiB) {
    BackendSpec spec = BackendSpec::parse("opencl:0");
    EXPECT_EQ(parse_weight_cache_option(spec, "0"), 0u);
    EXPECT_EQ(parse_weight_cache_option(spec, "3"), 3u << 20);
    for (const char* bad : {"", "-1", "1.5", "1M", "x", "99999999999999999999"}) {
        try {
            parse_weight_cache_option(spec, bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::bad_input) << bad;
        }
    }
    EXPECT_EQ(default_weight_cache_budget(8ull << 30), 4ull << 30);
}

// The cpu node's use of the cache: a decode matmul (T ≤ 3) on f32 weights in
// immutable memory runs on their packed copy, made once (a miss, then hits),
// with the same bits as the transposing GEMV on the same values in heap
// memory (never cached: uncacheable is not even counted, nothing is packed);
// each storage variant keys its own copy (its rounding is packed in);
// weight_cache=0 packs nothing; a GEMM (T > 3) never touches the cache.
// An f16/bf16 checkpoint weight is multiplied in place until its 8th decode
// matmul, then packed (2 bytes a weight, a miss) and multiplied from its
// packed copy (hits): the same bits every time; a GEMM (T > 3) does not
// count as a use; weight_cache=0 never packs.
TEST(WeightCache, CpuPacksANarrowWeightFromItsEighthDecodeMatmul) {
    const std::int64_t N = 70, K = 600;
    for (const DType wd : {DType::bf16, DType::f16}) {
        Tensor w(DType::f32, {N, K});
        for (std::int64_t i = 0; i < w.numel(); ++i) w.as<float>()[i] = std::sin(static_cast<float>(i)) * 0.05f;
        const Tensor wn = Tensor::convert(w.view(), wd);
        const ImmutableRegistration reg(wn.raw(), wn.nbytes());
        Tensor x(DType::f32, {1, K}), x5(DType::f32, {5, K});
        for (std::int64_t i = 0; i < K; ++i) x.as<float>()[i] = std::cos(static_cast<float>(i) * 0.37f);
        for (std::int64_t i = 0; i < x5.numel(); ++i) x5.as<float>()[i] = std::cos(static_cast<float>(i) * 0.11f);
        for (const char* spec : {"cpu", "cpu:storage=f16", "cpu:storage=bf16"}) {
            auto node = create_backend(spec);
            const Tensor first = node->matmul(x, wn.view());
            (void)node->matmul(x5, wn.view());  // a GEMM: not a decode use
            for (int use = 2; use <= 10; ++use) {
                const Tensor y = node->matmul(x, wn.view());
                ASSERT_EQ(std::memcmp(first.raw(), y.raw(), y.nbytes()), 0) << spec << " use " << use;
                const WeightCacheStats s = *node->weight_cache_stats();
                EXPECT_EQ(s.misses, use >= 8 ? 1u : 0u) << spec << " " << dtype_name(wd) << " use " << use;
                EXPECT_EQ(s.hits, use >= 8 ? static_cast<std::uint64_t>(use - 8) : 0u) << spec << " use " << use;
            }
            // Panels of 2 bytes a weight: N padded to 3 groups of 32.
            EXPECT_EQ(node->weight_cache_stats()->resident_bytes, 96u * K * 2) << spec << " " << dtype_name(wd);
        }
        auto off = create_backend("cpu:weight_cache=0");
        for (int use = 1; use <= 10; ++use) (void)off->matmul(x, wn.view());
        EXPECT_EQ(off->weight_cache_stats()->misses, 0u);
    }
}

TEST(WeightCache, CpuDecodeRunsOnPackedWeightsWithTheSameBits) {
    const std::int64_t N = 70, K = 600;
    std::vector<float> w_heap(static_cast<std::size_t>(N * K));
    for (std::size_t i = 0; i < w_heap.size(); ++i) w_heap[i] = std::sin(static_cast<float>(i)) * 0.05f;
    const std::vector<float> w_kept(w_heap);  // the same values, registered as immutable
    const ImmutableRegistration reg(w_kept.data(), w_kept.size() * sizeof(float));
    const TensorView wi{DType::f32, w_kept.data(), {N, K}};
    const TensorView wh{DType::f32, w_heap.data(), {N, K}};
    for (const char* spec : {"cpu", "cpu:storage=bf16", "cpu:threads=1"}) {
        auto node = create_backend(spec);
        for (std::int64_t T : {1, 2, 3, 5}) {
            Tensor x(DType::f32, {T, K});
            for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = std::cos(static_cast<float>(i) * 0.37f);
            const Tensor a = node->matmul(x, wh), b = node->matmul(x, wi);
            ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << spec << " T " << T;
        }
        const WeightCacheStats s = *node->weight_cache_stats();
        EXPECT_GT(s.budget_bytes, 0u) << spec;
        EXPECT_EQ(s.misses, 1u) << spec;  // packed once, at T = 1
        EXPECT_EQ(s.hits, 2u) << spec;    // T = 2, 3; T = 5 is a GEMM
        EXPECT_EQ(s.resident_entries, 1u) << spec;
    }
    auto off = create_backend("cpu:weight_cache=0");
    Tensor x(DType::f32, {1, K});
    for (std::int64_t i = 0; i < K; ++i) x.as<float>()[i] = 1.0f / static_cast<float>(i + 1);
    const Tensor a = off->matmul(x, wi), b = create_backend("cpu")->matmul(x, wi);
    ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    EXPECT_EQ(off->weight_cache_stats()->misses, 0u);
    EXPECT_EQ(off->weight_cache_stats()->resident_entries, 0u);
}
