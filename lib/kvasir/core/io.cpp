#include "kvasir/core/io.hpp"

#include "kvasir/core/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvasir {

void write_file_atomic(const std::string& path, std::string_view content) {
    namespace fs = std::filesystem;
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::string name = ".";
    name += target.filename().string();
    name += ".tmp-XXXXXX";
    std::string tmpl = (dir / name).string();
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) fail(ErrorCode::bad_input, "{}: cannot create a temporary file beside it: {}", path, std::strerror(errno));
    const auto abandon = [&](const char* what) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmpl.c_str());
        fail(ErrorCode::bad_input, "{}: {}: {}", path, what, std::strerror(err));
    };
    std::size_t done = 0;
    while (done < content.size()) {
        const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            abandon("write failed");
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fchmod(fd, 0644) != 0) abandon("chmod failed");
    if (::fsync(fd) != 0) abandon("fsync failed");
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmpl.c_str());
        fail(ErrorCode::bad_input, "{}: close failed: {}", path, std::strerror(err));
    }
    if (::rename(tmpl.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmpl.c_str());
        fail(ErrorCode::bad_input, "{}: rename failed: {}", path, std::strerror(err));
    }
    // Make the rename itself durable.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) fail(ErrorCode::bad_input, "{}: cannot read: {}", path, ec.message());
    if (size > max_bytes) fail(ErrorCode::bad_input, "{}: file is {} bytes, more than the {} allowed", path, size, max_bytes);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::bad_input, "{}: cannot open", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace kvasir
