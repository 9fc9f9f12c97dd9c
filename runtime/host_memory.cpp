// Host memory: what the machine has left, and the optimizer state's host buffers (host_memory.h).
#include "host_memory.h"

#include <starpu.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <fstream>
#include <string>

#include "../codelets/codelets.h"
#include "../codelets/cpu_team.h"
#include "dos.h"

namespace dos {

// ---------------------------------------------------------------------------------------------
// Host memory

std::size_t host_bytes_per_param(DType dtype) { return 12 + 4 + dtype_size(dtype); }

namespace detail {
std::size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::size_t kb = 0, avail = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  return avail;
}
}  // namespace detail

void check_host_memory(std::size_t bytes, const std::string& what) {
  const std::size_t avail = detail::host_memory_available();
  if (avail == 0) return;  // cannot tell (not Linux): let the allocation decide
  if (bytes > avail) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "%s needs %.1f GB of host memory and only %.1f GB are available: give this process a shard of "
                  "the model (fewer parameters: dos-train --shard R/W, or data-parallel ranks on more nodes), a "
                  "smaller model, or run on a machine with more memory",
                  what.c_str(), bytes / 1e9, avail / 1e9);
    throw ResourceError(msg);
  }
}

namespace {

/// Measurement switch: DOS_HOST_ALLOC=starpu allocates the host buffers with starpu_malloc_flags
/// (cudaHostAlloc) instead of posix_memalign + starpu_memory_pin (cudaHostRegister), to compare
/// the DMA rates of the two kinds of pinned memory. StarPU aborts when that allocation fails.
bool host_alloc_by_starpu() {
  static const bool on = [] {
    const char* e = std::getenv("DOS_HOST_ALLOC");
    return e && std::string(e) == "starpu";
  }();
  return on && starpu_cuda_worker_get_count() > 0;
}

/// Measurement switch: the page backing of the host buffers, from DOS_HOST_PAGES: "huge" (2 MiB
/// aligned and advised MADV_HUGEPAGE, so that the kernel backs them with transparent huge pages
/// where it allows them), "4k" (advised MADV_NOHUGEPAGE), unset: as the allocator gives them. Any
/// other value, or one given with DOS_HOST_ALLOC=starpu (whose memory the CUDA driver allocates),
/// warns once and is ignored.
enum class Pages { as_given, huge, small };
Pages host_pages() {
  static const Pages p = [] {
    const char* e = std::getenv("DOS_HOST_PAGES");
    if (!e) return Pages::as_given;
    const std::string s = e;
    if (s != "huge" && s != "4k") {
      std::fprintf(stderr, "[dos] warning: DOS_HOST_PAGES=%s is not huge or 4k: ignored (the allocator's pages)\n", e);
      return Pages::as_given;
    }
    if (host_alloc_by_starpu()) {
      std::fprintf(stderr, "[dos] warning: DOS_HOST_PAGES is ignored with DOS_HOST_ALLOC=starpu (cudaHostAlloc's pages)\n");
      return Pages::as_given;
    }
    return s == "huge" ? Pages::huge : Pages::small;
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
  bind_worker_team();
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
