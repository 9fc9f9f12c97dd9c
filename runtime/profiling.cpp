// StarPU's bus counters as running totals (profiling.h).
#include "profiling.h"

#include <starpu.h>
#include <starpu_profiling.h>

namespace dos::detail {

namespace {
/// StarPU's bus counters reset when read: every reader goes through this accumulator, so that the
/// timeline's sampling thread and step() see the same running totals (bytes since start-up).
std::mutex g_bus_mu;
std::uint64_t g_bus_h2d = 0, g_bus_d2h = 0;
}  // namespace

void read_bus_bytes(std::uint64_t* h2d, std::uint64_t* d2h) {
  std::lock_guard<std::mutex> l(g_bus_mu);
  const int nbus = starpu_bus_get_count();
  for (int b = 0; b < nbus; ++b) {
    struct starpu_profiling_bus_info info;
    if (starpu_bus_get_profiling_info(b, &info) != 0) continue;
    const auto src = starpu_node_get_kind(unsigned(starpu_bus_get_src(b)));
    const auto dst = starpu_node_get_kind(unsigned(starpu_bus_get_dst(b)));
    if (src == STARPU_CPU_RAM && dst == STARPU_CUDA_RAM) g_bus_h2d += std::uint64_t(info.transferred_bytes);
    if (src == STARPU_CUDA_RAM && dst == STARPU_CPU_RAM) g_bus_d2h += std::uint64_t(info.transferred_bytes);
  }
  *h2d = g_bus_h2d;
  *d2h = g_bus_d2h;
}

void add_bus_bytes(std::uint64_t h2d, std::uint64_t d2h) {
  std::lock_guard<std::mutex> l(g_bus_mu);
  g_bus_h2d += h2d;
  g_bus_d2h += d2h;
}

}  // namespace dos::detail
