// dos-bench stream (stream_bench.cpp): the runtime's state streaming against the PCIe roof.
#pragma once

#include <cstddef>
#include <vector>

namespace dos_bench {

/// One way of streaming: lookahead (streamed subgroups prefetched ahead, OptimizerOptions::
/// stream_lookahead) and the write-back (eager: per subgroup as soon as it is updated; else at the
/// end of the phase).
struct StreamVariant {
  int lookahead = 3;
  bool eager = true;
};

/// n: bf16 parameters (in GPU memory); subgroup_size: elements per subgroup; iterations: timed
/// update phases per variant (after one untimed); json: print JSON instead of a table.
struct StreamOptions {
  std::size_t n = 0, subgroup_size = 0;
  int iterations = 3;
  std::vector<StreamVariant> variants;
  bool json = false;
};

/// Measures the PCIe roof and then one Optimizer per variant under the `gpu` policy; prints the
/// table (or JSON). Returns the process exit status: 0, or 1 with a message on stderr when there
/// is no GPU, no CUDA in the build, or not enough GPU memory. Errors of the runtime propagate as
/// dos::Error.
int run_stream(const StreamOptions& o);

}  // namespace dos_bench
