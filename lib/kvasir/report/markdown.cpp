#include "kvasir/report/markdown.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/report/text.hpp"

#include <fmt/format.h>

namespace kvasir {

std::string pair_table_markdown(const OpsReport& r, const std::string& op) {
    const OpResult* res = nullptr;
    for (const OpResult& o : r.ops)
        if (o.op == op) res = &o;
    KVASIR_CHECK(res != nullptr, ErrorCode::internal, "report has no op '{}'", op);
    std::string out = fmt::format("**{}** — {}\n\n", op, res->inputs);
    out += "| backend pair | max abs Δ | max rel Δ | cosine |\n|---|---|---|---|\n";
    const std::size_t n = r.nodes.size();
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = a + 1; b < n; ++b) {
            const auto& s = res->matrix[a][b];
            const std::string pair = fmt::format("{} vs {}", r.nodes[b].node, r.nodes[a].node);
            if (!s)
                out += fmt::format("| {} | error | error | error |\n", pair);
            else
                out += fmt::format("| {} | {} | {} | {} |\n", pair, fmt_sci(s->max_abs), fmt_sci(s->max_rel),
                                   fmt_cosine(s->cosine));
        }
    for (std::size_t i = 0; i < n; ++i)
        if (!res->errors[i].empty()) out += fmt::format("\n{}: error: {}\n", r.nodes[i].node, res->errors[i]);
    return out;
}

}  // namespace kvasir
