// Host side of grad_norm.h.
#include "grad_norm.h"

#include <vector>

namespace dos_train {

namespace {
/// The squares of chunk [off, off + len) summed as grad_norm.h says.
double chunk_sumsq(const void* g, dos::DType t, std::size_t off, std::size_t len) {
  double lane[kNormLanes] = {};
  for (std::size_t j = 0; j < kNormLanes; ++j)
    for (std::size_t i = j; i < len; i += kNormLanes) {
      const double x = double(dos::load_as_f32(g, t, off + i));
      lane[j] += x * x;
    }
  for (std::size_t s = kNormLanes / 2; s > 0; s /= 2)
    for (std::size_t j = 0; j < s; ++j) lane[j] += lane[j + s];
  return lane[0];
}
}  // namespace

double grad_sumsq_host(const void* g, dos::DType t, std::size_t n) {
  const std::size_t nchunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> sums(nchunks);
#pragma omp parallel for schedule(static)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kNormChunk;
    sums[c] = chunk_sumsq(g, t, off, off + kNormChunk <= n ? kNormChunk : n - off);
  }
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

void scale_grads_host(void* g, dos::DType t, std::size_t n, float coef) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) dos::store_from_f32(g, t, i, dos::load_as_f32(g, t, i) * coef);
}

float clip_coefficient(double norm, double max_norm) {
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

}  // namespace dos_train
