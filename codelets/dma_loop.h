// PCIe copies in a loop between pinned host memory and the GPU, as a streamed subgroup's state
// moves, to measure what the links get while something else runs (CPU Adam sharing host memory).
// Used by the calibration (runtime/calibration.cpp, the links' share of host memory beside CPU
// Adam) and by dos-bench host. Compiled only in a build with CUDA (DOS_HAVE_CUDA).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <thread>

namespace dos {

/// cudaMemcpyAsync in a loop, host to device and device to host at once (dirs 3, full duplex) or
/// one of them (1: host to device, 2: device to host): one thread per direction that runs, both
/// bound to `core` (-1: left unbound), each keeping two copies of `chunk` bytes in flight on a
/// stream of its own and blocking on events, cycling through the first `span` bytes of its host
/// buffer (all of it when span is 0) from its start, until stopped. completed() counts the copies
/// done (every direction that runs), so that any interval's rate is the difference of two
/// readings. The host buffers are the caller's, pinned (cudaHostAlloc or cudaHostRegister), and
/// must outlive the loop; the device buffers (up_bytes and down_bytes) are the loop's own, on the
/// device current on the thread that calls start(), which the loop's threads then use too. A
/// failed CUDA call stops the loop and is kept (error()).
class DmaLoop {
 public:
  DmaLoop(void* up_host, std::size_t up_bytes, void* down_host, std::size_t down_bytes, std::size_t chunk, int core,
          std::size_t span = 0, int dirs = 3);
  DmaLoop(const DmaLoop&) = delete;
  DmaLoop& operator=(const DmaLoop&) = delete;
  ~DmaLoop() { finish(); }
  /// Allocates the device buffers and starts the threads; false (the error kept, as
  /// cudaErrorInvalidValue for a bad argument) when the device buffers cannot be allocated, chunk
  /// is 0 or larger than the host buffer of a direction that runs, dirs is not 1, 2 or 3, or the
  /// loop was started before.
  bool start();
  /// Copies completed so far, every direction that runs together.
  std::size_t completed() const { return done_.load(); }
  /// The directions that run (1 or 2).
  int directions() const { return (dirs_ & 1) + ((dirs_ >> 1) & 1); }
  /// Seconds on the steady clock (std::chrono::steady_clock, from its epoch): the clock to read
  /// rate()'s t0 and t1 on. Throws nothing.
  static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  /// Bytes per second per direction that runs (with both, the mean of the two) between two
  /// readings of completed() at t0 and t1 (seconds, t1 > t0; DmaLoop::now_s).
  double rate(std::size_t c0, double t0, std::size_t c1, double t1) const {
    return double(c1 - c0) / directions() * double(chunk_) / (t1 - t0);
  }
  /// Stops the threads (each finishes its copies in flight) and frees the device buffers.
  void finish();
  /// The first failed CUDA call's cudaError_t value; 0 when none failed.
  int error() const { return error_.load(); }
  /// error()'s text (cudaGetErrorString); "no error" when none failed.
  const char* error_string() const;

 private:
  bool ok(int e);
  void run(int d);
  void* up_host_;
  void* down_host_;
  std::size_t up_bytes_, down_bytes_, chunk_, span_;
  int core_, dirs_;
  int device_ = 0;
  bool started_ = false;
  void *dev_up_ = nullptr, *dev_down_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> done_{0};
  std::atomic<int> error_{0};
  std::thread th_[2];
};

/// What the links got beside some work: the loop's rate each way and the work's seconds.
struct DmaBeside {
  double bytes_per_s_each_way = 0;  ///< full-duplex copies completed over the work's seconds, bytes/s each way
  double seconds = 0;               ///< the work's wall-clock seconds
  int error = 0;                    ///< a failed CUDA call's cudaError_t (then the rate is 0); 0 when none
};

/// Runs `work` on the calling thread while a DmaLoop copies `chunk` bytes both ways at once
/// (buffers of 4 x chunk of pinned host memory, cudaHostAlloc, and as much device memory on the
/// current device), its threads bound to `core` (-1: unbound), started 50 ms before the work so
/// that its copies are flowing. Returns the copies completed during the work over its seconds
/// (each way), within one chunk per direction of the truth at either end. An exception from `work`
/// is passed on after the loop stopped and the buffers were freed; a failed CUDA call (allocation
/// included) is returned in DmaBeside::error, and then `work` has not run if the loop could not
/// start.
DmaBeside dma_rate_beside(std::size_t chunk, int core, const std::function<void()>& work);

}  // namespace dos
