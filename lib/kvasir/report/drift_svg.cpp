// drift_svg (drift_svg.hpp): log-log axes, one polyline per node, the √L
// and L guides and the legend.
#include "kvasir/report/drift_svg.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/report/writers_common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace kvasir {

using namespace writers_detail;

namespace {

// The plot's geometry and log-log scales: depth on x (1 … depth), ‖Δh‖/‖h‖
// on y (whole decades around the positive finite values), the guides'
// anchor (the geometric mean of the depth-1 values).
struct Frame {
    double left = 80, top = 50, pw = 560, ph = 360, bottom_pad = 60;
    double width = 0, height = 0, legend_x = 0;
    std::size_t depth = 1;
    bool have_data = false;
    int anchors = 0;
    double anchor = 0, x_max = 0, y_lo = -8, y_hi = 0;

    explicit Frame(const std::vector<DriftSeries>& series) {
        std::size_t longest = 10;
        for (const auto& s : series) longest = std::max(longest, s.node.size());
        // Wide enough for the longest legend entry and the guides' note.
        const double legend_w = std::max(60 + 6.6 * static_cast<double>(longest + 14), 330.0);
        width = left + pw + 30 + legend_w;
        height = top + ph + bottom_pad;
        legend_x = left + pw + 30;
        double lo = std::numeric_limits<double>::infinity(), hi = -lo;
        for (const auto& s : series) {
            depth = std::max(depth, s.rel.size());
            for (const double v : s.rel)
                if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
        }
        double log_sum = 0;
        for (const auto& s : series)
            if (!s.rel.empty() && std::isfinite(s.rel[0]) && s.rel[0] > 0) log_sum += std::log10(s.rel[0]), ++anchors;
        have_data = std::isfinite(lo);
        anchor = anchors > 0 ? std::pow(10.0, log_sum / anchors) : 0;
        x_max = std::log10(static_cast<double>(std::max<std::size_t>(depth, 2)));
        if (anchors > 0) hi = std::max(hi, anchor * static_cast<double>(std::max<std::size_t>(depth, 2)));  // room for the L guide
        y_lo = have_data ? std::floor(std::log10(lo)) : -8;
        y_hi = have_data ? std::max(std::ceil(std::log10(hi)), y_lo + 1) : 0;
    }
    double px(double depth_l) const { return left + pw * std::log10(depth_l) / x_max; }
    double py(double v) const { return top + ph * (y_hi - std::log10(v)) / (y_hi - y_lo); }
};

// The canvas, the title, the plot's clip and border.
void open_plot(std::string& o, const Frame& f) {
    o += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
        num(f.width), num(f.height), num(f.width), num(f.height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(f.width), num(f.height));
    o += "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">residual-stream drift vs depth (log-log)</text>\n";
    o += fmt::format("<defs><clipPath id=\"plot\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath></defs>\n", num(f.left),
                     num(f.top), num(f.pw), num(f.ph));
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n", num(f.left), num(f.top),
                     num(f.pw), num(f.ph));
}

// Gridlines and tick labels of both axes, and the axis titles.
void axes(std::string& o, const Frame& f) {
    // y: one gridline per decade (every other decade when there are many).
    const int y_step = (f.y_hi - f.y_lo) > 10 ? 2 : 1;
    for (int e = static_cast<int>(f.y_lo); e <= static_cast<int>(f.y_hi); e += y_step) {
        const double y = f.py(std::pow(10.0, e));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(f.left), num(y), num(f.left + f.pw), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{}</text>\n", num(f.left - 6), num(y + 4), e);
    }
    // x: every depth up to 12, then 1-2-5 per decade.
    std::vector<std::size_t> xt;
    if (f.depth <= 12) {
        for (std::size_t l = 1; l <= std::max<std::size_t>(f.depth, 2); ++l) xt.push_back(l);
    } else {
        for (std::size_t dec = 1; dec <= f.depth; dec *= 10)
            for (const std::size_t k : {1, 2, 5})
                if (k * dec <= f.depth) xt.push_back(k * dec);
        if (xt.back() != f.depth) xt.push_back(f.depth);
    }
    for (const std::size_t l : xt) {
        const double x = f.px(static_cast<double>(l));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(x), num(f.top), num(x), num(f.top + f.ph));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(x), num(f.top + f.ph + 16), l);
    }
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">depth L (layers)</text>\n", num(f.left + f.pw / 2),
                     num(f.top + f.ph + 38));
    o += fmt::format("<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">‖Δh‖ / ‖h‖</text>\n",
                     num(f.top + f.ph / 2), num(f.top + f.ph / 2));
}

// The √L and L guides through the anchor, each labelled at its end.
void guides(std::string& o, const Frame& f) {
    const double l_end = static_cast<double>(std::max<std::size_t>(f.depth, 2));
    const std::array<std::pair<double, const char*>, 2> lines = {{{0.5, "∝ √L"}, {1.0, "∝ L"}}};
    for (const auto& [power, label] : lines) {
        std::string pts;
        for (int i = 0; i <= 32; ++i) {
            const double l = std::pow(l_end, i / 32.0);
            pts += fmt::format("{},{} ", num(f.px(l)), num(f.py(f.anchor * std::pow(l, power))));
        }
        o += fmt::format("<polyline class=\"guide\" points=\"{}\" fill=\"none\" stroke=\"#888888\" stroke-width=\"1.2\" "
                         "stroke-dasharray=\"{}\" clip-path=\"url(#plot)\"/>\n",
                         pts, power < 1 ? "6,4" : "2,3");
        const double ly = std::clamp(f.py(f.anchor * std::pow(l_end, power)), f.top + 10, f.top + f.ph - 4);
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#666666\">{}</text>\n", num(f.left + f.pw - 4),
                         num(ly - 4), label);
    }
}

// One node's polylines (broken where a value cannot sit on a log axis), its
// points, and its legend entry at legend_y. style == nullptr: `colour`, a
// dot on every point; else its marker on about 16 points.
void series_line(std::string& o, const Frame& f, const DriftSeries& s, const char* colour, const std::size_t* style,
                 double legend_y) {
    const std::size_t every = !style || s.rel.size() <= 24 ? 1 : (s.rel.size() + 15) / 16;
    std::string pts, dots;
    std::size_t plotted = 0;
    const auto flush = [&]() {
        if (plotted > 1) o += fmt::format("<polyline class=\"series\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, colour);
        pts.clear();
        plotted = 0;
    };
    bool any = false;
    for (std::size_t l = 0; l < s.rel.size(); ++l) {
        const double v = s.rel[l];
        if (!(std::isfinite(v) && v > 0)) {
            flush();
            continue;
        }
        any = true;
        const double x = f.px(static_cast<double>(l + 1)), y = f.py(v);
        pts += fmt::format("{},{} ", num(x), num(y));
        ++plotted;
        if (!style)
            dots += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"><title>{} L{}: {}</title></circle>", num(x), num(y), colour,
                                xml_escape(s.node), l + 1, shortest(v));
        else if (l % every == 0 || l + 1 == s.rel.size())
            dots += marker_svg(series_marker(*style), x, y, 3.5, colour, fmt::format("{} L{}: {}", s.node, l + 1, shortest(v)));
    }
    flush();
    o += dots + "\n";
    const std::string alpha = std::isfinite(s.alpha) ? fmt::format("α = {:.2f}", s.alpha) : "α = " + shortest(s.alpha);
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>", num(f.legend_x), num(legend_y),
                     num(f.legend_x + 22), num(legend_y), colour);
    if (style) o += marker_svg(series_marker(*style), f.legend_x + 11, legend_y, 3.5, colour);
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}  {}{}</text>\n", num(f.legend_x + 28), num(legend_y + 4), xml_escape(s.node), alpha,
                     any ? "" : " (identical: no drift)");
}

// style == nullptr: the classic palette, a dot on every point; else series i
// in series_colour(style[i]) with marker series_marker(style[i]) on about
// 16 points (every point up to 24 layers).
std::string drift_plot(const std::vector<DriftSeries>& series, const std::vector<std::size_t>* style) {
    static const std::array<const char*, 10> palette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    const Frame f(series);
    std::string o;
    open_plot(o, f);
    axes(o, f);
    if (f.anchors > 0) guides(o, f);
    double legend_y = f.top + 8;
    for (std::size_t i = 0; i < series.size(); ++i) {
        const char* colour = style ? series_colour((*style)[i]) : palette[i % palette.size()];
        series_line(o, f, series[i], colour, style ? &(*style)[i] : nullptr, legend_y);
        legend_y += 18;
    }
    if (f.anchors > 0) {
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#666666\">guides through the mean depth-1 drift:</text>\n", num(f.legend_x),
                         num(legend_y + 12));
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#666666\">dashed ∝ √L (incoherent), dotted ∝ L (coherent)</text>\n",
                         num(f.legend_x), num(legend_y + 28));
    }
    if (!f.have_data)
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666666\">no positive drift to plot</text>\n",
                         num(f.left + f.pw / 2), num(f.top + f.ph / 2));
    o += "</svg>\n";
    return o;
}

}  // namespace

std::string drift_svg(const std::vector<DriftSeries>& series) { return drift_plot(series, nullptr); }

std::string drift_svg(const std::vector<DriftSeries>& series, const std::vector<std::size_t>& style) {
    KVASIR_CHECK(style.size() == series.size(), ErrorCode::internal, "drift plot: {} styles for {} series", style.size(), series.size());
    return drift_plot(series, &style);
}

}  // namespace kvasir
