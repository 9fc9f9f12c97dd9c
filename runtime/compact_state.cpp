// The compact master's state access (OptimizerOptions::compact_master): its masters rebuilt from
// the caller's parameters for reading and split back into them for writing (Impl::compact_masters,
// optimizer_impl.h); the layout is codelets.h's compact state.
#include <starpu.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "../codelets/codelets.h"
#include "optimizer_impl.h"

namespace dos {
using namespace detail;

void Optimizer::Impl::compact_masters(Subgroup* sg, std::size_t from, std::size_t to, float* at, bool write) const {
  auto* self = const_cast<Impl*>(this);  // tasks on the staging handles (h_state's values change only when `write`)
  if (write)  // a NaN has no compact form (compact_master.h): refused before anything changes
    for (std::size_t i = from; i < to; ++i)
      if (std::isnan(at[i - from]))
        throw Error("the master of element " + std::to_string(sg->begin + i) +
                    " to write is NaN, which the compact master cannot hold (its sign and payload would be lost): "
                    "an Adam state holds finite numbers (a damaged or foreign state?)");
  // P from the caller's buffers into the staging, where they live (a copy task), then home (the
  // acquire waits for the copy); not when every element's P is written here (a load), nor for a
  // read where the staging holds the caller's P already (a CPU subgroup's kept P, params_on_host:
  // it stays kept, and the next CPU update brings no P down)
  const bool whole = write && from == 0 && to == sg->size;
  const bool kept = !write && sg->params_on_host;
  if (!whole && !kept) {
    struct starpu_task* g = self->make_task(&gather_cl, &sg->gather_p16, &sg->hint_io, where_caller);
    g->handles[0] = sg->h_param16;
    submit(g, "parameter copy (compact master)");
  }
  starpu_data_acquire(sg->h_state, write ? STARPU_RW : STARPU_R);
  starpu_data_acquire(sg->h_param16, whole ? STARPU_W : write ? STARPU_RW : STARPU_R);
  auto* p16 = reinterpret_cast<std::uint16_t*>(sg->param16.ptr);
  const CompactSlices c = compact_slices(sg->compact_base(), sg->stride);
  for (std::size_t i = from; i < to; ++i) {
    if (!write) {
      at[i - from] = bits_f32(compact_join(p16[i], c.lo[i], compact_bit(c.r, i)));
      continue;
    }
    const std::uint32_t u = f32_bits(at[i - from]);
    const std::uint16_t p = f32_to_bf16(at[i - from]);
    std::uint16_t lo = 0;
    std::uint32_t r = 0;
    compact_split(u, p, &lo, &r);
    p16[i] = p;
    c.lo[i] = lo;
    c.r[i / 8] = std::uint8_t((c.r[i / 8] & ~(1u << (i % 8))) | (r << (i % 8)));
  }
  starpu_data_release(sg->h_param16);
  starpu_data_release(sg->h_state);
  if (kept) return;
  if (write) {  // the new P to the caller, as after a load
    try {
      struct starpu_task* t = self->make_task(&scatter_cl, &sg->scatter, &sg->hint_io, where_caller);
      t->handles[0] = sg->h_param16;
      submit(t, "parameter write-back (compact master)");
    } catch (const std::exception& e) {
      // lo and r are split from the new masters, the caller's P is not: every master of the subgroup
      // is now wrong until a state is loaded
      self->broken = std::string(kCompactWriteFailed) + e.what();
      starpu_data_invalidate_submit(sg->h_param16);
      sg->params_on_host = false;
      throw;
    }
    // a write acquire waits for the write-back, which reads the staging
    starpu_data_acquire(sg->h_param16, STARPU_W);
    starpu_data_release(sg->h_param16);
  }
  starpu_data_invalidate_submit(sg->h_param16);
  sg->params_on_host = false;
}

}  // namespace dos
