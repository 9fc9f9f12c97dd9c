// This rank's shard of the model in the caller's memory (shard.h): its tensors, its parameter and
// gradient buffers with their initial values, and the views the optimizer and backward take of them.
#include "shard.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emulate.h"

namespace dos_train {

using dos::DType;

namespace {

/// Initial value of element i of the piece `st`: a function of its index in the whole model, so that
/// every shard starts from its slice of the unsharded model's parameters.
float init_value(const ShardTensor& st, std::size_t i, std::uint64_t seed) {
  switch (st.t.kind) {
    case dos_train::TensorKind::norm: return 1.0f;
    case dos_train::TensorKind::bias: return 0.0f;
    default: return dos_train::normal_like(seed, 1, st.global_begin + i) * 0.02f;
  }
}

void* host_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) fail("cannot allocate " + std::to_string(bytes) + " bytes");
  return p;
}

}  // namespace

std::vector<ShardTensor> shard_tensors(const std::vector<ParamTensor>& all, dos::ShardRange r) {
  std::vector<ShardTensor> out;
  std::size_t flat = 0;
  for (const ParamTensor& t : all) {
    const std::size_t b = std::max(flat, r.begin), e = std::min(flat + t.numel(), r.end);
    if (b < e) out.push_back({t, b, b - flat, e - b});
    flat += t.numel();
  }
  return out;
}

std::vector<std::size_t> element_counts(const std::vector<ShardTensor>& tensors) {
  std::vector<std::size_t> numels;
  for (const ShardTensor& st : tensors) numels.push_back(st.count);
  return numels;
}

Buffers allocate_buffers(const Job& j, const std::vector<ShardTensor>& tensors, std::uint64_t seed, bool on_gpu) {
  const DType dtype = j.c.dtype;
  const std::size_t n = j.n, esz = dos::dtype_size(dtype);
  std::vector<char> init(n * esz);
  for (const ShardTensor& st : tensors) {
    const std::size_t base = st.global_begin - j.range.begin;
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < st.count; ++i)
      dos::store_from_f32(init.data(), dtype, base + i, init_value(st, i, seed));
  }
  Buffers b;
  b.on_gpu = on_gpu;
#if defined(DOS_HAVE_CUDA)
  if (on_gpu) {
    b.params = dos_train::cuda_alloc(n * esz);
    b.grads = dos_train::cuda_alloc(n * esz);
    dos_train::cuda_copy_to_device(b.params, init.data(), n * esz);
  }
#endif
  if (!on_gpu) {
    b.params = host_alloc(n * esz);
    b.grads = host_alloc(n * esz);
    std::memcpy(b.params, init.data(), n * esz);
    // committed now, as counted: a speculative update's budget (half of what is free when it first
    // comes, before backward has written every gradient) would take untouched pages for free
    std::memset(b.grads, 0, n * esz);
  }
  return b;
}

void free_buffers(const Buffers& b) {
#if defined(DOS_HAVE_CUDA)
  if (b.on_gpu) {
    dos_train::cuda_free(b.params);
    dos_train::cuda_free(b.grads);
  }
#endif
  if (!b.on_gpu) {
    std::free(b.params);
    std::free(b.grads);
  }
}

std::vector<dos::TensorView> tensor_views(const std::vector<ShardTensor>& tensors, dos::ShardRange range,
                                          const Buffers& b, std::size_t esz) {
  std::vector<dos::TensorView> views;
  for (const ShardTensor& st : tensors) {
    const std::size_t off = (st.global_begin - range.begin) * esz;
    views.push_back({static_cast<char*>(b.params) + off, static_cast<char*>(b.grads) + off, st.count});
  }
  return views;
}

dos_train::GroupRanges backward_ranges(const ModelConfig& cfg, const std::vector<ShardTensor>& tensors,
                                       dos::ShardRange range) {
  dos_train::GroupRanges release(std::size_t(cfg.layers) + 2);
  for (const ShardTensor& st : tensors) {
    const std::size_t lo = st.global_begin - range.begin;
    release[dos_train::backward_group(cfg, st.t.name)].push_back({lo, lo + st.count});
  }
  return release;
}

}  // namespace dos_train
