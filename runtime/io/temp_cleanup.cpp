// Temporary paths removed on SIGINT or SIGTERM (temp_cleanup.h).
#include "temp_cleanup.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <cerrno>
#include <cstring>

namespace dos {
namespace {

constexpr int kSlots = 64;
constexpr std::size_t kPathMax = 4096;

/// A slot: 0 free, 1 being filled or emptied, 2 a file, 3 a folder.
struct Slot {
  std::atomic<int> state{0};
  char path[kPathMax];
};
Slot g_slots[kSlots];
struct sigaction g_previous[2];
std::atomic<bool> g_installed{false};
/// The handler's cleanup: started by the first signal's handler, done when it has removed every
/// registered path. A second signal handled meanwhile on another thread waits for it (the two
/// would otherwise share remove_files_in's buffer, and the second could end the process first).
std::atomic<bool> g_cleaning{false}, g_cleaned{false};

/// Removes the files directly inside `dir` (async-signal-safe).
void remove_files_in(const char* dir) {
  const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    alignas(8) static char buf[16384];  // only the signal handler uses it
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long at = 0; at < n;) {
        // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name
        unsigned short reclen;
        std::memcpy(&reclen, buf + at + 16, sizeof reclen);
        if (reclen == 0) break;  // (never from the kernel; no endless loop on a damaged record)
        const char* name = buf + at + 19;
        if (std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0) ::unlinkat(fd, name, 0);
        at += reclen;
      }
    }
    ::close(fd);
  }
}

/// Removes the files directly inside `dir`, then `dir` (async-signal-safe). Another thread of the
/// process may still be writing into it while the handler runs (a checkpoint's files): a file made
/// after the listing keeps rmdir from removing the folder, so it lists and removes again, a few
/// times, while rmdir finds the folder not empty.
void remove_folder(const char* dir) {
  for (int round = 0; round < 16; ++round) {
    remove_files_in(dir);
    if (::rmdir(dir) == 0 || errno != ENOTEMPTY) return;
  }
}

void on_signal(int sig) {
  const int saved_errno = errno;
  if (!g_cleaning.exchange(true)) {
    for (Slot& s : g_slots) {
      const int st = s.state.load();
      if (st == 2) ::unlink(s.path);
      if (st == 3) remove_folder(s.path);
    }
    g_cleaned.store(true);
  } else {
    // another thread's handler is cleaning: wait for it (up to 2 s), so as not to end the process first
    const struct timespec ms = {0, 1000000};
    for (int i = 0; i < 2000 && !g_cleaned.load(); ++i) ::nanosleep(&ms, nullptr);
  }
  errno = saved_errno;
  // the previous handler (StarPU's, or the default action) ends the process once this returns
  sigaction(sig, &g_previous[sig == SIGINT ? 0 : 1], nullptr);
  raise(sig);
}

}  // namespace

TempPathGuard::TempPathGuard(const std::string& path, bool folder) {
  if (path.size() >= kPathMax) return;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(folder ? 3 : 2);
      slot_ = i;
      return;
    }
  }
}

TempPathGuard::~TempPathGuard() { release(); }

TempPathGuard& TempPathGuard::operator=(TempPathGuard&& o) noexcept {
  if (this != &o) {
    release();
    slot_ = o.slot_;
    o.slot_ = -1;
  }
  return *this;
}

void TempPathGuard::release() {
  if (slot_ >= 0) g_slots[slot_].state.store(0);
  slot_ = -1;
}

int make_fresh_path(const std::string& prefix, bool folder, const std::function<int(const std::string&)>& make,
                    std::string* name, TempPathGuard* guard) {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = prefix;
    for (int k = 0; k < 6; ++k) candidate += kChars[rd() % (sizeof kChars - 1)];
    TempPathGuard registered;
    if (guard) registered = TempPathGuard(candidate, folder);  // a signal now finds nothing to remove yet
    const int made = make(candidate);
    if (made >= 0) {
      *name = std::move(candidate);
      if (guard) *guard = std::move(registered);
      return made;
    }
    if (errno != EEXIST) return -1;  // (the registration ends with `registered`)
  }
  errno = EEXIST;
  return -1;
}

void remove_temporaries_on_signal() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  const int sigs[2] = {SIGINT, SIGTERM};
  for (int k = 0; k < 2; ++k) {
    sigaction(sigs[k], nullptr, &g_previous[k]);
    if (g_previous[k].sa_handler != SIG_IGN) sigaction(sigs[k], &sa, nullptr);  // an ignored signal stays ignored
  }
}

}  // namespace dos
