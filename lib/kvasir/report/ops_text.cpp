#include "kvasir/report/ops_text.hpp"

#include <fmt/format.h>

namespace kvasir {

std::string render_ops_text(const OpsReport& r, const Style& st) {
    std::string out;
    const OpsConfig& c = r.config;
    out += st.bold("Step 1 — per-op delta") +
           fmt::format("  seed {}  reference {}\n", c.seed, r.nodes[r.reference].node);
    const std::size_t n = r.nodes.size();
    for (const OpResult& op : r.ops) {
        out += "\n" + st.bold(op.op) + "  " + st.dim(op.inputs) + "\n";
        for (std::size_t i = 0; i < n; ++i)
            if (!op.errors[i].empty()) out += "  " + st.red(fmt::format("{}: error: {}", r.nodes[i].node, op.errors[i])) + "\n";
        std::vector<std::string> header{"max|Δ|"};
        for (const Capabilities& cap : r.nodes) header.push_back(cap.node);
        TextTable abs_table(header);
        header[0] = "cosine";
        TextTable cos_table(header);
        header[0] = "top-k ids agree";
        TextTable id_table(header);
        bool has_ids = false;
        for (std::size_t a = 0; a < n; ++a) {
            std::vector<std::string> ra{r.nodes[a].node}, rc{r.nodes[a].node}, ri{r.nodes[a].node};
            for (std::size_t b = 0; b < n; ++b) {
                if (a == b) {
                    ra.emplace_back("·");
                    rc.emplace_back("·");
                    ri.emplace_back("·");
                    continue;
                }
                const auto& s = op.matrix[a][b];
                ra.push_back(s ? fmt_sci(s->max_abs) : "—");
                rc.push_back(s ? fmt_cosine(s->cosine) : "—");
                const auto& ids = op.id_matrix[a][b];
                has_ids = has_ids || ids.has_value();
                ri.push_back(ids ? fmt_rate(ids->exact_match_rate) : "—");
            }
            abs_table.add_row(ra);
            cos_table.add_row(rc);
            id_table.add_row(ri);
        }
        out += abs_table.render("  ");
        out += cos_table.render("  ");
        if (has_ids) out += id_table.render("  ");
    }
    if (!r.shard_checks.empty()) {
        out += "\n" + st.bold("Shard check") +
               st.dim(fmt::format("  moe block split over {} expert-parallel nodes, recombined, vs monolithic on the same node",
                                  c.shards)) +
               "\n";
        TextTable t({"node", "max|Δ|", "max rel", "cosine"});
        for (const ShardCheck& s : r.shard_checks) {
            if (s.stats)
                t.add_row({s.node, fmt_sci(s.stats->max_abs), fmt_sci(s.stats->max_rel), fmt_cosine(s.stats->cosine)});
            else
                t.add_row({s.node, st.red("error: " + s.error), "", ""});
        }
        out += t.render("  ");
    }
    return out;
}

}  // namespace kvasir
