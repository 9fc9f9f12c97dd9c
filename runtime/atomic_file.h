// Writing a file so that readers see either the old file or the complete new one, never a part.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace dos {

/// Writes the concatenation of `chunks` (pointer, byte count) to `path`: the bytes go to a
/// temporary file in the same folder, which is flushed (fsync) and renamed over `path` only once
/// complete. On any failure the temporary file is removed, `path` is left as it was, and
/// std::runtime_error names the path and the system error.
void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, std::size_t>>& chunks);

/// Throws std::runtime_error, before any work is done, when a file cannot be created at `path`
/// (its folder is missing or not writable), naming the path and the reason.
void check_writable(const std::string& path);

}  // namespace dos
