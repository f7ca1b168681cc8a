#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "tandem/bytes.h"
#include "tandem/error.h"

namespace tandem::model {
namespace {

[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw_error(ErrorCode::Io, "gguf " + path, what + " (" + std::strerror(err) + ")");
}

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw_io(path, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_error(ErrorCode::Io, "gguf " + path, "not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw_io(path, "cannot map " + std::to_string(size_) + " bytes", err);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  release();
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedOutputFile::MappedOutputFile(const std::string& path, size_t size)
    : path_(path), size_(size) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io(path, "cannot create", errno);
  if (size_ == 0) return;
  // fallocate reserves the blocks (ENOSPC now rather than SIGBUS on a page fault later);
  // filesystems without it fall back to a sparse file.
  int rc = ::fallocate(fd_, 0, 0, off_t(size_));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) rc = ::ftruncate(fd_, off_t(size_));
  if (rc != 0) {
    int err = errno;
    close_mapping();
    ::unlink(path_.c_str());
    throw_io(path, "cannot reserve " + std::to_string(size_) + " bytes", err);
  }
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close_mapping();
    ::unlink(path_.c_str());
    throw_io(path, "cannot map " + std::to_string(size_) + " bytes for writing", err);
  }
  data_ = static_cast<uint8_t*>(p);
}

void MappedOutputFile::release(size_t offset, size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  size_t begin = align_up(offset, page);
  size_t end = std::min(offset + bytes, size_) / page * page;
  // MADV_DONTNEED on a shared file mapping keeps the data (the pages are marked dirty first).
  if (data_ != nullptr && begin < end) ::madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

void MappedOutputFile::close_mapping() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void MappedOutputFile::commit() {
  int err = 0;
  if (data_ != nullptr && ::munmap(data_, size_) != 0) err = errno;
  data_ = nullptr;
  if (fd_ >= 0 && ::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0) {
    ::unlink(path_.c_str());
    throw_io(path_, "cannot finish writing", err);
  }
  committed_ = true;
}

MappedOutputFile::~MappedOutputFile() {
  close_mapping();
  if (!committed_) ::unlink(path_.c_str());
}

}  // namespace tandem::model
