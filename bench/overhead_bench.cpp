// dos-bench overhead: what the runtime costs per task and per subgroup when the kernels cost next
// to nothing (tiny subgroups), beside an empty StarPU task measured in the same StarPU instance.
// "Above empty" is the runtime's own share: its task graph, data handles, transfers of a few KB,
// callbacks and write-back acquires, over what StarPU needs to run any task at all.
#include "overhead_bench.h"

#include <starpu.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_stats.h"
#include "dos.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace dos_bench {
namespace {

using Clock = std::chrono::steady_clock;

void empty_func(void*[], void*) {}

/// An empty codelet: no buffers, a function that returns at once on either kind of worker.
struct starpu_codelet make_empty_codelet() {
  struct starpu_codelet cl = {};
  cl.name = "dos_bench_empty";
  cl.cpu_funcs[0] = empty_func;
  cl.cuda_funcs[0] = empty_func;
  cl.nbuffers = 0;
  return cl;
}

struct EmptyCost {
  double batch_us = 0;       // per task, all submitted then waited for
  double round_trip_us = 0;  // per task, each submitted and waited for
};

/// Microseconds per empty task on a worker of `where` (STARPU_CPU or STARPU_CUDA).
EmptyCost empty_task_cost(struct starpu_codelet* cl, uint32_t where, int n) {
  auto submit_one = [&](bool sync) {
    struct starpu_task* t = starpu_task_create();
    t->cl = cl;
    t->where = where;
    t->synchronous = sync ? 1 : 0;
    const int ret = starpu_task_submit(t);
    if (ret != 0) throw dos::Error("StarPU refused an empty task (error " + std::to_string(ret) + ")");
  };
  for (int i = 0; i < 50; ++i) submit_one(false);  // warm-up
  starpu_task_wait_for_all();
  EmptyCost c;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) submit_one(false);
  starpu_task_wait_for_all();
  c.batch_us = 1e6 * std::chrono::duration<double>(Clock::now() - t0).count() / n;
  const int m = std::max(1, n / 4);
  t0 = Clock::now();
  for (int i = 0; i < m; ++i) submit_one(true);
  c.round_trip_us = 1e6 * std::chrono::duration<double>(Clock::now() - t0).count() / m;
  return c;
}

struct PhaseCost {
  std::string label, side;
  double seconds = 0;  // median update phase
  std::size_t tasks = 0;
};

}  // namespace

int run_overhead(const OverheadOptions& o) {
  if (o.subgroup_size < 1 || o.subgroups < 1 || o.subgroups > 100000 || o.phases < 1 || o.empty_tasks < 1 ||
      o.subgroup_size > (std::size_t(1) << 30) / o.subgroups) {
    std::fprintf(stderr, "dos-bench overhead: --subgroup-size and --subgroups must be >= 1 (subgroups <= 1e5, their "
                         "product <= 2^30), --reps and --empty-tasks >= 1\n");
    return 1;
  }
  dos::RuntimeOptions ro;
  ro.policy = "dos";
  ro.verbose = false;
  dos::Runtime rt(ro);
  const bool gpu = rt.cuda_workers() > 0;
  struct starpu_codelet empty = make_empty_codelet();
  const EmptyCost empty_cpu = empty_task_cost(&empty, STARPU_CPU, o.empty_tasks);
  EmptyCost empty_cuda;
  if (gpu) empty_cuda = empty_task_cost(&empty, STARPU_CUDA, o.empty_tasks);

  const std::size_t n = o.subgroup_size * o.subgroups;
  void *params = nullptr, *grads = nullptr;
  std::vector<std::uint16_t> host_params, host_grads;
  dos::MemoryKind memory = dos::MemoryKind::host;
#if defined(DOS_HAVE_CUDA)
  if (gpu) {
    if (cudaMalloc(&params, n * 2) != cudaSuccess || cudaMalloc(&grads, n * 2) != cudaSuccess ||
        cudaMemset(params, 0, n * 2) != cudaSuccess || cudaMemset(grads, 0, n * 2) != cudaSuccess) {
      std::fprintf(stderr, "dos-bench overhead: cannot allocate %zu bf16 parameters and gradients on the GPU\n", n);
      return 1;
    }
    memory = dos::MemoryKind::cuda;
  }
#endif
  if (memory == dos::MemoryKind::host) {
    host_params.assign(n, 0);
    host_grads.assign(n, 0);
    params = host_params.data();
    grads = host_grads.data();
  }
  std::vector<PhaseCost> phases;
  struct Placement {
    const char* label;
    const char* side;
    double fraction;
  };
  std::vector<Placement> placements = {{"every subgroup on the CPU", "cpu", 0.0}};
  if (gpu) placements.push_back({"every subgroup streamed", "cuda", 1.0});
  for (const Placement& p : placements) {
    dos::OptimizerOptions oo;
    oo.subgroup_size = o.subgroup_size;
    oo.dtype = dos::DType::bf16;
    oo.memory = memory;
    oo.verbose = false;
    // no calibration: the plan is forced, and the rates only feed the prediction
    oo.rates = dos::Rates{1e9, 1e9, 1e11, 1e11, 5e10, 5e10};
    dos::Optimizer opt(rt, {{params, grads, n}}, oo);
    opt.set_plan_override(dos::PlanOverride{dos::PlanOverride::fraction, p.fraction});
    std::vector<double> secs;
    std::size_t tasks = 0;
    for (int i = 0; i < o.phases + 2; ++i) {
      const dos::StepStats st = opt.step();
      if (i < 2) continue;  // the first phases allocate device buffers and warm the caches
      secs.push_back(st.seconds);
      // tasks per subgroup: one Adam on the direct path (caller's buffers and update on the GPU),
      // else a gradient gather, an Adam and a parameter scatter; on the CPU with the caller's buffers
      // on the GPU the runtime copies the parameters itself (dos::runtime_uploads_params): no scatter
      // task, its upload counted as one piece of work
      tasks = st.subgroups_gpu * (memory == dos::MemoryKind::cuda ? 1 : 3) + st.subgroups_cpu * 3;
    }
    phases.push_back({p.label, p.side, median(secs), tasks});
  }
#if defined(DOS_HAVE_CUDA)
  if (memory == dos::MemoryKind::cuda) {
    cudaFree(params);
    cudaFree(grads);
  }
#endif
  if (o.json) {
    nlohmann::ordered_json j = {{"subgroup_size", o.subgroup_size}, {"subgroups", o.subgroups},
                                {"caller_memory", memory == dos::MemoryKind::cuda ? "cuda" : "host"},
                                {"empty_task_us", {{"cpu", {{"batch", empty_cpu.batch_us},
                                                            {"round_trip", empty_cpu.round_trip_us}}}}},
                                {"phases", nlohmann::ordered_json::array()}};
    if (gpu)
      j["empty_task_us"]["cuda"] = {{"batch", empty_cuda.batch_us}, {"round_trip", empty_cuda.round_trip_us}};
    for (const PhaseCost& p : phases) {
      const double per_task = 1e6 * p.seconds / double(p.tasks);
      j["phases"].push_back({{"placement", p.label}, {"update_seconds_median", p.seconds}, {"tasks", p.tasks},
                             {"us_per_subgroup", 1e6 * p.seconds / double(o.subgroups)}, {"us_per_task", per_task},
                             {"us_per_task_above_empty",
                              per_task - (p.side == std::string("cuda") ? empty_cuda : empty_cpu).batch_us}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("dos-bench overhead: %zu subgroups of %zu bf16 parameters (caller's buffers in %s memory), median of "
              "%d phases; empty task: %d submitted then waited for (batch), or each waited for (round trip)\n",
              o.subgroups, o.subgroup_size, memory == dos::MemoryKind::cuda ? "GPU" : "host", o.phases, o.empty_tasks);
  std::printf("%-36s %12s %7s %12s %10s %14s\n", "what", "phase s", "tasks", "us/subgroup", "us/task", "above empty us");
  std::printf("%-36s %12s %7d %12s %10.1f %14s\n", "empty StarPU task, CPU worker (batch)", "-", o.empty_tasks, "-",
              empty_cpu.batch_us, "0");
  std::printf("%-36s %12s %7d %12s %10.1f %14s\n", "empty StarPU task, CPU worker (trip)", "-", std::max(1, o.empty_tasks / 4), "-",
              empty_cpu.round_trip_us, "-");
  if (gpu) {
    std::printf("%-36s %12s %7d %12s %10.1f %14s\n", "empty StarPU task, CUDA worker (batch)", "-", o.empty_tasks, "-",
                empty_cuda.batch_us, "0");
    std::printf("%-36s %12s %7d %12s %10.1f %14s\n", "empty StarPU task, CUDA worker (trip)", "-", std::max(1, o.empty_tasks / 4),
                "-", empty_cuda.round_trip_us, "-");
  }
  for (const PhaseCost& p : phases) {
    const double per_task = 1e6 * p.seconds / double(p.tasks);
    const double empty_us = (p.side == std::string("cuda") ? empty_cuda : empty_cpu).batch_us;
    std::printf("%-36s %12.6f %7zu %12.1f %10.1f %14.1f\n", p.label.c_str(), p.seconds, p.tasks,
                1e6 * p.seconds / double(o.subgroups), per_task, per_task - empty_us);
  }
  return 0;
}

}  // namespace dos_bench
