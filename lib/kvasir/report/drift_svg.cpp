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

// style == nullptr: the classic palette, a dot on every point; else series i
// in series_colour(style[i]) with marker series_marker(style[i]) on about
// 16 points (every point up to 24 layers).
std::string drift_plot(const std::vector<DriftSeries>& series, const std::vector<std::size_t>* style) {
    static const std::array<const char*, 10> palette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    const double left = 80, top = 50, pw = 560, ph = 360, bottom_pad = 60;
    std::size_t longest = 10;
    for (const auto& s : series) longest = std::max(longest, s.node.size());
    // Wide enough for the longest legend entry and the guides' note.
    const double legend_w = std::max(60 + 6.6 * static_cast<double>(longest + 14), 330.0);
    const double width = left + pw + 30 + legend_w, height = top + ph + bottom_pad;

    std::size_t depth = 1;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto& s : series) {
        depth = std::max(depth, s.rel.size());
        for (const double v : s.rel)
            if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    }
    // Guides anchored at the geometric mean of the depth-1 values.
    double log_sum = 0;
    int anchors = 0;
    for (const auto& s : series)
        if (!s.rel.empty() && std::isfinite(s.rel[0]) && s.rel[0] > 0) log_sum += std::log10(s.rel[0]), ++anchors;
    const bool have_data = std::isfinite(lo);
    const double anchor = anchors > 0 ? std::pow(10.0, log_sum / anchors) : 0;
    const double x_max = std::log10(static_cast<double>(std::max<std::size_t>(depth, 2)));
    if (anchors > 0) hi = std::max(hi, anchor * static_cast<double>(std::max<std::size_t>(depth, 2)));  // room for the L guide
    const double y_lo = have_data ? std::floor(std::log10(lo)) : -8, y_hi = have_data ? std::max(std::ceil(std::log10(hi)), y_lo + 1) : 0;
    const auto px = [&](double depth_l) { return left + pw * std::log10(depth_l) / x_max; };
    const auto py = [&](double v) { return top + ph * (y_hi - std::log10(v)) / (y_hi - y_lo); };

    std::string o = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
        num(width), num(height), num(width), num(height));
    o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", num(width), num(height));
    o += "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">residual-stream drift vs depth (log-log)</text>\n";
    o += fmt::format("<defs><clipPath id=\"plot\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath></defs>\n", num(left),
                     num(top), num(pw), num(ph));
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n", num(left), num(top),
                     num(pw), num(ph));

    // y: one gridline per decade (every other decade when there are many).
    const int y_step = (y_hi - y_lo) > 10 ? 2 : 1;
    for (int e = static_cast<int>(y_lo); e <= static_cast<int>(y_hi); e += y_step) {
        const double y = py(std::pow(10.0, e));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(left), num(y), num(left + pw), num(y));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">1e{}</text>\n", num(left - 6), num(y + 4), e);
    }
    // x: every depth up to 12, then 1-2-5 per decade.
    std::vector<std::size_t> xt;
    if (depth <= 12) {
        for (std::size_t l = 1; l <= std::max<std::size_t>(depth, 2); ++l) xt.push_back(l);
    } else {
        for (std::size_t dec = 1; dec <= depth; dec *= 10)
            for (const std::size_t k : {1, 2, 5})
                if (k * dec <= depth) xt.push_back(k * dec);
        if (xt.back() != depth) xt.push_back(depth);
    }
    for (const std::size_t l : xt) {
        const double x = px(static_cast<double>(l));
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e0e0e0\"/>", num(x), num(top), num(x), num(top + ph));
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(x), num(top + ph + 16), l);
    }
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">depth L (layers)</text>\n", num(left + pw / 2), num(top + ph + 38));
    o += fmt::format("<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">‖Δh‖ / ‖h‖</text>\n",
                     num(top + ph / 2), num(top + ph / 2));

    if (anchors > 0) {
        const double l_end = static_cast<double>(std::max<std::size_t>(depth, 2));
        const std::array<std::pair<double, const char*>, 2> guides = {{{0.5, "∝ √L"}, {1.0, "∝ L"}}};
        for (const auto& [power, label] : guides) {
            std::string pts;
            for (int i = 0; i <= 32; ++i) {
                const double l = std::pow(l_end, i / 32.0);
                pts += fmt::format("{},{} ", num(px(l)), num(py(anchor * std::pow(l, power))));
            }
            o += fmt::format("<polyline class=\"guide\" points=\"{}\" fill=\"none\" stroke=\"#888888\" stroke-width=\"1.2\" "
                             "stroke-dasharray=\"{}\" clip-path=\"url(#plot)\"/>\n",
                             pts, power < 1 ? "6,4" : "2,3");
            const double ly = std::clamp(py(anchor * std::pow(l_end, power)), top + 10, top + ph - 4);
            o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#666666\">{}</text>\n", num(left + pw - 4),
                             num(ly - 4), label);
        }
    }

    double legend_y = top + 8;
    const double legend_x = left + pw + 30;
    for (std::size_t i = 0; i < series.size(); ++i) {
        const DriftSeries& s = series[i];
        const char* colour = style ? series_colour((*style)[i]) : palette[i % palette.size()];
        const std::size_t every = !style || s.rel.size() <= 24 ? 1 : (s.rel.size() + 15) / 16;
        std::string pts, dots;
        std::size_t plotted = 0;
        // A gap where a value cannot sit on a log axis: separate polylines.
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
            const double x = px(static_cast<double>(l + 1)), y = py(v);
            pts += fmt::format("{},{} ", num(x), num(y));
            ++plotted;
            if (!style)
                dots += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"><title>{} L{}: {}</title></circle>", num(x), num(y), colour,
                                    xml_escape(s.node), l + 1, shortest(v));
            else if (l % every == 0 || l + 1 == s.rel.size())
                dots += marker_svg(series_marker((*style)[i]), x, y, 3.5, colour, fmt::format("{} L{}: {}", s.node, l + 1, shortest(v)));
        }
        flush();
        o += dots + "\n";
        const std::string alpha = std::isfinite(s.alpha) ? fmt::format("α = {:.2f}", s.alpha) : "α = " + shortest(s.alpha);
        o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>", num(legend_x), num(legend_y),
                         num(legend_x + 22), num(legend_y), colour);
        if (style) o += marker_svg(series_marker((*style)[i]), legend_x + 11, legend_y, 3.5, colour);
        o += fmt::format("<text x=\"{}\" y=\"{}\">{}  {}{}</text>\n", num(legend_x + 28), num(legend_y + 4), xml_escape(s.node), alpha,
                         any ? "" : " (identical: no drift)");
        legend_y += 18;
    }
    if (anchors > 0) {
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#666666\">guides through the mean depth-1 drift:</text>\n", num(legend_x),
                         num(legend_y + 12));
        o += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#666666\">dashed ∝ √L (incoherent), dotted ∝ L (coherent)</text>\n",
                         num(legend_x), num(legend_y + 28));
    }
    if (!have_data)
        o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666666\">no positive drift to plot</text>\n",
                         num(left + pw / 2), num(top + ph / 2));
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
