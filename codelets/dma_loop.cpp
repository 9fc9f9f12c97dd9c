// DmaLoop and dma_rate_beside (dma_loop.h).
#include "dma_loop.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cpu_team.h"

namespace dos {

DmaLoop::DmaLoop(void* up_host, std::size_t up_bytes, void* down_host, std::size_t down_bytes, std::size_t chunk,
                 int core, std::size_t span, int dirs)
    : up_host_(up_host),
      down_host_(down_host),
      up_bytes_(up_bytes),
      down_bytes_(down_bytes),
      chunk_(chunk),
      span_(span),
      core_(core),
      dirs_(dirs) {}

bool DmaLoop::ok(int e) {
  if (e == int(cudaSuccess)) return true;
  int none = 0;
  error_.compare_exchange_strong(none, e);
  stop_ = true;
  return false;
}

const char* DmaLoop::error_string() const { return cudaGetErrorString(cudaError_t(error_.load())); }

bool DmaLoop::start() {
  if (started_ || (dirs_ != 1 && dirs_ != 2 && dirs_ != 3) || chunk_ == 0 || ((dirs_ & 1) && chunk_ > up_bytes_) ||
      ((dirs_ & 2) && chunk_ > down_bytes_))
    return ok(int(cudaErrorInvalidValue));
  started_ = true;
  if (!ok(int(cudaGetDevice(&device_)))) return false;
  if (((dirs_ & 1) && !ok(int(cudaMalloc(&dev_up_, up_bytes_)))) || ((dirs_ & 2) && !ok(int(cudaMalloc(&dev_down_, down_bytes_)))))
    return false;
  for (int d = 0; d < 2; ++d)
    if (dirs_ & (1 << d)) th_[d] = std::thread([this, d] { run(d); });
  return true;
}

void DmaLoop::run(int d) {
  if (core_ >= 0) bind_this_thread(core_);
  cudaStream_t s = nullptr;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  bool ready = ok(int(cudaSetDevice(device_))) && ok(int(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  for (auto& e : ev)
    ready = ready && ok(int(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync)));
  const std::size_t host_bytes = d == 0 ? up_bytes_ : down_bytes_;
  char* dev = static_cast<char*>(d == 0 ? dev_up_ : dev_down_);
  char* h = static_cast<char*>(d == 0 ? up_host_ : down_host_);
  const std::size_t nchunks = std::max<std::size_t>(1, (span_ ? std::min(span_, host_bytes) : host_bytes) / chunk_);
  for (std::size_t i = 0; ready && !stop_.load(std::memory_order_relaxed); ++i) {
    const std::size_t off = (i % nchunks) * chunk_;
    if (!ok(int(d == 0 ? cudaMemcpyAsync(dev + off, h + off, chunk_, cudaMemcpyHostToDevice, s)
                       : cudaMemcpyAsync(h + off, dev + off, chunk_, cudaMemcpyDeviceToHost, s))) ||
        !ok(int(cudaEventRecord(ev[i % 2], s))))
      break;
    if (i >= 1) {
      if (!ok(int(cudaEventSynchronize(ev[(i - 1) % 2])))) break;
      done_.fetch_add(1);
    }
  }
  if (s) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  for (auto& e : ev)
    if (e) cudaEventDestroy(e);
}

void DmaLoop::finish() {
  stop_ = true;
  for (auto& t : th_)
    if (t.joinable()) t.join();
  if (dev_up_) cudaFree(dev_up_);
  if (dev_down_) cudaFree(dev_down_);
  dev_up_ = dev_down_ = nullptr;
}

DmaBeside dma_rate_beside(std::size_t chunk, int core, const std::function<void()>& work) {
  DmaBeside out;
  const std::size_t bytes = 4 * chunk;
  struct FreeHost {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  void *up_raw = nullptr, *down_raw = nullptr;
  cudaError_t e = cudaHostAlloc(&up_raw, bytes, cudaHostAllocDefault);
  std::unique_ptr<void, FreeHost> up(e == cudaSuccess ? up_raw : nullptr);
  if (e == cudaSuccess) e = cudaHostAlloc(&down_raw, bytes, cudaHostAllocDefault);
  std::unique_ptr<void, FreeHost> down(e == cudaSuccess ? down_raw : nullptr);
  if (e != cudaSuccess) {
    out.error = int(e);
    return out;
  }
  DmaLoop loop(up.get(), bytes, down.get(), bytes, chunk, core);  // destroyed (stopped) before the buffers
  if (!loop.start()) {
    out.error = loop.error();
    return out;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the copies flowing
  const std::size_t c0 = loop.completed();
  const double t0 = DmaLoop::now_s();
  work();  // on an exception, the loop stops (its destructor), then the buffers are freed
  const double t1 = DmaLoop::now_s();
  const std::size_t c1 = loop.completed();
  loop.finish();
  out.seconds = t1 - t0;
  out.error = loop.error();
  if (out.error == 0 && t1 > t0) out.bytes_per_s_each_way = loop.rate(c0, t0, c1, t1);
  return out;
}

}  // namespace dos
