// The check of optimizer-state values shared by the checkpoint's save and load and by
// Optimizer::load_state: an Adam state holds finite numbers, and a second moment >= 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace dos {

/// The first element of v[0, n) (fp32) that is not finite, or (nonnegative: an exp_avg_sq) is below
/// 0; n when none. Runs on the calling thread's OpenMP team (a memory-bound pass of 4 bytes per
/// element); the element found is the first one whatever the team. Throws nothing.
inline std::size_t first_bad_state_value(const float* v, std::size_t n, bool nonnegative) {
  std::size_t first = n;
#pragma omp parallel for reduction(min : first) schedule(static)
  for (std::size_t k = 0; k < n; ++k)
    if (!std::isfinite(v[k]) || (nonnegative && v[k] < 0)) first = std::min(first, k);
  return first;
}

}  // namespace dos
