// GPU memory for the runtime's own scratch buffers (calibration), without CUDA in the callers.
#pragma once

#include <cstddef>

namespace dos {

/// Allocates `bytes` of zeroed memory on CUDA device 0. Throws dos::Error when the build has no
/// CUDA or the allocation fails (the message says which).
void* device_alloc_zeroed(std::size_t bytes);
/// Frees memory from device_alloc_zeroed (nullptr is ignored).
void device_free(void* p);

}  // namespace dos
