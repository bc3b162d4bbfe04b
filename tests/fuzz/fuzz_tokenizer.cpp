// libFuzzer target for the tokenizer.json parser and the encoder behind it:
// the input is a tokenizer.json, optionally followed by a NUL byte and a text
// to encode. Any input either parses or throws kvasir::Error; a parsed
// tokenizer encodes the text (or refuses it as not UTF-8), every id it gives
// decodes, and every offset lies inside the text — never a crash.
#include "kvasir/core/error.hpp"
#include "kvasir/model/tokenizer.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view all(reinterpret_cast<const char*>(data), size);
    const std::size_t nul = all.find('\0');
    const std::string_view json = all.substr(0, nul);
    const std::string_view text = nul == std::string_view::npos ? std::string_view("Hello, world! 日本語 🙂\n  x") : all.substr(nul + 1);
    try {
        const kvasir::Tokenizer t = kvasir::Tokenizer::parse(json, "fuzz/tokenizer.json");
        (void)t.describe();
        try {
            const auto spans = t.encode_spans(text);
            std::vector<std::int32_t> ids;
            for (const auto& s : spans) {
                if (s.begin > s.end || s.end > text.size()) std::abort();
                ids.push_back(s.id);
            }
            (void)t.decode(ids);
            (void)t.decode(ids, true);
        } catch (const kvasir::Error&) {
        }
    } catch (const kvasir::Error&) {
    }
    return 0;
}
