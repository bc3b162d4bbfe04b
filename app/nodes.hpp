// Turning --backends/--reference into live nodes.
#pragma once

#include "commands.hpp"

#include "kvasir/backend/backend.hpp"

#include <memory>
#include <vector>

namespace kvasir::app {

struct Nodes {
    std::vector<std::unique_ptr<Backend>> nodes;
    std::size_t reference = 0;
};

// Creates every requested node (the reference first if it was not listed).
// Duplicate nodes are refused. An absent backend named explicitly is an
// error (exit 2); absent backends are simply not in the default list.
Nodes create_nodes(const NodeOptions& options);

// Splits --backends values into node specs (see nodes.cpp for the comma rule).
std::vector<std::string> split_node_list(const std::vector<std::string>& args);

}  // namespace kvasir::app
