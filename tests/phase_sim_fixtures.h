// What the phase simulation's hand-worked tests share (tests/test_phase_sim.cpp,
// tests/test_phase_sim_copies.cpp): the workload of a phase as those tests describe it.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "phase_sim.h"

namespace phase_sim_fixtures {

/// A phase's workload: one subgroup of sizes[i] elements per entry, the caller's parameters and
/// gradients on the GPU (caller_on_gpu) or in host memory, 2 bytes each; every other field as
/// dos::Workload sets it.
inline dos::Workload workload(std::vector<std::size_t> sizes, bool caller_on_gpu) {
  dos::Workload w;
  w.sizes = std::move(sizes);
  w.caller_on_gpu = caller_on_gpu;
  w.param_bytes = 2;
  w.grad_bytes = 2;
  return w;
}

}  // namespace phase_sim_fixtures
