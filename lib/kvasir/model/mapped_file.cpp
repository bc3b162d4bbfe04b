#include "kvasir/model/mapped_file.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace kvasir {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
    const int fd = open_input_file(path_);  // a FIFO, device or directory is refused by name, never blocks
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fail(ErrorCode::bad_input, "{}: cannot stat: {}", path_, std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(ErrorCode::bad_input, "{}: not a regular file", path_);
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            fail(ErrorCode::bad_input, "{}: cannot map: {}", path_, std::strerror(err));
        }
        data_ = static_cast<const std::byte*>(p);
        registration_ = ImmutableRegistration(data_, size_);
    }
    ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
    registration_.reset();
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      registration_(std::move(other.registration_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        registration_.reset();
        if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        registration_ = std::move(other.registration_);
    }
    return *this;
}

std::size_t MappedFile::resident_bytes(std::size_t offset, std::size_t length) const {
    if (data_ == nullptr || length == 0 || offset >= size_) return 0;
    if (length > size_ - offset) length = size_ - offset;
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t first = offset / page;
    const std::size_t last = (offset + length - 1) / page;
    std::vector<unsigned char> vec(last - first + 1);
    if (::mincore(const_cast<std::byte*>(data_) + first * page, (last - first + 1) * page, vec.data()) != 0)
        fail(ErrorCode::internal, "{}: mincore failed: {}", path_, std::strerror(errno));
    std::size_t resident = 0;
    for (unsigned char v : vec)
        if (v & 1u) resident += page;
    return resident;
}

void MappedFile::drop_pages() const {
    if (data_ == nullptr) return;
    ::madvise(const_cast<std::byte*>(data_), size_, MADV_DONTNEED);
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    }
}

}  // namespace kvasir
