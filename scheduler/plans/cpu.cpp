// The `cpu` plan: every update on the CPU (ZeRO-Offload). Needs nothing.
#include "../plan.h"

namespace dos {
namespace {

class CpuPlan final : public Plan {
 public:
  PlanNeeds needs() const override { return {}; }
  std::vector<PlanSide> decide(const PlanInput& in) const override {
    return std::vector<PlanSide>(in.workload.sizes.size(), PlanSide::cpu);
  }
};

}  // namespace

extern const PlanEntry plan_cpu = {"cpu", "cpu", "every update on the CPU (ZeRO-Offload)",
                                   [](const std::string&) -> std::unique_ptr<Plan> { return std::make_unique<CpuPlan>(); }};

}  // namespace dos
