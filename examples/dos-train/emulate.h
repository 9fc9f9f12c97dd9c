// Emulated forward/backward for dos-train: deterministic parameter initialisation and gradients,
// from a seed, computed identically on the host and on the GPU (a counter-based hash, no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../../codelets/kernels/dtype.h"

namespace dos_train {

/// splitmix64 finaliser: a well-mixed 64-bit hash of x.
DOS_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// An approximately standard-normal value for (seed, stream, index): the sum of four uniforms
/// in [0, 1) (24-bit, exact in fp32), centred and scaled to unit variance (Irwin-Hall). Only
/// additions and one final multiplication: the same fp32 result on the host and the GPU.
DOS_HD float normal_like(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t a = mix64(seed ^ mix64(stream ^ mix64(index)));
  const std::uint64_t b = mix64(a);
  const float u0 = float(a >> 40) * (1.0f / 16777216.0f);
  const float u1 = float((a >> 16) & 0xffffffu) * (1.0f / 16777216.0f);
  const float u2 = float(b >> 40) * (1.0f / 16777216.0f);
  const float u3 = float((b >> 16) & 0xffffffu) * (1.0f / 16777216.0f);
  return ((u0 + u1) + (u2 + u3) - 2.0f) * 1.7320508f;
}

/// Gradient of global parameter `index` at iteration `iter`: normal_like * scale.
/// 1e-3 is the order of a per-element gradient of a GPT-style model in bf16 training after
/// clipping; the exact value only matters for the optimizer's numerics, not for its speed.
constexpr float kGradScale = 1e-3f;
DOS_HD float emulated_grad(std::uint64_t seed, std::uint64_t iter, std::uint64_t index) {
  return normal_like(seed, 0x6772616400000000ull + iter, index) * kGradScale;
}

/// Data-parallel rank `part`'s contribution to the gradient of global parameter `index` at
/// iteration `iter`, when the gradient is the sum of the ranks' contributions (dos-train as W MPI
/// ranks, or --grad-parts W in one process): normal_like * 2^-10 truncated to a multiple of 2^-20
/// (|q| 2^-20 with |q| < 2^12, about emulated_grad's size). Sums of up to 2^11 of them are exact in
/// fp32 in any order, so a W-rank job and a one-process run with --grad-parts W see the same
/// gradients bit for bit, whatever order the reduction takes.
DOS_HD float emulated_grad_part(std::uint64_t seed, std::uint64_t iter, std::uint64_t part, std::uint64_t index) {
  const float x = normal_like(seed ^ mix64(0x7061727400000000ull + part), 0x6772616400000000ull + iter, index);
  return float(int(x * 1024.0f)) * (1.0f / 1048576.0f);
}

/// Part `part` of the gradient of global parameter `index` when it is the sum of `parts` parts:
/// emulated_grad itself when parts == 1 (so a one-part job on any number of ranks, where one rank
/// adds it and the others add zeros, sees exactly the gradients of a plain one-process run), else
/// emulated_grad_part.
DOS_HD float grad_part(std::uint64_t seed, std::uint64_t iter, std::uint64_t part, std::uint64_t parts,
                       std::uint64_t index) {
  return parts == 1 ? emulated_grad(seed, iter, index) : emulated_grad_part(seed, iter, part, index);
}

/// Sums parts [part_begin, part_end) of `parts` (grad_part), in part order, for global indices
/// [first, first + n) into dst (fp32, host memory), with OpenMP; zeros when the range is empty.
void fill_grad_parts_host(float* dst, std::size_t n, std::uint64_t seed, std::uint64_t iter, std::uint64_t first,
                          std::uint64_t part_begin, std::uint64_t part_end, std::uint64_t parts);

/// Writes n gradients of global indices [first, first + n) for iteration `iter` into dst (dtype t),
/// on the host with OpenMP.
void fill_grads_host(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                     std::uint64_t first);

#if defined(DOS_HAVE_CUDA)
/// The CUDA stream of the emulation's kernels (gradients, norms): non-blocking, created at first use
/// (a cudaStream_t). Throws std::runtime_error when it cannot be created.
struct CUstream_st* emulation_stream();
/// Same on the GPU (dst a device pointer); synchronous. Throws std::runtime_error on a CUDA error.
void fill_grads_cuda(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                     std::uint64_t first);
/// fill_grad_parts_host on the GPU (dst: n floats of device memory), the same bits; synchronous.
void fill_grad_parts_cuda(float* dst, std::size_t n, std::uint64_t seed, std::uint64_t iter, std::uint64_t first,
                          std::uint64_t part_begin, std::uint64_t part_end, std::uint64_t parts);
/// dst[i] = src[i] rounded to dtype t (dos::store_from_f32, round to nearest even) for i < n, both
/// device pointers; synchronous. Throws std::runtime_error on a CUDA error.
void store_from_f32_cuda(void* dst, dos::DType t, const float* src, std::size_t n);
/// The number of GPUs CUDA sees (0 when none or no driver).
int cuda_device_count();
/// Makes `device` the calling thread's current GPU (cudaSetDevice); throws on a CUDA error.
void cuda_set_device(int device);
/// The PCI bus id of `device` ("0000:3b:00.0"), "" when CUDA cannot tell.
std::string cuda_pci_bus_id(int device);
/// Device memory helpers for the caller-owned buffers (throw std::runtime_error with CUDA's message).
void* cuda_alloc(std::size_t bytes);
void cuda_free(void* p);
void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes);
void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes);
/// Device memory free now on the current GPU and its total, bytes (cudaMemGetInfo); throws
/// std::runtime_error with CUDA's message.
void cuda_memory_info(std::size_t* free_bytes, std::size_t* total_bytes);
#endif

}  // namespace dos_train
