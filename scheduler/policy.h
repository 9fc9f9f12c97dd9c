// Scheduling policies of the runtime: the policy-by-name registry and the "placement" policy
// that runs the project's own plans (cpu, gpu, dos, static:R). The plans themselves come from the
// runtime and the models; this policy only puts each task where its plan says.
//
// Contract of the placement policy (struct starpu_sched_policy placement_policy):
//  - push_task(task) is called by StarPU from the thread that submitted the task once its data
//    dependencies are satisfied, or from the worker/callback thread that released the last of them;
//    several threads may call it at once. It holds no lock of its own: it reads the task's hint
//    (task->sched_data, a `const TaskHint*` owned by the runtime and alive until the task ends),
//    picks a worker, asks StarPU to prefetch the task's inputs to that worker's memory node (unless the
//    hint says the runtime does it), and
//    queues the task on that worker with starpu_push_local_task, at the back of the queue (FIFO) or,
//    for an urgent hint, where the worker pops next (which takes the worker's lock and
//    calls starpu_push_task_end).
//  - A hint says which side (CPU or GPU) must run the task, and the subgroup index, which spreads
//    subgroups round-robin over the workers of that side. Should that side have no worker able to
//    run the task, it goes to any worker that can (with a one-time warning), never refused. A task without a hint (or Side::any) goes
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

/// Per-task hint read by the placement policy (task->sched_data). prefetch: ask StarPU to fetch
/// the task's inputs to the chosen worker's memory when the task is pushed (false: the runtime
/// schedules that transfer itself, e.g. the streamed state prefetched a few subgroups ahead).
/// urgent: put the task where its worker pops first (starpu_push_local_task with back = 1)
/// instead of behind the tasks already queued (the parameter write-back of a CPU-updated subgroup,
/// which otherwise waits behind every streamed subgroup's Adam on the single CUDA worker).
struct TaskHint {
  Side side;
  unsigned subgroup;
  bool prefetch = true;
  bool urgent = false;
};

/// The StarPU policy that follows TaskHints (its policy_name is "dos-placement").
extern struct starpu_sched_policy placement_policy;

/// The policies the runtime offers. builtin: one of StarPU's own policies places the tasks with its
/// own models (dmda, eager, lws, ...). The others are the project's plans, run by placement_policy:
/// cpu: every update on the CPU (ZeRO-Offload); gpu: every update on the GPU, state streamed;
/// dos: the plan of least predicted time under the resource model (models/resource_model.h),
/// re-taken every iteration; static_ratio: DeepSpeed's ZeRO-Offload++ / TwinFlow `ratio`: a fixed
/// CPU share of the subgroups, the others updated on the GPU with their state kept there.
enum class PolicyKind { builtin, cpu, gpu, dos, static_ratio };

/// A parsed --policy value: name as given, its kind, and for static_ratio the CPU share R in [0, 1].
struct PolicyChoice {
  std::string name;
  PolicyKind kind = PolicyKind::cpu;
  double cpu_share = 1.0;
  bool builtin() const { return kind == PolicyKind::builtin; }
};

/// Parses a policy name: "cpu", "gpu", "dos", "static:R" (R, the CPU share, a number in [0, 1]), or
/// the name of one of StarPU's built-in policies (as listed by StarPU, e.g. "dmda", "dmdas",
/// "eager", "lws", "heteroprio").
/// Throws std::invalid_argument naming the unknown policy (or bad R) and listing the valid ones.
PolicyChoice parse_policy(const std::string& name);

/// Names of StarPU's built-in policies in the linked StarPU, in StarPU's order.
std::vector<std::string> builtin_policy_names();

}  // namespace dos
