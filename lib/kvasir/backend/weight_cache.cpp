#include "kvasir/backend/weight_cache.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"

#include <fmt/format.h>

#include <charconv>
#include <list>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

namespace kvasir {

std::uint64_t default_weight_cache_budget(std::uint64_t device_memory_bytes) {
    return static_cast<std::uint64_t>(static_cast<double>(device_memory_bytes) * kWeightCacheDeviceShare);
}

std::uint64_t parse_weight_cache_option(const BackendSpec& spec, const std::string& value) {
    std::uint64_t mib = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mib);
    KVASIR_CHECK(ec == std::errc() && end == value.data() + value.size() && mib <= (std::uint64_t{1} << 40),
                 ErrorCode::bad_input, "backend '{}': weight_cache must be a whole number of MiB (0 = off), not '{}'",
                 spec.canonical(), value);
    return mib << 20;
}

std::string describe_weight_cache(std::uint64_t budget, bool from_option, const char* memory_query) {
    if (budget == 0) return "off (weight_cache=0): every weight uploaded at every call";
    return fmt::format("weights kept resident, least recently used evicted first; budget {} MiB ({}); only immutable "
                       "memory (checkpoint mappings) is cached, activations are uploaded per call",
                       budget >> 20,
                       from_option ? fmt::format("weight_cache={}", budget >> 20)
                                   : fmt::format("{:.0f}% of {}", kWeightCacheDeviceShare * 100, memory_query));
}

namespace {

struct Key {
    std::uint64_t region;
    std::size_t offset, host_bytes;
    DType dtype;
    Shape shape;
    DType format;
    std::uint32_t layout;
    bool operator<(const Key& o) const {
        return std::tie(region, offset, host_bytes, dtype, shape, format, layout) <
               std::tie(o.region, o.offset, o.host_bytes, o.dtype, o.shape, o.format, o.layout);
    }
};

struct Entry {
    Key key;
    std::shared_ptr<const void> buffer;
    std::uint64_t bytes;
    std::uint64_t last_use;  // the cache's clock at its last get
};

}  // namespace

struct WeightCacheCore::Impl {
    mutable std::mutex mutex;
    std::list<Entry> lru;  // most recently used first
    std::map<Key, std::list<Entry>::iterator> index;
    std::set<Key> seen;      // every cacheable weight asked for
    std::uint64_t clock = 0;  // cacheable gets so far
    WeightCacheStats stats;
};

WeightCacheCore::WeightCacheCore(std::uint64_t budget_bytes) : impl_(std::make_unique<Impl>()) {
    impl_->stats.budget_bytes = budget_bytes;
}

WeightCacheCore::~WeightCacheCore() = default;

std::shared_ptr<const void> WeightCacheCore::get(const TensorView& w, DType format, std::uint64_t device_bytes,
                                                 const Upload& upload, std::uint32_t layout) {
    Impl& c = *impl_;
    WeightCacheStats& s = c.stats;
    const std::lock_guard lock(c.mutex);
    const std::size_t host_bytes = static_cast<std::size_t>(w.numel()) * dtype_size(w.dtype);
    const std::optional<ImmutableSpan> span = s.budget_bytes > 0 ? find_immutable(w.data, host_bytes) : std::nullopt;
    if (!span || device_bytes > s.budget_bytes) {
        ++(span ? s.oversized : s.uncacheable);
        std::shared_ptr<const void> once = upload();
        s.bytes_uploaded += device_bytes;
        return once;
    }
    Key key{span->region, span->offset, host_bytes, w.dtype, w.shape, format, layout};
    const std::uint64_t now = ++c.clock;
    c.seen.insert(key);
    if (const auto it = c.index.find(key); it != c.index.end()) {
        ++s.hits;
        it->second->last_use = now;
        c.lru.splice(c.lru.begin(), c.lru, it->second);
        return it->second->buffer;
    }
    // Scan resistance: a forward pass asks for every weight of the model in
    // the same order, pass after pass. When they do not all fit, LRU evicts
    // each weight just before it is needed again and every get misses; so a
    // victim still warm — asked for within as many gets as there are weights
    // this cache has seen, i.e. within the current pass — is kept, and the
    // newcomer is uploaded for the call alone (declined). The resident share
    // then hits on every pass; an entry nobody asked for during a whole pass
    // (another model, a finished step) is evicted as before.
    if (!c.lru.empty() && s.resident_bytes + device_bytes > s.budget_bytes && now - c.lru.back().last_use < c.seen.size()) {
        ++s.declined;
        std::shared_ptr<const void> once = upload();
        s.bytes_uploaded += device_bytes;
        return once;
    }
    while (!c.lru.empty() && s.resident_bytes + device_bytes > s.budget_bytes) {
        const Entry& victim = c.lru.back();
        s.resident_bytes -= victim.bytes;
        ++s.evictions;
        c.index.erase(victim.key);
        c.lru.pop_back();
    }
    std::shared_ptr<const void> buffer = upload();
    ++s.misses;
    s.bytes_uploaded += device_bytes;
    c.lru.push_front(Entry{key, buffer, device_bytes, now});
    c.index.emplace(std::move(key), c.lru.begin());
    s.resident_bytes += device_bytes;
    return buffer;
}

WeightCacheStats WeightCacheCore::stats() const {
    const std::lock_guard lock(impl_->mutex);
    WeightCacheStats s = impl_->stats;
    s.resident_entries = impl_->lru.size();
    return s;
}

void WeightCacheCore::clear() {
    const std::lock_guard lock(impl_->mutex);
    impl_->index.clear();
    impl_->lru.clear();
    impl_->seen.clear();
    impl_->stats.resident_bytes = 0;
}

}  // namespace kvasir
