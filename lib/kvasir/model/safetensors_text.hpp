// Internal to the safetensors reader, checkpoint index and writer (not a
// public API): what all three need to word their one-line messages about
// untrusted bytes — escaping names for a message, strict UTF-8 validation,
// nlohmann's parse error text, and the value kinds a SAX handler reports.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace kvasir::safetensors_detail {

// Render bytes from an untrusted file for a one-line message: printable ASCII
// and well-formed UTF-8 pass through; control characters, quotes, backslashes
// and broken UTF-8 become escapes; long text is cut. This keeps the "one line
// naming the file and the problem" contract whatever a tensor is called.
std::string escape(std::string_view s, std::size_t max_bytes = 160);
// escape(s) between single quotes.
std::string q(std::string_view s);

// Index of the first byte that is not part of strict UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos. The same
// acceptance as Rust's str::from_utf8, which the reference applies.
std::size_t utf8_invalid_at(std::string_view s) noexcept;

// nlohmann's parse_error text without its "[json.exception.parse_error.101] "
// prefix, escaped (the "last read" part quotes raw input) and bounded.
std::string json_error_text(const nlohmann::detail::exception& ex);

// The value kinds a SAX handler sees; used to word "X is not Y" errors.
const char* kind_word(int k);
enum Kind { k_null, k_bool, k_negative, k_unsigned, k_float, k_string, k_object, k_array };

}  // namespace kvasir::safetensors_detail
