// Temporary files and folders that must not outlive an interrupted process: while registered, a
// SIGINT or SIGTERM removes them before the process ends with the signal's usual status.
#pragma once

#include <functional>
#include <string>

namespace dos {

/// A registration of one temporary path, for as long as the object lives. `folder`: the path is a
/// folder whose files (one level deep; checkpoint folders hold no subfolders) are removed with it.
/// At most 64 paths are registered at once, each shorter than 4096 bytes; beyond that a path is
/// simply not registered (it is still removed by the normal error paths). Not copyable.
class TempPathGuard {
 public:
  TempPathGuard() = default;
  TempPathGuard(const std::string& path, bool folder);
  ~TempPathGuard();
  TempPathGuard(const TempPathGuard&) = delete;
  TempPathGuard& operator=(const TempPathGuard&) = delete;
  /// Takes over another registration (the moved-from object then holds none).
  TempPathGuard(TempPathGuard&& o) noexcept : slot_(o.slot_) { o.slot_ = -1; }
  TempPathGuard& operator=(TempPathGuard&& o) noexcept;
  /// Ends the registration now (the path was renamed into place or removed).
  void release();

 private:
  int slot_ = -1;
};

/// Makes a new path named prefix + 6 random letters and digits (a fresh name even where process ids
/// repeat, as in containers) with make(path), which creates it exclusively: returns >= 0 when it
/// made it, or < 0 with errno set (EEXIST: the name is taken, another is tried, up to 100). With
/// `guard`, each name is registered for removal on SIGINT and SIGTERM (as a folder when `folder`)
/// before it is made, and *guard holds the registration of the path made: a signal between its
/// making and a registration after it would leave it behind. Returns make's result for the path
/// made (its name in *name), or -1 with errno set (EEXIST after 100 names taken). Throws what
/// make throws, std::bad_alloc.
int make_fresh_path(const std::string& prefix, bool folder, const std::function<int(const std::string&)>& make,
                    std::string* name, TempPathGuard* guard);

/// Installs handlers for SIGINT and SIGTERM that remove every registered path (async-signal-safe:
/// unlink, unlinkat, rmdir, getdents64 and nanosleep only; a second signal handled meanwhile on
/// another thread waits for the first's cleanup), then let the previous handler, or the default
/// action, end the process with the signal (exit status 128 + signal number in a shell). A path
/// made by one thread while another thread's handler runs may be left: the creators register a
/// path before they make it (checkpoint folders, PendingFile), which closes the gap when the
/// creating thread takes the signal, as the main thread of a process usually does. Call it
/// after anything else that installs handlers for these signals (StarPU does at starpu_init);
/// calling it again does nothing. A signal that is ignored (SIG_IGN, as under nohup) stays ignored.
void remove_temporaries_on_signal();

}  // namespace dos
