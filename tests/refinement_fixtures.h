// What the refinement's tests share (tests/test_refinement.cpp, tests/test_first_phases.cpp): the
// rates of the machine they simulate, the 20B quarter's workload and update budget, what the runtime
// would measure of a phase on a machine that behaves as the phase simulation says, and a bitwise
// comparison of two sets of rates.
#pragma once

#include <cstddef>
#include <vector>

#include "cmocka_cpp.h"
#include "phase_sim.h"
#include "refinement.h"

namespace refinement_fixtures {

inline const dos::Rates kRates{4e9, 3e9, 1.3e11, 4.9e11, 4.9e10, 5.1e10};

inline dos::Workload quarter_20b() {  // the 20B preset's shard 1/4 as dos-train plans it: 35 subgroups
  dos::Workload w;
  w.sizes.assign(35, 124000000);
  w.sizes.back() = 4323185920ull - 34ull * 124000000ull;
  w.caller_on_gpu = true;
  w.param_bytes = 2;
  w.grad_bytes = 2;
  return w;
}

inline dos::Execution budget_40gb() {  // dos-train's --gpu-update-budget 40GB on that shard
  dos::Execution e;
  e.update_budget = std::size_t(40e9);
  return e;
}

/// What the runtime would measure in a phase of `plan` on a machine that behaves as the simulation
/// at rates `truth`.
inline dos::PhaseMeasure measure_on(const dos::Workload& w, const std::vector<dos::PlanSide>& plan, const dos::Rates& truth,
                                    const dos::Execution& e, double* seconds) {
  const dos::Simulation s = dos::simulate_phase(w, plan, truth, e);
  dos::PhaseMeasure m;
  for (dos::PlanSide p : plan) m.streamed += p == dos::PlanSide::gpu_streamed ? 1 : 0;
  m.cpu_adam_seconds = s.cpu;
  m.alone_params = s.cpu_after_stream_params;
  m.alone_seconds = s.cpu_after_stream;
  m.stream_end_seconds = s.stream_end;
  *seconds = s.total;
  return m;
}

/// Every rate of a and b equal, bit for bit.
inline void assert_same_rates(const dos::Rates& a, const dos::Rates& b) {
  for (auto f : {&dos::Rates::U_c, &dos::Rates::U_c_dma, &dos::Rates::U_g, &dos::Rates::D_c, &dos::Rates::B_h2d,
                 &dos::Rates::B_d2h, &dos::Rates::link_share})
    assert_true(a.*f == b.*f);
}

}  // namespace refinement_fixtures
