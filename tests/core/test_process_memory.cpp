// core/process_memory: a process's own memory (anonymous + shared) grows with
// what it allocates and touches, not with the file pages it maps and reads —
// which resident memory counts. The peak watch sees an allocation freed before
// it is asked.
#include "kvasir/core/process_memory.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

using namespace kvasir;

namespace {

constexpr std::size_t kMiB = 1u << 20;
constexpr std::size_t kBytes = 256 * kMiB;

TEST(ProcessMemory, OwnGrowsWithTouchedAnonymousMemory) {
    const auto before = process_memory();
    ASSERT_TRUE(before.has_value());
    EXPECT_LE(before->own, before->resident);
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memset(p, 1, kBytes);
    const auto after = process_memory();
    ::munmap(p, kBytes);
    ASSERT_TRUE(after.has_value());
    EXPECT_GE(after->own, before->own + kBytes - 8 * kMiB);
    EXPECT_GE(after->resident, before->resident + kBytes - 8 * kMiB);
}

TEST(ProcessMemory, MappedFilePagesAreResidentButNotOwn) {
    const std::string path = (std::filesystem::temp_directory_path() / ("kvasir_pm_" + std::to_string(::getpid()))).string();
    {
        const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kBytes)), 0);
        std::unique_ptr<char[]> chunk(new char[kMiB]);
        std::memset(chunk.get(), 7, kMiB);
        for (std::size_t i = 0; i < kBytes / kMiB; ++i) ASSERT_EQ(::pwrite(fd, chunk.get(), kMiB, static_cast<off_t>(i * kMiB)), static_cast<ssize_t>(kMiB));
        ::close(fd);
    }
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    void* p = ::mmap(nullptr, kBytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    const auto before = process_memory();
    std::uint64_t sum = 0;
    const auto* bytes = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < kBytes; i += 4096) sum += bytes[i];
    const auto after = process_memory();
    ::munmap(p, kBytes);
    std::filesystem::remove(path);
    EXPECT_EQ(sum, 7u * (kBytes / 4096));
    ASSERT_TRUE(before && after);
    EXPECT_GE(after->resident, before->resident + kBytes - 8 * kMiB);  // every page read is resident
    EXPECT_LT(after->own, before->own + 8 * kMiB);                     // none of them is the process's own
}

TEST(ProcessMemory, PeakWatchSeesMemoryFreedBeforeItIsAsked) {
    const PeakMemoryWatch watch(1);
    const auto base = process_memory();
    ASSERT_TRUE(base.has_value());
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memset(p, 1, kBytes);
    // Held until the watch's thread has sampled it twice (peak_own() would sample by itself).
    const std::uint64_t taken = watch.samples();
    while (watch.samples() < taken + 2) ::usleep(1000);
    ::munmap(p, kBytes);
    const auto now = process_memory();
    ASSERT_TRUE(now.has_value());
    EXPECT_LT(now->own, base->own + 8 * kMiB);
    EXPECT_GE(watch.peak_own(), base->own + kBytes - 8 * kMiB);
}

TEST(ProcessMemory, AnotherProcessIsReadByPid) {
    const auto self = process_memory(::getpid());
    ASSERT_TRUE(self.has_value());
    EXPECT_GT(self->resident, 0u);
    EXPECT_FALSE(process_memory(-12345).has_value());
}

}  // namespace
