// What an update phase measures of itself: the bytes StarPU moved over the PCIe buses
// (read_bus_bytes), the phase's tasks for its timeline (Timeline), and the seconds its tasks kept the
// workers busy (PhaseBusy). Contract: all three are thread-safe (StarPU's callback threads, the
// timeline's sampling thread and the caller's thread use them at once); read_bus_bytes needs StarPU
// running. Internal to the runtime (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "../codelets/task_clock.h"
#include "dos.h"

namespace dos::detail {

/// Bytes moved from host memory to a GPU (h2d) and back (d2h) since StarPU started, over every bus.
/// StarPU (1.3.10) counts a transfer's bytes in its bus profiling when it issues the copy, not
/// when the copy ends: a phase's total holds every transfer it issued (it waits for them all), but
/// a sample taken during the phase runs ahead of what the links have carried.
void read_bus_bytes(std::uint64_t* h2d, std::uint64_t* d2h);
/// Adds bytes the runtime copied itself, outside StarPU (CopyStream), to the totals
/// read_bus_bytes gives, once the copy has ended (unlike StarPU, which counts at the issue).
void add_bus_bytes(std::uint64_t h2d, std::uint64_t d2h);

/// Tasks of a phase, from the task clock (task_clock.h), when a timeline is asked for.
struct Timeline {
  std::mutex mu;
  double t0_us = 0;  // starpu_timing_now() when the phase began: the task clock's clock
  std::vector<TimelineTask> tasks;
  void record(const char* what, std::size_t subgroup, const task_clock::Span& span) {
    auto secs = [&](double us) { return 1e-6 * (us - t0_us); };
    std::lock_guard<std::mutex> g(mu);
    tasks.push_back(TimelineTask{span.gpu ? "gpu" : "cpu", what, subgroup, secs(span.start_us), secs(span.end_us)});
  }
  /// A piece of work that is no worker's task (the runtime's own copies): its lane, kind,
  /// subgroup, and start and end on the task clock's clock (starpu_timing_now(), microseconds).
  void record_span(const char* lane, const char* what, std::size_t subgroup, double start_us, double end_us) {
    std::lock_guard<std::mutex> g(mu);
    tasks.push_back(TimelineTask{lane, what, subgroup, 1e-6 * (start_us - t0_us), 1e-6 * (end_us - t0_us)});
  }
};

/// One CPU Adam task of a phase: when it ran (starpu_timing_now(), microseconds) and on how many
/// parameters.
struct AdamSpan {
  double start_us = 0, end_us = 0;
  std::size_t params = 0;
};

/// Seconds one optimizer's tasks kept the workers busy during a phase, summed over workers: every
/// task on CPU workers, every task on CUDA workers, and the CPU Adam tasks alone (what the rates'
/// refinement and calibration compare with the model, which counts only Adam on the CPU), with each
/// CPU Adam task's span (the refinement's measure of U_c: the tasks that ran after the streaming).
struct PhaseBusy {
  std::mutex mu;
  double cpu = 0, gpu = 0, cpu_adam = 0;
  std::vector<AdamSpan> cpu_adam_spans;
  /// Zeroes the sums and makes room for `subgroups` spans, so that the task callbacks never
  /// allocate (a bad_alloc there would cross StarPU's C code). Throws std::bad_alloc.
  void reset(std::size_t subgroups) {
    std::lock_guard<std::mutex> g(mu);
    cpu = gpu = cpu_adam = 0;
    cpu_adam_spans.clear();
    cpu_adam_spans.reserve(subgroups);
  }
};

}  // namespace dos::detail
