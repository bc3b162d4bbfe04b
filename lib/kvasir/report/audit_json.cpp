// audit_report_json (audit_json.hpp): the JSON report, keys in schema order.
#include "kvasir/report/audit_json.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/report/writers_common.hpp"

#include <array>

namespace kvasir {

using namespace writers_detail;

namespace {

nlohmann::ordered_json matrix_json(const std::vector<std::vector<std::optional<double>>>& m) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& row : m) {
        nlohmann::ordered_json r = nlohmann::ordered_json::array();
        for (const auto& x : row) r.push_back(x ? json_double(*x) : nlohmann::ordered_json(nullptr));
        rows.push_back(r);
    }
    return rows;
}

}  // namespace

nlohmann::ordered_json audit_report_json(const AuditReport& r) {
    KVASIR_CHECK(r.model.is_object() && r.model.contains("fingerprint") && r.model["fingerprint"].is_string(), ErrorCode::internal,
                 "audit report: model must hold a string \"fingerprint\"");
    nlohmann::ordered_json j;
    j["schema"] = kAuditReportSchema;
    j["tool"] = tool_json();
    nlohmann::ordered_json proto;
    proto["id"] = r.protocol.id;
    proto["version"] = r.protocol.version;
    proto["content_hash"] = r.protocol.content_hash;
    proto["path"] = r.protocol.path;
    if (!r.protocol.steps_judged.empty()) proto["steps_judged"] = r.protocol.steps_judged;
    if (!r.protocol.view.is_null()) proto["view"] = r.protocol.view;
    j["protocol"] = proto;
    j["model"] = r.model;
    j["reference"] = r.reference;
    j["seed"] = r.seed;
    j["gate"] = to_string(r.gate);
    j["exit_code"] = exit_code(r.nodes, r.gate);

    nlohmann::ordered_json summary;
    std::size_t judged = 0;
    std::array<std::size_t, 4> counts{};  // fit, unfit-sensitive, unfit, error
    for (const NodeVerdict& v : r.nodes) {
        if (v.verdict == Verdict::reference) continue;
        ++judged;
        ++counts[static_cast<std::size_t>(v.verdict) - 1];
    }
    summary["nodes"] = r.nodes.size();
    summary["judged"] = judged;
    summary["fit"] = counts[0];
    summary["unfit-sensitive"] = counts[1];
    summary["unfit"] = counts[2];
    summary["error"] = counts[3];
    j["summary"] = summary;
    // Sample sizes too small to decide a criterion (verdict.hpp).
    j["warnings"] = sample_size_warnings(r.nodes);

    nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
    for (const NodeVerdict& v : r.nodes) nodes.push_back(to_json(v));
    j["nodes"] = nodes;

    nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
    for (const PairMatrix& m : r.pairs) {
        check_matrix(m);
        nlohmann::ordered_json p;
        p["name"] = m.name;
        p["description"] = m.description;
        p["nodes"] = m.nodes;
        p["max_abs"] = matrix_json(m.max_abs);
        p["cosine"] = matrix_json(m.cosine);
        pairs.push_back(p);
    }
    j["pairs"] = pairs;

    nlohmann::ordered_json drift = nlohmann::ordered_json::array();
    for (const DriftSeries& s : r.drift) {
        nlohmann::ordered_json d;
        d["node"] = s.node;
        nlohmann::ordered_json depth = nlohmann::ordered_json::array(), rel = nlohmann::ordered_json::array();
        for (std::size_t i = 0; i < s.rel.size(); ++i) {
            depth.push_back(i + 1);
            rel.push_back(json_double(s.rel[i]));
        }
        d["depth"] = depth;
        d["rel"] = rel;
        d["alpha"] = json_double(s.alpha);
        drift.push_back(d);
    }
    j["drift"] = drift;
    j["steps"] = r.steps.is_object() ? r.steps : nlohmann::ordered_json::object();
    return j;
}

}  // namespace kvasir
