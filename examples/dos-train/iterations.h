// dos-train's training iterations: each one's forward and backward (emulated), this rank's
// gradients, the gradient check (--max-grad-norm), the update, the updated parameters to every
// rank, and its line and row (IterationLog); with --overlap on, the update overlapped with backward
// and, in one process with the emulated compute, with the next forward. And --sweep: the iterations
// once per streamed fraction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "compute_emulator.h"
#include "dos.h"
#include "report.h"
#include "step_io.h"

namespace dos_train {

/// For each group of backward (compute_emulator.h, backward_group: the layers, then the head, then
/// the embeddings), the shard-local element ranges [first, second) whose gradients that group's
/// backward makes final.
using GroupRanges = std::vector<std::vector<std::pair<std::size_t, std::size_t>>>;

/// Runs the iterations of one rank, numbered across resumes and sweep entries (the emulated
/// gradients depend on the number).
class TrainingLoop {
 public:
  /// What the iterations work on, kept, not owned. opt, io, log: the rank's optimizer, its gradients
  /// and broadcast, its lines and rows; compute: the forward and backward emulator, null without
  /// --emulate-compute; release: the ranges each backward group makes final (one entry per group of
  /// compute_emulator.h's forward_gemms); n: this shard's parameters; overlap: --overlap resolved
  /// (Checked::overlap); max_grad_norm: --max-grad-norm (0: no gradient check); first_iteration:
  /// the iteration the run goes on from (0, or the checkpoint's with --resume).
  struct Setup {
    dos::Optimizer* opt = nullptr;
    StepIO* io = nullptr;
    IterationLog* log = nullptr;
    ComputeEmulator* compute = nullptr;
    GroupRanges release;
    std::size_t n = 0;
    bool overlap = false;
    double max_grad_norm = 0;
    std::int64_t first_iteration = 0;
  };
  /// Throws nothing.
  explicit TrainingLoop(Setup s);
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// Runs `count` training iterations, each: forward and backward (emulated), this rank's gradients
  /// (with --overlap on, each group's written and declared final as its backward ends), the gradient
  /// check (--max-grad-norm: a non-finite norm skips the update, a norm above it clips the
  /// gradients), the update, the updated parameters to every rank, its line and row (`label` after
  /// the iteration's number: " [0.5]" in a sweep). Returns their update figures, in order; the
  /// last iteration's phase has ended when it returns. Collective under MPI. Throws what the
  /// optimizer, StepIO and the emulator throw (std::runtime_error, dos::Error).
  std::vector<dos::StepStats> run(int count, const std::string& label);

  /// The number of the last iteration run (first_iteration before any).
  std::int64_t iteration() const { return it_; }

 private:
  using clock = std::chrono::steady_clock;
  /// Forward and backward of the current iteration (started at t_iter) and its gradients, by
  /// backward's groups where they can be (StepIO::by_range); adds the seconds spent in collectives
  /// to *comm_seconds. With the update overlapping forward, closes the previous iteration's phase
  /// once forward has ended and opens this one's.
  ComputeTimes gradients(clock::time_point t_iter, double* comm_seconds);
  /// The gradient check (--max-grad-norm) after backward: the norm, and the clipping done; *verdict
  /// becomes skip (a non-finite norm) or changed (clipped), else stays keep.
  GradientCheck check_gradients(dos::StepVerdict* verdict);
  /// The update of the current iteration, once its gradients are final: the phase finished
  /// (--overlap on), skipped, or run whole.
  dos::StepStats update(dos::StepVerdict verdict);
  /// Waits for the updated parameters of backward group g (the update overlapping forward).
  void wait_group(std::size_t g);
  /// Writes and declares final the gradients of backward group g.
  void release_group(std::size_t g);
  /// Closes the open iteration's phase (Optimizer::wait_step), its time running to t_next, and
  /// records it.
  void close_running(clock::time_point t_next);

  Setup s_;
  std::int64_t it_;
  /// With --overlap on, an emulated backward and one process, the update overlaps the next forward
  /// too (overlap_forward_): the phase is finished with finish_step_async, each layer's forward
  /// waits only for that layer's parameters (wait_parameters; the embeddings before the first
  /// layer), and the phase is closed (wait_step) once forward has ended, before the next
  /// begin_step. An iteration's line then comes at the next iteration's backward, and its time runs
  /// to the start of the next iteration (the last iteration of a run waits for its phase: nothing
  /// follows it).
  bool overlap_forward_;
  std::vector<std::size_t> backward_order_;  ///< head, layers from the last, embeddings
  struct Running {  // an iteration whose phase still runs (finish_step_async)
    bool open = false;
    std::int64_t it = 0;
    ComputeTimes ct;
    GradientCheck gc;
    clock::time_point t_iter;
  } running_;
  std::string label_;                  ///< the label of the run in progress
  std::vector<dos::StepStats> steps_;  ///< the update figures of the run in progress
};

/// --sweep: for each entry ("model", or a streamed fraction in [0, 1] such as "0.5" or "1/3"), the
/// plan overridden accordingly on `opt` (the optimizer `loop` runs) and `iterations` iterations run
/// with the entry as their label; then the table printed (print_sweep: n, this shard's parameters).
/// Returns the report's "sweep" array. Throws std::runtime_error for an entry that is not a number
/// or a fraction, and what TrainingLoop::run throws.
nlohmann::ordered_json run_sweep(TrainingLoop& loop, dos::Optimizer& opt, const std::vector<std::string>& entries,
                                 int iterations, std::size_t n);

}  // namespace dos_train
