// Canonical JSON and the content hash over it: two documents that differ only
// in key order or whitespace are the same content (a protocol reformatted by
// an editor keeps its hash), any value change is a different content.
// scripts/capture_format.py reimplements both for the Python side.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvasir {

// The document with object keys sorted (byte order) and no whitespace, numbers
// in nlohmann's shortest round-trip form (1e-3 and 0.001 are the same double
// and print alike; the integer 1 and the float 1.0 do NOT). Strings must be
// valid UTF-8 (nlohmann's type_error otherwise: nothing is replaced silently).
std::string canonical_json(const nlohmann::json& doc);
// "sha256:" + sha256_hex(canonical_json(doc)).
std::string content_hash(const nlohmann::json& doc);

}  // namespace kvasir
