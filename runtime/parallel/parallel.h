// Data parallelism for a training program on the runtime, over the collectives of comm.h (ZeRO
// partitioning: rank r of W owns shard r of the flat parameters, partition.h's shard_range, and
// updates it). Two concerns, each independent of the model and of where the gradients come from:
//
//  - rank placement: which GPU a rank drives (choose_gpu), the cores near that GPU (gpu_local_cores,
//    hwloc), and the rank's own block of those cores when several ranks of a node were launched on
//    the same cores (place_rank); rank_path names each rank's own output file;
//  - the two loops of a data-parallel iteration, shard by shard: the gradients' reduce to each
//    shard's owner (reduce_to_owners) before the update, and the updated parameters' broadcast from
//    each owner to every rank (broadcast_from_owners) after it, through host memory (Comm, MPI) or
//    GPU to GPU (DeviceComm, NCCL).
//
// The loops take the caller's buckets, so that they allocate nothing per iteration; the sizes are
// given with each function (largest_shard gives the size of one shard's bucket).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "partition.h"

namespace dos {

// ---- rank placement ----------------------------------------------------------------------------

/// `path` with ".rank-RRRRR-of-WWWWW" (five digits each, zero-padded) inserted before its extension,
/// or appended when its last component has none: rank `rank` of `world` ranks' own output file.
/// rank_path("out/report.json", 3, 8) is "out/report.rank-00003-of-00008.json". Never throws.
std::string rank_path(const std::string& path, std::size_t rank, std::size_t world);

/// This rank's GPU, one per rank of a node: comm.local_rank() modulo the number of GPUs CUDA sees
/// (one GPU per rank when the launcher shows every GPU of the node to every rank; GPU 0 when it
/// shows one, as Slurm's --gpus-per-task does). Made the calling thread's current GPU
/// (cudaSetDevice). Returns the CUDA device index, or -1 (and changes nothing) when `ncuda` is 0 (no
/// CUDA worker wanted, as RuntimeOptions::ncuda), in a build without CUDA, or when CUDA sees no GPU.
/// Not collective. Throws std::runtime_error when cudaSetDevice fails.
int choose_gpu(const Comm& comm, int ncuda = -1);

/// The PCI bus id of CUDA device `gpu` ("0000:3b:00.0"); "" when gpu < 0, in a build without CUDA,
/// or when CUDA cannot tell. Never throws.
std::string gpu_pci_bus_id(int gpu);

/// The cores near a GPU and their NUMA nodes.
struct GpuLocality {
  std::vector<int> cores;  ///< OS core (PU) numbers, ascending; empty when unknown
  std::string numa_nodes;  ///< those cores' NUMA nodes in hwloc's list syntax ("0", "0-1"); "" when unknown
};

/// The cores of the NUMA node(s) of the GPU at PCI bus id `pci_bus_id` (as gpu_pci_bus_id gives
/// it): hwloc's PCI device for it and its first non-I/O ancestor. Empty (both fields) when
/// `pci_bus_id` is empty or hwloc cannot load the topology or find the device. Never throws.
GpuLocality gpu_local_cores(const std::string& pci_bus_id);

/// Every rank's `bytes` bytes at `mine` (host memory), in rank order, into `all` (host memory,
/// comm.size() x `bytes` bytes, rank r's at r x bytes). Collective over `comm`, every rank with the
/// same `bytes`. Throws std::runtime_error when the collective fails (Comm).
void gather_from_each(Comm& comm, const void* mine, void* all, std::size_t bytes);

/// Where a rank runs, decided with the other ranks (place_rank).
struct Placement {
  /// In words, for a listing of the ranks: "GPU 1 (NUMA node 0), cores 16-31 (16)".
  std::string words;
  /// Another rank of this node drives the same GPU (NCCL cannot run then: one GPU per rank).
  bool gpu_shared = false;
  /// Problems found, each a sentence without a prefix (the caller prints them with its own, e.g.
  /// "program: warning: rank R: "): a GPU shared with another rank, more ranks than cores, cores that
  /// could not be bound.
  std::vector<std::string> warnings;
  /// Non-empty when the ranks oversubscribe this node's cores ("3 ranks share 2 core(s)"): the
  /// rank's threads should stay unbound and few; give it to RuntimeOptions::unbound_reason (the
  /// runtime then binds nothing and runs one thread per CPU worker unless told otherwise).
  std::string unbound_reason;
};

/// Gives this rank its cores, near its GPU (`gpu`: choose_gpu's answer, -1 for none). Ranks on one
/// node whose launcher gave them the same cores (plain mpirun --bind-to none) would bind their
/// threads to the same cores: each takes its own contiguous block instead, out of the cores of its
/// GPU's NUMA node, shared only with the ranks of the node whose GPUs have the same cores (so memory
/// first-touched by the rank's CPU threads lands on its GPU's node); where two GPUs' core sets
/// overlap without being equal, the whole set is split instead. Ranks whose launcher gave them cores
/// of their own (Slurm with --cpus-per-task, mpirun --map-by ... --bind-to core) keep exactly those.
/// Binds the calling process (sched_setaffinity) before its threads start, so call it before the
/// Runtime is made. With fewer cores than ranks sharing them, binds nothing and says so in
/// unbound_reason (for RuntimeOptions::unbound_reason: the runtime then leaves its threads unbound);
/// both cases are in `warnings`.
/// Collective over `comm`. Throws std::runtime_error when the collective fails.
Placement place_rank(Comm& comm, int gpu);

// ---- the data-parallel loops -------------------------------------------------------------------

/// The shards of `total` elements over `world` ranks, in rank order (shard_range for each rank).
/// Throws std::invalid_argument as shard_range does (world 0, or world > total).
std::vector<ShardRange> shard_ranges(std::size_t total, std::size_t world);

/// The number of elements of the largest of `ranges` (0 when empty): the size of a bucket that holds
/// any one shard.
std::size_t largest_shard(const std::vector<ShardRange>& ranges);

/// Fills `dst` with this rank's contribution to the gradient of the global flat elements
/// [piece.begin, piece.end): piece.end - piece.begin fp32 values, in host memory for the Comm loop
/// and in the GPU memory of the DeviceComm for the DeviceComm loop. Its exceptions propagate.
using ContributionFn = std::function<void(float* dst, ShardRange piece)>;

/// Receives the sum over the ranks of the contributions for [piece.begin, piece.end), a piece of
/// this rank's own shard: piece.end - piece.begin fp32 values at `sum` (GPU memory, valid during the
/// call only). Its exceptions propagate.
using ReceiveFn = std::function<void(const float* sum, ShardRange piece)>;

/// Receives a piece [piece.begin, piece.end) of the broadcast parameters: (piece.end - piece.begin)
/// x elem_bytes bytes at `data` (in the memory of the loop's buckets, valid during the call only).
using ShardFn = std::function<void(const void* data, ShardRange piece)>;

/// The gradients' reduce-scatter in buckets of one shard, through host memory: for each rank r in
/// rank order, `contribution` fills `bucket` with this rank's contribution to shard r (ranges[r]),
/// then Comm::reduce_sum sums the ranks' buckets (fp32) into rank r's `mine`. On return `mine`
/// holds the sum for this rank's own shard.
/// ranges: one per rank, in rank order, as shard_ranges gives them (comm.size() of them);
/// bucket: largest_shard(ranges) floats of host memory; mine: ranges[comm.rank()]'s size in floats
/// of host memory. Collective over `comm`. Returns the seconds spent in reduce_sum (wall clock;
/// the contributions' time excluded). Throws std::invalid_argument when ranges.size() is not
/// comm.size(); std::runtime_error when a collective fails; the contribution's exceptions.
double reduce_to_owners(Comm& comm, const std::vector<ShardRange>& ranges, const ContributionFn& contribution,
                        float* bucket, float* mine);

/// The same GPU to GPU (DeviceComm::reduce_sum, fp32), in chunks of at most `chunk` elements: for
/// each rank r and each chunk of shard r, `contribution` fills `send` with this rank's contribution;
/// the sum goes to rank r in `recv`, and rank r's `receive` takes it (there, e.g., rounded into the
/// model's gradients). `rank`: this rank (the Comm's rank() the DeviceComm was made over);
/// send, recv: `chunk` floats each of the DeviceComm's GPU memory; chunk >= 1. Collective.
/// Returns the seconds spent in reduce_sum (the contributions and `receive` excluded). Throws
/// std::invalid_argument when chunk is 0 or rank is out of range; std::runtime_error when NCCL or
/// CUDA fails; the callbacks' exceptions.
double reduce_to_owners(DeviceComm& comm, int rank, const std::vector<ShardRange>& ranges, std::size_t chunk,
                        const ContributionFn& contribution, float* send, float* recv, const ReceiveFn& receive);

/// The parameters' all-gather in buckets of one shard, through host memory: for each rank r in rank
/// order, rank r copies its shard (`mine`) into `bucket` and Comm::broadcast sends it to every rank;
/// `received`, when given, sees each shard on every rank (the owner's included) as it arrives.
/// elem_bytes: bytes per parameter (2 for bf16/fp16, 4 for fp32); mine: ranges[comm.rank()]'s size
/// x elem_bytes bytes of host memory; bucket: largest_shard(ranges) x elem_bytes bytes of host
/// memory. Collective over `comm`. Returns the seconds of the whole loop (copies and broadcasts;
/// `received` included). Throws std::invalid_argument when ranges.size() is not comm.size();
/// std::runtime_error when a collective fails; the callback's exceptions.
double broadcast_from_owners(Comm& comm, const std::vector<ShardRange>& ranges, std::size_t elem_bytes,
                             const void* mine, void* bucket, const ShardFn& received = {});

/// The same GPU to GPU (DeviceComm::broadcast), in chunks of at most `chunk` elements: each owner
/// sends straight from `mine` (its shard, in the DeviceComm's GPU memory) into every rank's
/// `bucket` (chunk x elem_bytes bytes of GPU memory). `mine` must be complete when called (work on
/// other CUDA streams is not waited for). `received` sees each chunk on every rank. Collective.
/// Returns the seconds of the whole loop. Throws std::invalid_argument when chunk is 0 or rank is
/// out of range; std::runtime_error when NCCL or CUDA fails; the callback's exceptions.
double broadcast_from_owners(DeviceComm& comm, int rank, const std::vector<ShardRange>& ranges, std::size_t elem_bytes,
                             std::size_t chunk, const void* mine, void* bucket, const ShardFn& received = {});

}  // namespace dos
