// A CPU-updated subgroup's staging between the caller's buffers and the runtime's: its gradients
// into the host staging buffer (Optimizer::Impl::stage_download) and its new parameters back to the
// caller (Optimizer::Impl::scatter_params). Each is a StarPU task (gather_cl, scatter_cl), or, when
// the caller's tensors are on a GPU, a copy of the runtime's own on a CUDA stream per direction
// (copy_stream.h), with the callbacks of both.
#include <starpu.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "../codelets/codelets.h"
#include "../codelets/kernels/env_choice.h"
#include "optimizer_impl.h"
#include "profiling.h"

namespace dos {
using namespace detail;

bool runtime_uploads_params() {
  static const bool tasks = env_choice("DOS_PARAM_UPLOAD", {"task", "copy"}, 1, "the runtime's copy is used") == 0;
  return !tasks;
}

bool runtime_downloads_grads() {
  static const bool tasks = env_choice("DOS_GRAD_DOWNLOAD", {"task", "copy"}, 1, "the runtime's copy is used") == 0;
  return !tasks;
}

const char* runtime_copy_by() {
  static_assert(std::size(kCopyByValues) == 6, "every value of kCopyByValues is accepted below");
  static const char* const by = kCopyByValues[env_choice(
      "DOS_COPY_BY",
      {kCopyByValues[0], kCopyByValues[1], kCopyByValues[2], kCopyByValues[3], kCopyByValues[4], kCopyByValues[5]}, 0,
      "ignored (the default, adaptive: gradients down by the copy engine until one starves, parameters up by the "
      "kernel)")];
  return by;
}

bool runtime_copy_by_auto() { return std::strcmp(runtime_copy_by(), "auto") == 0; }

namespace {
bool copy_by_adaptive() { return std::strcmp(runtime_copy_by(), "adaptive") == 0; }
/// Under "adaptive": a download of this process has starved (note_starved_download)
std::atomic<bool> g_download_starved{false};
}  // namespace

bool runtime_downloads_dodge_writebacks() {
  return runtime_copy_by_auto() || (copy_by_adaptive() && g_download_starved.load());
}

bool detail::note_starved_download() noexcept {
  return copy_by_adaptive() && !g_download_starved.exchange(true);
}

bool copies_by_copy_engine(const char* by, bool up) {
  return std::strcmp(by, "memcpy") == 0 || std::strcmp(by, up ? "memcpy-up" : "memcpy-down") == 0 ||
         (!up && (std::strcmp(by, "auto") == 0 || std::strcmp(by, "adaptive") == 0));
}

bool runtime_copies_by_copy_engine(bool up) { return copies_by_copy_engine(runtime_copy_by(), up); }

namespace {

/// Callback of the parameter write-back task: the timeline, the parameters written, and one piece
/// of the subgroup done.
void scatter_done(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  clock_task(sg, "scatter");
  params_written(sg);
  subgroup_part_done(sg);
}

/// Callback of the gradient conversion task: the timeline.
void gather_done(void* arg) { clock_task(static_cast<Subgroup*>(arg), "gather"); }

/// A copy of the runtime's own (CopyStream) between its acquire of the staging handle on host
/// memory and its end: the parameters up (to_gpu, handle h_param16 held for reading) or the
/// gradients down (to_host, h_grad32 held for writing).
struct OwnCopy {
  Subgroup* sg;
  OpenStep* ph;
  CopyStream* stream;
  CopyStream::Direction dir;
  bool params_down = false;  // to_host: the caller's parameters into h_param16 (compact master), not the gradients
  /// The staging handle the copy holds: h_param16 up or for params_down, h_grad32 otherwise.
  starpu_data_handle_t handle() const {
    return dir == CopyStream::Direction::to_gpu || params_down ? sg->h_param16 : sg->h_grad32;
  }
};

/// The copy's end, on the CopyStream's thread: the staging handle is released (for the gradients,
/// this lets the CPU Adam waiting for them run), the bytes join the bus counters, the timeline gets
/// the copy on its lane ("h2d", a "scatter"; "d2h", a "gather"), and, for the parameters, they are
/// written and the subgroup's piece of work is done. A failure is recorded: the phase fails when
/// it ends (a gradient that did not arrive has been used by the CPU Adam, so the optimizer is then
/// broken, as after any failed step).
void end_copy(OwnCopy* c, const CopyStream::Result& r) noexcept {
  Subgroup* sg = c->sg;
  OpenStep* ph = c->ph;
  const bool up = c->dir == CopyStream::Direction::to_gpu;
  const bool params_down = c->params_down;
  const starpu_data_handle_t held = c->handle();
  delete c;
  // a failure is noted before the release lets the CPU Adam (and after it wait_parameters) go on
  try {
    if (!r.error.empty())
      ph->note_copy_error(std::string(up            ? "uploading the parameters of subgroup "
                                      : params_down ? "downloading the parameters of subgroup "
                                                    : "downloading the gradients of subgroup ") +
                          std::to_string(sg->hint_update.subgroup) + ": " + r.error);
  } catch (const std::bad_alloc&) {
    ph->note_copy_error("out of memory");
  }
  starpu_data_release(held);
  if (r.error.empty()) add_bus_bytes(up ? r.bytes : 0, up ? 0 : r.bytes);
  if (!up && !params_down && r.error.empty() && r.by_engine)  // the gradients' downloads only
    ph->note_download(1e-6 * (r.end_us - r.start_us), r.bytes);
  try {
    if (sg->timeline)
      sg->timeline->record_span(up ? "h2d" : "d2h", up ? "scatter" : "gather", std::size_t(sg->hint_update.subgroup),
                                r.start_us, r.end_us);
  } catch (const std::bad_alloc&) {  // the timeline loses the span
  }
  if (up) {
    params_written(sg);
    subgroup_part_done(sg);
  }
  ph->pending.done();
}

/// Callback of the acquire of a CPU-updated subgroup's staging handle on host memory (a StarPU
/// thread): hands the copy to its CopyStream.
void start_copy(void* arg) {
  auto* c = static_cast<OwnCopy*>(arg);
  Subgroup* sg = c->sg;
  const bool up = c->dir == CopyStream::Direction::to_gpu;
  try {
    CopyStream::Job j;
    j.dir = c->dir;
    j.segs = sg->segs.data();
    j.nseg = sg->segs.size();
    j.elem_bytes = up || c->params_down ? dtype_size(sg->scatter.dtype) : dtype_size(sg->gather_grads.dst_dtype);
    j.host = up || c->params_down ? sg->param16.ptr : sg->grad32.ptr;
    j.params_down = c->params_down;
    // auto (or adaptive once a download starved): a download goes by the kernel while streamed
    // state is on its way home on the copy engine
    if (!up && c->ph->st.downloads_dodge_writebacks) j.engine_busy = sg->on_link;
    j.done = [c](const CopyStream::Result& r) { end_copy(c, r); };
    c->stream->enqueue(std::move(j));
  } catch (const std::exception& e) {
    CopyStream::Result r;
    r.error = std::string("queueing the copy: ") + e.what();
    end_copy(c, r);
  }
}

}  // namespace

void Optimizer::Impl::begin_downloads(OpenStep& ph) {
  // A turned adaptive rule leaves a phase overlapped with backward on the copy engine: there a
  // download by the kernel waits behind backward's own kernels, and the CPU's speculative updates
  // with it (on the GPT of 1.01e9 parameters with the compact master on an H100, once the rule had
  // turned the steps speculated 1 subgroup instead of 3-8 and ran 46.8k tokens/s instead of
  // 50.3k; DOS_COPY_BY=auto from the start, 46.8k). DOS_COPY_BY=auto asked for holds everywhere.
  ph.st.downloads_dodge_writebacks = runtime_downloads_dodge_writebacks() && (!ph.st.overlapped || runtime_copy_by_auto());
  ph.b_d2h = have_rates ? rates.B_d2h : 0;
  ph.starved_floor = download_starved_floor();
}

void Optimizer::Impl::judge_downloads(OpenStep& ph, StepStats& st, bool counts) noexcept {
  double starved_s = 0, starved_bytes = 0;
  {
    std::lock_guard<std::mutex> g(ph.copy_mu);  // every copy has ended: nothing else writes these now
    st.longest_download_seconds = ph.longest_download_seconds;
    st.longest_download_bytes = ph.longest_download_bytes;
    starved_s = ph.starved_seconds;
    starved_bytes = double(ph.starved_bytes);
  }
  // A starved download turns the rule when it cost the CPU: its workers idle more than 10% of the
  // phase. Not from the first phase that streams, whose device allocations may hold the links (in a
  // compact master's first phase on an H100 a 248 MB download took 194 ms where the later ones
  // took about 40 ms or less, the CPU 98% busy all the same), and only from a phase run after
  // backward, as the refinement's: an overlapped phase's seconds begin with backward and one left
  // running into the next forward ends after the caller's wait, so the CPU's idle share there says
  // nothing of the downloads.
  const double cpu_busy_fraction =
      rt.cpu_workers() > 0 && st.seconds > 0 ? st.cpu_busy_seconds / (double(rt.cpu_workers()) * st.seconds) : 1.0;
  if (starved_s > 0 && counts && cpu_busy_fraction < kStarvedCpuBusy && note_starved_download() && opt.verbose)
    std::fprintf(stderr,
                 "[dos] a gradient download by the copy engine took %.1f ms for %.1f MB (%.1f ms at the model's %.1f "
                 "GB/s), waiting behind the state write-backs, and the CPU was busy %.0f%% of the phase: from the "
                 "next phase on, downloads issued while a write-back is on its way home go by the kernel "
                 "(DOS_COPY_BY=adaptive; memcpy-down keeps the copy engine; the same bits)\n",
                 1e3 * starved_s, 1e-6 * starved_bytes, 1e3 * starved_bytes / ph.b_d2h, 1e-9 * ph.b_d2h,
                 100 * cpu_busy_fraction);
}

bool Optimizer::Impl::own_copies_possible() const {
  return where_caller == STARPU_CUDA && !cuda_nodes.empty() && codelets_have_cuda();
}

bool Optimizer::Impl::own_param_upload() const { return runtime_uploads_params() && own_copies_possible(); }

bool Optimizer::Impl::own_param_download() const { return runtime_downloads_grads() && own_copies_possible(); }

bool Optimizer::Impl::own_grad_download() const {
  // a plain copy only when the staged gradient keeps the caller's dtype (no conversion to fp32)
  return runtime_downloads_grads() && own_copies_possible() && (opt.native_grads || opt.dtype == DType::fp32);
}

void Optimizer::Impl::own_copy(OpenStep& ph, std::size_t i, CopyStream::Direction dir, bool params_down) {
  Subgroup* sg = sgs[i].get();
  const bool up = dir == CopyStream::Direction::to_gpu;
  std::unique_ptr<CopyStream>& stream = up ? uploader : downloader;
  if (!stream) stream = std::make_unique<CopyStream>();
  auto* c = new OwnCopy{sg, &ph, stream.get(), dir, params_down && !up};  // before add(): a throw here leaves the count as it was
  ph.pending.add();
  // up: a read acquire, once the CPU's Adam has written the parameters; down: a write acquire, which
  // the CPU Adam submitted after it waits for (StarPU's sequential consistency)
  if (starpu_data_acquire_on_node_cb(c->handle(), STARPU_MAIN_RAM, up ? STARPU_R : STARPU_W, start_copy, c) != 0) {
    delete c;
    ph.pending.done();
    if (!up)  // the Adam that would read the staging must not be submitted: the phase fails
      throw Error(std::string("StarPU refused to acquire the ") + (params_down ? "parameter" : "gradient") +
                  " staging of subgroup " + std::to_string(i) + " in host memory");
    ph.note_copy_error("StarPU refused to acquire the new parameters of subgroup " + std::to_string(i) +
                       " in host memory");
    params_written(sg);
    subgroup_part_done(sg);
  }
}

void Optimizer::Impl::stage_download(OpenStep& ph, std::size_t i, bool params) {
  Subgroup* sg = sgs[i].get();
  if (params ? !plan.empty() && plan[i] == PlanSide::cpu && own_param_download() : downloads_grads(i)) {
    // The runtime's own download (copy_stream.h): the gradients (and a compact master's P, on the
    // same stream) come down beside the streaming, not behind the streamed Adams in the CUDA
    // worker's queue.
    own_copy(ph, i, CopyStream::Direction::to_host, params);
    return;
  }
  const starpu_data_handle_t staging = params ? sg->h_param16 : sg->h_grad32;
  struct starpu_task* g = make_task(&gather_cl, params ? &sg->gather_p16 : &sg->gather_grads, &sg->hint_io, where_caller);
  g->handles[0] = staging;
  g->callback_func = gather_done;
  g->callback_arg = sg;
  submit(g, params ? "parameter copy (compact master)" : "gradient conversion");
  if ((plan.empty() ? ph.speculated[i] : plan[i] == PlanSide::cpu) && where_caller == STARPU_CUDA && !cuda_nodes.empty()) {
    // The CPU's input comes down as soon as it is staged: an asynchronous acquire on main RAM is a
    // fetch, which StarPU serves before prefetches; left to the Adam task's prefetch, the gradient
    // waited behind the streamed subgroups' write-backs and the CPU idled.
    acquire_home(ph, staging, STARPU_R, nullptr, false);
  }
}

void Optimizer::Impl::scatter_params(OpenStep& ph, std::size_t i, bool keep_params) {
  Subgroup* sg = sgs[i].get();
  if (uploads_params(i)) {
    // The runtime's own upload (copy_stream.h) once the CPU's Adam has written the staging buffer.
    own_copy(ph, i, CopyStream::Direction::to_gpu);
  } else {
    struct starpu_task* s = make_task(&scatter_cl, &sg->scatter, &sg->hint_scatter, where_caller);
    s->handles[0] = sg->h_param16;
    s->callback_func = scatter_done;
    s->callback_arg = sg;
    submit(s, "parameter write-back");
  }
  starpu_data_invalidate_submit(sg->h_grad32);  // both staging buffers are dropped once used
  if (!keep_params) starpu_data_invalidate_submit(sg->h_param16);
  // kept for the next phase on the host: a device copy left by a write-back task is not needed
  else if (!uploads_params(i)) starpu_data_wont_use(sg->h_param16);
}

}  // namespace dos
