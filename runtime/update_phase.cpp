// The update phase of the Optimizer: begin_step (or step()), the submitter thread that runs the
// speculative updates gradients_final lets it (speculation.cpp), finish_step (the plan's task graph,
// the state's write-back (state_writeback.cpp), the late-bound tail (tail_binder.cpp), the phase's
// statistics), and the callbacks of its tasks.
#include <starpu.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "../codelets/codelets.h"
#include "../codelets/cpu_team.h"
#include "../codelets/task_clock.h"
#include "../scheduler/policy.h"
#include "dos.h"
#include "optimizer_impl.h"
#include "profiling.h"

namespace dos {
using namespace detail;

// ---------------------------------------------------------------------------------------------
// The update phase's task callbacks (StarPU's threads)

namespace detail {  // the callback helpers (optimizer_impl.h)

void subgroup_part_done(Subgroup* sg) {
  if (sg->parts_left.fetch_sub(1) == 1 && sg->window) sg->window->give(sg->footprint);
}

void clock_task(Subgroup* sg, const char* what) {
  task_clock::Span span;
  if (!task_clock::finish(starpu_task_get_current(), &span)) return;
  if (sg->busy) {
    const double s = 1e-6 * (span.end_us - span.start_us);
    std::lock_guard<std::mutex> g(sg->busy->mu);
    (span.gpu ? sg->busy->gpu : sg->busy->cpu) += s;
    if (!span.gpu && std::strcmp(what, "adam") == 0) {
      sg->busy->cpu_adam += s;
      auto& spans = sg->busy->cpu_adam_spans;  // room for one per subgroup (PhaseBusy::reset): no allocation here
      if (spans.size() < spans.capacity()) spans.push_back(AdamSpan{span.start_us, span.end_us, sg->size});
    }
  }
  // the write-back span's start (a speculative Adam's write-back into its shadow is on no lane, and
  // a redone one's may still end after the reset of its redo)
  if (std::strcmp(what, "adam") == 0) {
    sg->adam_end_us.store(span.end_us);
    if (span.gpu) link_writeback_started(sg);
    if (const int side = sg->tail_side.load(); side != 0 && sg->tail)
      sg->tail->adam_ended(side == 1, double(sg->size), span.start_us, span.end_us);
  }
  if (sg->timeline) {
    try {
      sg->timeline->record(what, std::size_t(sg->hint_update.subgroup), span);
    } catch (const std::bad_alloc&) {  // the timeline loses the task (this runs in StarPU's C callback)
    }
  }
}

void note_worker(Subgroup* sg) {
  const int w = starpu_worker_get_id();
  sg->ran_on.store(w >= 0 && starpu_worker_get_type(w) == STARPU_CUDA_WORKER ? 2 : 1);
}

void params_written(Subgroup* sg) {
  if (sg->ready) sg->ready->mark(sg->params_written);
}

}  // namespace detail

namespace {

/// Callback of the Adam task: which kind of worker ran it, and its timeline entry.
void record_worker(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  note_worker(sg);
  clock_task(sg, "adam");
}
/// Callback of the Adam task of the direct path (adam_direct_cl): as record_worker, the parameters
/// written, and the task is one piece of the subgroup's work.
void adam_direct_done(void* arg) {
  record_worker(arg);
  params_written(static_cast<Subgroup*>(arg));
  subgroup_part_done(static_cast<Subgroup*>(arg));
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// One update phase: begin_step, gradients_final (speculative updates), finish_step

void Optimizer::Impl::require_no_open_step(const char* what) const {
  if (open && open->finishing)
    throw UsageError(std::string(what) + " while an update phase still runs (finish_step_async without wait_step): "
                     "call wait_step first");
  if (open)
    throw UsageError(std::string(what) + " while an update phase is open (begin_step without finish_step): call "
                     "finish_step first");
}

void Optimizer::Impl::fail(const std::string& why) {
  starpu_task_wait_for_all();
  broken = why;
  open.reset();
  throw Error(why);
}

void Optimizer::Impl::begin(bool overlapped) {
  if (!broken.empty())
    throw Error("a previous step failed (" + broken + "): the optimizer state may be inconsistent; create a new Optimizer");
  require_no_open_step("begin_step");
  // the caller's idle OpenMP threads would leave the CPU workers' teams sleeping between kernels
  // (codelets/cpu_team.h); freed before the phase's clock starts
  release_caller_openmp_threads();
  open = std::make_unique<OpenStep>();
  OpenStep& ph = *open;
  StepStats& st = ph.st;
  st.overlapped = overlapped;
  read_bus_bytes(&ph.h2d0, &ph.d2h0);
  busy.reset(sgs.size());  // nothing of this optimizer is in flight
  ph.t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> g(timeline.mu);
    timeline.tasks.clear();
    timeline.t0_us = starpu_timing_now();
    st.started_at = 1e-6 * timeline.t0_us;
  }
  ph.state_off_gpu = states_off_gpu();  // before the plan: a resident state off the GPU must come up
  ph.params_on_host = params_on_host();
  try {
    // The timeline's bus samples: a thread reads the bus counters every millisecond during the
    // phase (start_sampler); one that cannot start (std::system_error) leaves no phase open
    if (timeline_on) ph.start_sampler();
    PlanDecision decided;
    plan = make_plan(&decided);
    st.plan_seconds = decided.seconds;
    st.plan_decided_ahead = decided.ahead;
  } catch (...) {
    open.reset();
    throw;
  }
  st.plan = plan;
  begin_downloads(ph);
  if (!plan.empty()) {
    for (std::size_t i = 0; i < sgs.size(); ++i) {
      sgs[i]->hint_update.side = plan[i] == PlanSide::cpu ? Side::cpu : Side::gpu;
      st.planned_streamed += plan[i] == PlanSide::gpu_streamed;
      st.planned_resident += plan[i] == PlanSide::gpu_resident;
    }
    if (have_rates) {
      ph.sim = simulate_plan();
      st.predicted_seconds = ph.sim.total;
      Workload bound_w = workload;  // a plan choosing its own resident subgroups keeps the last ones
      bound_w.resident = std::max(bound_w.resident, st.planned_resident);
      // the resident states still off the GPU come up in this phase (its simulation charges them
      // too): those of the bound's resident subgroups (the last ones, which every plan of this
      // repository keeps resident) that the plan keeps resident
      const std::size_t first_resident = sgs.size() - std::min(bound_w.resident, sgs.size());
      double cold = 0;
      for (std::size_t i = first_resident; i < ph.state_off_gpu.size(); ++i)
        if (plan[i] == PlanSide::gpu_resident && ph.state_off_gpu[i]) cold += double(bound_w.sizes[i]);
      st.lower_bound_seconds = lower_bound(bound_w, calibrated_rates, rates, rt.cpu_workers(), cold);
      st.bound_by = ph.sim.busiest();
    }
  }
  const bool gpu = !cuda_nodes.empty();
  const std::size_t n = sgs.size();
  ph.admitted.assign(n, 0);
  ph.final_elems.assign(n, 0);
  ph.stepped.assign(n, 0);
  ph.speculated.assign(n, 0);
  ph.in_tail.assign(n, 0);
  state_writebacks_on_link.store(0);  // the last phase's write-backs are all home
  // The update budget bounds the subgroups in flight; lookahead prefetches take theirs only while
  // room for one more subgroup is left, so that the subgroup being submitted always gets in.
  for (std::size_t i = 0; i < n; ++i) {
    Subgroup* sg = sgs[i].get();
    sg->footprint = gpu ? subgroup_footprint(workload, sg->size, plan.empty() ? PlanSide::cpu : plan[i]) : 0;
    ph.largest_fp = std::max(ph.largest_fp, sg->footprint);
    sg->timeline = timeline_on ? &timeline : nullptr;
    sg->busy = &busy;
    sg->tail = &ph.tail;
    sg->tail_side.store(0);
    sg->on_link = &state_writebacks_on_link;
    sg->writeback_link.store(2);
    sg->spec_ended.store(false);
    sg->ran_on.store(0);
    sg->adam_end_us.store(0);
    sg->params_written.store(false);
    sg->ready = &ready;
  }
  {
    std::lock_guard<std::mutex> g(ready.mu);
    ready.last_us = 0;
  }
  window.reset(gpu ? opt.gpu_update_budget : 0);
  // Submission order (OptimizerOptions::submit_order). cpu_first: the subgroups that are not
  // streamed first, then the streamed ones. The CUDA worker runs its tasks in the order they become
  // ready, so in plan order the CPU subgroups' gradient staging waits behind every streamed Adam
  // submitted before it (and that Adam behind its state's H2D): the CPU starves while PCIe waits
  // for the CPU's gradients. Staged first, the CPU's gradients go down at once and the streamed
  // subgroups then follow each other on the link at its full rate. Only when the update budget
  // holds the CPU subgroups' staging and the streaming window together; otherwise plan order.
  ph.cpu_first = gpu && !plan.empty() && submits_cpu_first(workload, plan, execution());
  st.cpu_first = ph.cpu_first;
  ph.setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ph.t0).count();
  // the prediction: the seconds spent so far and the simulated phase from here
  if (st.predicted_seconds > 0) st.predicted_seconds += ph.setup_seconds;
  if (overlapped)
    ph.submitter = std::thread([this, &ph] {
      for (;;) {
        std::size_t i;
        {
          std::unique_lock<std::mutex> l(ph.q_mu);
          ph.q_cv.wait(l, [&] { return ph.q_closed || !ph.queue.empty(); });
          if (ph.queue.empty()) return;  // closed and drained
          i = ph.queue.front();
          ph.queue.pop_front();
        }
        if (!ph.submit_error.empty()) continue;  // after a failure nothing more is submitted
        try {
          speculate(ph, i);
        } catch (const std::exception& e) {
          ph.submit_error = e.what();
        }
      }
    });
}

StepStats Optimizer::Impl::finish(StepVerdict verdict) {
  finish_submit(verdict, false);
  return finish_wait();
}

void Optimizer::Impl::finish_submit(StepVerdict verdict, bool async) {
  if (!open || open->finishing) throw UsageError("finish_step without begin_step");
  OpenStep& ph = *open;
  StepStats& st = ph.st;
  const auto t_finish = std::chrono::steady_clock::now();
  ph.verdict = verdict;
  ph.async = async;
  ph.drain();  // every speculative update queued so far is submitted
  if (!ph.submit_error.empty()) {
    ph.pending.wait();
    fail(ph.submit_error);
  }
  for (std::size_t i : ph.spec_order) {
    st.speculated += 1;
    if (sgs[i]->spec_ended.load()) st.hidden_params += sgs[i]->size;
  }
  const bool gpu = !cuda_nodes.empty();
  auto streamed = [&](std::size_t i) { return !plan.empty() && plan[i] == PlanSide::gpu_streamed; };
  try {
    if (verdict == StepVerdict::skip) {
      // nothing of this step is kept: the speculative results are dropped, the step counts restored
      for (std::size_t i : ph.spec_order) {
        sgs[i]->step -= 1;
        starpu_data_invalidate_submit(sgs[i]->h_param16);
        subgroup_part_done(sgs[i].get());
      }
      st.skipped = true;
      for (const auto& sg : sgs) params_written(sg.get());  // the caller's parameters stay as they are
    } else {
      for (std::size_t i : ph.spec_order) {
        Subgroup* sg = sgs[i].get();
        if (verdict == StepVerdict::changed) {  // redone below from the state before the step
          ph.speculated[i] = 0;
          st.redone += 1;
          starpu_data_invalidate_submit(sg->h_param16);
          continue;
        }
        // kept: the shadow holds the new state (StarPU orders these swaps after the speculative
        // task, which wrote the shadow handles, through the handles themselves)
        std::swap(sg->state, sg->sh_state);
        std::swap(sg->h_state, sg->sh_h_state);
        scatter_new_params(ph, i);
      }
      choose_tail(ph);
      std::vector<std::size_t> stream_order;  // the streamed subgroups, in submission order
      for (std::size_t i = 0; i < sgs.size(); ++i)
        if (streamed(i) && !ph.in_tail[i]) stream_order.push_back(i);
      const std::size_t lookahead = gpu ? opt.stream_lookahead : 0;
      auto prefetch_state = [&](std::size_t i) {
        Subgroup* sg = sgs[i].get();
        if (ph.admitted[i]) return;
        if (!window.try_take(sg->footprint, window.limit ? ph.largest_fp : 0)) return;
        ph.admitted[i] = 1;
        const unsigned node = cuda_nodes[i % cuda_nodes.size()];  // the placement policy's choice
        starpu_data_prefetch_on_node(sg->h_state, node, 1);
      };
      const std::vector<std::size_t> order =
          submission_order(plan.empty() ? std::vector<PlanSide>(sgs.size(), PlanSide::cpu) : plan, ph.cpu_first);
      std::size_t next_streamed = 0;  // position in stream_order of the next streamed subgroup
      for (const std::size_t i : order) {
        if (ph.in_tail[i]) continue;  // bound and submitted by the binder thread
        const bool is_streamed = streamed(i);
        if (is_streamed && lookahead > 0) {
          // this subgroup's state and that of the next `lookahead` streamed ones are on their way
          for (std::size_t q = next_streamed; q < stream_order.size() && q <= next_streamed + lookahead; ++q)
            prefetch_state(stream_order[q]);
        }
        if (is_streamed) ++next_streamed;
        if (ph.speculated[i]) continue;  // kept above
        submit_update(ph, i, is_streamed && lookahead > 0);
      }
      if (!ph.tail_order.empty()) ph.binder = std::thread([this, &ph] {
        try {
          bind_tail_subgroups(ph);
        } catch (const std::exception& e) {
          ph.bind_error = e.what();
          // the subgroups it did not submit will not be written: a caller's wait_parameters must
          // not wait for them, and says the step failed (wait_step then fails it)
          ph.note_copy_error("submitting the plan's tail failed: " + ph.bind_error);
          for (std::size_t i : ph.tail_order)
            if (!ph.tail_submitted[i]) params_written(sgs[i].get());
        }
      });
    }
  } catch (const std::exception& e) {
    ph.join_binder(true);
    ph.pending.wait();  // the acquires already made call back into `pending` and the subgroups
    fail(e.what());
  }
  // The phase ends when every subgroup's state is safe in host memory and nowhere else (pure
  // offload: nothing of the state stays valid on the GPU; after an eager write-back this moves no
  // data, it only invalidates the device copy). Resident subgroups keep their state on the GPU.
  try {
    for (std::size_t i = 0; i < sgs.size(); ++i) {
      if (ph.in_tail[i] || (!plan.empty() && plan[i] == PlanSide::gpu_resident)) continue;  // the binder: after its tasks
      write_back(ph, sgs[i].get(), STARPU_RW, false);
    }
  } catch (const std::exception& e) {
    ph.join_binder(true);
    ph.pending.wait();
    fail(e.what());
  }
  ph.finishing = true;
  ph.waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_finish).count();
}

void Optimizer::Impl::submit_update(OpenStep& ph, std::size_t i, bool prefetched) {
  Subgroup* sg = sgs[i].get();
  const bool is_streamed = !plan.empty() && plan[i] == PlanSide::gpu_streamed;
  if (!ph.admitted[i]) {
    window.take(sg->footprint);
    ph.admitted[i] = 1;
  }
  const bool eager = is_streamed && opt.eager_writeback;
  if (ph.stepped[i]) {
    // a redone speculative update (stepped when it was speculated): its verdict's piece of
    // work is this write-back; its shadow's write-backs may still run
    sg->parts_left.fetch_add(eager ? 1 : 0);
  } else {
    sg->parts_left.store(1 + (eager ? 1 : 0));
    sg->step += 1;
    ph.stepped[i] = 1;
  }
  sg->hint_update.prefetch = !prefetched;
  sg->adam.sp = make_adam_step_params(opt.adam, sg->step);
  sg->ran_on.store(0);
  sg->adam_end_us.store(0);
  sg->writeback_link.store(eager ? 0 : 2);  // before the Adam is submitted: its end counts the write-back
  if (!ph.tail_order.empty() && !plan.empty() && plan[i] != PlanSide::gpu_resident) {
    // the binder's pace: every CPU and streamed update of the phase counts
    sg->tail_side.store(is_streamed ? 2 : 1);
    ph.tail.submitted(!is_streamed, double(sg->size));
  }
  if (direct_path(i)) {
    // One task: Adam on the state, reading the caller's gradients and writing its parameters in
    // place (their dtype), so nothing but the state crosses PCIe and the CUDA worker runs one
    // task per subgroup.
    sg->params_on_host = false;  // the new P is written on the GPU
    submit(adam_task(sg, &adam_direct_cl, &sg->adam_direct, STARPU_CUDA, adam_direct_done), "Adam");
    if (eager) write_back(ph, sg, STARPU_R, true);
    return;
  }
  stage_gradient(ph, i);
  // A compact master's Adam reads P in the staging (nothing else writes the caller's parameters);
  // under a plan that keeps the subgroup on the CPU, the new P stays there for the next phase.
  stage_params_unless_kept(ph, i);
  struct starpu_task* a =
      adam_task(sg, opt.compact_master ? &adam_compact_cl : &adam_cl, &sg->adam, STARPU_CPU | STARPU_CUDA, record_worker);
  a->handles[1] = sg->h_grad32;
  a->handles[2] = sg->h_param16;
  submit(a, "Adam");
  scatter_new_params(ph, i);
  if (eager) write_back(ph, sg, STARPU_R, true);
}

void Optimizer::Impl::stage_params_unless_kept(OpenStep& ph, std::size_t i) {
  Subgroup* sg = sgs[i].get();
  if (opt.compact_master && !(keeps_params_on_host(i) && sg->params_on_host)) stage_params(ph, i);
  sg->params_on_host = false;
}

void Optimizer::Impl::scatter_new_params(OpenStep& ph, std::size_t i) {
  const bool keep = keeps_params_on_host(i);
  scatter_params(ph, i, keep);
  sgs[i]->params_on_host = keep;
}

void Optimizer::Impl::wait_parameters(std::size_t begin, std::size_t end) {
  if (begin > end || end > nparams)
    throw Error("wait_parameters: the range [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") is not inside the optimizer's " + std::to_string(nparams) + " parameters");
  if (!open) return;  // no phase runs: the parameters are the last step's
  if (!open->finishing)
    throw UsageError("wait_parameters while an update phase is open (begin_step without finish_step): the "
                     "parameters are written after finish_step_async");
  const auto t = std::chrono::steady_clock::now();
  bool blocked = false;  // only a wait counts in the exposed time
  std::unique_lock<std::mutex> g(ready.mu);
  for (const auto& sg : sgs) {
    if (sg->begin >= end || sg->begin + sg->size <= begin || sg->params_written.load()) continue;
    blocked = true;
    ready.cv.wait(g, [&] { return sg->params_written.load(); });
  }
  if (blocked) {
    const auto now = std::chrono::steady_clock::now();
    open->waited += std::chrono::duration<double>(now - t).count();
    open->waits_end = std::chrono::duration<double>(now - open->t0).count();
  }
  g.unlock();
  const std::string copy_error = open->copy_failure();
  if (!copy_error.empty())
    throw Error("wait_parameters: a copy between the GPU and host memory failed (" + copy_error +
                "): the parameters may hold a mix of old and new values; wait_step fails the step");
}

void Optimizer::Impl::wait_work() {
  OpenStep* ph = open.get();  // stays until wait_step, which does not start before this returns
  if (!ph || !ph->finishing) return;
  ph->join_binder(false);  // every subgroup of the tail submitted, its write-back asked for
  ph->pending.wait();
  starpu_task_wait_for_all();
}

StepStats Optimizer::Impl::finish_wait() {
  if (!open || !open->finishing) throw Error("wait_step without finish_step_async");
  OpenStep& ph = *open;
  StepStats& st = ph.st;
  const StepVerdict verdict = ph.verdict;
  const auto t_wait = std::chrono::steady_clock::now();
  wait_work();  // every callback has run (nothing refers to `pending` any more), every task ended
  if (!ph.bind_error.empty()) fail("submitting the plan's tail failed (" + ph.bind_error + ")");
  if (const int refused = ph.refused.load())
    fail("StarPU refused to bring " + std::to_string(refused) + " buffer(s) back to host memory");
  if (const std::string e = ph.copy_failure(); !e.empty())
    fail("a copy between the GPU and host memory failed (" + e + ")");
  if (ph.stop_sampler()) {
    // the phase's totals as its last sample: a phase that ends before the sampler's thread has
    // started still gets one
    ph.sample_bus();
  }
  st.window_peak_bytes = window.limit ? window.peak : 0;
  for (unsigned node : cuda_nodes) {
    const starpu_ssize_t total = starpu_memory_get_total(node), avail = starpu_memory_get_available(node);
    if (total > 0 && avail >= 0) st.gpu_bytes_end += std::uint64_t(total - avail);
  }
  if (timeline_on) {
    std::lock_guard<std::mutex> g(timeline.mu);
    st.timeline = timeline.tasks;
  }
  const auto t_end = std::chrono::steady_clock::now();
  st.seconds = std::chrono::duration<double>(t_end - ph.t0).count();
  // what the caller waited for: finish_step's whole call, or, after finish_step_async, the calls
  // that waited (the phase may have ended long before wait_step: its end is its last write-back)
  ph.waited += std::chrono::duration<double>(t_end - t_wait).count();
  st.exposed_seconds = ph.waited;
  if (ph.async) {
    // wait_step came after the phase's last piece of work: the phase ended then, plus what this
    // call took (as finish_step's own time counts in a synchronous phase)
    double last_us = ph.pending.last_done_us;
    {
      std::lock_guard<std::mutex> g(ready.mu);
      last_us = std::max(last_us, ready.last_us);
    }
    // (or when the caller's last wait for parameters returned, a wake-up later)
    const double done = std::max(1e-6 * (last_us - timeline.t0_us), ph.waits_end);
    if (done > 0 && std::chrono::duration<double>(t_wait - ph.t0).count() >= done)
      st.seconds = done + std::chrono::duration<double>(t_end - t_wait).count();
  }
  read_bus_bytes(&st.bytes_h2d, &st.bytes_d2h);
  st.bytes_h2d -= ph.h2d0;
  st.bytes_d2h -= ph.d2h0;
  if (ph.pending.last_subgroup_part_us > 0)
    st.stream_end_seconds = 1e-6 * (ph.pending.last_subgroup_part_us - timeline.t0_us);
  PhaseMeasure measure;  // what the refinement reads (models/refinement.h)
  {
    std::lock_guard<std::mutex> g(busy.mu);
    st.cpu_busy_seconds = busy.cpu;
    st.gpu_busy_seconds = busy.gpu;
    st.cpu_adam_seconds = busy.cpu_adam;
    // the CPU Adam tasks that began once the streamed state was back in host memory
    const double stream_end_us = ph.pending.last_subgroup_part_us;
    const Execution team = cpu_team();  // a subgroup's parameters at the team's rate (PhaseMeasure::alone_params)
    if (st.planned_streamed > 0 && stream_end_us > 0) {
      std::vector<BusySpan> spans;
      spans.reserve(busy.cpu_adam_spans.size());
      for (const AdamSpan& s : busy.cpu_adam_spans) {
        if (s.start_us >= stream_end_us) {
          measure.alone_params += double(s.params) / cpu_team_share(team, std::size_t(s.params));
          measure.alone_seconds += 1e-6 * (s.end_us - s.start_us);
        }
        spans.push_back(BusySpan{1e-6 * (s.start_us - timeline.t0_us), 1e-6 * (std::max(s.end_us, s.start_us) - timeline.t0_us)});
      }
      if (!st.overlapped && !ph.async)  // a phase run after backward, as the refinement's
        st.cpu_adam_idle_before_stream_end_seconds = idle_seconds(spans, ph.setup_seconds, st.stream_end_seconds);
    }
  }
  measure.streamed = st.planned_streamed;
  if (st.tail_moved > 0) {
    // the refinement compares the phase with the simulation of what ran: the plan as bound
    measure.streamed = std::size_t(std::count(plan.begin(), plan.end(), PlanSide::gpu_streamed));
    ph.sim = simulate_plan();
  }
  measure.cpu_adam_seconds = st.cpu_adam_seconds;
  // from the first submission, where the simulation starts: the plan's search alone took 0.7-1.0 ms
  // of a 4.4 ms phase of 55 small subgroups on the GPU machine, which counted as the links' time
  // would have lowered their rates
  measure.stream_end_seconds =
      st.stream_end_seconds > ph.setup_seconds ? st.stream_end_seconds - ph.setup_seconds : 0;  // 0: unknown
  measure.eager_writeback = opt.eager_writeback;
  const bool buffers_were_allocated = stream_buffers_allocated;  // before this phase
  if (!st.skipped && measure.streamed > 0) stream_buffers_allocated = true;  // choose_tail reads it
  st.params = nparams;
  for (std::size_t i = 0; i < sgs.size(); ++i) {
    const auto& sg = sgs[i];
    if (sg->step > st.step) st.step = sg->step;
    if (st.skipped) continue;
    const bool on_gpu = sg->ran_on.load() == 2;
    (on_gpu ? st.subgroups_gpu : st.subgroups_cpu) += 1;
    st.placement.push_back(!on_gpu ? PlanSide::cpu
                                   : (!plan.empty() && plan[i] == PlanSide::gpu_resident ? PlanSide::gpu_resident
                                                                                         : PlanSide::gpu_streamed));
  }
  // Forced plans are real measurements too. The refinement reads no bus counter (which the
  // timeline's sampler also reads), so it runs with a timeline as without; not after a phase opened
  // by begin_step (its clock starts with the caller's backward, and its busy times include what the
  // caller's work slowed down), nor after one left running into the caller's forward (the same), nor
  // after a skipped one.
  last_changed = st.overlapped && verdict == StepVerdict::changed;
  const bool first_streamed = measure.streamed > 0 && !buffers_were_allocated;
  const bool plain = !st.skipped && !st.overlapped && !ph.async;  // a phase run after backward
  // the adaptive copy rule counts such a phase too, but for the first that streams (staging.cpp)
  judge_downloads(ph, st, plain && !first_streamed);
  if (plain) st.refinement_held = refine(measure, ph.sim, first_streamed, st.seconds - ph.setup_seconds);
  StepStats out = std::move(st);
  open.reset();
  decide_next_plan_ahead();  // with the refined rates, while the caller computes the next gradients
  return out;
}

namespace {
/// Holds Impl::in_call for one call of step(), step_async() or begin_step(); throws UsageError when
/// another thread's call holds it (the phase's state is not made for two threads at once).
struct OneCaller {
  std::atomic<bool>& flag;
  OneCaller(std::atomic<bool>& f, const char* what) : flag(f) {
    if (flag.exchange(true))
      throw UsageError(std::string(what) + " was called while another thread's step() or begin_step() runs on this "
                  "optimizer: call it from one thread at a time");
  }
  ~OneCaller() { flag.store(false); }
};
}  // namespace

StepStats Optimizer::step() {
  OneCaller one(impl_->in_call, "step()");
  impl_->begin(false);
  return impl_->finish(StepVerdict::keep);
}
void Optimizer::begin_step() {
  OneCaller one(impl_->in_call, "begin_step()");
  impl_->begin(true);
}
void Optimizer::gradients_final(std::size_t begin, std::size_t end) { impl_->declare_final(begin, end); }
StepStats Optimizer::finish_step(StepVerdict verdict) { return impl_->finish(verdict); }
void Optimizer::finish_step_async(StepVerdict verdict) { impl_->finish_submit(verdict, true); }
void Optimizer::step_async() {
  OneCaller one(impl_->in_call, "step_async()");
  impl_->begin(false);
  impl_->finish_submit(StepVerdict::keep, true);
}
void Optimizer::wait_parameters(std::size_t begin, std::size_t end) { impl_->wait_parameters(begin, end); }
StepStats Optimizer::wait_step() { return impl_->finish_wait(); }
void Optimizer::wait_step_work() { impl_->wait_work(); }
bool Optimizer::step_open() const { return impl_->open != nullptr; }
bool Optimizer::step_running() const { return impl_->open && impl_->open->finishing; }

}  // namespace dos
