// Internal to the runtime (not installed): the optimizer's private parts, shared by optimizer.cpp
// (construction, task helpers, state access), plan_step.cpp (plans, refinement), update_phase.cpp (the update
// phase and its task callbacks) and speculation.cpp (gradients_final, the speculative updates), with staging.cpp (the CPU subgroups' copies), state_writeback.cpp
// (the state's way home) and tail_binder.cpp (the late binding of the plan's tail). A Subgroup
// (subgroup.h) is one slice of the flat parameters with its host state, staging buffers and
// StarPU handles; an OpenStep is an update phase between begin_step and the end
// of finish_step; Optimizer::Impl owns both. Contract: Optimizer::Impl runs on the caller's thread,
// except speculate (and what it calls), which the open step's submitter thread runs; StarPU's
// callbacks touch a Subgroup only through its atomics, its window, its timeline and its busy sums,
// and an OpenStep only through its Pending.
#pragma once

#include <starpu.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../codelets/codelets.h"
#include "../scheduler/plan_prefetch.h"
#include "../scheduler/policy.h"
#include "admission.h"
#include "dos.h"
#include "host_memory.h"
#include "copy_stream.h"
#include "profiling.h"
#include "refinement.h"
#include "subgroup.h"

namespace dos {
namespace detail {

/// Impl::broken's prefix after a load that failed part-way.
inline constexpr const char* kLoadFailed = "loading a state failed part-way: ";
/// Impl::broken's prefix when a compact master's split was not followed by its parameters' write
/// (Impl::compact_masters): a whole state loaded mends it, as it mends a load that failed part-way.
inline constexpr const char* kCompactWriteFailed = "writing the parameters of a compact master failed: ";
/// Whether Impl::broken `b` is a mark that loading a whole state mends. Throws nothing.
inline bool load_mends(const std::string& b) {
  return b.rfind(kLoadFailed, 0) == 0 || b.rfind(kCompactWriteFailed, 0) == 0;
}

/// What deciding one phase's plan cost (make_plan): seconds spent on it (deciding, or waiting for
/// the decision made ahead), and whether a decision made before the phase (plan_ahead) was taken.
struct PlanDecision {
  double seconds = 0;
  bool ahead = false;
};

/// The state of an update phase between begin_step() and the end of finish_step().
struct OpenStep {
  StepStats st;
  std::uint64_t h2d0 = 0, d2h0 = 0;
  std::chrono::steady_clock::time_point t0;
  /// Seconds from t0 to the end of begin(): what the phase's start spent before anything could be
  /// submitted (the plan's decision, its simulation, the bound, the subgroups' set-up). The phase
  /// simulation starts at the first submission, so the refinement takes the phase's times less it.
  double setup_seconds = 0;
  /// The timeline's bus sampler: a thread that calls sample_bus() every millisecond while the phase
  /// runs (start_sampler), woken at once by stop_sampler, so that joining it adds no wait to the
  /// phase's time (a thread sleeping its millisecond out had made a timeline's phase end up to a
  /// sampling period late: its times came in steps of about 1.1 ms on short phases).
  bool sampling = false;  // guarded by sampling_mu
  std::mutex sampling_mu;
  std::condition_variable sampling_cv;
  std::thread sampler;
  /// Starts the sampler thread (sampling until stop_sampler). Throws std::system_error when the
  /// thread cannot be started.
  void start_sampler() {
    {
      std::lock_guard<std::mutex> g(sampling_mu);
      sampling = true;
    }
    sampler = std::thread([this] {
      std::unique_lock<std::mutex> g(sampling_mu);
      while (sampling) {
        g.unlock();
        sample_bus();
        g.lock();
        sampling_cv.wait_for(g, std::chrono::milliseconds(1), [this] { return !sampling; });
      }
    });
  }
  /// Stops the sampler thread, if one runs, and joins it; returns whether one ran. Throws nothing.
  bool stop_sampler() {
    {
      std::lock_guard<std::mutex> g(sampling_mu);
      sampling = false;
    }
    sampling_cv.notify_all();
    if (!sampler.joinable()) return false;
    sampler.join();
    return true;
  }
  /// Appends one bus sample to st.bus: the bytes each way since h2d0 / d2h0, at seconds since t0.
  /// Called by the sampler thread while the phase runs, then once by the caller after joining it.
  void sample_bus() {
    BusSample b;
    read_bus_bytes(&b.h2d, &b.d2h);
    b.h2d -= h2d0;
    b.d2h -= d2h0;
    b.t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.bus.push_back(b);
  }
  Simulation sim;
  /// Per subgroup, its state had no valid copy on the GPU when the phase began (states_off_gpu):
  /// what execution() hands the phase simulation while the phase is open.
  std::vector<bool> state_off_gpu;
  /// Per subgroup, Subgroup::params_on_host when the phase began (compact master; empty otherwise):
  /// what execution() hands the phase simulation while the phase is open.
  std::vector<bool> params_on_host;
  Pending pending;
  std::atomic<int> refused{0};          // asynchronous acquires StarPU refused (any submitting thread)
  std::vector<char> admitted;           // the subgroup holds its footprint in the admission window
  std::vector<std::size_t> final_elems;  // elements of the subgroup's gradient declared final
  std::map<std::size_t, std::size_t> declared;  // the ranges declared final so far: begin -> end
  std::mutex declare_mu;  // gradients_final from several threads at once (declared, final_elems)
  std::vector<char> stepped;            // its step count went up in this step
  std::vector<char> speculated;         // its speculative update was submitted (and not redone)
  std::vector<std::size_t> spec_order;  // the speculated subgroups, in submission order
  // Optimizer::finish_step_async: every task is submitted, the phase runs on (wait_step ends it)
  bool finishing = false;
  bool async = false;  // finished by finish_step_async
  StepVerdict verdict = StepVerdict::keep;
  double waited = 0;  // seconds the caller waited in finish_step_async, wait_parameters and wait_step
  double waits_end = 0;  // seconds from t0 to the end of the caller's last blocked wait_parameters
  std::size_t largest_fp = 0;
  bool cpu_first = false;
  // Speculative updates are submitted by a thread of their own, from the subgroups whose gradients
  // became complete (gradients_final queues them): the caller's thread, busy with backward, never
  // waits in StarPU's task and data calls.
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<std::size_t> queue;
  bool q_closed = false;
  std::thread submitter;
  std::string submit_error;  // the first failure of the submitter thread (empty: none)
  // Late binding of the plan's tail (OptimizerOptions::tail_subgroups): the subgroups left out of
  // the submission, and the thread that binds and submits them (its failure: bind_error).
  TailWatch tail;
  std::vector<std::size_t> tail_order;
  std::vector<char> in_tail;
  std::vector<char> tail_submitted;  // the binder submitted all of the subgroup's work
  std::thread binder;
  std::string bind_error;
  // the first failure of a copy of the runtime's own between the caller's GPU tensors and host
  // staging (CopyStream; empty: none): the phase fails when it ends
  mutable std::mutex copy_mu;
  std::string copy_error;
  void note_copy_error(const std::string& why) {
    std::lock_guard<std::mutex> g(copy_mu);
    if (copy_error.empty()) copy_error = why;
  }
  /// The first copy failure noted so far (empty: none); any thread.
  std::string copy_failure() const {
    std::lock_guard<std::mutex> g(copy_mu);
    return copy_error;
  }
  // The runtime's own gradient downloads by the copy engine (DOS_COPY_BY, dos::runtime_copy_by):
  // b_d2h and starved_floor are set when the phase begins, with st.downloads_dodge_writebacks
  // (the rates' B_d2h in bytes/s, 0 without rates; download_starved_floor(), seconds;
  // runtime_downloads_dodge_writebacks); the longest download so far and the longest that starved
  // (download_starved against b_d2h and starved_floor) are kept under copy_mu.
  double b_d2h = 0;
  double starved_floor = 0.1;
  double longest_download_seconds = 0;  // guarded by copy_mu
  std::size_t longest_download_bytes = 0;  // guarded by copy_mu
  double starved_seconds = 0;  // the longest starved download's seconds (0: none); guarded by copy_mu
  std::size_t starved_bytes = 0;  // and its bytes; guarded by copy_mu
  /// Records one download by the copy engine that took `seconds` (issue to end) for `bytes`; any
  /// thread. Throws nothing.
  void note_download(double seconds, std::size_t bytes) noexcept {
    std::lock_guard<std::mutex> g(copy_mu);
    if (seconds > longest_download_seconds) {
      longest_download_seconds = seconds;
      longest_download_bytes = bytes;
    }
    if (seconds > starved_seconds && download_starved(seconds, bytes, b_d2h, starved_floor)) {
      starved_seconds = seconds;
      starved_bytes = bytes;
    }
  }

  OpenStep() = default;
  OpenStep(const OpenStep&) = delete;
  OpenStep& operator=(const OpenStep&) = delete;
  /// Ends the submitter thread after the subgroups queued so far: every speculative update it
  /// submits is submitted when this returns.
  void drain() {
    {
      std::lock_guard<std::mutex> g(q_mu);
      q_closed = true;
    }
    q_cv.notify_all();
    if (submitter.joinable()) submitter.join();
  }
  /// Waits for the binder thread to end; with `stop`, tells it to give up first (a failed phase).
  void join_binder(bool stop) {
    if (stop) {
      {
        std::lock_guard<std::mutex> g(tail.mu);
        tail.stop = true;
      }
      tail.cv.notify_all();
    }
    if (binder.joinable()) binder.join();
  }
  /// Stops the submitter, the binder and the sampler and waits for the acquisitions still referring
  /// to `pending`.
  ~OpenStep() {
    drain();
    join_binder(true);
    stop_sampler();
    pending.wait();
  }
};

/// Submits t; throws Error when StarPU refuses it (`what` names the task).
void submit(struct starpu_task* t, const char* what);

// The update phase's callback helpers (update_phase.cpp), shared with the parameter write-back
// (staging.cpp) and the speculative updates (speculation.cpp). StarPU's threads and the CopyStreams' call them.
/// Ends one piece of a subgroup's work; the last one gives its footprint back to the window.
void subgroup_part_done(Subgroup* sg);
/// From a step task's callback: completes the task's clock record, adds it to the optimizer's busy
/// sums and, when a timeline is asked for, to the timeline.
void clock_task(Subgroup* sg, const char* what);
/// From a GPU Adam's callback: a submitted eager write-back's state now leaves the GPU, counted on
/// the link (Subgroup::writeback_link; state_writeback.cpp, which uncounts it once home).
void link_writeback_started(Subgroup* sg);
/// Marks the subgroup's parameters written (Optimizer::wait_parameters).
void params_written(Subgroup* sg);
/// From an Adam task's callback: records in sg->ran_on the kind of worker running it (1: CPU, 2:
/// CUDA).
void note_worker(Subgroup* sg);
/// Whether a read acquire of a state on host memory is followed by starpu_data_wont_use on its
/// handle (state_writeback.cpp): true unless DOS_WONT_USE=0 (a measurement switch, read once).
bool wont_use_after_writeback();

/// Under DOS_COPY_BY=adaptive (runtime_copy_by): records that a download of this process starved,
/// so that runtime_downloads_dodge_writebacks() is true from now on; returns whether this call
/// changed it (false under any other DOS_COPY_BY, or when a starved download was noted before).
/// Any thread; throws nothing. (staging.cpp)
bool note_starved_download() noexcept;

/// The memory node of each of StarPU's CUDA workers, in worker-id order (empty without one). StarPU
/// must be running. Throws nothing. (optimizer.cpp)
std::vector<unsigned> cuda_memory_nodes();

/// Checks the calibration's switches now, DOS_CALIBRATE_LINK_SHARE (its link_share rule),
/// DOS_CALIBRATION_REPS (its repetitions of each scratch phase) and DOS_CALIBRATION_SUBGROUPS (its
/// scratch subgroups; calibrate_rates), so that a bad
/// value is refused wherever a model policy runs, not only where a calibration does (a machine
/// without a GPU never calibrates). Throws Error naming the variable. (calibration.cpp)
void check_calibration_switches();

}  // namespace detail

/// What an optimizer reads of its Runtime, kept by value: an Optimizer may outlive its Runtime
/// (StarPU then stops with the last Optimizer), so it keeps no pointer to it. The worker counts are
/// StarPU's, read when asked (StarPU runs as long as an Optimizer lives).
struct RuntimeFacts {
  bool model = false;  ///< Runtime::model_policy() when the optimizer was made
  bool model_policy() const { return model; }
  int threads = 1;  ///< Runtime::cpu_threads() when the optimizer was made
  int cpu_threads() const { return threads; }
  unsigned cpu_workers() const { return starpu_cpu_worker_get_count(); }
  unsigned cuda_workers() const { return starpu_cuda_worker_get_count(); }
};

struct Optimizer::Impl {
  RuntimeFacts rt;
  OptimizerOptions opt;
  std::vector<TensorView> tensors;
  std::vector<std::unique_ptr<detail::Subgroup>> sgs;
  std::size_t nparams = 0;
  uint32_t where_caller = STARPU_CPU;
  bool use_hints = false;
  /// Set while step(), step_async() or begin_step() runs: a second thread's call meanwhile is
  /// refused (OneCaller in update_phase.cpp).
  std::atomic<bool> in_call{false};
  PolicyChoice choice;
  Workload workload;
  Rates rates{};             // the rates to plan with: calibrated, then refined after every phase
  Rates calibrated_rates{};  // the calibration's own (the lower bound's, stable from run to run)
  // the refinement holds the links to calibrated_rates (models/refinement.h, kLinkCeiling): they come
  // from a calibration (this process's, the cache's, a rates file's apart from its rates)
  bool holds_links = false;
  bool have_rates = false;
  PlanOverride override_;
  std::string rates_path;  // where calibrate_rates caches the rates; refined ones go back there
  bool refined = false;
  // whether rates.link_share holds a counted measure, not the placeholder nor the calibration's
  // uncounted one (refine_rates takes its first measure whole), and the provisional measure, the
  // calibration's or a first streamed phase's (LinkShareRecord): initial_link_share_record (or
  // link_share_is_measured of rates given) at construction, then record_phase after each refined
  // phase; what rates_to_save writes back
  LinkShareRecord link_share_record;
  // whether rates.U_c holds a measure of this optimizer's phases (Refined::u_c_measured): false at
  // the start from calibrated or cached rates (the first measure from a phase that streamed nothing
  // and ran its CPU Adam mostly without DMA is then taken whole; a measure from CPU Adam tasks after
  // a phase's streaming is blended and ends that), true from rates given
  bool u_c_measured = true;
  // how the last phases recorded (refined or held) went against their predictions, and the last
  // one's plan (hold_outlier_phase's record)
  PhaseErrors phase_errors;
  /// Whether a phase of this optimizer has run (not skipped) with streamed subgroups: StarPU
  /// allocated their GPU buffers in it. Until then choose_tail binds nothing (tail_binder.cpp), and
  /// the next phase that streams is refine's first_streamed (overlapped and asynchronous phases
  /// allocate too, though they refine nothing). An
  /// approximation: a later plan that streams other subgroups allocates theirs in a phase that binds.
  bool stream_buffers_allocated = false;
  std::vector<PlanSide> plan;  // this step's plan (empty for StarPU's built-in policies)
  std::string broken;          // why a failed step left the state inconsistent (empty: fine)
  AdmissionWindow window;      // the GPU update budget
  detail::Timeline timeline;
  detail::PhaseBusy busy;
  detail::ParamsReady ready;
  bool timeline_on = false;
  std::vector<unsigned> cuda_nodes;  // memory node of each CUDA worker, in worker-id order
  std::unique_ptr<detail::OpenStep> open;  // the update phase between begin_step and finish_step
  // the runtime's own copies of CPU subgroups' staging (copy_stream.h), one stream each way, made at
  // their first use (uploads_params, downloads_grads)
  // Streamed state write-backs on the device-to-host link now (Subgroup::writeback_link), read by
  // the downloader's jobs under DOS_COPY_BY=auto and adaptive once turned (declared before the
  // CopyStreams: it outlives them).
  std::atomic<int> state_writebacks_on_link{0};
  std::unique_ptr<detail::CopyStream> uploader, downloader;
  std::size_t shadow_used = 0, shadow_limit = 0;  // host bytes of shadow state, and their budget
  // The previous overlapped step's gradients changed after their declaration (clipping was active):
  // this step speculates nothing, since its speculative updates would most likely be redone too
  // (clipping tends to stay active from one step to the next); the next step tries again.
  bool last_changed = false;

  // The update phase (update_phase.cpp; declare_final, which Optimizer::gradients_final calls, in
  // speculation.cpp).
  void begin(bool overlapped);
  void declare_final(std::size_t begin, std::size_t end);
  StepStats finish(StepVerdict verdict);
  /// finish(): everything submitted, the phase left running (Optimizer::finish_step_async when async).
  void finish_submit(StepVerdict verdict, bool async);
  /// finish(): waits for the phase submitted by finish_submit and returns its figures.
  StepStats finish_wait();
  void wait_parameters(std::size_t begin, std::size_t end);
  /// Optimizer::wait_step_work.
  void wait_work();
  [[noreturn]] void fail(const std::string& why);
  void require_no_open_step(const char* what) const;
  /// read_master_range / write_master_range: copies between the masters of flat elements
  /// [begin, end) and `at` (host memory), subgroup by subgroup, acquiring each master for `mode`
  /// (STARPU_R to read, STARPU_RW to write). Throws Error, nothing copied, for a range outside the
  /// parameters or, writing, a value that is not finite.
  void copy_master_range(std::size_t begin, std::size_t end, float* at, enum starpu_data_access_mode mode,
                         const char* what) const;
  // The speculative updates (speculation.cpp). speculable: whether subgroup i may be updated
  // speculatively in this step (a speculation budget, no clipping active at the last step; a
  // streamed one with speculate_streamed, and a CUDA worker). ensure_shadow: the
  // subgroup's host shadow state allocated and registered within the speculation budget; false when
  // it does not fit. speculate: subgroup i's speculative update submitted when speculable, its
  // shadow state has room and, on the GPU, its footprint fits the update budget now; else nothing.
  bool speculable(std::size_t i) const;
  bool ensure_shadow(detail::Subgroup* sg);
  void speculate(detail::OpenStep& ph, std::size_t i);
  /// Subgroup i's gradients into its staging handle (h_grad32) before its Adam task (params false),
  /// or a compact state's P into h_param16 for adam_compact_cl (params true): the runtime's own
  /// download (downloads_grads(i); for P, the plan puts i on the CPU and own_param_download(), on
  /// the gradients' copy stream), or a gather_cl task where the caller's buffers are (converting
  /// or copying the gradients; copying P) and, with them on a GPU and the update on the CPU, an
  /// acquire that brings the result down at once. Throws what own_copy and submit throw.
  void stage_download(detail::OpenStep& ph, std::size_t i, bool params);
  void stage_gradient(detail::OpenStep& ph, std::size_t i) { stage_download(ph, i, false); }
  void stage_params(detail::OpenStep& ph, std::size_t i) { stage_download(ph, i, true); }
  /// Subgroup i's parameter write-back, after its Adam task: the runtime's own upload
  /// (uploads_params(i)) or a scatter_cl task; then both staging buffers are invalidated, but for
  /// the parameters' when keep_params (a compact master's P kept in the host staging for the next
  /// phase: Subgroup::params_on_host).
  void scatter_params(detail::OpenStep& ph, std::size_t i, bool keep_params = false);
  /// Whether subgroup i's new P stays in its host staging after its update (Subgroup::params_on_host):
  /// a compact master's subgroup that the plan updates on the CPU.
  bool keeps_params_on_host(std::size_t i) const {
    return opt.compact_master && !plan.empty() && plan[i] == PlanSide::cpu;
  }
  /// Before a non-direct Adam task of subgroup i (adam_compact_cl, adam_compact_into_cl): a compact
  /// state's P staged (stage_params) unless its last update, on the CPU, left it in the staging
  /// (keeps_params_on_host and Subgroup::params_on_host); then params_on_host cleared until the
  /// update's P is written back (scatter_new_params). Nothing staged for the full form. Throws what
  /// stage_params throws.
  void stage_params_unless_kept(detail::OpenStep& ph, std::size_t i);
  /// After subgroup i's Adam task (or its kept speculative one): scatter_params, its P kept in the
  /// staging when keeps_params_on_host(i), and Subgroup::params_on_host set to match. Throws what
  /// scatter_params throws.
  void scatter_new_params(detail::OpenStep& ph, std::size_t i);
  /// Submits subgroup i's update in this phase (update_phase.cpp): its admission into the window,
  /// step count, Adam task with its gradient staging and parameter write-back, and the eager
  /// write-back of a streamed state. prefetched: its state's prefetch was asked for by the
  /// submission's lookahead (else StarPU prefetches the task's inputs when it is pushed).
  void submit_update(detail::OpenStep& ph, std::size_t i, bool prefetched);
  /// The binder thread's work (tail_binder.cpp; OptimizerOptions::tail_subgroups): each subgroup
  /// of ph.tail_order, in turn, once tail_due, is given bind_tail's side (plan, hint and
  /// footprint), submitted, and its end-of-phase write-back asked for. Throws what submit_update
  /// throws.
  void bind_tail_subgroups(detail::OpenStep& ph);
  /// Chooses ph.tail_order and ph.in_tail (tail_binder.cpp; OptimizerOptions::tail_subgroups):
  /// the last tail_subgroups subgroups, in index order, that the plan updates on the CPU or
  /// streams; none in a phase opened by begin_step or finished by finish_step_async (the binder
  /// runs only inside step(), so no call of the caller's meets it half way), without a CUDA worker,
  /// a model's plan or rates, before a phase of this optimizer has streamed
  /// (stream_buffers_allocated), or when the subgroups left outside the tail do not both stream
  /// and update on the CPU.
  void choose_tail(detail::OpenStep& ph);
  /// A copy of the runtime's own for subgroup i (staging.cpp): an asynchronous acquire of its
  /// staging handle on host memory (to_gpu: h_param16 for reading; to_host: h_grad32 for writing),
  /// whose callback queues the copy on the CopyStream of that direction; the copy's end releases
  /// the handle. A failed copy, or a refused acquire of the parameters, is noted in ph
  /// (OpenStep::note_copy_error) and fails the phase at its end; a refused acquire of the gradient
  /// staging throws Error at once (nothing may then read the staging). params_down (to_host only):
  /// the caller's parameters into h_param16 instead (a compact state's P, stage_params).
  void own_copy(detail::OpenStep& ph, std::size_t i, detail::CopyStream::Direction dir, bool params_down = false);
  /// At the start of phase `ph` (begin, before any copy): how its gradient downloads go and what
  /// counts as starved (ph.st.downloads_dodge_writebacks;
  /// b_d2h, the rates' B_d2h or 0 without rates; starved_floor, read here rather than on a copy's
  /// thread). Throws what reading the environment throws (std::bad_alloc). (staging.cpp)
  void begin_downloads(detail::OpenStep& ph);
  /// At the end of phase `ph` (finish_wait: every copy has ended), after `st`'s seconds and busy
  /// times: the phase's longest gradient download by the copy engine into `st`
  /// (longest_download_seconds, longest_download_bytes), and DOS_COPY_BY's adaptive rule
  /// (runtime_copy_by): when the phase `counts` (run after backward, not the optimizer's first
  /// that streams), one of its downloads starved (OpenStep::note_download) and its CPU workers were
  /// busy less than kStarvedCpuBusy of it, the rule turns (note_starved_download), said on stderr
  /// when the optimizer is verbose. Throws nothing. (staging.cpp)
  void judge_downloads(detail::OpenStep& ph, StepStats& st, bool counts) noexcept;
  /// on_timeline: the span of this write-back goes on the timeline's lane "writeback" (the eager
  /// write-back of a subgroup's state; with sg null it never does).
  void acquire_home(detail::OpenStep& ph, starpu_data_handle_t h,
                    enum starpu_data_access_mode mode, detail::Subgroup* sg, bool on_timeline);
  void write_back(detail::OpenStep& ph, detail::Subgroup* sg,
                  enum starpu_data_access_mode mode, bool part_of_subgroup);

  /// An Execution with only the CPU team set (its threads per worker, the CPU kernel's work item):
  /// what cpu_team_share reads.
  Execution cpu_team() const {
    Execution e;
    e.cpu_team_threads = std::size_t(std::max(1, rt.cpu_threads()));
    e.cpu_work_item = kCpuWorkItem;
    return e;
  }
  /// How step() carries a plan out (the phase simulation's view of it, models/phase_sim.h).
  Execution execution() const {
    Execution e = cpu_team();
    e.order = opt.submit_order;
    e.lookahead = cuda_nodes.empty() ? 0 : opt.stream_lookahead;
    e.update_budget = cuda_nodes.empty() ? 0 : opt.gpu_update_budget;
    e.cpu_workers = rt.cpu_workers();
    e.own_param_upload = own_param_upload();
    e.own_grad_download = own_grad_download();
    e.grad_download_by_copy_engine = runtime_copies_by_copy_engine(false);
    e.param_upload_by_copy_engine = runtime_copies_by_copy_engine(true);
    e.state_off_gpu = open ? open->state_off_gpu : states_off_gpu();
    e.params_on_host = open ? open->params_on_host : params_on_host();
    return e;
  }
  /// Per subgroup, Subgroup::params_on_host (compact master; empty otherwise). Read when none of
  /// this optimizer's updates is being submitted.
  std::vector<bool> params_on_host() const {
    std::vector<bool> v;
    if (opt.compact_master)
      for (const auto& sg : sgs) v.push_back(sg->params_on_host);
    return v;
  }
  /// Per subgroup, whether its state handle has no valid copy on the memory node of the CUDA
  /// worker that the placement policy gives it (StarPU's starpu_data_query_status, read without
  /// StarPU's lock: exact when none of this optimizer's tasks is in flight, as at a phase's
  /// beginning, which is when begin() reads it). Empty without a CUDA worker.
  std::vector<bool> states_off_gpu() const;
  /// The phase simulation of `plan` at `rates` as step() carries it out (execution()); when the
  /// simulation cannot progress (std::logic_error), a Simulation holding only the resource bound's
  /// total (predict, resource_model.h). Needs have_rates.
  Simulation simulate_plan() const;
  /// Whether subgroup i's new parameters go to the caller's GPU tensors by the runtime's own upload
  /// (CopyStream) instead of a scatter_cl task on the CUDA worker: the plan updates it on the
  /// CPU, the caller's buffers are on a GPU and the build has CUDA. Measurement switch:
  /// DOS_PARAM_UPLOAD=task keeps the scatter_cl task.
  bool uploads_params(std::size_t i) const { return !plan.empty() && plan[i] == PlanSide::cpu && own_param_upload(); }
  /// Whether the runtime uploads CPU-updated subgroups' parameters itself (uploads_params):
  /// own_copies_possible(), unless DOS_PARAM_UPLOAD=task.
  bool own_param_upload() const;
  /// Whether subgroup i's gradients come into host staging by the runtime's own download
  /// (CopyStream) instead of a gather_cl task on the CUDA worker and StarPU's transfer: the plan
  /// updates it on the CPU and own_grad_download(). Measurement switch: DOS_GRAD_DOWNLOAD=task.
  bool downloads_grads(std::size_t i) const { return !plan.empty() && plan[i] == PlanSide::cpu && own_grad_download(); }
  /// Whether the runtime downloads CPU-updated subgroups' gradients itself (downloads_grads):
  /// own_copies_possible(), the gradients staged in the caller's dtype (native_grads, or fp32
  /// parameters: a plain copy, no conversion), unless DOS_GRAD_DOWNLOAD=task.
  bool own_grad_download() const;
  /// Whether the runtime downloads a CPU-updated subgroup's parameters itself (a compact state's P,
  /// stage_params): own_copies_possible(), unless DOS_GRAD_DOWNLOAD=task (a plain copy whatever the
  /// gradients' staging).
  bool own_param_download() const;
  /// Whether copies of the runtime's own can serve the caller: its buffers are on a GPU, a CUDA
  /// worker runs and the build has CUDA.
  bool own_copies_possible() const;
  /// Whether subgroup i's update this step takes the direct path: a plan puts it on the GPU and the
  /// caller's buffers are there (CUDA worker present).
  bool direct_path(std::size_t i) const {
    return !plan.empty() && plan[i] != PlanSide::cpu && where_caller == STARPU_CUDA && !cuda_nodes.empty();
  }

  // Construction, task helpers and state access (optimizer.cpp); plans and refinement (plan_step.cpp).
  Impl();
  ~Impl();

  /// The plan of the next step: none under a StarPU policy; every update on the CPU without a CUDA
  /// worker; a forced plan (set_plan_override) spread over the subgroups that are not resident;
  /// else the plan's own decision.
  /// `decided`, when given, gets what the plan's own decision cost (left as it is for a forced plan
  /// or without a CUDA worker): StepStats::plan_seconds and plan_decided_ahead.
  std::vector<PlanSide> make_plan(detail::PlanDecision* decided = nullptr) const;
  /// The plan's decision held for reuse: made ahead when a phase ends (decide_next_plan_ahead),
  /// or the last one make_plan made, for an equal input (plan_prefetch.h). Only for plans with
  /// PlanNeeds::decided_ahead; make_plan reads and fills it (mutable: make_plan is const).
  mutable PlanPrefetch plan_ahead;
  /// Starts the next phase's decision on a thread of its own (PlanPrefetch::start) for a plan with
  /// PlanNeeds::decided_ahead, no plan override and a CUDA worker; called when a phase has ended
  /// and its rates are refined. Throws nothing (a decision that cannot start is made when the next
  /// phase begins).
  void decide_next_plan_ahead() noexcept;
  /// Whether the plan's decisions are made ahead and reused (plan_ahead): PlanNeeds::decided_ahead,
  /// unless the measurement switch DOS_PLAN_AHEAD=off (every plan decided when its phase begins;
  /// the same sides; on, the default; another value warns once). Throws std::bad_alloc only,
  /// while warning of a bad value.
  bool decides_ahead() const;

  /// Online refinement of the rates after a step (the rule and its sources: models/refinement.h,
  /// refine_rates): what the step measured (`m`: its CPU Adam busy time, its CPU Adam tasks that
  /// began after the last streamed write-back, when the streaming ended), against `sim`, the
  /// simulation of the step's plan at the rates it was made with. Only under a plan that refines,
  /// with a CUDA worker, once rates are known (then they are complete: given and checked, or
  /// calibrated, and a refinement step keeps each positive and finite, so refine_rates does not
  /// throw here); sets `refined` when a measurement was applied, and `link_share_record` by
  /// record_phase (Refined::link_share_measured: its first measure is taken whole while it is not
  /// counted (the placeholder or the calibration's measure); Refined::link_share_provisional: what the rates file gets when no
  /// phase measures it). first_streamed: the step streamed and no earlier phase of
  /// this optimizer did (stream_buffers_allocated before it), so StarPU allocated the streamed
  /// state's GPU buffers in it (on the GPU machine such a phase ran 0-25% slower than the next
  /// ones on the 7B and 20B quarters before the kernels were loaded at start, 1% faster to 10%
  /// slower after); while link_share is not counted refine_after_phase takes its measure whole
  /// (the other rates half way) without counting it as link_share's measure, and when link_share
  /// holds a measure it refines the phase as any other. (A first step that streamed nothing ran 3%
  /// slower than the next ones on the 7B 1/16 shard: it refines.)
  /// seconds: the phase's measured seconds from its first submission (StepStats::seconds less
  /// the set-up, OpenStep::setup_seconds), as sim.total counts them. A phase that hold_outlier_phase holds (its measured /
  /// predicted ratio, against sim.total, more than 1.3x off the last phase's, under the same plan,
  /// after two steady phases; not the first that streamed) refines nothing; returns true then, false
  /// otherwise. DOS_OUTLIER_PHASES=refine refines every
  /// phase (the rule before, to measure the two against each other on one machine).
  /// DOS_LINK_SHARE_MEASURE=simulated (runtime_link_share_measure) hands refine_after_phase the
  /// phase simulation of the plan as run at each candidate link_share (its stream end), for its
  /// simulated measure of link_share.
  bool refine(const PhaseMeasure& m, const Simulation& sim, bool first_streamed, double seconds);

  struct starpu_task* make_task(struct starpu_codelet* cl, void* arg, const TaskHint* hint, uint32_t where);

  /// An Adam task of the plan's side on subgroup sg's state (handle 0: h_state; the caller sets any
  /// others), with `done` as its callback (argument: sg).
  struct starpu_task* adam_task(detail::Subgroup* sg, struct starpu_codelet* cl, void* arg, uint32_t where,
                                void (*done)(void*));

  /// Calls submit_for(sg, master) for every subgroup in order, `master` a StarPU handle of its own
  /// over the master slice of sg's host state (sg->size fp32 elements), then waits for every task
  /// and unregisters those handles, which brings what a task wrote home into the state buffer (its
  /// device copies are dropped). For tasks on the master parameters alone (their initialisation,
  /// the cast after a load), which would otherwise move the whole state. h_state must be valid in
  /// host memory only and hold no task (as after its registration or a write acquire there), and
  /// no task may use it meanwhile. Rethrows what submit_for throws, after the same wait.
  void with_master_handles(const std::function<void(detail::Subgroup*, starpu_data_handle_t)>& submit_for);

  /// Holds every subgroup's state (h_state: master, exp_avg and exp_avg_sq) in host memory (acquired in `mode`:
  /// STARPU_R brings the host copies up to date, STARPU_W invalidates the device copies) and calls
  /// fn with their pointers, as a vector of State ({master, exp_avg, exp_avg_sq, size}), in subgroup
  /// (flat) order; releases them all when fn returns or throws.
  /// (Defined in optimizer.cpp, its only user.)
  /// With a compact state (OptimizerOptions::compact_master) the masters are rebuilt into buffers of
  /// their own first (4 bytes per parameter, compact_masters; not with STARPU_W) and split back after
  /// fn unless mode is STARPU_R, the new parameters then written to the caller.
  template <class State, class Fn>
  void hold_state(starpu_data_access_mode mode, Fn&& fn) const;
  /// hold_state's holding: master_of(sg) gives the master pointer handed to fn.
  template <class State, class Master, class Fn>
  void hold_full_or_compact(starpu_data_access_mode mode, Master&& master_of, Fn&& fn) const;

  /// A compact state's masters of subgroup sg's elements [from, to) (subgroup positions): read into
  /// at[0, to - from) (write false: rebuilt from the caller's parameters P, lo and r), or written from
  /// it (write true: split into P, lo and r, and P written to the caller's buffers). P comes from the
  /// caller by a copy task into the staging h_param16 (not when [from, to) is the whole subgroup and
  /// written: every P is then new), acquired with h_state in host memory; returns
  /// once the tasks it submitted have ended. No phase may be open, and no other call may use sg's
  /// staging meanwhile (not thread-safe). Throws Error, nothing changed, when a value to write is a
  /// NaN (no compact form; infinities have one); rethrows a failure to submit the write-back of P,
  /// after marking the optimizer broken (kCompactWriteFailed: lo and r split, P not written).
  /// (compact_state.cpp.)
  void compact_masters(detail::Subgroup* sg, std::size_t from, std::size_t to, float* at, bool write) const;

  /// Copies slice `slice` of every subgroup's state (0: master, 1: exp_avg, 2: exp_avg_sq) into
  /// out (nparams fp32 elements, flat order), each acquired in host memory for reading.
  void read_state(float* out, std::size_t slice) const;
};

}  // namespace dos
