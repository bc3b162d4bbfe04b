// libFuzzer target for the capture reader (lib/kvasir/audit/capture.cpp
// Capture::open, on top of the safetensors reader): the input is a capture
// file. Any input either opens — its content hash matched, its metadata
// (node, capabilities, steps, errors, faults) parsed — and every tensor it
// lists can be viewed and read to its last element inside the mapping, or
// throws kvasir::Error — never a crash or a read outside the file. The
// bytes are written to a private temporary file, as Capture reads a path.
// A first byte 'M' makes the rest a JSON object of metadata strings, written
// as a capture with its content hash filled in (write_capture): the fuzzer
// then reaches the metadata parsers behind the hash check, which random
// bytes never pass.
#include "kvasir/audit/capture.hpp"
#include "kvasir/core/error.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {

const std::string& scratch_path() {
    static const std::string path = [] {
        const char* dir = std::getenv("TMPDIR");
        return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/kvasir-fuzz-capture-" + std::to_string(getpid()) +
               ".safetensors";
    }();
    return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = scratch_path();
    if (size > 0 && data[0] == 'M') {
        const nlohmann::json j = nlohmann::json::parse(data + 1, data + size, nullptr, false);
        if (!j.is_object()) return 0;
        kvasir::CaptureData cd;
        for (const auto& [k, v] : j.items()) {
            if (!v.is_string()) return 0;
            cd.metadata[k] = v.get<std::string>();
        }
        cd.tensors["ops.matmul.out"] = kvasir::Tensor(kvasir::DType::f32, {2, 2});
        try {
            kvasir::write_capture(path, cd);
        } catch (const kvasir::Error&) {
            return 0;
        }
    } else {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        if (f == nullptr) std::abort();
        if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
        std::fclose(f);
    }
    try {
        const kvasir::Capture c = kvasir::Capture::open(path);
        (void)c.node();
        (void)c.capabilities().dump();
        for (const std::string& step : c.steps()) (void)c.has_step(step);
        (void)c.errors();
        (void)c.not_captured();
        (void)c.free_running();
        (void)c.note("ops_inputs");
        for (const std::string& name : c.tensor_names()) {
            const kvasir::TensorView v = c.view(name);
            double sum = 0;
            if (v.numel() > 0) sum += v.at(0) + v.at(v.numel() - 1);
            (void)sum;
        }
    } catch (const kvasir::Error&) {
    }
    return 0;
}
