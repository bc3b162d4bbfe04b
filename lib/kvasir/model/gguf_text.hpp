// Internal to the GGUF reader and the llama.cpp naming (not a public API):
// how both echo names from an untrusted file in their one-line messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvasir::gguf_detail {

// A name from the file made safe for a one-line message: printable ASCII kept,
// everything else as \xNN, long names cut.
std::string printable(std::string_view s, std::size_t max_len = 80);

}  // namespace kvasir::gguf_detail
