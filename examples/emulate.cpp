#include "emulate.h"

namespace dos_train {

void fill_grads_host(void* dst, dos::DType t, std::size_t n, std::uint64_t seed, std::uint64_t iter,
                     std::uint64_t first) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) dos::store_from_f32(dst, t, i, emulated_grad(seed, iter, first + i));
}

}  // namespace dos_train
