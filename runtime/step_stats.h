// What an update phase did: StepStats (Optimizer::step's result) and its timeline's samples.
// Part of the public C++ API: runtime/dos.h includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phase_sim.h"

namespace dos {

/// One task or transfer sample of an update phase, for timelines. lane: "cpu" or "gpu" (an Adam,
/// gradient conversion or parameter write-back task on that kind of worker), "h2d" (a CPU-updated
/// subgroup's parameter write-back copied by the runtime itself, on a CUDA stream of its own, when
/// the caller's parameters are on the GPU: runtime_uploads_params) or "d2h" (a CPU-updated
/// subgroup's gradients copied down by the runtime itself: runtime_downloads_grads) or "writeback"
/// (a streamed subgroup's eager state write-back in the phase, not a speculative update's write-back
/// into its shadow state, from the end of the Adam that wrote the state to
/// the state being home: its wait behind other transfers on StarPU's device-to-host stream
/// included, so these spans may overlap; of zero length at its end when it ended before the Adam's
/// own callback ran, as a tiny one can); what: "adam", "adam_spec" (a speculative Adam,
/// Optimizer::gradients_final), "gather", "scatter" or "state" (lane "writeback"); subgroup:
/// its index; start, end: seconds since the phase began
/// (the runtime's own task clock, codelets/task_clock.h; StarPU's task profiling stays off).
struct TimelineTask {
  std::string lane, what;
  std::size_t subgroup = 0;
  double start = 0, end = 0;
};
/// Bytes moved over PCIe, each way, since the phase began, sampled every millisecond from the
/// phase's start until the call that waits for its end (step(), finish_step, or wait_step after
/// step_async / finish_step_async, which may come long after the phase ended), then once more
/// there (StarPU's bus counters; so a timeline's phase has at least one sample, the last one its
/// totals); t: seconds since the phase began.
struct BusSample {
  double t = 0;
  std::uint64_t h2d = 0, d2h = 0;
};

/// What one update phase did.
/// seconds: wall time of step(); params: elements updated; subgroups_cpu / subgroups_gpu: Adam
/// tasks that ran on a CPU / CUDA worker; bytes_h2d / bytes_d2h: bytes StarPU moved host->device /
/// device->host during the phase (its per-bus counters); step: the largest subgroup step count;
/// cpu_busy_seconds / gpu_busy_seconds: time the CPU / CUDA workers spent executing tasks during the
/// phase, summed over workers (the runtime's task clock, codelets/task_clock.h; for a CUDA worker,
/// from launch, or the end of the task before it on the stream, to completion of its asynchronous
/// tasks).
struct StepStats {
  double seconds = 0;
  std::size_t params = 0;
  std::size_t subgroups_cpu = 0;
  std::size_t subgroups_gpu = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2h = 0;
  std::int64_t step = 0;
  double cpu_busy_seconds = 0;
  double gpu_busy_seconds = 0;
  /// Of cpu_busy_seconds, the CPU Adam tasks alone, seconds (without the staging and write-back
  /// tasks that run on CPU workers when the caller's buffers are in host memory).
  double cpu_adam_seconds = 0;
  /// The plan of this phase: subgroups planned on the GPU (streamed or resident), and for the
  /// project's policies with a model (dos, static:R), the predicted time and the lower bound
  /// (models/resource_model.h), seconds; 0 where there is no model. predicted_seconds is what the
  /// phase's start spent before its first submission (deciding the plan: plan_seconds, simulating
  /// it, the bound) plus the phase simulation's total from there.
  std::size_t planned_streamed = 0;
  std::size_t planned_resident = 0;
  double predicted_seconds = 0;
  double lower_bound_seconds = 0;
  /// The resource the phase simulation of this phase's plan found busiest, as
  /// Simulation::busiest names it (models/phase_sim.h): "cpu", "h2d", "d2h" or "gpu"; empty where
  /// there is no model (a StarPU policy, a plan without the model's rates, no CUDA worker).
  std::string bound_by;
  /// Per subgroup, the side the plan gave it (empty under a StarPU policy, which decides alone).
  std::vector<PlanSide> plan;
  /// Per subgroup, the kind of worker its Adam task ran on (PlanSide::cpu or gpu_streamed, or
  /// gpu_resident where the plan kept it resident), as the task's executing worker reported it.
  std::vector<PlanSide> placement;
  /// When the phase began (begin_step, or step() / step_async()), seconds on the runtime's clock
  /// (clock_seconds()): TimelineTask::start and end count from it.
  double started_at = 0;
  /// Filled only when Optimizer::set_timeline(true): every task of the phase, and the bus samples.
  std::vector<TimelineTask> timeline;
  std::vector<BusSample> bus;
  /// Bytes StarPU had allocated on the GPU (all GPUs) when the phase ended, and the most the
  /// admission window held at once (0 without a GPU update budget).
  std::uint64_t gpu_bytes_end = 0;
  std::uint64_t window_peak_bytes = 0;
  /// Whether the phase submitted its CPU subgroups first (OptimizerOptions::submit_order and the
  /// budget allowed it), and when, in seconds since the phase began, the last streamed subgroup's
  /// state was back in host memory (0: nothing streamed): the end of the streaming, which the rates'
  /// refinement divides the PCIe bytes by (less the phase's set-up before its first submission,
  /// where the phase simulation starts).
  bool cpu_first = false;
  double stream_end_seconds = 0;
  /// Seconds between the phase's first submission (after its set-up) and stream_end_seconds in
  /// which no CPU Adam task ran (models/refinement.h, idle_seconds; several CPU workers' tasks
  /// counted as one union): the CPU waiting for its gradients, or done before the streams. The
  /// phase simulation's counterpart is Simulation::cpu_idle_before_stream_end. 0 when nothing
  /// streamed, the stream end is unknown or not after the set-up, and for a phase opened by
  /// begin_step or submitted by step_async (its clock starts with the caller's work, and its
  /// speculative CPU Adams are not counted as Adams).
  double cpu_adam_idle_before_stream_end_seconds = 0;
  /// Whether the rates' refinement held this phase as an outlier (models/refinement.h,
  /// hold_outlier_phase: its measured / predicted ratio more than 1.3x off the last phase's, under
  /// the same plan, after two phases whose ratios were within 1.15x of each other): nothing was
  /// refined from it. false for a phase refined, or not refined for another reason. The prediction
  /// judged is the simulation of the plan as it ran (the plan, or the plan as bound when the tail
  /// binding moved subgroups: tail_moved > 0) against the phase's seconds from its first
  /// submission: predicted_seconds and seconds, both less the phase's set-up.
  bool refinement_held = false;
  /// The runtime's own gradient downloads by the copy engine (runtime_copy_by): the one that took
  /// longest from its issue to its end, seconds, and its bytes (0, 0: none went by the copy engine);
  /// downloads_dodge_writebacks: whether this phase's downloads issued while a streamed state was on
  /// its way home went by the kernel (runtime_downloads_dodge_writebacks when the phase began).
  double longest_download_seconds = 0;
  std::size_t longest_download_bytes = 0;
  bool downloads_dodge_writebacks = false;
  /// Seconds the phase's start spent on its plan, counted in `seconds`: the plan's decide() (the
  /// `dos` plan's search), or the wait for the decision made ahead of the phase (PlanNeeds::
  /// decided_ahead: started when the phase before ended); plan_decided_ahead: the phase took that
  /// decision, or one made for an equal input before, instead of deciding when it began. 0 and
  /// false for StarPU's policies, forced plans and runs without a CUDA worker.
  double plan_seconds = 0;
  bool plan_decided_ahead = false;
  /// Late binding (OptimizerOptions::tail_subgroups): subgroups whose side was decided while the
  /// phase ran, and of those, the ones given the other side than the plan's (`plan` keeps the plan's
  /// sides, `placement` says where each ran).
  std::size_t tail_bound = 0;
  std::size_t tail_moved = 0;
  /// Overlap (Optimizer::begin_step ... finish_step): whether the phase was opened by begin_step;
  /// exposed_seconds: wall time of finish_step (of step() for a plain step: about `seconds`), the
  /// part of the phase the caller waited for after its gradients were all final; `seconds` then
  /// runs from begin_step. speculated: subgroups updated speculatively (before finish_step, from
  /// gradients declared final); hidden_params: of their elements, those whose speculative update had
  /// ended when finish_step was called; redone: speculative updates redone (StepVerdict::changed);
  /// skipped: StepVerdict::skip (nothing updated: subgroups_cpu/gpu and placement are empty).
  bool overlapped = false;
  double exposed_seconds = 0;
  std::size_t speculated = 0;
  std::size_t hidden_params = 0;
  std::size_t redone = 0;
  bool skipped = false;
};

}  // namespace dos
