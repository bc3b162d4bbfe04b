// File output that never leaves a half-written report behind.
#pragma once

#include <string>
#include <string_view>

namespace kvasir {

// Write `content` to `path` atomically: a temporary file in the same folder,
// fsync, rename over `path`, fsync the folder. If anything fails (or the
// process dies midway) `path` keeps its previous content, the temporary file
// is removed where possible, and Error(bad_input) names the path and errno.
void write_file_atomic(const std::string& path, std::string_view content);

// Whole-file read with a size bound; Error(bad_input) naming the path on failure.
std::string read_text_file(const std::string& path, std::size_t max_bytes = 64u << 20);

}  // namespace kvasir
