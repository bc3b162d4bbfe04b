// The backend registry: which backends this build knows, which of them have
// a device on this machine, and how to create a node from a spec string.
//
// A backend that was not compiled in, or that was compiled but finds no
// device, is *absent*: listed with the reason, never an error. Asking to
// create an absent backend is Error(unsupported) with that reason.
#pragma once

#include "kvasir/backend/backend.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

struct BackendDevice {
    int index = 0;
    std::string name;  // e.g. "pthread-haswell-AMD EPYC (Portable Computing Language)"
};

struct BackendStatus {
    std::string name;          // "cpu", "opencl", ...
    std::string description;   // one line: what this backend is
    bool compiled = false;     // built into this binary
    bool available = false;    // compiled and at least one device found
    std::string reason;        // why absent (empty when available)
    std::vector<BackendDevice> devices;
};

// Every backend this build knows about, compiled or not, in a fixed order.
std::vector<BackendStatus> list_backends();

// Create a node. Throws Error(bad_input) for an unknown name or malformed
// spec (naming the known backends), Error(unsupported) for an absent one.
std::unique_ptr<Backend> create_backend(const BackendSpec& spec);
std::unique_ptr<Backend> create_backend(std::string_view spec);

// Nodes audited when the user names none: every available device of every
// backend, plus the f16-accumulation variant of cpu (the precision-mismatch
// contrast every report should show).
std::vector<std::string> default_nodes();

// Names of all backends this build knows (for error messages and --help).
std::string known_backend_names();

}  // namespace kvasir
