// Statistics the benchmarks share. Header only; no state.
#pragma once

#include <algorithm>
#include <vector>

namespace dos_bench {

/// The median of `v` (seconds, or any figure): its middle element once sorted, the upper one of the
/// two middle elements for an even count. `v` must not be empty (the benchmarks time at least one
/// repetition).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace dos_bench
