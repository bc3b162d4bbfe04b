#include "kvasir/core/json_schema.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <regex>
#include <set>

namespace kvasir {

std::string json_pointer_child(const std::string& parent, std::string_view token) {
    std::string out = parent + "/";
    for (const char c : token) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

std::string json_pointer_child(const std::string& parent, std::size_t index) {
    return parent + "/" + std::to_string(index);
}

nlohmann::json parse_json_strict(const std::string& text, const std::string& source) {
    struct Frame {
        bool is_object = false;
        std::set<std::string> keys;
        std::string key;
        std::size_t index = 0;
    };
    std::vector<Frame> stack;
    const auto pointer = [&](std::size_t upto) {
        std::string p;
        for (std::size_t i = 0; i < upto; ++i)
            p = stack[i].is_object ? json_pointer_child(p, stack[i].key) : json_pointer_child(p, stack[i].index);
        return p;
    };
    const auto bump = [&]() {
        if (!stack.empty() && !stack.back().is_object) ++stack.back().index;
    };
    const nlohmann::json::parser_callback_t cb = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        switch (event) {
            case E::object_start: stack.push_back(Frame{true, {}, {}, 0}); break;
            case E::array_start: stack.push_back(Frame{false, {}, {}, 0}); break;
            case E::key: {
                const std::string key = parsed.get<std::string>();
                if (!stack.back().keys.insert(key).second)
                    fail(ErrorCode::bad_input, "{}: {}: duplicate key", source,
                         json_pointer_child(pointer(stack.size() - 1), key));
                stack.back().key = key;
                break;
            }
            case E::object_end:
            case E::array_end:
                stack.pop_back();
                bump();
                break;
            case E::value: bump(); break;
        }
        return true;
    };
    try {
        return nlohmann::json::parse(text, cb);
    } catch (const nlohmann::json::parse_error& e) {
        fail(ErrorCode::bad_input, "{}: invalid JSON: {}", source, e.what());
    } catch (const nlohmann::json::out_of_range& e) {
        // A number too large for a double (1e999): the value being read is
        // the current key of the innermost object, or the next array slot.
        fail(ErrorCode::bad_input, "{}: {}: a number outside the range of a double", source,
             stack.empty() ? std::string("/") : pointer(stack.size()));
    }
}

bool json_is_integer(const nlohmann::json& j) {
    if (j.is_number_integer()) return true;
    if (!j.is_number_float()) return false;
    const double v = j.get<double>();
    return std::isfinite(v) && std::floor(v) == v;
}

namespace {

std::string type_of(const nlohmann::json& j) {
    if (j.is_number_integer()) return "integer";
    if (j.is_number_float()) return "number";
    return j.type_name();  // null, boolean, string, array, object
}

}  // namespace

std::string describe_json_value(const nlohmann::json& j) {
    std::string text = j.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return fmt::format("{} {}", type_of(j), text);
}

namespace {

const std::set<std::string, std::less<>> kTypeNames = {"null", "boolean", "string", "array", "object", "number", "integer"};
// Keywords that assert nothing: skipped by the validator (and by the check).
const std::set<std::string, std::less<>> kAnnotations = {"$schema", "$id",         "$comment", "title",
                                                         "description", "default", "examples"};
// Keywords whose value is an object of schemas that only a $ref reaches.
const std::set<std::string, std::less<>> kContainers = {"$defs", "definitions"};

// `t` is one of kTypeNames (the schema check refuses any other).
bool has_type(const nlohmann::json& j, const std::string& t) {
    if (t == "null") return j.is_null();
    if (t == "boolean") return j.is_boolean();
    if (t == "string") return j.is_string();
    if (t == "array") return j.is_array();
    if (t == "object") return j.is_object();
    if (t == "number") return j.is_number();
    return json_is_integer(j);
}

// <0, 0, >0 like a <=> b. Two integers compare exactly: as doubles, 2^53 + 1
// and 2^53 would be equal and a uint64 seed bound would be off by one.
int compare_numbers(const nlohmann::json& a, const nlohmann::json& b) {
    const auto sign = [](auto x, auto y) { return (x > y) - (x < y); };
    if (a.is_number_integer() && b.is_number_integer()) {
        const bool a_neg = !a.is_number_unsigned() && a.get<std::int64_t>() < 0;
        const bool b_neg = !b.is_number_unsigned() && b.get<std::int64_t>() < 0;
        if (a_neg != b_neg) return a_neg ? -1 : 1;
        if (a_neg) return sign(a.get<std::int64_t>(), b.get<std::int64_t>());
        return sign(a.get<std::uint64_t>(), b.get<std::uint64_t>());
    }
    return sign(a.get<double>(), b.get<double>());  // JSON has no NaN
}

std::string article(const std::string& type) {
    return (type == "integer" || type == "array" || type == "object") ? "an " + type : "a " + type;
}

// nlohmann has already checked that strings are valid UTF-8, so counting the
// bytes that do not continue a sequence counts code points.
std::size_t utf8_length(const std::string& s) {
    std::size_t n = 0;
    for (const char c : s)
        if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
    return n;
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

class SchemaWalker {
public:
    SchemaWalker(const nlohmann::json& root, std::vector<SchemaViolation>& out) : root_(root), out_(out) {}

    // Refuse, before validating anything, every keyword this validator does
    // not implement and every malformed value of one it does — anywhere in
    // the schema, not just where some document happens to lead.
    void check(const nlohmann::json& schema, const std::string& where) {
        if (schema.is_boolean()) return;
        if (!schema.is_object()) refuse(where, fmt::format("a schema must be an object or a boolean, got {}", describe_json_value(schema)));
        for (const auto& [key, value] : schema.items()) {
            const std::string at = json_pointer_child(where, key);
            if (kAnnotations.count(key) != 0) continue;
            if (kContainers.count(key) != 0 || key == "properties" || key == "patternProperties") {
                if (!value.is_object()) refuse(at, fmt::format("'{}' must be an object of schemas", key));
                for (const auto& [name, sub] : value.items()) {
                    if (key == "patternProperties") regex(name, at);
                    check(sub, json_pointer_child(at, name));
                }
            } else if (key == "additionalProperties") {
                check(value, at);
            } else if (key == "items") {
                // Draft 7's tuple form; 2020-12 calls it prefixItems and
                // reserves items for the one schema of every element.
                if (value.is_array()) refuse(at, "'items' as an array (draft-7 tuple form, 2020-12 prefixItems) is not supported");
                check(value, at);
            } else if (key == "type") {
                const bool list = value.is_array() && !value.empty();
                if (!value.is_string() && !list) refuse(at, "'type' must be a type name or a non-empty array of them");
                for (const auto& t : list ? value : nlohmann::json::array({value}))
                    if (!t.is_string() || kTypeNames.count(t.get_ref<const std::string&>()) == 0)
                        refuse(at, fmt::format("unknown type name {}", t.dump()));
            } else if (key == "enum") {
                if (!value.is_array()) refuse(at, "'enum' must be an array");
            } else if (key == "const") {
                // any value
            } else if (key == "required") {
                if (!value.is_array() || !std::all_of(value.begin(), value.end(), [](const auto& k) { return k.is_string(); }))
                    refuse(at, "'required' must be an array of strings");
            } else if (key == "minItems" || key == "maxItems" || key == "minLength") {
                if (!json_is_integer(value) || value.get<double>() < 0)
                    refuse(at, fmt::format("'{}' must be a non-negative integer, got {}", key, describe_json_value(value)));
            } else if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" || key == "exclusiveMaximum") {
                if (!value.is_number()) refuse(at, fmt::format("'{}' must be a number, got {}", key, describe_json_value(value)));
            } else if (key == "pattern") {
                if (!value.is_string()) refuse(at, "'pattern' must be a string");
                regex(value.get<std::string>(), at);
            } else if (key == "$ref") {
                if (!value.is_string()) refuse(at, "'$ref' must be a string");
                resolve(value.get<std::string>(), at);
            } else {
                refuse(at, fmt::format("keyword '{}' is not supported by kvasir's validator", key));
            }
        }
    }

    void validate(const nlohmann::json& schema, const nlohmann::json& doc, const std::string& path, int depth) {
        KVASIR_CHECK(depth < 64, ErrorCode::internal, "schema: $ref nesting deeper than 64 at {}", path);
        if (schema.is_boolean()) {
            if (!schema.get<bool>()) add(path, "not allowed here");
            return;
        }
        if (schema.contains("$ref")) validate(resolve(schema["$ref"].get<std::string>(), "$ref"), doc, path, depth + 1);

        if (schema.contains("type")) {
            std::vector<std::string> types;
            if (schema["type"].is_string())
                types.push_back(schema["type"].get<std::string>());
            else
                for (const auto& t : schema["type"]) types.push_back(t.get<std::string>());
            const bool ok = std::any_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(doc, t); });
            if (!ok) {
                std::string want;
                for (std::size_t i = 0; i < types.size(); ++i)
                    want += (i == 0 ? "" : i + 1 == types.size() ? " or " : ", ") + article(types[i]);
                add(path, fmt::format("expected {}, got {}", want, describe_json_value(doc)));
                return;  // the remaining keywords would only repeat the type error
            }
        }
        // nlohmann's == is JSON Schema's equality: 1 == 1.0, objects ignore
        // key order, false != 0.
        if (schema.contains("enum")) {
            const auto& options = schema["enum"];
            if (std::find(options.begin(), options.end(), doc) == options.end())
                add(path, fmt::format("{} is not one of {}", doc.dump(), options.dump()));
        }
        if (schema.contains("const") && doc != schema["const"])
            add(path, fmt::format("expected {}, got {}", schema["const"].dump(), doc.dump()));

        if (doc.is_number()) numeric(schema, doc, path);
        if (doc.is_string()) string(schema, doc.get<std::string>(), path);
        if (doc.is_array()) array(schema, doc, path, depth);
        if (doc.is_object()) object(schema, doc, path, depth);
    }

private:
    [[noreturn]] static void refuse(const std::string& where, const std::string& problem) {
        fail(ErrorCode::internal, "schema: {}: {}", where.empty() ? "/" : where, problem);
    }

    void add(const std::string& path, std::string message) { out_.push_back({path, std::move(message)}); }

    // "#/$defs/a%25b" → the subschema at JSON pointer "/$defs/a%b": the part
    // after '#' is a URI fragment, so %-escapes are decoded before the
    // pointer's own ~0 / ~1 escapes.
    const nlohmann::json& resolve(const std::string& ref, const std::string& where) {
        if (ref.empty() || ref[0] != '#')
            refuse(where, fmt::format("only a local $ref (\"#...\") is supported, not '{}'", ref));
        std::string pointer;
        for (std::size_t i = 1; i < ref.size(); ++i) {
            if (ref[i] != '%') {
                pointer += ref[i];
                continue;
            }
            const int hi = i + 2 < ref.size() ? hex_digit(ref[i + 1]) : -1;
            const int lo = i + 2 < ref.size() ? hex_digit(ref[i + 2]) : -1;
            if (hi < 0 || lo < 0) refuse(where, fmt::format("$ref '{}' has a malformed %-escape", ref));
            pointer += static_cast<char>(hi * 16 + lo);
            i += 2;
        }
        try {
            const nlohmann::json::json_pointer ptr(pointer);
            if (root_.contains(ptr)) return root_.at(ptr);
        } catch (const nlohmann::json::exception& e) {
            refuse(where, fmt::format("$ref '{}' is not a JSON pointer: {}", ref, e.what()));
        }
        refuse(where, fmt::format("$ref '{}' points nowhere", ref));
    }

    void numeric(const nlohmann::json& s, const nlohmann::json& doc, const std::string& path) {
        const auto bound = [&](const char* key, auto ok, const char* relation) {
            if (s.contains(key) && !ok(compare_numbers(doc, s[key])))
                add(path, fmt::format("{} is not {} {}", doc.dump(), relation, s[key].dump()));
        };
        bound("minimum", [](int c) { return c >= 0; }, ">=");
        bound("maximum", [](int c) { return c <= 0; }, "<=");
        bound("exclusiveMinimum", [](int c) { return c > 0; }, ">");
        bound("exclusiveMaximum", [](int c) { return c < 0; }, "<");
    }

    void string(const nlohmann::json& s, const std::string& v, const std::string& path) {
        if (s.contains("minLength") && utf8_length(v) < s["minLength"].get<std::size_t>())
            add(path, fmt::format("string shorter than {} characters", s["minLength"].get<std::size_t>()));
        if (s.contains("pattern")) {
            const std::string& pat = s["pattern"].get_ref<const std::string&>();
            if (!std::regex_search(v, regex(pat, "pattern")))
                add(path, fmt::format("\"{}\" does not match the pattern {}", v.size() > 60 ? v.substr(0, 57) + "..." : v, pat));
        }
    }

    void array(const nlohmann::json& s, const nlohmann::json& doc, const std::string& path, int depth) {
        if (s.contains("minItems") && doc.size() < s["minItems"].get<std::size_t>())
            add(path, fmt::format("expected at least {} items, got {}", s["minItems"].get<std::size_t>(), doc.size()));
        if (s.contains("maxItems") && doc.size() > s["maxItems"].get<std::size_t>())
            add(path, fmt::format("expected at most {} items, got {}", s["maxItems"].get<std::size_t>(), doc.size()));
        if (s.contains("items"))
            for (std::size_t i = 0; i < doc.size(); ++i) validate(s["items"], doc[i], json_pointer_child(path, i), depth + 1);
    }

    void object(const nlohmann::json& s, const nlohmann::json& doc, const std::string& path, int depth) {
        if (s.contains("required"))
            for (const auto& key : s["required"])
                if (!doc.contains(key.get<std::string>()))
                    add(path, fmt::format("missing key '{}'", key.get<std::string>()));
        for (const auto& [key, value] : doc.items()) {
            const std::string child = json_pointer_child(path, key);
            bool matched = false;
            if (s.contains("properties") && s["properties"].contains(key)) {
                matched = true;
                validate(s["properties"][key], value, child, depth + 1);
            }
            if (s.contains("patternProperties"))
                for (const auto& [pat, sub] : s["patternProperties"].items())
                    if (std::regex_search(key, regex(pat, "patternProperties"))) {
                        matched = true;
                        validate(sub, value, child, depth + 1);
                    }
            if (matched || !s.contains("additionalProperties")) continue;
            const auto& extra = s["additionalProperties"];
            if (extra.is_boolean() && !extra.get<bool>())
                add(child, "unknown key");
            else
                validate(extra, value, child, depth + 1);
        }
    }

    const std::regex& regex(const std::string& pattern, const std::string& where) {
        auto it = regexes_.find(pattern);
        if (it == regexes_.end()) {
            try {
                it = regexes_.emplace(pattern, std::make_unique<std::regex>(pattern, std::regex::ECMAScript)).first;
            } catch (const std::regex_error& e) {
                refuse(where, fmt::format("invalid pattern '{}': {}", pattern, e.what()));
            }
        }
        return *it->second;
    }

    const nlohmann::json& root_;
    std::vector<SchemaViolation>& out_;
    std::map<std::string, std::unique_ptr<std::regex>> regexes_;
};

}  // namespace

std::vector<SchemaViolation> schema_violations(const nlohmann::json& schema, const nlohmann::json& doc) {
    std::vector<SchemaViolation> out;
    SchemaWalker walker(schema, out);
    walker.check(schema, "");
    walker.validate(schema, doc, "", 0);
    return out;
}

void validate_against_schema(const nlohmann::json& schema, const nlohmann::json& doc, const std::string& source) {
    const auto v = schema_violations(schema, doc);
    if (!v.empty()) fail(ErrorCode::bad_input, "{}: {}: {}", source, v.front().path.empty() ? "/" : v.front().path, v.front().message);
}

}  // namespace kvasir
