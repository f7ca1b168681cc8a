// RAII memory mappings: a read-only view of a whole file (the reader's zero-copy source) and a
// writable, pre-sized output file (the writer fills tensors in place, no staging copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace tandem::model {

class MappedFile {
 public:
  // Maps `path` read-only; throws Io naming the path and the OS error.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A new file of exactly `size` bytes (zero-filled) mapped read-write. The space is reserved up
// front so a full disk is an Io error here, not a SIGBUS later. Unless commit() is called the
// destructor removes the file, so a failed write leaves nothing half-written behind.
class MappedOutputFile {
 public:
  MappedOutputFile(const std::string& path, size_t size);
  MappedOutputFile(const MappedOutputFile&) = delete;
  MappedOutputFile& operator=(const MappedOutputFile&) = delete;
  ~MappedOutputFile();

  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  // Drops the whole pages inside [offset, offset + bytes) from this process: they stay in the
  // page cache and are written back, but a multi-GB write no longer shows up as our RSS.
  void release(size_t offset, size_t bytes);
  // Unmaps and closes the file, keeping it; throws Io if the OS reports a failure.
  void commit();

 private:
  void close_mapping() noexcept;
  std::string path_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool committed_ = false;
};

}  // namespace tandem::model
