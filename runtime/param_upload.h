// The parameter upload of CPU-updated subgroups: a copy engine of the runtime's own that moves a
// subgroup's new 16-bit parameters from their host staging buffer into the caller's GPU tensors.
//
// Why not a StarPU task: as a CUDA task (scatter_cl) the upload waits in the CUDA worker's queue
// behind every streamed subgroup's Adam submitted before it, and its input then waits on StarPU's
// one host-to-device transfer stream behind the streamed state already requested there (the
// lookahead's prefetches): on the 20B quarter every CPU subgroup's upload ran after the last
// streamed Adam, in a tail of about 85 ms with nothing else on the link. Here the upload is a
// cudaMemcpyAsync on a CUDA stream of its own, issued as soon as the CPU's Adam has written the
// staging buffer, beside the streaming.
//
// Contract: one ParamUploader per optimizer, used only in builds with CUDA (DOS_HAVE_CUDA; in
// others the constructor throws std::logic_error). enqueue() may be called from any thread,
// StarPU's callback threads included, and never blocks on a copy; the jobs run in FIFO order on a
// thread of the uploader's own, which sets the CUDA device of each job's first destination, issues
// its copies on the uploader's stream and waits for them (a blocking-sync event: the thread sleeps,
// it does not spin on a core). Each job's `done` runs on that thread once its copies have ended or
// failed, exactly once, also for jobs still queued when the uploader is destroyed (the destructor
// runs them all, then joins). The uploader never touches StarPU.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "../codelets/codelets.h"

struct CUstream_st;  // cudaStream_t and cudaEvent_t without CUDA's headers
struct CUevent_st;

namespace dos::detail {

class ParamUploader {
 public:
  /// What one upload did. start_us, end_us: starpu_timing_now()'s clock (microseconds) when its
  /// first copy was issued and when the last had ended; bytes: bytes copied host-to-device; error:
  /// empty, or what failed (the CUDA call and its message: the caller's tensors then hold an
  /// unknown mix of old and new values).
  struct Result {
    double start_us = 0, end_us = 0;
    std::size_t bytes = 0;
    std::string error;
  };
  /// One subgroup's upload: `host` holds the subgroup's new parameters in the caller's dtype
  /// (args->dtype), packed in subgroup order; segment s's args->segs[s].count elements go from
  /// host + segs[s].offset elements to segs[s].param (a device pointer). host and args must stay
  /// valid and unchanged until `done` has been called. `done` runs on the uploader's thread and
  /// must not throw (an exception there ends the process).
  struct Job {
    const ScatterArgs* args = nullptr;
    const void* host = nullptr;
    std::function<void(const Result&)> done;
  };

  /// Starts the uploader's thread (its CUDA stream is made on first use, on the first job's
  /// device). Throws std::logic_error in a build without CUDA, std::system_error when the thread
  /// cannot start.
  ParamUploader();
  /// Finishes every job queued (their `done` run), then stops the thread.
  ~ParamUploader();
  ParamUploader(const ParamUploader&) = delete;
  ParamUploader& operator=(const ParamUploader&) = delete;

  /// Queues j behind the jobs queued before it. Never blocks on a copy; throws std::bad_alloc only.
  void enqueue(Job j);

 private:
  void run();
  /// One job's copies on `stream` (made, with `done_event`, on the job's device when `device`
  /// differs), waited for; fills res.bytes and res.error.
  void upload(const Job& job, Result& res, CUstream_st*& stream, CUevent_st*& done_event, int& device);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace dos::detail
