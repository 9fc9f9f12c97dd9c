// Reading and writing safetensors files (https://huggingface.co/docs/safetensors: an 8-byte
// little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw
// little-endian data). Used for --save-params and by the tests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "atomic_file.h"

namespace dos {

/// One tensor to write: name, safetensors dtype string ("F32", "F16", "BF16"), shape (elements per
/// dimension; the product must equal bytes / element size), and a pointer to `bytes` bytes of data,
/// or, when `pieces` is not empty, the data in pieces (pointer, bytes) written one after another
/// (their bytes must add up to `bytes`; `data` is then unused): a tensor spread over several
/// buffers is written without being gathered first.
struct SafetensorOut {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  const void* data;
  std::size_t bytes;
  std::vector<std::pair<const void*, std::size_t>> pieces = {};
};

/// Writes `tensors` to `path` atomically (write_file_atomically in atomic_file.h): a failure
/// (full disk, bad folder) leaves no file and no half-written one behind.
/// Throws std::runtime_error naming the path and the system error when the file cannot be written,
/// and std::invalid_argument on duplicate names or a shape that does not match the byte count.
void write_safetensors(const std::string& path, const std::vector<SafetensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// The same in two phases: returns the written, uncommitted file (PendingFile in atomic_file.h);
/// its commit() puts it in place. The tensors' data must stay alive until this returns.
std::unique_ptr<PendingFile> prepare_safetensors(const std::string& path, const std::vector<SafetensorOut>& tensors,
                                                 const std::map<std::string, std::string>& metadata = {});

/// A tensor read back: dtype string, shape and the raw bytes.
struct SafetensorIn {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> data;
};

/// Reads a whole safetensors file. Throws std::runtime_error when the file cannot be read or is not
/// a well-formed safetensors file (the message says which).
std::map<std::string, SafetensorIn> read_safetensors(const std::string& path);

/// A safetensors file opened for reading parts of its tensors: the header is parsed on opening, and
/// read() fetches byte ranges with pread, so that a reader of one slice never holds the file (a
/// checkpoint re-sharded to more ranks reads each rank's elements only).
class SafetensorsReader {
 public:
  /// One tensor: dtype string, shape, and its bytes' range [begin, end) in the file's data section.
  struct Entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;
  };
  /// Opens `path` and parses its header. Throws std::runtime_error when the file cannot be opened or
  /// is not a regular file, its header is not well-formed, a tensor's bytes do not match its shape
  /// and dtype, or the tensors do not tile the data section exactly (overlap, gap, truncation); the
  /// message says which. Metadata values that are not strings are ignored.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  /// The opened file's identity (device, inode, size, modification time in ns): equal for two
  /// readers only when they read the same, unchanged file.
  const std::vector<std::uint64_t>& identity() const { return identity_; }
  /// The header's "__metadata__" (string to string; empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Copies `bytes` bytes of tensor `name`, from byte `offset` of it, into `dst`. Throws
  /// std::runtime_error for an unknown tensor, a range beyond its end, or a failed read.
  void read(const std::string& name, std::uint64_t offset, void* dst, std::size_t bytes) const;

 private:
  void read_at(std::uint64_t at, void* dst, std::size_t bytes) const;  // pread until done (EINTR, short reads)
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::uint64_t> identity_;
};

}  // namespace dos
