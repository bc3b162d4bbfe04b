#include "kvasir/core/number_format.hpp"

#include <fmt/format.h>

#include <cmath>

namespace kvasir {

std::string fmt_sci(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (v == 0) return "0";
    return fmt::format("{:.2e}", v);
}

std::string fmt_cosine(double v) {
    if (std::isnan(v)) return "nan";
    if (v == 1.0) return "1";
    // Equivalent backends sit at 1 − 1e-12 … 1 − 1e-5: show the distance to 1,
    // which ten fixed decimals would round away.
    if (v > 0.99999 && v < 1.0) return fmt::format("1-{:.1e}", 1.0 - v);
    return fmt::format("{:.10f}", v);
}

std::string fmt_rate(double v) {
    if (std::isnan(v)) return "nan";
    return fmt::format("{:.1f}%", 100.0 * v);
}

std::string fmt_fixed(double v, int digits) {
    if (std::isnan(v)) return "nan";
    return fmt::format("{:.{}f}", v, digits);
}

std::string fmt_general(double v, int digits) {
    if (std::isnan(v)) return "nan";
    return fmt::format("{:.{}g}", v, digits);
}

}  // namespace kvasir
