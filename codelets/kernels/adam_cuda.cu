// CUDA Adam/AdamW and conversion kernels (see adam.h for the formula and the contract).
// One fused pass per subgroup: read g, p, m, v; write p, m, v and the 16-bit parameter copy.
// Built with --fmad=false, so the fp32 operations are the CPU kernel's, in the same order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "adam.h"
#include "compact_master.h"

namespace dos {
namespace {

// Four elements per thread and loop trip: 16-byte loads and stores of the fp32 arrays, 8-byte ones
// of 16-bit arrays, so that the memory system sees few, wide requests (scalar 4-byte accesses
// reached 84% of the device-to-device copy rate on the H200, these are meant to reach the roof).
// Every element still gets exactly the scalar code's operations, so the results are the same bits.

/// The four elements [4*q, 4*q+4) of a buffer of type T, as fp32 (T's buffer 8- or 16-byte aligned).
template <DType T>
__device__ __forceinline__ void load4(const void* __restrict__ src, std::size_t q, float x[4]) {
  if (T == DType::fp32) {
    const float4 f = static_cast<const float4*>(src)[q];
    x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
  } else {
    const uint2 u = static_cast<const uint2*>(src)[q];
    const std::uint16_t h[4] = {std::uint16_t(u.x), std::uint16_t(u.x >> 16), std::uint16_t(u.y),
                                std::uint16_t(u.y >> 16)};
    for (int k = 0; k < 4; ++k) x[k] = T == DType::bf16 ? bf16_to_f32(h[k]) : f16_to_f32(h[k]);
  }
}

/// Writes x[0..3] into the elements [4*q, 4*q+4) of a buffer of type T, rounded to nearest even.
template <DType T>
__device__ __forceinline__ void store4(void* __restrict__ dst, std::size_t q, const float x[4]) {
  if (T == DType::fp32) {
    static_cast<float4*>(dst)[q] = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    std::uint16_t h[4];
    for (int k = 0; k < 4; ++k) h[k] = T == DType::bf16 ? f32_to_bf16(x[k]) : f32_to_f16(x[k]);
    static_cast<uint2*>(dst)[q] = make_uint2(std::uint32_t(h[0]) | (std::uint32_t(h[1]) << 16),
                                             std::uint32_t(h[2]) | (std::uint32_t(h[3]) << 16));
  }
}

/// One element's Adam/AdamW update, in the CPU kernel's (and PyTorch's) operation order.
__device__ __forceinline__ void adam_elem(float& pi, float& mi, float& vi, float gi, const AdamStepParams& sp) {
  gi = sp.l2 != 0.0f ? gi + sp.l2 * pi : gi;  // skipped where l2 is 0, as in the CPU kernel
  pi = pi * sp.decay;
  mi = lerp_torch(mi, gi, sp.one_minus_beta1);
  vi = vi * sp.beta2 + (sp.one_minus_beta2 * gi) * gi;
  const float denom = sqrtf(vi) / sp.bias_correction2_sqrt + sp.eps;
  pi = pi + (-sp.step_size * mi) / denom;
}

/// Scalar grid-stride loop over [first, n): any alignment; also the vector kernels' tails.
template <DType G, DType P, bool WriteParam>
__device__ __forceinline__ void adam_scalar(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                                            const void* __restrict__ g, void* __restrict__ out, std::size_t first,
                                            std::size_t n, const AdamStepParams& sp) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = first + std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pi = p[i], mi = m[i], vi = v[i];
    adam_elem(pi, mi, vi, load_as_f32(g, G, i), sp);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (WriteParam) store_from_f32(out, P, i, pi);
  }
}

template <DType G, DType P, bool WriteParam>
__global__ void adam_kernel(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                            const void* __restrict__ g, void* __restrict__ out, std::size_t n, AdamStepParams sp) {
  adam_scalar<G, P, WriteParam>(p, m, v, g, out, 0, n, sp);
}

/// Needs p, m, v 16-byte aligned, g and out aligned to 4 of their elements.
template <DType G, DType P, bool WriteParam>
__global__ void adam_kernel_vec4(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                                 const void* __restrict__ g, void* __restrict__ out, std::size_t n,
                                 AdamStepParams sp) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x, nq = n / 4;
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < nq; q += stride) {
    float pp[4], mm[4], vv[4], gg[4];
    load4<DType::fp32>(p, q, pp);
    load4<DType::fp32>(m, q, mm);
    load4<DType::fp32>(v, q, vv);
    load4<G>(g, q, gg);
    for (int k = 0; k < 4; ++k) adam_elem(pp[k], mm[k], vv[k], gg[k], sp);
    store4<DType::fp32>(p, q, pp);
    store4<DType::fp32>(m, q, mm);
    store4<DType::fp32>(v, q, vv);
    if (WriteParam) store4<P>(out, q, pp);
  }
  adam_scalar<G, P, WriteParam>(p, m, v, g, out, nq * 4, n, sp);
}

/// One element i of the compact-master step: the master rebuilt from P (param[i]), lo[i] and its
/// rounding bit old_r, adam_elem, the new P, low half and moments written; returns the new
/// rounding bit (compact_round_up).
template <DType G>
__device__ __forceinline__ std::uint32_t compact_elem(std::uint16_t* __restrict__ param, std::uint16_t* __restrict__ lo,
                                                      float* __restrict__ m, float* __restrict__ v,
                                                      const void* __restrict__ g, std::size_t i, std::uint32_t old_r,
                                                      const AdamStepParams& sp) {
  float pi = bits_f32(compact_join(param[i], lo[i], old_r)), mi = m[i], vi = v[i];
  adam_elem(pi, mi, vi, load_as_f32(g, G, i), sp);
  const std::uint16_t pn = f32_to_bf16(pi);
  const std::uint32_t u = f32_bits(pi);
  param[i] = pn;
  lo[i] = std::uint16_t(u);
  m[i] = mi;
  v[i] = vi;
  return compact_round_up(u, pn);
}

/// Adam on masters in compact form (compact_master.h): each warp takes 32 consecutive elements per
/// trip (the grid's threads a multiple of 32, so the trips stay warp-aligned and every lane of a warp
/// runs the same trips), rebuilds each master from P, lo and its r bit, runs adam_elem, writes the
/// new P, lo and exp_avg/exp_avg_sq, and packs the new r bits with a warp vote: lanes 0, 8, 16 and 24
/// each write one byte of r (the four bytes of the trip's 32 elements), only those of elements < n.
template <DType G>
__global__ void adam_compact_kernel(std::uint16_t* __restrict__ param, std::uint16_t* __restrict__ lo,
                                    std::uint8_t* __restrict__ rbits, float* __restrict__ m, float* __restrict__ v,
                                    const void* __restrict__ g, std::size_t n, AdamStepParams sp) {
  const unsigned lane = threadIdx.x % 32;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t base = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x - lane; base < n; base += stride) {
    const std::size_t i = base + lane;
    const std::uint32_t r = i < n ? compact_elem<G>(param, lo, m, v, g, i, compact_bit(rbits, i), sp) : 0u;
    const std::uint32_t vote = __ballot_sync(0xffffffffu, r);  // every lane of the warp is here
    if (lane % 8 == 0 && i < n) rbits[i / 8] = std::uint8_t(vote >> lane);  // unused high bits of a tail: 0
  }
}

/// adam_compact_kernel on elements [first, first + n) of a subgroup: the warps' trips are aligned to
/// the subgroup's own 32-element words of r (from first rounded down to 32), lanes outside the range
/// idle, and lane 0 writes each word: the vote whole, or, at the range's edges, merged into the word's
/// other bits.
template <DType G>
__global__ void adam_compact_at_kernel(std::uint16_t* __restrict__ param, std::uint16_t* __restrict__ lo,
                                       std::uint32_t* __restrict__ rwords, std::size_t first, float* __restrict__ m,
                                       float* __restrict__ v, const void* __restrict__ g, std::size_t n,
                                       AdamStepParams sp) {
  const unsigned lane = threadIdx.x % 32;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t j0 = first / 32 * 32, span = first + n - j0;
  for (std::size_t base = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x - lane; base < span; base += stride) {
    const std::size_t j = j0 + base + lane;  // the element's place in the subgroup
    const bool in = j >= first && j < first + n;
    const std::uint32_t r =
        in ? compact_elem<G>(param, lo, m, v, g, j - first, (rwords[j / 32] >> (j % 32)) & 1u, sp) : 0u;
    const std::uint32_t vote = __ballot_sync(0xffffffffu, r);  // every lane of the warp is here
    const std::uint32_t mine = __ballot_sync(0xffffffffu, in);
    if (lane == 0) {
      std::uint32_t& word = rwords[(j0 + base) / 32];
      word = mine == 0xffffffffu ? vote : (word & ~mine) | (vote & mine);
    }
  }
}

template <DType S>
__global__ void convert_kernel(const void* __restrict__ src, float* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = load_as_f32(src, S, i);
}

template <DType S>
__global__ void convert_kernel_vec4(const void* __restrict__ src, float* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x, nq = n / 4;
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < nq; q += stride) {
    float x[4];
    load4<S>(src, q, x);
    store4<DType::fp32>(dst, q, x);
  }
  for (std::size_t i = nq * 4 + std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = load_as_f32(src, S, i);
}

template <DType D>
__global__ void store_kernel(const float* __restrict__ src, void* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_from_f32(dst, D, i, src[i]);
}

template <DType D>
__global__ void store_kernel_vec4(const float* __restrict__ src, void* __restrict__ dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x, nq = n / 4;
  for (std::size_t q = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < nq; q += stride) {
    float x[4];
    load4<DType::fp32>(src, q, x);
    store4<D>(dst, q, x);
  }
  for (std::size_t i = nq * 4 + std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_from_f32(dst, D, i, src[i]);
}

constexpr int kThreads = 256;

unsigned grid_for(std::size_t n) {
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  const std::size_t cap = 132 * 32;  // enough resident blocks for any current GPU; the loop strides
  return unsigned(blocks < cap ? (blocks ? blocks : 1) : cap);
}

/// Whether ptr is aligned to four elements of `bytes_per_element` (the vector kernels' need).
bool aligned4(const void* ptr, std::size_t bytes_per_element) {
  return ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % (4 * bytes_per_element) == 0;
}

// Each family's kernels are chosen in one place, by the launch's runtime inputs (the dtypes, whether
// a parameter copy is written, whether the buffers allow the vector kernel): the launches call these
// functions, and preload_adam_kernels calls them over every value of those inputs, so the preload
// loads exactly the kernels a launch can use. nullptr: a dtype outside DType's values.
using AdamKernel = void (*)(float*, float*, float*, const void*, void*, std::size_t, AdamStepParams);
using ConvertKernel = void (*)(const void*, float*, std::size_t);
using StoreKernel = void (*)(const float*, void*, std::size_t);
using AdamCompactKernel = void (*)(std::uint16_t*, std::uint16_t*, std::uint8_t*, float*, float*, const void*,
                                   std::size_t, AdamStepParams);

constexpr DType kDTypes[] = {DType::fp32, DType::fp16, DType::bf16};

template <DType G, DType P, bool W>
AdamKernel adam_variant(bool vec) {
  return vec ? adam_kernel_vec4<G, P, W> : adam_kernel<G, P, W>;
}

/// Calls f with std::integral_constant<DType, d> for the runtime dtype d (so that f can name a
/// kernel instance by decltype(c)::value) and returns what f returns, a kernel pointer; nullptr for
/// a value outside DType's.
template <typename F>
auto with_dtype(DType d, F&& f) -> decltype(f(std::integral_constant<DType, DType::fp32>{})) {
  switch (d) {
    case DType::fp32: return f(std::integral_constant<DType, DType::fp32>{});
    case DType::fp16: return f(std::integral_constant<DType, DType::fp16>{});
    case DType::bf16: return f(std::integral_constant<DType, DType::bf16>{});
  }
  return nullptr;
}

/// The Adam kernel for gradients of gt, a parameter copy of pt written (write) or none, scalar or
/// vector (vec).
AdamKernel adam_kernel_for(DType gt, DType pt, bool write, bool vec) {
  return with_dtype(gt, [&](auto g) -> AdamKernel {
    constexpr DType G = decltype(g)::value;
    if (!write) return adam_variant<G, DType::fp32, false>(vec);
    return with_dtype(pt, [&](auto p) -> AdamKernel { return adam_variant<G, decltype(p)::value, true>(vec); });
  });
}

/// The compact-master Adam kernel for gradients of gt.
AdamCompactKernel adam_compact_kernel_for(DType gt) {
  return with_dtype(gt, [&](auto g) -> AdamCompactKernel { return adam_compact_kernel<decltype(g)::value>; });
}

using AdamCompactAtKernel = void (*)(std::uint16_t*, std::uint16_t*, std::uint32_t*, std::size_t, float*, float*,
                                     const void*, std::size_t, AdamStepParams);
/// The compact-master Adam kernel on a range of a subgroup, for gradients of gt.
AdamCompactAtKernel adam_compact_at_kernel_for(DType gt) {
  return with_dtype(gt, [&](auto g) -> AdamCompactAtKernel { return adam_compact_at_kernel<decltype(g)::value>; });
}

/// The kernel converting a buffer of st to fp32, scalar or vector.
ConvertKernel convert_kernel_for(DType st, bool vec) {
  return with_dtype(st, [&](auto c) -> ConvertKernel {
    constexpr DType S = decltype(c)::value;
    return vec ? convert_kernel_vec4<S> : convert_kernel<S>;
  });
}

/// The kernel storing fp32 into a buffer of dt, scalar or vector.
StoreKernel store_kernel_for(DType dt, bool vec) {
  return with_dtype(dt, [&](auto c) -> StoreKernel {
    constexpr DType D = decltype(c)::value;
    return vec ? store_kernel_vec4<D> : store_kernel<D>;
  });
}

/// Blocks for a kernel over n elements, scalar or vector (four elements per thread and trip).
unsigned grid_for_kernel(std::size_t n, bool vec) { return grid_for(vec ? (n + 3) / 4 : n); }

/// cudaFuncGetAttributes on `kernel` (which loads it); cudaErrorInvalidValue for nullptr.
template <typename K>
cudaError_t load_kernel(K kernel) {
  if (!kernel) return cudaErrorInvalidValue;
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, kernel);
}

}  // namespace

int preload_adam_kernels() {
  for (bool vec : {false, true})
    for (DType a : kDTypes) {
      for (DType b : kDTypes)
        for (bool write : {false, true})
          if (const cudaError_t e = load_kernel(adam_kernel_for(a, b, write, vec)); e != cudaSuccess) return int(e);
      if (const cudaError_t e = load_kernel(convert_kernel_for(a, vec)); e != cudaSuccess) return int(e);
      if (const cudaError_t e = load_kernel(store_kernel_for(a, vec)); e != cudaSuccess) return int(e);
    }
  for (DType a : kDTypes) {
    if (const cudaError_t e = load_kernel(adam_compact_kernel_for(a)); e != cudaSuccess) return int(e);
    if (const cudaError_t e = load_kernel(adam_compact_at_kernel_for(a)); e != cudaSuccess) return int(e);
  }
  return 0;
}

int adam_step_cuda(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp, void* stream) {
  if (n == 0) return 0;
  const bool write = param_out != nullptr;
  const bool vec = aligned4(master, 4) && aligned4(exp_avg, 4) && aligned4(exp_avg_sq, 4) &&
                   aligned4(grad, dtype_size(grad_dtype)) && (!write || aligned4(param_out, dtype_size(param_dtype)));
  const AdamKernel k = adam_kernel_for(grad_dtype, param_dtype, write, vec);
  if (!k) return int(cudaErrorInvalidValue);
  k<<<grid_for_kernel(n, vec), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(master, exp_avg, exp_avg_sq, grad,
                                                                               param_out, n, sp);
  return int(cudaGetLastError());
}

int adam_step_compact_cuda(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                           float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n,
                           const AdamStepParams& sp, void* stream) {
  if (n == 0) return 0;
  const AdamCompactKernel k = adam_compact_kernel_for(grad_dtype);
  if (!k) return int(cudaErrorInvalidValue);
  static_assert(kThreads % 32 == 0, "whole warps: the compact kernel's trips are warp-aligned");
  k<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(param, master_lo, round_up_bits, exp_avg,
                                                                    exp_avg_sq, grad, n, sp);
  return int(cudaGetLastError());
}

int adam_step_compact_cuda_at(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                              std::size_t first, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                              std::size_t n, const AdamStepParams& sp, void* stream) {
  if (n == 0) return 0;
  const AdamCompactAtKernel k = adam_compact_at_kernel_for(grad_dtype);
  if (!k) return int(cudaErrorInvalidValue);
  if (reinterpret_cast<std::uintptr_t>(round_up_bits) % 4 != 0) return int(cudaErrorMisalignedAddress);
  const std::size_t span = first + n - first / 32 * 32;  // whole words of r: the trips stay warp-aligned
  k<<<grid_for(span), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      param, master_lo, reinterpret_cast<std::uint32_t*>(round_up_bits), first, exp_avg, exp_avg_sq, grad, n, sp);
  return int(cudaGetLastError());
}

int convert_to_f32_cuda(const void* src, DType src_dtype, float* dst, std::size_t n, void* stream) {
  if (n == 0) return 0;
  const bool vec = aligned4(src, dtype_size(src_dtype)) && aligned4(dst, 4);
  const ConvertKernel k = convert_kernel_for(src_dtype, vec);
  if (!k) return int(cudaErrorInvalidValue);
  k<<<grid_for_kernel(n, vec), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n);
  return int(cudaGetLastError());
}

int convert_from_f32_cuda(const float* src, void* dst, DType dst_dtype, std::size_t n, void* stream) {
  if (n == 0) return 0;
  const bool vec = aligned4(src, 4) && aligned4(dst, dtype_size(dst_dtype));
  const StoreKernel k = store_kernel_for(dst_dtype, vec);
  if (!k) return int(cudaErrorInvalidValue);
  k<<<grid_for_kernel(n, vec), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n);
  return int(cudaGetLastError());
}

int benchmark_cuda_kernels(std::size_t n, DType dtype, double* adam_seconds, double* convert_seconds,
                           double* store_seconds) {
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
    *adam_seconds = *convert_seconds = *store_seconds = 1e30;
    // Runs one launch between two events and keeps the shortest time in *best (seconds).
    auto timed = [&](auto launch, double* best) {
      float ms = 0;
      ok(cudaEventRecord(start, nullptr));
      ok(cudaError_t(launch()));
      ok(cudaEventRecord(stop, nullptr));
      ok(cudaEventSynchronize(stop));
      ok(cudaEventElapsedTime(&ms, start, stop));
      if (e == cudaSuccess && ms * 1e-3 < *best) *best = ms * 1e-3;
    };
    for (int rep = 0; rep < 3 && e == cudaSuccess; ++rep) {
      timed([&] { return adam_step_cuda(p, m, v, g, dtype, out, dtype, n, sp, nullptr); }, adam_seconds);
      timed([&] { return convert_to_f32_cuda(g, dtype, g32, n, nullptr); }, convert_seconds);
      timed([&] { return convert_from_f32_cuda(g32, out, dtype, n, nullptr); }, store_seconds);
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

int benchmark_pcie(std::size_t bytes, PcieRoof* roof) {
  void *host_up = nullptr, *host_down = nullptr, *dev_up = nullptr, *dev_down = nullptr;
  cudaStream_t up = nullptr, down = nullptr;
  cudaEvent_t ev[4] = {};
  cudaError_t e = cudaHostAlloc(&host_up, bytes, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaHostAlloc(&host_down, bytes, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaMalloc(&dev_up, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&dev_down, bytes);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking);
  for (auto& x : ev)
    if (e == cudaSuccess) e = cudaEventCreate(&x);
  if (e == cudaSuccess) std::memset(host_up, 1, bytes);
  if (e == cudaSuccess) e = cudaMemset(dev_down, 1, bytes);
  *roof = PcieRoof{};
  auto timed = [&](bool do_up, bool do_down, double* r_up, double* r_down) {
    for (int rep = 0; rep < 3 && e == cudaSuccess; ++rep) {
      if (do_up) cudaEventRecord(ev[0], up);
      if (do_down) cudaEventRecord(ev[2], down);
      if (do_up) e = cudaMemcpyAsync(dev_up, host_up, bytes, cudaMemcpyHostToDevice, up);
      if (e == cudaSuccess && do_down) e = cudaMemcpyAsync(host_down, dev_down, bytes, cudaMemcpyDeviceToHost, down);
      if (do_up) cudaEventRecord(ev[1], up);
      if (do_down) cudaEventRecord(ev[3], down);
      float ms = 0;
      if (e == cudaSuccess && do_up) e = cudaEventSynchronize(ev[1]);
      if (e == cudaSuccess && do_down) e = cudaEventSynchronize(ev[3]);
      if (e == cudaSuccess && do_up && cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess)
        *r_up = std::max(*r_up, double(bytes) / (ms * 1e-3));
      if (e == cudaSuccess && do_down && cudaEventElapsedTime(&ms, ev[2], ev[3]) == cudaSuccess)
        *r_down = std::max(*r_down, double(bytes) / (ms * 1e-3));
    }
  };
  double unused = 0;
  timed(true, false, &roof->h2d, &unused);
  timed(false, true, &unused, &roof->d2h);
  timed(true, true, &roof->duplex_h2d, &roof->duplex_d2h);
  for (auto& x : ev)
    if (x) cudaEventDestroy(x);
  if (up) cudaStreamDestroy(up);
  if (down) cudaStreamDestroy(down);
  for (void* d : {dev_up, dev_down})
    if (d) cudaFree(d);
  for (void* h : {host_up, host_down})
    if (h) cudaFreeHost(h);
  return int(e);
}

}  // namespace dos
