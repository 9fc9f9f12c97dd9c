// dos-train: the job this rank runs and its shard of the model in the caller's memory. Job holds
// what main.cpp's resolve_job decides; ShardTensor is a tensor, or the part of it, in this rank's
// shard; the shard's parameter and gradient buffers are allocated and initialised here as a
// training framework's would be (GPU or host memory), with the optimizer's views of them and
// backward's order of their gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dos.h"
#include "iterations.h"
#include "model_config.h"
#include "options.h"
#include "partition.h"

namespace dos_train {

/// A tensor, or the part of it that falls in this rank's shard.
struct ShardTensor {
  ParamTensor t;
  std::size_t global_begin;   // flat index of its first element in the whole model
  std::size_t tensor_offset;  // first element inside the tensor
  std::size_t count;
  bool whole() const { return tensor_offset == 0 && count == t.numel(); }
};

/// The parts of `all` (every parameter tensor of the model, in order) that fall in `r` (flat element
/// indices of the whole model, [begin, end)), in order, each cut to its elements in r. Throws what
/// ParamTensor::numel throws (std::invalid_argument on an element count beyond 64 bits) and
/// std::bad_alloc.
std::vector<ShardTensor> shard_tensors(const std::vector<ParamTensor>& all, dos::ShardRange r);

/// The elements of each of `tensors`, in order. Throws nothing but std::bad_alloc.
std::vector<std::size_t> element_counts(const std::vector<ShardTensor>& tensors);

/// The job this rank runs: the model, the data-parallel job and this rank's shard of it, and the
/// option values checked against them (resolve_job).
struct Job {
  ModelConfig cfg;
  std::vector<ParamTensor> all;     ///< every parameter tensor of the model, in order
  std::size_t total = 0;            ///< the model's parameters (all shards)
  std::size_t rank = 0, world = 1;  ///< this rank's shard of `world` (--shard, or the MPI job's)
  bool dp = false;                  ///< data parallelism: a rank of an MPI job of two ranks or more
  std::size_t subgroup = 0;         ///< --subgroup-size, elements
  /// The emulated gradient sums `parts` contributions; this rank adds [parts_begin, parts_end).
  std::size_t parts = 1, parts_begin = 0, parts_end = 1;
  dos::ShardRange range{};  ///< this rank's elements of the model (flat indices)
  std::size_t n = 0;        ///< this shard's parameters
  Checked c;                ///< check_options
};

/// This shard's parameters and gradients, the caller's memory as a training framework's would be:
/// GPU memory (on_gpu) or page-aligned host memory, n elements of the dtype each.
struct Buffers {
  void* params = nullptr;
  void* grads = nullptr;
  bool on_gpu = false;
};

/// Allocates the buffers of this shard (`tensors`, of j.range) and writes its initial parameters
/// (from `seed`, --seed) into params; on the host, the gradients are zeroed. Each buffer holds j.n
/// elements of j.c.dtype: GPU memory when on_gpu (in a build with CUDA), else host memory aligned
/// to 4096 bytes. An initial value is a function of the element's index in the whole model, so that
/// every shard starts from its slice of the unsharded model's parameters (norm weights 1, biases 0,
/// other weights 0.02 x normal_like). free_buffers frees them. Throws std::runtime_error when memory
/// runs out or CUDA fails.
Buffers allocate_buffers(const Job& j, const std::vector<ShardTensor>& tensors, std::uint64_t seed, bool on_gpu);

/// Frees what allocate_buffers allocated. Throws nothing.
void free_buffers(const Buffers& b);

/// The optimizer's view of each of `tensors` in the buffers (`esz`: bytes per element): its
/// parameters and gradients at its offset from range.begin (this rank's first element, as in
/// allocate_buffers) and its element count. Throws nothing but std::bad_alloc.
std::vector<dos::TensorView> tensor_views(const std::vector<ShardTensor>& tensors, dos::ShardRange range,
                                          const Buffers& b, std::size_t esz);

/// Backward's order of the gradients: the ranges (shard-local) whose gradients each group's
/// backward makes final (compute_emulator.h, backward_group), one entry per group: the layers, the
/// head, the embeddings. Each range is [begin, end) in elements from range.begin (this rank's first
/// element). Throws what backward_group throws (std::stoll's on a layer tensor's name without a
/// layer number) and std::bad_alloc.
dos_train::GroupRanges backward_ranges(const ModelConfig& cfg, const std::vector<ShardTensor>& tensors,
                                       dos::ShardRange range);

}  // namespace dos_train
