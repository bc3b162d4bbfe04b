// Message helpers shared by the safetensors reader, checkpoint index and
// writer (declared in safetensors_text.hpp).
#include "kvasir/model/safetensors_text.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kvasir::safetensors_detail {

std::string escape(std::string_view s, std::size_t max_bytes) {
    std::string out;
    out.reserve(std::min(s.size(), max_bytes) + 8);
    std::size_t i = 0;
    while (i < s.size()) {
        if (out.size() >= max_bytes) {
            out += "...";
            break;
        }
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f) {
            if (c == '\'' || c == '\\') out += '\\';
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        // A well-formed multi-byte UTF-8 sequence is kept (names may be non-ASCII).
        std::size_t len = 0;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) len = 3;
        else if (c >= 0xF0 && c <= 0xF4) len = 4;
        bool ok = len > 0 && i + len <= s.size();
        for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok) {
            out.append(s.substr(i, len));
            i += len;
        } else {
            out += fmt::format("\\x{:02x}", c);
            ++i;
        }
    }
    return out;
}

std::string q(std::string_view s) { return "'" + escape(s) + "'"; }

std::size_t utf8_invalid_at(std::string_view s) noexcept {
    std::size_t i = 0;
    const std::size_t n = s.size();
    auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    while (i < n) {
        const unsigned c = at(i);
        if (c < 0x80) {
            ++i;
            continue;
        }
        std::size_t len;
        unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) len = 3, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
        else if (c == 0xED) len = 3, hi = 0x9F;
        else if (c == 0xF0) len = 4, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) len = 4, hi = 0x8F;
        else return i;
        if (i + len > n) return i;
        if (at(i + 1) < lo || at(i + 1) > hi) return i;
        for (std::size_t k = 2; k < len; ++k)
            if ((at(i + k) & 0xC0) != 0x80) return i;
        i += len;
    }
    return std::string::npos;
}

std::string json_error_text(const nlohmann::detail::exception& ex) {
    std::string_view w = ex.what();
    if (const auto p = w.find("] "); p != std::string_view::npos && !w.empty() && w.front() == '[') w.remove_prefix(p + 2);
    return escape(w, 200);
}

const char* kind_word(int k) {
    static constexpr const char* words[] = {"null", "a boolean", "a negative number", "an integer",
                                            "a non-integer number", "a string", "an object", "an array"};
    return words[k];
}

}  // namespace kvasir::safetensors_detail
