// libFuzzer target for the HF config.json parser: any input either parses
// into a validated ModelConfig or throws kvasir::Error — never crashes.
#include "kvasir/core/error.hpp"
#include "kvasir/model/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const kvasir::ModelConfig c = kvasir::parse_model_config(text, "fuzz/config.json");
        // Exercise the derived views the forward pass relies on.
        for (std::int64_t l = 0; l < c.num_layers; ++l) (void)c.is_moe(l);
        (void)kvasir::layer_tensor_names(c, 0);
    } catch (const kvasir::Error&) {
    }
    return 0;
}
