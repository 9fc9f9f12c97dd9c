// Checksums of checkpoint data (checksum.h): XXH3 64-bit hashes of fixed-size blocks.
#include "checksum.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <stdexcept>

#define XXH_INLINE_ALL  // header-only: no run-time dependency on libxxhash.so
#include <xxhash.h>

namespace dos {

const char* const kChecksumName = "xxh3-64";

std::uint64_t checksum(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

std::vector<std::uint64_t> block_checksums(const std::vector<std::pair<const void*, std::size_t>>& pieces,
                                           std::size_t block_bytes) {
  if (block_bytes == 0) throw std::invalid_argument("block_checksums: block size 0");
  std::vector<std::uint64_t> out;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  std::size_t in_block = 0;  // bytes of the current block hashed so far
  for (const auto& [ptr, size] : pieces) {
    const char* p = static_cast<const char*>(ptr);
    std::size_t left = size;
    while (left > 0) {
      const std::size_t take = std::min(left, block_bytes - in_block);
      XXH3_64bits_update(&state, p, take);
      p += take, left -= take, in_block += take;
      if (in_block == block_bytes) {
        out.push_back(XXH3_64bits_digest(&state));
        XXH3_64bits_reset(&state);
        in_block = 0;
      }
    }
  }
  if (in_block > 0) out.push_back(XXH3_64bits_digest(&state));
  return out;
}

std::string checksum_hex(std::uint64_t h) {
  char s[24];
  std::snprintf(s, sizeof s, "0x%016" PRIx64, h);
  return s;
}

}  // namespace dos
