// dos-train's memory checks before a run allocates anything large: the host memory a rank (or a
// node's ranks together) needs against what the node and its memory cgroup leave (refused when it
// does not fit), and, with the emulated compute on a GPU under an update budget, the GPU memory
// the run may hold at once against what the GPU has free (a warning: StarPU's limit is a worst case).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model_config.h"
#include "step_io.h"

namespace dos_train {

/// What decides a run's memory. io: the collectives' setup as StepIO gets it (comm, device, total,
/// rank, world, dtype, on_gpu, parts; params and grads not needed); subgroup: elements per subgroup;
/// native_grads: --grad-transfer native (gradients staged in the model's dtype, else fp32);
/// save_params: --save-params given; model, shard: for messages.
struct RunMemory {
  StepIO::Setup io;
  std::size_t subgroup = 1;
  bool native_grads = true;
  bool save_params = false;
  /// --master compact with --save-state or --resume: the masters rebuilt in host memory, 4 B/param
  bool compact_state_copy = false;
  std::string model, shard;
};

/// Before the runtime starts (StarPU calibrating its bus, CUDA and NCCL starting), what can be told
/// then: the subgroup count (dos::partition_subgroups refuses too many, with its message) and this
/// rank's optimizer state alone, a lower bound of host_need, for its n parameters. Throws
/// std::invalid_argument (the count) and dos::ResourceError (the state).
void check_state_lower_bound(std::size_t n, std::size_t subgroup, dos::DType dtype, bool native_grads,
                             const std::string& model, const std::string& shard);

/// Host bytes rank r of the run needs: the optimizer state (dos::host_bytes_per_param for its
/// shard), the parameters and gradients when they live on the host (2 x the dtype's size per
/// parameter), the collectives' host buckets (StepIO::host_bytes), 64 KB per subgroup (its StarPU
/// handles and page rounding, about 28 KB measured) and, with --save-params, an fp32 copy of the
/// shard's masters (one more with compact_state_copy). The process's own libraries (about 0.2 GB) are not counted. Throws
/// std::invalid_argument for r >= io.world (dos::shard_range).
std::size_t host_need(const RunMemory& m, std::size_t r);

/// Checks host_need before anything large is allocated (dos::check_host_memory: MemAvailable or the
/// process's cgroup limit). Under MPI (io.comm) it is collective: every rank reads what is free
/// before any allocates (all_ok separates the reads from the allocations) and a node of several
/// ranks checks them together, each at the largest rank's need (shards differ by at most one
/// element), so that the job fails on every rank or on none. Throws std::runtime_error with the
/// message (or, on a rank that found room, one saying another rank did not).
void check_host_need(const RunMemory& m);

#if defined(DOS_HAVE_CUDA)
/// With the emulated compute on the GPU and StarPU's memory limited to `starpu_limit` bytes (its
/// limit for the GPU budgets; 0: none, no warning), the warning of gpu_memory_warning
/// (compute_emulator.h) when StarPU's limit, the emulated forward and backward of `cfg` for
/// `tokens` tokens and the model's parameters and gradients (with NCCL's GPU buckets) exceed the GPU
/// memory free now less kGpuSpareBytes; "" otherwise. update_text, resident_text: --gpu-update-budget and
/// --gpu-resident-budget as given (resident_text empty when not given), for the message;
/// update_budget: --gpu-update-budget in bytes. Throws std::runtime_error when CUDA fails.
std::string gpu_need_warning(const RunMemory& m, const ModelConfig& cfg, std::int64_t tokens, std::size_t starpu_limit,
                             const std::string& update_text, const std::string& resident_text,
                             std::size_t update_budget);
#endif

}  // namespace dos_train
