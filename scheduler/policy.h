// Scheduling policies of the runtime: the policy-by-name registry and the "placement" policy
// that runs the project's own plans (cpu, gpu; the k-stride policy of issue 4 plugs in here).
//
// Contract of the placement policy (struct starpu_sched_policy placement_policy):
//  - push_task(task) is called by StarPU from the thread that submitted the task once its data
//    dependencies are satisfied, or from the worker/callback thread that released the last of them;
//    several threads may call it at once. It holds no lock of its own: it reads the task's hint
//    (task->sched_data, a `const TaskHint*` owned by the runtime and alive until the task ends),
//    picks a worker, asks StarPU to prefetch the task's inputs to that worker's memory node, and
//    queues the task on that worker with starpu_push_local_task (which takes the worker's lock and
//    calls starpu_push_task_end).
//  - A hint says which side (CPU or GPU) must run the task, and the subgroup index, which spreads
//    subgroups round-robin over the workers of that side. A task without a hint (or Side::any) goes
//    to the first worker, in worker-id order, able to run it (it honours task->where).
//  - pop_task is NULL: workers drain their local queues in order.
//  - The policy keeps no state between calls; init_sched/deinit_sched do nothing.
#pragma once

#include <starpu.h>

#include <string>
#include <vector>

namespace dos {

/// Where an update task must run.
enum class Side : int { any = 0, cpu = 1, gpu = 2 };

/// Per-task hint read by the placement policy (task->sched_data).
struct TaskHint {
  Side side;
  unsigned subgroup;
};

/// The StarPU policy that follows TaskHints (its policy_name is "dos-placement").
extern struct starpu_sched_policy placement_policy;

/// A parsed --policy value.
/// name: as given; builtin: true when StarPU's own policy of that name places the tasks
/// (dmda, eager, lws, ...), false for the project's plans run by placement_policy;
/// side: for the project's plans, where every Adam task goes (cpu or gpu).
struct PolicyChoice {
  std::string name;
  bool builtin = false;
  Side side = Side::cpu;
};

/// Parses a policy name: "cpu", "gpu", or the name of one of StarPU's built-in policies
/// (as listed by StarPU, e.g. "dmda", "dmdas", "eager", "lws", "heteroprio").
/// Throws std::invalid_argument naming the unknown policy and listing the valid ones.
PolicyChoice parse_policy(const std::string& name);

/// Names of StarPU's built-in policies in the linked StarPU, in StarPU's order.
std::vector<std::string> builtin_policy_names();

}  // namespace dos
