// heatmap_svg (heatmap_svg.hpp): the colour ramp, the grid of cells and
// the colour bar.
#include "kvasir/report/heatmap_svg.hpp"

#include "kvasir/report/text.hpp"
#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

namespace kvasir {

using namespace writers_detail;

namespace {

struct Rgb {
    double r, g, b;
};

// Sequential ramp green → pale yellow → orange → red over s ∈ [0, 1].
Rgb ramp(double s) {
    static const std::array<std::pair<double, Rgb>, 4> stops = {{{0.0, {26, 150, 65}},
                                                                  {0.5, {255, 255, 191}},
                                                                  {0.75, {253, 174, 97}},
                                                                  {1.0, {215, 25, 28}}}};
    s = std::clamp(s, 0.0, 1.0);
    for (std::size_t i = 1; i < stops.size(); ++i)
        if (s <= stops[i].first) {
            const double t = (s - stops[i - 1].first) / (stops[i].first - stops[i - 1].first);
            const Rgb& a = stops[i - 1].second;
            const Rgb& b = stops[i].second;
            return {a.r + t * (b.r - a.r), a.g + t * (b.g - a.g), a.b + t * (b.b - a.b)};
        }
    return stops.back().second;
}

std::string hex(const Rgb& c) {
    return fmt::format("#{:02x}{:02x}{:02x}", static_cast<int>(std::lround(c.r)), static_cast<int>(std::lround(c.g)),
                       static_cast<int>(std::lround(c.b)));
}

// Readable text colour over a fill (relative luminance, sRGB weights).
const char* ink(const Rgb& c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b > 140 ? "#000000" : "#ffffff"; }

constexpr double kLogFloor = -16;  // 1 − cos below 1e-16 is f64 round-off: drawn as "identical"

// log10(1 − cos) mapped to [0, 1].
double heat(double cosine) {
    const double d = 1.0 - cosine;
    const double t = d <= 0 ? kLogFloor : std::clamp(std::log10(d), kLogFloor, 0.0);
    return (t - kLogFloor) / -kLogFloor;
}

}  // namespace

std::string heatmap_svg(const PairMatrix& m) {
    check_matrix(m);
    const std::size_t n = m.nodes.size();
    const double cw = 118, ch = 46;  // cell size
    std::size_t longest = 4;
    for (const auto& s : m.nodes) longest = std::max(longest, s.size());
    const double char_w = 6.6;  // 11px monospace
    const double left = 20 + char_w * static_cast<double>(longest);
    const double top = 70 + 0.72 * char_w * static_cast<double>(longest);  // column labels rotated −45°
    const double grid_w = cw * static_cast<double>(n), grid_h = ch * static_cast<double>(n);
    const double bar_x = left + grid_w + 30, bar_h = std::max(160.0, grid_h), bar_w = 16;
    const double width = bar_x + bar_w + 90, height = std::max(top + grid_h, top + bar_h) + 40;

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\" font-size=\"11\">\n",
        num(width), num(height), num(width), num(height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(width), num(height));
    o += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">cosine of backend pairs — {}</text>\n",
                     xml_escape(m.name));
    o += fmt::format("<text x=\"10\" y=\"38\" fill=\"#444444\">{}</text>\n", xml_escape(m.description));
    o += "<text x=\"10\" y=\"54\" fill=\"#444444\">rows: reference, columns: candidate; colour: log10(1 − cosine)</text>\n";

    for (std::size_t b = 0; b < n; ++b) {
        const double x = left + cw * (static_cast<double>(b) + 0.5);
        o += fmt::format("<text class=\"col-label\" x=\"{}\" y=\"{}\" transform=\"rotate(-45 {} {})\">{}</text>\n", num(x),
                         num(top - 8), num(x), num(top - 8), xml_escape(m.nodes[b]));
    }
    for (std::size_t a = 0; a < n; ++a) {
        const double y = top + ch * static_cast<double>(a);
        o += fmt::format("<text class=\"row-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(left - 8),
                         num(y + ch / 2 + 4), xml_escape(m.nodes[a]));
        for (std::size_t b = 0; b < n; ++b) {
            const double x = left + cw * static_cast<double>(b);
            const double cx = x + cw / 2;
            if (a == b) {
                o += fmt::format("<rect class=\"diag\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f0f0f0\" stroke=\"#ffffff\"/>\n",
                                 num(x), num(y), num(cw), num(ch));
                o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#999999\">—</text>\n", num(cx), num(y + ch / 2 + 4));
                continue;
            }
            const auto& c = m.cosine[a][b];
            const auto& d = m.max_abs[a][b];
            Rgb fill{200, 200, 200};
            std::string line1 = "not measured", line2;
            if (c && !std::isnan(*c)) {
                fill = ramp(heat(*c));
                line1 = fmt_cosine(*c);
                line2 = d ? "max|Δ| " + fmt_sci(*d) : "";
            } else if (c) {
                line1 = "nan";
            }
            o += fmt::format("<rect class=\"cell\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\">"
                             "<title>{} vs {}: cosine {}, max|Δ| {}</title></rect>\n",
                             num(x), num(y), num(cw), num(ch), hex(fill), xml_escape(m.nodes[b]), xml_escape(m.nodes[a]),
                             c ? shortest(*c) : "not measured", d ? shortest(*d) : "not measured");
            o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n", num(cx),
                             num(y + (line2.empty() ? ch / 2 + 4 : ch / 2 - 3)), ink(fill), xml_escape(line1));
            if (!line2.empty())
                o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{}\">{}</text>\n", num(cx),
                                 num(y + ch / 2 + 11), ink(fill), xml_escape(line2));
        }
    }

    // Colour bar: 1 − cos from 1 (top, red) down to 1e-16 (bottom, green).
    o += "<defs><linearGradient id=\"heat\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
    for (int i = 0; i <= 16; ++i) {
        const double s = i / 16.0;
        o += fmt::format("<stop offset=\"{}\" stop-color=\"{}\"/>", num(s), hex(ramp(s)));
    }
    o += "</linearGradient></defs>\n";
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#heat)\" stroke=\"#666666\"/>\n", num(bar_x),
                     num(top), num(bar_w), num(bar_h));
    o += fmt::format("<text x=\"{}\" y=\"{}\">1 − cos</text>\n", num(bar_x - 10), num(top - 8));
    for (int e = 0; e >= -16; e -= 4) {
        const double y = top + bar_h * (static_cast<double>(-e) / 16.0);
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#666666\"/>", num(bar_x + bar_w), num(y),
                         num(bar_x + bar_w + 4), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(bar_x + bar_w + 7), num(y + 4),
                         e == 0 ? std::string("1") : fmt::format("1e{}", e));
    }
    o += "</svg>\n";
    return o;
}

}  // namespace kvasir
