// Independent references for the tests: a plain scalar double-precision Adam/AdamW written from
// PyTorch's documented algorithm (torch.optim.Adam / torch.optim.AdamW "Algorithm" boxes), and
// 16-bit conversions that do not share code with the kernels (fp16 through GCC's _Float16, whose
// conversions are libgcc's correctly rounded soft-float; bf16 through frexp/nearbyint in double).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ref {

struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
};

/// One step of Adam (decoupled=false) or AdamW (decoupled=true) at step count t, in double.
inline void adam_step(double& p, double& m, double& v, double g, const Hyper& h, long t) {
  if (h.decoupled) p *= 1.0 - h.lr * h.weight_decay;
  else if (h.weight_decay != 0) g += h.weight_decay * p;  // torch: "if lambda != 0"
  m = h.beta1 * m + (1.0 - h.beta1) * g;
  v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  const double mhat = m / (1.0 - std::pow(h.beta1, double(t)));
  const double vhat = v / (1.0 - std::pow(h.beta2, double(t)));
  p -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
}

/// The distance from |x| to the next larger float: one unit in the last place.
inline float ulp(float x) {
  x = std::fabs(x);
  return std::nextafter(x, INFINITY) - x;
}

inline float f16_bits_to_float(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return float(h);
}
inline uint16_t float_to_f16_bits(float x) {
  _Float16 h = _Float16(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// fp32 -> bf16 value (as a float), round to nearest even, computed in double arithmetic.
inline float round_to_bf16(float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  const double d = x;
  int e;
  std::frexp(d, &e);                        // |d| = m * 2^e, m in [0.5, 1)
  int q = e - 8;                            // 8 significant bits
  if (q < -133) q = -133;                   // bf16 subnormal quantum 2^-133
  const double r = std::nearbyint(std::ldexp(d, -q));  // ties to even (default rounding mode)
  const double out = std::ldexp(r, q);
  if (std::fabs(out) > 3.3895313892515355e38) return std::copysign(INFINITY, x);
  return float(out);
}

}  // namespace ref
