// The overlapped update's speculative side: gradients_final (Optimizer::gradients_final), which
// queues each subgroup whose gradients are all final for the open step's submitter thread
// (update_phase.cpp), and the speculative update that thread submits for it: out of place into a
// shadow state (adam_into_cl, adam_compact_into_cl for the compact master), on the CPU or, for a
// streamed subgroup, on the GPU, whose verdict finish_step then keeps or redoes.
#include <starpu.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>

#include "../codelets/codelets.h"
#include "dos.h"
#include "host_memory.h"
#include "optimizer_impl.h"

namespace dos {
using namespace detail;

namespace {
/// Callback of a speculative Adam task (adam_into_cl): as record_worker, and the task has ended.
void record_speculative(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  note_worker(sg);
  clock_task(sg, "adam_spec");
  sg->spec_ended.store(true);
}
}  // namespace

bool Optimizer::Impl::speculable(std::size_t i) const {
  if (opt.speculation_budget == 0 || last_changed) return false;
  if (!plan.empty() && plan[i] == PlanSide::gpu_streamed)
    return opt.speculate_streamed && !cuda_nodes.empty() && codelets_have_cuda();
  return rt.cpu_workers() > 0 && (plan.empty() || plan[i] == PlanSide::cpu);
}

bool Optimizer::Impl::ensure_shadow(Subgroup* sg) {
  if (sg->sh_h_state) return true;
  const std::size_t bytes = state_bytes_for(sg->size);
  if (shadow_limit == 0) {  // the budget, fixed at the first speculative update that finds room
    // (a budget of 0, from a full cgroup, is asked again at the next one)
    if (opt.speculation_budget > 0) {
      shadow_limit = std::size_t(opt.speculation_budget);
    } else {
      CgroupLimit cgroup;
      const std::size_t avail = host_memory_available(&cgroup);
      // 0 from a full cgroup means nothing left; 0 otherwise means unknown (not Linux)
      shadow_limit = avail || cgroup.limit ? avail / 2 : std::size_t(3) * nparams * sizeof(float);
    }
  }
  if (shadow_used + bytes > shadow_limit) return false;
  try {
    sg->sh_state = alloc_host(bytes);
  } catch (const std::exception&) {
    // no room after all: this subgroup (and every later one) is updated in finish_step, the same bits
    shadow_limit = shadow_used;
    return false;
  }
  if (opt.compact_master)  // the state's own layout (Subgroup::compact_base), so that the two can be swapped
    starpu_vector_data_register(&sg->sh_h_state, STARPU_MAIN_RAM,
                                uintptr_t(sg->sh_state.ptr + sg->stride - compact_head_floats(sg->stride)),
                                compact_head_floats(sg->stride) + 2 * sg->stride, sizeof(float));
  else
    starpu_vector_data_register(&sg->sh_h_state, STARPU_MAIN_RAM, uintptr_t(sg->sh_state.ptr), 3 * sg->stride,
                                sizeof(float));
  shadow_used += bytes;
  return true;
}

void Optimizer::Impl::speculate(OpenStep& ph, std::size_t i) {
  Subgroup* sg = sgs[i].get();
  if (!speculable(i) || !ensure_shadow(sg)) return;
  // A streamed subgroup is updated on the GPU: its state goes down (PCIe is idle during backward),
  // the new state is written to the shadow handles there and comes back into the host shadow at
  // once; the old state's device copy is dropped first when memory runs short.
  const bool on_gpu = !plan.empty() && plan[i] == PlanSide::gpu_streamed;
  // its share of the update budget (with the shadow state on the GPU) only if it fits now:
  // nothing gives room back before finish_step, so a speculative update never waits for it
  if (!ph.admitted[i]) {
    const std::size_t fp = sg->footprint + (on_gpu ? state_bytes_for(sg->size) : 0);
    if (!window.try_take(fp, 0)) return;
    sg->footprint = fp;  // what the window gives back when the subgroup's work ends
    ph.admitted[i] = 1;
  }
  sg->step += 1;
  ph.stepped[i] = 1;
  ph.speculated[i] = 1;
  ph.spec_order.push_back(i);
  // its pieces of work: the verdict's (the parameter write-back when kept), and on the GPU the
  // write-back of the shadow state
  sg->parts_left.store(1 + (on_gpu ? 1 : 0));
  sg->adam.sp = make_adam_step_params(opt.adam, sg->step);
  sg->hint_update.prefetch = true;
  stage_gradient(ph, i);
  // A compact state's P: in the staging, where adam_compact_into_cl writes the new one (the caller's
  // parameters keep P until the verdict keeps the update: finish_submit's scatter_new_params)
  stage_params_unless_kept(ph, i);
  struct starpu_task* a = make_task(opt.compact_master ? &adam_compact_into_cl : &adam_into_cl, &sg->adam,
                                    &sg->hint_update, on_gpu ? STARPU_CUDA : STARPU_CPU);
  a->handles[0] = sg->h_state;
  a->handles[1] = sg->h_grad32;
  a->handles[2] = sg->h_param16;
  a->handles[3] = sg->sh_h_state;
  a->callback_func = record_speculative;
  a->callback_arg = sg;
  submit(a, "speculative Adam");
  starpu_data_invalidate_submit(sg->h_grad32);  // a redo stages the gradient again
  if (on_gpu) {
    starpu_data_wont_use(sg->h_state);
    acquire_home(ph, sg->sh_h_state, STARPU_R, sg, false);  // not on the timeline's lane "writeback"
    if (wont_use_after_writeback()) starpu_data_wont_use(sg->sh_h_state);
  }
}

void Optimizer::Impl::declare_final(std::size_t begin, std::size_t end) {
  if (!open) throw UsageError("gradients_final outside an update phase: call begin_step first");
  if (open->finishing)  // finish_submit has run: by finish_step_async, step_async, or a finish_step or step()
    throw UsageError(!open->async ? "gradients_final while finish_step or step() runs in another thread: an "
                                    "optimizer takes one call at a time; declare within a phase opened by "
                                    "begin_step, before it is finished"
                     : open->st.overlapped
                         ? "gradients_final after finish_step_async: the phase takes every gradient as final from "
                           "then on; wait for it (wait_step), then open the next with begin_step"
                         : "gradients_final while a phase started by step_async runs: it was submitted whole, every "
                           "gradient final; wait for it (wait_step), then open an overlapped phase with begin_step");
  if (begin > end || end > nparams)
    throw Error("gradients_final: the range [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") is not inside the optimizer's " + std::to_string(nparams) + " parameters");
  OpenStep& ph = *open;
  if (begin == end) return;
  std::lock_guard<std::mutex> guard(ph.declare_mu);
  {  // each element once per step: the range must not meet one declared before
    auto next = ph.declared.lower_bound(begin);
    const bool meets_next = next != ph.declared.end() && next->first < end;
    const bool meets_prev = next != ph.declared.begin() && std::prev(next)->second > begin;
    if (meets_next || meets_prev)
      throw Error("gradients_final: elements of [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") were declared final before in this step (each element once per step)");
    ph.declared.emplace(begin, end);
  }
  // the first subgroup ending after `begin` (subgroups are consecutive in the flat order)
  std::size_t i = std::size_t(std::upper_bound(sgs.begin(), sgs.end(), begin,
                                               [](std::size_t b, const std::unique_ptr<Subgroup>& sg) {
                                                 return b < sg->begin + sg->size;
                                               }) - sgs.begin());
  for (; i < sgs.size() && sgs[i]->begin < end; ++i) {
    Subgroup* sg = sgs[i].get();
    const std::size_t lo = std::max(begin, sg->begin), hi = std::min(end, sg->begin + sg->size);
    if (hi <= lo) continue;
    ph.final_elems[i] += hi - lo;
    if (ph.final_elems[i] == sg->size) {
      {
        std::lock_guard<std::mutex> g(ph.q_mu);
        ph.queue.push_back(i);
      }
      ph.q_cv.notify_one();
    }
  }
}

}  // namespace dos
