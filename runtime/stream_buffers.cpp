// The streamed subgroups' GPU state buffers, made at construction (Optimizer::Impl::
// prepare_stream_buffers in optimizer_impl.h) so that an optimizer's first phase that streams
// allocates nothing.
#include <starpu.h>

#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "device_memory.h"
#include "optimizer_impl.h"
#include "switches.h"

namespace dos {
using namespace detail;

std::size_t Optimizer::Impl::prepare_stream_buffers() {
  prepared_stream_buffers = 0;
  if (env_says("DOS_PREPARE_STREAM", "0") || cuda_nodes.empty() || !have_rates || !choice.plan || !workload.may_stream)
    return 0;
  std::vector<PlanSide> first;
  try {
    first = make_plan();
  } catch (const std::exception&) {
    return 0;  // begin_step makes the plan again and raises the error there
  }
  // the streamed subgroups the update budget admits at once, each on its CUDA node
  std::size_t room = opt.gpu_update_budget > 0 ? opt.gpu_update_budget : std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> chosen;
  std::map<unsigned, std::size_t> bytes_on;  // state bytes per CUDA node
  for (std::size_t i = 0; i < first.size() && i < sgs.size(); ++i) {
    if (first[i] != PlanSide::gpu_streamed) continue;
    const std::size_t fp = subgroup_footprint(workload, sgs[i]->size, PlanSide::gpu_streamed);
    if (fp > room) break;
    room -= fp;
    chosen.push_back(i);
    bytes_on[cuda_nodes[i % cuda_nodes.size()]] += state_bytes_for(sgs[i]->size);
  }
  if (chosen.empty()) return 0;
  const std::size_t margin = std::size_t(1) << 30;
  for (const auto& [node, bytes] : bytes_on) {
    const int dev = starpu_memory_node_get_devid(node);
    const starpu_ssize_t starpu_avail = starpu_memory_get_available(node);  // within StarPU's limit, if any
    if (dev < 0 || device_free_bytes(dev) < bytes + margin ||
        (starpu_avail >= 0 && std::size_t(starpu_avail) < bytes))
      return 0;
  }
  // every scratch handle held on its node until all are made, so that none reuses another's buffer
  std::vector<starpu_data_handle_t> held;
  held.reserve(chosen.size());
  for (std::size_t i : chosen) {
    const unsigned node = cuda_nodes[i % cuda_nodes.size()];
    starpu_data_handle_t h = nullptr;
    starpu_vector_data_register(&h, -1, 0, 3 * sgs[i]->stride, sizeof(float));
    if (starpu_data_acquire_on_node(h, int(node), STARPU_W) != 0) {
      starpu_data_unregister_no_coherency(h);
      break;
    }
    starpu_data_release_on_node(h, int(node));
    held.push_back(h);
  }
  for (starpu_data_handle_t h : held) starpu_data_unregister_no_coherency(h);  // into StarPU's allocation cache
  prepared_stream_buffers = held.size();
  return held.size();
}

}  // namespace dos
