// Internal to the runtime (not installed): one subgroup of an Optimizer (Subgroup: a slice of the
// flat parameters with its host state, staging buffers, StarPU handles and what its task callbacks
// touch) and the phase-wide records those callbacks write (ParamsReady, Pending, TailWatch).
// Optimizer::Impl (optimizer_impl.h) owns them. Contract: StarPU's callbacks touch a Subgroup only
// through its atomics, its window, its timeline and its busy sums; ParamsReady, Pending and
// TailWatch lock their own mutex and may be called from any thread.
#pragma once

#include <starpu.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "../codelets/codelets.h"
#include "../scheduler/policy.h"
#include "admission.h"
#include "dos.h"
#include "host_memory.h"

namespace dos::detail {

struct Subgroup {
  std::size_t begin = 0, size = 0;
  std::int64_t step = 0;
  // The Adam state in one host buffer of 3 * stride fp32 elements under one StarPU handle (the
  // layout of codelets.h: master parameters, exp_avg, exp_avg_sq, each `size` long, `stride` apart),
  // so that a streamed subgroup's state moves in one transfer each way.
  std::size_t stride = 0;
  HostBuffer state;
  HostBuffer grad32, param16;  // host staging of the fp32 gradient and the new parameters
  starpu_data_handle_t h_state = nullptr;
  starpu_data_handle_t h_grad32 = nullptr, h_param16 = nullptr;
  // The shadow state of speculative updates (Optimizer::gradients_final): where adam_into_cl writes
  // the new state, swapped with the state above when the update is kept. Allocated at the
  // subgroup's first speculative update.
  HostBuffer sh_state;
  starpu_data_handle_t sh_h_state = nullptr;
  /// The host copy of the master parameters, exp_avg and exp_avg_sq (size fp32 elements each;
  /// valid on the host only while h_state is acquired there or no task holds it elsewhere).
  /// In a compact state (OptimizerOptions::compact_master) master() holds no master (its slot holds
  /// the unused start of the buffer and then the compact head): the masters are rebuilt from the
  /// caller's parameters (Impl::compact_masters).
  float* master() const { return state.ptr; }
  /// A compact state's first element (its head: lo, then the r bits' words; codelets.h's compact
  /// layout), compact_head_floats(stride) elements before exp_avg(): where the handle h_state starts
  /// in that form, covering compact_head_floats(stride) + 2 stride fp32 elements.
  float* compact_base() const { return state.ptr + stride - compact_head_floats(stride); }
  float* exp_avg() const { return state.ptr + stride; }
  float* exp_avg_sq() const { return state.ptr + 2 * stride; }
  std::atomic<bool> spec_ended{false};  // the speculative Adam task of the open step has ended
  // The caller's parameters of this subgroup hold the open step's result (its parameter write-back,
  // or its direct-path Adam, has ended; Optimizer::wait_parameters waits for it).
  std::atomic<bool> params_written{false};
  struct ParamsReady* ready = nullptr;
  std::vector<Segment> segs;
  // For each segment: the caller tensor it lies in and its first element there (where
  // Optimizer::set_gradients finds the segment's gradient in the new buffers).
  std::vector<std::pair<std::size_t, std::size_t>> seg_src;
  GatherArgs gather_grads{}, gather_params{};
  GatherArgs gather_p16{};  // the caller's parameters copied as they are into h_param16 (compact master)
  // Compact master: h_param16's host copy holds the caller's current parameters (this subgroup's
  // last update ran on the CPU under a plan and wrote them there, and nothing has written them
  // since: the compact master's callers write their parameters only through the optimizer), so its
  // next CPU update brings no P down. Cleared by a direct-path update and by compact_masters.
  // Written by the thread submitting the subgroup's update.
  bool params_on_host = false;
  ScatterArgs scatter{};
  AdamArgs adam{};
  AdamDirectArgs adam_direct{};
  TaskHint hint_update{};  // the Adam task: the side the policy's plan names
  TaskHint hint_io{};      // conversion and write-back: wherever the caller's buffers are
  TaskHint hint_scatter{};  // the parameter write-back of an update phase: as hint_io, urgent
  std::atomic<int> ran_on{0};  // 1: CPU worker, 2: CUDA worker
  // Admission window (update budget): bytes this subgroup holds on the GPU in this phase, and the
  // pieces of work (parameter write-back task, state write-backs) still to end before it gives
  // them back.
  std::size_t footprint = 0;
  std::atomic<int> parts_left{0};
  AdmissionWindow* window = nullptr;
  struct Timeline* timeline = nullptr;
  // starpu_timing_now() (microseconds) when this subgroup's last Adam task ended, for the
  // timeline's write-back span (it starts there: the write-back waits for that task)
  std::atomic<double> adam_end_us{0};
  struct PhaseBusy* busy = nullptr;  // the optimizer's busy sums of the phase
  // Late binding of the plan's tail (OptimizerOptions::tail_subgroups): what the phase's binder
  // watches, and the side this subgroup's Adam counts on there (0: none, 1: CPU, 2: stream).
  struct TailWatch* tail = nullptr;
  std::atomic<int> tail_side{0};
  // The eager write-back of this subgroup's streamed state on the device-to-host link, for
  // DOS_COPY_BY=auto or adaptive (runtime_downloads_dodge_writebacks): 0 submitted, its Adam not ended on the GPU (an Adam
  // on the CPU leaves it there until the state is home); 1 its Adam ended on the GPU and the state
  // is on its way home (counted in *on_link); 2 none, or home. on_link: the optimizer's count of
  // such write-backs (Impl::state_writebacks_on_link). Speculative shadows' and end-of-phase
  // write-backs are not counted.
  std::atomic<int> writeback_link{2};
  std::atomic<int>* on_link = nullptr;

  Subgroup() = default;
  Subgroup(const Subgroup&) = delete;
  Subgroup& operator=(const Subgroup&) = delete;
  /// Unregisters the handles (the state comes home first) and frees the host buffers. The caller
  /// waits for every task touching them before (Optimizer::Impl's destructor does).
  ~Subgroup() {
    if (h_state) starpu_data_unregister(h_state);
    // scratch: nothing to bring home
    for (starpu_data_handle_t h : {h_grad32, h_param16, sh_h_state})
      if (h) starpu_data_unregister_no_coherency(h);
    for (HostBuffer* b : {&state, &grad32, &param16, &sh_state})
      if (b->ptr) free_host(*b);
  }
};

/// Counts outstanding asynchronous acquisitions and waits for them.
/// Wakes Optimizer::wait_parameters when a subgroup's parameters are written (Subgroup::params_written).
struct ParamsReady {
  std::mutex mu;
  std::condition_variable cv;
  double last_us = 0;  // starpu_timing_now() of the last mark of the phase
  /// From a task's callback: the subgroup's parameters are written.
  void mark(std::atomic<bool>& written) {
    const double now = starpu_timing_now();
    {
      std::lock_guard<std::mutex> g(mu);
      written.store(true);
      if (now > last_us) last_us = now;
    }
    cv.notify_all();
  }
};

struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  int n = 0;
  double last_done_us = 0;  // starpu_timing_now() when the last acquisition ended
  double last_subgroup_part_us = 0;  // starpu_timing_now() of the last write-back that ended a subgroup's part
  void subgroup_part_ended() {
    const double now = starpu_timing_now();
    std::lock_guard<std::mutex> l(mu);
    if (now > last_subgroup_part_us) last_subgroup_part_us = now;
  }
  void add() {
    std::lock_guard<std::mutex> l(mu);
    ++n;
  }
  void done() {
    const double now = starpu_timing_now();
    std::lock_guard<std::mutex> l(mu);
    if (now > last_done_us) last_done_us = now;
    if (--n == 0) cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return n == 0; });
  }
};

/// What the late binding of a plan's tail watches while the phase runs (OptimizerOptions::
/// tail_subgroups, models/tail_binding.h): each side's parameters submitted whose Adam has not
/// ended, and the pace each side kept. The Adam tasks' callbacks write it (adam_ended), the
/// phase's binder thread reads it. Times: starpu_timing_now()'s microseconds.
struct TailWatch {
  std::mutex mu;
  std::condition_variable cv;
  double t0_us = 0;                       // the phase's start
  double cpu_out = 0, stream_out = 0;     // parameters submitted to each side, Adam not ended
  double cpu_seconds = 0, cpu_params = 0;  // the CPU Adam tasks ended: busy seconds, parameters
  double cpu_last_end_us = 0;
  // the stream's Adam ends: the first, the last, and the parameters of those after the first
  double stream_first_end_us = 0, stream_last_end_us = 0, stream_params_after_first = 0;
  bool stop = false;  // the phase is being torn down: the binder gives up
  /// n parameters given to one side (cpu, else the stream).
  void submitted(bool cpu, double n) {
    std::lock_guard<std::mutex> g(mu);
    (cpu ? cpu_out : stream_out) += n;
  }
  /// The Adam of n parameters given to one side ran from start_us to end_us.
  void adam_ended(bool cpu, double n, double start_us, double end_us) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (cpu) {
        cpu_out -= n;
        cpu_seconds += 1e-6 * (end_us - start_us);
        cpu_params += n;
        if (end_us > cpu_last_end_us) cpu_last_end_us = end_us;
      } else {
        stream_out -= n;
        if (stream_first_end_us == 0) {
          stream_first_end_us = end_us;
        } else {
          stream_params_after_first += n;
        }
        if (end_us > stream_last_end_us) stream_last_end_us = end_us;
      }
    }
    cv.notify_all();
  }
};

}  // namespace dos::detail
