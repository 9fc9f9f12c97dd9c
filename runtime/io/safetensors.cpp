// Reading and writing safetensors files (safetensors.h).
#include "safetensors.h"

#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace dos {
namespace {

std::size_t dtype_bytes(const std::string& d) {
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  throw std::invalid_argument("safetensors: unknown dtype '" + d + "'");
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  prepare_safetensors(path, tensors, metadata)->commit();
}

std::unique_ptr<PendingFile> prepare_safetensors(const std::string& path, const std::vector<SafetensorOut>& tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::size_t offset = 0;
  for (const SafetensorOut& t : tensors) {
    if (!names.insert(t.name).second) throw std::invalid_argument("safetensors: duplicate tensor name '" + t.name + "'");
    std::size_t elems = 1;
    for (std::int64_t d : t.shape) elems *= std::size_t(d);
    if (elems * dtype_bytes(t.dtype) != t.bytes)
      throw std::invalid_argument("safetensors: shape of '" + t.name + "' does not match its " + std::to_string(t.bytes) + " bytes");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  const std::uint64_t hlen = h.size();

  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hlen >> (8 * i));
  std::vector<std::pair<const void*, std::size_t>> chunks = {{len, 8}, {h.data(), h.size()}};
  for (const SafetensorOut& t : tensors) {
    if (t.pieces.empty()) {
      chunks.emplace_back(t.data, t.bytes);
      continue;
    }
    std::size_t sum = 0;
    for (const auto& piece : t.pieces) sum += piece.second;
    if (sum != t.bytes)
      throw std::invalid_argument("safetensors: the pieces of '" + t.name + "' hold " + std::to_string(sum) +
                                  " bytes, not " + std::to_string(t.bytes));
    chunks.insert(chunks.end(), t.pieces.begin(), t.pieces.end());
  }
  return std::make_unique<PendingFile>(path, chunks);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  struct stat st;  // a folder or a FIFO is refused before open (opening a FIFO would wait for a writer)
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + " is not a regular file");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  try {
    if (::fstat(fd_, &st) != 0) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
    const std::uint64_t file_bytes = std::uint64_t(st.st_size);
    identity_ = {std::uint64_t(st.st_dev), std::uint64_t(st.st_ino), file_bytes,
                 std::uint64_t(st.st_mtim.tv_sec) * 1000000000u + std::uint64_t(st.st_mtim.tv_nsec)};
    if (file_bytes < 8) throw std::runtime_error(path + ": not a safetensors file (shorter than 8 bytes)");
    unsigned char len[8];
    read_at(0, len, 8);
    std::uint64_t hlen = 0;
    for (int i = 0; i < 8; ++i) hlen |= std::uint64_t(len[i]) << (8 * i);
    if (hlen > (100u << 20)) throw std::runtime_error(path + ": not a safetensors file (header length " + std::to_string(hlen) + ")");
    if (8 + hlen > file_bytes)
      throw std::runtime_error(path + ": truncated (" + std::to_string(file_bytes) + " bytes; the header alone needs " +
                               std::to_string(8 + hlen) + ")");
    std::string h(hlen, '\0');
    read_at(8, h.data(), hlen);
    data_start_ = 8 + hlen;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(h);
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ": malformed safetensors header: " + e.what());
    }
    if (!header.is_object()) throw std::runtime_error(path + ": malformed safetensors header: not a JSON object");
    for (auto it = header.begin(); it != header.end(); ++it) {
      try {
        if (it.key() == "__metadata__") {  // string to string by the format; other values are ignored
          if (it.value().is_object())
            for (auto m = it.value().begin(); m != it.value().end(); ++m)
              if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
          continue;
        }
        Entry t;
        t.dtype = it.value().at("dtype").get<std::string>();
        t.shape = it.value().at("shape").get<std::vector<std::int64_t>>();
        const nlohmann::json& off = it.value().at("data_offsets");
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
          throw std::runtime_error("data_offsets must be two whole numbers");
        t.begin = off[0].get<std::uint64_t>();
        t.end = off[1].get<std::uint64_t>();
        std::uint64_t elems = 1;
        for (std::int64_t d : t.shape) {
          if (d < 0 || (d > 0 && elems > (std::uint64_t(1) << 62) / std::uint64_t(d)))
            throw std::runtime_error("bad shape");
          elems *= std::uint64_t(d);
        }
        if (t.begin > t.end || t.end - t.begin != elems * dtype_bytes(t.dtype))
          throw std::runtime_error("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                   ") do not hold its shape's " + std::to_string(elems) + " elements of " + t.dtype);
        tensors_.emplace(it.key(), std::move(t));
      } catch (const std::exception& e) {
        throw std::runtime_error(path + ": bad entry '" + it.key() + "': " + e.what());
      }
    }
    // the tensors tile the data section exactly, one after another (as the format requires): no
    // overlap, no gap, nothing beyond the file
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
    for (const auto& [name, e] : tensors_) spans.emplace_back(e.begin, e.end);
    std::sort(spans.begin(), spans.end());
    std::uint64_t at = 0;
    for (const auto& [b, e] : spans) {
      if (b != at) throw std::runtime_error(path + ": its tensors overlap or leave a gap at byte " + std::to_string(at) +
                                            " of the data");
      at = e;
    }
    if (at != file_bytes - data_start_)
      throw std::runtime_error(path + ": truncated or padded (" + std::to_string(file_bytes - data_start_) +
                               " bytes of data; its tensors need " + std::to_string(at) + ")");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

void SafetensorsReader::read_at(std::uint64_t at, void* dst, std::size_t bytes) const {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, out, std::min<std::size_t>(bytes, std::size_t(1) << 30), off_t(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw std::runtime_error("cannot read " + path_ + ": " + (got < 0 ? std::strerror(errno) : "file truncated"));
    out += got, at += std::uint64_t(got), bytes -= std::size_t(got);
  }
}

SafetensorsReader::~SafetensorsReader() { ::close(fd_); }

void SafetensorsReader::read(const std::string& name, std::uint64_t offset, void* dst, std::size_t bytes) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error(path_ + ": no tensor '" + name + "'");
  if (offset > it->second.end - it->second.begin || bytes > it->second.end - it->second.begin - offset)
    throw std::runtime_error(path_ + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                             ") are beyond tensor '" + name + "'");
  read_at(data_start_ + it->second.begin + offset, dst, bytes);
}

std::map<std::string, SafetensorIn> read_safetensors(const std::string& path) {
  const SafetensorsReader reader(path);
  std::map<std::string, SafetensorIn> out;
  for (const auto& [name, e] : reader.tensors()) {
    SafetensorIn t{e.dtype, e.shape, std::vector<std::uint8_t>(e.end - e.begin)};
    reader.read(name, 0, t.data.data(), t.data.size());
    out.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace dos
