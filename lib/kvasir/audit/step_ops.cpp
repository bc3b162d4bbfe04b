// Step 1 as an audit step: per-op delta (steps/op_delta.hpp computes it).
//
// The ops' inputs are seeded and every node regenerates them; what comes
// from the authority is the MoE op's routing and, with real weights, the
// real-statistics MoE input (the authority's own post-attention RMSNorm).
// So the authority is the decision: its ops run again beside each node —
// cheap next to the forward steps, and exactly what a capture on another
// machine does.
//
// Tensors: ops.<op>.out (the compared value), ops.<op>.ids (router ops),
// ops.moe.shard_combined (the node's own sharded-then-recombined block).
// Notes: ops_inputs (op → one line of inputs), ops_errors (op → the node's
// failure of that op; "shard" for the shard check): one failing op does not
// hide the others.
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include "kvasir/backend/forwarding.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/steps/op_delta.hpp"

#include <memory>

namespace kvasir {

namespace {

nlohmann::json note_object(const NodeOutputs& n, const std::string& key) {
    const auto text = n.note(key);
    if (!text) return nlohmann::json::object();
    nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
}

class OpsAudit final : public Step {
public:
    const char* name() const override { return "ops"; }

    bool plan(const AuditConfig& ac, detail::AuditPlan& plan) const override {
        const Protocol& p = *ac.protocol;
        if (!p.ops.enabled) return false;
        OpsConfig oc = p.ops_config();
        oc.seed = plan.seed;
        if (p.ops.weights == "model") {
            oc.model = ac.model;
            oc.layer = p.ops.layer;
            // The protocol must fit the model — refused here, naming the JSON
            // path, before any step runs (not as the reference's error later).
            const ModelConfig& m = ac.model->config();
            KVASIR_CHECK(oc.layer >= 0 && oc.layer < m.num_layers, ErrorCode::bad_input,
                         "{}: /steps/ops/layer: {} is outside 0..{} of {} (the model has {} layers)", p.source, oc.layer,
                         m.num_layers - 1, ac.model->path(), m.num_layers);
            try {
                (void)oc.resolved();
            } catch (const Error& e) {
                if (e.code() != ErrorCode::bad_input) throw;
                fail(ErrorCode::bad_input, "{}: /steps/ops: {}", p.source, e.what());
            }
        }
        oc.validate();
        plan.ops = oc;
        return true;
    }

    std::any decide(const StepEnv&, Backend& authority) const override { return &authority; }

    StepOutput collect(const StepEnv& env, Backend& node, const std::any& decisions, bool self) const override {
        Backend& authority = *std::any_cast<Backend*>(decisions);
        std::vector<std::unique_ptr<Backend>> nodes;
        if (!self) nodes.push_back(std::make_unique<ForwardingBackend>(authority));
        nodes.push_back(std::make_unique<ForwardingBackend>(node));
        const std::size_t me = nodes.size() - 1;
        OpsOutputs keep;
        const OpsReport r = run_op_delta(*env.plan->ops, nodes, 0, &keep);
        StepOutput out;
        nlohmann::ordered_json inputs = nlohmann::ordered_json::object(), errors = nlohmann::ordered_json::object();
        for (const OpResult& op : r.ops) {
            inputs[op.op] = op.inputs;
            if (!op.errors[me].empty()) errors[op.op] = op.errors[me];
        }
        for (const ShardCheck& s : r.shard_checks)
            if (s.node == node.capabilities().node && !s.error.empty() && !errors.contains("moe")) errors["shard"] = s.error;
        if (me < keep.size()) out.tensors = std::move(keep[me]);
        out.notes["ops_inputs"] = inputs.dump();
        if (!errors.empty()) out.notes["ops_errors"] = errors.dump();
        return out;
    }

    nlohmann::ordered_json compare(const Protocol& p, const StepNodes& in, Ledger& led, AuditReport& out) const override {
        const std::size_t n = in.nodes.size(), ref = in.reference;
        const NodeOutputs& refn = *in.nodes[ref];
        OpsReport r;
        r.reference = ref;
        r.config = p.ops_config();
        for (const NodeOutputs* o : in.nodes) {
            Capabilities c;
            c.node = o->node();
            r.nodes.push_back(c);
        }
        std::vector<nlohmann::json> errors(n);
        for (std::size_t i = 0; i < n; ++i)
            if (in.present[i]) errors[i] = note_object(*in.nodes[i], "ops_errors");
        const nlohmann::json ref_inputs = note_object(refn, "ops_inputs");
        for (const std::string& op : all_op_names()) {
            bool any = false;
            std::vector<std::optional<TensorView>> values(n), ids(n);
            std::vector<std::string> errs(n);
            for (std::size_t i = 0; i < n; ++i) {
                if (!in.present[i]) continue;
                if (errors[i].contains(op) && errors[i][op].is_string()) {
                    errs[i] = errors[i][op].get<std::string>();
                    any = true;
                }
                if (!in.nodes[i]->has("ops." + op + ".out")) continue;
                any = true;
                values[i] = in.nodes[i]->view("ops." + op + ".out");
                if (in.nodes[i]->has("ops." + op + ".ids")) ids[i] = in.nodes[i]->view("ops." + op + ".ids");
            }
            if (!any) continue;
            const std::string inputs =
                ref_inputs.contains(op) && ref_inputs[op].is_string() ? ref_inputs[op].get<std::string>() : "from captures";
            for (std::size_t i = 0; i < n; ++i)
                if (in.present[i] && !values[i] && errs[i].empty()) errs[i] = "not captured";
            r.ops.push_back(op_result_from_outputs(op, inputs, values, ids, std::move(errs)));
        }
        for (std::size_t i = 0; i < n; ++i) {
            if (!in.present[i]) continue;
            const NodeOutputs& o = *in.nodes[i];
            ShardCheck sc;
            sc.node = o.node();
            sc.shards = static_cast<int>(p.ops.shards);
            if (errors[i].contains("shard") && errors[i]["shard"].is_string()) {
                sc.error = errors[i]["shard"].get<std::string>();
            } else if (o.has("ops.moe.shard_combined") && o.has("ops.moe.out")) {
                sc.stats = kvasir::compare(o.view("ops.moe.out"), o.view("ops.moe.shard_combined"));
            } else {
                continue;
            }
            r.shard_checks.push_back(std::move(sc));
        }
        // Measurements: every candidate against the reference, op by op.
        for (const OpResult& op : r.ops) {
            for (std::size_t i = 0; i < n; ++i) {
                if (!in.present[i]) continue;
                if (!op.errors[i].empty()) led.error(i, "ops", op.op + ": " + op.errors[i]);
                if (i != ref && !op.errors[ref].empty())
                    led.error(i, "ops", op.op + ": not compared: the reference failed: " + op.errors[ref]);
                if (i == ref || !op.matrix[ref][i]) continue;
                led.measure(i, "ops", "ops." + op.op + ".max_rel", op.matrix[ref][i]->max_rel);
                led.measure(i, "ops", "ops." + op.op + ".cosine_min", op.matrix[ref][i]->cosine);
            }
        }
        for (const ShardCheck& s : r.shard_checks) {
            const std::size_t i = led.index_of(s.node);
            if (!s.error.empty()) led.error(i, "ops", "shard check: " + s.error);
            if (s.stats) led.measure(i, "ops", "shard.max_rel", s.stats->max_rel);
        }
        // The MoE block first: it is the headline matrix (CSV, heatmap).
        for (const OpResult& op : r.ops)
            if (op.op == "moe") out.pairs.push_back(pair_matrix(r, op.op));
        for (const OpResult& op : r.ops)
            if (op.op != "moe") out.pairs.push_back(pair_matrix(r, op.op));
        nlohmann::ordered_json j = to_json(r);
        nlohmann::ordered_json names = nlohmann::ordered_json::array();
        for (const NodeOutputs* o : in.nodes) names.push_back(o->node());
        j["nodes"] = names;  // capabilities are in each node's verdict
        return j;
    }
};

}  // namespace

const Step& ops_step() {
    static const OpsAudit s;
    return s;
}

}  // namespace kvasir
