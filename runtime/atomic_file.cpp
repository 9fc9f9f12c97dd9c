#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dos {
namespace {
std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}
}  // namespace

void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, std::size_t>>& chunks) {
  std::string tmp = path + ".tmp.XXXXXX";
  std::vector<char> tmpl(tmp.begin(), tmp.end());
  tmpl.push_back('\0');
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) throw std::runtime_error("cannot create a file next to " + path + ": " + std::strerror(errno));
  tmp = tmpl.data();
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
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
}

void check_writable(const std::string& path) {
  const std::string dir = folder_of(path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw std::runtime_error("cannot write " + path + ": folder " + dir + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw std::runtime_error("cannot write " + path + ": folder " + dir + " is not writable");
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw std::runtime_error("cannot write " + path + ": it is a folder");
}

}  // namespace dos
