// Writing a file so that readers see either the old file or the complete new one, never a part.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "temp_cleanup.h"

namespace dos {

using Chunks = std::vector<std::pair<const void*, std::size_t>>;

/// A file written in two phases, so that several outputs appear together or not at all: the
/// constructor writes the concatenation of `chunks` (pointer, byte count) to a temporary file next
/// to `path` and flushes it (fsync); commit() renames it over `path`; destroying it uncommitted
/// removes the temporary file. Throws std::runtime_error naming the path and the system error when
/// the file cannot be written (and leaves nothing behind), or when `path` exists and is not a
/// regular file (a device, a FIFO, a symbolic link: never replaced) or is write-protected. The temporary file is
/// registered with TempPathGuard (temp_cleanup.h): a SIGINT or SIGTERM removes it.
class PendingFile {
 public:
  PendingFile(const std::string& path, const Chunks& chunks);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  /// Renames the temporary file over the path, then removes the temporary files that earlier
  /// writers of the same path left behind when they were killed (PATH.tmp.XXXXXX, regular files
  /// older than this one's), naming each on standard error. Throws std::runtime_error when the
  /// rename fails.
  void commit();

 private:
  std::string path_, tmp_;
  bool committed_ = false;
  TempPathGuard guard_;
};

/// PendingFile(path, chunks).commit(): a reader sees the old file or the whole new one.
void write_file_atomically(const std::string& path, const Chunks& chunks);

/// Throws std::runtime_error when the folder that would hold `path` is missing or not writable, or,
/// with `probe`, when no file can be created and removed in it (tried with a file named
/// .dos-write-check-XXXXXX, removed at once: a file system such as /proc that access() calls
/// writable, an append-only folder, where the message names the file it could not remove); the
/// message starts "cannot write <what>" (what: how to name path in the message). The checks made
/// before any work probe; a write's own (PendingFile) does not, its temporary file being the attempt.
void check_parent_writable(const std::string& path, const std::string& what, bool probe = true);

/// Throws std::runtime_error, before any work is done, when a file cannot be created at `path`
/// (its folder is missing or not writable, or `path` exists and is not a regular file, or exists
/// write-protected: no write permission for this user or no write bit at all in its mode, or, with
/// `probe`, no file can be created and removed in its folder: check_parent_writable), naming the
/// path and the reason.
void check_writable(const std::string& path, bool probe = true);

}  // namespace dos
