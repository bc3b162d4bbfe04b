#include "kvasir/core/canonical_json.hpp"

#include "kvasir/core/sha256.hpp"

namespace kvasir {

// nlohmann::json (not ordered_json) keeps objects in a std::map, so dump()
// already writes keys in byte order; dump() without an indent writes no
// whitespace. An ordered_json document must be converted first (the caller's
// type makes that explicit).
std::string canonical_json(const nlohmann::json& doc) { return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict); }

std::string content_hash(const nlohmann::json& doc) { return "sha256:" + sha256_hex(canonical_json(doc)); }

}  // namespace kvasir
