// The update phase's own task clock: when each task started and ended on its worker, and how long
// each kind of worker was busy, without StarPU's task profiling.
//
// Why not StarPU's profiling: with it on, StarPU 1.3 (and 1.4 before 1.4.5) reads the GPU's energy
// counter through NVML around every CUDA task, inside the task's timed window, which costs
// milliseconds per task on some machines and also lengthens the times StarPU's history perfmodels
// learn. The runtime therefore leaves StarPU's profiling off and stamps the tasks itself:
//   - every codelet implementation calls begin() first (CPU and CUDA alike), and a CPU
//     implementation calls end_here() once its kernel has returned;
//   - the task's callback calls finish(): a CUDA task (STARPU_CUDA_ASYNC) ends when StarPU's CUDA
//     driver has seen its stream event complete and runs the callback, so the callback's time is
//     its end. A CUDA task launched while the one before it on the same worker was still running
//     (StarPU's CUDA pipeline) starts when that one ended: the same rule as StarPU's own profiling.
// Only tasks with a callback are stamped (a task without one never calls finish(), and its stamp
// would stay). Times are starpu_timing_now()'s clock, in microseconds. What the spans add up to
// (busy times per worker kind or per task kind) is the caller's to sum: the clock keeps no totals,
// so optimizers stepping at the same time in one process do not mix theirs.
#pragma once

#include <starpu.h>

namespace dos {
namespace task_clock {

/// One task's execution on a worker: StarPU worker id, whether it is a CUDA worker, and its start
/// and end in microseconds (starpu_timing_now()'s clock), end >= start.
struct Span {
  int worker = -1;
  bool gpu = false;
  double start_us = 0;
  double end_us = 0;
};

/// Stamps the start of the calling worker's current task (starpu_task_get_current()) when it has a
/// callback. Call first thing in a codelet implementation; does nothing outside a task. Thread-safe;
/// never throws (a failed allocation drops the stamp).
void begin() noexcept;

/// Stamps the end of the current task on a CPU worker: its kernel has returned. Call last thing in
/// a CPU codelet implementation. Thread-safe; never throws.
void end_here() noexcept;

/// Completes task t's record from its callback (StarPU runs the callback on the worker that ran
/// the task, once the task has ended): fills *out and forgets t. Returns false, with *out
/// untouched, when t was never stamped by begin(). Thread-safe.
bool finish(const struct starpu_task* t, Span* out) noexcept;

}  // namespace task_clock
}  // namespace dos
