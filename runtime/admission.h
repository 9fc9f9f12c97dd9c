// The GPU update budget as an admission window (OptimizerOptions::gpu_update_budget): a subgroup
// takes its GPU footprint (bytes) before its tasks are submitted, or when its state is prefetched,
// and gives it back when its last piece of work ends. Header-only, no StarPU: tests/test_admission.cpp.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace dos {

/// Bytes held on the GPU by the subgroups in flight, against a limit. Thread-safe: the submitting
/// thread takes, StarPU's callback threads give back.
struct AdmissionWindow {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t used = 0;   // bytes held now
  std::size_t limit = 0;  // bytes; 0: no limit
  std::size_t peak = 0;   // the most held at once since reset()

  /// Empties the window and sets its limit (bytes; 0: no limit).
  void reset(std::size_t l) {
    std::lock_guard<std::mutex> g(mu);
    used = peak = 0;
    limit = l;
  }
  /// Whether b more bytes fit now. With nothing held anything fits, so that a subgroup larger than
  /// the limit still runs (alone) and take() never waits for ever.
  bool fits(std::size_t b) const { return limit == 0 || used == 0 || used + b <= limit; }
  /// Takes b bytes if b + headroom fit now (headroom is left free, not taken: the room the
  /// subgroup being submitted will need); returns whether it did. Used for prefetches, which must
  /// never fill the window with subgroups not yet submitted.
  bool try_take(std::size_t b, std::size_t headroom) {
    std::lock_guard<std::mutex> g(mu);
    if (limit != 0 && used + b + headroom > limit) return false;
    used += b;
    peak = std::max(peak, used);
    return true;
  }
  /// Takes b bytes, waiting until they fit (other subgroups give theirs back).
  void take(std::size_t b) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return fits(b); });
    used += b;
    peak = std::max(peak, used);
  }
  /// Gives back b bytes taken before, and wakes the waiting take().
  void give(std::size_t b) {
    std::lock_guard<std::mutex> g(mu);
    used -= std::min(b, used);
    cv.notify_all();
  }
};

}  // namespace dos
