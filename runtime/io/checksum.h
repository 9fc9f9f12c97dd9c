// Checksums of checkpoint data: XXH3 64-bit hashes (xxHash, Debian's libxxhash-dev, used header-only)
// of a byte stream cut into fixed-size blocks, so that a reader of one slice of a tensor verifies
// only the blocks it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dos {

/// The checksum's name as checkpoint files record it ("xxh3-64").
extern const char* const kChecksumName;

/// XXH3 64-bit hash of `bytes` bytes at `data` (seed 0).
std::uint64_t checksum(const void* data, std::size_t bytes);

/// The checksum of every block of `block_bytes` bytes (the last one may be shorter) of the byte
/// stream made of `pieces` (pointer, byte count) one after another, without gathering them:
/// returns ceil(total / block_bytes) hashes. Throws std::invalid_argument when block_bytes is 0.
std::vector<std::uint64_t> block_checksums(const std::vector<std::pair<const void*, std::size_t>>& pieces,
                                           std::size_t block_bytes);

/// "0x" and 16 lowercase hexadecimal digits.
std::string checksum_hex(std::uint64_t h);

}  // namespace dos
