// Turning --backends/--reference into live nodes.
#pragma once

#include "commands.hpp"

#include "kvasir/audit/verdict.hpp"
#include "kvasir/backend/backend.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/steps/node_clock.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kvasir::app {

struct Nodes {
    std::vector<std::unique_ptr<Backend>> nodes;
    std::size_t reference = 0;
};

// Creates every requested node (the reference first if it was not listed),
// each started once. Duplicate nodes are refused. An absent backend named
// explicitly is an error (exit 2); absent backends are simply not in the
// default list. With `failed`: a node whose backend exists and fails to
// start (Error(backend_failure): a device that does not initialise) becomes
// an error node there (the audit's) instead of stopping the command; bad
// specs and absent backends named explicitly stay exit 2. `model`: the model
// the nodes run (steps/substitution.hpp create_node: a node declaring a
// substitution needs it), null for a command that runs ops only.
Nodes create_nodes(const NodeOptions& options, const Model* model, std::vector<NodeInput>* failed = nullptr);
// The same from node specs already split (node_specs, plus what a command adds).
Nodes create_nodes(const std::vector<std::string>& specs, const std::string& reference, const Model* model,
                   std::vector<NodeInput>* failed = nullptr);
// The node specs --backends names (split once: split_node_list), or the
// registry's defaults when it names none.
std::vector<std::string> node_specs(const NodeOptions& options);

// Runs one measuring step, `run(nodes)`, on timing decorators of the nodes
// (NodeClock: the same results) and, when `print` (--timings), writes on
// stderr where its time went — the wall seconds, the seconds inside each
// node, the rest — and every device node's weight-cache counters.
void print_step_timings(const std::string& step, const Nodes& nodes, const NodeClock& clock, double wall_s);
template <typename Run>
auto run_timed(const std::string& step, Nodes& nodes, bool print, Run&& run) {
    NodeClock clock(nodes.nodes);
    const auto t0 = std::chrono::steady_clock::now();
    auto result = run(clock.timed());
    if (print)
        print_step_timings(step, nodes, clock, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return result;
}

// Splits --backends values into node specs (see nodes.cpp for the comma rule).
std::vector<std::string> split_node_list(const std::vector<std::string>& args);

}  // namespace kvasir::app
