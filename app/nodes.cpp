#include "nodes.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/report/audit_text.hpp"
#include "kvasir/steps/substitution.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>

namespace kvasir::app {

// "--backends cpu-ref,cuda:0:blas=cublas,tf32=1": commas separate nodes, but
// also a node's options; a piece with '=' and no ':' continues the node before it.
std::vector<std::string> split_node_list(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    for (const std::string& arg : args)
        for (const std::string& piece : comma_pieces(arg)) {
            const bool continues = !out.empty() && piece.find('=') != std::string::npos &&
                                   piece.find(':') == std::string::npos && out.back().find(':') != std::string::npos;
            if (continues)
                out.back() += "," + piece;
            else
                out.push_back(piece);
        }
    return out;
}

std::vector<std::string> node_specs(const NodeOptions& options) {
    return options.backends.empty() ? default_nodes() : split_node_list(options.backends);
}

Nodes create_nodes(const NodeOptions& options, const Model* model, std::vector<NodeInput>* failed) {
    return create_nodes(node_specs(options), options.reference, model, failed);
}

Nodes create_nodes(const std::vector<std::string>& specs, const std::string& reference_spec, const Model* model,
                   std::vector<NodeInput>* failed) {
    const std::string ref_text = BackendSpec::parse(reference_spec).canonical();
    Nodes out;
    std::vector<std::string> names;
    std::optional<std::size_t> reference;
    for (const std::string& s : specs) {
        std::unique_ptr<Backend> node;
        try {
            node = create_node(s, model);
        } catch (const Error& e) {
            if (failed == nullptr || e.code() != ErrorCode::backend_failure) throw;
            NodeInput n;
            n.node = s;
            n.capabilities["node"] = s;
            n.errors["create"] = e.what();
            failed->push_back(std::move(n));
            continue;
        }
        const std::string name = node->capabilities().node;
        KVASIR_CHECK(std::find(names.begin(), names.end(), name) == names.end(), ErrorCode::bad_input,
                     "node '{}' given twice", name);
        if (!reference && BackendSpec::parse(s).canonical() == ref_text) reference = names.size();
        names.push_back(name);
        out.nodes.push_back(std::move(node));
    }
    if (reference) {
        out.reference = *reference;
        return out;
    }
    // The reference is not listed under its own spelling: started here (the
    // one node started without being listed), unless it is a listed node
    // under another spelling ("cpu:acc=f32" is "cpu"), then that one is it.
    auto ref = create_node(reference_spec, model);
    const auto it = std::find(names.begin(), names.end(), ref->capabilities().node);
    if (it != names.end()) {
        out.reference = static_cast<std::size_t>(it - names.begin());
    } else {
        out.nodes.insert(out.nodes.begin(), std::move(ref));
        out.reference = 0;
    }
    return out;
}

void print_step_timings(const std::string& step, const Nodes& nodes, const NodeClock& clock, double wall_s) {
    RunTimings t;
    t.load_note = "none: the step reads the weights it needs as it goes (inside the node seconds)";
    StepTiming st{step, wall_s, {}};
    for (std::size_t i = 0; i < nodes.nodes.size(); ++i) {
        t.nodes.push_back(nodes.nodes[i]->capabilities().node);
        st.node_seconds.push_back(clock.seconds(i));
    }
    t.steps.push_back(std::move(st));
    record_node_counters(nodes.nodes, t);
    std::fputs(render_timings(t).c_str(), stderr);
}

}  // namespace kvasir::app
