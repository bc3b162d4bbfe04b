#include "kvasir/backend/capabilities_json.hpp"

#include "kvasir/core/dtype.hpp"

#include <type_traits>

namespace kvasir {

nlohmann::ordered_json to_json(const Capabilities& c) {
    nlohmann::ordered_json j;
    j["node"] = c.node;
    j["backend"] = c.backend;
    j["device"] = c.device;
    j["runtime"] = c.runtime;
    j["storage"] = dtype_name(c.storage);
    j["accumulation"] = dtype_name(c.accumulation);
    j["output"] = dtype_name(c.output);
    j["fma"] = c.fma;
    j["threads"] = c.threads;
    j["deterministic"] = c.deterministic;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.extra) extra[k] = v;
    j["extra"] = extra;
    return j;
}

namespace {

// The counters in one order for both directions.
template <typename Stats, typename F>
    requires std::is_same_v<std::remove_const_t<Stats>, WeightCacheStats>
void for_each_counter(Stats& s, F&& f) {
    f("budget_bytes", s.budget_bytes);
    f("hits", s.hits);
    f("misses", s.misses);
    f("uncacheable", s.uncacheable);
    f("oversized", s.oversized);
    f("declined", s.declined);
    f("bytes_uploaded", s.bytes_uploaded);
    f("evictions", s.evictions);
    f("resident_bytes", s.resident_bytes);
    f("resident_entries", s.resident_entries);
}

template <typename Stats, typename F>
    requires std::is_same_v<std::remove_const_t<Stats>, TransferStats>
void for_each_counter(Stats& s, F&& f) {
    f("uploads", s.uploads);
    f("upload_bytes", s.upload_bytes);
    f("downloads", s.downloads);
    f("download_bytes", s.download_bytes);
    f("syncs", s.syncs);
    f("launches", s.launches);
    f("allocations", s.allocations);
}

// Counters as a JSON object of unsigned integers, and back (every key
// present and unsigned, else nullopt).
template <typename Stats>
nlohmann::ordered_json counters_json(const Stats& stats) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for_each_counter(stats, [&](const char* key, std::uint64_t v) { j[key] = v; });
    return j;
}
template <typename Stats>
std::optional<Stats> counters_from_json(const nlohmann::json& j) {
    if (!j.is_object()) return std::nullopt;
    Stats s;
    bool ok = true;
    for_each_counter(s, [&](const char* key, std::uint64_t& v) {
        const auto it = j.find(key);
        if (it == j.end() || !it->is_number_unsigned()) ok = false;
        else v = it->get<std::uint64_t>();
    });
    return ok ? std::optional<Stats>(s) : std::nullopt;
}

}  // namespace

nlohmann::ordered_json to_json(const WeightCacheStats& stats) { return counters_json(stats); }
std::optional<WeightCacheStats> weight_cache_stats_from_json(const nlohmann::json& j) {
    return counters_from_json<WeightCacheStats>(j);
}
nlohmann::ordered_json to_json(const TransferStats& stats) { return counters_json(stats); }
std::optional<TransferStats> transfer_stats_from_json(const nlohmann::json& j) { return counters_from_json<TransferStats>(j); }

}  // namespace kvasir
