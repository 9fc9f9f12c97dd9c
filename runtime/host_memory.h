// Host memory for the optimizer state: how much the machine has left (host_memory_available; the
// public check_host_memory and host_bytes_per_param of dos.h are defined in host_memory.cpp), and the
// state's host buffers (HostBuffer). Contract: alloc_host and free_host need StarPU running (a CPU
// worker zeroes the buffer: NUMA first touch; a CUDA worker makes it pinned); alloc_host throws
// Error when the memory cannot be had, free_host takes any buffer of alloc_host, once. Internal to
// the runtime (not installed).
#pragma once

#include <cstddef>

namespace dos::detail {

/// MemAvailable of /proc/meminfo, bytes; 0 when it cannot be read (not Linux).
std::size_t host_memory_available();

/// Host buffer, page-aligned, zero-filled, pinned for DMA when there is a CUDA worker and pinning
/// works (a failure to pin warns once and keeps pageable memory: slower copies, same results).
struct HostBuffer {
  float* ptr = nullptr;
  std::size_t bytes = 0;
  bool pinned = false;
  bool from_starpu = false;  // allocated by starpu_malloc_flags (DOS_HOST_ALLOC=starpu)
};

/// A HostBuffer of `bytes` (a page is allocated when 0), zeroed with the Adam kernel's partition by
/// the first CPU worker's team (by the calling thread without a CPU worker). Throws Error when the
/// memory cannot be allocated.
HostBuffer alloc_host(std::size_t bytes);
/// Frees b (nothing when b.ptr is null) and sets b.ptr to null.
void free_host(HostBuffer& b);

}  // namespace dos::detail
