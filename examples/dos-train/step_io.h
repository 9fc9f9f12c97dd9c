// What surrounds the update in one of dos-train's iterations: this rank's gradients before
// Optimizer::step() (produce_gradients) and the updated parameters' broadcast to every rank after
// it (broadcast_parameters). The gradients are emulated (emulate.h); under MPI they are reduced
// shard by shard to each shard's owner and the parameters broadcast from each owner with the
// library's data-parallel loops (runtime/parallel/parallel.h), through NCCL on GPU buffers or MPI
// through host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm.h"
#include "dos.h"

namespace dos_train {

/// The gradients in and the parameters out of this rank's update, with the buffers that takes
/// (allocated once, at construction).
class StepIO {
 public:
  struct Setup {
    dos::Comm* comm = nullptr;          ///< the data-parallel job (two ranks or more); null for one process
    dos::DeviceComm* device = nullptr;  ///< NCCL over this rank's GPU (needs comm); null: through host memory
    std::size_t total = 0;              ///< the model's parameters, all shards
    std::size_t rank = 0, world = 1;    ///< this rank's shard of `world` (partition.h's shard_range)
    void* params = nullptr;             ///< this shard's parameters, `dtype` elements (GPU memory when on_gpu)
    void* grads = nullptr;              ///< this shard's gradients, the same
    dos::DType dtype = dos::DType::bf16;
    bool on_gpu = false;
    std::uint64_t seed = 0;             ///< --seed of the emulated gradients
    /// The emulated gradient is the sum of `parts` parts; this rank adds [parts_begin, parts_end).
    std::size_t parts = 1, parts_begin = 0, parts_end = 1;
    /// Test aid: at this iteration (>= 1) the shard's first gradient element is a NaN; 0: never.
    std::uint64_t nan_at = 0;
  };
  /// Allocates the buckets the collectives need (at most one shard each, host memory; with
  /// `device`, 64 Mi-element chunks of GPU memory instead: 640 MiB for bf16, whatever the model).
  /// Throws std::runtime_error when memory runs out.
  explicit StepIO(const Setup& s);
  /// Bytes of host memory StepIO(s) allocates (its buckets; not s.params and s.grads): with MPI
  /// through host memory (comm without device), the largest shard's fp32 and `dtype` buckets and
  /// this shard's fp32 sum, and its `dtype` staging where the model is on the GPU (on_gpu); with
  /// --grad-parts above 1 in one process, the last two; otherwise 0. Throws nothing.
  static std::size_t host_bytes(const Setup& s);
  /// Bytes of GPU memory StepIO(s) allocates: with `device` (NCCL), two fp32 chunks and one `dtype`
  /// chunk of min(64 Mi, the largest shard) elements; otherwise 0. Throws nothing.
  static std::size_t device_bytes(const Setup& s);
  StepIO(const StepIO&) = delete;
  StepIO& operator=(const StepIO&) = delete;

  /// Writes this rank's gradients for iteration `iteration` into the gradient buffer: the emulated
  /// gradient of its shard (one process), the sum of all parts (one process, --grad-parts), or,
  /// under MPI, each rank's contribution reduced shard by shard to the shard's owner. Collective
  /// under MPI. Returns the seconds spent in collectives (0 for one process). Throws
  /// std::runtime_error when CUDA or a collective fails.
  double produce_gradients(std::uint64_t iteration);

  /// Whether gradients can be produced range by range (produce_gradient_range): one process, the
  /// gradient in one part (no sum over data-parallel parts to reduce first).
  bool by_range() const { return !s_.comm && s_.parts == 1; }

  /// produce_gradients for this shard's elements [begin, end) only (shard-local indices; the same
  /// values as produce_gradients writes there), what a layer's backward writes. Needs by_range().
  /// Throws std::logic_error without it, std::out_of_range for a range beyond the shard, and
  /// std::runtime_error when CUDA fails.
  void produce_gradient_range(std::uint64_t iteration, std::size_t begin, std::size_t end);

  /// The squared L2 norm of the gradients of every rank (grad_norm.h's order: the same bits
  /// whatever the thread count and on the host and GPU; under MPI this rank's sum gathered from
  /// every rank and the sums added in rank order, collective). inf or NaN when a gradient is.
  /// Throws std::runtime_error when CUDA or a collective fails.
  double gradient_sumsq();

  /// Multiplies this shard's gradients by coef in place (fp32 product rounded to the dtype), as
  /// torch.nn.utils.clip_grad_norm_ does. Throws std::runtime_error when CUDA fails.
  void scale_gradients(float coef);

  /// After the update: the updated parameters of each shard from its owner to every rank (the
  /// all-gather forward needs next; forward being emulated, each shard goes through one bucket and
  /// is not kept). Collective under MPI. Returns the seconds spent in collectives (0 for one
  /// process). Throws std::runtime_error when CUDA or a collective fails.
  double broadcast_parameters();

 private:
  /// produce_gradients without the test aid's NaN.
  double produce_all(std::uint64_t iteration);
  /// The one-part emulated gradients of shard-local elements [begin, end), where they live.
  void fill_range(std::uint64_t iteration, std::size_t begin, std::size_t end);
  Setup s_;
  std::size_t n_ = 0, esz_ = 0, chunk_ = 0;
  std::vector<dos::ShardRange> ranges_;
  std::vector<float> bucket32_, shard32_;      // host buckets: a contribution, the summed shard (fp32)
  std::vector<char> bucket16_, staging16_;     // a shard's parameters, and 16-bit staging of this shard
  /// GPU memory freed with its owner.
  struct DeviceBuffer {
    void* p = nullptr;
    DeviceBuffer() = default;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer();
  };
  DeviceBuffer d_send32_, d_recv32_, d_bucket16_;  // NCCL's chunks: a contribution, the sum (fp32), parameters
};

}  // namespace dos_train
