#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "emulate.h"

namespace dos_train {
namespace {
__global__ void grads_kernel(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                             std::uint64_t first) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dos::store_from_f32(dst, t, i, emulated_grad(seed, iter, first + i));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

void fill_grads_cuda(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                     std::uint64_t first) {
  if (n == 0) return;
  std::size_t blocks = (n + 255) / 256;
  if (blocks > 8192) blocks = 8192;
  grads_kernel<<<unsigned(blocks), 256>>>(dst, t, n, seed, iter, first);
  check(cudaGetLastError(), "gradient kernel launch");
  check(cudaDeviceSynchronize(), "gradient kernel");
}

void* cuda_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  return p;
}
void cuda_free(void* p) { cudaFree(p); }
void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
}
void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
}

}  // namespace dos_train
