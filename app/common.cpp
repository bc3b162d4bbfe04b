#include "commands.hpp"

#include "kvasir/audit/audit.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace kvasir::app {

std::string default_model_path() { return std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/qwen3_moe_tiny"; }

int& command_exit_code() {
    static int code = 0;
    return code;
}

void add_output_options(CLI::App& cmd, OutputOptions& out) {
    cmd.add_flag("--json", out.json, "Print the report as JSON on stdout instead of tables");
    cmd.add_option("-o,--output", out.output_file, "Also write the JSON report to FILE (atomically)");
}

void add_node_options(CLI::App& cmd, NodeOptions& nodes) {
    cmd.add_option("-b,--backends", nodes.backends,
                   "Nodes to run, comma separated: NAME[:DEVICE][:key=value,...], e.g. cpu-ref,cpu,cpu:acc=f16. "
                   "Default: every available backend plus cpu:acc=f16");
    cmd.add_option("-r,--reference", nodes.reference, "Node every other node is compared with")
        ->capture_default_str();
}

std::function<void(const AuditProgress&)> progress_printer() {
    if (!isatty(STDERR_FILENO)) return {};
    return [](const AuditProgress& p) {
        // Done: the steps before this one, plus the nodes before this one
        // inside it (a node's share of a step is taken as equal).
        double done = p.step_index > 0 ? p.step_index - 1 : 0;
        if (p.node_index > 0 && p.nodes > 0) done += static_cast<double>(p.node_index - 1) / p.nodes;
        const int pct = p.steps > 0 ? static_cast<int>(100.0 * done / p.steps) : 0;
        std::string line = fmt::format("\r\033[K[{}/{} {:3d}%] {}", p.step_index, p.steps, pct, p.step);
        if (!p.node.empty()) line += fmt::format(" — {} ({}/{})", p.node, p.node_index, p.nodes);
        std::fputs(line.c_str(), stderr);
        std::fflush(stderr);
    };
}

void end_progress() {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
}

}  // namespace kvasir::app
