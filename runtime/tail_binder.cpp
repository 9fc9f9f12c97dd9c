// Late binding of the plan's tail in an update phase (OptimizerOptions::tail_subgroups): which
// subgroups are left out of the submission (Optimizer::Impl::choose_tail), and the binder thread's
// work, which gives each its side while the phase runs (bind_tail_subgroups; the decisions are
// models/tail_binding.h's) and submits it.
#include <starpu.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "../models/tail_binding.h"
#include "optimizer_impl.h"

namespace dos {
using namespace detail;

void Optimizer::Impl::choose_tail(OpenStep& ph) {
  ph.tail_order.clear();
  if (opt.tail_subgroups == 0 || ph.st.overlapped || ph.async || cuda_nodes.empty() || plan.empty() || !have_rates)
    return;
  // Not in the first phase that streams: StarPU allocates the streamed state's GPU buffers in it,
  // which slows the stream by an amount no pace measured so far foretells. On the GPU machine, the
  // 20B quarter's first phase with the binder took 0.94-0.95 s against 0.81-0.88 s for the plan as
  // made, the CPU busy 64-67% of it against 74-81% (docs/measured-2026-12.md, "At 099fc13", "The
  // tail binding's first phase").
  if (!stream_buffers_allocated) return;
  std::vector<std::size_t> tail;
  for (std::size_t i = sgs.size(); i-- > 0 && tail.size() < opt.tail_subgroups;)
    if (plan[i] != PlanSide::gpu_resident) tail.push_back(i);
  std::vector<char> in(sgs.size(), 0);
  for (std::size_t i : tail) in[i] = 1;
  // the binder learns each side's pace from the updates submitted before the tail: it needs both
  bool cpu = false, stream = false;
  for (std::size_t i = 0; i < sgs.size(); ++i)
    if (!in[i]) {
      cpu = cpu || plan[i] == PlanSide::cpu;
      stream = stream || plan[i] == PlanSide::gpu_streamed;
    }
  if (!cpu || !stream) return;
  ph.tail_order.assign(tail.rbegin(), tail.rend());
  ph.in_tail = std::move(in);
  ph.tail_submitted.assign(sgs.size(), 0);
  std::lock_guard<std::mutex> g(ph.tail.mu);
  ph.tail.t0_us = starpu_timing_now();  // the submission's start: no side has had work before
}

void Optimizer::Impl::bind_tail_subgroups(OpenStep& ph) {
  TailWatch& w = ph.tail;
  const double workers = double(std::max<std::size_t>(1, rt.cpu_workers()));
  // Before a side has a pace of its own in this phase: the model's rates (the CPU beside DMA, the
  // state's bytes per parameter up at B_h2d: 12, or 10.125 in compact form)
  const double state = state_bytes_per_param(workload);
  const double cpu_model = 1.0 / (rates.U_c_dma * workers), stream_model = state / rates.B_h2d;
  const double cpu_drain = double(workload.param_bytes) / rates.B_h2d, stream_drain = state / rates.B_d2h;
  for (const std::size_t i : ph.tail_order) {
    Subgroup* sg = sgs[i].get();
    const std::size_t n = sg->size;
    PlanSide side;
    {
      std::unique_lock<std::mutex> l(w.mu);
      for (;;) {
        if (w.stop) return;
        const double now = starpu_timing_now();
        // work ahead: what is given and not ended, less what the running update has done since the
        // side's last end (or the phase's start)
        auto left = [&](double out, double pace, double last_end_us) {
          return std::max(0.0, out * pace - 1e-6 * (now - std::max(last_end_us, w.t0_us)));
        };
        SideOutlook cpu, stream;
        cpu.lead = 1;
        stream.lead = 2;
        cpu.pace = w.cpu_params > 0 ? w.cpu_seconds / w.cpu_params / workers : cpu_model;
        cpu.drain = cpu_drain;
        cpu.left = left(w.cpu_out, cpu.pace, w.cpu_last_end_us);
        stream.pace = w.stream_params_after_first > 0
                          ? 1e-6 * (w.stream_last_end_us - w.stream_first_end_us) / w.stream_params_after_first
                          : stream_model;
        stream.drain = stream_drain;
        stream.left = left(w.stream_out, stream.pace, w.stream_last_end_us);
        if (tail_due(n, cpu, stream)) {
          side = bind_tail(n, cpu, stream);
          break;
        }
        w.cv.wait_for(l, std::chrono::milliseconds(1));  // an Adam's end, or time passing
      }
    }
    ph.st.tail_bound += 1;
    if (side != plan[i]) ph.st.tail_moved += 1;
    plan[i] = side;
    sg->hint_update.side = side == PlanSide::cpu ? Side::cpu : Side::gpu;
    sg->footprint = subgroup_footprint(workload, sg->size, side);
    submit_update(ph, i, false);
    write_back(ph, sg, STARPU_RW, false);  // the end of the phase, after its tasks
    ph.tail_submitted[i] = 1;
  }
}

}  // namespace dos
