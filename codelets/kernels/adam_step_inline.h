// The CPU kernels' shared pieces (adam_cpu.cpp, adam_compact_cpu.cpp): one element's Adam/AdamW
// step, so that the full and the compact form of the master run the same fp32 operations in the
// same order, and the instruction sets the element loops are compiled for. Internal to the kernels.
#pragma once

#include <cmath>

#include "adam.h"

// The element loops are compiled by GCC for AVX-512, AVX2 and baseline x86-64 through
// target_clones; the loader picks the best at run time.
#if defined(__x86_64__) && !defined(DOS_NO_TARGET_CLONES)
#define DOS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DOS_CLONES
#endif

namespace dos {
namespace detail {

/// One element's Adam/AdamW step (adam.h's formula, PyTorch's operation order), shared by
/// adam_cpu.cpp's adam_range and adam_compact_cpu.cpp's compact_range so that the full and the
/// compact form of the master run the same fp32 operations: returns the new master from the master
/// pi and the gradient gi, and sets the new moments mi, vi from m_in, v_in (read where the formula
/// reads them; they may be the arrays' elements). The constants are AdamStepParams' fields, passed
/// as the loops' own locals.
template <bool L2>
inline __attribute__((always_inline)) float adam_update(float pi, float& mi, float& vi, float gi, const float& m_in,
                                                        const float& v_in, float omb1, float b2, float omb2, float eps,
                                                        float step_size, float bc2s, float l2, float decay) {
  // Adam: coupled L2, left out where l2 is 0 (AdamW, or Adam without weight decay) as torch skips
  // grad.add(param, alpha=0): 0 * an infinite master would make the gradient NaN. A template
  // argument, not a select in the loop: GCC vectorised no bf16 variant with the select (3.5x slower)
  if (L2) gi = gi + l2 * pi;
  pi = pi * decay;                          // AdamW: decoupled decay (decay = 1 for Adam)
  mi = lerp_torch(m_in, gi, omb1);          // exp_avg.lerp_(grad, 1 - beta1)
  vi = v_in * b2 + (omb2 * gi) * gi;        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
  float denom = std::sqrt(vi) / bc2s + eps;  // (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
  return pi + (-step_size * mi) / denom;    // param.addcdiv_(exp_avg, denom, value=-step_size)
}

}  // namespace detail
}  // namespace dos
