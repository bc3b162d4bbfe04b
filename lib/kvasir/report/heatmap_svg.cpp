// heatmap_svg and pair_heatmap_svg (heatmap_svg.hpp): the colour ramps, the
// grid of cells both draw, and their colour bars.
#include "kvasir/report/heatmap_svg.hpp"

#include "kvasir/report/text.hpp"
#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

namespace kvasir {

using namespace writers_detail;

namespace {

struct Rgb {
    double r, g, b;
};

template <std::size_t N>
Rgb interpolate(const std::array<std::pair<double, Rgb>, N>& stops, double s) {
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

// Sequential ramp green → pale yellow → orange → red over s ∈ [0, 1].
Rgb ramp(double s) {
    static const std::array<std::pair<double, Rgb>, 4> stops = {{{0.0, {26, 150, 65}},
                                                                  {0.5, {255, 255, 191}},
                                                                  {0.75, {253, 174, 97}},
                                                                  {1.0, {215, 25, 28}}}};
    return interpolate(stops, s);
}

// Viridis (matplotlib's, sampled at ninths) reversed: s = 0 light yellow,
// s = 1 dark purple — lightness falls monotonically, so darker is always
// "more different", in colour, for colour-blind readers and in grey print.
Rgb viridis_reversed(double s) {
    static const std::array<std::pair<double, Rgb>, 9> stops = {{{0.0, {253, 231, 37}},
                                                                  {0.125, {173, 220, 48}},
                                                                  {0.25, {94, 201, 98}},
                                                                  {0.375, {40, 174, 128}},
                                                                  {0.5, {33, 145, 140}},
                                                                  {0.625, {44, 114, 142}},
                                                                  {0.75, {59, 82, 139}},
                                                                  {0.875, {71, 44, 122}},
                                                                  {1.0, {68, 1, 84}}}};
    return interpolate(stops, s);
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

// One off-diagonal cell: its fill, one or two lines of text, its tooltip.
struct Cell {
    Rgb fill{200, 200, 200};
    std::string line1, line2, title;
};

struct Grid {
    double left = 0, top = 0, cw = 0, ch = 0;
    // Each pair once: rows 0 … n−2, columns 1 … n−1, cells above the
    // diagonal only (for metrics symmetric in the pair), in lighter markup
    // (a 1 px white gap instead of a stroke, text centred by one group).
    bool upper = false;
};

// The labels and cells both heatmaps draw: column labels rotated −45° above
// the grid, row labels right-aligned on its left, the diagonal, and every
// off-diagonal cell as cell(a, b) describes it.
void draw_grid(std::string& o, const PairMatrix& m, const Grid& g, const std::function<Cell(std::size_t, std::size_t)>& cell) {
    const std::size_t n = m.nodes.size();
    const double left = g.left, top = g.top, cw = g.cw, ch = g.ch;
    if (g.upper) {
        for (std::size_t b = 1; b < n; ++b) {
            const double x = left + cw * (static_cast<double>(b - 1) + 0.5);
            o += fmt::format("<text class=\"col-label\" x=\"{}\" y=\"{}\" transform=\"rotate(-45 {} {})\">{}</text>\n", num(x),
                             num(top - 8), num(x), num(top - 8), xml_escape(m.nodes[b]));
        }
        for (std::size_t a = 0; a + 1 < n; ++a)
            o += fmt::format("<text class=\"row-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(left - 8),
                             num(top + ch * static_cast<double>(a) + ch / 2 + 4), xml_escape(m.nodes[a]));
        // Whole pixels here (the caller picks integer sizes): shorter numbers in
        // the markup that dominates a large page.
        const auto px = [](double v) { return fmt::format("{}", std::lround(v)); };
        o += "<g text-anchor=\"middle\">\n";
        for (std::size_t a = 0; a + 1 < n; ++a)
            for (std::size_t b = a + 1; b < n; ++b) {
                const double x = left + cw * static_cast<double>(b - 1), y = top + ch * static_cast<double>(a);
                const Cell c = cell(a, b);
                const char* colour = ink(c.fill);
                o += fmt::format("<rect class=\"cell\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}</title></rect>"
                                 "<text x=\"{}\" y=\"{}\"{}>{}</text>\n",
                                 px(x), px(y), px(cw - 1), px(ch - 1), hex(c.fill), xml_escape(c.title), px(x + cw / 2),
                                 px(y + ch / 2 + 3), colour[1] == 'f' ? " fill=\"#ffffff\"" : "", xml_escape(c.line1));
            }
        o += "</g>\n";
        return;
    }
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
            const Cell c = cell(a, b);
            o += fmt::format("<rect class=\"cell\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\">"
                             "<title>{}</title></rect>\n",
                             num(x), num(y), num(cw), num(ch), hex(c.fill), xml_escape(c.title));
            o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n", num(cx),
                             num(y + (c.line2.empty() ? ch / 2 + 4 : ch / 2 - 3)), ink(c.fill), xml_escape(c.line1));
            if (!c.line2.empty())
                o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{}\">{}</text>\n", num(cx),
                                 num(y + ch / 2 + 11), ink(c.fill), xml_escape(c.line2));
        }
    }
}

std::size_t longest_label(const PairMatrix& m) {
    std::size_t longest = 4;
    for (const auto& s : m.nodes) longest = std::max(longest, s.size());
    return longest;
}

}  // namespace

std::string heatmap_svg(const PairMatrix& m) {
    check_matrix(m);
    const std::size_t n = m.nodes.size();
    const double cw = 118, ch = 46;  // cell size
    const std::size_t longest = longest_label(m);
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

    draw_grid(o, m, {left, top, cw, ch}, [&](std::size_t a, std::size_t b) {
        const auto& c = m.cosine[a][b];
        const auto& d = m.max_abs[a][b];
        Cell cell;
        cell.line1 = "not measured";
        if (c && !std::isnan(*c)) {
            cell.fill = ramp(heat(*c));
            cell.line1 = fmt_cosine(*c);
            cell.line2 = d ? "max|Δ| " + fmt_sci(*d) : "";
        } else if (c) {
            cell.line1 = "nan";
        }
        cell.title = fmt::format("{} vs {}: cosine {}, max|Δ| {}", m.nodes[b], m.nodes[a], c ? shortest(*c) : "not measured",
                                 d ? shortest(*d) : "not measured");
        return cell;
    });

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

std::string pair_heatmap_svg(const PairMatrix& m, PairMetric metric) {
    check_matrix(m);
    const std::size_t n = m.nodes.size();
    const bool cosine = metric == PairMetric::one_minus_cosine;
    // The value a cell shows: max|Δ|, or 1 − cos (≤ 0: identical).
    const auto value = [&](std::size_t a, std::size_t b) -> std::optional<double> {
        if (cosine) {
            const auto& c = m.cosine[a][b];
            if (!c) return std::nullopt;
            return std::isnan(*c) ? *c : std::max(0.0, 1.0 - *c);
        }
        return m.max_abs[a][b];
    };
    // Colour scale, in decades: 1 − cos on the fixed 1e-16 … 1 (f64
    // round-off to orthogonal); max|Δ| over the decades the matrix spans.
    int lo = static_cast<int>(kLogFloor), hi = 0;
    if (!cosine) {
        double vmin = std::numeric_limits<double>::infinity(), vmax = 0;
        for (std::size_t a = 0; a < n; ++a)
            for (std::size_t b = a + 1; b < n; ++b)
                if (const auto v = value(a, b); v && std::isfinite(*v) && *v > 0) vmin = std::min(vmin, *v), vmax = std::max(vmax, *v);
        if (vmax > 0) {
            lo = static_cast<int>(std::floor(std::log10(vmin)));
            hi = std::max(static_cast<int>(std::ceil(std::log10(vmax))), lo + 1);
        }
    }
    const auto scale = [&](double v) { return v <= 0 ? 0.0 : std::clamp((std::log10(v) - lo) / (hi - lo), 0.0, 1.0); };

    const double cw = 58, ch = 22, char_w = 6.0;  // 10px monospace
    const std::size_t longest = longest_label(m);
    const double label_rise = 0.72 * char_w * static_cast<double>(longest);  // column labels rotated −45°
    const double left = std::round(14 + char_w * static_cast<double>(longest)), top = std::round(34 + label_rise);
    const double cells = static_cast<double>(n > 0 ? n - 1 : 0);  // each pair once
    const double grid_w = cw * cells, grid_h = ch * cells;
    const int decades = hi - lo;
    const double block = std::clamp(150.0 / decades, 8.0, 18.0), bar_w = 14;
    const double bar_x = left + grid_w + 24, bar_h = block * decades;
    const double width = std::max(bar_x + bar_w + 56, left + grid_w + label_rise + 8);
    const double height = std::max(top + grid_h, top + bar_h + 20) + 8;

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\" font-size=\"10\">\n",
        num(width), num(height), num(width), num(height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(width), num(height));
    o += fmt::format("<text x=\"4\" y=\"14\" font-size=\"12\" font-weight=\"bold\">{} — {}</text>\n", cosine ? "1 − cosine" : "max|Δ|",
                     xml_escape(m.name));

    draw_grid(o, m, {left, top, cw, ch, true}, [&](std::size_t a, std::size_t b) {
        const auto v = value(a, b);
        Cell cell;
        if (!v) {
            cell.line1 = "n/a";
            cell.title = fmt::format("{} vs {}: not measured", m.nodes[b], m.nodes[a]);
            return cell;
        }
        if (std::isnan(*v)) {
            cell.fill = {0, 0, 0};
            cell.line1 = "NaN";
        } else {
            cell.fill = viridis_reversed(scale(*v));
            cell.line1 = fmt_sci(*v);
        }
        cell.title = fmt::format("{} vs {}: {}", m.nodes[b], m.nodes[a], shortest(*v));
        return cell;
    });

    // Stepped colour bar, one block per decade, the largest at the top.
    const int step = decades > 8 ? 4 : decades > 4 ? 2 : 1;
    for (int k = 0; k < decades; ++k) {
        const double y = top + block * k;
        o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>", num(bar_x), num(y), num(bar_w), num(block),
                         hex(viridis_reversed((decades - k - 0.5) / decades)));
    }
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#666666\"/>\n", num(bar_x), num(top),
                     num(bar_w), num(bar_h));
    for (int e = hi; e >= lo; --e) {
        if ((hi - e) % step != 0 && e != lo) continue;
        const double y = top + block * (hi - e);
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#666666\"/>", num(bar_x + bar_w), num(y),
                         num(bar_x + bar_w + 3), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(bar_x + bar_w + 5), num(y + 3.5),
                         e == 0 ? std::string("1") : fmt::format("1e{}", e));
    }
    o += fmt::format("<text x=\"{}\" y=\"{}\">log scale</text>\n", num(bar_x - 2), num(top + bar_h + 16));
    o += "</svg>\n";
    return o;
}

}  // namespace kvasir
