// Atomic file writes (atomic_file.h): a temporary file next to the target, flushed, then renamed
// over it; and the checks, before any work, that a path can be written.
#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace dos {
namespace {
std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

/// Removes PATH.tmp.XXXXXX (six letters and digits, as create_registered_temp makes them) beside
/// `path`: regular files last
/// modified before `before`, left by a writer that was killed; each named on standard error.
void remove_stale_temporaries(const std::string& path, const struct timespec& before) {
  const std::string dir = folder_of(path);
  const auto slash = path.find_last_of('/');
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    bool six = true;
    for (std::size_t k = prefix.size(); k < name.size(); ++k) six = six && std::isalnum((unsigned char)name[k]);
    struct stat st;
    const std::string full = dir + "/" + name;
    if (!six || ::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const bool older = st.st_mtim.tv_sec < before.tv_sec ||
                       (st.st_mtim.tv_sec == before.tv_sec && st.st_mtim.tv_nsec < before.tv_nsec);
    if (older && ::unlink(full.c_str()) == 0)
      std::fprintf(stderr, "[dos] removed %s, left by an interrupted write of %s\n", full.c_str(), path.c_str());
  }
  ::closedir(d);
}

/// Creates the file prefix + 6 random letters and digits (the names mkstemp makes, mode 0600),
/// registered for removal on SIGINT and SIGTERM before it exists (make_fresh_path); its name goes
/// to *name and the registration to *guard. Returns the open descriptor, or -1 with errno set.
int create_registered_temp(const std::string& prefix, std::string* name, TempPathGuard* guard) {
  const auto create = [](const std::string& path) {
    return ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  };
  return make_fresh_path(prefix, false, create, name, guard);
}
}  // namespace

PendingFile::PendingFile(const std::string& path, const Chunks& chunks) : path_(path) {
  check_writable(path, false);  // the temporary file below is the real attempt
  int fd = create_registered_temp(path + ".tmp.", &tmp_, &guard_);
  if (fd < 0) throw std::runtime_error("cannot create a file next to " + path + ": " + std::strerror(errno));
  try {
    for (const auto& c : chunks) {
      const char* p = static_cast<const char*>(c.first);
      std::size_t n = c.second;
      while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
        p += w;
        n -= std::size_t(w);
      }
    }
    if (::fsync(fd) != 0) throw std::runtime_error("cannot flush " + path + ": " + std::strerror(errno));
    ::fchmod(fd, 0644);
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw std::runtime_error("cannot close " + path + ": " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp_.c_str());
    throw;
  }
}

PendingFile::~PendingFile() {
  if (!committed_) ::unlink(tmp_.c_str());
}

void PendingFile::commit() {
  struct stat mine;
  const bool have_mine = ::stat(tmp_.c_str(), &mine) == 0;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(errno));
  committed_ = true;
  guard_.release();
  if (have_mine) remove_stale_temporaries(path_, mine.st_mtim);
}

void write_file_atomically(const std::string& path, const Chunks& chunks) { PendingFile(path, chunks).commit(); }

void check_parent_writable(const std::string& path, const std::string& what, bool probe) {
  const std::string dir = folder_of(path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw std::runtime_error("cannot write " + what + ": folder " + dir + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw std::runtime_error("cannot write " + what + ": folder " + dir + " is not writable");
  if (!probe) return;
  // access() does not know every file system (root may "write" in /proc, where nothing can be
  // created): a file created there and removed at once tells
  std::string name = dir + "/.dos-write-check-XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd < 0) {
    const int err = errno;
    throw std::runtime_error("cannot write " + what + ": no file can be created in folder " + dir + " (" +
                             std::strerror(err) + ")");
  }
  ::close(fd);
  if (::unlink(name.c_str()) != 0) {
    const int err = errno;
    throw std::runtime_error("cannot write " + what + ": files can be created in folder " + dir +
                             " but not removed or replaced (" + std::strerror(err) + "; an append-only folder?), "
                             "and a write puts its file in place by renaming; the check's file " + name +
                             " is left there: remove it once the folder allows it");
  }
}

void check_writable(const std::string& path, bool probe) {
  check_parent_writable(path, path, probe);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;  // a new file
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error("will not write " + path + ": it exists and is not a regular file (a folder, device, "
                             "FIFO or symbolic link); give the path of a regular file");
  // The rename would replace a write-protected file all the same: honour the protection (by its
  // mode bits too, which root's access() ignores).
  if ((st.st_mode & 0222) == 0 || ::access(path.c_str(), W_OK) != 0)
    throw std::runtime_error("will not write " + path + ": it exists and is write-protected; make it writable "
                             "(chmod u+w) or give another path");
}

}  // namespace dos
