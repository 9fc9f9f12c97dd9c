// dos-bench overhead (overhead_bench.cpp): the runtime's cost per task and per subgroup, beside the
// cost of an empty StarPU task measured in the same process.
#pragma once

#include <cstddef>

namespace dos_bench {

/// subgroup_size: elements per subgroup (small, so that the kernels take next to nothing);
/// subgroups: how many; phases: timed update phases per placement (after two untimed ones), and
/// empty_tasks: empty StarPU tasks per worker kind; json: print JSON instead of a table.
struct OverheadOptions {
  std::size_t subgroup_size = 10007;
  std::size_t subgroups = 55;
  int phases = 20;
  int empty_tasks = 2000;
  bool json = false;
};

/// Measures, in one StarPU instance (policy `dos`):
///  - an empty StarPU task (no buffers, an empty function) on a CPU worker and, when there is one,
///    on a CUDA worker: microseconds per task, submitted all at once then waited for (throughput),
///    and submitted one at a time, each waited for (round trip);
///  - update phases of `subgroups` subgroups of `subgroup_size` bf16 parameters, every subgroup on
///    the CPU, and (with a CUDA worker) every subgroup streamed through the GPU: median phase
///    seconds, microseconds per subgroup and per task, and per task above the empty task of the
///    same worker kind.
/// The caller's parameters and gradients are on the GPU when there is one (as in training), else in
/// host memory. Prints the table (or JSON) and returns the exit status: 0, or 1 with a message on
/// stderr when the options are out of range. Errors of the runtime propagate as dos::Error.
int run_overhead(const OverheadOptions& o);

}  // namespace dos_bench
