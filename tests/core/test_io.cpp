// core/io: every kind of path that is not a regular file is refused by name
// before it is read (a FIFO never blocks), permission denied and symlink
// loops say so, and the atomic write never replaces a non-regular file,
// leaves no temporary behind on an exception or SIGINT/SIGTERM, and ignores
// a stale temporary a kill -9 left.
#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace fs = std::filesystem;
using namespace kvasir;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        std::string t = (fs::temp_directory_path() / "kvasir-io-XXXXXX").string();
        EXPECT_NE(::mkdtemp(t.data()), nullptr);
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

// The call throws Error(bad_input) whose message holds `path` and `words`.
void expect_refusal(const std::function<void()>& f, const std::string& path, const std::string& words) {
    try {
        f();
        ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_input) << e.what();
        const std::string m = e.what();
        EXPECT_NE(m.find(path), std::string::npos) << m;
        EXPECT_NE(m.find(words), std::string::npos) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << "not one line: " << m;
    }
}

std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void put(const std::string& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A listening-free unix socket bound at `p`.
void make_socket(const std::string& p) {
    const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(s, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    ASSERT_LT(p.size(), sizeof a.sun_path);
    std::strcpy(a.sun_path, p.c_str());
    ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
    ::close(s);
}

std::size_t entries(const fs::path& dir) {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
    return n;
}

}  // namespace

TEST(InputPaths, EveryNonRegularKindIsRefusedByName) {
    TempDir t;
    const std::string fifo = t.file("fifo"), sock = t.file("sock"), dir = t.file("dir"), loop = t.file("loop"),
                      dangling = t.file("dangling"), to_fifo = t.file("to_fifo"), regular = t.file("ok.txt");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    make_socket(sock);
    fs::create_directory(dir);
    fs::create_symlink("loop2", loop);
    fs::create_symlink("loop", t.file("loop2"));
    fs::create_symlink("nowhere", dangling);
    fs::create_symlink("fifo", to_fifo);
    put(regular, "12 34");

    // A FIFO with no writer: refused at once, never opened for a blocking read.
    expect_refusal([&] { read_text_file(fifo); }, fifo, "is a FIFO (named pipe), not a regular file");
    expect_refusal([&] { read_text_file(to_fifo); }, to_fifo, "is a FIFO (named pipe), not a regular file");
    expect_refusal([&] { (void)open_input_file(fifo); }, fifo, "FIFO");
    expect_refusal([&] { read_text_file(sock); }, sock, "is a socket, not a regular file");
    expect_refusal([&] { read_text_file("/dev/zero"); }, "/dev/zero", "is a character device, not a regular file");
    expect_refusal([&] { read_text_file(dir); }, dir, "is a directory, not a regular file");
    expect_refusal([&] { read_text_file(loop); }, loop, "a symlink loop");
    expect_refusal([&] { read_text_file(dangling); }, dangling, "a symlink to nothing");
    expect_refusal([&] { read_text_file(t.file("missing")); }, t.file("missing"), "no such file or directory");
    expect_refusal([&] { read_text_file(regular + "/x"); }, regular + "/x", "not a directory");
    expect_refusal([&] { read_text_file(""); }, "", "an empty path");
    // A directory is accepted only where one may be given.
    EXPECT_TRUE(check_input_path(dir, InputKind::file_or_directory));
    EXPECT_FALSE(check_input_path(regular, InputKind::file_or_directory));
    expect_refusal([&] { (void)check_input_path(fifo, InputKind::file_or_directory); }, fifo, "FIFO");
    EXPECT_EQ(read_text_file(regular), "12 34");
    expect_refusal([&] { read_text_file(regular, 4); }, regular, "5 bytes, more than the 4 allowed");
}

TEST(InputPaths, PermissionDeniedSaysSo) {
    TempDir t;
    const std::string secret = t.file("secret.json");
    put(secret, "{}");
    ::chmod(secret.c_str(), 0);
    ::chmod(t.path.c_str(), 0755);
    // root reads anything: drop to an unprivileged user in a child process.
    EXPECT_EXIT(
        {
            if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(9);
            int rc = 1;
            try {
                read_text_file(secret);
            } catch (const Error& e) {
                const std::string m = e.what();
                if (m == secret + ": permission denied") rc = 0;
                else std::fprintf(stderr, "%s\n", m.c_str());
            }
            std::_Exit(rc);
        },
        ::testing::ExitedWithCode(0), "");
}

TEST(AtomicWrite, NeverReplacesANonRegularFileAndNamesIt) {
    TempDir t;
    const std::string fifo = t.file("out.fifo"), sock = t.file("out.sock"), dir = t.file("out.dir");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    make_socket(sock);
    fs::create_directory(dir);
    expect_refusal([&] { write_file_atomic(fifo, "x"); }, fifo, "is a FIFO (named pipe); an output is never written over one");
    expect_refusal([&] { write_file_atomic(sock, "x"); }, sock, "is a socket; an output is never written over one");
    expect_refusal([&] { write_file_atomic(dir, "x"); }, dir, "is a directory; an output is never written over one");
    fs::create_symlink("out.fifo", t.file("link"));
    expect_refusal([&] { write_file_atomic(t.file("link"), "x"); }, t.file("link"), "FIFO");
    expect_refusal([&] { write_file_atomic("", "x"); }, "", "an empty output path");
    EXPECT_TRUE(fs::is_fifo(fifo));
    EXPECT_TRUE(fs::is_socket(sock));
    EXPECT_TRUE(fs::is_directory(dir));
    EXPECT_EQ(entries(t.path), 4u) << "a temporary was left behind";
}

TEST(AtomicWrite, OutputPathsAreCheckedTogether) {
    TempDir t;
    const std::string a = t.file("a.json");
    fs::create_symlink("a.json", t.file("alias.json"));
    check_output_paths({{"--output", a}, {"--junit", t.file("b.xml")}});
    expect_refusal([&] { check_output_paths({{"--output", a}, {"--junit", a}}); }, a, "--output and --junit name the same file");
    // Another spelling, and a symlink to it (neither exists yet / the link's target does not).
    const std::string other = (t.path / "." / "a.json").string();
    expect_refusal([&] { check_output_paths({{"--output", a}, {"--html", other}}); }, other, "--output and --html name the same file");
    expect_refusal([&] { check_output_paths({{"--output", a}, {"--html", t.file("alias.json")}}); }, t.file("alias.json"),
                   "name the same file");
    expect_refusal([&] { check_output_paths({{"--markdown", ""}}); }, "--markdown", "an empty path");
    fs::create_directory(t.file("d"));
    expect_refusal([&] { check_output_paths({{"--csv", t.file("d")}}); }, "--csv " + t.file("d"), "is a directory");
}

// -o /dev/null: the output is discarded (nothing created beside it, the
// device untouched), as often as it is named; every other device is still
// refused, and says which one is allowed.
TEST(AtomicWrite, TheNullDeviceDiscardsAndNoOtherDeviceIsWritten) {
    struct stat before {};
    ASSERT_EQ(::stat("/dev/null", &before), 0);
    write_file_atomic("/dev/null", "discarded");
    {
        AtomicFile f("/dev/null");
        f.write("x", 1);
        f.commit();
    }
    TempDir t;
    fs::create_symlink("/dev/null", t.file("sink"));
    write_file_atomic(t.file("sink"), "discarded too");
    EXPECT_TRUE(fs::is_symlink(t.file("sink"))) << "the link was replaced";
    EXPECT_EQ(entries(t.path), 1u) << "a temporary was left behind";
    check_output_paths({{"--output", "/dev/null"}, {"--html", "/dev/null"}, {"--junit", t.file("sink")}});
    struct stat after {};
    ASSERT_EQ(::stat("/dev/null", &after), 0);
    EXPECT_TRUE(S_ISCHR(after.st_mode));
    EXPECT_EQ(after.st_rdev, before.st_rdev);
    expect_refusal([&] { write_file_atomic("/dev/zero", "x"); }, "/dev/zero",
                   "is a character device; an output is never written over one (of the devices only /dev/null");
    expect_refusal([&] { check_output_paths({{"--output", "/dev/full"}}); }, "--output /dev/full", "is a character device");
}

// SIGINT or SIGTERM while a report is half-written: the process dies by the
// signal (its default action is kept), the old report is intact and the
// temporary is gone.
void interrupted_mid_write(int sig) {
    TempDir t;
    const std::string p = t.file("report.json");
    put(p, "previous");
    EXPECT_EXIT(
        {
            AtomicFile f(p);
            f.write("half of a new rep", 17);
            ::raise(sig);
            std::_Exit(0);  // not reached
        },
        ::testing::KilledBySignal(sig), "");
    EXPECT_EQ(slurp(p), "previous");
    EXPECT_EQ(entries(t.path), 1u) << "the temporary survived the signal";
}

TEST(AtomicWrite, SigintAndSigtermRemoveTheTemporary) {
    interrupted_mid_write(SIGINT);
    interrupted_mid_write(SIGTERM);
}

TEST(AtomicWrite, AnExceptionRemovesTheTemporaryAndAStaleOneIsLeftAlone) {
    TempDir t;
    const std::string p = t.file("r.json");
    // What a kill -9 during an earlier write left: a hidden temporary.
    const std::string stale = t.file(".r.json.tmp-AbC123");
    put(stale, "partial");
    put(p, "old");
    try {
        AtomicFile f(p);
        f.write("new", 3);
        throw std::runtime_error("a step failed");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(slurp(p), "old");
    EXPECT_EQ(entries(t.path), 2u);
    write_file_atomic(p, "new report");
    EXPECT_EQ(slurp(p), "new report");
    EXPECT_EQ(slurp(stale), "partial") << "a stale temporary is neither reused nor mistaken for the report";
    EXPECT_EQ(entries(t.path), 2u);
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms(0644));
}
