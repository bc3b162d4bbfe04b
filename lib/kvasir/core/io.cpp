#include "kvasir/core/io.hpp"

#include "kvasir/core/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <signal.h>
#include <sys/syscall.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

namespace kvasir {

namespace {

// What a non-regular file is, in words.
const char* kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "not a regular file";
}

// The null device (Linux: character device 1:3), under any name: an output
// named there is discarded, as every Unix tool's is.
bool is_null_device(const struct stat& st) {
    return S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3;
}

[[noreturn]] void refuse_errno(const std::string& path, int err) {
    if (err == ENOENT) {
        struct stat l {};
        if (::lstat(path.c_str(), &l) == 0 && S_ISLNK(l.st_mode))
            fail(ErrorCode::bad_input, "{}: a symlink to nothing (its target does not exist)", path);
        fail(ErrorCode::bad_input, "{}: no such file or directory", path);
    }
    if (err == ELOOP) fail(ErrorCode::bad_input, "{}: a symlink loop (too many levels of symbolic links)", path);
    if (err == EACCES || err == EPERM) fail(ErrorCode::bad_input, "{}: permission denied", path);
    if (err == ENOTDIR) fail(ErrorCode::bad_input, "{}: a part of the path is not a directory", path);
    if (err == ENAMETOOLONG) fail(ErrorCode::bad_input, "{}: name too long", path);
    fail(ErrorCode::bad_input, "{}: cannot open: {}", path, std::strerror(err));
}

}  // namespace

bool check_input_path(const std::string& path, InputKind kind) {
    if (path.empty()) fail(ErrorCode::bad_input, "an empty path where a file is expected");
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) refuse_errno(path, errno);
    if (S_ISREG(st.st_mode)) return false;
    if (S_ISDIR(st.st_mode) && kind == InputKind::file_or_directory) return true;
    fail(ErrorCode::bad_input, "{}: is {}, not a regular file", path, kind_of(st.st_mode));
}

int open_input_file(const std::string& path) {
    (void)check_input_path(path);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) refuse_errno(path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(ErrorCode::bad_input, "{}: is {}, not a regular file", path, kind_of(st.st_mode));
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
    const int fd = open_input_file(path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fail(ErrorCode::bad_input, "{}: cannot read: {}", path, std::strerror(err));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > max_bytes) {
        ::close(fd);
        fail(ErrorCode::bad_input, "{}: file is {} bytes, more than the {} allowed", path, size, max_bytes);
    }
    std::string text;
    try {
        text.resize(static_cast<std::size_t>(size));
    } catch (...) {
        ::close(fd);
        throw;
    }
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = n < 0 ? errno : 0;
            ::close(fd);
            fail(ErrorCode::bad_input, "{}: {}", path, err != 0 ? std::string("read failed: ") + std::strerror(err)
                                                               : std::string("short read (the file shrank while it was read)"));
        }
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return text;
}

// --- atomic writes --------------------------------------------------------

namespace {

// Temporaries in flight, for the signal handler: lock-free slots holding
// heap copies of the paths (the handler only reads them and calls unlink,
// which is async-signal-safe).
constexpr int kTempSlots = 64;
std::atomic<char*> g_temp_slots[kTempSlots];
std::atomic<bool> g_handlers_installed{false};
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Registered temporary folders: an open descriptor (for getdents64) and the path.
constexpr int kFolderSlots = 8;
struct FolderSlot {
    std::atomic<char*> path{nullptr};
    std::atomic<int> fd{-1};
};
FolderSlot g_folder_slots[kFolderSlots];

// The Linux getdents64 record (man 2 getdents).
struct LinuxDirent64 {
    std::uint64_t d_ino;
    std::int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[1];
};

// Unlinks every entry directly in the folder `fd`, then the folder: raw
// syscalls only, safe in a signal handler.
void empty_and_remove(int fd, const char* path) {
    alignas(8) char buf[4096];
    ::lseek(fd, 0, SEEK_SET);
    for (;;) {
        const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
            const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
            const char* name = d->d_name;
            if (!(name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))) ::unlinkat(fd, name, 0);
            off += d->d_reclen;
        }
    }
    ::rmdir(path);
}

extern "C" void remove_temporaries_and_reraise(int sig) {
    for (auto& slot : g_temp_slots)
        if (char* p = slot.exchange(nullptr)) ::unlink(p);  // the heap copy leaks: the process is ending
    for (auto& f : g_folder_slots) {
        char* p = f.path.exchange(nullptr);
        const int fd = f.fd.exchange(-1);
        if (p != nullptr && fd >= 0) empty_and_remove(fd, p);
    }
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

void install_cleanup_handlers() {
    if (g_handlers_installed.exchange(true)) return;
    for (int sig : kCleanupSignals) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // ignored (nohup) or owned by someone else
        struct sigaction sa {};
        sa.sa_handler = remove_temporaries_and_reraise;
        sigemptyset(&sa.sa_mask);
        for (int s : kCleanupSignals) sigaddset(&sa.sa_mask, s);
        ::sigaction(sig, &sa, nullptr);
    }
}

int register_temporary(const std::string& path) {
    char* copy = ::strdup(path.c_str());
    if (copy == nullptr) return -1;
    for (int i = 0; i < kTempSlots; ++i) {
        char* expected = nullptr;
        if (g_temp_slots[i].compare_exchange_strong(expected, copy)) return i;
    }
    std::free(copy);  // table full (64 writes at once): this one is only removed by the destructor
    return -1;
}

void unregister_temporary(int slot) {
    if (slot < 0) return;
    std::free(g_temp_slots[slot].exchange(nullptr));
}

// Why `path` cannot be an output ("" when it can): an existing output that is
// not a regular file is never replaced — the null device excepted, where the
// output is discarded.
std::string output_target_problem(const std::string& path) {
    if (path.empty()) return "an empty output path";
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !is_null_device(st))
        return fmt::format("{}: is {}; an output is never written over one{}", path, kind_of(st.st_mode),
                           S_ISCHR(st.st_mode) ? " (of the devices only /dev/null, which discards it)" : "");
    return {};
}

void check_output_target(const std::string& path) {
    if (const std::string why = output_target_problem(path); !why.empty()) fail(ErrorCode::bad_input, "{}", why);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
    namespace fs = std::filesystem;
    check_output_target(path_);
    if (struct stat st {}; ::stat(path_.c_str(), &st) == 0 && is_null_device(st)) {
        discard_ = true;  // -o /dev/null: nothing to create, write or rename
        return;
    }
    install_cleanup_handlers();
    const fs::path target(path_);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    // The temporary is registered for the signal handler BEFORE it is
    // created (O_EXCL), so no signal, on any thread, can fall between the
    // two and leave it behind; a name already taken is unregistered again
    // and another one drawn.
    static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 gen{std::random_device{}() ^ (static_cast<std::uint64_t>(::getpid()) << 32)};
    int err = EEXIST;
    for (int attempt = 0; attempt < 100 && fd_ < 0 && err == EEXIST; ++attempt) {
        std::string name = ".";
        name += target.filename().string();
        name += ".tmp-";
        for (int i = 0; i < 6; ++i) name += kChars[gen() % (sizeof kChars - 1)];
        temp_ = (dir / name).string();
        slot_ = register_temporary(temp_);
        fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd_ < 0) {
            err = errno;
            unregister_temporary(slot_);
            slot_ = -1;
        }
    }
    if (fd_ < 0) fail(ErrorCode::bad_input, "{}: cannot create a temporary file beside it: {}", path_, std::strerror(err));
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty()) ::unlink(temp_.c_str());
    unregister_temporary(slot_);
}

void AtomicFile::abandon(const char* what, int err) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(temp_.c_str());
    temp_.clear();
    unregister_temporary(slot_);
    slot_ = -1;
    fail(ErrorCode::bad_input, "{}: {}: {}", path_, what, std::strerror(err));
}

void AtomicFile::write(const void* data, std::size_t n) {
    if (discard_) return;
    KVASIR_ASSERT(fd_ >= 0);
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);  // ≤ what one write() moves on Linux
        const ssize_t w = ::write(fd_, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) abandon("cannot write", w < 0 ? errno : EIO);
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

void AtomicFile::commit() {
    namespace fs = std::filesystem;
    if (discard_) return;
    KVASIR_ASSERT(fd_ >= 0);
    if (::fchmod(fd_, 0644) != 0) abandon("chmod failed", errno);
    if (::fsync(fd_) != 0) abandon("fsync failed", errno);
    const int r = ::close(fd_);
    fd_ = -1;
    if (r != 0) abandon("close failed", errno);
    check_output_target(path_);  // became a FIFO or a folder meanwhile: still never replaced
    if (::rename(temp_.c_str(), path_.c_str()) != 0) abandon("cannot rename the temporary file into place", errno);
    temp_.clear();
    unregister_temporary(slot_);
    slot_ = -1;
    // Make the rename itself durable.
    const fs::path target(path_);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

TemporaryFolderGuard::TemporaryFolderGuard(const std::string& path) {
    install_cleanup_handlers();
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;  // not removable on a signal; its owner still removes it normally
    char* copy = ::strdup(path.c_str());
    for (int i = 0; i < kFolderSlots && copy != nullptr; ++i) {
        char* expected = nullptr;
        if (g_folder_slots[i].path.compare_exchange_strong(expected, copy)) {
            g_folder_slots[i].fd.store(fd);
            slot_ = i;
            return;
        }
    }
    std::free(copy);
    ::close(fd);
}

TemporaryFolderGuard::~TemporaryFolderGuard() {
    if (slot_ < 0) return;
    const int fd = g_folder_slots[slot_].fd.exchange(-1);
    std::free(g_folder_slots[slot_].path.exchange(nullptr));
    if (fd >= 0) ::close(fd);
}

void write_file_atomic(const std::string& path, std::string_view content) {
    AtomicFile f(path);
    f.write(content.data(), content.size());
    f.commit();
}

void check_output_paths(const std::vector<std::pair<std::string, std::string>>& outputs) {
    namespace fs = std::filesystem;
    std::vector<std::pair<std::string, fs::path>> seen;
    for (const auto& [option, path] : outputs) {
        if (path.empty()) fail(ErrorCode::bad_input, "{}: an empty path", option);
        if (const std::string why = output_target_problem(path); !why.empty()) fail(ErrorCode::bad_input, "{} {}", option, why);
        // Any number of outputs may be discarded into the null device.
        if (struct stat st {}; ::stat(path.c_str(), &st) == 0 && is_null_device(st)) continue;
        // The file a write would reach: symlinks followed even where their
        // target does not exist yet (a rename replaces the link, but two
        // outputs through one link are still one mistake).
        std::error_code ec;
        fs::path p = fs::absolute(path, ec);
        for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
            const fs::path target = fs::read_symlink(p, ec);
            if (ec) break;
            p = target.is_absolute() ? target : p.parent_path() / target;
        }
        fs::path canonical = fs::weakly_canonical(p, ec);
        if (ec) canonical = p.lexically_normal();
        for (const auto& [other, earlier] : seen) {
            std::error_code eq;
            if (earlier == canonical || fs::equivalent(earlier, canonical, eq))
                fail(ErrorCode::bad_input, "{} and {} name the same file {}: each report needs its own", other, option, path);
        }
        seen.emplace_back(option, std::move(canonical));
    }
}

}  // namespace kvasir
