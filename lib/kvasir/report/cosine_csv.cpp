// cosine_csv (cosine_csv.hpp): RFC 4180 fields and line ends.
#include "kvasir/report/cosine_csv.hpp"

#include "kvasir/report/writers_common.hpp"

namespace kvasir {

using namespace writers_detail;

namespace {

std::string csv_field(std::string_view s) {
    if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
    std::string out = "\"";
    for (const char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

}  // namespace

std::string cosine_csv(const PairMatrix& m) {
    check_matrix(m);
    std::string out = "node";
    for (const auto& n : m.nodes) out += "," + csv_field(n);
    out += "\r\n";  // RFC 4180 line ends
    for (std::size_t a = 0; a < m.nodes.size(); ++a) {
        out += csv_field(m.nodes[a]);
        for (std::size_t b = 0; b < m.nodes.size(); ++b) out += "," + (m.cosine[a][b] ? shortest(*m.cosine[a][b]) : std::string());
        out += "\r\n";
    }
    return out;
}

}  // namespace kvasir
