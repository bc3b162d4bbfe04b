#include "nodes.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/report/audit_text.hpp"

#include <algorithm>
#include <cstdio>

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

Nodes create_nodes(const NodeOptions& options) {
    std::vector<std::string> specs = options.backends.empty() ? default_nodes() : split_node_list(options.backends);
    Nodes out;
    const std::string ref_name = create_backend(options.reference)->capabilities().node;
    std::vector<std::string> names;
    for (const std::string& s : specs) {
        auto node = create_backend(s);
        const std::string name = node->capabilities().node;
        KVASIR_CHECK(std::find(names.begin(), names.end(), name) == names.end(), ErrorCode::bad_input,
                     "node '{}' given twice", name);
        names.push_back(name);
        out.nodes.push_back(std::move(node));
    }
    const auto it = std::find(names.begin(), names.end(), ref_name);
    if (it == names.end()) {
        out.nodes.insert(out.nodes.begin(), create_backend(options.reference));
        out.reference = 0;
    } else {
        out.reference = static_cast<std::size_t>(it - names.begin());
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
