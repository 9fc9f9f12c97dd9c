// The `gpu` plan: every update on the GPU, the state streamed in and out, except the last
// subgroups that fit the GPU resident budget, which keep their state there. Needs a CUDA worker.
#include <algorithm>
#include <stdexcept>

#include "../plan.h"

namespace dos {
namespace {

class GpuPlan final : public Plan {
 public:
  PlanNeeds needs() const override {
    PlanNeeds n;
    n.cuda_worker = true;
    return n;
  }
  std::vector<PlanSide> decide(const PlanInput& in) const override {
    const std::size_t n = in.workload.sizes.size();
    std::vector<PlanSide> p(n, PlanSide::gpu_streamed);
    for (std::size_t i = n - std::min(in.workload.resident, n); i < n; ++i) p[i] = PlanSide::gpu_resident;
    return p;
  }
  /// Refuses an update budget below one streamed subgroup when some subgroup must be streamed.
  void validate(const Workload& w, const GpuBudgets& budgets) const override {
    if (w.may_stream || w.resident >= w.sizes.size()) return;
    std::size_t need_streamed = 0;
    for (std::size_t sz : w.sizes) need_streamed = std::max(need_streamed, subgroup_footprint(w, sz, PlanSide::gpu_streamed));
    throw std::invalid_argument("policy " + name() + " streams every subgroup, and one streamed subgroup needs " +
                                gb_text(double(need_streamed)) + " of GPU memory, above the GPU update budget of " +
                                gb_text(double(budgets.update)) +
                                ": raise the budget, lower the subgroup size, or use the dos policy");
  }
};

}  // namespace

extern const PlanEntry plan_gpu = {"gpu", "gpu", "every update on the GPU, the state streamed (needs a CUDA worker)",
                                   [](const std::string&) -> std::unique_ptr<Plan> { return std::make_unique<GpuPlan>(); }};

}  // namespace dos
