// The one file of runtime/ whose CUDA and CPU-only builds differ.
#include "device_memory.h"

#include <string>

#include "dos.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>

#include "../codelets/kernels/adam.h"

namespace dos {
void* device_alloc_zeroed(std::size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e == cudaSuccess) e = cudaMemset(p, 0, bytes);
  if (e != cudaSuccess) {
    if (p) cudaFree(p);
    throw Error("cannot allocate " + std::to_string(bytes) + " bytes of GPU memory: " + cudaGetErrorString(e));
  }
  return p;
}
void device_free(void* p) {
  if (p) cudaFree(p);
}
void benchmark_gpu_rates(std::size_t n, DType dtype, double* adam_params_per_s, double* convert_params_per_s) {
  double a = 0, c = 0, store = 0;
  const int err = benchmark_cuda_kernels(n, dtype, &a, &c, &store);
  if (err != 0) throw Error(std::string("GPU kernel benchmark failed: ") + cudaGetErrorString(cudaError_t(err)));
  *adam_params_per_s = double(n) / a;
  *convert_params_per_s = double(n) / c;
}
}  // namespace dos

#else

namespace dos {
void* device_alloc_zeroed(std::size_t bytes) {
  throw Error("cannot allocate " + std::to_string(bytes) + " bytes of GPU memory: this build has no CUDA");
}
void device_free(void*) {}
void benchmark_gpu_rates(std::size_t, DType, double*, double*) {
  throw Error("cannot benchmark the GPU kernels: this build has no CUDA");
}
}  // namespace dos

#endif
