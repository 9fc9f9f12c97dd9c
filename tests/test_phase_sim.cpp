// The phase simulation (models/phase_sim.h) on cases small enough to follow by hand: each expected
// time below is worked out here, piece by piece, from the resources' rates and the order the runtime
// submits in, not by the simulation's code. The runtime's own copies, the compact master's streamed
// state and a resident state still to come up are in test_phase_sim_copies.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "cmocka_cpp.h"
#include "phase_sim.h"
#include "phase_sim_fixtures.h"

namespace {

using dos::PlanSide;

using phase_sim_fixtures::workload;

// Every subgroup on the CPU, the caller's buffers in host memory: no PCIe, CPU Adam alone at U_c.
void test_cpu_only(void**) {
  const dos::Workload w = workload({1000000, 3000000, 777}, false);
  const dos::Rates r{1e9, 5e8, 1e12, 1e12, 1e10, 1e10};
  const dos::Simulation s = dos::simulate_phase(w, {PlanSide::cpu, PlanSide::cpu, PlanSide::cpu}, r, dos::Execution{});
  const double want = (1000000.0 + 3000000.0 + 777.0) / 1e9;
  assert_float_equal(s.total, want, 1e-12);
  assert_float_equal(s.cpu, want, 1e-12);
  assert_float_equal(s.cpu_beside_dma, 0.0, 0.0);
  assert_float_equal(s.h2d + s.d2h, 0.0, 0.0);
  assert_float_equal(s.stream_end, 0.0, 0.0);
}

// One streamed subgroup: its state goes up (12 n / B), the GPU updates it (n / U_g), it comes back
// (12 n / B): nothing overlaps (the pipeline's fill and drain).
void test_one_streamed(void**) {
  const double n = 1e8;
  const dos::Workload w = workload({std::size_t(n)}, true);
  const dos::Rates r{1e9, 1e9, 1e11, 4e11, 4e10, 5e10};
  const dos::Simulation s = dos::simulate_phase(w, {PlanSide::gpu_streamed}, r, dos::Execution{});
  const double want = 12 * n / 4e10 + n / 1e11 + 12 * n / 5e10;
  assert_float_equal(s.total, want, 1e-12);
  assert_float_equal(s.stream_end, want, 1e-12);
  assert_float_equal(s.h2d, 12 * n / 4e10, 1e-12);
  assert_float_equal(s.d2h, 12 * n / 5e10, 1e-12);
}

// Two streamed subgroups: the second's state goes up while the GPU updates the first (prefetched),
// and comes back once the first's has: a = 12 n / B each way, g = n / U_g < a; the first goes up in
// [0, a], is updated in [a, a + g], goes back in [a + g, 2a + g]; the second goes up in [a, 2a], is
// updated in [2a, 2a + g] and goes back in [2a + g, 3a + g].
void test_two_streamed(void**) {
  const double n = 1e8, B = 5e10, U_g = 1e11;
  const dos::Workload w = workload({std::size_t(n), std::size_t(n)}, true);
  const dos::Rates r{1e9, 1e9, U_g, 4e11, B, B};
  const dos::Simulation s =
      dos::simulate_phase(w, {PlanSide::gpu_streamed, PlanSide::gpu_streamed}, r, dos::Execution{});
  const double a = 12 * n / B, g = n / U_g;
  assert_float_equal(s.total, 3 * a + g, 1e-12);
  assert_float_equal(s.gpu, 2 * g, 1e-12);
}

// Host memory shared. U_c = 1e9 with 28 B of host traffic per CPU-updated parameter (24 + 2 + 2):
// 28e9 B/s; B = 28e9 each way; U_c_dma = 0.75 U_c, so M = 0.75 (28e9 + 56e9) = 63e9 B/s: CPU Adam
// beside one link (56e9) runs at full speed, beside both (84e9) everything gets 3/4. The caller in
// host memory; subgroup 0 on the CPU (2e9 parameters), subgroups 1 and 2 streamed (2e9 each, 14 B
// up and 14 B down per parameter: 28e9 B, 1 s at full rate); the GPU's work next to nothing.
// [0, 1]: the CPU (1e9 done) and subgroup 1 going up, full speed. From 1: subgroup 2 goes up and 1
// comes back, beside the CPU: all at 3/4, so both links need 4/3 s and the CPU's last 1e9 too:
// they end together at 7/3. Then subgroup 2 comes back alone at full speed: 10/3.
void test_host_memory_shared(void**) {
  const dos::Workload w = workload({2000000000, 2000000000, 2000000000}, false);
  const std::vector<PlanSide> plan = {PlanSide::cpu, PlanSide::gpu_streamed, PlanSide::gpu_streamed};
  const dos::Rates r{1e9, 0.75e9, 1e15, 1e15, 28e9, 28e9};
  assert_float_equal(dos::host_bandwidth(w, r), 63e9, 1.0);
  const dos::Simulation s = dos::simulate_phase(w, plan, r, dos::Execution{});
  assert_float_equal(s.cpu, 7.0 / 3, 1e-5);
  assert_float_equal(s.cpu_beside_dma, 7.0 / 3, 1e-5);
  assert_float_equal(s.total, 10.0 / 3, 1e-5);
  assert_float_equal(s.stream_end, s.total, 1e-12);
  // without contention (U_c_dma = U_c): the CPU ends at 2, the links at 2 and 3
  const dos::Simulation f = dos::simulate_phase(w, plan, dos::Rates{1e9, 1e9, 1e15, 1e15, 28e9, 28e9}, dos::Execution{});
  assert_float_equal(f.cpu, 2.0, 1e-5);
  assert_float_equal(f.total, 3.0, 1e-5);
  // M is never below what CPU Adam or both links get alone
  assert_float_equal(dos::host_bandwidth(w, dos::Rates{1e9, 0.1e9, 1e15, 1e15, 28e9, 28e9}), 56e9, 1.0);
  assert_float_equal(dos::host_bandwidth(w, dos::Rates{1e9, 0.1e9, 1e15, 1e15, 1e9, 1e9}), 28e9, 1.0);
}

// The order of submission and the CUDA worker's first-in first-out queue. Subgroup 0 streamed,
// subgroup 1 on the CPU, the caller on the GPU; n = 1e9 each, B = 1.2e10 each way (the state, 12 n,
// takes 1 s each way, the gradient and the parameters, 2 n, 1/6 s), CPU Adam 1 s, the GPU's work
// next to nothing (1e-6 s: n / U_g; the staging n / D_c is 1e-6 s too).
// plan order: the GPU's queue holds the streamed Adam, then the staging, which waits behind it
// for the state: up [0, 1], Adam [1, 1+e], staging [1+e, 1+2e], the state goes back [1+e, 2+e]
// and the gradient behind it [2+e, 2+e+1/6], CPU Adam [.., 3+e+1/6], parameters up
// [.., 3+e+1/3], their write-back: 3 + 1/3 + e.
// cpu_first: the staging first [0, e], the gradient down [e, e+1/6], CPU Adam [.., e+7/6],
// parameters up once the state is up (1 s) [e+7/6, e+4/3]; the streamed Adam [1, 1+e], its state
// back [1+e, 2+e], the end.
void test_order(void**) {
  const double n = 1e9, e = 1e-6;
  const dos::Workload w = workload({std::size_t(n), std::size_t(n)}, true);
  const dos::Rates r{1e9, 1e9, 1e15, 1e15, 1.2e10, 1.2e10};
  const std::vector<PlanSide> plan = {PlanSide::gpu_streamed, PlanSide::cpu};
  dos::Execution plan_order;
  plan_order.order = dos::SubmitOrder::plan;
  const dos::Simulation a = dos::simulate_phase(w, plan, r, plan_order);
  assert_false(a.cpu_first);
  assert_float_equal(a.total, 3 + 1.0 / 3 + e, 1e-9);
  dos::Execution cpu_first;
  cpu_first.order = dos::SubmitOrder::cpu_first;
  const dos::Simulation b = dos::simulate_phase(w, plan, r, cpu_first);
  assert_true(b.cpu_first);
  assert_float_equal(b.total, 2 + e, 1e-9);
  assert_float_equal(b.stream_end, 2 + e, 1e-9);
  // the order itself: the subgroups that are not streamed first, each group in index order
  const std::vector<PlanSide> four = {PlanSide::gpu_streamed, PlanSide::cpu, PlanSide::gpu_streamed,
                                      PlanSide::gpu_resident};
  assert_true(dos::submission_order(four, true) == (std::vector<std::size_t>{1, 3, 0, 2}));
  assert_true(dos::submission_order(four, false) == (std::vector<std::size_t>{0, 1, 2, 3}));
  // an update budget too small for the CPU subgroup's staging beside the streaming window: plan order
  cpu_first.update_budget = std::size_t(12 * n);
  assert_false(dos::submits_cpu_first(w, plan, cpu_first));
}

// The update budget: two CPU subgroups (caller on the GPU, staging 4 B per parameter) and a budget
// of one subgroup's staging: the second starts only when the first's parameters are back, so the
// phase is twice one subgroup's chain: gradient down 0.2 s, Adam 1 s, parameters up 0.2 s. Without
// a budget the second's gradient follows the first's and its Adam the first's: 0.2 + 1 + 1 + 0.2.
void test_budget(void**) {
  const double n = 1e9;
  const dos::Workload w = workload({std::size_t(n), std::size_t(n)}, true);
  const dos::Rates r{1e9, 1e9, 1e15, 1e15, 1e10, 1e10};
  assert_int_equal(dos::subgroup_footprint(w, std::size_t(n), PlanSide::cpu), 4 * std::size_t(n));
  assert_int_equal(dos::subgroup_footprint(w, std::size_t(n), PlanSide::gpu_streamed), 12 * std::size_t(n));
  assert_int_equal(dos::subgroup_footprint(w, std::size_t(n), PlanSide::gpu_resident), 0);
  // the state buffer's slices are padded to 16 elements: 1001 parameters take 3 slices of 1008
  assert_int_equal(dos::subgroup_footprint(w, 1001, PlanSide::gpu_streamed), 12 * 1008);
  assert_int_equal(dos::subgroup_footprint(w, 1001, PlanSide::cpu), 4 * 1001);
  dos::Execution tight;
  tight.update_budget = 4 * std::size_t(n);
  const std::vector<PlanSide> plan = {PlanSide::cpu, PlanSide::cpu};
  assert_float_equal(dos::simulate_phase(w, plan, r, tight).total, 2 * 1.4 + 2e-6, 1e-9);
  assert_float_equal(dos::simulate_phase(w, plan, r, dos::Execution{}).total, 2.4 + 1e-6, 1e-9);
  // The runtime's own copies stage nothing on the GPU: a CPU subgroup's footprint counts what is
  // left there, and with nothing left the same tight budget no longer holds the second subgroup
  // back: gradients down on the own lane [0, 0.2] and [0.2, 0.4], Adams [0.2, 1.2] and [1.2, 2.2],
  // parameters up [1.2, 1.4] and [2.2, 2.4] (no staging task on the GPU).
  dos::Workload own = w;
  own.cpu_grads_staged_on_gpu = false;
  assert_int_equal(dos::subgroup_footprint(own, std::size_t(n), PlanSide::cpu), 2 * std::size_t(n));
  own.cpu_params_staged_on_gpu = false;
  assert_int_equal(dos::subgroup_footprint(own, std::size_t(n), PlanSide::cpu), 0);
  assert_int_equal(dos::subgroup_footprint(own, std::size_t(n), PlanSide::gpu_streamed), 12 * std::size_t(n));
  tight.own_grad_download = tight.own_param_upload = true;
  assert_float_equal(dos::simulate_phase(own, plan, r, tight).total, 2.4, 1e-9);
  // A streamed subgroup larger than the budget is let in alone, into an empty window; the lookahead
  // cannot prefetch it, so its state is fetched when the GPU takes it: up in 1.2 s (12 n at B =
  // 1e10), Adam 1e-6 s, back in 1.2 s, before the next one is let in.
  dos::Execution small;
  small.update_budget = 12 * std::size_t(n) - 1;
  const std::vector<PlanSide> streamed = {PlanSide::gpu_streamed, PlanSide::gpu_streamed};
  assert_float_equal(dos::simulate_phase(w, streamed, r, small).total, 2 * 2.4 + 2e-6, 1e-9);
}

// The plan search and the lower bound: on a grid of machines, the simulated best plan is never
// faster than the lower bound (which assumes no fill, drain or wait) and never slower than the
// simulated all-CPU and all-streamed plans.
void test_choice_and_bound(void**) {
  for (double uc : {1e9, 4e9}) {
    for (double share : {1.0, 0.75, 0.5}) {
      for (double b : {2e10, 5e10}) {
        dos::Workload w = workload(std::vector<std::size_t>(20, 100000000), true);
        const dos::Rates r{uc, uc * share, 1.3e11, 5e11, b, b};
        const dos::Choice c = dos::choose_plan_simulated(w, r, dos::Execution{});
        const double lb = dos::lower_bound(w, r);
        const double all_cpu = dos::simulate_phase(w, dos::spread_plan(20, 0), r, dos::Execution{}).total;
        const double all_gpu = dos::simulate_phase(w, dos::spread_plan(20, 20), r, dos::Execution{}).total;
        assert_true(lb <= c.predicted.total + 1e-12);
        assert_true(c.predicted.total <= std::min(all_cpu, all_gpu) + 1e-12);
        assert_int_equal(std::size_t(std::count(c.plan.begin(), c.plan.end(), PlanSide::gpu_streamed)), c.streamed);
        // a simulated choice's bound is what the simulation of its plan names, not "gpu" for
        // every total that is none of the busy times
        const dos::Simulation s = dos::simulate_phase(w, c.plan, r, dos::Execution{});
        assert_string_equal(c.predicted.bound_by().c_str(), s.busiest());
      }
    }
  }
}

// busiest_resource by hand: the largest time, ties in the order cpu, h2d, d2h, gpu.
void test_busiest_resource(void**) {
  assert_string_equal(dos::busiest_resource(1, 2, 3, 4), "gpu");
  assert_string_equal(dos::busiest_resource(5, 2, 3, 4), "cpu");
  assert_string_equal(dos::busiest_resource(1, 3, 3, 2), "h2d");
  assert_string_equal(dos::busiest_resource(1, 2, 3, 3), "d2h");
  dos::Prediction p;  // a simulated total, above every busy time: the busiest, d2h
  p.total = 1.0;
  p.cpu = 0.5;
  p.h2d = 0.6;
  p.d2h = 0.7;
  p.gpu = 0.1;
  assert_string_equal(p.bound_by().c_str(), "d2h");
  p.host = 1.0;  // the closed form's total is the host term
  assert_string_equal(p.bound_by().c_str(), "host");
}

// Two CPU workers: subgroups 0 and 2 on the first, 1 on the second, side by side at U_c each (the
// caller in host memory: no PCIe, and host memory holds both: M is at least their demand).
void test_cpu_workers(void**) {
  const dos::Workload w = workload({1000000000, 500000000, 250000000}, false);
  const dos::Rates r{1e9, 1e9, 1e12, 1e12, 1e10, 1e10};
  dos::Execution e;
  e.cpu_workers = 2;
  const dos::Simulation s = dos::simulate_phase(w, {PlanSide::cpu, PlanSide::cpu, PlanSide::cpu}, r, e);
  assert_float_equal(s.total, 1.25, 1e-9);  // worker 0: 1 s + 0.25 s; worker 1: 0.5 s
  assert_float_equal(s.cpu, 1.75, 1e-9);
  // the lower bound counts both workers (nothing streamed): 1.75e9 parameters at 2e9/s
  dos::Workload cpu_only = w;
  cpu_only.may_stream = false;
  assert_float_equal(dos::lower_bound(cpu_only, r, 2), 0.875, 1e-9);
  assert_true(dos::lower_bound(w, r, 2) <= s.total);
}

// A CPU worker's team of T threads takes a subgroup in work items of W elements: a subgroup of n
// keeps at most ceil(n / W) threads busy and ends no sooner than one thread takes for its largest
// item, min(n, W) at U_c / T. Worked by hand: T = 15, W = 16384, U_c = 1.5e9 (1e8 per thread).
void test_cpu_team_share(void**) {
  dos::Execution e;
  e.cpu_team_threads = 15;
  e.cpu_work_item = 16384;
  // one item (10007 elements) on one thread: 10007 / 1e8 s against 10007 / 1.5e9 at the team's rate
  assert_float_equal(dos::cpu_team_share(e, 10007), 1.0 / 15, 1e-15);
  // two items (20000: 16384 and 3616): the longer one, 16384 / 1e8 s
  assert_float_equal(dos::cpu_team_share(e, 20000), 20000.0 / (15 * 16384.0), 1e-15);
  // enough items for every thread: the team's rate, exactly
  assert_true(dos::cpu_team_share(e, 15 * 16384) == 1.0);
  assert_true(dos::cpu_team_share(e, 124000000) == 1.0);
  // no limit without a team or an item size, and for an empty subgroup
  dos::Execution none;
  assert_true(dos::cpu_team_share(none, 10007) == 1.0);
  e.cpu_work_item = 0;
  assert_true(dos::cpu_team_share(e, 10007) == 1.0);
  e.cpu_work_item = 16384;
  e.cpu_team_threads = 1;
  assert_true(dos::cpu_team_share(e, 10007) == 1.0);
  e.cpu_team_threads = 15;
  assert_true(dos::cpu_team_share(e, 0) == 1.0);

  // the caller in host memory, every subgroup on the CPU (one worker, nothing on PCIe): the
  // subgroups run one after another, 10007 and 777 elements at 1e8/s each, 20000 as its longer item
  const dos::Workload w = workload({10007, 777, 20000}, false);
  const dos::Rates r{1.5e9, 1e9, 1e12, 1e12, 1e10, 1e10};
  const std::vector<PlanSide> cpu3(3, PlanSide::cpu);
  const dos::Simulation s = dos::simulate_phase(w, cpu3, r, e);
  const double want = (10007.0 + 777.0 + 16384.0) / 1e8;
  assert_float_equal(s.total, want, 1e-12 * want);
  assert_float_equal(s.cpu, want, 1e-12 * want);
  // without the limit: at the team's rate
  const dos::Simulation flat = dos::simulate_phase(w, cpu3, r, none);
  assert_float_equal(flat.total, (10007.0 + 777.0 + 20000.0) / 1.5e9, 1e-12);

  // subgroups of at least T x W elements: the same simulation to the bit as without the limit, on a
  // mixed plan with the caller on the GPU
  const dos::Workload big = workload({300000, 245760, 1000000, 400000}, true);
  const dos::Rates rb{4e9, 3e9, 1e11, 4e11, 4.5e10, 5e10, 0.8};
  const std::vector<PlanSide> mixed{PlanSide::cpu, PlanSide::gpu_streamed, PlanSide::cpu, PlanSide::cpu};
  const dos::Simulation a = dos::simulate_phase(big, mixed, rb, e), b = dos::simulate_phase(big, mixed, rb, none);
  assert_true(a.total == b.total && a.cpu == b.cpu && a.h2d == b.h2d && a.d2h == b.d2h && a.gpu == b.gpu);
  assert_true(a.cpu_beside_dma == b.cpu_beside_dma && a.stream_end == b.stream_end);

  // the pieces after the stream's end count a small subgroup's parameters at the team's rate: the
  // caller in host memory, a subgroup of 1e6 on the CPU (1 ms at 1e9/s, the team's rate), then one of
  // 10007 (on one thread: 15 x 10007 / 1e9 s), and a streamed one of 1000 whose state is home within
  // microseconds: the second CPU piece begins after the stream's end and counts 15 x 10007
  const dos::Workload late = workload({1000000, 10007, 1000}, false);
  const dos::Rates rl{1e9, 1e9, 1e12, 1e12, 1e10, 1e10};
  const dos::Simulation sl =
      dos::simulate_phase(late, {PlanSide::cpu, PlanSide::cpu, PlanSide::gpu_streamed}, rl, e);
  assert_true(sl.stream_end > 0 && sl.stream_end < 1e-3);
  assert_float_equal(sl.cpu_after_stream, 15 * 10007.0 / 1e9, 1e-15);
  assert_float_equal(sl.cpu_after_stream_params, 15 * 10007.0, 1e-6);
  assert_float_equal(sl.total, 1e-3 + 15 * 10007.0 / 1e9, 1e-12);

  // the tiny preset's shape on a GPU machine's rates (55 subgroups of 10007, the caller on the GPU):
  // at the team's rate the search keeps subgroups on the CPU; with one thread per subgroup's item the
  // CPU side takes 55 x 10007 / (5.04e9 / 15) s, and every subgroup is streamed
  const dos::Workload tiny = workload(std::vector<std::size_t>(55, 10007), true);
  const dos::Rates rt{5.04e9, 4.22e9, 1.004e11, 4.061e11, 4.75e10, 5.13e10, 0.84};
  dos::Execution gpu_machine;
  gpu_machine.cpu_team_threads = 15;
  gpu_machine.cpu_work_item = 16384;
  const dos::Choice flat_choice = dos::choose_plan_simulated(tiny, rt, dos::Execution{});
  const dos::Choice team_choice = dos::choose_plan_simulated(tiny, rt, gpu_machine);
  assert_true(flat_choice.streamed < 55);
  assert_int_equal(team_choice.streamed, 55);
  const dos::Simulation all_cpu = dos::simulate_phase(tiny, std::vector<PlanSide>(55, PlanSide::cpu), rt, gpu_machine);
  assert_true(all_cpu.cpu >= 55 * 10007.0 / (5.04e9 / 15) * (1 - 1e-12));
}

// The simulated search takes the paper's strides as candidates too: the 7B 1/16 shard's five
// subgroups (four of 1e8 and one of 2.115e7) at the rates a GPU machine had, where the stride 2
// (cscsc) streams two whole subgroups and the spread plans of 2 and 3 streamed (ccscs, cscss) stream
// the short last one: the choice is the least simulated time over every spread plan and every
// stride 2..5 (the brute force here), which on these rates is the stride 2.
void test_search_strides(void**) {
  dos::Workload w = workload({100000000, 100000000, 100000000, 100000000, 21150976}, true);
  w.cpu_grads_staged_on_gpu = w.cpu_params_staged_on_gpu = false;
  dos::Rates r{3.70e9, 3.69e9, 137.1e9, 510e9, 52.0e9, 50.8e9};
  dos::Execution e;
  e.own_param_upload = e.own_grad_download = true;
  double best = dos::simulate_phase(w, dos::spread_plan(5, 0), r, e).total;
  std::vector<PlanSide> best_plan = dos::spread_plan(5, 0);
  auto take = [&](const std::vector<PlanSide>& p) {
    const double t = dos::simulate_phase(w, p, r, e).total;
    if (t < best) best = t, best_plan = p;
  };
  double best_spread = best;
  for (std::size_t m = 1; m <= 5; ++m) {
    take(dos::spread_plan(5, m));
    best_spread = std::min(best_spread, dos::simulate_phase(w, dos::spread_plan(5, m), r, e).total);
  }
  for (std::size_t k = 2; k <= 5; ++k) take(dos::stride_plan(5, k));
  const dos::Choice c = dos::choose_plan_simulated(w, r, e);
  std::printf("  7B 1/16: best spread plan %.4f s, choice %zu streamed %.4f s\n", best_spread, c.streamed, c.predicted.total);
  assert_float_equal(c.predicted.total, best, 1e-12);
  assert_true(c.plan == best_plan);
  assert_true(c.plan == dos::stride_plan(5, 2));
  assert_true(c.predicted.total < 0.95 * best_spread);
}

// Many subgroups: the plan search's grid and golden-section steps find the plan that trying every
// streamed count finds (here by brute force over every m, each simulated).
void test_search_many(void**) {
  dos::Workload w = workload(std::vector<std::size_t>(301, 10000000), true);
  w.sizes.back() = 1234567;
  for (double share : {1.0, 0.7}) {
    const dos::Rates r{4e9, 4e9 * share, 1.3e11, 5e11, 5e10, 5e10};
    double best = 0;
    std::size_t best_m = 0;
    for (std::size_t m = 0; m <= 301; ++m) {
      const double t = dos::simulate_phase(w, dos::spread_plan(301, m), r, dos::Execution{}).total;
      if (m == 0 || t < best) best = t, best_m = m;
    }
    const dos::Choice c = dos::choose_plan_simulated(w, r, dos::Execution{});
    std::printf("  301 subgroups, U_c_dma/U_c %.1f: brute force %zu streamed (%.4f s), search %zu (%.4f s)\n", share,
                best_m, best, c.streamed, c.predicted.total);
    assert_true(c.predicted.total <= best * (1 + 1e-3));
  }
}

// The CPU Adam pieces that began after the streaming ended (Simulation::cpu_after_stream). Caller in
// host memory, so the CPU subgroups move nothing over PCIe and wait for nothing: the CPU runs
// subgroup 1 from 0 to n1 / U_c and subgroup 2 after it; the streamed subgroup 0 moves (12 + 2) n0
// up, is updated in n0 / U_g and moves (12 + 2) n0 down. With U_c_dma = U_c host memory never
// slows anything (M is the full demand), so each time is its resource's own.
void test_cpu_after_stream(void**) {
  const double n0 = 1e8, B = 5e10, U_g = 1e11, U_c = 1e9;
  const dos::Rates r{U_c, U_c, U_g, 4e11, B, B};
  const double stream_end = 14 * n0 / B + n0 / U_g + 14 * n0 / B;  // 0.057 s
  const std::vector<PlanSide> plan = {PlanSide::gpu_streamed, PlanSide::cpu, PlanSide::cpu};
  {  // subgroup 1 ends after the streaming: subgroup 2 begins after it, and alone counts
    const double n1 = 1e8, n2 = 3e7;  // n1 / U_c = 0.1 s > stream_end
    const dos::Simulation s =
        dos::simulate_phase(workload({std::size_t(n0), std::size_t(n1), std::size_t(n2)}, false), plan, r, dos::Execution{});
    assert_float_equal(s.stream_end, stream_end, 1e-12);
    assert_float_equal(s.cpu_after_stream_params, n2, 0.0);
    assert_float_equal(s.cpu_after_stream, n2 / U_c, 1e-12);
    assert_float_equal(s.total, (n1 + n2) / U_c, 1e-12);
  }
  {  // both CPU pieces begin before the streaming ends: nothing counts
    const double n1 = 2e7, n2 = 2e7;  // subgroup 2 begins at 0.02 s < stream_end
    const dos::Simulation s =
        dos::simulate_phase(workload({std::size_t(n0), std::size_t(n1), std::size_t(n2)}, false), plan, r, dos::Execution{});
    assert_float_equal(s.cpu_after_stream_params, 0.0, 0.0);
    assert_float_equal(s.cpu_after_stream, 0.0, 0.0);
  }
  {  // a piece that begins exactly when the streaming ends counts (the runtime's >= as well): one
     // parameter streamed, 14 B each way at 14 B/s and 1 s of GPU Adam, so the state is home at 3;
     // the CPU's first piece takes [0, 3], the second [3, 4]
    const dos::Simulation s = dos::simulate_phase(workload({1, 3, 1}, false), plan, dos::Rates{1, 1, 1, 1, 14, 14},
                                                  dos::Execution{});
    ASSERT_NEAR(s.stream_end, 3.0, 1e-12);
    ASSERT_NEAR(s.cpu_after_stream, 1.0, 1e-12);
    ASSERT_NEAR(s.cpu_after_stream_params, 1.0, 0.0);
  }
  {  // two CPU workers: subgroups 1 and 3 on one, 2 and 4 on the other (i % 2): 1 in [0, 3], 2 in
     // [0, 4], 3 in [3, 5], 4 in [4, 5]; the streaming ends at 3, so 3 (2 parameters, 2 s) and 4
     // (1 parameter, 1 s) count
    dos::Execution two;
    two.cpu_workers = 2;
    const dos::Simulation s =
        dos::simulate_phase(workload({1, 3, 4, 2, 1}, false),
                            {PlanSide::gpu_streamed, PlanSide::cpu, PlanSide::cpu, PlanSide::cpu, PlanSide::cpu},
                            dos::Rates{1, 1, 1, 1, 14, 14}, two);
    ASSERT_NEAR(s.stream_end, 3.0, 1e-12);
    ASSERT_NEAR(s.cpu_after_stream, 3.0, 1e-12);
    ASSERT_NEAR(s.cpu_after_stream_params, 3.0, 0.0);
  }
  {  // nothing streamed: nothing counts
    const dos::Simulation s = dos::simulate_phase(workload({1000, 2000}, false), {PlanSide::cpu, PlanSide::cpu}, r,
                                                  dos::Execution{});
    assert_float_equal(s.cpu_after_stream_params, 0.0, 0.0);
  }
}

void test_bad_input(void**) {
  const dos::Workload w = workload({10, 10}, true);
  bool threw = false;
  try {
    dos::simulate_phase(w, {PlanSide::cpu}, dos::Rates{1, 1, 1, 1, 1, 1}, dos::Execution{});
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  assert_true(threw);
  threw = false;
  try {
    dos::simulate_phase(w, {PlanSide::cpu, PlanSide::cpu}, dos::Rates{1, 0, 1, 1, 1, 1}, dos::Execution{});
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  assert_true(threw);
  threw = false;
  dos::Execution flags;
  flags.state_off_gpu = {true};  // one flag for two subgroups
  try {
    dos::simulate_phase(w, {PlanSide::gpu_resident, PlanSide::gpu_resident}, dos::Rates{1, 1, 1, 1, 1, 1}, flags);
  } catch (const std::invalid_argument& e) {
    threw = true;
    std::printf("  %s\n", e.what());
  }
  assert_true(threw);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_only),   cmocka_unit_test(test_one_streamed),       cmocka_unit_test(test_two_streamed),
      cmocka_unit_test(test_host_memory_shared), cmocka_unit_test(test_order),       cmocka_unit_test(test_budget),
      cmocka_unit_test(test_choice_and_bound),   cmocka_unit_test(test_search_many), cmocka_unit_test(test_search_strides),
      cmocka_unit_test(test_cpu_workers),        cmocka_unit_test(test_cpu_team_share),
      cmocka_unit_test(test_cpu_after_stream),   cmocka_unit_test(test_bad_input), cmocka_unit_test(test_busiest_resource),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
