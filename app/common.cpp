#include "commands.hpp"

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

}  // namespace kvasir::app
