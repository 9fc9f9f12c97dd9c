// The CUDA implementations of the codelets, or null pointers in a build without CUDA.
// This header is the one place where the CUDA and CPU-only builds of the codelets differ.
#pragma once

#include <starpu.h>

namespace dos {
namespace cuda_funcs {
#if defined(DOS_HAVE_CUDA)
constexpr bool kHaveCuda = true;
/// CUDA implementation of adam_cl (codelets.h): fused Adam kernel on the local stream.
void adam(void* buffers[], void* cl_arg);
/// CUDA implementation of adam_compact_cl: the compact-master Adam kernel on the staged P.
void adam_compact(void* buffers[], void* cl_arg);
/// CUDA implementation of adam_into_cl: the old state copied to the new buffers on the device, then
/// the fused Adam kernel in place on them (the same bits as adam).
void adam_into(void* buffers[], void* cl_arg);
/// CUDA implementation of adam_compact_into_cl: the old compact state copied to the new buffer on the
/// device, then adam_compact's kernel on the copy (the same bits as adam_compact).
void adam_compact_into(void* buffers[], void* cl_arg);
/// CUDA implementation of adam_direct_cl: one Adam kernel per segment on the caller's device buffers
/// (the compact-master kernel of a range, adam_step_compact_cuda_at, on a compact state).
void adam_direct(void* buffers[], void* cl_arg);
/// CUDA implementation of gather_cl: one conversion kernel per segment, from device pointers.
void gather(void* buffers[], void* cl_arg);
/// CUDA implementation of scatter_cl: one device-to-device copy per segment.
void scatter(void* buffers[], void* cl_arg);
/// CUDA implementation of cast_cl: master parameters rounded to the parameters' dtype.
void cast(void* buffers[], void* cl_arg);
#else
constexpr bool kHaveCuda = false;
constexpr starpu_cuda_func_t adam = nullptr;
constexpr starpu_cuda_func_t adam_direct = nullptr;
constexpr starpu_cuda_func_t adam_compact = nullptr;
constexpr starpu_cuda_func_t adam_into = nullptr;
constexpr starpu_cuda_func_t adam_compact_into = nullptr;
constexpr starpu_cuda_func_t gather = nullptr;
constexpr starpu_cuda_func_t scatter = nullptr;
constexpr starpu_cuda_func_t cast = nullptr;
#endif
}  // namespace cuda_funcs
}  // namespace dos
