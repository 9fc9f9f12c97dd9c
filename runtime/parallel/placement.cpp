// Rank placement (parallel.h): a rank's GPU, the cores near it, and its own block of them.
#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.h"

#include "../../codelets/cpu_team.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace dos {

namespace {

/// A 31-bit hash of a string (FNV-1a): keys compared across ranks.
int hash31(const std::string& text) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return int(h & 0x7fffffffu);
}

/// A list of core numbers as text, to be hashed.
std::string core_list(const std::vector<int>& cores) {
  std::string t;
  for (int c : cores) t += std::to_string(c) + ",";
  return t;
}

}  // namespace

std::string rank_path(const std::string& path, std::size_t rank, std::size_t world) {
  char tag[48];
  std::snprintf(tag, sizeof tag, ".rank-%05zu-of-%05zu", rank, world);
  const auto slash = path.find_last_of('/'), dot = path.find_last_of('.');
  const std::size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  // no extension: no dot in the file's name, or only its leading one (".hidden")
  if (dot == std::string::npos || dot <= name_start) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

int choose_gpu(const Comm& comm, int ncuda) {
#if defined(DOS_HAVE_CUDA)
  if (ncuda == 0) return -1;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1;
  const int gpu = comm.local_rank() % count;
  const cudaError_t e = cudaSetDevice(gpu);
  if (e != cudaSuccess)
    throw std::runtime_error("cudaSetDevice(" + std::to_string(gpu) + ") failed: " + cudaGetErrorString(e));
  return gpu;
#else
  (void)comm;
  (void)ncuda;
  return -1;
#endif
}

std::string gpu_pci_bus_id(int gpu) {
#if defined(DOS_HAVE_CUDA)
  char id[32] = "";
  return gpu >= 0 && cudaDeviceGetPCIBusId(id, sizeof id, gpu) == cudaSuccess ? std::string(id) : std::string();
#else
  (void)gpu;
  return std::string();
#endif
}

GpuLocality gpu_local_cores(const std::string& pci_bus_id) {
  GpuLocality out;
  if (pci_bus_id.empty()) return out;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return out;
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) == 0) {
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topo, pci_bus_id.c_str());
    hwloc_obj_t near = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : nullptr;
    if (near && near->cpuset && near->nodeset) {
      int i;
      hwloc_bitmap_foreach_begin(i, near->cpuset) out.cores.push_back(i);
      hwloc_bitmap_foreach_end();
      char* nodes = nullptr;
      hwloc_bitmap_list_asprintf(&nodes, near->nodeset);
      out.numa_nodes = nodes ? nodes : "";
      std::free(nodes);
    }
  }
  hwloc_topology_destroy(topo);
  return out;
}

void gather_from_each(Comm& comm, const void* mine, void* all, std::size_t bytes) {
  std::vector<ShardRange> one;  // one element of `bytes` bytes per rank
  for (std::size_t r = 0; r < std::size_t(comm.size()); ++r) one.push_back({r, r + 1});
  comm.all_gather(mine, all, one, bytes);
}

Placement place_rank(Comm& comm, int gpu) {
  const std::vector<int> cores = allowed_cores();
  const std::string bus = gpu_pci_bus_id(gpu);
  const GpuLocality local = gpu_local_cores(bus);
  const std::vector<int>& near = local.cores;
  const std::string& nodes = local.numa_nodes;
  std::vector<int> pool;  // the cores of this rank's GPU's node(s) it may take its block from
  for (int c : cores)
    if (std::find(near.begin(), near.end(), c) != near.end()) pool.push_back(c);
  if (pool.empty()) pool = cores;
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  enum { kHost, kCores, kPool, kFirst, kLast, kBus, kFields };
  const int mine[kFields] = {hash31(host), hash31(core_list(cores)), hash31(core_list(pool)),
                             pool.empty() ? -1 : pool.front(), pool.empty() ? -1 : pool.back(),
                             bus.empty() ? -1 : hash31(bus)};
  const std::size_t world = std::size_t(comm.size());
  std::vector<int> all(kFields * world, -1);
  gather_from_each(comm, mine, all.data(), sizeof mine);
  auto field = [&](std::size_t r, int f) { return all[r * kFields + std::size_t(f)]; };
  const std::size_t me = std::size_t(comm.rank());
  Placement out;
  std::string gpu_words = gpu >= 0 ? "GPU " + std::to_string(gpu) + (nodes.empty() ? "" : " (NUMA node " + nodes + ")")
                                   : std::string("no GPU");
  // the ranks of this node launched on the same cores as this one; `overlap`: two of them have GPU
  // core sets that overlap without being equal (every rank of the group finds the same answer)
  std::vector<std::size_t> peers;
  for (std::size_t r = 0; r < world; ++r) {
    if (field(r, kHost) != mine[kHost]) continue;
    if (r != me && mine[kBus] >= 0 && field(r, kBus) == mine[kBus]) out.gpu_shared = true;
    if (field(r, kCores) == mine[kCores]) peers.push_back(r);
  }
  bool overlap = false;
  for (std::size_t i : peers)
    for (std::size_t j : peers)
      if (field(i, kPool) != field(j, kPool) && field(i, kFirst) <= field(j, kLast) && field(j, kFirst) <= field(i, kLast))
        overlap = true;
  const int sharing = int(peers.size());
  if (out.gpu_shared) {
    out.warnings.push_back("another rank on this node uses the same GPU (" + bus +
                           "): ranks share GPUs (one rank per GPU: srun --gpus-per-task=1, or as many ranks per node "
                           "as GPUs)");
    gpu_words += ", shared with another rank";
  }
  if (sharing <= 1) {
    out.words = gpu_words + ", cores as launched (" + std::to_string(cores.size()) + ")";
    return out;
  }
  if (overlap) pool = cores;
  int index = 0, group = 0;
  for (std::size_t r : peers) {
    if (!overlap && field(r, kPool) != mine[kPool]) continue;
    if (r < me) ++index;
    ++group;
  }
  if (int(pool.size()) < group) {
    out.warnings.push_back(std::to_string(group) + " ranks share " + std::to_string(pool.size()) +
                           " core(s): they oversubscribe the cores; threads are left unbound (give each rank its "
                           "cores: srun --cpus-per-task, mpirun --map-by)");
    out.unbound_reason = std::to_string(group) + " ranks share " + std::to_string(pool.size()) + " core(s)";
    out.words = gpu_words + ", cores shared with other ranks (unbound)";
    return out;
  }
  const std::size_t per = pool.size() / std::size_t(group);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (std::size_t i = std::size_t(index) * per; i < std::size_t(index + 1) * per; ++i) CPU_SET(pool[i], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    out.warnings.push_back("could not restrict itself to its " + std::to_string(per) + " cores");
    out.words = gpu_words + ", cores as launched (could not bind)";
    return out;
  }
  out.words = gpu_words + ", cores " + std::to_string(pool[std::size_t(index) * per]) + "-" +
              std::to_string(pool[std::size_t(index + 1) * per - 1]) + " (" + std::to_string(per) + ")";
  return out;
}

}  // namespace dos
