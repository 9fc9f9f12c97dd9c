#include "safetensors.h"

#include "atomic_file.h"

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
  for (const SafetensorOut& t : tensors) chunks.emplace_back(t.data, t.bytes);
  return std::make_unique<PendingFile>(path, chunks);
}

std::map<std::string, SafetensorIn> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  unsigned char len[8];
  if (!f.read(reinterpret_cast<char*>(len), 8)) throw std::runtime_error(path + ": not a safetensors file (shorter than 8 bytes)");
  std::uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= std::uint64_t(len[i]) << (8 * i);
  if (hlen > (100u << 20)) throw std::runtime_error(path + ": not a safetensors file (header length " + std::to_string(hlen) + ")");
  std::string h(hlen, '\0');
  if (!f.read(h.data(), std::streamsize(hlen))) throw std::runtime_error(path + ": truncated safetensors header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": malformed safetensors header: " + e.what());
  }
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::map<std::string, SafetensorIn> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    SafetensorIn t;
    try {
      t.dtype = it.value().at("dtype").get<std::string>();
      t.shape = it.value().at("shape").get<std::vector<std::int64_t>>();
      const auto off = it.value().at("data_offsets").get<std::vector<std::uint64_t>>();
      if (off.size() != 2 || off[0] > off[1] || off[1] > data.size())
        throw std::runtime_error("data_offsets out of range");
      t.data.assign(data.begin() + std::ptrdiff_t(off[0]), data.begin() + std::ptrdiff_t(off[1]));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ": bad entry '" + it.key() + "': " + e.what());
    }
    out.emplace(it.key(), std::move(t));
  }
  return out;
}

}  // namespace dos
