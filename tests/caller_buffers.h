// Test helper: the caller's parameter and gradient buffers of a runtime test, in host or GPU
// memory, with copies to and from host memory. Failures of CUDA calls fail the running cmocka test.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "cmocka_cpp.h"

namespace test {

/// n elements of esz bytes each for the parameters and for the gradients (GPU memory when cuda).
struct CallerBuffers {
  std::size_t n = 0, esz = 0;
  void *param = nullptr, *grad = nullptr;
  bool cuda = false;
  CallerBuffers(std::size_t n_, std::size_t esz_, bool cuda_) : n(n_), esz(esz_), cuda(cuda_) {
#if defined(DOS_HAVE_CUDA)
    if (cuda) {
      assert_int_equal(cudaMalloc(&param, n * esz), 0);
      assert_int_equal(cudaMalloc(&grad, n * esz), 0);
      return;
    }
#endif
    param = std::malloc(n * esz);
    grad = std::malloc(n * esz);
  }
  CallerBuffers(const CallerBuffers&) = delete;
  CallerBuffers& operator=(const CallerBuffers&) = delete;
  ~CallerBuffers() {
#if defined(DOS_HAVE_CUDA)
    if (cuda) {
      cudaFree(param);
      cudaFree(grad);
      return;
    }
#endif
    std::free(param);
    std::free(grad);
  }
  /// Copies n elements from host memory src into dst (param or grad).
  void put(void* dst, const void* src) {
#if defined(DOS_HAVE_CUDA)
    if (cuda) {
      assert_int_equal(cudaMemcpy(dst, src, n * esz, cudaMemcpyHostToDevice), 0);
      return;
    }
#endif
    std::memcpy(dst, src, n * esz);
  }
  /// Copies n elements of src (param or grad) into host memory dst.
  void get(void* dst, const void* src) {
#if defined(DOS_HAVE_CUDA)
    if (cuda) {
      assert_int_equal(cudaMemcpy(dst, src, n * esz, cudaMemcpyDeviceToHost), 0);
      return;
    }
#endif
    std::memcpy(dst, src, n * esz);
  }
};

}  // namespace test
