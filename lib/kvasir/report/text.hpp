// Terminal output: aligned text tables and optional ANSI colour. Colour is on
// only when the stream is a TTY and NO_COLOR is unset (https://no-color.org).
#pragma once

#include "kvasir/core/number_format.hpp"  // fmt_sci, fmt_cosine, fmt_rate

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace kvasir {

struct Style {
    bool color = false;
    std::string bold(const std::string& s) const;
    std::string dim(const std::string& s) const;
    std::string red(const std::string& s) const;
    std::string green(const std::string& s) const;
    std::string yellow(const std::string& s) const;
};

// Colour decision for a stream: isatty && getenv("NO_COLOR") is unset or empty.
Style style_for(std::FILE* stream);

class TextTable {
public:
    explicit TextTable(std::vector<std::string> header);
    void add_row(std::vector<std::string> cells);
    // Left-align the first `columns` columns (default 1: labels left,
    // numbers right).
    TextTable& left_aligned(std::size_t columns);
    // Widths measured in code points with ANSI escapes ignored; trailing
    // spaces trimmed.
    std::string render(const std::string& indent = "") const;

private:
    std::size_t left_columns_ = 1;
    std::vector<std::string> header_;
    std::vector<std::vector<std::string>> rows_;
};

}  // namespace kvasir
