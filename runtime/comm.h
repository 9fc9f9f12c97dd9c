// Collective communication among the data-parallel ranks of a job: rank r of W owns
// shard r of the flat parameters (ZeRO partitioning, partition.h's shard_range) and runs the update
// phase for it; every iteration the gradients are reduce-scattered (each rank receives the sum over
// ranks of its shard) and the updated 16-bit parameters all-gathered. Two backends behind two small
// interfaces: Comm (MPI, host buffers; it also starts the job and carries every control message)
// and DeviceComm (NCCL, buffers on this rank's GPU, bootstrapped through Comm).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "partition.h"

namespace dos {

/// The ranks of a job. Every call is collective: all ranks make it, with the same `ranges` (one
/// ShardRange per rank, in rank order, covering the flat parameters without overlap).
/// Errors (an MPI call failing) throw std::runtime_error naming the call (the MPI backend sets
/// MPI_ERRORS_RETURN on its communicator).
class Comm {
 public:
  virtual ~Comm() = default;
  /// This rank and the number of ranks (0 <= rank() < size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This rank among the ranks on its node (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED), and how
  /// many ranks the node runs: what picks a rank's GPU and tells it who shares its host memory.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  /// Sums `count` floats of `send` (host memory) over the ranks into `recv` on rank `root` (recv is
  /// ignored on the other ranks). The reduce-scatter in buckets: one call per rank's shard, each
  /// with that shard's contributions; the sum is in fp32 in the backend's order, exact whenever
  /// the contributions' partial sums are (dos-train's quantised emulated gradients).
  virtual void reduce_sum(const float* send, float* recv, std::size_t count, int root) = 0;
  /// `bytes` of `buf` (host memory) from rank `root` to every rank. The all-gather in buckets.
  virtual void broadcast(void* buf, std::size_t bytes, int root) = 0;
  /// shard: this rank's elements (elem_bytes each, host memory); full: on return, every rank's
  /// shard at its place (ranges.back().end elements, host memory).
  virtual void all_gather(const void* shard, void* full, const std::vector<ShardRange>& ranges,
                          std::size_t elem_bytes) = 0;
  /// True on every rank when `ok` is true on every rank (a logical AND: one rank's failure is
  /// known to all, so that all stop with the same message).
  virtual bool all_ok(bool ok) = 0;
  /// Ends the whole job at once with exit status `code` (MPI_Abort): what a rank does after an
  /// error, since a rank that stops alone leaves the others waiting in a collective for ever.
  [[noreturn]] virtual void abort(int code) = 0;
  /// The backend's name and version ("MPI: Open MPI v4.1.4, ...").
  virtual std::string name() const = 0;
};

/// Collectives on buffers in this rank's GPU memory (device pointers of the GPU the backend was
/// made for), for the NCCL backend. Every call is collective and synchronous: it returns once the
/// result is in place (it runs on the backend's own CUDA stream, then waits for it). Errors (an
/// NCCL or CUDA call failing) throw std::runtime_error naming the call and NCCL's message. Destroyed
/// while an exception unwinds (this rank failed; the others may wait in a collective), it aborts
/// the NCCL communicator (ncclCommAbort) instead of destroying it, which could block for ever.
class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  /// Sums `count` floats of `send` over the ranks into `recv` on rank `root` (recv is ignored on
  /// the other ranks): ncclReduce, fp32, ncclSum. Exact whenever the contributions' partial sums
  /// are, like Comm::reduce_sum.
  virtual void reduce_sum(const float* send, float* recv, std::size_t count, int root) = 0;
  /// `bytes` of `send` (read on rank `root` only) into `recv` on every rank: ncclBroadcast. The
  /// inputs must be complete when the call is made: work queued on other CUDA streams (the legacy
  /// default stream included) is not waited for.
  virtual void broadcast(const void* send, void* recv, std::size_t bytes, int root) = 0;
  /// The backend's name and version ("NCCL 2.27.7").
  virtual std::string name() const = 0;
};

/// Makes the NCCL communicator of the job over the GPU `cuda_device` (this rank's; the calling
/// thread's current device is set to it): rank 0's ncclUniqueId travels through `host`
/// (Comm::broadcast), then ncclCommInitRank. Collective over `host`'s ranks. Throws
/// std::runtime_error when this build has no NCCL or NCCL fails to start (its message).
std::unique_ptr<DeviceComm> make_nccl_comm(Comm& host, int cuda_device);

/// Whether this build has the NCCL backend (found at build time next to CUDA).
bool have_nccl();

/// True when this process was started by an MPI launcher (mpirun/mpiexec, or srun with PMI/PMIx):
/// OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or MPI_LOCALNRANKS is set.
bool launched_by_mpi();

/// How many tasks the launcher started (OMPI_COMM_WORLD_SIZE, PMI_SIZE, or Slurm's
/// SLURM_STEP_NUM_TASKS for `srun -n N` with or without an MPI plugin); 1 when none says.
int launcher_tasks();

/// Initialises MPI (MPI_THREAD_FUNNELED) and returns the world communicator; MPI_Finalize runs when
/// it is destroyed. Throws std::runtime_error when this build has no MPI or MPI_Init fails.
std::unique_ptr<Comm> make_mpi_comm();

/// Whether this build has the MPI backend.
bool have_mpi();

}  // namespace dos
