// The `greedy` plan, the worked example of docs/writing-a-policy.md: each subgroup, in index order,
// on whichever side would finish it first under the calibrated rates.
//
// Two clocks, both starting at 0 s: when the CPU and when the streaming pipeline would be free.
// A subgroup of n parameters costs
//   on the CPU:       n / U_c_dma                                (CPU Adam beside the streaming),
//   streamed:         max(12 n / B_h2d, n / U_g, 12 n / B_d2h)   (state in, GPU Adam, state out,
//                                                                 pipelined: the slowest stage;
//                                                                 10.125 n each way with the compact
//                                                                 master: state_bytes_per_param),
// and goes where its clock plus its cost is the smaller (a tie goes to the CPU, which moves no state);
// that side's clock advances by the cost. The last Workload::resident subgroups stay resident and
// take no part; nothing is streamed when !Workload::may_stream. A deliberately small model: it
// leaves out what `dos` simulates (the CPU subgroups' gradients and parameters on PCIe, host memory
// shared by CPU Adam and DMA, the pipeline's fill and drain).
#include <algorithm>
#include <stdexcept>

#include "../plan.h"

namespace dos {
namespace {

class GreedyPlan final : public Plan {
 public:
  PlanNeeds needs() const override {
    PlanNeeds n;
    n.rates = true;
    return n;
  }
  std::vector<PlanSide> decide(const PlanInput& in) const override {
    if (!in.rates) throw std::invalid_argument("plan " + name() + " needs the model's rates and was given none");
    const Workload& w = in.workload;
    const Rates& r = *in.rates;
    const std::size_t n = w.sizes.size(), free = n - std::min(w.resident, n);
    std::vector<PlanSide> plan(n, PlanSide::gpu_resident);
    double cpu_free = 0, stream_free = 0;  // seconds
    const double state = state_bytes_per_param(w);  // bytes each way per streamed parameter
    for (std::size_t i = 0; i < free; ++i) {
      const double p = double(w.sizes[i]);
      const double on_cpu = cpu_free + p / r.U_c_dma;
      const double streamed = stream_free + std::max({state * p / r.B_h2d, p / r.U_g, state * p / r.B_d2h});
      if (!w.may_stream || on_cpu <= streamed) {
        plan[i] = PlanSide::cpu;
        cpu_free = on_cpu;
      } else {
        plan[i] = PlanSide::gpu_streamed;
        stream_free = streamed;
      }
    }
    return plan;
  }
};

}  // namespace

extern const PlanEntry plan_greedy = {
    "greedy", "greedy", "each subgroup, in order, on the side that would finish it first under the calibrated rates",
    [](const std::string&) -> std::unique_ptr<Plan> { return std::make_unique<GreedyPlan>(); }};

}  // namespace dos
