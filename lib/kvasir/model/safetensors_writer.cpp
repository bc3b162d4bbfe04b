// write_safetensors (safetensors_writer.hpp): the canonical layout and the
// atomic write (temporary file, fsync, rename, directory fsync).
#include "kvasir/model/safetensors_writer.hpp"

#include "kvasir/core/error.hpp"
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


// Closes/unlinks the temporary file unless released: every early exit
// (exception included) leaves no temporary behind.
class TempFile {
public:
    TempFile(std::string p, int fd) : path_(std::move(p)), fd_(fd) {}
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!path_.empty()) ::unlink(path_.c_str());
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    int fd() const { return fd_; }
    const std::string& path() const { return path_; }
    int close() {
        const int r = ::close(fd_);
        fd_ = -1;
        return r;
    }
    void release() { path_.clear(); }

private:
    std::string path_;
    int fd_;
};

void write_all(int fd, const std::byte* p, std::size_t n, const std::string& shown) {
    while (n > 0) {
        // Bounded chunks: write() moves at most ~2 GiB per call on Linux anyway.
        const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
        const ssize_t w = ::write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail(ErrorCode::bad_input, "{}: cannot write: {}", shown, std::strerror(errno));
        }
        if (w == 0) fail(ErrorCode::bad_input, "{}: cannot write: no progress", shown);
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

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

    // --- write a temporary file next to the target ---------------------------
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    static std::atomic<unsigned> counter{0};
    int fd = -1;
    std::string tmp;
    for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
        const auto stamp = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
        tmp = (dir / fmt::format(".{}.tmp-{}-{}-{:x}", target.filename().string(), ::getpid(), counter++, stamp & 0xffffff)).string();
        // O_EXCL: never clobber anything; mode 0666 lets the umask decide, as for any new file.
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) bad(fmt::format("cannot create a temporary file in {}: {}", escape(dir.string(), 400), std::strerror(errno)));
    }
    if (fd < 0) bad("cannot create a unique temporary file");
    TempFile temp(tmp, fd);

    std::array<std::byte, 8> len{};
    for (int i = 0; i < 8; ++i) len[static_cast<std::size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
    write_all(fd, len.data(), len.size(), shown);
    write_all(fd, reinterpret_cast<const std::byte*>(text.data()), text.size(), shown);
    for (const Out& o : order)
        write_all(fd, static_cast<const std::byte*>(o.view->data), static_cast<std::size_t>(o.nbytes), shown);
    if (::fsync(fd) != 0) bad(fmt::format("cannot fsync: {}", std::strerror(errno)));
    if (temp.close() != 0) bad(fmt::format("cannot close: {}", std::strerror(errno)));
    if (::rename(tmp.c_str(), path.c_str()) != 0) bad(fmt::format("cannot rename the temporary file into place: {}", std::strerror(errno)));
    temp.release();
    // Make the rename itself durable.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) bad(fmt::format("written, but cannot open its directory to fsync it: {}", std::strerror(errno)));
    const int r = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (r != 0) bad(fmt::format("written, but fsync of its directory failed: {}", std::strerror(err)));
}

}  // namespace kvasir
