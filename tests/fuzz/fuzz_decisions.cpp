// libFuzzer target for the shared-decisions reader (capture --decisions-in:
// lib/kvasir/audit/capture.cpp open_decisions_file and the encodings of
// audit/step.cpp load_routing_sets / load_tensor_list, on top of the
// safetensors reader): the input is a decisions file. Any input either gives
// routing sets whose every plan has i32 ids and float weights of one shape,
// rows within what the file stores, and anchor tensors readable to their last
// element — or throws kvasir::Error; never a crash or a read outside the
// file. The bytes are written to a private temporary file, as the reader
// reads a path. Seed: tests/fuzz/corpus/decisions (the ci protocol's
// generate decisions, as capture --decisions-out writes them).
#include "kvasir/audit/capture.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/core/error.hpp"

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
        return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/kvasir-fuzz-decisions-" + std::to_string(getpid()) +
               ".decisions";
    }();
    return path;
}

double touch(const kvasir::Tensor& t) {
    double sum = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) sum += t.at(i);
    return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = scratch_path();
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
        if (size > 0) std::fwrite(data, 1, size, f);
        std::fclose(f);
    } else {
        std::abort();
    }
    try {
        const auto file = kvasir::open_decisions_file(path);
        volatile double sink = 0;
        // The count the file claims, where it is small, as the count a step
        // expects: past that check the fuzzer reaches the rows and the plans.
        std::size_t expected = 16;
        if (file->has("routing.sets")) {
            const kvasir::TensorView c = file->view("routing.sets");
            if (c.numel() == 1 && c.at(0) >= 0 && c.at(0) <= 4096) expected = static_cast<std::size_t>(c.at(0));
        }
        for (const auto& set : kvasir::load_routing_sets(*file, "routing", 4, expected))
            for (const kvasir::RoutingPlan& p : set) {
                if (p.ids.empty()) continue;
                if (p.ids.dtype() != kvasir::DType::i32 || p.weights.shape() != p.ids.shape()) std::abort();
                sink = sink + touch(p.ids) + touch(p.weights);
            }
        for (const kvasir::Tensor& t : kvasir::load_tensor_list(*file, "hidden", 5)) sink = sink + touch(t);
    } catch (const kvasir::Error&) {
    }
    std::remove(path.c_str());
    return 0;
}
