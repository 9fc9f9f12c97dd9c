// PCIe traffic of one subgroup update: the byte counts of one update phase (README, "dos-train":
// the paragraph "The update phase's data flow"), as a pure function. The resource model builds its
// per-resource times on these; the tests check StarPU's measured bus counters against them.
#pragma once

#include <cstddef>
#include <cstdint>

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
/// Returns the bytes for n parameters (n * bytes per parameter, each way). Throws nothing.
inline PcieBytes subgroup_pcie_bytes(bool gpu_update, bool caller_on_gpu, std::size_t param_bytes, std::size_t n,
                                     std::size_t grad_bytes = 4) {
  std::uint64_t h = 0, d = 0;
  if (gpu_update) {
    h = 12;
    d = 12;
    if (!caller_on_gpu) {
      h += grad_bytes;
      d += param_bytes;
    }
  } else if (caller_on_gpu) {
    h = param_bytes;
    d = grad_bytes;
  }
  return PcieBytes{h * n, d * n};
}

}  // namespace dos
