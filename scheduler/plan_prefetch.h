// A plan's decision made ahead of the phase that uses it. A plan whose decide() is costly (the
// `dos` plan's search over simulated phases: about 80 simulations, 150-200 ns per subgroup each)
// would otherwise decide at the start of every update phase, on the phase's critical path. With
// PlanNeeds::decided_ahead the runtime starts the next phase's decision on a thread of its own as
// soon as a phase has ended (its rates refined), and takes it when the next phase begins if that
// phase's input is equal to the one the decision was made from; otherwise it decides then, as
// without. The sides a phase runs are therefore exactly those decide() gives for that phase's
// input, decided ahead or not: only when the work is done changes.
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "plan.h"

namespace dos {

/// Whether two plan inputs are equal in everything a plan may read: the workload (sizes, where
/// the caller's buffers live, bytes per element, resident, may_stream, staging flags, the master's form), the rates
/// (both null, or every rate bit for bit equal) and the execution (order, lookahead, update budget,
/// CPU workers, their teams' threads and work item, the copy flags, state_off_gpu, params_on_host).
/// Throws nothing.
bool same_plan_input(const Workload& wa, const Rates* ra, const Execution& ea, const Workload& wb, const Rates* rb,
                     const Execution& eb) noexcept;

/// One plan decision, made ahead on a thread of its own (start) or recorded after being made
/// at the phase's start (remember), and handed out for an equal input (take). Not thread-safe:
/// one optimizer's calls, one at a time (its step's own thread). The destructor waits for a
/// decision still running.
class PlanPrefetch {
 public:
  PlanPrefetch() = default;
  PlanPrefetch(const PlanPrefetch&) = delete;
  PlanPrefetch& operator=(const PlanPrefetch&) = delete;
  ~PlanPrefetch();

  /// Starts plan->decide on a new thread with copies of the input (the workload, the rates when
  /// given, the execution); replaces what was held (waiting for a decision still running). Does
  /// nothing when a decision for this plan and an equal input is held already. When the thread
  /// cannot be created (std::system_error) nothing is held and the next take() returns
  /// std::nullopt. Throws std::invalid_argument when plan is null, std::bad_alloc when the copies
  /// cannot be made.
  void start(std::shared_ptr<const Plan> plan, const Workload& w, const Rates* rates, const Execution& e);

  /// Records `sides`, decided now by `plan` for this input, so that an equal input later gets them
  /// without deciding again; replaces what was held (waiting for a decision still running).
  /// Throws std::bad_alloc when the copies cannot be made (nothing is held then).
  void remember(std::shared_ptr<const Plan> plan, const Workload& w, const Rates* rates, const Execution& e,
                std::vector<PlanSide> sides);

  /// The sides held for exactly this plan and input (same plan object, same_plan_input), waiting
  /// for the decision when it is still running, or std::nullopt when none is held for them. A
  /// decision held stays held (an equal input takes it again). A decision that threw is dropped
  /// and gives std::nullopt: the caller decides then, and a decide() that fails again throws its
  /// own error there, as is one whose sides could not be copied (out of memory). Throws nothing.
  std::optional<std::vector<PlanSide>> take(const Plan* plan, const Workload& w, const Rates* rates,
                                            const Execution& e);

  /// Whether a decision is held (started or remembered) for this plan and an equal input, whether
  /// or not it has finished. Throws nothing.
  bool holds(const Plan* plan, const Workload& w, const Rates* rates, const Execution& e) const noexcept;

  /// Drops what is held (waiting for a decision still running). Throws nothing.
  void clear() noexcept;

 private:
  /// Holds `result` as the decision for this plan and input (moves only: throws nothing).
  void hold(std::shared_ptr<const Plan> plan, Workload w, std::optional<Rates> rates, Execution e,
            std::shared_future<std::vector<PlanSide>> result) noexcept;

  std::shared_ptr<const Plan> plan_;  // keeps the plan alive: its thread reads it, take() compares it
  Workload workload_;
  std::optional<Rates> rates_;
  Execution execution_;
  std::shared_future<std::vector<PlanSide>> result_;
};

}  // namespace dos
