// The `static:R` plan: DeepSpeed's ZeRO-Offload++ (TwinFlow) `ratio`. R, the CPU share in [0, 1]:
// the first round(R n) subgroups on the CPU, the others keep their state resident on the GPU for
// good (static_plan, models/resource_model.h). It chooses its resident subgroups itself and must fit
// them in the GPU resident budget when one is given.
#include <cstdlib>
#include <cstdio>
#include <stdexcept>

#include "../plan.h"
#include "number_text.h"
#include "adam.h"

namespace dos {
namespace {

class StaticPlan final : public Plan {
 public:
  explicit StaticPlan(double cpu_share) : cpu_share_(cpu_share) {}
  PlanNeeds needs() const override {
    PlanNeeds n;
    n.rates = true;
    n.resident = ResidentState::own;
    return n;
  }
  std::vector<PlanSide> decide(const PlanInput& in) const override {
    return static_plan(in.workload.sizes.size(), cpu_share_);
  }
  /// Refuses a resident share above a given GPU resident budget, naming the smallest R that fits.
  void validate(const Workload& w, const GpuBudgets& budgets) const override {
    if (budgets.resident < 0) return;
    const std::size_t budget = std::size_t(budgets.resident);
    const std::vector<PlanSide> sp = static_plan(w.sizes.size(), cpu_share_);
    std::size_t kept = 0, nres = 0;
    for (std::size_t i = 0; i < sp.size(); ++i)
      if (sp[i] == PlanSide::gpu_resident) kept += subgroup_state_bytes(w, w.sizes[i]), ++nres;
    if (kept <= budget) return;
    const std::size_t fit = resident_subgroups(w.sizes, budget, w.compact_master);
    char r[32];
    std::snprintf(r, sizeof r, "%.4g", double(w.sizes.size() - fit) / double(w.sizes.size()));
    throw std::invalid_argument("policy " + name() + " keeps " + std::to_string(nres) + " subgroups' state (" +
                                gb_text(double(kept)) + ") resident on the GPU, more than the GPU resident budget of " +
                                gb_text(double(budget)) + ": use static:" + r + " or a larger CPU share (" +
                                std::to_string(fit) + " subgroups fit), or raise the budget");
  }

 private:
  double cpu_share_;
};

std::unique_ptr<Plan> make(const std::string& r) {
  double v = 0;
  if (!parse_decimal(r, &v) || !(v >= 0.0 && v <= 1.0))
    throw std::invalid_argument("policy 'static:" + r +
                                "': R in static:R is the CPU share of the subgroups, a number in [0, 1] (e.g. static:0.6)");
  return std::make_unique<StaticPlan>(v);
}

}  // namespace

extern const PlanEntry plan_static = {
    "static", "static:R", "DeepSpeed's ZeRO-Offload++ ratio: the first R of the subgroups on the CPU, the others resident "
    "on the GPU", make};

}  // namespace dos
