// StepIO (step_io.h): the emulated gradients into the update, and the parameters out of it.
#include "step_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "emulate.h"
#include "grad_norm.h"
#include "parallel/parallel.h"

namespace dos_train {

namespace {
/// NCCL's buckets in GPU memory hold at most this many elements (outside StarPU's memory cap and
/// the GPU budgets).
constexpr std::size_t kChunk = std::size_t(1) << 26;

/// Elements of each of StepIO's GPU buckets (with `device`): at most kChunk, at most the largest shard.
std::size_t device_chunk(const std::vector<dos::ShardRange>& ranges) {
  return std::min(kChunk, dos::largest_shard(ranges));
}

/// Elements of StepIO's host buffers for s: the buckets (largest shard, under MPI through host
/// memory), this shard's fp32 sum (those, or several parts in one process) and its 16-bit staging
/// (the same, where the model is on the GPU: on the host the model's own buffers serve).
struct HostSizes {
  std::size_t bucket = 0, shard = 0, staging = 0;
};
HostSizes host_sizes(const StepIO::Setup& s, const std::vector<dos::ShardRange>& ranges) {
  const bool dp = s.comm != nullptr;
  const dos::ShardRange mine = ranges[s.rank];
  const bool host_buckets = (s.parts > 1 || dp) && !s.device;
  const std::size_t shard = host_buckets ? mine.end - mine.begin : 0;
  return {dp && !s.device ? dos::largest_shard(ranges) : 0, shard, s.on_gpu ? shard : 0};
}
}  // namespace

std::size_t StepIO::device_bytes(const Setup& s) {
  if (!s.device) return 0;
  return device_chunk(dos::shard_ranges(s.total, s.world)) * (2 * sizeof(float) + dos::dtype_size(s.dtype));
}

std::size_t StepIO::host_bytes(const Setup& s) {
  const HostSizes h = host_sizes(s, dos::shard_ranges(s.total, s.world));
  return h.bucket * (sizeof(float) + dos::dtype_size(s.dtype)) + h.shard * sizeof(float) +
         h.staging * dos::dtype_size(s.dtype);
}

StepIO::StepIO(const Setup& s) : s_(s) {
  ranges_ = dos::shard_ranges(s_.total, s_.world);
  const dos::ShardRange mine = ranges_[s_.rank];
  n_ = mine.end - mine.begin;
  esz_ = dos::dtype_size(s_.dtype);
  const HostSizes h = host_sizes(s_, ranges_);
  bucket32_.resize(h.bucket);
  shard32_.resize(h.shard);
  bucket16_.resize(h.bucket * esz_);
  staging16_.resize(h.staging * esz_);
  chunk_ = device_chunk(ranges_);
#if defined(DOS_HAVE_CUDA)
  if (s_.device) {
    d_send32_.p = cuda_alloc(chunk_ * sizeof(float));
    d_recv32_.p = cuda_alloc(chunk_ * sizeof(float));
    d_bucket16_.p = cuda_alloc(chunk_ * esz_);
  }
#endif
}

StepIO::DeviceBuffer::~DeviceBuffer() {
#if defined(DOS_HAVE_CUDA)
  if (p) cuda_free(p);
#endif
}

namespace {
/// The NaN of the test aid (step_io.h, Setup::nan_at) written into element 0 of `grads`.
void poison_first(void* grads, dos::DType t, bool on_gpu) {
  const std::size_t esz = dos::dtype_size(t);
  char nan_elem[4];
  dos::store_from_f32(nan_elem, t, 0, std::numeric_limits<float>::quiet_NaN());
#if defined(DOS_HAVE_CUDA)
  if (on_gpu) {
    cuda_copy_to_device(grads, nan_elem, esz);
    return;
  }
#endif
  (void)on_gpu;
  std::memcpy(grads, nan_elem, esz);
}
}  // namespace

double StepIO::produce_gradients(std::uint64_t it) {
  const double comm_s = produce_all(it);
  if (s_.nan_at != 0 && it == s_.nan_at && n_ > 0) poison_first(s_.grads, s_.dtype, s_.on_gpu);
  return comm_s;
}

void StepIO::fill_range(std::uint64_t it, std::size_t begin, std::size_t end) {
  const dos::ShardRange mine = ranges_[s_.rank];
  void* dst = static_cast<char*>(s_.grads) + begin * esz_;
#if defined(DOS_HAVE_CUDA)
  if (s_.on_gpu) fill_grads_cuda(dst, s_.dtype, end - begin, s_.seed, it, mine.begin + begin);
#endif
  if (!s_.on_gpu) fill_grads_host(dst, s_.dtype, end - begin, s_.seed, it, mine.begin + begin);
}

void StepIO::produce_gradient_range(std::uint64_t it, std::size_t begin, std::size_t end) {
  if (!by_range()) throw std::logic_error("gradients by range need one process and one gradient part");
  if (begin > end || end > n_) throw std::out_of_range("gradient range beyond the shard");
  fill_range(it, begin, end);
  if (s_.nan_at != 0 && it == s_.nan_at && begin == 0 && end > 0) poison_first(s_.grads, s_.dtype, s_.on_gpu);
}

double StepIO::gradient_sumsq() {
  double mine = 0;
#if defined(DOS_HAVE_CUDA)
  if (s_.on_gpu) mine = grad_sumsq_cuda(s_.grads, s_.dtype, n_);
#endif
  if (!s_.on_gpu) mine = grad_sumsq_host(s_.grads, s_.dtype, n_);
  if (!s_.comm) return mine;
  std::vector<double> all(s_.world);
  dos::gather_from_each(*s_.comm, &mine, all.data(), sizeof(double));
  double total = 0;
  for (double x : all) total += x;  // rank order on every rank: the same bits everywhere
  return total;
}

void StepIO::scale_gradients(float coef) {
#if defined(DOS_HAVE_CUDA)
  if (s_.on_gpu) {
    scale_grads_cuda(s_.grads, s_.dtype, n_, coef);
    return;
  }
#endif
  scale_grads_host(s_.grads, s_.dtype, n_, coef);
}

double StepIO::produce_all(std::uint64_t it) {
  const dos::ShardRange mine = ranges_[s_.rank];
  if (s_.device) {
#if defined(DOS_HAVE_CUDA)
    // GPU to GPU: this rank's contribution to each shard made on its GPU, reduced (fp32) to the
    // shard's owner, rounded to the model's dtype into its gradients.
    return dos::reduce_to_owners(
        *s_.device, int(s_.rank), ranges_, chunk_,
        [&](float* dst, dos::ShardRange p) {
          fill_grad_parts_cuda(dst, p.end - p.begin, s_.seed, it, p.begin, s_.parts_begin, s_.parts_end, s_.parts);
        },
        static_cast<float*>(d_send32_.p), static_cast<float*>(d_recv32_.p),
        [&](const float* sum, dos::ShardRange p) {
          store_from_f32_cuda(static_cast<char*>(s_.grads) + (p.begin - mine.begin) * esz_, s_.dtype, sum,
                              p.end - p.begin);
        });
#endif
  }
  if (s_.parts > 1 || s_.comm) {
    // The gradient is the sum of `parts` ranks' contributions: under MPI, this rank's, reduced
    // shard by shard (a bucket of one shard at a time) to the shard's owner; in one process
    // (--grad-parts), all of them for this shard.
    double comm_s = 0;
    if (s_.comm) {
      comm_s = dos::reduce_to_owners(
          *s_.comm, ranges_,
          [&](float* dst, dos::ShardRange p) {
            fill_grad_parts_host(dst, p.end - p.begin, s_.seed, it, p.begin, s_.parts_begin, s_.parts_end, s_.parts);
          },
          bucket32_.data(), shard32_.data());
    } else {
      fill_grad_parts_host(shard32_.data(), n_, s_.seed, it, mine.begin, 0, s_.parts, s_.parts);
    }
    char* g16 = s_.on_gpu ? staging16_.data() : static_cast<char*>(s_.grads);
    const float* sum = shard32_.data();
#pragma omp parallel for schedule(static)
    for (std::size_t k = 0; k < n_; ++k) dos::store_from_f32(g16, s_.dtype, k, sum[k]);
#if defined(DOS_HAVE_CUDA)
    if (s_.on_gpu) cuda_copy_to_device(s_.grads, staging16_.data(), n_ * esz_);
#endif
    return comm_s;
  }
  fill_range(it, 0, n_);
  return 0;
}

double StepIO::broadcast_parameters() {
  if (s_.device) return dos::broadcast_from_owners(*s_.device, int(s_.rank), ranges_, esz_, chunk_, s_.params, d_bucket16_.p);
  if (!s_.comm) return 0;
#if defined(DOS_HAVE_CUDA)
  if (s_.on_gpu) cuda_copy_to_host(staging16_.data(), s_.params, n_ * esz_);
#endif
  const void* mine = s_.on_gpu ? static_cast<const void*>(staging16_.data()) : s_.params;
  return dos::broadcast_from_owners(*s_.comm, ranges_, esz_, mine, bucket16_.data());
}

}  // namespace dos_train
