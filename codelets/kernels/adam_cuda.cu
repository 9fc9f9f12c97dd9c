// CUDA Adam/AdamW and conversion kernels (see adam.h for the formula and the contract).
// One fused pass per subgroup: read g, p, m, v; write p, m, v and the 16-bit parameter copy.
// Built with --fmad=false, so the fp32 operations are the CPU kernel's, in the same order.
#include <cuda_runtime.h>

#include "adam.h"

namespace dos {
namespace {

template <DType G, DType P, bool WriteParam>
__global__ void adam_kernel(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                            const void* __restrict__ g, void* __restrict__ out, std::size_t n,
                            AdamStepParams sp) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float gi = load_as_f32(g, G, i);
    float pi = p[i];
    gi = gi + sp.l2 * pi;
    pi = pi * sp.decay;
    float mi = sp.beta1 * m[i] + sp.one_minus_beta1 * gi;
    float vi = sp.beta2 * v[i] + sp.one_minus_beta2 * (gi * gi);
    float denom = sqrtf(vi) / sp.bias_correction2_sqrt + sp.eps;
    pi = pi - sp.step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (WriteParam) store_from_f32(out, P, i, pi);
  }
}

template <DType S>
__global__ void convert_kernel(const void* __restrict__ src, float* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = load_as_f32(src, S, i);
}

constexpr int kThreads = 256;

unsigned grid_for(std::size_t n) {
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  const std::size_t cap = 132 * 32;  // enough resident blocks for any current GPU; the loop strides
  return unsigned(blocks < cap ? (blocks ? blocks : 1) : cap);
}

template <DType G, DType P, bool W>
void launch_adam(float* p, float* m, float* v, const void* g, void* out, std::size_t n,
                 const AdamStepParams& sp, cudaStream_t s) {
  adam_kernel<G, P, W><<<grid_for(n), kThreads, 0, s>>>(p, m, v, g, out, n, sp);
}

template <DType G>
void launch_adam_g(float* p, float* m, float* v, const void* g, void* out, DType pt, std::size_t n,
                   const AdamStepParams& sp, cudaStream_t s) {
  if (!out) return launch_adam<G, DType::fp32, false>(p, m, v, g, out, n, sp, s);
  switch (pt) {
    case DType::fp32: return launch_adam<G, DType::fp32, true>(p, m, v, g, out, n, sp, s);
    case DType::fp16: return launch_adam<G, DType::fp16, true>(p, m, v, g, out, n, sp, s);
    case DType::bf16: return launch_adam<G, DType::bf16, true>(p, m, v, g, out, n, sp, s);
  }
}

}  // namespace

int adam_step_cuda(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case DType::fp32: launch_adam_g<DType::fp32>(master, exp_avg, exp_avg_sq, grad, param_out, param_dtype, n, sp, s); break;
    case DType::fp16: launch_adam_g<DType::fp16>(master, exp_avg, exp_avg_sq, grad, param_out, param_dtype, n, sp, s); break;
    case DType::bf16: launch_adam_g<DType::bf16>(master, exp_avg, exp_avg_sq, grad, param_out, param_dtype, n, sp, s); break;
  }
  return int(cudaGetLastError());
}

int convert_to_f32_cuda(const void* src, DType src_dtype, float* dst, std::size_t n, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (src_dtype) {
    case DType::fp32: convert_kernel<DType::fp32><<<grid_for(n), kThreads, 0, s>>>(src, dst, n); break;
    case DType::fp16: convert_kernel<DType::fp16><<<grid_for(n), kThreads, 0, s>>>(src, dst, n); break;
    case DType::bf16: convert_kernel<DType::bf16><<<grid_for(n), kThreads, 0, s>>>(src, dst, n); break;
  }
  return int(cudaGetLastError());
}

}  // namespace dos
