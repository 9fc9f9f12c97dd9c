// Copies between pinned host memory and device memory made by the GPU's cores instead of its
// copy engines. Nothing here knows StarPU.
//
// Why: a cudaMemcpyAsync on a stream of its own waits while another stream keeps the same
// direction's copy engine queue full. On the GPU machine (H200, bench/copy_contention.cu) a 248 MB
// copy took 4.7 ms alone and 266-270 ms behind ten queued 496 MB copies and twenty more issued
// while it waited: it ended only with the last of them, whatever its stream's priority or the size
// of its pieces. The same copy by a kernel reading (or writing) the host buffer through its mapped
// device pointer took 6.1 ms up and 5.6 ms down beside that traffic. StarPU 1.3 keeps its one
// transfer stream per direction that full while it prefetches streamed state.
#pragma once

#include <cstddef>

namespace dos {

#if defined(DOS_HAVE_CUDA)
/// Copies `bytes` bytes from src to dst with a kernel of `blocks` blocks (0: one per
/// multiprocessor) launched asynchronously on `stream` (a cudaStream_t). to_device: src is pinned
/// host memory as the device sees it (the pointer cudaHostGetDevicePointer gives) and dst device
/// memory; otherwise src is device memory and dst mapped pinned host memory. Any alignment and any
/// byte count (0 launches nothing). The host side is read or written in aligned 16-byte units
/// (whole PCIe requests); an up copy may read up to 15 bytes of host memory before and after the
/// range, inside its first and last aligned 16 bytes (never another page), and no byte outside
/// [dst, dst + bytes) is written. The ranges must not overlap. Returns a cudaError_t value
/// (0 = success): that of cudaGetDevice or cudaDeviceGetAttribute when blocks is 0 and they fail,
/// else that of the launch (the copy's own faults surface at the stream's next synchronisation).
int pcie_copy_cuda(void* dst, const void* src, std::size_t bytes, bool to_device, unsigned blocks, void* stream);

/// Loads both copy kernels (up and down) into the current device's context, now, instead of at
/// their first launch, which under CUDA's lazy loading can wait for the work already running on the
/// device (preload_adam_kernels in adam.h says why that matters). Returns a cudaError_t value (0 =
/// success): that of the first cudaFuncGetAttributes that failed.
int preload_pcie_copy_kernels();
#endif

}  // namespace dos
