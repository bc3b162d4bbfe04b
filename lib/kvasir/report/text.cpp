#include "kvasir/report/text.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace kvasir {

static std::string wrap(bool on, const char* code, const std::string& s) {
    return on ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
}
std::string Style::bold(const std::string& s) const { return wrap(color, "1", s); }
std::string Style::dim(const std::string& s) const { return wrap(color, "2", s); }
std::string Style::red(const std::string& s) const { return wrap(color, "31", s); }
std::string Style::green(const std::string& s) const { return wrap(color, "32", s); }
std::string Style::yellow(const std::string& s) const { return wrap(color, "33", s); }

Style style_for(std::FILE* stream) {
    const char* no_color = std::getenv("NO_COLOR");
    const bool disabled = no_color != nullptr && no_color[0] != '\0';
    return Style{!disabled && ::isatty(::fileno(stream)) != 0};
}

static std::size_t display_width(const std::string& s) {
    std::size_t w = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c == 0x1b) {  // skip an ANSI escape up to its final letter
            while (i < s.size() && !std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
            continue;
        }
        if ((c & 0xc0) != 0x80) ++w;  // count UTF-8 lead bytes only
    }
    return w;
}

TextTable::TextTable(std::vector<std::string> header) : header_(std::move(header)) {}

TextTable& TextTable::left_aligned(std::size_t columns) {
    left_columns_ = std::max<std::size_t>(1, columns);
    return *this;
}

void TextTable::add_row(std::vector<std::string> cells) {
    cells.resize(header_.size());
    rows_.push_back(std::move(cells));
}

std::string TextTable::render(const std::string& indent) const {
    std::vector<std::size_t> width(header_.size(), 0);
    for (std::size_t c = 0; c < header_.size(); ++c) width[c] = display_width(header_[c]);
    for (const auto& row : rows_)
        for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], display_width(row[c]));
    std::string out;
    const auto line = [&](const std::vector<std::string>& row) {
        out += indent;
        for (std::size_t c = 0; c < row.size(); ++c) {
            const std::string pad(width[c] - display_width(row[c]), ' ');
            if (c > 0) out += "  ";
            out += c < left_columns_ ? row[c] + pad : pad + row[c];
        }
        while (!out.empty() && out.back() == ' ') out.pop_back();
        out += '\n';
    };
    line(header_);
    for (const auto& row : rows_) line(row);
    return out;
}

}  // namespace kvasir
