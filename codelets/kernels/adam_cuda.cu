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
    float mi = lerp_torch(m[i], gi, sp.one_minus_beta1);
    float vi = v[i] * sp.beta2 + (sp.one_minus_beta2 * gi) * gi;
    float denom = sqrtf(vi) / sp.bias_correction2_sqrt + sp.eps;
    pi = pi + (-sp.step_size * mi) / denom;
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

template <DType D>
__global__ void store_kernel(const float* __restrict__ src, void* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_from_f32(dst, D, i, src[i]);
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

int convert_from_f32_cuda(const float* src, void* dst, DType dst_dtype, std::size_t n, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dst_dtype) {
    case DType::fp32: store_kernel<DType::fp32><<<grid_for(n), kThreads, 0, s>>>(src, dst, n); break;
    case DType::fp16: store_kernel<DType::fp16><<<grid_for(n), kThreads, 0, s>>>(src, dst, n); break;
    case DType::bf16: store_kernel<DType::bf16><<<grid_for(n), kThreads, 0, s>>>(src, dst, n); break;
  }
  return int(cudaGetLastError());
}

int benchmark_cuda_kernels(std::size_t n, DType dtype, double* adam_seconds, double* convert_seconds) {
  float *p = nullptr, *m = nullptr, *v = nullptr, *g32 = nullptr;
  void *g = nullptr, *out = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaError_t e = cudaSuccess;
  auto ok = [&](cudaError_t r) { return (e = (e == cudaSuccess ? r : e)) == cudaSuccess; };
  if (ok(cudaMalloc(&p, n * 4)) && ok(cudaMalloc(&m, n * 4)) && ok(cudaMalloc(&v, n * 4)) && ok(cudaMalloc(&g32, n * 4)) &&
      ok(cudaMalloc(&g, n * dtype_size(dtype))) && ok(cudaMalloc(&out, n * dtype_size(dtype))) &&
      ok(cudaMemset(p, 0, n * 4)) && ok(cudaMemset(m, 0, n * 4)) && ok(cudaMemset(v, 0, n * 4)) &&
      ok(cudaMemset(g, 0, n * dtype_size(dtype))) && ok(cudaEventCreate(&start)) && ok(cudaEventCreate(&stop))) {
    AdamHyper h;
    const AdamStepParams sp = make_adam_step_params(h, 1);
    *adam_seconds = *convert_seconds = 1e30;
    for (int rep = 0; rep < 3 && e == cudaSuccess; ++rep) {
      float ms = 0;
      ok(cudaEventRecord(start, nullptr));
      ok(cudaError_t(adam_step_cuda(p, m, v, g, dtype, out, dtype, n, sp, nullptr)));
      ok(cudaEventRecord(stop, nullptr));
      ok(cudaEventSynchronize(stop));
      ok(cudaEventElapsedTime(&ms, start, stop));
      if (ms * 1e-3 < *adam_seconds) *adam_seconds = ms * 1e-3;
      ok(cudaEventRecord(start, nullptr));
      ok(cudaError_t(convert_to_f32_cuda(g, dtype, g32, n, nullptr)));
      ok(cudaEventRecord(stop, nullptr));
      ok(cudaEventSynchronize(stop));
      ok(cudaEventElapsedTime(&ms, start, stop));
      if (ms * 1e-3 < *convert_seconds) *convert_seconds = ms * 1e-3;
    }
  }
  for (void* q : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v), static_cast<void*>(g32), g, out})
    if (q) cudaFree(q);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return int(e);
}

int benchmark_cuda_copy(std::size_t bytes, double* seconds) {
  void *a = nullptr, *b = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaError_t e = cudaMalloc(&a, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
  if (e == cudaSuccess) e = cudaMemset(a, 0, bytes);
  if (e == cudaSuccess) e = cudaEventCreate(&start);
  if (e == cudaSuccess) e = cudaEventCreate(&stop);
  *seconds = 1e30;
  for (int rep = 0; rep < 3 && e == cudaSuccess; ++rep) {
    float ms = 0;
    cudaEventRecord(start, nullptr);
    e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr);
    cudaEventRecord(stop, nullptr);
    if (e == cudaSuccess) e = cudaEventSynchronize(stop);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
    if (e == cudaSuccess && ms * 1e-3 < *seconds) *seconds = ms * 1e-3;
  }
  if (a) cudaFree(a);
  if (b) cudaFree(b);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return int(e);
}

}  // namespace dos
