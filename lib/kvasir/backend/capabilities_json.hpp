// A node's capabilities as every report and capture records them (kept out
// of backend.hpp, which the GPU compilers also read).
#pragma once

#include "kvasir/backend/backend.hpp"

#include <nlohmann/json.hpp>

#include <optional>

namespace kvasir {

nlohmann::ordered_json to_json(const Capabilities& caps);

// A node's weight-cache counters (capture metadata "weight_cache"), and back;
// nullopt for a document that is not one (a capture from another writer).
nlohmann::ordered_json to_json(const WeightCacheStats& stats);
std::optional<WeightCacheStats> weight_cache_stats_from_json(const nlohmann::json& j);
// A node's transfer counters (capture metadata "transfers", "step_transfers"), likewise.
nlohmann::ordered_json to_json(const TransferStats& stats);
std::optional<TransferStats> transfer_stats_from_json(const nlohmann::json& j);

}  // namespace kvasir
