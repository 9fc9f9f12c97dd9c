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
// Kernels only: nothing here knows StarPU (the runtime's compact state, OptimizerOptions::compact_master,
// uses them through codelets.h). The helpers are plain integer arithmetic, the same on the host and on the GPU (DOS_HD).
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

/// adam_step_compact_cpu out of place for the state: the old state (in_lo, in_r: compact_round_up_bytes(n)
/// bytes, in_exp_avg, in_exp_avg_sq; n elements each, read only) is stepped into master_lo,
/// round_up_bits, exp_avg and exp_avg_sq (written whole: no byte of them is read before it is
/// written), param holding P on entry and the new P on return, as adam_step_compact_cpu's. The same
/// bits as adam_step_compact_cpu on a copy of the old state (every output byte, the last r byte's
/// unused high bits 0), on any alignment of the arrays. Block by block (2048 elements), as
/// compact_into_writes says: "stream" (the default) steps the old state into buffers of the
/// thread's own and writes them out with non-temporal stores (stream_copy_cpu: memcpy for the part
/// of each array's block before its first vector boundary and after its last), so that no output
/// line is read but those few: 26.25 bytes per parameter with a bf16 gradient, as
/// adam_step_compact_cpu's; "cache" copies the old state into the output and steps it there while
/// in cache, each output line read from memory by its first store. (The speculative update's, which
/// keeps the old state for a redo.) The input and output arrays must not overlap. Throws nothing.
void adam_step_compact_into_cpu(const std::uint16_t* in_lo, const std::uint8_t* in_r, const float* in_exp_avg,
                                const float* in_exp_avg_sq, std::uint16_t* param, std::uint16_t* master_lo,
                                std::uint8_t* round_up_bits, float* exp_avg, float* exp_avg_sq, const void* grad,
                                DType grad_dtype, std::size_t n, const AdamStepParams& sp);

/// How adam_step_compact_into_cpu writes its new state, as DOS_COMPACT_INTO says (a measurement
/// switch, read once; another value warns on stderr and gives the default): "stream" (the default),
/// each block stepped from the old state into the thread's own buffers and written with
/// non-temporal stores, so that no line of the output is read (but at each block's unaligned edges);
/// "cache", each block of the old state copied into the output and stepped there, whose first
/// stores read every output line from memory (about 10 more bytes per parameter than the step in
/// place). Measured on the GPU machine
/// (an H100's host, 15 threads, 5e7 elements, bf16 gradients, `dos-bench kernels`, two runs of each
/// in one call): "stream" 0.0090 and 0.0089 s, "cache" 0.0138 and 0.0123 s, the step in place
/// 0.0079-0.0087 s; the GPT of 1.01e9 parameters with the compact master overlapped ran 66468
/// tokens/s under "stream" and 57464 under "cache" (1.16x). On the 2-core development machine, not
/// bound by memory, no faster. The same bits either way. Throws nothing but std::bad_alloc.
const char* compact_into_writes();

/// adam_step_compact_cpu on elements [first, first + n) of a subgroup (a segment of it): param,
/// master_lo, exp_avg, exp_avg_sq and grad point at the range's first element (n elements each, as
/// adam_step_compact_cpu's), round_up_bits at the subgroup's packed r bits (element first + k's bit
/// is bit (first + k) % 8 of byte (first + k) / 8). Only the bits of the range are written: those of
/// the elements before and after it in the same bytes keep their values, so the segments of a
/// subgroup may be updated one after another in any order (not at once: their edge bytes are read
/// and written whole). The same bits as adam_step_compact_cpu on the whole subgroup. Throws nothing.
void adam_step_compact_cpu_at(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                              std::size_t first, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                              std::size_t n, const AdamStepParams& sp);

/// A compact state buffer's head (codelets.h, "compact state"): the fp32 elements that hold lo (stride
/// uint16_t: stride / 2 elements) and the packed r bits (ceil(stride / 32) 32-bit words), rounded up
/// to 16 elements so that exp_avg after it starts 64-byte aligned. At most `stride` (a multiple of 16,
/// state_stride_for), so the head fits in the master's slot of a full state buffer of the same stride.
constexpr std::size_t compact_head_floats(std::size_t stride) {
  return (stride / 2 + (stride + 31) / 32 + 15) / 16 * 16;
}

/// Bytes of a subgroup's compact state for n parameters (head, exp_avg, exp_avg_sq): 4 x
/// (compact_head_floats(s) + 2 s), s = state_stride_for(n); about 10.125 bytes per parameter plus
/// at most 244 bytes of padding. What a streamed subgroup's state moves each way.
constexpr std::size_t compact_state_bytes_for(std::size_t n) {
  return sizeof(float) * (compact_head_floats(state_stride_for(n)) + 2 * state_stride_for(n));
}

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
/// The CUDA twin of adam_step_compact_cpu_at: elements [first, first + n) of a subgroup, the arrays
/// at the range's first element, round_up_bits at the subgroup's packed r bits, which must be 4-byte
/// aligned (each warp writes one 32-bit word of r: element j's bit is bit j % 32 of word j / 32 on
/// this little-endian layout). The words at the range's two edges are read and merged: the bits of
/// other elements keep their values, so the segments of a subgroup launched one after another on
/// one stream give the bits of adam_step_compact_cuda on the whole subgroup. Returns a cudaError_t
/// value (0 = success; n == 0 launches nothing; a grad_dtype outside DType's values:
/// cudaErrorInvalidValue; round_up_bits not 4-byte aligned: cudaErrorMisalignedAddress, nothing
/// launched).
int adam_step_compact_cuda_at(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                              std::size_t first, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                              std::size_t n, const AdamStepParams& sp, void* stream);
#endif

}  // namespace dos
