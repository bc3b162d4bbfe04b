// A validator for the subset of JSON Schema (draft 2020-12) that
// protocols/protocol.schema.json and protocols/report.schema.json use. No
// Debian C++ package validates 2020-12, so the subset is written here and
// tested against the official JSON-Schema-Test-Suite (tests/core/
// test_json_schema.cpp runs every case of every supported keyword's file).
//
// Supported keywords (draft 2020-12 semantics): type (a name or an array of
// names; "integer" accepts 3.0), enum, const, properties, required,
// additionalProperties (a schema, false included), patternProperties, items
// (one schema for every element), minItems, maxItems, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (numbers; two integers compare exactly,
// anything else as doubles), minLength (in code points), pattern (ECMAScript
// regex, searched — not anchored — as the standard says; std::regex works on
// the UTF-8 bytes, so '.' is one byte: keep patterns to ASCII classes), and
// $ref to a local "#..." JSON pointer (URI fragment: %-escapes decoded first)
// whose siblings apply too, as 2020-12 says. Boolean schemas (true/false) are
// supported. Ignored: the annotations $schema, $id, $comment, title,
// description, default, examples, and the containers $defs and definitions
// (draft 7's name for it) — they only hold schemas a $ref can point at.
//
// Any OTHER keyword, or a supported one with a malformed value (a negative
// minItems, a pattern that does not compile, items as an array, a $ref that
// is not local or points nowhere), is refused with Error(internal) naming the
// keyword and its place in the schema, before any document is looked at: a
// validator that silently ignored, say, "oneOf" would pass documents the
// schema means to refuse. Internal, because the schemas ship with the tool.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

struct SchemaViolation {
    std::string path;     // JSON pointer into the document ("" = the root)
    std::string message;  // "expected a number, got string", "unknown key", ...
};

// Every violation, in document order. Empty = valid.
std::vector<SchemaViolation> schema_violations(const nlohmann::json& schema, const nlohmann::json& doc);
// Throws Error(bad_input) "<source>: <path>: <message>" for the first violation.
void validate_against_schema(const nlohmann::json& schema, const nlohmann::json& doc, const std::string& source);

// Parses untrusted JSON text strictly: Error(bad_input) "<source>: invalid
// JSON: …" for a syntax error, and — where nlohmann would silently keep the
// LAST of duplicate keys (in a protocol: one of two tolerances dropped; in a
// tokenizer: one of two ids) — "<source>: <pointer>: duplicate key"; a number
// outside the range of a double is refused naming its pointer.
nlohmann::json parse_json_strict(const std::string& text, const std::string& source);

// JSON pointer (RFC 6901) of `token` below `parent`: "~" → "~0", "/" → "~1".
std::string json_pointer_child(const std::string& parent, std::string_view token);
std::string json_pointer_child(const std::string& parent, std::size_t index);

// The schema's "integer": an integer, or a float with no fractional part (3.0).
bool json_is_integer(const nlohmann::json& j);
// "string \"abc\"", "integer 3", "object {...}" (long values cut at 40
// characters): what violation messages say they got.
std::string describe_json_value(const nlohmann::json& j);

}  // namespace kvasir
