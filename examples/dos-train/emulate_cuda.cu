#include <cuda_runtime.h>

#include <algorithm>
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
__global__ void grad_parts_kernel(float* dst, std::size_t n, std::uint64_t seed, std::uint64_t iter, std::uint64_t first,
                                  std::uint64_t part_begin, std::uint64_t part_end, std::uint64_t parts) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = 0.0f;  // in part order, as fill_grad_parts_host adds them
    for (std::uint64_t p = part_begin; p < part_end; ++p) g += grad_part(seed, iter, p, parts, first + i);
    dst[i] = g;
  }
}
__global__ void store_kernel(void* dst, dos::DType t, const float* src, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dos::store_from_f32(dst, t, i, src[i]);
}
unsigned grid_for(std::size_t n) { return unsigned(std::min<std::size_t>((n + 255) / 256, 8192)); }
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

cudaStream_t emulation_stream() {
  // non-blocking and waited for alone: the emulated gradients never wait for the runtime's
  // transfers and kernels on StarPU's streams (a legacy-default-stream launch, or a device-wide
  // synchronisation, would, and then the overlapped update slowed the emulated backward down)
  static cudaStream_t s = [] {
    cudaStream_t t = nullptr;
    check(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (emulation)");
    return t;
  }();
  return s;
}

void fill_grads_cuda(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                     std::uint64_t first) {
  if (n == 0) return;
  grads_kernel<<<grid_for(n), 256, 0, emulation_stream()>>>(dst, t, n, seed, iter, first);
  check(cudaGetLastError(), "gradient kernel launch");
  check(cudaStreamSynchronize(emulation_stream()), "gradient kernel");
}

void fill_grad_parts_cuda(float* dst, std::size_t n, std::uint64_t seed, std::uint64_t iter, std::uint64_t first,
                          std::uint64_t part_begin, std::uint64_t part_end, std::uint64_t parts) {
  if (n == 0) return;
  grad_parts_kernel<<<grid_for(n), 256, 0, emulation_stream()>>>(dst, n, seed, iter, first, part_begin, part_end, parts);
  check(cudaGetLastError(), "gradient parts kernel launch");
  check(cudaStreamSynchronize(emulation_stream()), "gradient parts kernel");
}

void store_from_f32_cuda(void* dst, dos::DType t, const float* src, std::size_t n) {
  if (n == 0) return;
  store_kernel<<<grid_for(n), 256, 0, emulation_stream()>>>(dst, t, src, n);
  check(cudaGetLastError(), "fp32 to 16-bit kernel launch");
  check(cudaStreamSynchronize(emulation_stream()), "fp32 to 16-bit kernel");
}

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
void cuda_set_device(int device) { check(cudaSetDevice(device), ("cudaSetDevice(" + std::to_string(device) + ")").c_str()); }
std::string cuda_pci_bus_id(int device) {
  char id[32] = "";
  return cudaDeviceGetPCIBusId(id, sizeof id, device) == cudaSuccess ? std::string(id) : std::string();
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
void cuda_memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

}  // namespace dos_train
