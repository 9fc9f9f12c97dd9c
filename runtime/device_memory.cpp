// The one file of runtime/ whose CUDA and CPU-only builds differ.
#include "device_memory.h"

#include <string>

#include "dos.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>

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
}  // namespace dos

#else

namespace dos {
void* device_alloc_zeroed(std::size_t bytes) {
  throw Error("cannot allocate " + std::to_string(bytes) + " bytes of GPU memory: this build has no CUDA");
}
void device_free(void*) {}
}  // namespace dos

#endif
