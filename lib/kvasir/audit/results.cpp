// The report model's constructors: pair matrices from step data, the
// protocol reference.
#include "kvasir/audit/results.hpp"

#include "kvasir/core/error.hpp"

#include <utility>

namespace kvasir {

// ============================================================================
// Pair matrices
// ============================================================================

PairMatrix pair_matrix(std::string name, std::string description, std::vector<std::string> nodes,
                       const std::vector<std::vector<std::optional<CompareStats>>>& stats) {
    const std::size_t n = nodes.size();
    KVASIR_CHECK(stats.size() == n, ErrorCode::internal, "pair matrix '{}': {} rows for {} nodes", name, stats.size(), n);
    PairMatrix m;
    m.name = std::move(name);
    m.description = std::move(description);
    m.nodes = std::move(nodes);
    m.max_abs.assign(n, std::vector<std::optional<double>>(n));
    m.cosine.assign(n, std::vector<std::optional<double>>(n));
    for (std::size_t a = 0; a < n; ++a) {
        KVASIR_CHECK(stats[a].size() == n, ErrorCode::internal, "pair matrix '{}': row {} has {} entries for {} nodes", m.name,
                     a, stats[a].size(), n);
        for (std::size_t b = 0; b < n; ++b) {
            if (a == b) {
                m.max_abs[a][b] = 0.0;
                m.cosine[a][b] = 1.0;
            } else if (stats[a][b]) {
                m.max_abs[a][b] = stats[a][b]->max_abs;
                m.cosine[a][b] = stats[a][b]->cosine;
            }
        }
    }
    return m;
}

PairMatrix pair_matrix(const OpsReport& report, const std::string& op) {
    for (const OpResult& r : report.ops)
        if (r.op == op) {
            std::vector<std::string> nodes;
            for (const Capabilities& c : report.nodes) nodes.push_back(c.node);
            return pair_matrix(op, r.inputs, std::move(nodes), r.matrix);
        }
    fail(ErrorCode::internal, "step 1 report has no op '{}'", op);
}

nlohmann::ordered_json NodeEntry::json_with(const nlohmann::ordered_json& figures) const {
    if (error) return {{"node", node}, {"error", *error}};
    nlohmann::ordered_json j{{"node", node}};
    if (!figures.is_null()) j.update(figures);
    return j;
}

ProtocolRef protocol_ref(const Protocol& p) {
    ProtocolRef r{p.id, p.version, p.content_hash, p.source, {}, nullptr};
    if (p.document.contains("view")) r.view = p.document;
    return r;
}

}  // namespace kvasir
