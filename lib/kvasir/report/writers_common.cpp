// The helpers the audit output formats share (writers_common.hpp).
#include "kvasir/report/writers_common.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <cmath>

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

}  // namespace writers_detail

}  // namespace kvasir
