#include "kvasir/core/immutable_memory.hpp"

#include "kvasir/core/error.hpp"

#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace kvasir {
namespace {

struct Region {
    std::uintptr_t end;
    std::uint64_t id;
    WeightOrigin origin;
};

struct Registry {
    std::mutex mutex;
    std::map<std::uintptr_t, Region> by_start;  // disjoint ranges
    std::uint64_t next_id = 1;
};

// Leaked on purpose: mappings may be released by static destructors.
Registry& registry() {
    static auto* r = new Registry();
    return *r;
}

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

ImmutableRegistration::ImmutableRegistration(const void* data, std::size_t size, WeightOrigin origin) {
    if (data == nullptr || size == 0) return;
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    const std::uintptr_t start = address(data), end = start + size;
    auto next = r.by_start.lower_bound(start);
    const bool overlaps_next = next != r.by_start.end() && next->first < end;
    const bool overlaps_prev = next != r.by_start.begin() && std::prev(next)->second.end > start;
    KVASIR_CHECK(!overlaps_next && !overlaps_prev, ErrorCode::internal,
                 "immutable memory [{:#x}, {:#x}) overlaps a live registration", start, end);
    id_ = r.next_id++;
    r.by_start.emplace(start, Region{end, id_, origin});
}

ImmutableRegistration::ImmutableRegistration(ImmutableRegistration&& other) noexcept
    : id_(std::exchange(other.id_, 0)) {}

ImmutableRegistration& ImmutableRegistration::operator=(ImmutableRegistration&& other) noexcept {
    if (this != &other) {
        reset();
        id_ = std::exchange(other.id_, 0);
    }
    return *this;
}

ImmutableRegistration::~ImmutableRegistration() { reset(); }

void ImmutableRegistration::reset() noexcept {
    if (id_ == 0) return;
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    for (auto it = r.by_start.begin(); it != r.by_start.end(); ++it)
        if (it->second.id == id_) {
            r.by_start.erase(it);
            break;
        }
    id_ = 0;
}

std::optional<ImmutableSpan> find_immutable(const void* data, std::size_t bytes) {
    if (data == nullptr) return std::nullopt;
    const std::uintptr_t start = address(data);
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    auto it = r.by_start.upper_bound(start);
    if (it == r.by_start.begin()) return std::nullopt;
    --it;
    if (start + bytes > it->second.end || start + bytes < start) return std::nullopt;
    return ImmutableSpan{it->second.id, static_cast<std::size_t>(start - it->first), it->second.origin};
}

}  // namespace kvasir
