// The registry of immutable host memory (core/immutable_memory.hpp): what a
// device node's weight cache trusts to tell a weight from an activation.
#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <utility>
#include <vector>

using namespace kvasir;

TEST(ImmutableMemory, FindsRangesInsideARegistrationOnly) {
    std::vector<std::byte> bytes(4096);
    const ImmutableRegistration reg(bytes.data(), bytes.size());
    ASSERT_NE(reg.id(), 0u);
    const auto whole = find_immutable(bytes.data(), bytes.size());
    ASSERT_TRUE(whole);
    EXPECT_EQ(whole->region, reg.id());
    EXPECT_EQ(whole->offset, 0u);
    const auto inner = find_immutable(bytes.data() + 100, 200);
    ASSERT_TRUE(inner);
    EXPECT_EQ(inner->region, reg.id());
    EXPECT_EQ(inner->offset, 100u);
    EXPECT_FALSE(find_immutable(bytes.data() + 4000, 200));  // runs past the end
    std::vector<std::byte> heap(64);
    EXPECT_FALSE(find_immutable(heap.data(), heap.size()));  // never registered
    EXPECT_FALSE(find_immutable(nullptr, 0));
}

TEST(ImmutableMemory, AnIdIsNeverReusedEvenAtTheSameAddress) {
    std::vector<std::byte> bytes(256);
    std::uint64_t first = 0;
    {
        const ImmutableRegistration reg(bytes.data(), bytes.size());
        first = reg.id();
    }
    EXPECT_FALSE(find_immutable(bytes.data(), bytes.size()));  // gone with its registration
    const ImmutableRegistration again(bytes.data(), bytes.size());
    EXPECT_NE(again.id(), first);
    EXPECT_EQ(find_immutable(bytes.data(), 8)->region, again.id());
}

TEST(ImmutableMemory, MovesCarryTheRegistrationAndResetEndsIt) {
    std::vector<std::byte> bytes(256);
    ImmutableRegistration a(bytes.data(), bytes.size());
    const std::uint64_t id = a.id();
    ImmutableRegistration b(std::move(a));
    EXPECT_EQ(a.id(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
    EXPECT_EQ(b.id(), id);
    EXPECT_EQ(find_immutable(bytes.data(), 1)->region, id);
    b.reset();
    EXPECT_FALSE(find_immutable(bytes.data(), 1));
}

TEST(ImmutableMemory, OverlappingRegistrationsAreAnInternalError) {
    std::vector<std::byte> bytes(256);
    const ImmutableRegistration reg(bytes.data() + 64, 64);
    for (const auto& [start, size] : std::vector<std::pair<std::size_t, std::size_t>>{{0, 65}, {127, 10}, {80, 8}, {0, 256}}) {
        try {
            const ImmutableRegistration clash(bytes.data() + start, size);
            ADD_FAILURE() << "overlap [" << start << ", " << start + size << ") accepted";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::internal);
        }
    }
    const ImmutableRegistration before(bytes.data(), 64), after(bytes.data() + 128, 64);  // adjacent is fine
    EXPECT_NE(before.id(), after.id());
}
