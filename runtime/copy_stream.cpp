// The runtime's own copies between the caller's GPU tensors and host staging (copy_stream.h).
#include "copy_stream.h"

#include <starpu.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "switches.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>

#include "../codelets/kernels/pcie_copy.h"
#endif

namespace dos::detail {

#if defined(DOS_HAVE_CUDA)

namespace {
/// Whether copies go by pcie_copy_cuda (true unless DOS_COPY_BY=memcpy: a measurement switch).
bool copies_by_kernel() {
  static const bool memcpy = env_says("DOS_COPY_BY", "memcpy");
  return !memcpy;
}
/// pcie_copy_cuda's grid: DOS_COPY_BLOCKS (a measurement switch: a whole number 1..65535), else 0
/// (one block per multiprocessor); any other value is ignored, with a warning on stderr.
unsigned kernel_blocks() {
  static const unsigned blocks = [] {
    const char* v = std::getenv("DOS_COPY_BLOCKS");
    if (!v || !*v) return 0u;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 1 && n <= 65535) return unsigned(n);
    std::fprintf(stderr, "[dos] warning: DOS_COPY_BLOCKS='%s' is not a whole number from 1 to 65535: ignored "
                         "(one block per multiprocessor)\n", v);
    return 0u;
  }();
  return blocks;
}
/// Empty when r is cudaSuccess, else "<what>: <CUDA's message>".
std::string cuda_error(cudaError_t r, const char* what) {
  return r == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(r);
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
  cudaEvent_t done_event = nullptr;
  int device = -1;  // the device the stream and event belong to
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return closing_ || !jobs_.empty(); });
      if (jobs_.empty()) break;  // closing, every job done
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Result res;
    res.start_us = starpu_timing_now();
    try {
      copy(job, res, stream, done_event, device);
    } catch (const std::exception& e) {  // std::bad_alloc while building a message
      res.error = e.what();
    }
    res.end_us = starpu_timing_now();
    if (!res.error.empty()) res.bytes = 0;
    job.done(res);
  }
  if (done_event) cudaEventDestroy(done_event);
  if (stream) cudaStreamDestroy(stream);
}

void CopyStream::copy(const Job& job, Result& res, cudaStream_t& stream, cudaEvent_t& done_event, int& device) {
  const bool up = job.dir == Direction::to_gpu;
  auto gpu_ptr = [&](const Segment& seg) { return up ? seg.param : seg.grad; };
  std::string err;
  if (job.nseg > 0) {
    // the stream on the device of the caller's tensors (one device per optimizer in practice; a
    // job on another device gets a stream there)
    cudaPointerAttributes attr{};
    err = cuda_error(cudaPointerGetAttributes(&attr, gpu_ptr(job.segs[0])),
                     up ? "cudaPointerGetAttributes of the parameters" : "cudaPointerGetAttributes of the gradients");
    if (err.empty() && attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      err = std::string("the caller's ") + (up ? "parameters" : "gradients") + " are not in GPU memory";
    if (err.empty() && attr.device != device) {
      if (stream) cudaStreamDestroy(stream), stream = nullptr;
      if (done_event) cudaEventDestroy(done_event), done_event = nullptr;
      device = -1;
      err = cuda_error(cudaSetDevice(attr.device), "cudaSetDevice");
      if (err.empty()) err = cuda_error(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      if (err.empty())
        err = cuda_error(cudaEventCreateWithFlags(&done_event, cudaEventBlockingSync | cudaEventDisableTiming),
                         "cudaEventCreate");
      if (err.empty()) device = attr.device;
    }
  }
  // the staging buffer as the device sees it: pinned memory is mapped; pageable memory (the
  // runtime could not pin it) is not, and goes by cudaMemcpyAsync
  char* host = static_cast<char*>(job.host);
  char* host_dev = nullptr;
  if (err.empty() && job.nseg > 0 && copies_by_kernel() &&
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0) != cudaSuccess) {
    cudaGetLastError();  // not mapped: clear the error
    host_dev = nullptr;
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "[dos] warning: a host staging buffer is not pinned (no device pointer): its copies go by "
                           "cudaMemcpyAsync, which waits behind StarPU's transfers on the copy engine (slower, same bits)\n");
  }
  for (std::size_t s = 0; err.empty() && s < job.nseg; ++s) {
    const Segment& seg = job.segs[s];
    const std::size_t n = seg.count * job.elem_bytes;
    const std::size_t at = seg.offset * job.elem_bytes;
    cudaError_t r;
    if (host_dev)
      r = up ? cudaError_t(pcie_copy_cuda(seg.param, host_dev + at, n, true, kernel_blocks(), stream))
             : cudaError_t(pcie_copy_cuda(host_dev + at, seg.grad, n, false, kernel_blocks(), stream));
    else
      r = up ? cudaMemcpyAsync(seg.param, host + at, n, cudaMemcpyHostToDevice, stream)
             : cudaMemcpyAsync(host + at, seg.grad, n, cudaMemcpyDeviceToHost, stream);
    err = cuda_error(r, up ? "copying the parameters to the GPU" : "copying the gradients to the host");
    if (err.empty()) res.bytes += n;
  }
  if (job.nseg > 0 && device >= 0) {  // wait for what was issued, also after a failed issue
    std::string e = cuda_error(cudaEventRecord(done_event, stream), "cudaEventRecord");
    if (e.empty()) e = cuda_error(cudaEventSynchronize(done_event), up ? "waiting for the copy of the parameters" : "waiting for the copy of the gradients");
    if (err.empty()) err = e;
  }
  res.error = std::move(err);
}

#else  // no CUDA: no GPU to copy to or from

CopyStream::CopyStream() {
  throw std::logic_error("CopyStream needs a build with CUDA (DOS_HAVE_CUDA)");
}
CopyStream::~CopyStream() = default;
void CopyStream::enqueue(Job) { throw std::logic_error("CopyStream needs a build with CUDA"); }
void CopyStream::run() {}
void CopyStream::copy(const Job&, Result&, CUstream_st*&, CUevent_st*&, int&) {}

#endif

}  // namespace dos::detail
