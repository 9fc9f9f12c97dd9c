// Global-norm gradient clipping for dos-train (--max-grad-norm): the squared norm of the
// gradients where they live (host or GPU), and their rescaling in place, in the gradients' dtype.
//
// The sum of squares is deterministic and the same bits on the host and the GPU: the n elements
// are cut into chunks of kNormChunk; in a chunk, lane j (of kNormLanes) adds the squares of
// elements j, j + kNormLanes, ... in order, in double (a square of an fp32 value is exact in
// double); the lanes are then added pairwise in a fixed tree (lane j += lane j + s for s =
// kNormLanes/2, ..., 1), and the chunk sums in chunk order on the host. Neither the thread count
// nor the GPU's scheduling changes the result, so an overlapped update and a plain one clip by the
// same coefficient.
#pragma once

#include <cstddef>

#include "../../codelets/kernels/dtype.h"

namespace dos_train {

constexpr std::size_t kNormChunk = std::size_t(1) << 16;  // elements per chunk
constexpr std::size_t kNormLanes = 256;                   // lanes per chunk (threads of a CUDA block)

/// Sum of the squares of n gradients of dtype t (fp32, fp16 or bf16) in host memory, in double,
/// in the order described above (OpenMP over chunks). inf or NaN when a gradient is inf or NaN (or
/// the sum overflows double).
double grad_sumsq_host(const void* g, dos::DType t, std::size_t n);

/// g[i] = g[i] x coef, computed in fp32 and rounded to dtype t (nearest even), for i < n, in host
/// memory (OpenMP): what torch.nn.utils.clip_grad_norm_ does to a gradient of that dtype.
void scale_grads_host(void* g, dos::DType t, std::size_t n, float coef);

#if defined(DOS_HAVE_CUDA)
/// grad_sumsq_host on the GPU (g: device memory), the same bits; synchronous.
/// Throws std::runtime_error on a CUDA error.
double grad_sumsq_cuda(const void* g, dos::DType t, std::size_t n);
/// scale_grads_host on the GPU (g: device memory), the same bits; synchronous.
/// Throws std::runtime_error on a CUDA error.
void scale_grads_cuda(void* g, dos::DType t, std::size_t n, float coef);
#endif

/// The coefficient torch.nn.utils.clip_grad_norm_ scales the gradients by: max_norm / (norm +
/// 1e-6), computed in double and rounded to fp32; 1 when that is >= 1 (no clipping).
float clip_coefficient(double norm, double max_norm);

}  // namespace dos_train
