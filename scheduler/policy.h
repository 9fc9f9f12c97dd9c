// Scheduling policies of the runtime: the "placement" policy that runs the plans (plan.h), the
// hint contract between the runtime and a scheduling policy, and the policy-by-name registry
// (plans, StarPU policies registered here, StarPU's built-ins).
//
// The hint contract (what the runtime promises any policy that reads TaskHints):
//  - Every task the runtime submits under a plan carries task->sched_data = a `const TaskHint*`,
//    owned by the runtime, valid until the task's callback has run. Under a StarPU policy (built-in
//    or registered) sched_data stays null and the policy decides alone.
//  - side: where the plan wants the task. Side::cpu or Side::gpu on the Adam task of a subgroup
//    (the plan's PlanSide: cpu, or gpu_streamed/gpu_resident); Side::any on the gradient staging
//    and parameter write-back tasks, whose task->where already allows only the memory of the
//    caller's buffers. The runtime plans a side only when a worker of that kind exists. A
//    speculative update (Optimizer::gradients_final: codelet adam_into_cl, "dos_adam_into") is an
//    Adam task like the others: its side is the plan's, its task->where allows that side only,
//    and its hint.prefetch is true.
//  - subgroup: the subgroup index (0-based, the flat order of the caller's tensors). With several
//    workers of a side, the placement policy runs subgroup s on the (s mod m)-th of the m workers of
//    that side able to run the task, in worker-id order.
//  - Which GPU: when OptimizerOptions::stream_lookahead > 0 the runtime prefetches a streamed
//    subgroup s's state (master, exp_avg, exp_avg_sq) to the memory node of CUDA worker
//    (s mod number of CUDA workers), in worker-id order, before its Adam task is submitted (while
//    the GPU update budget has room; otherwise StarPU fetches it when the task runs), and sets that
//    task's hint.prefetch to false. A policy that runs the task on another GPU still
//    computes the same bits (StarPU moves the data again) but pays a second transfer; follow the
//    same rule to avoid it. With one GPU (one process per GPU, as dos-train's ranks run) there is
//    no choice to make.
//  - prefetch: true asks the policy to prefetch the task's inputs to the chosen worker's memory
//    when the task is pushed (starpu_prefetch_task_input_for); false: the runtime has done it.
//  - urgent: the task should run before the tasks already queued on its worker (the placement
//    policy pushes it with starpu_push_local_task(worker, task, 1)); set on the parameter
//    write-back of CPU-updated subgroups when OptimizerOptions::urgent_writeback is on.
//  - The results do not depend on where a task runs: CPU and CUDA Adam give the same bits, so a
//    policy that ignores a hint is slower at worst, never wrong. It must not refuse a task
//    (push_task returning an error): StarPU would wait for it for ever.
//
// The placement policy (struct starpu_sched_policy placement_policy) follows the hints:
//  - push_task(task) is called by StarPU from the thread that submitted the task once its data
//    dependencies are satisfied, or from the worker/callback thread that released the last of them;
//    several threads may call it at once. It holds no lock of its own: it reads the hint, picks a
//    worker as above, asks StarPU to prefetch the task's inputs to that worker's memory node
//    (unless hint.prefetch is false), and queues the task on that worker with
//    starpu_push_local_task, at the back of the queue (FIFO) or, for an urgent hint, where the
//    worker pops next (which takes the worker's lock and calls starpu_push_task_end).
//  - Should the hint's side have no worker able to run the task, it goes to any worker that can
//    (with a one-time warning), never refused. A task without a hint (or Side::any) goes to the
//    first worker, in worker-id order, able to run it (it honours task->where).
//  - pop_task is NULL: workers drain their local queues in order.
//  - The policy keeps no state between calls; init_sched/deinit_sched do nothing.
//
// A StarPU policy written the StarPU way (a struct starpu_sched_policy) joins --policy from a file
// of its own under scheduler/policies/ that defines `struct starpu_sched_policy starpu_policy_<stem>`
// and the stem in the `starpu_policies` list of scheduler/meson.build (docs/writing-a-policy.md);
// a program can also call register_starpu_policy before starting its Runtime.
#pragma once

#include <starpu.h>

#include <memory>
#include <string>
#include <vector>

#include "plan.h"

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

/// A StarPU scheduling policy registered under its policy_name, written the StarPU way (a
/// struct starpu_sched_policy with its entry points), selectable by --policy like StarPU's
/// built-ins. The runtime attaches no TaskHint to its tasks (task->sched_data stays null): it
/// places them by itself, as StarPU's built-ins do.
const std::vector<struct starpu_sched_policy*>& registered_starpu_policies();

/// Adds a StarPU policy at run time (a program's own, before its Runtime starts), selectable by its
/// policy_name. The struct must live until the Runtime is destroyed. Throws std::invalid_argument
/// when policy is null, has no policy_name or no push_task, or its name is already taken by a
/// plan, a registered policy or one of StarPU's built-ins.
void register_starpu_policy(struct starpu_sched_policy* policy);

/// A parsed --policy value. name: as given. plan: the plan it names, run by placement_policy (null
/// for a StarPU policy); starpu_policy: a registered StarPU policy (registered_starpu_policies), or
/// null for the placement policy or a StarPU built-in, which StarPU finds by name.
struct PolicyChoice {
  std::string name;
  std::shared_ptr<const Plan> plan;
  struct starpu_sched_policy* starpu_policy = nullptr;
  /// True when a StarPU policy (built-in or registered) places the tasks by itself.
  bool builtin() const { return !plan; }
};

/// What clashes among the names --policy resolves, or "" when nothing does: two plans of one name,
/// two registered StarPU policies of one name, a plan or a registered policy named as one of
/// StarPU's own policies (or "dos-placement"), a registered policy named as a plan. A clash would
/// silently run another policy than the one named (the build-time lists are not checked at
/// registration). Throws nothing.
std::string policy_name_clash();

/// Parses a policy name: a registered plan (plan.h: "cpu", "gpu", "dos", "static:R", "greedy", ...),
/// a registered StarPU policy, or the name of one of StarPU's built-in policies (as listed by
/// StarPU, e.g. "dmda", "dmdas", "eager", "lws", "heteroprio").
/// Throws std::invalid_argument for an unknown name (the message lists the plans and the StarPU
/// policies), a plan's bad argument (e.g. R outside [0, 1] in static:R), or a clash among the
/// registered names (policy_name_clash).
PolicyChoice parse_policy(const std::string& name);

/// Names of StarPU's built-in policies in the linked StarPU, in StarPU's order.
std::vector<std::string> builtin_policy_names();

}  // namespace dos
