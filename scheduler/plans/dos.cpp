// The `dos` plan: the plan of least simulated time under the calibrated rates (choose_plan_simulated,
// models/phase_sim.h), re-taken every phase with the rates refined from what the last phase
// measured; the last subgroups that fit the GPU resident budget stay resident.
#include <stdexcept>

#include "../plan.h"

namespace dos {
namespace {

class DosPlan final : public Plan {
 public:
  PlanNeeds needs() const override {
    PlanNeeds n;
    n.rates = true;
    n.refine = true;
    n.decided_ahead = true;  // choose_plan_simulated: a pure function of workload, rates and execution
    return n;
  }
  std::vector<PlanSide> decide(const PlanInput& in) const override {
    if (!in.rates) throw std::invalid_argument("plan " + name() + " needs the model's rates and was given none");
    return choose_plan_simulated(in.workload, *in.rates, in.execution).plan;
  }
};

}  // namespace

extern const PlanEntry plan_dos = {
    "dos", "dos", "the resource model's plan of least simulated time, re-taken every iteration",
    [](const std::string&) -> std::unique_ptr<Plan> { return std::make_unique<DosPlan>(); }};

}  // namespace dos
