// CPU implementations of the codelets and the codelet tables (see codelets.h).
#include "codelets.h"

#include <cstring>

#include "cpu_team.h"
#include "cuda_funcs.h"
#include "task_clock.h"

namespace dos {
namespace {

/// The largest count of nseg segments (0 for none): the largest array a codelet hands one kernel.
std::size_t largest_segment(const Segment* segs, std::size_t nseg) {
  std::size_t m = 0;
  for (std::size_t s = 0; s < nseg; ++s) m = segs[s].count > m ? segs[s].count : m;
  return m;
}

void adam_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  const std::size_t n = STARPU_VECTOR_GET_NX(buffers[1]);
  bind_worker_team_for(n);
  const StateSlices s = slices(buffers[0], a->state_stride);
  adam_step_cpu(s.p, s.m, s.v, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->grad_dtype,
                reinterpret_cast<void*>(STARPU_VECTOR_GET_PTR(buffers[2])), a->param_dtype, n, a->sp);
}

void adam_compact_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  const std::size_t n = STARPU_VECTOR_GET_NX(buffers[1]);
  bind_worker_team_for(n);
  const CompactSlices s = compact_slices(reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[0])), a->state_stride);
  adam_step_compact_cpu(reinterpret_cast<std::uint16_t*>(STARPU_VECTOR_GET_PTR(buffers[2])), s.lo, s.r, s.m, s.v,
                        reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->grad_dtype, n, a->sp);
}

void adam_compact_into_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  const std::size_t n = STARPU_VECTOR_GET_NX(buffers[1]);
  bind_worker_team_for(n);
  // the old state stepped into the shadow block by block (the same bits as the update in place;
  // padding not copied, as adam_into_cpu's)
  const CompactSlices in = compact_slices(reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[0])), a->state_stride);
  const CompactSlices out = compact_slices(reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[3])), a->state_stride);
  adam_step_compact_into_cpu(in.lo, in.r, in.m, in.v, reinterpret_cast<std::uint16_t*>(STARPU_VECTOR_GET_PTR(buffers[2])),
                             out.lo, out.r, out.m, out.v, reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])),
                             a->grad_dtype, n, a->sp);
}

void adam_into_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  bind_worker_team_for(STARPU_VECTOR_GET_NX(buffers[1]));
  const StateSlices in = slices(buffers[0], a->state_stride), out = slices(buffers[3], a->state_stride);
  adam_step_into_cpu(in.p, in.m, in.v, out.p, out.m, out.v,
                     reinterpret_cast<const void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->grad_dtype,
                     reinterpret_cast<void*>(STARPU_VECTOR_GET_PTR(buffers[2])), a->param_dtype,
                     STARPU_VECTOR_GET_NX(buffers[1]), a->sp);
}

void adam_direct_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamDirectArgs*>(cl_arg);
  bind_worker_team_for(largest_segment(a->segs, a->nseg));
  if (a->adam->compact) {
    const CompactSlices c =
        compact_slices(reinterpret_cast<float*>(STARPU_VECTOR_GET_PTR(buffers[0])), a->adam->state_stride);
    for (std::size_t s = 0; s < a->nseg; ++s) {
      const Segment& sg = a->segs[s];
      adam_step_compact_cpu_at(static_cast<std::uint16_t*>(sg.param), c.lo + sg.offset, c.r, sg.offset,
                               c.m + sg.offset, c.v + sg.offset, sg.grad, a->dtype, sg.count, a->adam->sp);
    }
    return;
  }
  const StateSlices st = slices(buffers[0], a->adam->state_stride);
  for (std::size_t s = 0; s < a->nseg; ++s) {
    const Segment& sg = a->segs[s];
    adam_step_cpu(st.p + sg.offset, st.m + sg.offset, st.v + sg.offset, sg.grad, a->dtype, sg.param, a->dtype,
                  sg.count, a->adam->sp);
  }
}

void gather_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const GatherArgs*>(cl_arg);
  // a copy (16-bit gradients staged as they are) forks by bytes, a conversion by elements
  bind_worker_team_for(largest_segment(a->segs, a->nseg), a->dst_dtype == a->dtype ? dtype_size(a->dtype) : 0);
  char* dst = reinterpret_cast<char*>(STARPU_VECTOR_GET_PTR(buffers[0]));
  const std::size_t dsz = dtype_size(a->dst_dtype);
  for (std::size_t s = 0; s < a->nseg; ++s) {
    const Segment& sg = a->segs[s];
    const void* src = a->from_params ? sg.param : sg.grad;
    if (a->dst_dtype == a->dtype)
      copy_cpu(dst + sg.offset * dsz, src, sg.count * dsz);
    else
      convert_to_f32_cpu(src, a->dtype, reinterpret_cast<float*>(dst + sg.offset * dsz), sg.count);
  }
}

void scatter_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const ScatterArgs*>(cl_arg);
  const char* src = reinterpret_cast<const char*>(STARPU_VECTOR_GET_PTR(buffers[0]));
  const std::size_t esz = dtype_size(a->dtype);
  bind_worker_team_for(largest_segment(a->segs, a->nseg), esz);
  for (std::size_t s = 0; s < a->nseg; ++s) copy_cpu(a->segs[s].param, src + a->segs[s].offset * esz, a->segs[s].count * esz);
}

void cast_cpu(void* buffers[], void* cl_arg) {
  const auto* a = static_cast<const AdamArgs*>(cl_arg);
  bind_worker_team_for(STARPU_VECTOR_GET_NX(buffers[0]));
  convert_from_f32_cpu(reinterpret_cast<const float*>(STARPU_VECTOR_GET_PTR(buffers[0])),
                       reinterpret_cast<void*>(STARPU_VECTOR_GET_PTR(buffers[1])), a->param_dtype,
                       STARPU_VECTOR_GET_NX(buffers[0]));
}

// History-based perfmodels: subgroups of equal size share one footprint, so dmda learns one
// time per (codelet, size, worker type) (StarPU's regression models need several sizes to
// become valid, so they never do on equal sizes).
struct starpu_perfmodel adam_model = {};
struct starpu_perfmodel adam_direct_model = {};
struct starpu_perfmodel adam_compact_model = {};
struct starpu_perfmodel adam_into_model = {};
struct starpu_perfmodel adam_compact_into_model = {};
struct starpu_perfmodel gather_model = {};
struct starpu_perfmodel scatter_model = {};
struct starpu_perfmodel cast_model = {};

// Every implementation is stamped by the task clock (task_clock.h): a CPU one from entry to return,
// a CUDA one from its launch (the end comes from the task's callback).
template <void (*F)(void**, void*)>
void clocked_cpu(void* buffers[], void* cl_arg) {
  task_clock::begin();
  F(buffers, cl_arg);
  task_clock::end_here();
}
template <void (*F)(void**, void*)>
void clocked_cuda(void* buffers[], void* cl_arg) {
  task_clock::begin();
  F(buffers, cl_arg);
}
/// clocked_cuda<F>, or a null pointer in a build without CUDA (F null).
template <starpu_cuda_func_t F>
constexpr starpu_cuda_func_t clocked_cuda_or_null() {
  if constexpr (F == nullptr) return nullptr;
  else return &clocked_cuda<F>;
}

struct starpu_codelet make_codelet(const char* name, starpu_cpu_func_t cpu, starpu_cuda_func_t cuda,
                                   int nbuffers, const starpu_data_access_mode* modes,
                                   struct starpu_perfmodel* model, const char* symbol) {
  model->type = STARPU_HISTORY_BASED;
  model->symbol = symbol;
  struct starpu_codelet cl = {};
  cl.name = name;
  cl.cpu_funcs[0] = cpu;
  cl.cpu_funcs_name[0] = name;
  if (cuda) {
    cl.cuda_funcs[0] = cuda;
    cl.cuda_flags[0] = STARPU_CUDA_ASYNC;
  }
  cl.nbuffers = nbuffers;
  for (int i = 0; i < nbuffers; ++i) cl.modes[i] = modes[i];
  cl.model = model;
  return cl;
}

const starpu_data_access_mode kAdamModes[] = {STARPU_RW, STARPU_R, STARPU_W};
const starpu_data_access_mode kAdamCompactModes[] = {STARPU_RW, STARPU_R, STARPU_RW};
const starpu_data_access_mode kAdamIntoModes[] = {STARPU_R, STARPU_R, STARPU_W, STARPU_W};
const starpu_data_access_mode kAdamCompactIntoModes[] = {STARPU_R, STARPU_R, STARPU_RW, STARPU_W};
const starpu_data_access_mode kAdamDirectModes[] = {STARPU_RW};
const starpu_data_access_mode kGatherModes[] = {STARPU_W};
const starpu_data_access_mode kScatterModes[] = {STARPU_R};
const starpu_data_access_mode kCastModes[] = {STARPU_R, STARPU_W};

}  // namespace

struct starpu_codelet adam_cl = make_codelet("dos_adam", clocked_cpu<adam_cpu>, clocked_cuda_or_null<cuda_funcs::adam>(),
                                             3, kAdamModes, &adam_model, "dos_adam");
struct starpu_codelet adam_compact_cl =
    make_codelet("dos_adam_compact", clocked_cpu<adam_compact_cpu>, clocked_cuda_or_null<cuda_funcs::adam_compact>(), 3,
                 kAdamCompactModes, &adam_compact_model, "dos_adam_compact");
struct starpu_codelet adam_direct_cl =
    make_codelet("dos_adam_direct", clocked_cpu<adam_direct_cpu>, clocked_cuda_or_null<cuda_funcs::adam_direct>(), 1,
                 kAdamDirectModes, &adam_direct_model, "dos_adam_direct");
struct starpu_codelet adam_into_cl = make_codelet("dos_adam_into", clocked_cpu<adam_into_cpu>,
                                                  clocked_cuda_or_null<cuda_funcs::adam_into>(), 4, kAdamIntoModes,
                                                  &adam_into_model, "dos_adam_into");
struct starpu_codelet adam_compact_into_cl =
    make_codelet("dos_adam_compact_into", clocked_cpu<adam_compact_into_cpu>,
                 clocked_cuda_or_null<cuda_funcs::adam_compact_into>(), 4, kAdamCompactIntoModes,
                 &adam_compact_into_model, "dos_adam_compact_into");
struct starpu_codelet gather_cl = make_codelet("dos_gather", clocked_cpu<gather_cpu>,
                                               clocked_cuda_or_null<cuda_funcs::gather>(), 1, kGatherModes,
                                               &gather_model, "dos_gather");
struct starpu_codelet scatter_cl = make_codelet("dos_scatter", clocked_cpu<scatter_cpu>,
                                                clocked_cuda_or_null<cuda_funcs::scatter>(), 1, kScatterModes,
                                                &scatter_model, "dos_scatter");
struct starpu_codelet cast_cl = make_codelet("dos_cast", clocked_cpu<cast_cpu>, clocked_cuda_or_null<cuda_funcs::cast>(),
                                             2, kCastModes, &cast_model, "dos_cast");

bool codelets_have_cuda() { return cuda_funcs::kHaveCuda; }

}  // namespace dos
