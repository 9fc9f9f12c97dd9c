// A CPU-updated subgroup's parameter write-back (Optimizer::Impl::scatter_params): a scatter_cl
// task, or the runtime's own upload (param_upload.h) when the caller's parameters are on a GPU,
// with the callbacks of both.
#include <starpu.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "../codelets/codelets.h"
#include "optimizer_impl.h"
#include "profiling.h"

namespace dos {
using namespace detail;

bool runtime_uploads_params() {
  static const bool tasks = std::getenv("DOS_PARAM_UPLOAD") && std::string(std::getenv("DOS_PARAM_UPLOAD")) == "task";
  return !tasks;
}

namespace {

/// Callback of the parameter write-back task: the timeline, the parameters written, and one piece
/// of the subgroup done.
void scatter_done(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  clock_task(sg, "scatter");
  params_written(sg);
  subgroup_part_done(sg);
}

/// A parameter upload of the runtime's own (ParamUploader) between its acquire and its end.
struct Upload {
  Subgroup* sg;
  OpenStep* ph;
  ParamUploader* uploader;
};

/// The upload's end, on the uploader's thread: the staging buffer is released, the bytes join the
/// bus counters, the timeline gets the copy on its lane ("h2d", a "scatter"), and the parameters are written
/// (or the phase records why not: it fails when it ends).
void end_upload(Upload* up, const ParamUploader::Result& r) noexcept {
  Subgroup* sg = up->sg;
  OpenStep* ph = up->ph;
  delete up;
  starpu_data_release(sg->h_param16);
  if (r.error.empty()) add_bus_bytes(r.bytes, 0);
  try {
    if (!r.error.empty()) ph->note_upload_error(r.error);
    if (sg->timeline) sg->timeline->record_span("h2d", "scatter", std::size_t(sg->hint_update.subgroup), r.start_us, r.end_us);
  } catch (const std::bad_alloc&) {  // the timeline loses the span; an error keeps its placeholder
    if (!r.error.empty()) ph->note_upload_error("out of memory");
  }
  params_written(sg);
  subgroup_part_done(sg);
  ph->pending.done();
}

/// Callback of the read acquire of a CPU-updated subgroup's parameter staging on host memory (a
/// StarPU thread): hands the copy to the uploader.
void start_upload(void* arg) {
  auto* up = static_cast<Upload*>(arg);
  try {
    up->uploader->enqueue({&up->sg->scatter, up->sg->param16.ptr, [up](const ParamUploader::Result& r) { end_upload(up, r); }});
  } catch (const std::exception& e) {
    ParamUploader::Result r;
    r.error = std::string("queueing the parameter upload: ") + e.what();
    end_upload(up, r);
  }
}

}  // namespace

bool Optimizer::Impl::own_param_upload() const {
  return runtime_uploads_params() && where_caller == STARPU_CUDA && !cuda_nodes.empty() && codelets_have_cuda();
}

void Optimizer::Impl::scatter_params(OpenStep& ph, std::size_t i) {
  Subgroup* sg = sgs[i].get();
  if (uploads_params(i)) {
    // The runtime's own upload (param_upload.h) once the CPU's Adam has written the staging buffer:
    // a read acquire on host memory, held until the copy has ended.
    if (!uploader) uploader = std::make_unique<ParamUploader>();
    auto* up = new Upload{sg, &ph, uploader.get()};  // before add(): a throw here leaves the count as it was
    ph.pending.add();
    if (starpu_data_acquire_on_node_cb(sg->h_param16, STARPU_MAIN_RAM, STARPU_R, start_upload, up) != 0) {
      delete up;
      ph.note_upload_error("StarPU refused to acquire the new parameters of subgroup " + std::to_string(i) +
                           " in host memory");
      params_written(sg);
      subgroup_part_done(sg);
      ph.pending.done();
    }
  } else {
    struct starpu_task* s = make_task(&scatter_cl, &sg->scatter, &sg->hint_scatter, where_caller);
    s->handles[0] = sg->h_param16;
    s->callback_func = scatter_done;
    s->callback_arg = sg;
    submit(s, "parameter write-back");
  }
  starpu_data_invalidate_submit(sg->h_grad32);  // both staging buffers are dropped once used
  starpu_data_invalidate_submit(sg->h_param16);
}

}  // namespace dos
