// Host memory for the optimizer state: how much the machine has left (host_memory_available; the
// public check_host_memory and host_bytes_per_param of dos.h are defined in host_memory.cpp), and the
// state's host buffers (HostBuffer). Contract: alloc_host and free_host need StarPU running (a CPU
// worker zeroes the buffer: NUMA first touch; a CUDA worker makes it pinned); alloc_host throws
// Error when the memory cannot be had, free_host takes any buffer of alloc_host, once. Internal to
// the runtime (not installed).
#pragma once

#include <cstddef>
#include <string>

namespace dos::detail {

/// The tightest memory limit of the cgroups the process is in (cgroup_memory_limit).
/// available: limit - (usage - reclaimable: file cache, v2's reclaimable slab), bytes (0 when usage already exceeds it);
/// limit: that cgroup's limit, bytes; dir: its folder (e.g. /sys/fs/cgroup/memory/slurm/uid_0/job_7).
struct CgroupLimit {
  std::size_t available = 0;
  std::size_t limit = 0;
  std::string dir;
};

/// The memory left to the process by its cgroups (what Slurm's --mem or a container's memory limit
/// sets; past it the kernel's OOM killer ends the process), from the process's cgroup up to the
/// root of each memory hierarchy: cgroup v2 (memory.max, memory.current, memory.stat's
/// active_file, inactive_file and slab_reclaimable) and v1's memory controller
/// (memory.limit_in_bytes, memory.usage_in_bytes, memory.stat's total_active_file and
/// total_inactive_file). At each level with a limit, available = limit - (usage - reclaimable),
/// reclaimable being what the kernel takes back before it kills (the file cache; shmem and tmpfs
/// count as used); the least over the levels is returned. A hierarchy where the process's folder
/// cannot be placed (a cgroup namespace over the host's mount, whose mountinfo root starts with
/// "/..", or a folder not there) is left out. mountinfo and self_cgroup are the paths of
/// /proc/self/mountinfo and /proc/self/cgroup (other files in tests: their mount points then name
/// folders of a fake tree). Returns limit 0 when no level has a limit or the files cannot be read
/// (not Linux, no cgroup file system mounted). Throws nothing.
CgroupLimit cgroup_memory_limit(const std::string& mountinfo = "/proc/self/mountinfo",
                                const std::string& self_cgroup = "/proc/self/cgroup");

/// Host memory available now, bytes: MemAvailable of /proc/meminfo, or less where the process's
/// cgroups leave less (cgroup_memory_limit); 0 when neither can be read (not Linux), or when the
/// tighter cgroup has nothing left. When `cgroup` is given, it receives the cgroup limit found
/// (limit 0: none, or not the tighter one), which tells those two zeros apart.
std::size_t host_memory_available(CgroupLimit* cgroup = nullptr);

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
