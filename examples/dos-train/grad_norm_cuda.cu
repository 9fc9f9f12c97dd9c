// GPU side of grad_norm.h: one block of kNormLanes threads per chunk, the same order as the host.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "emulate.h"
#include "grad_norm.h"

namespace dos_train {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

__global__ void sumsq_kernel(const void* g, dos::DType t, std::size_t n, double* sums) {
  __shared__ double lane[kNormLanes];
  const std::size_t off = std::size_t(blockIdx.x) * kNormChunk;
  const std::size_t len = off + kNormChunk <= n ? kNormChunk : n - off;
  double s = 0;
  for (std::size_t i = threadIdx.x; i < len; i += kNormLanes) {
    const double x = double(dos::load_as_f32(g, t, off + i));
    s += x * x;
  }
  lane[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = kNormLanes / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) lane[threadIdx.x] += lane[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = lane[0];
}

__global__ void scale_kernel(void* g, dos::DType t, std::size_t n, float coef) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    dos::store_from_f32(g, t, i, dos::load_as_f32(g, t, i) * coef);
}
}  // namespace

double grad_sumsq_cuda(const void* g, dos::DType t, std::size_t n) {
  if (n == 0) return 0;
  const std::size_t nchunks = (n + kNormChunk - 1) / kNormChunk;
  // the chunk sums' buffer, kept (cudaFree would wait for the whole device, the runtime's streams too)
  static double* d = nullptr;
  static std::size_t cap = 0;
  if (cap < nchunks) {
    if (d) check(cudaFree(d), "cudaFree (gradient norm)");
    d = nullptr;
    cap = 0;
    check(cudaMalloc(&d, nchunks * sizeof(double)), "cudaMalloc (gradient norm)");
    cap = nchunks;
  }
  std::vector<double> sums(nchunks);
  cudaStream_t s = emulation_stream();
  sumsq_kernel<<<unsigned(nchunks), unsigned(kNormLanes), 0, s>>>(g, t, n, d);
  check(cudaGetLastError(), "gradient norm kernel launch");
  check(cudaMemcpyAsync(sums.data(), d, nchunks * sizeof(double), cudaMemcpyDeviceToHost, s), "gradient norm copy");
  check(cudaStreamSynchronize(s), "gradient norm kernel");
  double total = 0;
  for (double x : sums) total += x;
  return total;
}

void scale_grads_cuda(void* g, dos::DType t, std::size_t n, float coef) {
  if (n == 0) return;
  const std::size_t blocks = std::min<std::size_t>((n + 255) / 256, 65535);
  scale_kernel<<<unsigned(blocks), 256, 0, emulation_stream()>>>(g, t, n, coef);
  check(cudaGetLastError(), "gradient scaling kernel launch");
  check(cudaStreamSynchronize(emulation_stream()), "gradient scaling kernel");
}

}  // namespace dos_train
