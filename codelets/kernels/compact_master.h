// The compact master (docs/compact-master.md): an fp32 master M kept as the caller's bf16 parameter
// P = f32_to_bf16(M) (dtype.h: round to nearest even), M's low 16 bits lo and one bit r, whether the
// rounding went up. For every M that is not a NaN, M's high 16 bits are P - r (a carry through the
// exponent included, as in 0x7F7FFFFF -> P 0x7F80, inf, r 1), so
//
//     M = ((P - r) << 16) | lo        r in {0, 1}
//
// and exp_avg, exp_avg_sq, lo and r (4 + 4 + 2 + 1/8 = 10.125 bytes per parameter) stand for the
// 12 bytes of the fp32 state's master, exp_avg and exp_avg_sq beside P.
//
// Layout: for n parameters, lo is n uint16_t; the r bits are packed 8 per byte in a uint8_t array of
// compact_round_up_bytes(n) = ceil(n / 8) bytes, element i's bit being bit i % 8 of byte i / 8 (the
// lowest bit first). The unused high bits of the last byte (n % 8 != 0) are written 0 by the
// kernels and ignored when read.
//
// NaN: f32_to_bf16 makes every NaN 0x7FC0, so a NaN master's sign and payload are not kept. Its
// split gives r = 1 exactly when M's high half is not 0x7FC0, and the join of (0x7FC0, lo, r) is
// then 0x7FBF0000 | lo (a NaN: exponent all ones, fraction not 0), else 0x7FC00000 | lo (M itself):
// a NaN in, a positive NaN out, its low 16 bits those of M, its other bits not. The runtime's state
// checks reject non-finite masters anyway; infinities (P 0x7F80 or 0xFF80) come back exactly.
//
// Kernels only: nothing here knows StarPU, and the runtime does not use the compact form yet (the
// kernels below and `dos-bench host --state compact` exist; docs/compact-master.md, "Status"). The
// helpers are plain integer arithmetic, the same on the host and on the GPU (DOS_HD).
#pragma once

#include <cstddef>
#include <cstdint>

#include "adam.h"
#include "dtype.h"

namespace dos {

/// Bytes of the packed r bits of n parameters: ceil(n / 8).
constexpr std::size_t compact_round_up_bytes(std::size_t n) { return (n + 7) / 8; }

/// The rounding bit of master bits `m` (an fp32 bit pattern) whose bf16 rounding is `p`
/// (p == f32_to_bf16(bits_f32(m)), which the caller has at hand): 1 when p is not m's high half
/// (the rounding went up; for a NaN, when m's high half is not 0x7FC0), else 0.
DOS_HD std::uint32_t compact_round_up(std::uint32_t m, std::uint16_t p) { return std::uint32_t(p != (m >> 16)); }

/// Splits master bits `m` with bf16 rounding `p` (as compact_round_up) into its low half *lo and its
/// rounding bit *r (0 or 1).
DOS_HD void compact_split(std::uint32_t m, std::uint16_t p, std::uint16_t* lo, std::uint32_t* r) {
  *lo = std::uint16_t(m);
  *r = compact_round_up(m, p);
}

/// The master's fp32 bits from bf16 bits p, low half lo and rounding bit r (0 or 1):
/// ((p - r) << 16) | lo, computed modulo 2^32. For every non-NaN master M, compact_join of its
/// f32_to_bf16 rounding and its split is M's bits exactly; for a NaN, see the header's comment.
DOS_HD std::uint32_t compact_join(std::uint16_t p, std::uint16_t lo, std::uint32_t r) {
  return ((std::uint32_t(p) - r) << 16) | lo;
}

/// Element i's rounding bit from the packed array `bits` (bit i % 8 of byte i / 8).
DOS_HD std::uint32_t compact_bit(const std::uint8_t* bits, std::size_t i) { return (bits[i >> 3] >> (i & 7)) & 1u; }

/// One Adam/AdamW step over n parameters held in compact form, on the CPU: adam_step_cpu's step
/// (adam.h: PyTorch's formula in fp32, every operation rounded on its own; the same inline code,
/// adam_step_inline.h) on the master rebuilt from (param, master_lo, round_up_bits); the new master
/// is rounded into param and split back into master_lo and round_up_bits. The same bits as
/// adam_step_cpu on the whole master with a bf16 copy (new P, new master, exp_avg, exp_avg_sq) for
/// every master that is not a NaN.
///   param: n bf16 bit patterns, in: P = f32_to_bf16(master), out: the new P.
///   master_lo: n uint16_t, the masters' low halves, updated in place.
///   round_up_bits: compact_round_up_bytes(n) bytes of packed r bits (the header's layout), updated
///                  in place; no byte beyond them is read or written; the last byte's unused high
///                  bits are written 0.
///   exp_avg, exp_avg_sq: n fp32 each, updated in place.
///   grad: n elements of type grad_dtype (fp32, fp16 or bf16; another value is not checked, as in
///         adam_step_cpu), read only.
/// The arrays must not overlap; no alignment is needed. n may be any value, including 0. In blocks
/// of 2048 elements (adam_compact_cpu.cpp): one loop, vectorised by GCC for AVX-512, AVX2 or
/// baseline x86-64 (chosen at run time), reads and writes the arrays; the new r bits are packed
/// from the new masters kept in cache (compact_master_isa). OpenMP-parallel over the calling
/// thread's team in adam_step_cpu's work items of kCpuWorkItem elements (a multiple of 8: each byte
/// of r belongs to one item), handed out as cpu_adam_schedule() says. Every array is read before it
/// is written, with ordinary stores: a store reads no line the loop did not read, so with a bf16
/// gradient the step moves 14.125 bytes per parameter in and 12.125 out (26.25; adam_step_cpu with
/// a bf16 copy and non-temporal stores: 28).
void adam_step_compact_cpu(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                           float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n,
                           const AdamStepParams& sp);

/// The instruction set that packs adam_step_compact_cpu's new r bits and low halves: "avx512f",
/// "avx2" or "scalar" (chosen once from what the processor has; DOS_COMPACT_ISA=scalar|avx2|avx512f
/// in the environment picks one of those the processor has, for tests; a value that is not one of
/// them, or a path the processor lacks, is named in a warning on standard error and the best path
/// it has is used: the bits are the same on every path).
const char* compact_master_isa();

#if defined(DOS_HAVE_CUDA)
/// The CUDA twin of adam_step_compact_cpu: the same arguments as device pointers, launched
/// asynchronously on `stream` (a cudaStream_t); the same bits (built with --fmad=false). Each byte
/// of round_up_bits is written by one thread, from a warp vote (__ballot_sync) over 32 consecutive
/// elements. Returns a cudaError_t value (0 = success): with n > 0, a grad_dtype outside DType's
/// values launches nothing and returns cudaErrorInvalidValue; n == 0 launches nothing and returns 0.
/// preload_adam_kernels loads its kernels too.
int adam_step_compact_cuda(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                           float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n,
                           const AdamStepParams& sp, void* stream);
#endif

}  // namespace dos
