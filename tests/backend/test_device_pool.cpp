// DevicePool (backend/device_pool.hpp), the device-memory reuse of every
// device node, on fake handles: what it keeps, hands out, frees and when.
// (Its use by a node: Opencl.OpsOnAWarmNodeAllocateNothing on PoCL.)
#include "kvasir/backend/device_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

using namespace kvasir;

namespace {

std::vector<void*> g_released;
void record_release(void* h) { g_released.push_back(h); }
void* handle(std::uintptr_t n) { return reinterpret_cast<void*>(n); }

}  // namespace

TEST(DevicePool, SizeClassesAreWhole256ByteUnits) {
    EXPECT_EQ(DevicePool::size_class(0), 256u);
    EXPECT_EQ(DevicePool::size_class(1), 256u);
    EXPECT_EQ(DevicePool::size_class(256), 256u);
    EXPECT_EQ(DevicePool::size_class(257), 512u);
    EXPECT_EQ(DevicePool::size_class(4096 * 4), 16384u);
    EXPECT_EQ(default_device_pool_cap(std::uint64_t{16} << 30), std::uint64_t{1} << 30);
    EXPECT_EQ(default_device_pool_cap(std::uint64_t{8} << 30), std::uint64_t{512} << 20);
}

TEST(DevicePool, HandsBackWhatItKeptOfTheSameClassOnly) {
    g_released.clear();
    {
        DevicePool pool(1 << 20, record_release);
        EXPECT_EQ(pool.take(512), nullptr) << "an empty pool has nothing";
        pool.give(handle(0x1000), 512);
        pool.give(handle(0x2000), 512);
        pool.give(handle(0x3000), 1024);
        EXPECT_EQ(pool.idle_bytes(), 2048u);
        EXPECT_EQ(pool.take(768), nullptr) << "no buffer of that class";
        std::set<void*> got{pool.take(512), pool.take(512)};
        EXPECT_EQ(got, (std::set<void*>{handle(0x1000), handle(0x2000)}));
        EXPECT_EQ(pool.take(512), nullptr) << "each buffer is handed out once";
        EXPECT_EQ(pool.take(1024), handle(0x3000));
        EXPECT_EQ(pool.reused(), 3u);
        EXPECT_EQ(pool.idle_bytes(), 0u);
        pool.give(handle(0x4000), 256);
        EXPECT_TRUE(g_released.empty()) << "nothing freed while the pool holds it";
    }
    EXPECT_EQ(g_released, std::vector<void*>{handle(0x4000)}) << "the destructor frees what is idle, and only that";
}

TEST(DevicePool, KeepsNoMoreThanItsCapIdle) {
    g_released.clear();
    DevicePool pool(1024, record_release);
    pool.give(handle(0x10), 512);
    pool.give(handle(0x20), 512);
    pool.give(handle(0x30), 256);  // 1024 + 256 > 1024: freed at once
    EXPECT_EQ(g_released, std::vector<void*>{handle(0x30)});
    EXPECT_EQ(pool.idle_bytes(), 1024u);
    void* taken = pool.take(512);
    ASSERT_TRUE(taken == handle(0x10) || taken == handle(0x20));
    pool.give(handle(0x40), 256);  // 512 + 256 ≤ 1024: kept
    EXPECT_EQ(g_released.size(), 1u);
    EXPECT_EQ(pool.idle_bytes(), 768u);
    g_released.clear();
    pool.release_idle();  // what a node does before retrying a refused allocation
    EXPECT_EQ(std::set<void*>(g_released.begin(), g_released.end()),
              (std::set<void*>{taken == handle(0x10) ? handle(0x20) : handle(0x10), handle(0x40)}));
    EXPECT_EQ(pool.idle_bytes(), 0u);
    EXPECT_EQ(pool.take(512), nullptr);
    DevicePool off(0, record_release);  // cap 0: a pool that keeps nothing
    off.give(handle(0x50), 256);
    EXPECT_EQ(g_released.back(), handle(0x50));
    EXPECT_EQ(off.take(256), nullptr);
}
