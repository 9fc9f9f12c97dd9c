// The runtime's own parameter upload (param_upload.h).
#include "param_upload.h"

#include <starpu.h>

#include <stdexcept>
#include <utility>

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace dos::detail {

#if defined(DOS_HAVE_CUDA)

namespace {
/// Empty when r is cudaSuccess, else "<what>: <CUDA's message>".
std::string cuda_error(cudaError_t r, const char* what) {
  return r == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(r);
}
}  // namespace

ParamUploader::ParamUploader() { thread_ = std::thread([this] { run(); }); }

ParamUploader::~ParamUploader() {
  {
    std::lock_guard<std::mutex> g(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ParamUploader::enqueue(Job j) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void ParamUploader::run() {
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
      upload(job, res, stream, done_event, device);
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

void ParamUploader::upload(const Job& job, Result& res, cudaStream_t& stream, cudaEvent_t& done_event, int& device) {
  const ScatterArgs& a = *job.args;
  const std::size_t esz = dtype_size(a.dtype);
  std::string err;
  if (a.nseg > 0) {
    // the stream on the device of the caller's tensors (one device per optimizer in practice; a
    // job on another device gets a stream there)
    cudaPointerAttributes attr{};
    err = cuda_error(cudaPointerGetAttributes(&attr, a.segs[0].param), "cudaPointerGetAttributes of the parameters");
    if (err.empty() && attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      err = "the caller's parameters are not in GPU memory";
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
  const char* host = static_cast<const char*>(job.host);
  for (std::size_t s = 0; err.empty() && s < a.nseg; ++s) {
    const Segment& seg = a.segs[s];
    err = cuda_error(cudaMemcpyAsync(seg.param, host + seg.offset * esz, seg.count * esz, cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync of the parameters to the GPU");
    if (err.empty()) res.bytes += seg.count * esz;
  }
  if (a.nseg > 0 && device >= 0) {  // wait for what was issued, also after a failed issue
    std::string e = cuda_error(cudaEventRecord(done_event, stream), "cudaEventRecord");
    if (e.empty()) e = cuda_error(cudaEventSynchronize(done_event), "waiting for the parameter upload");
    if (err.empty()) err = e;
  }
  res.error = std::move(err);
}

#else  // no CUDA: nothing to upload to

ParamUploader::ParamUploader() {
  throw std::logic_error("ParamUploader needs a build with CUDA (DOS_HAVE_CUDA)");
}
ParamUploader::~ParamUploader() = default;
void ParamUploader::enqueue(Job) { throw std::logic_error("ParamUploader needs a build with CUDA"); }
void ParamUploader::run() {}
void ParamUploader::upload(const Job&, Result&, CUstream_st*&, CUevent_st*&, int&) {}

#endif

}  // namespace dos::detail
