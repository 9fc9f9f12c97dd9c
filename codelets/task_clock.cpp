// The update phase's own task clock (task_clock.h).
#include "task_clock.h"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace dos {
namespace task_clock {
namespace {

struct Stamp {
  int worker;
  double start_us;
  double end_us;  // 0 until end_here() (CPU) or finish() (CUDA)
};

std::mutex g_mu;
std::unordered_map<const struct starpu_task*, Stamp> g_stamps;
std::vector<double> g_last_end_us;  // per worker id: when its last finished task ended

}  // namespace

void begin() noexcept {
  const struct starpu_task* t = starpu_task_get_current();
  if (!t || !t->callback_func) return;
  const double now = starpu_timing_now();
  const int w = starpu_worker_get_id();
  try {
    std::lock_guard<std::mutex> g(g_mu);
    g_stamps[t] = Stamp{w, now, 0};
  } catch (...) {
  }
}

void end_here() noexcept {
  const struct starpu_task* t = starpu_task_get_current();
  if (!t) return;
  const double now = starpu_timing_now();
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_stamps.find(t);
  if (it != g_stamps.end()) it->second.end_us = now;
}

bool finish(const struct starpu_task* t, Span* out) noexcept {
  const double now = starpu_timing_now();
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_stamps.find(t);
  if (it == g_stamps.end()) return false;
  Stamp s = it->second;
  g_stamps.erase(it);
  const bool gpu = s.worker >= 0 && starpu_worker_get_type(s.worker) == STARPU_CUDA_WORKER;
  if (s.end_us == 0) s.end_us = now;
  if (s.worker >= 0) {
    try {
      if (g_last_end_us.size() <= std::size_t(s.worker)) g_last_end_us.resize(std::size_t(s.worker) + 1, 0.0);
    } catch (...) {
      return false;
    }
    double& last = g_last_end_us[std::size_t(s.worker)];
    // A pipelined CUDA task waited on the stream for the one launched before it.
    if (gpu && last > s.start_us) s.start_us = last < s.end_us ? last : s.end_us;
    if (s.end_us > last) last = s.end_us;
  }
  if (s.end_us < s.start_us) s.end_us = s.start_us;
  out->worker = s.worker;
  out->gpu = gpu;
  out->start_us = s.start_us;
  out->end_us = s.end_us;
  return true;
}

}  // namespace task_clock
}  // namespace dos
