// Host memory: what the machine has left, and the optimizer state's host buffers (host_memory.h).
#include "host_memory.h"

#include <starpu.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "../codelets/codelets.h"
#include "../codelets/cpu_team.h"
#include "../codelets/kernels/env_choice.h"
#include "dos.h"

namespace dos {

// ---------------------------------------------------------------------------------------------
// Host memory

std::size_t host_bytes_per_param(DType dtype, bool native_grads) {
  return 12 + (native_grads ? dtype_size(dtype) : 4) + dtype_size(dtype);
}
std::size_t host_bytes_per_param(DType dtype) { return host_bytes_per_param(dtype, false); }

namespace detail {
namespace {

/// The first line of `path` (empty when it cannot be read).
std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

/// A byte count of a cgroup file: a decimal number, or none ("max", absent, unreadable, or v1's
/// "no limit", a value near 2^63): false.
bool read_bytes(const std::string& path, std::size_t* out) {
  const std::string s = first_line(path);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno != 0 || v >= (1ull << 60)) return false;
  *out = std::size_t(v);
  return true;
}

/// The sum of the values of `keys` in a memory.stat file (an absent key counts 0).
std::size_t stat_sum(const std::string& path, std::initializer_list<const char*> keys) {
  std::ifstream f(path);
  std::string k;
  unsigned long long v = 0;
  std::size_t sum = 0;
  while (f >> k >> v)
    for (const char* key : keys)
      if (k == key) sum += std::size_t(v);
  return sum;
}

/// mountinfo's octal escapes (\040 for a space) undone.
std::string unescape_mount(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit((unsigned char)s[i + 1]) &&
        std::isdigit((unsigned char)s[i + 2]) && std::isdigit((unsigned char)s[i + 3])) {
      out += char((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

/// One memory hierarchy: where it is mounted and which folder of it the mount shows.
struct Hierarchy {
  std::string root, mount;
  bool v2 = false;
};

/// The memory hierarchies of mountinfo: cgroup2 mounts, and cgroup (v1) mounts with the memory
/// controller among their super options.
std::vector<Hierarchy> memory_hierarchies(const std::string& mountinfo) {
  std::vector<Hierarchy> out;
  std::ifstream f(mountinfo);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::vector<std::string> fields;
    for (std::string w; in >> w;) fields.push_back(w);
    const auto sep = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || sep == fields.end() || sep + 4 > fields.end()) continue;
    const std::string& fstype = sep[1];
    const std::string& super = sep[3];
    bool memory = false;
    std::istringstream opts(super);
    for (std::string o; std::getline(opts, o, ',');) memory = memory || o == "memory";
    if (fstype == "cgroup2" || (fstype == "cgroup" && memory))
      out.push_back({unescape_mount(fields[3]), unescape_mount(fields[4]), fstype == "cgroup2"});
  }
  return out;
}

/// The process's cgroup path in the v2 hierarchy (v2) or the v1 memory hierarchy, from
/// /proc/self/cgroup; empty when it has none.
std::string self_cgroup_path(const std::string& self_cgroup, bool v2) {
  std::ifstream f(self_cgroup);
  std::string line;
  while (std::getline(f, line)) {
    const std::size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (v2) {
      if (line.compare(0, a, "0") == 0 && controllers.empty()) return path;
      continue;
    }
    std::istringstream c(controllers);
    for (std::string name; std::getline(c, name, ',');)
      if (name == "memory") return path;
  }
  return std::string();
}

}  // namespace

CgroupLimit cgroup_memory_limit(const std::string& mountinfo, const std::string& self_cgroup) {
  CgroupLimit best;
  for (const Hierarchy& h : memory_hierarchies(mountinfo)) {
    std::string path = self_cgroup_path(self_cgroup, h.v2);
    if (path.empty()) continue;
    // The mount shows the hierarchy from h.root on: the process's folder is its path below it. A
    // path outside the mount's part (a cgroup namespace over the host's mount shows a root of
    // "/../.."), or a folder that is not there, cannot be placed: that hierarchy is left out
    // (no limit seen there, as before cgroups were read) rather than another group's read.
    if (h.root != "/") {
      if (path.compare(0, h.root.size(), h.root) != 0 || (path.size() != h.root.size() && path[h.root.size()] != '/'))
        continue;
      path = path.substr(h.root.size());
    }
    std::string dir = h.mount + (path == "/" || path.empty() ? std::string() : path);
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    const std::string limit_file = h.v2 ? "memory.max" : "memory.limit_in_bytes";
    const std::string usage_file = h.v2 ? "memory.current" : "memory.usage_in_bytes";
    for (;;) {  // the process's folder, then each one above it, up to the mount point
      std::size_t limit = 0, usage = 0;
      if (read_bytes(dir + "/" + limit_file, &limit) && read_bytes(dir + "/" + usage_file, &usage)) {
        // what the kernel reclaims before it kills: the file cache (active and inactive; shmem
        // is on the anonymous lists, so counted as used) and, on v2, reclaimable slab
        const std::size_t cache =
            h.v2 ? stat_sum(dir + "/memory.stat", {"active_file", "inactive_file", "slab_reclaimable"})
                 : stat_sum(dir + "/memory.stat", {"total_active_file", "total_inactive_file"});
        const std::size_t used = usage > cache ? usage - cache : 0;
        const std::size_t avail = limit > used ? limit - used : 0;
        if (best.limit == 0 || avail < best.available) best = {avail, limit, dir};
      }
      if (dir.size() <= h.mount.size()) break;
      const std::size_t slash = dir.rfind('/');
      if (slash == std::string::npos || slash < h.mount.size()) break;
      dir.resize(slash);
    }
  }
  return best;
}

std::size_t host_memory_available(CgroupLimit* cgroup) {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::size_t kb = 0, avail = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  const CgroupLimit c = cgroup_memory_limit();
  const bool tighter = c.limit > 0 && (avail == 0 || c.available < avail);
  if (cgroup) *cgroup = tighter ? c : CgroupLimit{};
  return tighter ? c.available : avail;
}
}  // namespace detail

void check_host_memory(std::size_t bytes, const std::string& what) {
  detail::CgroupLimit cgroup;
  const std::size_t avail = detail::host_memory_available(&cgroup);
  if (avail == 0 && cgroup.limit == 0) return;  // cannot tell (not Linux): let the allocation decide
  if (bytes > avail) {
    char msg[1024];
    char limit_text[512] = "";
    if (cgroup.limit > 0)
      std::snprintf(limit_text, sizeof limit_text,
                    " under the memory limit of this process's cgroup or one above it (%.2f GB at %s: Slurm's "
                    "--mem or --mem-per-cpu, or a container's limit; past it the kernel kills the process)",
                    cgroup.limit / 1e9, cgroup.dir.c_str());
    std::snprintf(msg, sizeof msg,
                  "%s needs %.2f GB of host memory and only %.2f GB are available%s: give each process fewer "
                  "parameters (a shard of the model, or data-parallel ranks spread over more nodes), a smaller "
                  "model, %s",
                  what.c_str(), bytes / 1e9, avail / 1e9, limit_text,
                  cgroup.limit > 0 ? "or ask the job for more memory" : "or run on a machine with more memory");
    throw ResourceError(msg);
  }
}

namespace {

/// Measurement switch: DOS_HOST_ALLOC=starpu allocates the host buffers with starpu_malloc_flags
/// (cudaHostAlloc) instead of posix_memalign + starpu_memory_pin (cudaHostRegister), to compare
/// the DMA rates of the two kinds of pinned memory. StarPU aborts when that allocation fails. Any
/// other value warns once and is ignored.
bool host_alloc_by_starpu() {
  static const bool on =
      detail::env_choice("DOS_HOST_ALLOC", {"starpu"}, -1, "ignored (posix_memalign and starpu_memory_pin)") == 0;
  return on && starpu_cuda_worker_get_count() > 0;
}

/// Measurement switch: the page backing of the host buffers, from DOS_HOST_PAGES: "huge" (2 MiB
/// aligned and advised MADV_HUGEPAGE, so that the kernel backs them with transparent huge pages
/// where it allows them), "4k" (advised MADV_NOHUGEPAGE), unset or empty: as the allocator gives
/// them. Any other value, or one given with DOS_HOST_ALLOC=starpu (whose memory the CUDA driver
/// allocates), warns once and is ignored.
enum class Pages { as_given, huge, small };
Pages host_pages() {
  static const Pages p = [] {
    const int pages = detail::env_choice("DOS_HOST_PAGES", {"huge", "4k"}, -1, "ignored (the allocator's pages)");
    if (pages < 0) return Pages::as_given;
    if (host_alloc_by_starpu()) {
      std::fprintf(stderr, "[dos] warning: DOS_HOST_PAGES is ignored with DOS_HOST_ALLOC=starpu (cudaHostAlloc's pages)\n");
      return Pages::as_given;
    }
    return pages == 0 ? Pages::huge : Pages::small;
  }();
  return p;
}
constexpr std::size_t kHugePage = std::size_t(2) << 20;

std::atomic<bool> g_warned_pageable{false};
std::atomic<bool> g_warned_madvise{false};

struct FirstTouch {
  float* ptr;
  std::size_t n;
};
void first_touch_on_worker(void* arg) {
  auto* t = static_cast<FirstTouch*>(arg);
  bind_worker_team_for(t->n);
  zero_fill_cpu(t->ptr, t->n);
}
}  // namespace

namespace detail {

HostBuffer alloc_host(std::size_t bytes) {
  HostBuffer b;
  b.bytes = bytes;
  const std::size_t n = bytes / sizeof(float);
  void* p = nullptr;
  if (host_alloc_by_starpu()) {
    if (starpu_malloc_flags(&p, b.bytes ? b.bytes : 4096, STARPU_MALLOC_PINNED) != 0)
      throw ResourceError("cannot allocate " + std::to_string(b.bytes) +
                          " bytes of pinned host memory (DOS_HOST_ALLOC=starpu)");
    b.from_starpu = b.pinned = true;
  } else {
    const Pages pages = host_pages();
    const std::size_t align = pages == Pages::huge ? kHugePage : 4096;
    const std::size_t span = ((b.bytes ? b.bytes : 4096) + align - 1) / align * align;
    if (posix_memalign(&p, align, span) != 0)
      throw ResourceError("cannot allocate " + std::to_string(b.bytes) + " bytes of host memory for the optimizer state");
    if (pages != Pages::as_given && madvise(p, span, pages == Pages::huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0 &&
        !g_warned_madvise.exchange(true))
      std::fprintf(stderr, "[dos] warning: madvise for DOS_HOST_PAGES failed (%s): the allocator's pages\n",
                   std::strerror(errno));
  }
  b.ptr = static_cast<float*>(p);
  // NUMA-aware first touch: the first CPU worker's (bound) team zeroes the buffer, one contiguous
  // range per thread, so its pages spread over the NUMA nodes of the team's cores. The Adam kernel
  // hands its work items out dynamically by default, so a page is updated on its own node only
  // when the team is on one node (DOS_CPU_SCHEDULE=static: by the thread that touched it).
  FirstTouch touch{b.ptr, n};
  if (starpu_cpu_worker_get_count() > 0) {
    unsigned worker = 0;
    starpu_worker_get_ids_by_type(STARPU_CPU_WORKER, reinterpret_cast<int*>(&worker), 1);
    starpu_execute_on_specific_workers(first_touch_on_worker, &touch, 1, &worker, "dos_first_touch");
  } else {
    zero_fill_cpu(b.ptr, n);
  }
  std::memset(reinterpret_cast<char*>(b.ptr) + n * sizeof(float), 0, bytes - n * sizeof(float));
  if (starpu_cuda_worker_get_count() > 0 && !b.from_starpu) {
    b.pinned = starpu_memory_pin(b.ptr, b.bytes) == 0;
    if (!b.pinned && !g_warned_pageable.exchange(true))
      std::fprintf(stderr, "[dos] warning: could not pin %zu bytes of optimizer state: using pageable memory, "
                           "whose copies to and from the GPU are slower and synchronous\n", b.bytes);
  }
  return b;
}

void free_host(HostBuffer& b) {
  if (!b.ptr) return;
  if (b.from_starpu) {
    starpu_free_flags(b.ptr, b.bytes ? b.bytes : 4096, STARPU_MALLOC_PINNED);
    b.ptr = nullptr;
    return;
  }
  if (b.pinned) starpu_memory_unpin(b.ptr, b.bytes);
  std::free(b.ptr);
  b.ptr = nullptr;
}

}  // namespace detail
}  // namespace dos
