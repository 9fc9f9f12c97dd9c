// GPU memory for the runtime's own scratch buffers (calibration), without CUDA in the callers.
#pragma once

#include <cstddef>

#include "dtype.h"

namespace dos {

/// Allocates `bytes` of zeroed memory on the calling thread's current CUDA device (the runtime's
/// GPU in its threads). Throws dos::Error when the build has no
/// CUDA or the allocation fails (the message says which).
void* device_alloc_zeroed(std::size_t bytes);
/// Frees memory from device_alloc_zeroed (nullptr is ignored).
void device_free(void* p);

/// The GPU's Adam and gradient-conversion rates, params/s, from a micro-benchmark of the real CUDA
/// kernels on n elements (benchmark_cuda_kernels in codelets/kernels/adam.h). Throws dos::Error
/// without CUDA or on a CUDA error.
void benchmark_gpu_rates(std::size_t n, DType dtype, double* adam_params_per_s, double* convert_params_per_s);

}  // namespace dos
