// libFuzzer target for the protocol parser (lib/kvasir/audit/protocol.cpp):
// the input is a protocol JSON document. Any input either parses into a
// Protocol whose derived settings (step 1's configuration, the steps it
// runs, its canonical hash) can be asked for, or throws kvasir::Error —
// never a crash, a hang or an allocation the document merely asks for.
// Relative paths resolve inside an empty folder: no file a document names is
// read (token streams are read later, by read_token_stream).
#include "kvasir/audit/protocol.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/core/json_schema.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const nlohmann::json doc = kvasir::parse_json_strict(text, "fuzz/protocol.json");
        const kvasir::Protocol p = kvasir::parse_protocol(doc, "fuzz/protocol.json", "/nonexistent-fuzz-dir");
        for (const std::string& step : kvasir::protocol_step_names()) (void)p.runs(step);
        if (p.ops.enabled) {
            try {
                p.ops_config().validate();
            } catch (const kvasir::Error&) {
            }
        }
    } catch (const kvasir::Error&) {
    }
    return 0;
}
