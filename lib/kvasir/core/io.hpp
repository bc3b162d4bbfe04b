// File output that never leaves a half-written report behind.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvasir {

// A file written atomically, the one mechanism behind every report and
// capture: the bytes go to a temporary file beside `path`
// (".NAME.tmp-XXXXXX", six random characters, created with O_EXCL); commit() fsyncs it,
// renames it over `path` and fsyncs the folder. Until then `path` keeps its
// previous content. The temporary is removed when the AtomicFile is destroyed
// uncommitted (an exception), and when the process is interrupted by SIGINT,
// SIGTERM or SIGHUP: a handler, installed with the first AtomicFile where the
// signal's action is the default, removes every temporary in flight and then
// lets the signal take its default action. Only a kill -9 can leave one
// behind; its hidden ".*.tmp-XXXXXX" name is never read as anything and a
// later write makes a fresh one.
// Refused with Error(bad_input) naming the path, before anything is created:
// an empty path, and an existing `path` that is not a regular file (a FIFO,
// socket, device or directory is never replaced by the rename). The null
// device is the one exception: an output named there (-o /dev/null) is
// discarded — nothing is created, written or renamed.
class AtomicFile {
public:
    explicit AtomicFile(std::string path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, std::size_t n);
    void commit();
    const std::string& path() const { return path_; }

private:
    std::string path_, temp_;
    int fd_ = -1;
    int slot_ = -1;  // in the signal handler's table
    bool discard_ = false;  // the null device: every write is dropped
    [[noreturn]] void abandon(const char* what, int err);
};

// A folder of temporary files (the isolated audit's captures and logs),
// registered with the same SIGINT/SIGTERM/SIGHUP handler: on such a signal
// the files directly in it are unlinked and the folder removed, with
// async-signal-safe calls only (getdents64 on a descriptor opened here,
// unlinkat, rmdir). The guard does not remove the folder itself on
// destruction — its owner does, normally; it only unregisters it.
class TemporaryFolderGuard {
public:
    explicit TemporaryFolderGuard(const std::string& path);
    ~TemporaryFolderGuard();
    TemporaryFolderGuard(const TemporaryFolderGuard&) = delete;
    TemporaryFolderGuard& operator=(const TemporaryFolderGuard&) = delete;

private:
    int slot_ = -1;
};

// AtomicFile in one call: `content` written atomically to `path`.
void write_file_atomic(const std::string& path, std::string_view content);

// Refuses, before a run starts, output paths that cannot be written as
// reports: an empty path, an existing non-regular file (checked as
// AtomicFile does; the null device is allowed, any number of times), and one path given for two outputs (also through a
// symlink or another spelling: the same file). `outputs` are (option, path)
// pairs; empty paths of options not given must be left out.
void check_output_paths(const std::vector<std::pair<std::string, std::string>>& outputs);

// Whole-file read with a size bound, through open_input_file(); Error(bad_input)
// naming the path on failure.
std::string read_text_file(const std::string& path, std::size_t max_bytes = 64u << 20);

// What an input path may be.
enum class InputKind { file, file_or_directory };

// Checks, before anything is opened, that `path` (symlinks followed) is what
// the caller reads: a regular file (or, where allowed, a directory). Refuses
// with Error(bad_input), naming the path and exactly what is wrong: "no such
// file or directory" only when there is none (a dangling symlink says so), a
// symlink loop, permission denied, or what it is instead — a FIFO, a socket,
// a character or block device, a directory. Returns true for a directory.
bool check_input_path(const std::string& path, InputKind kind = InputKind::file);

// Opens a regular file for reading (O_RDONLY | O_CLOEXEC) and returns the
// descriptor; the caller closes it. Refuses everything check_input_path()
// refuses, and is safe against a path swapped in between: it opens with
// O_NONBLOCK (a FIFO does not block the open) and checks the opened
// descriptor's own type with fstat before restoring blocking reads.
int open_input_file(const std::string& path);

}  // namespace kvasir
