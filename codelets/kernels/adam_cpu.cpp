// CPU Adam/AdamW and conversion kernels (see adam.h for the formula and the contract).
//
// Vectorisation: the element loop is written once (adam_elem) and compiled by GCC for AVX-512,
// AVX2 and baseline x86-64 through target_clones; the loader picks the best at run time, so one
// binary serves the CI machine and the GPU machine. Tails need no special code: the compiler's
// vector loop has its own scalar epilogue. Built with -ffp-contract=off so that every variant,
// and the CUDA kernel (built with --fmad=false), evaluate the same fp32 operations in the same
// order: results do not depend on the instruction set or on where a subgroup ran.
// OpenMP splits the array into chunks across the calling thread's team.
#include "adam.h"

#include <cmath>

namespace dos {

AdamStepParams make_adam_step_params(const AdamHyper& h, std::int64_t step) {
  AdamStepParams sp;
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  sp.beta1 = float(h.beta1);
  sp.one_minus_beta1 = float(1.0 - h.beta1);
  sp.beta2 = float(h.beta2);
  sp.one_minus_beta2 = float(1.0 - h.beta2);
  sp.eps = float(h.eps);
  sp.step_size = float(h.lr / bc1);
  sp.bias_correction2_sqrt = float(std::sqrt(bc2));
  sp.l2 = h.decoupled ? 0.0f : float(h.weight_decay);
  sp.decay = h.decoupled ? float(1.0 - h.lr * h.weight_decay) : 1.0f;
  return sp;
}

namespace {

constexpr std::size_t kChunk = 1 << 14;  // elements per OpenMP work item (64 KiB of fp32)

#if defined(__x86_64__) && !defined(DOS_NO_TARGET_CLONES)
#define DOS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DOS_CLONES
#endif

template <DType G, DType P, bool WriteParam>
inline __attribute__((always_inline)) void adam_range(float* __restrict p, float* __restrict m,
                                                      float* __restrict v, const void* __restrict g,
                                                      void* __restrict out, std::size_t n,
                                                      const AdamStepParams& sp) {
  const float omb1 = sp.one_minus_beta1, b2 = sp.beta2, omb2 = sp.one_minus_beta2;
  const float eps = sp.eps, step_size = sp.step_size, bc2s = sp.bias_correction2_sqrt;
  const float l2 = sp.l2, decay = sp.decay;
  for (std::size_t i = 0; i < n; ++i) {
    float gi = load_as_f32(g, G, i);
    float pi = p[i];
    gi = gi + l2 * pi;      // Adam: coupled L2 (l2 = 0 for AdamW)
    pi = pi * decay;        // AdamW: decoupled decay (decay = 1 for Adam)
    float mi = lerp_torch(m[i], gi, omb1);   // exp_avg.lerp_(grad, 1 - beta1)
    float vi = v[i] * b2 + (omb2 * gi) * gi;  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    float denom = std::sqrt(vi) / bc2s + eps;  // (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    pi = pi + (-step_size * mi) / denom;      // param.addcdiv_(exp_avg, denom, value=-step_size)
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (WriteParam) store_from_f32(out, P, i, pi);
  }
}

// One non-template, target-cloned function per (grad dtype, param dtype) pair.
#define DOS_ADAM_VARIANT(NAME, G, P, W)                                                         \
  DOS_CLONES void NAME(float* p, float* m, float* v, const void* g, void* out, std::size_t n, \
                       const AdamStepParams& sp) {                                              \
    adam_range<G, P, W>(p, m, v, g, out, n, sp);                                                \
  }
DOS_ADAM_VARIANT(adam_f32_none, DType::fp32, DType::fp32, false)
DOS_ADAM_VARIANT(adam_f32_f32, DType::fp32, DType::fp32, true)
DOS_ADAM_VARIANT(adam_f32_f16, DType::fp32, DType::fp16, true)
DOS_ADAM_VARIANT(adam_f32_bf16, DType::fp32, DType::bf16, true)
DOS_ADAM_VARIANT(adam_f16_none, DType::fp16, DType::fp32, false)
DOS_ADAM_VARIANT(adam_f16_f32, DType::fp16, DType::fp32, true)
DOS_ADAM_VARIANT(adam_f16_f16, DType::fp16, DType::fp16, true)
DOS_ADAM_VARIANT(adam_bf16_none, DType::bf16, DType::fp32, false)
DOS_ADAM_VARIANT(adam_bf16_f32, DType::bf16, DType::fp32, true)
DOS_ADAM_VARIANT(adam_bf16_bf16, DType::bf16, DType::bf16, true)
DOS_ADAM_VARIANT(adam_f16_bf16, DType::fp16, DType::bf16, true)
DOS_ADAM_VARIANT(adam_bf16_f16, DType::bf16, DType::fp16, true)
#undef DOS_ADAM_VARIANT

using AdamFn = void (*)(float*, float*, float*, const void*, void*, std::size_t, const AdamStepParams&);

AdamFn pick_adam(DType g, DType p, bool write) {
  static const AdamFn table[3][4] = {
      // param: fp32, fp16, bf16, none
      {adam_f32_f32, adam_f32_f16, adam_f32_bf16, adam_f32_none},
      {adam_f16_f32, adam_f16_f16, adam_f16_bf16, adam_f16_none},
      {adam_bf16_f32, adam_bf16_f16, adam_bf16_bf16, adam_bf16_none},
  };
  return table[int(g)][write ? int(p) : 3];
}

#define DOS_CONVERT_VARIANT(NAME, S)                                           \
  DOS_CLONES void NAME(const void* src, float* __restrict dst, std::size_t n) { \
    for (std::size_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, S, i);       \
  }
DOS_CONVERT_VARIANT(convert_f16, DType::fp16)
DOS_CONVERT_VARIANT(convert_bf16, DType::bf16)
DOS_CONVERT_VARIANT(convert_f32, DType::fp32)
#undef DOS_CONVERT_VARIANT

}  // namespace

void adam_step_cpu(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp) {
  const AdamFn fn = pick_adam(grad_dtype, param_dtype, param_out != nullptr);
  const std::size_t gsz = dtype_size(grad_dtype), psz = dtype_size(param_dtype);
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kChunk;
    const std::size_t len = off + kChunk <= n ? kChunk : n - off;
    fn(master + off, exp_avg + off, exp_avg_sq + off, static_cast<const char*>(grad) + off * gsz,
       param_out ? static_cast<char*>(param_out) + off * psz : nullptr, len, sp);
  }
}

void convert_to_f32_cpu(const void* src, DType src_dtype, float* dst, std::size_t n) {
  auto fn = src_dtype == DType::fp16 ? convert_f16 : (src_dtype == DType::bf16 ? convert_bf16 : convert_f32);
  const std::size_t ssz = dtype_size(src_dtype);
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kChunk;
    const std::size_t len = off + kChunk <= n ? kChunk : n - off;
    fn(static_cast<const char*>(src) + off * ssz, dst + off, len);
  }
}

}  // namespace dos
