// Plans: for one update phase, which subgroups are updated on the CPU, which are streamed through
// the GPU and which keep their state resident there. A plan decides; the runtime carries the
// decision out (it submits every subgroup's tasks with a TaskHint naming the side, policy.h) and the
// placement policy puts each task where its hint says.
//
// A plan is a class derived from Plan, in a file of its own under scheduler/plans/, which defines
// one PlanEntry (its --policy name, a line of help and a factory). The file's stem in the `plans`
// list of scheduler/meson.build registers it: the build generates the registry from that list, so a
// new plan is its file plus one word in that list, and nothing in runtime/ changes.
// docs/writing-a-policy.md walks through the `greedy` plan as an example.
//
// Everything here is pure: no StarPU, no clocks. A plan can be asked for its decision without a
// GPU (dos-train --plan-only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phase_sim.h"
#include "resource_model.h"

namespace dos {

/// How the GPU resident state of a plan is chosen.
/// budget: the runtime keeps the last subgroups whose state fits the GPU resident budget resident
///   (Workload::resident, from resident_subgroups) and the plan decides about the others (it should
///   put the last Workload::resident subgroups on PlanSide::gpu_resident, or leave the budget unused);
/// own: the plan chooses its resident subgroups itself (Workload::resident is 0) and Plan::validate
///   checks that they fit the budget.
enum class ResidentState { budget, own };

/// What a plan needs from the runtime, declared once.
/// rates: calibrated Rates (resource_model.h): measured at start-up (or read from the calibration
///   cache, or given in OptimizerOptions::rates) when there is a CUDA worker; such a plan also gets
///   a predicted time and the lower bound per phase, and accepts the forced plans of
///   Optimizer::set_plan_override (--k, --gpu-fraction);
/// refine: the rates refined after every phase from what the phase measured (only with rates);
/// resident: ResidentState;
/// cuda_worker: the plan cannot run without a CUDA worker (the runtime refuses to start without one);
/// decided_ahead: decide() is a function of its PlanInput alone (equal inputs give equal sides) and
///   may run on a thread of the runtime's own beside the caller's: the runtime then decides the next
///   phase's plan as soon as a phase has ended and its rates are refined, while the caller computes
///   the next gradients, and uses that decision when the next phase's input is equal to the one it
///   was made from (PlanPrefetch, plan_prefetch.h). decide() must then be safe to run beside
///   itself (several optimizers, and the thread of each, may call one plan object at once). For
///   plans whose decide() is costly (a search over simulated phases); false: decide() runs when
///   each phase begins.
/// Without a CUDA worker the runtime does not ask any plan: every update runs on the CPU.
struct PlanNeeds {
  bool rates = false;
  bool refine = false;
  ResidentState resident = ResidentState::budget;
  bool cuda_worker = false;
  bool decided_ahead = false;
};

/// What a plan is given to decide one phase.
/// workload: subgroup sizes (elements), where the caller's buffers live, the bytes per element,
///   Workload::resident (ResidentState::budget) and Workload::may_stream (false: the GPU update
///   budget cannot hold one streamed subgroup, so nothing may be streamed);
/// rates: the rates to plan with (params/s and bytes/s, all > 0), or null when the plan did not ask
///   for them (PlanNeeds::rates) or there are none;
/// execution: how the runtime carries the plan out (submission order, lookahead, update budget, and
///   which subgroups' state is not on the GPU yet: Execution::state_off_gpu), for plans that
///   simulate the phase (simulate_phase, phase_sim.h).
struct PlanInput {
  const Workload& workload;
  const Rates* rates = nullptr;
  Execution execution;
};

/// The GPU budgets of an optimizer, bytes. resident: optimizer state (12 B/param, each of a
/// subgroup's three state slices padded to 16 elements: state_bytes_for; the compact state's
/// bytes with Workload::compact_master: subgroup_state_bytes) the GPU may keep between
/// iterations, -1 (or any negative value) when not given; update: what an update phase may hold on
/// the GPU at once, 0 for no limit (OptimizerOptions::gpu_resident_budget, gpu_update_budget).
struct GpuBudgets {
  std::int64_t resident = -1;
  std::size_t update = 0;
};

/// A plan (see the top of this file). Implementations keep no state that changes between calls:
/// decide() may be called at any time, e.g. to preview the next phase's plan.
class Plan {
 public:
  virtual ~Plan() = default;
  /// What the plan needs from the runtime (constant for a plan object).
  virtual PlanNeeds needs() const = 0;
  /// The side of every subgroup for the next phase: exactly in.workload.sizes.size() entries.
  /// Must put nothing on PlanSide::gpu_streamed when !in.workload.may_stream. Called only when
  /// there is a CUDA worker, and with rates when needs().rates. Throws std::invalid_argument (or
  /// another std::exception) when it cannot decide; Optimizer::step() then throws dos::Error with
  /// the plan's name and message, before submitting anything.
  virtual std::vector<PlanSide> decide(const PlanInput& in) const = 0;
  /// Checks, once when an optimizer is created with a CUDA worker (its Workload complete:
  /// resident and may_stream set), that the plan can work within the GPU budgets. Throws
  /// std::invalid_argument with a message naming the plan, the figures and what to do. The
  /// default accepts everything.
  virtual void validate(const Workload& w, const GpuBudgets& budgets) const;
  /// The --policy text this plan was made from ("dos", "static:0.6").
  const std::string& name() const { return name_; }
  /// Sets the name; the registry calls it after the factory returns.
  void set_name(const std::string& name) { name_ = name; }

 private:
  std::string name_;
};

/// One registered plan. name: what --policy takes ("greedy"), or, for a plan with an argument,
/// what comes before the ':' ("static" for "static:R"); usage: how it is written in lists and help
/// ("static:R"; the same as name when it takes no argument); summary: one line saying what it does;
/// make: builds the plan from the argument (the text after "name:"; empty when the plan takes
/// none), throwing std::invalid_argument naming the bad argument and what is expected.
struct PlanEntry {
  const char* name;
  const char* usage;
  const char* summary;
  std::unique_ptr<Plan> (*make)(const std::string& argument);
  /// Whether the plan is written "name:ARGUMENT" (usage contains a ':').
  bool takes_argument() const;
};

/// Every registered plan, in registration order: those of scheduler/meson.build's `plans` list,
/// then those added with register_plan.
const std::vector<PlanEntry>& plan_registry();

/// Adds a plan at run time (a program's own plan, registered before its Runtime starts).
/// Throws std::invalid_argument when the name is empty, contains ':' or is already registered, or
/// make is null. A name of one of StarPU's policies is refused where a policy is next parsed
/// (parse_policy, policy_name_clash in policy.h: the Runtime's start, dos-train's options).
void register_plan(const PlanEntry& entry);

/// The plan --policy `text` names: "name" or "name:ARGUMENT". Returns null when no registered plan
/// has that name (it may be a StarPU policy). Throws std::invalid_argument when the plan exists but
/// the argument is wrong (missing, unexpected, or refused by the plan's factory).
std::unique_ptr<Plan> make_plan_by_name(const std::string& text);

/// The registered plans' usages, comma-separated ("cpu, gpu, dos, static:R, greedy").
std::string plan_usages();

/// What is wrong with the sides `plan` decided for workload `w` (one PlanSide per subgroup), or ""
/// when they keep the contract: as many sides as w.sizes; nothing on PlanSide::gpu_streamed when
/// !w.may_stream; for a plan whose resident state is ResidentState::budget, PlanSide::gpu_resident
/// only among the last w.resident subgroups (those the budget holds). The message names the plan
/// and the first subgroup at fault. Throws nothing.
std::string plan_contract_error(const Plan& plan, const Workload& w, const std::vector<PlanSide>& sides);

/// One letter per subgroup: 'c' CPU, 's' streamed through the GPU, 'r' resident on the GPU
/// ("ccsr"); empty for an empty plan.
std::string plan_letters(const std::vector<PlanSide>& plan);

/// Fills w.resident and w.may_stream from the GPU budgets as the runtime does with a CUDA worker,
/// then calls plan->validate(w, budgets). plan: null under a StarPU policy (no resident subgroups,
/// no validation). w.sizes, caller_on_gpu, param_bytes and grad_bytes must be set.
/// resident: resident_subgroups(sizes, budgets.resident, w.compact_master) when plan->needs().resident is budget, else 0; may_stream: false when budgets.update is not 0 and below one
/// streamed subgroup's footprint (subgroup_footprint, phase_sim.h).
/// Throws std::invalid_argument when budgets.update is not 0 and below one CPU subgroup's GPU
/// staging (the message names both figures), or when plan->validate does.
void apply_gpu_budgets(Workload& w, const Plan* plan, const GpuBudgets& budgets);

/// "12.34 GB": bytes in GB (1e9), two decimals, for messages; below 0.1 GB in MB ("3.52 MB"), and
/// below 0.1 MB in bytes ("4096 bytes"), so that small budgets do not read "0.00 GB".
std::string gb_text(double bytes);

}  // namespace dos
