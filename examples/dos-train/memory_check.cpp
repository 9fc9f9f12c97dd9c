// dos-train's memory checks (memory_check.h).
#include "memory_check.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "compute_emulator.h"
#include "dos.h"
#include "emulate.h"
#include "options.h"
#include "partition.h"

namespace dos_train {

void check_state_lower_bound(std::size_t n, std::size_t subgroup, dos::DType dtype, bool native_grads,
                             const std::string& model, const std::string& shard) {
  (void)dos::partition_subgroups({n}, subgroup);
  dos::check_host_memory(n * dos::host_bytes_per_param(dtype, native_grads),
                         "the optimizer state of " + std::to_string(n) + " parameters (" + model + ", shard " + shard + ")");
}

std::size_t host_need(const RunMemory& m, std::size_t r) {
  StepIO::Setup s = m.io;
  s.rank = r;
  const dos::ShardRange sr = dos::shard_range(s.total, r, s.world);
  const std::size_t n = sr.end - sr.begin, esz = dos::dtype_size(s.dtype);
  const std::size_t subgroups = (n + m.subgroup - 1) / m.subgroup;
  return n * dos::host_bytes_per_param(s.dtype, m.native_grads) + (s.on_gpu ? 0 : 2 * esz * n) +
         StepIO::host_bytes(s) + subgroups * 65536 + (m.save_params ? 4 * n : 0) + (m.compact_state_copy ? 4 * n : 0);
}

void check_host_need(const RunMemory& m) {
  const StepIO::Setup& io = m.io;
  const std::string held =
      std::string(io.on_gpu ? "the optimizer state" : "the optimizer state, the parameters and gradients") +
      (io.comm && !io.device ? ", the collectives' host buffers" : "") +
      (m.compact_state_copy ? ", and 4 bytes per parameter of masters that --master compact rebuilds to write or "
                              "read the checkpoint (--master full, or no --save-state/--resume, needs none)"
                            : "");
  const dos::ShardRange mine = dos::shard_range(io.total, io.rank, io.world);
  auto check_this_rank = [&] {
    dos::check_host_memory(host_need(m, io.rank), "the host state of " + std::to_string(mine.end - mine.begin) +
                                                      " parameters (" + held + "; " + m.model + ", shard " + m.shard + ")");
  };
  if (!io.comm) {
    check_this_rank();
    return;
  }
  // every rank comes here (all_ok is collective), one rank alone on its node too
  const std::size_t local = std::size_t(io.comm->local_size());
  std::string refused;
  try {
    if (local > 1) {
      std::size_t largest = 0;
      for (std::size_t r = 0; r < io.world; ++r) largest = std::max(largest, host_need(m, r));
      char each[32];
      std::snprintf(each, sizeof each, "%.2f GB", largest / 1e9);
      dos::check_host_memory(local * largest, "the host state of this node's " + std::to_string(local) +
                                                  " ranks (up to " + each + " each: " + held + "; " + m.model + ")");
    } else {
      check_this_rank();
    }
  } catch (const dos::ResourceError& e) {
    refused = e.what();
  }
  if (!io.comm->all_ok(refused.empty()))
    fail(refused.empty() ? "another rank found too little host memory for its node's ranks (its message says how much)"
                         : refused);
}

#if defined(DOS_HAVE_CUDA)
std::string gpu_need_warning(const RunMemory& m, const ModelConfig& cfg, std::int64_t tokens, std::size_t starpu_limit,
                             const std::string& update_text, const std::string& resident_text,
                             std::size_t update_budget) {
  if (starpu_limit == 0) return "";
  const std::size_t esz = dos::dtype_size(m.io.dtype);
  const dos::ShardRange mine = dos::shard_range(m.io.total, m.io.rank, m.io.world);
  GpuNeed need;
  need.starpu_limit = starpu_limit;
  need.compute = ComputeEmulator::peak_bytes(forward_gemms(cfg), tokens, esz);
  need.model = 2 * (mine.end - mine.begin) * esz + StepIO::device_bytes(m.io);
  std::size_t free_b = 0, total_b = 0;
  cuda_memory_info(&free_b, &total_b);
  const std::string budgets = update_text + (resident_text.empty() ? "" : " and --gpu-resident-budget " + resident_text);
  return gpu_memory_warning(need, free_b, budgets, update_budget, tokens);
}
#endif

}  // namespace dos_train
