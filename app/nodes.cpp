#include "nodes.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/error.hpp"

#include <algorithm>

namespace kvasir::app {

Nodes create_nodes(const NodeOptions& options) {
    std::vector<std::string> specs = options.backends.empty() ? default_nodes() : options.backends;
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

}  // namespace kvasir::app
