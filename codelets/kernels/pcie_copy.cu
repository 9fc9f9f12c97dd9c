// Copies between pinned host memory and device memory by the GPU's cores (pcie_copy.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "pcie_copy.h"

namespace dos {

namespace {

/// Grid-stride over the aligned 16-byte units of the host side: unit k covers host bytes
/// [h0 + 16k, h0 + 16k + 16) and the device bytes at the same offsets from the device range's
/// start. A whole unit with both sides co-aligned moves as one uint4; a whole unit otherwise as one
/// uint4 on the host side and bytes on the device side; the partial units at either end byte by
/// byte inside the range (an up copy reads its whole host unit).
template <bool kUp>
__global__ void pcie_copy_kernel(char* __restrict__ dst, const char* __restrict__ src, std::size_t bytes) {
  const std::uintptr_t host = reinterpret_cast<std::uintptr_t>(kUp ? src : dst);
  const std::uintptr_t dev = reinterpret_cast<std::uintptr_t>(kUp ? dst : src);
  const std::uintptr_t h0 = host & ~std::uintptr_t(15), h_end = host + bytes;
  const std::size_t units = (h_end - h0 + 15) / 16;
  const bool coaligned = ((dev - host) & 15) == 0;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < units;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::uintptr_t c = h0 + 16 * k;
    const std::uintptr_t lo = c > host ? c : host, hi = c + 16 < h_end ? c + 16 : h_end;
    const bool whole = lo == c && hi == c + 16;
    char* d = reinterpret_cast<char*>(dev + (c - host));  // device byte matching host byte c
    if (kUp) {
      const uint4 v = *reinterpret_cast<const uint4*>(c);
      if (whole && coaligned) {
        *reinterpret_cast<uint4*>(d) = v;
      } else {
        const char* b = reinterpret_cast<const char*>(&v);
        for (std::uintptr_t x = lo; x < hi; ++x) d[x - c] = b[x - c];
      }
    } else {
      char* h = reinterpret_cast<char*>(c);
      if (whole && coaligned) {
        *reinterpret_cast<uint4*>(h) = *reinterpret_cast<const uint4*>(d);
      } else if (whole) {
        uint4 v;
        char* b = reinterpret_cast<char*>(&v);
        for (int j = 0; j < 16; ++j) b[j] = d[j];
        *reinterpret_cast<uint4*>(h) = v;
      } else {
        for (std::uintptr_t x = lo; x < hi; ++x) h[x - c] = d[x - c];
      }
    }
  }
}

}  // namespace

int preload_pcie_copy_kernels() {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, pcie_copy_kernel<true>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, pcie_copy_kernel<false>);
  return int(e);
}

int pcie_copy_cuda(void* dst, const void* src, std::size_t bytes, bool to_device, unsigned blocks, void* stream) {
  if (bytes == 0) return cudaSuccess;
  if (blocks == 0) {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    blocks = unsigned(sms);
  }
  const std::size_t units = (bytes + 30) / 16 + 1;
  const std::size_t need = (units + 255) / 256;
  if (need < blocks) blocks = unsigned(need);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (to_device)
    pcie_copy_kernel<true><<<blocks, 256, 0, s>>>(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
  else
    pcie_copy_kernel<false><<<blocks, 256, 0, s>>>(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
  return cudaGetLastError();
}

}  // namespace dos
