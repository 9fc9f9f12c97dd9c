// A training iteration's forward and backward, emulated with the model's real GEMM shapes, so that
// the update phase runs between compute phases and GPU memory rises and falls as in training
// (the emulated iteration). Values are constants: only the times and the memory matter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "../../codelets/kernels/dtype.h"
#include "model_config.h"

namespace dos_train {

/// One linear layer: Y[T, out] = X[T, in] W[out, in]^T for T tokens; in, out: features
/// (elements per token).
struct Gemm {
  std::int64_t in = 0, out = 0;
};

/// The linear layers of one forward pass, grouped by transformer layer, the output head (lm_head,
/// or the tied embedding) as a last group of its own. From param_tensors(c): every 2-D weight but
/// the embeddings. Attention's token-by-token products (T x T per head) and the element-wise
/// operations are not emulated.
std::vector<std::vector<Gemm>> forward_gemms(const ModelConfig& c);

/// The group (forward_gemms' index) whose backward makes the gradient of parameter tensor `name`
/// final: its transformer layer (names "h.L." for gpt2, "model.layers.L." otherwise); c.layers for
/// the output head and the final norm, whose backward comes first; c.layers + 1 for the embeddings
/// (also the tied output head's weight), final only when backward has ended.
std::size_t backward_group(const ModelConfig& c, const std::string& name);

/// Times and memory of one emulated forward and backward.
/// forward, backward: seconds (wall, device synchronised); backward_device: seconds the device spent
/// from the start of each group's backward GEMMs to their end, summed over groups (CUDA events on the
/// GPU, the wall clock on the CPU stand-in): what backward would take with nothing else in the way;
/// backward_launch: seconds the host spent in the calls that enqueue backward's GEMMs (microseconds
/// each, unless another thread holds the device: a cudaFree elsewhere waits for the whole device);
/// backward_release: seconds spent in after_group (the gradients written and declared final);
/// forward_wait: seconds spent in before_group (waiting for a layer's parameters), within forward;
/// flops: floating-point operations done
/// (2 T in out per forward GEMM, twice that in backward: input and weight gradients);
/// peak_bytes: device memory in use at the end of the forward pass (all activations alive):
/// on the GPU, everything the device has allocated (cudaMemGetInfo: the model, StarPU's pool,
/// the activations); on the CPU stand-in, the activation bytes alone.
struct ComputeTimes {
  double forward = 0, forward_wait = 0, backward = 0, backward_device = 0, backward_launch = 0, backward_release = 0,
         flops = 0;
  std::uint64_t peak_bytes = 0;
};

/// Memory and GEMMs of one device (implementations: the GPU with cuBLAS, the CPU stand-in). Every
/// pointer is the backend's own memory (device memory for the GPU, host for the CPU) from alloc();
/// matrices are row-major with elem_bytes() per element (the model's dtype on the GPU, fp32 on the
/// CPU). Every method throws std::runtime_error naming the failing call (CUDA or cuBLAS error, or
/// host memory exhausted).
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  /// Bytes per element of activations and weights.
  virtual std::size_t elem_bytes() const = 0;
  /// Allocates `bytes` filled with a small constant. Throws std::runtime_error when out of memory,
  /// naming the size.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p) = 0;
  /// Y[T,out] = X[T,in] W[out,in]^T; dX[T,in] = dY[T,out] W; dW[out,in] = dY^T X.
  virtual void forward(const void* W, const void* X, void* Y, std::int64_t T, std::int64_t in, std::int64_t out) = 0;
  virtual void backward(const void* W, const void* X, const void* dY, void* dX, void* dW, std::int64_t T,
                        std::int64_t in, std::int64_t out) = 0;
  virtual void sync() = 0;
  /// Marks the start of a span of work (the GPU records an event on its stream).
  virtual void span_begin() = 0;
  /// Waits for the work enqueued so far (as sync()) and returns the seconds from span_begin() to the
  /// end of that work: device time between the two events on the GPU, the wall clock on the CPU.
  virtual double span_end() = 0;
  /// Device memory in use now, bytes (see ComputeTimes::peak_bytes).
  virtual std::uint64_t used_bytes() const = 0;
};

/// The GPU backend: cuBLAS GEMMs (fp32 accumulation) in `dtype` on the current device, on a stream
/// of its own. Throws std::runtime_error when CUDA or cuBLAS fail, or in a build without CUDA.
std::unique_ptr<ComputeBackend> make_cuda_backend(dos::DType dtype);
/// The CPU stand-in: fp32 GEMMs with OpenMP, for machines without a GPU (use scaled-down shapes).
std::unique_ptr<ComputeBackend> make_cpu_backend();

/// Runs forward and backward of `gemms` for `tokens` tokens on `backend`. Forward allocates each
/// layer's saved activations (its input and every GEMM's output); backward walks the layers in
/// reverse and frees each layer's activations after its gradients, so device memory peaks at the
/// end of the forward pass. One layer's weights (the largest) are allocated once and reused by
/// every layer.
class ComputeEmulator {
 public:
  /// `scale` >= 1 divides every dimension and the tokens (the CPU stand-in uses 16 or more).
  /// Throws std::invalid_argument when tokens < 1 or scale < 1.
  ComputeEmulator(std::vector<std::vector<Gemm>> gemms, std::int64_t tokens, std::unique_ptr<ComputeBackend> backend,
                  std::int64_t scale = 1);
  ~ComputeEmulator();
  /// One forward and one backward pass; the times, the FLOPs done and the memory at the peak.
  /// after_group (when given) is called with each group's index (forward_gemms' order) as that
  /// group's backward GEMMs have ended, from the last group to the first: where a training loop's
  /// gradients of that layer become final. Its time counts in backward.
  /// before_group (when given) is called with each group's index before its forward GEMMs are
  /// enqueued, from the first group to the last: where a layer's forward waits for its parameters
  /// (its time counts in forward and in forward_wait). between (when given) is called once forward
  /// has ended and before backward starts; its time counts in neither.
  /// Throws std::runtime_error (from the backend) when memory runs out; activations are freed; an
  /// exception from a callback propagates the same way.
  ComputeTimes run(const std::function<void(std::size_t group)>& after_group = {},
                   const std::function<void(std::size_t group)>& before_group = {},
                   const std::function<void()>& between = {});
  std::int64_t tokens() const { return tokens_; }
  /// Bytes a ComputeEmulator(gemms, tokens, backend, scale) with a backend of `elem_bytes` per
  /// element allocates at its peak, the end of forward: the largest layer's weights and their
  /// gradient, the largest output and input gradients (T x features each), and every group's saved
  /// activations (T x (its largest input + all its outputs)), T = max(1, tokens / scale) and every
  /// dimension divided by scale as the constructor does. On the CPU stand-in run()'s peak_bytes
  /// equals it. Throws std::invalid_argument as the constructor (tokens < 1, scale < 1).
  static std::size_t peak_bytes(const std::vector<std::vector<Gemm>>& gemms, std::int64_t tokens,
                                std::size_t elem_bytes, std::int64_t scale = 1);
  /// The backend's memory in use now (ComputeBackend::used_bytes).
  std::uint64_t used_bytes() const { return be_->used_bytes(); }

 private:
  std::vector<std::vector<Gemm>> gemms_;
  std::int64_t tokens_;
  std::unique_ptr<ComputeBackend> be_;
  void *weights_ = nullptr, *dweights_ = nullptr, *dy_ = nullptr, *dx_ = nullptr;
};

/// What an emulated iteration holds on the GPU at once, bytes: what StarPU may keep for the
/// optimizer (RuntimeOptions::gpu_memory_limit: it keeps what it frees up to that limit), the
/// emulated forward and backward at their peak (ComputeEmulator::peak_bytes), and the model's
/// parameters and gradients (the caller's buffers).
struct GpuNeed {
  std::size_t starpu_limit = 0, compute = 0, model = 0;
};

/// GPU memory, bytes, that gpu_memory_warning wants left over beside GpuNeed's sum: what the sum
/// does not count (the stream-ordered pool's granularity, cuBLAS's workspace, StarPU's own
/// allocations beside its limit). On an 80 GB H100 with the 20B quarter and 4096 tokens, against
/// the free memory emulator-memory assumes there (81559 MiB less 1 GB for the context): a 30GB
/// update budget left 6.6 GB spare and ran; 5GB beside 31.5 GB resident left 0.07 GB and ran out
/// of memory at the second iteration of one run (another's two iterations fitted, peaking at 83.7
/// GB); 3GB beside 31.5 GB resident (2.07 GB spare) ran. 2 GB lies between, not a measured edge.
inline constexpr std::size_t kGpuSpareBytes = std::size_t(2000000000);

/// "" when `need`'s sum and kGpuSpareBytes fit in `free_bytes` (the GPU memory free once the
/// runtime has started); otherwise a warning that the run may run out of GPU memory, with the three
/// parts, their sum, the free memory and the spare in GB, and what to lower: `budget_text` (the
/// --gpu-update-budget as given) to budget_bytes less what is missing, rounded down to 0.1 GB (a
/// budget this check passes), or --tokens (`tokens`); where that leaves no update budget, --tokens
/// or the resident budget. A warning, not a refusal: StarPU's
/// limit is the budgets' worst case (twice the update budget with speculative updates), which a run
/// may never reach (the 20B quarter with the update overlapped and 31.5 GB resident ran on a
/// 141 GB GPU where the sum was 159 GB). Throws nothing.
std::string gpu_memory_warning(const GpuNeed& need, std::size_t free_bytes, const std::string& budget_text,
                               std::size_t budget_bytes, std::int64_t tokens);

}  // namespace dos_train
