// The optimizer state's way home from the GPU (Optimizer::Impl::acquire_home, write_back): an
// asynchronous acquire of a handle on host memory, whose callback releases it, puts an eager state
// write-back's span on the timeline's lane "writeback", and ends the subgroup's piece of work; and
// the count of eager write-backs on the device-to-host link that DOS_COPY_BY=auto (and adaptive,
// once turned) reads.
#include <starpu.h>

#include <cstddef>
#include <new>

#include "../codelets/kernels/env_choice.h"
#include "optimizer_impl.h"

namespace dos {
using namespace detail;

// Subgroup::writeback_link's two moves: counted from its GPU Adam's end (unless the state is home
// already: 2), uncounted once home or refused.
void detail::link_writeback_started(Subgroup* sg) {
  int submitted = 0;
  if (sg->on_link && sg->writeback_link.compare_exchange_strong(submitted, 1)) sg->on_link->fetch_add(1);
}

namespace {

void link_writeback_ended(Subgroup* sg) {
  if (sg->writeback_link.exchange(2) == 1 && sg->on_link) sg->on_link->fetch_sub(1);
}

struct WriteBack {
  starpu_data_handle_t h;
  Pending* pending;
  Subgroup* sg;  // its part of the subgroup's work ends with the write-back (nullptr: none)
  bool on_timeline;  // the eager write-back of the subgroup's state: its span goes on lane "writeback"
};

void release_after_writeback(void* arg) {
  auto* wb = static_cast<WriteBack*>(arg);
  // The host copy is valid now. After a write acquire (end-of-phase write-back) it is the only
  // one; after a read acquire (eager write-back) the device copy was marked starpu_data_wont_use,
  // so StarPU drops it first when it needs room.
  starpu_data_release(wb->h);
  Pending* p = wb->pending;
  Subgroup* sg = wb->sg;
  const bool on_timeline = wb->on_timeline;
  delete wb;
  if (sg && on_timeline) link_writeback_ended(sg);
  if (sg && sg->timeline && on_timeline) {
    // lane "writeback": from the end of the Adam that wrote the state to the state being home
    // (the wait behind other transfers on StarPU's device-to-host stream included)
    try {
      // zero length when the Adam's own callback has not run yet (StarPU releases the task's data
      // before calling it, so a tiny write-back can end first)
      const double end_us = starpu_timing_now();
      const double a = sg->adam_end_us.load();
      sg->timeline->record_span("writeback", "state", std::size_t(sg->hint_update.subgroup),
                                a > 0 && a <= end_us ? a : end_us, end_us);
    } catch (const std::bad_alloc&) {  // the timeline loses the span
    }
  }
  if (sg) {
    p->subgroup_part_ended();
    subgroup_part_done(sg);
  }
  p->done();
}

}  // namespace

namespace detail {
// The state write-back (docs/measured-2026-11-30.md, "Streaming optimizer state at the PCIe rate"): an
// asynchronous acquire on main RAM turns the write-back of a GPU-updated subgroup into a normal
// D2H fetch, which runs beside the H2D stream. eager: a read acquire right after the subgroup's
// tasks, then starpu_data_wont_use so StarPU drops the device copy first; else a read-write
// acquire at the end of the phase (invalidating the device copy).
// Measurement switch: DOS_WONT_USE=0 leaves starpu_data_wont_use out of the eager write-back.
bool wont_use_after_writeback() {
  static const bool on = env_choice("DOS_WONT_USE", {"0", "1"}, 1, "1 is used") == 1;
  return on;
}
}  // namespace detail

void Optimizer::Impl::acquire_home(OpenStep& ph, starpu_data_handle_t h, enum starpu_data_access_mode mode, Subgroup* sg,
                                  bool on_timeline) {
  auto* wb = new WriteBack{h, &ph.pending, sg, on_timeline && sg != nullptr};  // before add(): a throw here leaves the count as it was
  ph.pending.add();
  if (starpu_data_acquire_on_node_cb(h, STARPU_MAIN_RAM, mode, release_after_writeback, wb) != 0) {
    delete wb;
    ph.pending.done();
    if (sg && on_timeline) link_writeback_ended(sg);
    if (sg) subgroup_part_done(sg);
    ++ph.refused;
  }
}

void Optimizer::Impl::write_back(OpenStep& ph, Subgroup* sg, enum starpu_data_access_mode mode, bool part_of_subgroup) {
  acquire_home(ph, sg->h_state, mode, part_of_subgroup ? sg : nullptr, part_of_subgroup);
  if (part_of_subgroup && wont_use_after_writeback()) starpu_data_wont_use(sg->h_state);
}

}  // namespace dos
