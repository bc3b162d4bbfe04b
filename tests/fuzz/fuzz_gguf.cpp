// libFuzzer target for the GGUF reader. Parses the input as a whole file; a
// kvasir::Error is the expected way to reject it, anything else (a crash, an
// ASan/UBSan report, another exception type, a leak) is a finding. Whatever
// parses is exercised further: every metadata value rendered, every tensor
// name mapped, the hyperparameter reader and the model description built
// from it (model_config_from_gguf: rope, yarn, windows) run, and every dequantisable tensor
// expanded so ASan sees any read outside the tensor's bytes.
//
// Run: build-fuzz/fuzz_gguf -max_total_time=60 tests/fuzz/corpus/gguf
#include "kvasir/core/error.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/quant.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace {
// Bound the output a single input may make us allocate (f32 elements). The
// parser already ties every tensor to bytes present in the input, and the
// densest format expands 144 bytes to 256 floats, so this only keeps
// iterations fast; it is not a safety limit.
constexpr std::int64_t kMaxDequantElements = std::int64_t{1} << 22;
// Keeps the work observable so the optimiser cannot drop it.
volatile std::size_t g_sink = 0;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    try {
        const kvasir::GgufFile file = kvasir::GgufFile::parse(bytes, "fuzz.gguf");
        std::size_t sink = 0;
        for (const auto& key : file.keys()) sink += file.get(key).summary().size();
        for (const auto& t : file.tensors()) {
            if (const auto role = kvasir::gguf_tensor_role(t.name)) sink += static_cast<std::size_t>(role->layer + 1);
            if (!kvasir::ggml_type_dequantizable(t.type) || t.numel > kMaxDequantElements) continue;
            const kvasir::Tensor values = kvasir::dequantize(t);
            if (values.numel() > 0) sink += static_cast<std::size_t>(values.as<float>()[values.numel() - 1] != 0.0f);
        }
        try {
            sink += static_cast<std::size_t>(kvasir::read_gguf_model_params(file).block_count);
            sink += static_cast<std::size_t>(kvasir::model_config_from_gguf(file, "fuzz.gguf").num_layers);
        } catch (const kvasir::Error&) {
        }
        g_sink = sink;
    } catch (const kvasir::Error&) {
    }
    return 0;
}
