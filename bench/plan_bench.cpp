// dos-bench plan: the `dos` plan's search (choose_plan_simulated) timed as the runtime runs it at
// every phase's start, on its critical path, beside one simulation of the chosen plan and the phase
// that plan is simulated to take. Pure computation: no StarPU, no GPU.
#include "plan_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_stats.h"
#include "phase_sim.h"
#include "resource_model.h"

namespace dos_bench {
namespace {

using Clock = std::chrono::steady_clock;

struct PlanRow {
  std::size_t subgroups = 0, simulations = 0, streamed = 0;
  double search_s = 0;  // median choose_plan_simulated
  double one_sim_s = 0; // median simulate_phase of the chosen plan
  double phase_s = 0;   // the chosen plan's simulated phase
};

template <class F>
double seconds_of(F f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int run_plan(const PlanOptions& o) {
  if (o.subgroups.empty() || o.subgroup_size < 1 || o.reps < 1) {
    std::fprintf(stderr, "dos-bench plan: give at least one subgroup count, --subgroup-size >= 1 and --reps >= 1\n");
    return 1;
  }
  for (std::size_t n : o.subgroups)
    if (n < 1 || n > 100000) {
      std::fprintf(stderr, "dos-bench plan: a subgroup count must be in [1, 1e5], got %zu\n", n);
      return 1;
    }
  // rates of the order the GPU machine's cache held after a calibrating run (docs/measured-2026-12.md:
  // U_c 4.15, U_c_dma 3.34 Gparams/s, link_share 0.777; U_g, D_c and PCIe of its --plan-only rates)
  dos::Rates r;
  r.U_c = 4.15e9;
  r.U_c_dma = 3.34e9;
  r.U_g = 136.9e9;
  r.D_c = 494.6e9;
  r.B_h2d = 50.0e9;
  r.B_d2h = 51.5e9;
  r.link_share = 0.777;
  // the runtime's defaults with the caller's bf16 buffers on the GPU (Optimizer::execution)
  dos::Execution e;
  e.order = dos::SubmitOrder::plan;
  e.lookahead = 3;
  e.cpu_workers = 1;
  e.own_param_upload = true;
  e.own_grad_download = true;
  e.grad_download_by_copy_engine = true;
  e.param_upload_by_copy_engine = false;
  std::vector<PlanRow> rows;
  for (std::size_t n : o.subgroups) {
    dos::Workload w;
    w.sizes.assign(n, o.subgroup_size);
    w.sizes.back() = std::max<std::size_t>(1, o.subgroup_size / 3);
    w.caller_on_gpu = true;
    w.param_bytes = 2;
    w.grad_bytes = 2;
    w.cpu_grads_staged_on_gpu = false;
    w.cpu_params_staged_on_gpu = false;
    PlanRow row;
    row.subgroups = n;
    // the same search with every evaluation counted: choose_plan_by over simulate_phase
    dos::choose_plan_by(w, [&](const std::vector<dos::PlanSide>& plan) {
      ++row.simulations;
      dos::Prediction p;
      p.total = dos::simulate_phase(w, plan, r, e).total;
      return p;
    });
    dos::Choice c = dos::choose_plan_simulated(w, r, e);  // untimed: the first call's allocations
    std::vector<double> search, one;
    for (int i = 0; i < o.reps; ++i) search.push_back(seconds_of([&] { c = dos::choose_plan_simulated(w, r, e); }));
    for (int i = 0; i < o.reps; ++i) one.push_back(seconds_of([&] { dos::simulate_phase(w, c.plan, r, e); }));
    row.search_s = median(search);
    row.one_sim_s = median(one);
    row.phase_s = c.predicted.total;
    row.streamed = c.streamed;
    rows.push_back(row);
  }
  auto ns_per_subgroup_sim = [](const PlanRow& row) {
    return 1e9 * row.search_s / double(row.simulations) / double(row.subgroups);
  };
  if (o.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const PlanRow& row : rows)
      j.push_back({{"subgroups", row.subgroups}, {"subgroup_size", o.subgroup_size}, {"simulations", row.simulations},
                   {"search_us_median", 1e6 * row.search_s}, {"ns_per_subgroup_per_simulation", ns_per_subgroup_sim(row)},
                   {"one_simulation_us_median", 1e6 * row.one_sim_s}, {"streamed", row.streamed},
                   {"phase_seconds", row.phase_s}, {"search_percent_of_phase", 100.0 * row.search_s / row.phase_s}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("dos-bench plan: choose_plan_simulated on %zu-parameter subgroups, median of %d searches; one "
              "simulate_phase call of the chosen plan and its simulated phase beside it\n",
              o.subgroup_size, o.reps);
  std::printf("%9s %6s %12s %14s %12s %9s %10s %9s\n", "subgroups", "sims", "search us", "ns/sg/sim", "one sim us",
              "streamed", "phase s", "% phase");
  for (const PlanRow& row : rows)
    std::printf("%9zu %6zu %12.1f %14.1f %12.2f %9zu %10.4f %8.3f%%\n", row.subgroups, row.simulations,
                1e6 * row.search_s, ns_per_subgroup_sim(row), 1e6 * row.one_sim_s, row.streamed, row.phase_s,
                100.0 * row.search_s / row.phase_s);
  return 0;
}

}  // namespace dos_bench
