// StarPU codelets of one update phase: thin bindings from task buffers to the pure kernels in
// kernels/. They declare access modes and perfmodels, unpack the data interfaces, and call a
// kernel; they decide nothing about where a task runs (that is scheduler/).
//
// Buffers (all StarPU vector handles) and arguments (task->cl_arg, owned by the runtime and
// alive until the task has finished). "state" is a subgroup's whole Adam state in one fp32 vector
// of 3 * AdamArgs::state_stride elements: the master parameters at [0, n), exp_avg at
// [stride, stride + n), exp_avg_sq at [2 stride, 2 stride + n) (n: the subgroup's size; stride >= n,
// a multiple of 16 elements so that each slice is 64-byte aligned), so that a streamed subgroup
// moves in one transfer each way:
//   adam_cl     state (fp32, RW), grad (grad_dtype, R, n elements), param16 (param_dtype, W)
//                                                                      cl_arg: const AdamArgs*
//   gather_cl   dst (dst_dtype, W): the caller's gradients (or parameters) of one subgroup,
//               converted to fp32 (or copied as they are) from the caller's own buffers (raw
//               pointers in the segments)
//                                                                      cl_arg: const GatherArgs*
//   scatter_cl  param16 (param_dtype, R): copied into the caller's parameter buffers
//                                                                      cl_arg: const ScatterArgs*
//   cast_cl     master (fp32, R, n elements), param16 (param_dtype, W): the master parameters rounded
//               to the parameters' dtype (after a checkpoint is loaded) cl_arg: const AdamArgs*
//   adam_direct_cl  state (fp32, RW): Adam reading the caller's gradients and writing the caller's
//               parameters directly (their dtype), segment by segment (the path of subgroups updated
//               where the caller's buffers live: no fp32 gradient or 16-bit parameter staging, no
//               conversion or copy tasks)
//                                                                      cl_arg: const AdamDirectArgs*
//   adam_compact_cl  state (compact, RW), grad (grad_dtype, R, n elements), param16 (bf16, RW): adam_cl
//               on a compact state (below), param16 holding P on entry (the caller's parameters,
//               staged) and the new P on return        cl_arg: const AdamArgs* (compact true)
//   adam_into_cl  state (fp32, R), grad (grad_dtype, R), param16 (param_dtype, W), state' (fp32, W):
//               adam_cl out of place, the new state written to the last buffer and the first left as
//               it was (a speculative update: kept by swapping the two, or redone from the first).
//                                                                      cl_arg: const AdamArgs*
//   adam_compact_into_cl  state (compact, R), grad (grad_dtype, R), param16 (bf16, RW), state'
//               (compact, W; the same number of elements as state): adam_compact_cl out of place for
//               the state (on the CPU adam_step_compact_into_cpu, on the GPU the first copied whole
//               into the last and updated there), the first left as it was; param16 holds P on
//               entry and the new P on return (the caller's parameters still hold P: a redone
//               update stages them again).
//                                                                      cl_arg: const AdamArgs* (compact true)
// A compact state (AdamArgs::compact; the compact master of kernels/compact_master.h): the buffer
// holds no master; its first compact_head_floats(stride) elements hold the masters' low halves lo
// (n uint16_t) and then their packed r bits (32-bit words from element stride / 2), exp_avg follows
// at [head, head + n) and exp_avg_sq at [head + stride, ...) (compact_slices). The master of each
// element is rebuilt from the caller's bf16 parameter P, lo and r (compact_join). adam_direct_cl
// reads and writes P in the caller's buffers, adam_compact_cl in its staging.
// gather_cl, scatter_cl and adam_direct_cl touch caller memory by raw pointer, so the runtime restricts them
// (task->where) to the side where that memory lives: STARPU_CUDA for GPU pointers, STARPU_CPU
// for host pointers. All CUDA implementations run on StarPU's local stream (STARPU_CUDA_ASYNC).
#pragma once

#include <starpu.h>

#include <cstddef>
#include <cstdint>

#include "kernels/adam.h"
#include "kernels/compact_master.h"

namespace dos {

/// A piece of one caller tensor that falls inside a subgroup.
/// param, grad: the caller's buffers at the first element of the piece (host or device
/// pointers, dtype as in the owning GatherArgs/ScatterArgs); offset: position of the piece
/// inside the subgroup, in elements; count: number of elements (> 0).
struct Segment {
  void* param;
  void* grad;
  std::size_t offset;
  std::size_t count;
};

/// Arguments of adam_cl: the step constants, the type of the 16-bit parameter copy, the type of the
/// staged gradient (fp32, or the parameters' dtype when gradients are staged unconverted), and the
/// state's stride: elements from the master parameters to exp_avg and from exp_avg to exp_avg_sq in
/// the state buffer (state_stride_for, kernels/adam.h).
/// compact: the state buffer is a compact state (the comment above; bf16 parameters only), read by
/// adam_direct_cl, adam_compact_cl and adam_compact_into_cl; adam_cl, adam_into_cl and cast_cl take full
/// states only.
struct AdamArgs {
  AdamStepParams sp;
  DType param_dtype;
  DType grad_dtype = DType::fp32;
  std::size_t state_stride = 0;
  bool compact = false;
};

/// Arguments of gather_cl: which caller buffers to read (from_params: the parameters, used once to
/// initialise the fp32 master parameters; otherwise the gradients), their dtype, and the segments.
/// dst_dtype: fp32 (convert), or `dtype` itself (copy unconverted: 16-bit gradient staging); no
/// other value (the destination buffer holds dst_dtype elements).
struct GatherArgs {
  const Segment* segs;
  std::size_t nseg;
  DType dtype;
  bool from_params;
  DType dst_dtype = DType::fp32;
};

/// Arguments of scatter_cl: the caller's parameter dtype and the segments to write.
struct ScatterArgs {
  const Segment* segs;
  std::size_t nseg;
  DType dtype;
};

/// Arguments of adam_direct_cl: the step constants, and the caller's segments and dtype.
struct AdamDirectArgs {
  const AdamArgs* adam;
  const Segment* segs;
  std::size_t nseg;
  DType dtype;
};

/// The three fp32 slices of a state buffer (see "state" above): the master parameters (p),
/// exp_avg (m) and exp_avg_sq (v), each `stride` elements apart (AdamArgs::state_stride).
struct StateSlices {
  float *p, *m, *v;
};

/// The slices of the StarPU vector interface `state_buffer` (a task's buffers[i] of a state handle)
/// at `stride` elements apart. Throws nothing.
inline StateSlices slices(void* state_buffer, std::size_t stride) {
  float* s = reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(state_buffer));
  return {s, s + stride, s + 2 * stride};
}

/// The slices of a compact state buffer (the comment above): lo (stride uint16_t), r (the packed bits,
/// 4-byte aligned), exp_avg and exp_avg_sq (fp32).
struct CompactSlices {
  std::uint16_t* lo;
  std::uint8_t* r;
  float *m, *v;
};

/// The slices of a compact state at `base` (its first element) for state stride `stride`. Throws nothing.
inline CompactSlices compact_slices(float* base, std::size_t stride) {
  const std::size_t head = compact_head_floats(stride);
  return {reinterpret_cast<std::uint16_t*>(base), reinterpret_cast<std::uint8_t*>(base + stride / 2), base + head,
          base + head + stride};
}

extern struct starpu_codelet adam_cl;
extern struct starpu_codelet adam_compact_cl;
extern struct starpu_codelet adam_direct_cl;
extern struct starpu_codelet adam_into_cl;
extern struct starpu_codelet adam_compact_into_cl;
extern struct starpu_codelet gather_cl;
extern struct starpu_codelet scatter_cl;
extern struct starpu_codelet cast_cl;

/// True when the codelets were built with their CUDA implementations.
bool codelets_have_cuda();

}  // namespace dos
