// write_safetensors (safetensors_writer.hpp): the canonical layout and the
// atomic write (temporary file, fsync, rename, directory fsync).
#include "kvasir/model/safetensors_writer.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

namespace kvasir {

using namespace safetensors_detail;

// ===========================================================================
// Writer
// ===========================================================================
namespace {

using json = nlohmann::json;


}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    namespace fs = std::filesystem;
    const std::string shown = escape(path, 400);
    auto bad = [&](const std::string& msg) { fail(ErrorCode::bad_input, "{}: {}", shown, msg); };

    // --- validate and lay out -----------------------------------------------
    struct Out {
        const std::string* name;
        const TensorView* view;
        std::uint64_t nbytes;
    };
    std::vector<Out> order;
    order.reserve(tensors.size());
    for (const auto& [name, v] : tensors) {
        if (name == "__metadata__") bad("\"__metadata__\" cannot be a tensor name");
        if (utf8_invalid_at(name) != std::string::npos) bad(fmt::format("tensor name {} is not valid UTF-8", q(name)));
        std::uint64_t numel = 1;
        for (std::int64_t d : v.shape) {
            if (d < 0) bad(fmt::format("tensor {}: negative dimension in shape {}", q(name), shape_str(v.shape)));
            if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel))
                bad(fmt::format("tensor {}: shape {} overflows", q(name), shape_str(v.shape)));
        }
        std::uint64_t nbytes = 0;
        if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dtype_size(v.dtype)), &nbytes))
            bad(fmt::format("tensor {}: shape {} overflows", q(name), shape_str(v.shape)));
        if (nbytes != 0 && v.data == nullptr) bad(fmt::format("tensor {}: view has no data", q(name)));
        order.push_back({&name, &v, nbytes});
    }
    for (const auto& [k, v] : metadata)
        if (utf8_invalid_at(k) != std::string::npos || utf8_invalid_at(v) != std::string::npos)
            bad(fmt::format("__metadata__ entry {} is not valid UTF-8", q(k)));
    // Largest element first, then name: with an 8-aligned data start every
    // tensor then starts at a multiple of its element size.
    std::stable_sort(order.begin(), order.end(), [](const Out& a, const Out& b) {
        return dtype_size(a.view->dtype) > dtype_size(b.view->dtype);
    });

    json header = json::object();  // std::map-backed: keys come out sorted
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    for (const Out& o : order) {
        header[*o.name] = {{"dtype", safetensors_dtype_name(to_safetensors_dtype(o.view->dtype))},
                           {"shape", o.view->shape},
                           {"data_offsets", {offset, offset + o.nbytes}}};
        offset += o.nbytes;
    }
    std::string text = header.dump();  // inputs are UTF-8-checked above, so dump() cannot throw
    text.append((8 - text.size() % 8) % 8, ' ');
    if (text.size() > kSafetensorsMaxHeader)
        bad(fmt::format("header would be {} bytes, more than readers accept ({})", text.size(), kSafetensorsMaxHeader));

    // --- write atomically (core/io: temporary, fsync, rename, folder fsync) --
    AtomicFile out(path);
    std::array<std::byte, 8> len{};
    for (int i = 0; i < 8; ++i) len[static_cast<std::size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
    out.write(len.data(), len.size());
    out.write(text.data(), text.size());
    for (const Out& o : order) out.write(o.view->data, static_cast<std::size_t>(o.nbytes));
    out.commit();
}

}  // namespace kvasir
