// Adam and AdamW update kernels: plain pointers, a count and the hyper-parameters.
// Nothing here knows StarPU (the codelets in ../codelets.h bind these to tasks).
//
// The formula is PyTorch's, element by element, in fp32 (torch.optim.Adam / torch.optim.AdamW,
// documentation "Algorithm" boxes, single-tensor implementation `_single_tensor_adam`):
//
//   Adam  (coupled L2):   g <- g + weight_decay * p                  grad.add(param, alpha=wd), if wd != 0
//   AdamW (decoupled):    p <- p * (1 - lr * weight_decay)           param.mul_(1 - lr * wd)
//   m <- lerp(m, g, 1 - beta1)                                         exp_avg.lerp_(grad, 1 - beta1)
//   v <- v * beta2 + ((1 - beta2) * g) * g                             exp_avg_sq.mul_(beta2).addcmul_(...)
//   p <- p + (-(lr / (1 - beta1^t)) * m) / (sqrt(v) / sqrt(1 - beta2^t) + eps)    param.addcdiv_(...)
//
// with the fp32 operations in the order of PyTorch's single-tensor implementation (lerp as ATen
// computes it: w < 0.5 ? m + w (g - m) : g - (g - m)(1 - w)), each operation rounded on its own.
// torch's own kernels round some of these as fused multiply-adds: with torch 1.13 on an AVX-512 CPU,
// lerp_ equals fma(w, g - m, m) and addcmul_ fma((1 - beta2) g, g, v beta2) on every element of a
// random 1e5-element test, and add(alpha=) is fused likewise; CUDA builds contract a * b + c by
// default. So torch.optim and these kernels agree to the bit on the first AdamW step and differ in
// the last place from the second (from the first for Adam's L2 term; torch's foreach and fused
// implementations, kernels of their own, were not compared). These kernels keep
// every operation rounded on its own (-ffp-contract=off, --fmad=false) so that the CPU and CUDA
// kernels, every instruction set and every policy give the same bits.
// where t is the subgroup's own step count (1 on the first update). The bias corrections are
// computed once per call in double precision on the host (make_adam_step_params) and passed as
// fp32, so the CPU and CUDA kernels evaluate exactly the same fp32 expression.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace dos {

/// The state stride of a subgroup of n parameters: n rounded up to a multiple of 16 elements. A
/// subgroup's Adam state is one fp32 buffer of 3 strides (master, exp_avg, exp_avg_sq: each slice
/// then starts 64-byte aligned when the buffer does).
constexpr std::size_t state_stride_for(std::size_t n) { return (n + 15) / 16 * 16; }

/// Bytes of a subgroup's Adam state buffer for n parameters: 3 * 4 * state_stride_for(n), that is
/// 12 bytes per parameter plus at most 180 bytes of padding. What a subgroup's state takes in GPU
/// memory, streamed or resident.
constexpr std::size_t state_bytes_for(std::size_t n) { return 3 * sizeof(float) * state_stride_for(n); }

/// Elements per work item of the CPU kernels below (64 KiB of fp32): adam_step_cpu,
/// adam_step_into_cpu, zero_fill_cpu and the conversions hand their arrays to the calling thread's
/// OpenMP team in items of this many elements, and copy_cpu in items of this many fp32's bytes.
constexpr std::size_t kCpuWorkItem = std::size_t(1) << 14;

/// Whether a CPU kernel below, run on n elements of at most 4 bytes each, opens a parallel region
/// with the calling thread's team (more than one work item): n > kCpuWorkItem. Otherwise the kernel
/// runs on the calling thread alone and wakes no other thread.
constexpr bool cpu_kernel_forks(std::size_t n) { return n > kCpuWorkItem; }

/// Whether copy_cpu on `bytes` opens a parallel region: more than one work item of kCpuWorkItem
/// fp32's bytes (64 KiB).
constexpr bool cpu_copy_forks(std::size_t bytes) { return bytes > kCpuWorkItem * sizeof(float); }

/// Hyper-parameters of Adam/AdamW, as in torch.optim.Adam / torch.optim.AdamW.
/// lr: learning rate (finite, >= 0); beta1, beta2: in [0, 1); eps: finite, >= 0, added to the denominator;
/// weight_decay: >= 0; decoupled: true for AdamW (decoupled weight decay), false for Adam
/// (weight decay added to the gradient, "L2"). amsgrad, maximize and capturable are not supported.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;
};

/// The fp32 constants of one Adam step at step count `step` (see make_adam_step_params).
struct AdamStepParams {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float step_size;             ///< lr / (1 - beta1^step)
  float bias_correction2_sqrt; ///< sqrt(1 - beta2^step)
  float l2;                    ///< weight_decay if coupled (Adam), else 0; the kernels add l2 * p only where l2 != 0
  float decay;                 ///< 1 - lr * weight_decay if decoupled (AdamW), else 1
};

/// ATen's scalar lerp: start + weight * (end - start), computed from the nearer end.
DOS_HD float lerp_torch(float start, float end, float weight) {
  return weight < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

/// Returns the step constants for step count `step` (>= 1), computed in double and rounded to
/// fp32 once. Throws nothing; the caller validates `h` (see validate_adam_hyper in runtime).
AdamStepParams make_adam_step_params(const AdamHyper& h, std::int64_t step);

/// One Adam/AdamW step over n elements on the CPU (vectorised, OpenMP-parallel over the
/// calling thread's team in work items of 16384 elements handed out one at a time, or one
/// contiguous range of them per thread with DOS_CPU_SCHEDULE=static in the environment, a
/// measurement switch with the same bits; the instruction set is chosen at run time).
///   master, exp_avg, exp_avg_sq: fp32 arrays of n elements, updated in place.
///   grad: n elements of type grad_dtype (fp32, fp16 or bf16), read only.
///   param_out: n elements of type param_dtype, written with the new master parameters rounded
///              to nearest even; may be nullptr (no 16-bit copy wanted).
/// n may be any value, including 0 and sizes that are not a multiple of the SIMD width.
void adam_step_cpu(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp);

/// adam_step_cpu out of place: the state is read from master_in, exp_avg_in, exp_avg_sq_in and the
/// new state written to master, exp_avg, exp_avg_sq (n fp32 each; the output arrays must not
/// overlap the inputs), the inputs left as they were. The same fp32 operations in the same order as
/// adam_step_cpu, hence the same bits: what a speculative update (computed before it is known to be
/// kept) writes beside the state it may have to be redone from. The new state is written block by
/// block from buffers of the thread's own with the stores cpu_param_copy_stores names: non-temporal
/// ones read no line of the output first but the partial lines at each block's ends (an output not
/// 64-byte aligned); ordinary ones read every line. How each block is stepped is adam_into_reads'.
void adam_step_into_cpu(const float* master_in, const float* exp_avg_in, const float* exp_avg_sq_in, float* master,
                        float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, void* param_out,
                        DType param_dtype, std::size_t n, const AdamStepParams& sp);

/// How adam_step_into_cpu steps the old state, as DOS_ADAM_INTO in the environment says (a
/// measurement switch, read once; another value warns on standard error and gives the default):
/// "direct" (the default), from where the old state lies into blocks of 2048 elements of the thread's
/// own (24 KiB), each then streamed out; "copy", each work item's old state (16384 elements, 192 KiB)
/// copied into the thread's blocks first and stepped there in place. Both move the bytes of the step
/// in place (28 per parameter with a bf16 gradient and copy, both streamed: from 16384 elements with
/// non-temporal stores); "copy" adds a pass through the cache.
/// The same bits either way. Throws nothing.
const char* adam_into_reads();

/// Copies `bytes` from src to dst (not overlapping) on the CPU, OpenMP-parallel in 64 KiB chunks.
void copy_cpu(void* dst, const void* src, std::size_t bytes);

/// Copies `bytes` from src to dst (not overlapping, any alignment) on the calling thread with
/// non-temporal stores, as adam_step_into_cpu writes its new state: no line of dst is read before
/// it is written. The head before dst's first vector boundary and the tail go by memcpy; the
/// instruction set is chosen once from the processor (AVX-512, AVX, else memcpy throughout), and
/// DOS_NT_STORES=0 in the environment makes it all memcpy (a measurement switch; the same bytes
/// every way). The caller fences (_mm_sfence) before another thread or a device reads dst. Throws
/// nothing.
void stream_copy_cpu(void* dst, const void* src, std::size_t bytes);

/// Zeroes n floats, OpenMP-parallel over the calling thread's team, one contiguous range of
/// 16384-element work items per thread, so that the pages are first touched, hence placed, on the
/// NUMA nodes of the team's cores. adam_step_cpu hands the same items out dynamically by default,
/// so with a team spread over several NUMA nodes an item may run on another node than its pages;
/// DOS_CPU_SCHEDULE=static keeps each on the thread that first touched it.
void zero_fill_cpu(float* p, std::size_t n);

/// Converts n elements of type src_dtype to fp32 on the CPU (OpenMP-parallel).
void convert_to_f32_cpu(const void* src, DType src_dtype, float* dst, std::size_t n);

/// Converts n fp32 elements to type dst_dtype on the CPU, rounding to nearest even (OpenMP-parallel).
void convert_from_f32_cpu(const float* src, void* dst, DType dst_dtype, std::size_t n);

/// The instruction set the CPU's fp16 conversions use: "avx512f", "f16c" or "scalar" (chosen once
/// from what the processor has; DOS_F16_ISA=scalar|f16c|avx512f in the environment picks one of
/// those the processor has, for tests; a value that is not one of them, or a path the processor
/// lacks, is named in a warning on standard error and the best path it has is used: the bits are
/// the same on every path).
const char* f16_conversion_isa();

/// How adam_step_cpu and adam_step_into_cpu hand their work items to the team's threads:
/// "dynamic" (one at a time, the default) or "static" (one contiguous range per thread, with
/// DOS_CPU_SCHEDULE=static in the environment, read once). The same bits either way.
const char* cpu_adam_schedule();

/// How adam_step_cpu writes its parameter copy (arrays of kChunk = 16384 elements or more) and
/// adam_step_into_cpu its new state: "non-temporal avx512f" or "non-temporal avx" (streaming
/// stores: the destination's lines are not read first, so an in-place update with 16-bit gradient
/// and copy moves 28 bytes per parameter), or "cached (memcpy)" (ordinary stores, which read each
/// destination line first: 30 bytes). Chosen once from what the processor has; DOS_NT_STORES=0
/// (cached) or =avx in the environment picks another, with the same bits.
const char* cpu_param_copy_stores();

#if defined(DOS_HAVE_CUDA)
/// CUDA twins of the functions above: same arguments, device pointers, launched asynchronously on
/// `stream` (a cudaStream_t). Errors of the launch are returned as a cudaError_t value (0 = success).
/// With n > 0, a dtype outside DType's values that the call uses (adam_step_cuda's grad_dtype, and
/// its param_dtype when param_out is not nullptr; the conversions' dtype) launches nothing and
/// returns cudaErrorInvalidValue; n == 0 launches nothing and returns 0 whatever the dtypes.
int adam_step_cuda(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp, void* stream);
int convert_to_f32_cuda(const void* src, DType src_dtype, float* dst, std::size_t n, void* stream);
int convert_from_f32_cuda(const float* src, void* dst, DType dst_dtype, std::size_t n, void* stream);

/// Times the CUDA kernels above on n elements of scratch device memory (zeroed; gradients and the
/// parameter copy of type `dtype`), best of 3 runs each, with CUDA events: Adam in *adam_seconds,
/// the gradient conversion (dtype -> fp32) in *convert_seconds, the parameter conversion (fp32 ->
/// dtype) in *store_seconds. Returns a cudaError_t value (0 = success).
int benchmark_cuda_kernels(std::size_t n, DType dtype, double* adam_seconds, double* convert_seconds,
                           double* store_seconds);

/// Times a device-to-device cudaMemcpy of `bytes` (best of 3, CUDA events): the device-memory
/// roof (it reads and writes `bytes` each). Returns a cudaError_t value (0 = success).
int benchmark_cuda_copy(std::size_t bytes, double* seconds);

/// The PCIe roof: copies `bytes` between pinned host memory (cudaHostAlloc) and the device with
/// cudaMemcpyAsync on two streams, best of 3 (CUDA events): host-to-device alone, device-to-host
/// alone, and both at once (each direction timed on its own stream). Rates in bytes/s.
/// Returns a cudaError_t value (0 = success).
struct PcieRoof {
  double h2d = 0, d2h = 0, duplex_h2d = 0, duplex_d2h = 0;
};
int benchmark_pcie(std::size_t bytes, PcieRoof* roof);

/// Loads every kernel of adam_cuda.cu (each Adam, conversion and store kernel, every dtype, scalar
/// and vector, and the compact-master Adam kernels of compact_master.h, every gradient dtype) into the current device's context, now. Under CUDA's lazy loading (the default since
/// CUDA 12.2, CUDA_MODULE_LOADING=LAZY) a kernel is otherwise loaded at its first launch, and that
/// load can wait for the work already running on the device: in an optimizer's first update phase
/// the first Adam, queued behind gigabytes of state transfers, then waited for them (tens of
/// milliseconds) and held up every streamed subgroup behind it. cudaFuncGetAttributes on a kernel
/// loads it (CUDA's runtime looks a kernel up in its module, which loads it, the first time the
/// kernel is referenced). Call it on each device before work is queued there (the runtime does, on
/// each CUDA worker, when it starts). It asks the launches' own kernel choice (adam_cuda.cu) for
/// every value of its inputs (the dtypes, a parameter copy written or not, scalar or vector), so
/// it loads every kernel a launch can use. Under eager loading it only reads the attributes. Returns a cudaError_t value (0 = success):
/// the first failure, e.g. cudaErrorNoKernelImageForDevice when the build has no code for the
/// device (meson's gpu_arch option).
int preload_adam_kernels();
#endif

}  // namespace dos
