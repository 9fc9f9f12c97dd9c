// dos-bench plan (plan_bench.cpp): what the `dos` plan's search (choose_plan_simulated,
// models/phase_sim.h) costs per phase, beside one simulation of a phase and the phase it plans.
#pragma once

#include <cstddef>
#include <vector>

namespace dos_bench {

/// subgroups: the phases' subgroup counts, one row each; subgroup_size: elements per subgroup (the
/// last one of each phase a third of it, as an optimizer's remainder); reps: timed searches per
/// row (after one untimed), the median kept; json: print JSON instead of a table.
struct PlanOptions {
  std::vector<std::size_t> subgroups = {55, 300, 1000};
  std::size_t subgroup_size = 100000000;
  int reps = 20;
  bool json = false;
};

/// For each subgroup count, on rates of the order the GPU machine measured (one H200, 16 cores:
/// docs/measured-2026-12.md) and the runtime's default execution (the caller's buffers and
/// gradients bf16 on the GPU, the runtime's own gradient downloads by the copy engine and
/// parameter uploads by a kernel, lookahead 3, one CPU worker, no update budget, nothing resident:
/// every subgroup is the search's to place): the search's median microseconds, the simulations it runs, nanoseconds per
/// subgroup per simulation, and beside them one simulate_phase call of the chosen plan
/// (microseconds, median of reps) and that plan's simulated phase (seconds), with the search's
/// share of it. Prints the table (or JSON) and returns the exit status: 0, or 1 with a message on
/// stderr when the options are out of range (a count of 0 or above 1e5, subgroup_size 0, reps < 1).
int run_plan(const PlanOptions& o);

}  // namespace dos_bench
