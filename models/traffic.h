// PCIe traffic of one subgroup update: the byte counts of one update phase (README, "dos-train":
// the paragraph "The update phase's data flow"), as a pure function. The resource model builds its
// per-resource times on these; the tests check StarPU's measured bus counters against them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compact_master.h"

namespace dos {

/// Bytes moved over PCIe, each way, by one update phase of one subgroup of n parameters.
struct PcieBytes {
  std::uint64_t h2d;
  std::uint64_t d2h;
};

/// gpu_update: the subgroup's Adam runs on the GPU (true) or the CPU (false).
/// caller_on_gpu: the caller's parameters and gradients live in GPU memory.
/// param_bytes: bytes per element of the caller's parameters (2 for fp16/bf16, 4 for fp32).
/// n: the subgroup's elements (parameters); every count below is multiplied by it.
/// grad_bytes: bytes per element of the staged gradient (4, the default, when converted to fp32
/// before it crosses PCIe; param_bytes when it crosses in the parameters' dtype).
/// Bytes per parameter, each way:
///  - GPU update, caller on the GPU: fp32 master, exp_avg, exp_avg_sq in and out: 12 B each way.
///  - CPU update, caller on the GPU: the staged gradient comes down (grad_bytes), the new
///    parameters go up (param_bytes).
///  - caller on the host: a CPU update moves nothing; a GPU update moves the state both ways, the
///    staged gradient up (grad_bytes) and the new parameters down (param_bytes).
/// compact: the compact master (OptimizerOptions::compact_master): a GPU update moves the compact
/// state each way (compact_state_bytes_for(n), kernels/compact_master.h: 10.125 B per parameter
/// and its head's padding) instead of 12 n, and needs P where it runs: a CPU update with the caller
/// on the GPU brings P down beside the gradient (grad_bytes + param_bytes down), a GPU update with
/// the caller on the host takes P up beside the gradient (grad_bytes + param_bytes up).
/// params_on_host (compact only): a CPU update whose P the host staging holds already
/// (Execution::params_on_host) brings no P down.
/// Returns the bytes for n parameters (n * bytes per parameter, each way; the compact state's bytes
/// as its buffer holds them). Throws nothing.
inline PcieBytes subgroup_pcie_bytes(bool gpu_update, bool caller_on_gpu, std::size_t param_bytes, std::size_t n,
                                     std::size_t grad_bytes = 4, bool compact = false, bool params_on_host = false) {
  std::uint64_t h = 0, d = 0, state = 0;
  if (gpu_update) {
    state = compact ? compact_state_bytes_for(n) : 12 * std::uint64_t(n);
    if (!caller_on_gpu) {
      h += grad_bytes + (compact ? param_bytes : 0);
      d += param_bytes;
    }
  } else if (caller_on_gpu) {
    h = param_bytes;
    d = grad_bytes + (compact && !params_on_host ? param_bytes : 0);
  }
  return PcieBytes{state + h * n, state + d * n};
}

}  // namespace dos
