#include "emulate.h"

namespace dos_train {

void fill_grads_host(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                     std::uint64_t first) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) dos::store_from_f32(dst, t, i, emulated_grad(seed, iter, first + i));
}

void fill_grad_parts_host(float* dst, std::size_t n, std::uint64_t seed, std::uint64_t iter, std::uint64_t first,
                          std::uint64_t part_begin, std::uint64_t part_end, std::uint64_t parts) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    float g = 0.0f;
    for (std::uint64_t p = part_begin; p < part_end; ++p) g += grad_part(seed, iter, p, parts, first + i);
    dst[i] = g;
  }
}

}  // namespace dos_train
