// The Optimizer's plan for each update phase and the model's rates after it: the plan its policy
// decides (or decided ahead, plan_prefetch.h) or a forced one (PlanOverride), the states already off
// the GPU, the phase's simulation, and the refinement of the rates from what the phase measured
// (models/refinement.h).
#include <starpu.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "../codelets/kernels/env_choice.h"
#include "dos.h"
#include "optimizer_impl.h"

namespace dos {
using namespace detail;

std::vector<PlanSide> Optimizer::Impl::make_plan(detail::PlanDecision* decided) const {
  const std::size_t n = sgs.size();
  if (!choice.plan) return {};
  if (rt.cuda_workers() == 0) return std::vector<PlanSide>(n, PlanSide::cpu);
  if (override_.kind == PlanOverride::none) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<PlanSide> p;
    const Rates* r = have_rates ? &rates : nullptr;
    const Execution e = execution();
    const bool ahead = decides_ahead();
    // a decision held for an equal input is the one decide() gives now (plan_prefetch.h)
    std::optional<std::vector<PlanSide>> held;
    if (ahead) held = plan_ahead.take(choice.plan.get(), workload, r, e);
    if (held) {
      p = std::move(*held);
    } else {
      try {
        p = choice.plan->decide(PlanInput{workload, r, e});
      } catch (const Error&) {
        throw;
      } catch (const std::exception& ex) {
        throw Error("plan " + choice.name + ": " + ex.what());
      }
      if (ahead) {
        try {
          plan_ahead.remember(choice.plan, workload, r, e, p);
        } catch (const std::exception&) {  // (out of memory) nothing kept: the next phase decides
          plan_ahead.clear();
        }
      }
    }
    if (const std::string err = plan_contract_error(*choice.plan, workload, p); !err.empty()) throw Error(err);
    if (decided) *decided = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), held.has_value()};
    return p;
  }
  const std::size_t res = std::min(workload.resident, n), free = n - res;
  std::vector<PlanSide> p;
  if (override_.kind == PlanOverride::fraction)
    p = spread_plan(free, workload.may_stream ? std::size_t(std::llround(override_.value * double(free))) : 0);
  else
    p = workload.may_stream ? stride_plan(free, std::size_t(override_.value)) : spread_plan(free, 0);
  p.resize(n, PlanSide::gpu_resident);
  return p;
}

bool Optimizer::Impl::decides_ahead() const {
  // measurement switch: DOS_PLAN_AHEAD=off decides every plan when its phase begins (same sides)
  static const bool off = env_choice("DOS_PLAN_AHEAD", {"on", "off"}, 0, "on is used (decided ahead)") == 1;
  return !off && choice.plan && choice.plan->needs().decided_ahead;
}

void Optimizer::Impl::decide_next_plan_ahead() noexcept {
  try {
    if (!decides_ahead() || override_.kind != PlanOverride::none || rt.cuda_workers() == 0 || open) return;
    plan_ahead.start(choice.plan, workload, have_rates ? &rates : nullptr, execution());
  } catch (const std::exception&) {
    plan_ahead.clear();  // (an allocation failed) the next phase decides when it begins
  }
}

std::vector<bool> Optimizer::Impl::states_off_gpu() const {
  if (cuda_nodes.empty()) return {};
  std::vector<bool> off(sgs.size(), true);
  for (std::size_t i = 0; i < sgs.size(); ++i) {
    if (!sgs[i]->h_state) continue;
    int valid = 0;
    starpu_data_query_status(sgs[i]->h_state, int(cuda_nodes[i % cuda_nodes.size()]), nullptr, &valid, nullptr);
    off[i] = valid == 0;
  }
  return off;
}

Simulation Optimizer::Impl::simulate_plan() const {
  try {
    return simulate_phase(workload, plan, rates, execution());
  } catch (const std::logic_error&) {  // a simulation that cannot progress: the resource bound
    Simulation bound;
    bound.total = predict(workload, plan, rates).total;
    return bound;
  }
}

namespace {
/// Whether the refinement holds outlier phases (hold_outlier_phase), unless DOS_OUTLIER_PHASES=refine:
/// then every phase refines, the rule before (plans may differ, results do not). Another value
/// warns once, at the first phase that refines, and is ignored.
bool holds_outlier_phases() {
  return env_choice("DOS_OUTLIER_PHASES", {"hold", "refine"}, 0,
                    "ignored (the default, hold: a phase far off its prediction, against the last phases under "
                    "the same plan, refines nothing)") == 0;
}

/// The value of a two-way switch `name` as the environment says: `values[1]` where it says so, else
/// `values[0]` (unset, or another value: then `why` in env_choice's warning). The strings are
/// literals: the pointer returned lives as long as the process.
const char* two_way_switch(const char* name, const char* const (&values)[2], const char* why) {
  return values[env_choice(name, {values[0], values[1]}, 0, why) == 1 ? 1 : 0];
}
}  // namespace

const char* runtime_link_share_measure() {
  static const char* const measure =
      two_way_switch("DOS_LINK_SHARE_MEASURE", {"beside", "simulated"},
                     "ignored (the default, beside: link_share x the simulated seconds beside CPU Adam over the rest "
                     "of the measured stream end)");
  return measure;
}

const char* runtime_first_link_share() {
  static const char* const rule =
      two_way_switch("DOS_FIRST_LINK_SHARE", {"lower", "whole"},
                     "ignored (the default, lower: the first streamed phase's measure of link_share not taken "
                     "where it is above the calibration's value)");
  return rule;
}

bool Optimizer::Impl::refine(const PhaseMeasure& m, const Simulation& sim, bool first_streamed, double seconds) {
  if (!have_rates || !choice.plan || !choice.plan->needs().refine || rt.cuda_workers() == 0) return false;
  static const bool hold_outliers = holds_outlier_phases();
  // the plan as it ran (as bound, when the tail binding moved subgroups) against its simulation
  const double ratio = sim.total > 0 ? seconds / sim.total : std::nan("");
  const bool held = hold_outliers && !first_streamed && hold_outlier_phase(phase_errors, ratio, plan);
  phase_errors = record_phase_error(phase_errors, ratio, held, plan);
  if (held) return true;
  // the simulated measure's stream ends: the plan as run, at the rates it was made with, in the
  // phase's view (the phase is still open)
  static const bool simulated_share = std::strcmp(runtime_link_share_measure(), "simulated") == 0;
  static const bool lowers_only = std::strcmp(runtime_first_link_share(), "lower") == 0;
  const StreamEndAt stream_end_at = simulated_share ? simulated_stream_end(workload, plan, rates, execution()) : nullptr;
  // the share rule's links held to kLinkCeiling times the calibrated rates where those are a
  // calibration's (models/refinement.h)
  const Refined r = refine_after_phase(workload, rates, m, sim, rt.cpu_workers(), link_share_record.measured,
                                       first_streamed, u_c_measured, holds_links ? &calibrated_rates : nullptr,
                                       simulated_share ? &stream_end_at : nullptr, lowers_only);
  rates = r.rates;
  u_c_measured = r.u_c_measured;
  refined = refined || r.applied;
  link_share_record = record_phase(link_share_record, r);
  return false;
}

}  // namespace dos
