// The placement policy (contract in policy.h), the registered StarPU policies and the
// policy-by-name lookup.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <stdexcept>

#include "policy.h"

namespace dos {
namespace {

bool side_matches(unsigned worker, Side side) {
  if (side == Side::any) return true;
  const enum starpu_worker_archtype t = starpu_worker_get_type(int(worker));
  return side == Side::gpu ? t == STARPU_CUDA_WORKER : t == STARPU_CPU_WORKER;
}

int placement_push_task(struct starpu_task* task) {
  const auto* hint = static_cast<const TaskHint*>(task->sched_data);
  const Side side = hint ? hint->side : Side::any;
  const unsigned sg = hint ? hint->subgroup : 0;
  unsigned candidates[STARPU_NMAXWORKERS];
  unsigned ncand = 0;
  const unsigned nworkers = starpu_worker_get_count();
  for (unsigned w = 0; w < nworkers; ++w) {
    unsigned impl;
    if (side_matches(w, side) && starpu_worker_can_execute_task_first_impl(w, task, &impl)) candidates[ncand++] = w;
  }
  if (ncand == 0 && side != Side::any) {
    // The runtime plans only sides that have workers; should a hint name a side without one, run the
    // task on any worker able to (CPU and CUDA Adam give the same bits) rather than lose it: StarPU
    // does not recover from a push_task that refuses a task, and would wait for it for ever.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "dos-placement: warning: no %s worker for task '%s': running it where it can run\n",
                   side == Side::gpu ? "CUDA" : "CPU", task->cl && task->cl->name ? task->cl->name : "?");
    for (unsigned w = 0; w < nworkers; ++w) {
      unsigned impl;
      if (starpu_worker_can_execute_task_first_impl(w, task, &impl)) candidates[ncand++] = w;
    }
  }
  if (ncand == 0) {
    std::fprintf(stderr, "dos-placement: no worker can run task '%s'\n", task->cl && task->cl->name ? task->cl->name : "?");
    return -ENODEV;
  }
  const unsigned w = candidates[sg % ncand];
  if (starpu_get_prefetch_flag() && (!hint || hint->prefetch)) starpu_prefetch_task_input_for(task, w);
  return starpu_push_local_task(int(w), task, hint && hint->urgent ? 1 : 0);
}

void placement_init(unsigned) {}
void placement_deinit(unsigned) {}

}  // namespace

struct starpu_sched_policy placement_policy = [] {
  struct starpu_sched_policy p = {};
  p.init_sched = placement_init;
  p.deinit_sched = placement_deinit;
  p.push_task = placement_push_task;
  p.pop_task = nullptr;
  p.policy_name = "dos-placement";
  p.policy_description = "Deep Optimizer States: each task on the side its plan names";
  p.worker_type = STARPU_WORKER_LIST;
  return p;
}();

std::vector<std::string> builtin_policy_names() {
  std::vector<std::string> names;
  for (struct starpu_sched_policy** p = starpu_sched_get_predefined_policies(); p && *p; ++p)
    names.emplace_back((*p)->policy_name);
  return names;
}

// The StarPU policies of scheduler/meson.build's `starpu_policies` list (generated:
// starpu_policy_list.cpp).
struct starpu_sched_policy* const* built_in_starpu_policies(std::size_t* count);

namespace {
std::vector<struct starpu_sched_policy*>& starpu_registry() {
  static std::vector<struct starpu_sched_policy*> r = [] {
    std::size_t n = 0;
    struct starpu_sched_policy* const* list = built_in_starpu_policies(&n);
    return std::vector<struct starpu_sched_policy*>(list, list + n);
  }();
  return r;
}
}  // namespace

const std::vector<struct starpu_sched_policy*>& registered_starpu_policies() { return starpu_registry(); }

void register_starpu_policy(struct starpu_sched_policy* policy) {
  if (!policy || !policy->policy_name || !*policy->policy_name)
    throw std::invalid_argument("register_starpu_policy: the policy needs a policy_name");
  const std::string name = policy->policy_name;
  if (!policy->push_task) throw std::invalid_argument("register_starpu_policy: policy '" + name + "' has no push_task");
  bool taken = make_plan_by_name(name) != nullptr;
  for (struct starpu_sched_policy* p : starpu_registry()) taken = taken || name == p->policy_name;
  for (const std::string& b : builtin_policy_names()) taken = taken || name == b;
  if (taken) throw std::invalid_argument("register_starpu_policy: the name '" + name + "' is already taken");
  starpu_registry().push_back(policy);
}

std::string policy_name_clash() {
  const std::vector<std::string> builtins = builtin_policy_names();
  auto builtin = [&](const std::string& n) { return std::find(builtins.begin(), builtins.end(), n) != builtins.end(); };
  std::vector<std::string> plans;
  for (const PlanEntry& e : plan_registry()) {
    const std::string n = e.name;
    if (std::find(plans.begin(), plans.end(), n) != plans.end())
      return "two plans are named '" + n + "' (scheduler/meson.build's plans list, or register_plan): rename one";
    if (builtin(n) || n == placement_policy.policy_name)
      return "the plan '" + n + "' has the name of one of StarPU's policies, which --policy " + n +
             " would then not reach: rename the plan (its PlanEntry's name)";
    plans.push_back(n);
  }
  std::vector<std::string> seen;
  for (struct starpu_sched_policy* p : starpu_registry()) {
    const std::string n = p->policy_name ? p->policy_name : "";
    if (n.empty()) return "a registered StarPU policy has no policy_name: give it one";
    if (std::find(seen.begin(), seen.end(), n) != seen.end())
      return "two registered StarPU policies are named '" + n + "': rename one (its policy_name)";
    if (builtin(n) || n == placement_policy.policy_name)
      return "the registered StarPU policy '" + n + "' has the name of one of StarPU's own, which it would replace "
             "under --policy " + n + ": rename it (its policy_name)";
    if (std::find(plans.begin(), plans.end(), n) != plans.end())
      return "the registered StarPU policy '" + n + "' has the name of a plan, which --policy " + n +
             " names first: rename one";
    seen.push_back(n);
  }
  return "";
}

PolicyChoice parse_policy(const std::string& name) {
  if (const std::string clash = policy_name_clash(); !clash.empty())
    throw std::invalid_argument("the policies' names clash: " + clash);
  PolicyChoice c;
  c.name = name;
  if ((c.plan = make_plan_by_name(name))) return c;
  for (struct starpu_sched_policy* p : starpu_registry())
    if (name == p->policy_name) {
      c.starpu_policy = p;
      return c;
    }
  const std::vector<std::string> builtins = builtin_policy_names();
  for (const std::string& b : builtins)
    if (b == name) return c;
  std::string others;
  for (struct starpu_sched_policy* p : starpu_registry()) others += (others.empty() ? "" : ", ") + std::string(p->policy_name);
  std::string list;
  for (const std::string& b : builtins) list += (list.empty() ? "" : ", ") + b;
  throw std::invalid_argument("unknown policy '" + name + "': choose a plan (" + plan_usages() + ")" +
                              (others.empty() ? std::string() : ", a registered StarPU policy (" + others + ")") +
                              " or one of StarPU's policies (" + list + ")");
}

}  // namespace dos
