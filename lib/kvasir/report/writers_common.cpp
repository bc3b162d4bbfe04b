// The helpers the audit output formats share (writers_common.hpp).
#include "kvasir/report/writers_common.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <initializer_list>
#include <utility>

namespace kvasir {

std::string xml_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default:
                if (u < 0x20 && c != '\t' && c != '\n' && c != '\r')
                    out += "\xEF\xBF\xBD";  // U+FFFD: XML 1.0 forbids these characters even escaped
                else
                    out += c;
        }
    }
    return out;
}

namespace writers_detail {

void check_matrix(const PairMatrix& m) {
    const std::size_t n = m.nodes.size();
    bool ok = m.max_abs.size() == n && m.cosine.size() == n;
    for (std::size_t i = 0; ok && i < n; ++i) ok = m.max_abs[i].size() == n && m.cosine[i].size() == n;
    KVASIR_CHECK(ok, ErrorCode::internal, "pair matrix '{}' is not {}×{} over its nodes", m.name, n, n);
}

std::string scalar_text(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string shortest(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return fmt::format("{}", x);  // shortest round-trip form
}

std::string num(double x) { return fmt::format("{:.2f}", x); }

const char* series_colour(std::size_t i) {
    // Okabe & Ito (2008), "Color Universal Design": blue, vermillion, bluish
    // green, reddish purple, orange, sky blue, black.
    static const std::array<const char*, 7> colours = {"#0072b2", "#d55e00", "#009e73", "#cc79a7",
                                                       "#e69f00", "#56b4e9", "#000000"};
    return colours[i % colours.size()];
}

Marker series_marker(std::size_t i) {
    static const std::array<Marker, 5> shapes = {Marker::circle, Marker::square, Marker::triangle, Marker::diamond,
                                                 Marker::triangle_down};
    return shapes[i % shapes.size()];
}

std::string marker_svg(Marker m, double x, double y, double r, std::string_view fill, std::string_view title) {
    const std::string tip = title.empty() ? std::string() : "<title>" + xml_escape(title) + "</title>";
    const std::string f(fill);
    const auto poly = [&](std::initializer_list<std::pair<double, double>> pts) {
        std::string p;
        for (const auto& [dx, dy] : pts) p += (p.empty() ? "" : " ") + num(x + dx * r) + "," + num(y + dy * r);
        return fmt::format("<polygon points=\"{}\" fill=\"{}\">{}</polygon>", p, f, tip);
    };
    switch (m) {
        case Marker::circle: return fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{}\">{}</circle>", num(x), num(y), num(r), f, tip);
        case Marker::square:
            return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\">{}</rect>", num(x - 0.9 * r), num(y - 0.9 * r),
                               num(1.8 * r), num(1.8 * r), f, tip);
        case Marker::triangle: return poly({{0, -1.25}, {1.1, 0.75}, {-1.1, 0.75}});
        case Marker::triangle_down: return poly({{0, 1.25}, {1.1, -0.75}, {-1.1, -0.75}});
        case Marker::diamond: return poly({{0, -1.3}, {1.1, 0}, {0, 1.3}, {-1.1, 0}});
        case Marker::cross:
            return poly({{-1.2, -0.8}, {-0.8, -1.2}, {0, -0.4}, {0.8, -1.2}, {1.2, -0.8}, {0.4, 0}, {1.2, 0.8}, {0.8, 1.2},
                         {0, 0.4}, {-0.8, 1.2}, {-1.2, 0.8}, {-0.4, 0}});
    }
    return {};
}

}  // namespace writers_detail

}  // namespace kvasir
