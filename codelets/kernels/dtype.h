// Element types of parameters and gradients, and the scalar fp32 <-> fp16/bf16 conversions.
//
// The conversions are plain integer arithmetic (no intrinsics), so that the same code compiles
// for the host (where GCC vectorises it) and for CUDA, and they round to nearest, ties to even,
// as PyTorch's `.to(torch.float16)` / `.to(torch.bfloat16)` do (IEEE 754 roundTiesToEven).
// Kernels only: nothing here knows StarPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__)
#define DOS_HD __host__ __device__ __forceinline__
#else
#define DOS_HD inline
#endif

namespace dos {

/// Element type of a caller-owned buffer (parameters or gradients).
/// fp32: IEEE binary32 (4 bytes); fp16: IEEE binary16 (2 bytes); bf16: bfloat16 (2 bytes,
/// the upper half of a binary32).
enum class DType : std::uint8_t { fp32 = 0, fp16 = 1, bf16 = 2 };

/// Size of one element of `t`, in bytes (4 or 2).
DOS_HD std::size_t dtype_size(DType t) { return t == DType::fp32 ? 4u : 2u; }

/// Name used on the command line and in files: "fp32", "fp16" or "bf16".
inline const char* dtype_name(DType t) {
  return t == DType::fp32 ? "fp32" : (t == DType::fp16 ? "fp16" : "bf16");
}

/// The IEEE binary32 bit pattern of f (a bit copy, no conversion; on the host and the GPU).
DOS_HD std::uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

/// The float whose IEEE binary32 bit pattern is u (the inverse of f32_bits; a bit copy).
DOS_HD float bits_f32(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// bfloat16 bits -> fp32 (exact).
DOS_HD float bf16_to_f32(std::uint16_t h) { return bits_f32(std::uint32_t(h) << 16); }

/// fp32 -> bfloat16 bits, round to nearest even; every NaN becomes 0x7FC0, as in PyTorch's
/// c10::detail::round_to_nearest_even.
DOS_HD std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t(0x7fc0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));  // cvt.rn.bf16.f32: the same rounding
#endif
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

/// IEEE binary16 bits -> fp32 (exact, subnormals and inf/NaN included). On the GPU the hardware
/// conversion (exact as well) serves every finite or infinite value; NaN keeps the software path so
/// that its payload is carried over the same way on both sides.
DOS_HD float f16_to_f32(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0) return __half2float(__ushort_as_half(h));
#endif
  std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in fp32
  float mag = float(man) * 5.9604644775390625e-8f;
  return bits_f32(sign | f32_bits(mag));
}

/// fp32 -> IEEE binary16 bits, round to nearest even; overflow gives inf, NaN stays NaN. On the
/// GPU, the hardware's round-to-nearest-even conversion (cvt.rn.f16.f32, the same IEEE rounding)
/// serves every value but NaN.
DOS_HD std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = f32_bits(f);
  std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#endif
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {  // normal fp16 range (>= 2^-14)
    std::uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return std::uint16_t(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): +-0
  // subnormal fp16: shift the 24-bit significand right, round to nearest even
  std::uint32_t e = a >> 23;                     // 102..112
  std::uint32_t m = (a & 0x7fffffu) | 0x800000u;  // implicit bit
  std::uint32_t shift = 126u - e;                 // 14..24
  std::uint32_t q = m >> shift;
  std::uint32_t rem = m & ((1u << shift) - 1u);
  std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return std::uint16_t(sign | q);
}

/// Reads element i of a buffer of type `t` as fp32.
DOS_HD float load_as_f32(const void* p, DType t, std::size_t i) {
  if (t == DType::fp32) return static_cast<const float*>(p)[i];
  std::uint16_t h = static_cast<const std::uint16_t*>(p)[i];
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/// Writes fp32 value x into element i of a buffer of type `t` (rounded to nearest even).
DOS_HD void store_from_f32(void* p, DType t, std::size_t i, float x) {
  if (t == DType::fp32) {
    static_cast<float*>(p)[i] = x;
    return;
  }
  static_cast<std::uint16_t*>(p)[i] = t == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
}

}  // namespace dos
