// The runtime's own copies between the caller's GPU tensors and host staging (copy_stream.h).
#include "copy_stream.h"

#include <starpu.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../codelets/kernels/env_choice.h"
#include "dos.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>

#include "../codelets/kernels/pcie_copy.h"
#endif

namespace dos::detail {

#if defined(DOS_HAVE_CUDA)

// StarPU 1.3's CUDA driver (src/drivers/cuda/driver_cuda.c), exported but not in its public
// headers: the stream its device-to-host copies from that memory node go on. Weak: null where the
// StarPU linked at run time lacks it.
extern "C" cudaStream_t starpu_cuda_get_out_transfer_stream(unsigned src_node) __attribute__((weak));

namespace {
/// pcie_copy_cuda's grid: DOS_COPY_BLOCKS (a measurement switch: a whole number 1..65535), else 0
/// (one block per multiprocessor); any other value is ignored, with a warning on stderr.
unsigned kernel_blocks() {
  static const unsigned blocks = unsigned(env_whole("DOS_COPY_BLOCKS", 1, 65535, 0, "one block per multiprocessor"));
  return blocks;
}
/// Under DOS_COPY_BY=auto, the streamed states on their way home (Job::engine_busy) from which a
/// gradient download goes by the kernel: DOS_AUTO_WRITEBACKS (a measurement switch: a whole number
/// 1..64), else 1; any other value is ignored, with a warning on stderr.
int auto_writebacks() {
  static const int least = int(env_whole("DOS_AUTO_WRITEBACKS", 1, 64, 1, "1"));
  return least;
}
/// StarPU's device-to-host transfer stream of CUDA device `dev` under DOS_DOWNLOAD_STREAM=starpu
/// (read once), else nullptr; nullptr as well, with a warning on stderr (once), where StarPU exports
/// no such function (it is not in StarPU's public headers: declared weak above) or runs no CUDA
/// worker on `dev`.
cudaStream_t starpu_download_stream(int dev) {
  static const bool on = env_choice("DOS_DOWNLOAD_STREAM", {"own", "starpu"}, 0, "own is used") == 1;
  if (!on) return nullptr;
  const bool exported = &starpu_cuda_get_out_transfer_stream != nullptr;
  const unsigned n = exported ? starpu_worker_get_count() : 0;
  for (unsigned w = 0; w < n; ++w)
    if (starpu_worker_get_type(int(w)) == STARPU_CUDA_WORKER && starpu_worker_get_devid(int(w)) == dev)
      return starpu_cuda_get_out_transfer_stream(starpu_worker_get_memory_node(w));
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr, "[dos] warning: DOS_DOWNLOAD_STREAM=starpu: %s; the runtime's own stream is used\n",
                 exported ? "StarPU runs no CUDA worker on the gradients' device"
                          : "this StarPU exports no starpu_cuda_get_out_transfer_stream");
  return nullptr;
}
/// Empty when r is cudaSuccess, else "<what>: <CUDA's message>".
std::string cuda_error(cudaError_t r, const char* what) {
  return r == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(r);
}
/// Whether the thread takes every queued job at once (true unless DOS_COPY_BATCH=0: a measurement
/// switch that takes one job at a time and sleeps on its event at once, the earlier way).
bool batches_jobs() {
  static const bool one_at_a_time = detail::env_choice("DOS_COPY_BATCH", {"0", "1"}, 1, "1 is used") == 0;
  return !one_at_a_time;
}
}  // namespace

CopyStream::CopyStream() { thread_ = std::thread([this] { run(); }); }

CopyStream::~CopyStream() {
  {
    std::lock_guard<std::mutex> g(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CopyStream::enqueue(Job j) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void CopyStream::run() {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;  // one per job issued and not yet waited for, on `device`
  int device = -1;                  // the device the stream and events belong to
  for (;;) {
    std::deque<Job> batch;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return closing_ || !jobs_.empty(); });
      if (jobs_.empty()) break;  // closing, every job done
      // the first job queued, and behind it, while the batch stays within kBatchBytes, the next
      // ones (small copies: one wake-up for many; a large copy goes alone, as the copies of large
      // subgroups issued back to back measured slower beside the CPU's Adam)
      std::size_t bytes = 0;
      do {
        bytes += job_bytes(jobs_.front());
        batch.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      } while (batches_jobs() && !jobs_.empty() && bytes + job_bytes(jobs_.front()) <= kBatchBytes);
    }
    std::vector<Result> res(batch.size());
    std::vector<char> has_event(batch.size(), 0);
    std::vector<cudaStream_t> went_on(batch.size(), nullptr);  // the stream each job's copies went on
    std::size_t first = 0;  // jobs [first, k) are issued and not yet waited for
    // waits for jobs [first, k) in order and runs their `done`; job j's span starts when it was
    // issued or, when an earlier job of [first, j) went on the same stream (which runs them one
    // after the other), when the latest such job ended, whichever is later (a job that was not
    // issued went on no stream and holds back no other's span)
    auto finish = [&](std::size_t k) {
      for (std::size_t j = first; j < k; ++j) {
        if (has_event[j]) {
          std::string e = wait_event(events[j - first]);
          if (res[j].error.empty()) res[j].error = std::move(e);
        }
        res[j].end_us = starpu_timing_now();
        for (std::size_t i = j; went_on[j] && i-- > first;)
          if (went_on[i] == went_on[j]) {
            if (res[j].start_us < res[i].end_us) res[j].start_us = res[i].end_us;
            break;
          }
        if (!res[j].error.empty()) res[j].bytes = 0;
        batch[j].done(res[j]);
      }
      first = k;
    };
    for (std::size_t k = 0; k < batch.size(); ++k) {
      res[k].start_us = starpu_timing_now();
      try {
        const int dev = job_device(batch[k], res[k].error);
        if (dev >= 0 && dev != device) {  // another device: what was issued on this one ends first
          finish(k);
          res[k].start_us = starpu_timing_now();
          for (cudaEvent_t ev : events) cudaEventDestroy(ev);
          events.clear();
          if (stream) cudaStreamDestroy(stream), stream = nullptr;
          device = -1;
          res[k].error = cuda_error(cudaSetDevice(dev), "cudaSetDevice");
          if (res[k].error.empty())
            res[k].error = cuda_error(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
          if (res[k].error.empty()) device = dev;
        }
        if (dev >= 0 && device == dev) {  // issued, also after a failed issue (what went out is waited for)
          cudaStream_t used = issue(batch[k], res[k], stream);
          went_on[k] = used;
          const std::size_t slot = k - first;  // events[slot] is job k's (a job not issued leaves its slot unused)
          while (events.size() <= slot) {
            cudaEvent_t ev = nullptr;
            std::string e = cuda_error(cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming),
                                       "cudaEventCreate");
            if (!e.empty()) {
              if (res[k].error.empty()) res[k].error = std::move(e);
              break;
            }
            events.push_back(ev);
          }
          if (events.size() > slot) {
            std::string e = cuda_error(cudaEventRecord(events[slot], used), "cudaEventRecord");
            if (e.empty()) has_event[k] = 1;
            else if (res[k].error.empty()) res[k].error = std::move(e);
          }
          if (!has_event[k] && res[k].error.empty()) res[k].error = "no event to wait for the copy";
          if (!has_event[k]) cudaStreamSynchronize(used);  // nothing of it may still run after its done
        }
      } catch (const std::exception& e) {  // std::bad_alloc while building a message
        if (res[k].error.empty()) res[k].error = e.what();
      }
    }
    finish(batch.size());
  }
  for (cudaEvent_t ev : events) cudaEventDestroy(ev);
  if (stream) cudaStreamDestroy(stream);
}

std::string CopyStream::wait_event(cudaEvent_t ev) {
  // a short poll first: a small copy ends within microseconds, sooner than the thread would wake
  // from a blocking wait; a large one then sleeps (the thread does not hold a core for it)
  const double until = starpu_timing_now() + kPollUs;
  for (;;) {
    const cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) return std::string();
    if (q != cudaErrorNotReady) return cuda_error(q, "waiting for a copy");
    if (!batches_jobs() || starpu_timing_now() >= until) break;
  }
  return cuda_error(cudaEventSynchronize(ev), "waiting for a copy");
}

std::size_t CopyStream::job_bytes(const Job& job) {
  std::size_t n = 0;
  for (std::size_t s = 0; s < job.nseg; ++s) n += job.segs[s].count * job.elem_bytes;
  return n;
}

int CopyStream::job_device(const Job& job, std::string& err) {
  if (job.nseg == 0) return -1;
  const bool up = job.dir == Direction::to_gpu;
  cudaPointerAttributes attr{};
  const bool params = up || job.params_down;
  err = cuda_error(cudaPointerGetAttributes(&attr, params ? job.segs[0].param : job.segs[0].grad),
                   params ? "cudaPointerGetAttributes of the parameters" : "cudaPointerGetAttributes of the gradients");
  if (err.empty() && attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    err = std::string("the caller's ") + (params ? "parameters" : "gradients") + " are not in GPU memory";
  return err.empty() ? attr.device : -1;
}

cudaStream_t CopyStream::issue(const Job& job, Result& res, cudaStream_t stream) {
  const bool up = job.dir == Direction::to_gpu;
  // the staging buffer as the device sees it: pinned memory is mapped; pageable memory (the
  // runtime could not pin it) is not, and goes by cudaMemcpyAsync
  char* host = static_cast<char*>(job.host);
  char* host_dev = nullptr;
  const bool by_engine = dos::runtime_copies_by_copy_engine(up) && !(job.engine_busy && job.engine_busy->load() >= auto_writebacks());
  if (!by_engine &&
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0) != cudaSuccess) {
    cudaGetLastError();  // not mapped: clear the error
    host_dev = nullptr;
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "[dos] warning: a host staging buffer is not pinned (no device pointer): its copies go by "
                           "cudaMemcpyAsync, which waits behind StarPU's transfers on the copy engine (slower, same bits)\n");
  }
  res.by_engine = !host_dev;  // by cudaMemcpyAsync: asked for, or the staging is not mapped
  if (!host_dev && !up) {
    int dev = -1;
    if (cudaGetDevice(&dev) == cudaSuccess)
      if (cudaStream_t s = starpu_download_stream(dev)) stream = s;
  }
  for (std::size_t s = 0; res.error.empty() && s < job.nseg; ++s) {
    const Segment& seg = job.segs[s];
    const std::size_t n = seg.count * job.elem_bytes;
    const std::size_t at = seg.offset * job.elem_bytes;
    cudaError_t r;
    if (host_dev)
      r = up ? cudaError_t(pcie_copy_cuda(seg.param, host_dev + at, n, true, kernel_blocks(), stream))
             : cudaError_t(pcie_copy_cuda(host_dev + at, job.params_down ? seg.param : seg.grad, n, false,
                                          kernel_blocks(), stream));
    else
      r = up ? cudaMemcpyAsync(seg.param, host + at, n, cudaMemcpyHostToDevice, stream)
             : cudaMemcpyAsync(host + at, job.params_down ? seg.param : seg.grad, n, cudaMemcpyDeviceToHost, stream);
    res.error = cuda_error(r, up                ? "copying the parameters to the GPU"
                              : job.params_down ? "copying the parameters to the host"
                                                : "copying the gradients to the host");
    if (res.error.empty()) res.bytes += n;
  }
  return stream;
}

#else  // no CUDA: no GPU to copy to or from

CopyStream::CopyStream() {
  throw std::logic_error("CopyStream needs a build with CUDA (DOS_HAVE_CUDA)");
}
CopyStream::~CopyStream() = default;
void CopyStream::enqueue(Job) { throw std::logic_error("CopyStream needs a build with CUDA"); }
void CopyStream::run() {}
std::string CopyStream::wait_event(CUevent_st*) { return std::string(); }
int CopyStream::job_device(const Job&, std::string&) { return -1; }
std::size_t CopyStream::job_bytes(const Job&) { return 0; }
CUstream_st* CopyStream::issue(const Job&, Result&, CUstream_st* stream) { return stream; }

#endif

bool download_starved(double seconds, std::size_t bytes, double b_d2h, double floor_seconds) noexcept {
  // a NaN fails every comparison: false, as for a rate that is not positive
  return b_d2h > 0 && seconds > floor_seconds && seconds > 10.0 * double(bytes) / b_d2h;
}

double download_starved_floor() {
  static const double floor =
      1e-3 * double(env_whole("DOS_STARVED_DOWNLOAD_MS", 0, 600000, 100, "100 ms"));
  return floor;
}

}  // namespace dos::detail
