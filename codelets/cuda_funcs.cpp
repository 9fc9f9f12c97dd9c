// CUDA implementations of the codelets (built only with CUDA; see codelets.h for the buffers).
// Every launch goes to starpu_cuda_get_local_stream() and returns without synchronising
// (STARPU_CUDA_ASYNC): StarPU records an event and completes the task when the stream gets there.
#include <cuda_runtime.h>

#include "codelets.h"
#include "cuda_funcs.h"

namespace dos {
namespace cuda_funcs {
namespace {
void check(int err, const char* what) {
  if (err != 0) STARPU_ABORT_MSG("%s failed: %s", what, cudaGetErrorString(cudaError_t(err)));
}

/// An out-of-place update's first step on the device: the old state (buffer 0) copied whole into the
/// new one (buffer 3, as many elements), padding included, on `stream`; returns buffer 3's pointer.
float* copy_state_into_new(void* buffers[], cudaStream_t stream) {
  float* out = reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[3]));
  check(int(cudaMemcpyAsync(out, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[0])),
                            STARPU_VECTOR_GET_NX(buffers[0]) * sizeof(float), cudaMemcpyDeviceToDevice, stream)),
        "cudaMemcpyAsync of the state");
  return out;
}
}  // namespace

void adam(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  const std::size_t n = STARPU_VECTOR_GET_NX(buffers[1]);
  const StateSlices s = slices(buffers[0], a->state_stride);
  check(adam_step_cuda(s.p, s.m, s.v, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->grad_dtype,
                       reinterpret_cast<void*>(STARPU_VECTOR_GET_PTR(buffers[2])), a->param_dtype, n, a->sp,
                       starpu_cuda_get_local_stream()),
        "CUDA Adam kernel launch");
}

void adam_compact(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  const CompactSlices s = compact_slices(reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[0])), a->state_stride);
  check(adam_step_compact_cuda(reinterpret_cast<std::uint16_t*>(STARPU_VECTOR_GET_PTR(buffers[2])), s.lo, s.r, s.m,
                               s.v, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->grad_dtype,
                               STARPU_VECTOR_GET_NX(buffers[1]), a->sp, starpu_cuda_get_local_stream()),
        "CUDA compact-master Adam kernel launch");
}

void adam_into(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  cudaStream_t stream = starpu_cuda_get_local_stream();
  copy_state_into_new(buffers, stream);  // GPU memory: ~1% of the task
  const StateSlices out = slices(buffers[3], a->state_stride);
  check(adam_step_cuda(out.p, out.m, out.v, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])),
                       a->grad_dtype, reinterpret_cast<void*>(STARPU_VECTOR_GET_PTR(buffers[2])), a->param_dtype,
                       STARPU_VECTOR_GET_NX(buffers[1]), a->sp, stream),
        "CUDA Adam kernel launch");
}

void adam_compact_into(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  cudaStream_t stream = starpu_cuda_get_local_stream();
  // adam_compact's own kernel on a copy of the old state: the same bits as the update in place
  const CompactSlices s = compact_slices(copy_state_into_new(buffers, stream), a->state_stride);
  check(adam_step_compact_cuda(reinterpret_cast<std::uint16_t*>(STARPU_VECTOR_GET_PTR(buffers[2])), s.lo, s.r, s.m,
                               s.v, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->grad_dtype,
                               STARPU_VECTOR_GET_NX(buffers[1]), a->sp, stream),
        "CUDA compact-master Adam kernel launch");
}

void adam_direct(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamDirectArgs*>(cl_arg);
  if (a->adam->compact) {
    const CompactSlices c =
        compact_slices(reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[0])), a->adam->state_stride);
    for (std::size_t s = 0; s < a->nseg; ++s) {
      const Segment& sg = a->segs[s];
      check(adam_step_compact_cuda_at(static_cast<std::uint16_t*>(sg.param), c.lo + sg.offset, c.r, sg.offset,
                                      c.m + sg.offset, c.v + sg.offset, sg.grad, a->dtype, sg.count, a->adam->sp,
                                      starpu_cuda_get_local_stream()),
            "CUDA compact-master Adam kernel launch");
    }
    return;
  }
  const StateSlices st = slices(buffers[0], a->adam->state_stride);
  for (std::size_t s = 0; s < a->nseg; ++s) {
    const Segment& sg = a->segs[s];
    check(adam_step_cuda(st.p + sg.offset, st.m + sg.offset, st.v + sg.offset, sg.grad, a->dtype, sg.param, a->dtype,
                         sg.count, a->adam->sp, starpu_cuda_get_local_stream()),
          "CUDA Adam kernel launch");
  }
}

void gather(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const GatherArgs*>(cl_arg);
  char* dst = reinterpret_cast<char*>(STARPU_VECTOR_GET_PTR(buffers[0]));
  const std::size_t dsz = dtype_size(a->dst_dtype);
  for (std::size_t s = 0; s < a->nseg; ++s) {
    const Segment& sg = a->segs[s];
    const void* src = a->from_params ? sg.param : sg.grad;
    if (a->dst_dtype == a->dtype)
      check(int(cudaMemcpyAsync(dst + sg.offset * dsz, src, sg.count * dsz, cudaMemcpyDeviceToDevice,
                                starpu_cuda_get_local_stream())),
            "cudaMemcpyAsync of the 16-bit gradients");
    else
      check(convert_to_f32_cuda(src, a->dtype, reinterpret_cast<float*>(dst + sg.offset * dsz), sg.count,
                                starpu_cuda_get_local_stream()),
            "CUDA conversion kernel launch");
  }
}

void scatter(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const ScatterArgs*>(cl_arg);
  const char* src = reinterpret_cast<const char*>(STARPU_VECTOR_GET_PTR(buffers[0]));
  const std::size_t esz = dtype_size(a->dtype);
  for (std::size_t s = 0; s < a->nseg; ++s)
    check(int(cudaMemcpyAsync(a->segs[s].param, src + a->segs[s].offset * esz, a->segs[s].count * esz,
                              cudaMemcpyDeviceToDevice, starpu_cuda_get_local_stream())),
          "cudaMemcpyAsync of the 16-bit parameters");
}

void cast(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  check(convert_from_f32_cuda(reinterpret_cast<const float*>(STARPU_VECTOR_GET_PTR(buffers[0])),
                              reinterpret_cast<void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->param_dtype,
                              STARPU_VECTOR_GET_NX(buffers[0]), starpu_cuda_get_local_stream()),
        "CUDA cast kernel launch");
}

}  // namespace cuda_funcs
}  // namespace dos
