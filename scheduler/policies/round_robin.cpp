// "round-robin": a StarPU scheduling policy written the StarPU way, the example of an outside policy
// (docs/writing-a-policy.md). Each task goes to the next worker, in turn, able to run it; it reads
// no hint (the runtime attaches none under a StarPU policy), so it knows nothing of plans and serves
// as the simplest thing to compare a plan against.
//
// Contract: push_task may be called by several threads at once; the turn is an atomic counter, so it
// takes no lock of its own. pop_task is NULL: each worker drains its local queue in order.
#include <starpu.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

namespace dos {
namespace {

std::atomic<unsigned> next_turn{0};

int round_robin_push_task(struct starpu_task* task) {
  const unsigned nworkers = starpu_worker_get_count();
  const unsigned first = next_turn.fetch_add(1);
  for (unsigned k = 0; k < nworkers; ++k) {
    const unsigned w = (first + k) % nworkers;
    unsigned impl;
    if (!starpu_worker_can_execute_task_first_impl(w, task, &impl)) continue;
    if (starpu_get_prefetch_flag()) starpu_prefetch_task_input_for(task, w);
    return starpu_push_local_task(int(w), task, 0);
  }
  // Not reached: starpu_task_submit refuses (-ENODEV) a task that no worker can run before any
  // policy sees it, and every task this policy is pushed has at least one worker above. Kept as
  // the loud end of a broken invariant rather than a push to a worker that cannot run the task.
  std::fprintf(stderr, "round-robin: no worker can run task '%s'\n", task->cl && task->cl->name ? task->cl->name : "?");
  return -ENODEV;
}

void round_robin_init(unsigned) { next_turn.store(0); }
void round_robin_deinit(unsigned) {}

}  // namespace

struct starpu_sched_policy starpu_policy_round_robin = [] {
  struct starpu_sched_policy p = {};
  p.init_sched = round_robin_init;
  p.deinit_sched = round_robin_deinit;
  p.push_task = round_robin_push_task;
  p.pop_task = nullptr;
  p.policy_name = "round-robin";
  p.policy_description = "each task on the next worker, in turn, able to run it";
  p.worker_type = STARPU_WORKER_LIST;
  return p;
}();

}  // namespace dos
