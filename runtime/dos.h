// Deep Optimizer States: the public C++ API.
//
// The caller (a training loop, a PyTorch binding) owns the model's parameters and gradients:
// buffers of fp32, fp16 or bf16 elements, all in host memory or all in the memory of the runtime's
// GPU (CUDA device 0 unless RuntimeOptions::cuda_device names another).
// The runtime owns the optimizer state: fp32 master parameters (initialised from the caller's
// parameters), `exp_avg`, `exp_avg_sq` and a step count per subgroup, in pinned host memory.
//
//   dos::Runtime rt({.policy = "cpu"});                 // one per process: starts StarPU
//   dos::Optimizer opt(rt, {{w_ptr, gw_ptr, n_w}, {b_ptr, gb_ptr, n_b}}, options);
//   for (...) { forward(); backward();                  // gradients written into gw_ptr, gb_ptr
//               /* finish all GPU work writing gradients */
//               dos::StepStats s = opt.step(); }       // params updated in place, 16-bit
//
// step() is synchronous: when it returns, the caller's parameters hold the new values and the
// state is back in host memory. The caller must not touch parameters or gradients during step().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <functional>
#include <string>
#include <vector>

#include "adam.h"
#include "phase_sim.h"
#include "resource_model.h"
#include "copy_rules.h"
#include "model_switches.h"
#include "step_stats.h"

namespace dos {

/// The error type of the runtime: bad input (the message names the value and what to do) or a
/// resource that could not be had (ResourceError).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An Error that is no fault of the input: StarPU could not start, or host memory for the
/// optimizer state could not be had (not enough available, an allocation refused). The C ABI
/// reports it as DOS_E_RUNTIME wherever it arises (DosError in the Python binding), where other
/// Errors at creation are DOS_E_INVALID (ValueError).
class ResourceError : public Error {
 public:
  using Error::Error;
};

/// An Error of a call made out of turn, leaving the optimizer as it was: a second thread's step()
/// while one runs, gradients_final outside an open phase or after it was finished, finish_step
/// without begin_step, wait_parameters before finish_step_async, a call that reads or replaces the
/// state while a phase is open. Its message names the calls to make instead. The C ABI reports it
/// as DOS_E_INVALID wherever it arises (ValueError in the Python binding), where other Errors of a
/// step are DOS_E_RUNTIME, and names the C calls in its hints (dos_optimizer_wait_step for
/// wait_step).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// Where the caller's parameter and gradient buffers live.
enum class MemoryKind { host, cuda };

/// One caller tensor: its parameters and gradients (same dtype, `numel` elements each, any shape:
/// only the element count matters). Pointers are host pointers or CUDA device pointers, per
/// OptimizerOptions::memory.
struct TensorView {
  void* param;
  void* grad;
  std::size_t numel;
};

class Plan;

/// Options of a Runtime.
/// policy: a registered plan ("cpu": every update on the CPU, "gpu": every update on the GPU,
///   "dos", "static:R", "greedy", ...: scheduler/plan.h), a StarPU policy registered with the
///   library (scheduler/policy.h), or the name of a StarPU built-in policy ("dmda", "eager", "lws",
///   ...); empty: $STARPU_SCHED if set, else "cpu".
///   An explicit policy wins over $STARPU_SCHED (a warning says so).
/// cpu_threads: OpenMP threads of the CPU Adam codelet; 0: $OMP_NUM_THREADS if set, else one per
///   CPU worker when unbound_reason is given (processes oversubscribing the cores), else every
///   core of the process's CPU set minus one per CUDA worker (the cores that drive the GPUs) and
///   minus caller_cores.
/// caller_cores: cores the automatic cpu_threads leaves to the caller's own threads (at least one
///   CPU thread is kept); 0 (default) leaves none. An update overlapped with the caller's backward
///   (Optimizer::begin_step) wants 1: the thread that launches backward's kernels otherwise shares
///   its core with a busy Adam thread and each launch waits (on the GPU machine a quarter of the 20B
///   preset's emulated backward, overlapped with the update, took 0.566 s with every core given to
///   CPU Adam and 0.451 s with one left to the caller: docs/measured-2026-12.md, "The update
///   overlapped with backward and the next forward: a quarter of the 20B preset").
/// cpu_workers: StarPU CPU workers; 0 (default): $STARPU_NCPU if set, else 1, one worker whose
///   codelets run an OpenMP team over cpu_threads cores. N > 1: N workers, the subgroups spread over
///   them, each worker's team cpu_threads / N threads (cpu_threads = N gives single-threaded
///   workers: the other way to use the cores, to compare with the first).
/// ncuda: CUDA workers to start; -1: one per visible device (StarPU's default); 0: none.
/// verbose: print what was chosen (policy, workers, threads) on stderr.
/// gpu_memory_limit: bytes StarPU may allocate on each GPU for the optimizer's data (its
/// STARPU_LIMIT_CUDA_MEM, set before StarPU starts, rounded up to MiB; it stays
/// set in the process's environment); 0: StarPU's default (90% of the device, or
/// what STARPU_LIMIT_CUDA_MEM already says). StarPU keeps freed device buffers cached for reuse
/// and StarPU 1.3 cannot hand them back on request (starpu_data_evict_from_node came in 1.4), so this
/// limit is what keeps the rest of the GPU for the model's forward and backward. Give it the sum of
/// gpu_memory_for_budgets over the optimizers plus kStarpuDeviceMargin.
struct RuntimeOptions {
  std::string policy;
  int cpu_threads = 0;
  int caller_cores = 0;
  int cpu_workers = 0;
  int ncuda = -1;
  bool verbose = true;
  std::size_t gpu_memory_limit = 0;
  /// This process's one GPU (a CUDA device index as cudaSetDevice takes it), or -1 for StarPU's
  /// default (every GPU, or ncuda of them). Data-parallel ranks on one node each take their own.
  int cuda_device = -1;
  /// Processes on this node that share its host memory and PCIe (the data-parallel ranks of the
  /// node, >= 1). Calibrated rates are cached per value: the rates measured while the other ranks
  /// stream their state at the same time are the ones that hold for this rank.
  int node_ranks = 1;
  /// Non-empty: the runtime binds none of its threads, runs one OpenMP thread per CPU worker unless
  /// cpu_threads or $OMP_NUM_THREADS says otherwise, and its binding line says why with these words
  /// (e.g. "3 ranks share 2 core(s)", as place_rank gives them when ranks oversubscribe a node's
  /// cores); empty: it binds them as DOS_BIND, OpenMP's own binding and the cores allow.
  std::string unbound_reason;
};

/// The policy a Runtime started with RuntimeOptions::policy `given` runs: `given` when not empty,
/// else $STARPU_SCHED when set and not empty, else "cpu". Reads the environment only (a Runtime
/// hides $STARPU_SCHED from starpu_init and puts it back before its constructor returns); the name
/// is not checked. Never throws but
/// std::bad_alloc.
std::string resolve_policy(const std::string& given);

/// Bytes of GPU memory StarPU may need for one optimizer's update phases and resident state under
/// its GPU budgets (OptimizerOptions::gpu_update_budget, gpu_resident_budget), for
/// RuntimeOptions::gpu_memory_limit. elements: the optimizer's parameters; subgroup_size: elements
/// per subgroup (>= 1); param_bytes, grad_bytes: bytes of one parameter element and of one gradient
/// element as the runtime stages them on the GPU (2 or 4: the dtype's size, or 4 for gradients sent
/// in fp32); speculative: streamed subgroups may be updated speculatively during backward (an
/// overlapped update with speculate_streamed and a speculation budget).
/// A streamed subgroup takes f = 12 + grad_bytes + param_bytes bytes per element at most (the fp32
/// master and two moments, and the gradient and parameters when staged: models/phase_sim.h's
/// subgroup_footprint, which the admission window charges), and a speculated one f + 16 +
/// param_bytes in all (also its shadow state, and its fp32 gradient and parameters staged beside
/// it, of which the window charges the shadow state only); each state buffer adds its padding, at
/// most 180 bytes per subgroup (state_bytes_for, codelets/kernels/adam.h). The update phase then
/// holds at most the larger of update_budget and one subgroup (runtime/admission.h admits one
/// subgroup whatever its size), twice the budget when speculative, and never more than the whole
/// optimizer; the resident state at most min(resident_budget, 12 elements and the padding). The
/// compact master's states are smaller (compact_state_bytes_for): the same figure bounds them.
/// Returns 0 when update_budget is 0 (no budget: no limit to ask for). Saturates at SIZE_MAX
/// instead of wrapping. Throws Error for subgroup_size 0, bytes other than 2 and 4, or a
/// resident_budget below -1 (as OptimizerOptions::gpu_resident_budget refuses it).
std::size_t gpu_memory_for_budgets(std::size_t elements, std::size_t subgroup_size, std::size_t param_bytes,
                                   std::size_t grad_bytes, std::size_t update_budget, std::int64_t resident_budget,
                                   bool speculative);
/// Bytes of GPU memory StarPU allocates for itself beside the optimizers' data (its per-worker
/// buffers), added once to the sum of gpu_memory_for_budgets: 64 MiB.
inline constexpr std::size_t kStarpuDeviceMargin = std::size_t(64) << 20;

/// The runtime's clock, seconds: StarPU's (starpu_timing_now(): StarPU 1.3.10 reads CLOCK_MONOTONIC,
/// counted from StarPU's start while a Runtime runs), which
/// StepStats::started_at and the task clock read. Another clock of the process relates to it by
/// reading both at once.
double clock_seconds();

/// The process's StarPU instance (one at a time). Throws Error for an unknown policy, a Runtime that
/// already exists in this process, cpu_threads < 0 or above 4 times the machine's cores (above
/// the cores this process may use it warns when verbose), cpu_workers < 0 or more CPU workers
/// asked for than StarPU starts (by $STARPU_NCPU, else $STARPU_NCPUS, else cpu_workers, as StarPU
/// reads them: StarPU 1.3 starts at most one per core it counts), ncuda < -1 or above the
/// GPUs StarPU sees, node_ranks < 1, $STARPU_NCPU, $STARPU_NCPUS or
/// $STARPU_NCUDA set to something other than a whole number >= 0 (StarPU would abort), a plan that needs a CUDA worker
/// ("gpu") without one, or StarPU's heteroprio with a CUDA worker; ResourceError when StarPU cannot
/// start.
class Runtime {
 public:
  explicit Runtime(const RuntimeOptions& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The policy name as StarPU reports it running ("dos-placement" for the plans, "dmda", ...).
  std::string running_policy() const;
  /// The policy as requested ("cpu", "gpu", "dmda", ...).
  const std::string& policy() const { return policy_; }
  /// True for the plans that need the model's rates (PlanNeeds::rates: dos, static:R, greedy).
  bool model_policy() const;
  /// The plan --policy named (scheduler/plan.h), or null under a StarPU policy. Owned by the Runtime.
  const Plan* plan() const;
  /// StarPU's CPU workers (each runs one CPU task at a time with a team of cpu_threads()).
  unsigned cpu_workers() const;
  /// StarPU's CUDA workers (0 without a GPU, or with ncuda 0).
  unsigned cuda_workers() const;
  /// OpenMP threads of each CPU worker's team.
  int cpu_threads() const { return cpu_threads_; }
  /// RuntimeOptions::node_ranks as given.
  int node_ranks() const { return node_ranks_; }
  /// Cores a CPU worker thread may run on (the smallest over CPU workers), as its affinity says.
  int worker_cores() const { return worker_cores_; }
  /// How the threads are bound to cores, in words ("CUDA driver(s) on core 0, CPU team(s) on cores
  /// 1-15", or "none (...)" with the reason); see codelets/cpu_team.h.
  const std::string& binding() const { return binding_; }
  /// The core (OS processor number) the first CUDA worker's driver thread is bound to, or -1 when
  /// there is no CUDA worker or the threads are not bound (binding() says why).
  int cuda_driver_core() const { return cuda_driver_core_; }

  struct Impl;

 private:
  friend class Optimizer;  // reads the policy the runtime chose
  Impl& impl() const { return *impl_; }
  std::string policy_;
  int cpu_threads_ = 1;
  int node_ranks_ = 1;
  int worker_cores_ = 0;
  int cuda_driver_core_ = -1;
  int omp_team_ = 0;
  std::string binding_;
  std::unique_ptr<Impl> impl_;
};

/// Options of an Optimizer.
/// adam: the hyper-parameters (torch.optim.Adam if adam.decoupled is false, AdamW if true).
/// subgroup_size: elements per subgroup (>= 1); the last subgroup holds the remainder.
/// dtype: element type of the caller's parameters and gradients.
/// memory: where the caller's buffers live.
/// rates: the machine's rates for the `dos` policy's model (params/s and bytes/s, Rates); left at
///   their defaults (the six rates 0, link_share 1): measured at start-up by calibrate_rates
///   (cached per host and configuration), unless recalibrate is set, which forces a new
///   measurement. Given, they must be given whole: Error when some are and some are not (each > 0
///   and finite), or when they break the model's bounds (rate_bounds_error).
/// calibrated_rates: with rates read from a rates file (load_rates), that file's calibrated rates
///   (load_rates' *calibrated): the optimizer then starts from the file as from the rates cache it
///   reads itself (a link_share equal to the calibration's is not counted as a measure, so its first
///   phases that stream take their own whole; U_c's first measure likewise: initial_link_share_record,
///   Refined::u_c_measured). Left at its default (zeros) with rates given: each rate given counts as
///   a measure. Error when given without rates, or incomplete, or beyond the model's bounds.
/// verbose: print on stderr, lines starting "[dos]", where the model's rates came from (the
///   calibration: its CPU Adam rate per repetition, its link_share when measured, the calibrated
///   rates; or the rates cache file read), a warning when the rates cache cannot be read or written,
///   and a note when the GPU update budget is below one streamed subgroup's footprint (every update
///   not resident then runs on the CPU). Default true; false prints none of these (errors are still
///   thrown).
/// gpu_resident_budget: bytes of optimizer state the GPU may keep between iterations (12 per
///   parameter, each of a subgroup's three state slices padded to 16 elements; about 10.125 with
///   compact_master, compact_state_bytes_for); -1: not given.
///   `dos` (and `gpu`) keep the last subgroups that fit resident (none when not given) and plan the
///   others; `static:R` must fit its resident share in it when given (Error otherwise, naming the
///   smallest R that fits).
/// gpu_update_budget: bytes the update phase may hold on the GPU at once (state of streamed
///   subgroups, 12 B/param with the same padding; the gradient and parameter staging of the others
///   where it is on the GPU: not where the runtime copies between the caller's GPU tensors and host
///   staging itself, runtime_downloads_grads, runtime_uploads_params); 0: no limit. Subgroups
///   enter the phase only while their footprint fits; a budget below one streamed subgroup's
///   footprint plans every non-resident update on the CPU; below one CPU subgroup's staging is an
///   Error.
/// stream_lookahead: streamed subgroups whose state is prefetched to the GPU ahead of the one
///   being submitted (default 3); 0: none, StarPU
///   prefetches a task's inputs when the task is pushed, as for every other task. finish_step
///   submits the whole phase in one go, so when the update budget holds every streamed state, all
///   are asked for by the submission's end whatever the value above 0 (on the GPU machine 3, 8 and
///   26 ran the 20B quarter at 40 GB alike: docs/measured-2026-12.md, "At 360e7b7"); a tighter budget stops
///   the submission at the admission window, and then the value counts.
/// native_grads: the gradients of subgroups updated away from the caller's buffers cross PCIe in
///   the parameters' dtype (2 B/param for bf16/fp16) and the Adam kernel widens them; false: they
///   are converted to fp32 first (4 B/param). Same results either way (the widening is exact).
///   Default true: on the GPU machine the 20B quarter's dos update phase took 0.948 s with it and
///   1.057 s with fp32 gradients, in one measurement (docs/measured-2026-11-30.md, "Side by side: a
///   quarter of the 20B preset").
/// urgent_writeback: push a CPU-updated subgroup's parameter write-back task where the worker
///   running it pops next, instead of behind the tasks already queued (TaskHint::urgent). Only
///   where that write-back is a task: the caller's buffers in host memory, or on the GPU with
///   runtime_uploads_params() false (otherwise the runtime copies the parameters itself and there is
///   no such task). Measured slower on the GPU machine (README, "dos-train", --urgent-writeback, and
///   the runs kept in docs/compare-20b/urgent/: the urgent task holds the CUDA worker while its input
///   waits on StarPU's host-to-device stream behind the lookahead's prefetches), hence off by
///   default. Same results either way.
/// eager_writeback: write each streamed subgroup's state back as soon as its update ends (an
///   asynchronous read acquire on main RAM, then starpu_data_wont_use); false: all at the end of
///   the phase. A GPU update budget needs eager write-back (Error otherwise).
/// submit_order: SubmitOrder (models/phase_sim.h); default plan. cpu_first takes the CPU subgroups'
///   gradient staging out from behind the streamed Adams in the CUDA worker's first-in first-out
///   queue; on the GPU machine it was no faster (the phase is bound by host memory shared by CPU Adam
///   and DMA, not by that queue; docs/measured-2026-12.md, "Side by side: a quarter of the 20B
///   preset"). The results are the same bits either way.
/// speculation_budget: host bytes for the shadow state of speculative updates (12 bytes per
///   parameter of a subgroup updated speculatively and its slices' padding, state_bytes_for,
///   allocated and pinned at its first speculative update and kept); -1 (default): half of the
///   host memory available (MemAvailable, or less where the process's cgroup limit leaves less)
///   when the first speculative update comes; 0: no speculative update (Optimizer::gradients_final
///   only records, the whole update runs in finish_step). A subgroup beyond the budget waits for
///   finish_step.
/// speculate_streamed: speculative updates of the subgroups the plan streams too, on the GPU (their
///   state crosses PCIe while the caller's backward runs, the new state comes back into the host
///   shadow; GPU memory for the old and new state within the update budget); true (default);
///   false: only the CPU's subgroups are updated speculatively. The same bits either way. The GPU
///   side needs StarPU's device buffers from CUDA's stream-ordered allocator (the StarPU that
///   scripts/setup.sh builds): with cudaFree, each buffer StarPU frees under the update budget waits
///   for the whole GPU, backward's kernels included, and the 20B quarter's emulated iteration took
///   1.61 s instead of 1.26 s (docs/measured-2026-12.md, "The update overlapped with backward and
///   the next forward: a quarter of the 20B preset"). With a site's own StarPU, measure both.
/// tail_subgroups: late binding of the plan's tail (models/tail_binding.h). With a plan that both
///   streams and updates on the CPU, the last tail_subgroups subgroups of the plan's CPU and streamed
///   ones (index order) are left out of the submission, and a thread of
///   the phase gives each, in index order, to the side projected to end first when either side's
///   work ahead falls to its lead (the CPU one update, the stream two: its next state goes up
///   behind the one already on its way), from the pace each side has kept in this phase. 0
///   (default): the plan as made. Only in phases run by step() (not in one opened by begin_step,
///   nor in step_async()'s), with a CUDA worker and a plan made with the model's rates (dos,
///   static:R, greedy) that has CPU and streamed subgroups before the tail (their pace is what the
///   binder learns from), once a phase of the optimizer (not skipped; overlapped and asynchronous ones
///   count) whose plan streams has ended (StarPU allocates the streamed state's GPU buffers in the
///   first, which slows the stream unforeseeably); otherwise
///   nothing is bound (no error). Results are the same bits either way;
///   StepStats::tail_bound and tail_moved say what it did.
/// compact_master: keep each master parameter as its low 16 bits and one rounding bit beside the
///   caller's bf16 parameter (the compact master, codelets/kernels/compact_master.h: M = ((P - r) << 16)
///   | lo for every finite M), so that a streamed subgroup's state is 10.125 bytes per parameter each
///   way instead of 12, and CPU Adam moves 26.25 bytes of host memory per parameter instead of 28; a
///   CPU-updated subgroup brings its P down (2 bytes per parameter) beside its gradient, unless its
///   last update ran on the CPU under a plan and left P in the host staging (Execution::
///   params_on_host). The same bits as the full master in every parameter and every state read back
///   (read_master, with_host_state, checkpoints: the master is rebuilt from the caller's parameters,
///   which must then hold the last step's values; a load splits it and writes the parameters): the
///   caller writes its parameters only through the optimizer (write_master_range, load_state), never
///   between steps by itself. bf16 parameters only (Error
///   otherwise). The speculative updates of an overlapped step (gradients_final) run as the full
///   master's, by adam_compact_into_cl (on the CPU, or on the GPU for a streamed subgroup with
///   speculate_streamed): the new state into the shadow, the new P into the staging, the caller's
///   parameters left as they were until the verdict keeps the update (the same bits). The
///   host buffer keeps its 12 bytes per parameter; a streamed
///   or resident subgroup's GPU footprint is its compact state (the update and resident budgets
///   count that). Reading or writing the
///   masters costs a copy of the caller's parameters per subgroup (none for a read of a subgroup
///   whose P the host staging keeps; with_host_state and load_state:
///   4 more bytes of host memory per parameter), and those calls are not to be made from two threads
///   at once (they share the subgroup's staging). Default false.
struct OptimizerOptions {
  AdamHyper adam;
  std::size_t subgroup_size = 100000000;
  DType dtype = DType::bf16;
  MemoryKind memory = MemoryKind::host;
  Rates rates{};
  Rates calibrated_rates{};
  bool recalibrate = false;
  bool verbose = true;
  std::int64_t gpu_resident_budget = -1;
  std::size_t gpu_update_budget = 0;
  unsigned stream_lookahead = 3;
  bool eager_writeback = true;
  bool native_grads = true;
  bool urgent_writeback = false;
  SubmitOrder submit_order = SubmitOrder::plan;
  std::int64_t speculation_budget = -1;
  bool speculate_streamed = true;
  std::size_t tail_subgroups = 0;
  bool compact_master = false;
};

/// What the caller found once every gradient of a step was final (Optimizer::finish_step).
/// keep: the gradients are as they were when declared final: the speculative updates are kept.
/// changed: the caller changed gradients in place after declaring them final (global-norm
///   clipping, loss-scale unscaling): every speculative update is redone from the state before the
///   step, with the gradients as they are now.
/// skip: no update this step (a gradient holds an inf or NaN): the speculative results are dropped,
///   the step counts and the parameters stay as before the step.
enum class StepVerdict { keep, changed, skip };

/// Forces the plan of a plan with the model's rates (dos, ...), for sweeps: fraction: round(value * n) subgroups streamed,
/// spread evenly (value in [0, 1]); stride: the paper's stride k = value (an integer >= 1);
/// none: the model's choice.
struct PlanOverride {
  enum Kind { none, fraction, stride } kind = none;
  double value = 0;
};

/// Host bytes the runtime needs per parameter, at most: 12 (fp32 master, exp_avg, exp_avg_sq) + 4
/// (gradient staging: fp32, or 2 with 16-bit staging) + the parameter dtype's size (parameter
/// staging).
std::size_t host_bytes_per_param(DType dtype);
/// The same for OptimizerOptions::native_grads as given: the gradient staging in the parameters'
/// dtype (native_grads, its size) or fp32 (4 bytes): 12 + that + the dtype's size, bytes per
/// parameter (without the pages' rounding of each subgroup's buffers).
std::size_t host_bytes_per_param(DType dtype, bool native_grads);

/// Throws ResourceError (an Error) when `bytes` exceed the host memory available now: MemAvailable
/// of /proc/meminfo, or less where the process's memory cgroups leave less (Slurm's --mem, a
/// container's limit: v1 and v2, the least over the process's cgroup and its ancestors of limit -
/// (usage - file cache - v2's reclaimable slab)). The message names `what`, both figures in GB, the
/// cgroup's folder and limit when the cgroup is the tighter, and what to do. Does nothing when
/// neither can be read (no /proc, as off Linux): the allocation then decides.
void check_host_memory(std::size_t bytes, const std::string& what);

/// Adam/AdamW over the caller's tensors, as StarPU task graphs (one per step()).
/// Two Optimizers over the same parameters each take their masters for the parameters' own values
/// and write them back unseen by the other: not supported (the Python binding handles a parameter
/// given to two optimizers; a C++ caller gives each parameter to one Optimizer).
/// Throws Error on bad input: no tensor or 0 elements in all, a null pointer, two tensors whose
/// parameters (or whose gradients) share memory (a gradient may point at its own parameter until
/// set_gradients gives the real one), subgroup_size 0,
/// hyper-parameters outside their ranges (lr < 0, eps < 0, beta outside [0, 1),
/// weight_decay < 0), CUDA memory without a CUDA worker, or more state than host memory holds;
/// and, with a CUDA worker, GPU budgets that cannot work (OptimizerOptions): a resident budget
/// below -1, an update budget without eager write-back or below one CPU subgroup's staging,
/// static:R keeping more state resident than the resident budget, or policy gpu with an update
/// budget below one streamed subgroup. Without a CUDA worker the budgets have no effect. Under a
/// model policy (dos, static:R), also for a bad DOS_CALIBRATE_LINK_SHARE, DOS_CALIBRATION_REPS or
/// DOS_CALIBRATION_SUBGROUPS (calibrate_rates), with or without a CUDA worker.
class Optimizer {
 public:
  Optimizer(Runtime& runtime, const std::vector<TensorView>& tensors, const OptimizerOptions& options);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Runs one update phase: every subgroup's step count += 1, Adam/AdamW on the policy's side,
  /// the new parameters written into the caller's buffers (rounded to nearest even).
  /// The gradients are not checked, as torch.optim.AdamW does not check them: a NaN or inf
  /// gradient makes its element's master and moments NaN or inf for good. A caller that may see
  /// them checks first (dos-train's --max-grad-norm, the binding's skip_nonfinite) and skips the
  /// step (begin_step, then finish_step with StepVerdict::skip: nothing changes).
  /// One thread at a time: step(), step_async() and begin_step() from a second thread while one
  /// of them runs are refused (UsageError, nothing changed); other concurrent calls are not safe.
  /// Before the phase, step(), step_async() and begin_step() free the calling thread's idle OpenMP
  /// threads of this library's libgomp (release_caller_openmp_threads, codelets/cpu_team.h: with
  /// them, libgomp lets the CPU workers' teams sleep between kernels); the caller's next parallel
  /// region starts new ones (thread-local data and affinity set by hand start afresh). Nothing is
  /// freed when called inside a parallel region, and the gain is lost while the caller runs
  /// parallel regions during the phase (an overlapped phase beside a backward on the CPU).
  /// Throws Error when a step is open (begin_step without finish_step) or a previous step failed.
  StepStats step();

  /// The update overlapped with the caller's backward: begin_step() opens a phase (its plan is
  /// made then); gradients_final(begin, end) says that the gradients of flat elements [begin, end)
  /// will not change any more, and every subgroup whose gradient is then complete and that the
  /// plan puts on the CPU (every subgroup under a StarPU policy) is updated at once, on CPU workers,
  /// speculatively (each one the plan streams too, on the GPU, with
  /// OptimizerOptions::speculate_streamed): the new state goes to a shadow copy (OptimizerOptions::speculation_budget), the
  /// state and the caller's parameters stay as they were. finish_step(verdict) says every gradient
  /// is final and what the caller did with them (StepVerdict): keep commits the speculative
  /// updates (the shadow becomes the state, the parameters are written), changed redoes them from
  /// the state before the step, skip drops them; then the rest of the phase runs as step() does.
  /// The parameters and state after finish_step are the same bits as step() after the same
  /// gradients (skip: as if no step ran), whatever was speculated. After a step that ended with
  /// StepVerdict::changed, the next step speculates nothing (its updates would most likely be
  /// redone as well: clipping tends to stay active); the one after tries again.
  /// The caller must not change gradients declared final before finish_step (except as
  /// StepVerdict::changed says), nor read or write the parameters between begin_step and the end
  /// of finish_step. Throws Error: begin_step when a step is already open or a previous step
  /// failed; gradients_final outside an open step (also while a phase left running by
  /// finish_step_async or step_async runs), for a range beyond num_params(), or for
  /// elements declared final twice in one step; finish_step without begin_step. gradients_final may
  /// be called from several threads at once (each layer's backward on its own), not concurrently
  /// with begin_step or finish_step. Other methods
  /// that read or replace the state or the hyper-parameters throw Error while a step is open.
  void begin_step();
  void gradients_final(std::size_t begin, std::size_t end);
  StepStats finish_step(StepVerdict verdict = StepVerdict::keep);
  /// The update overlapped with the caller's next forward too: finish_step_async(verdict) does
  /// what finish_step does but returns once every task of the phase is submitted, without waiting
  /// for them (its time counts in StepStats::exposed_seconds). wait_parameters(begin, end) then
  /// blocks until the caller's parameters of flat elements [begin, end) hold the step's result
  /// (every subgroup meeting the range has written its parameters; immediately when no phase
  /// runs), so that the forward of a layer waits only for that layer's parameters; the subgroups'
  /// parameters are written in the plan's submission order, which is the flat order but for the
  /// CPU's subgroups first under SubmitOrder::cpu_first. wait_step() waits for the rest of the
  /// phase (the state back in host memory) and returns its StepStats: exposed_seconds is the time
  /// spent in the three calls; seconds runs from begin_step to the phase's last write-back.
  /// The bits are those of finish_step. Until wait_step returns the caller may read the parameters
  /// of ranges wait_parameters returned for and nothing else; begin_step, step(), and every method
  /// that reads or replaces the state throw Error ("call wait_step first"). Throws Error:
  /// finish_step_async as finish_step; wait_parameters for a range beyond num_params() or while a
  /// step is open and not finished, and once one of the runtime's own copies between the GPU and
  /// host memory has failed (runtime_uploads_params, runtime_downloads_grads; the parameters may
  /// then hold a mix of old and new values, and wait_step fails the step); wait_step without
  /// finish_step_async.
  void finish_step_async(StepVerdict verdict = StepVerdict::keep);
  /// step() without waiting: the whole phase submitted (StepStats::overlapped stays false), then
  /// wait_parameters and wait_step as after finish_step_async. Throws as step().
  void step_async();
  void wait_parameters(std::size_t begin, std::size_t end);
  StepStats wait_step();
  /// Blocks until every task of a phase left running by finish_step_async or step_async has ended
  /// (parameters written, state back in host memory), without closing the phase: wait_step still
  /// closes it, then without waiting. Returns at once when no phase runs. May be called from
  /// another thread than the caller's while the caller is in wait_parameters or computes, but
  /// wait_step must not start before it returns (the C ABI uses it to pause StarPU's workers as
  /// soon as the phase's work is done). Throws nothing.
  void wait_step_work();
  /// Whether a step is open (begin_step called, finish_step or wait_step not yet).
  bool step_open() const;
  /// Whether a step was finished by finish_step_async and wait_step has not yet been called.
  bool step_running() const;

  /// Elements the optimizer updates: the sum of the tensors' numel given at construction.
  std::size_t num_params() const;
  /// The dtype of the caller's parameters and gradients (OptimizerOptions::dtype).
  DType dtype() const;
  /// Subgroups the parameters were cut into: ceil(num_params() / OptimizerOptions::subgroup_size).
  std::size_t num_subgroups() const;
  /// Size in elements of subgroup i (i < num_subgroups()).
  std::size_t subgroup_size(std::size_t i) const;
  /// Step count of subgroup i (0 before the first step()).
  std::int64_t step_count(std::size_t i) const;
  /// Copies the fp32 master parameters (num_params() floats, in the flat order of the caller's
  /// tensors) into `out`, host memory. Throws Error while an update phase is open (begin_step
  /// without finish_step: "call finish_step first") or still running (finish_step_async without
  /// wait_step: "call wait_step first").
  void read_master(float* out) const;
  /// Same for exp_avg and exp_avg_sq (the same errors).
  void read_exp_avg(float* out) const;
  void read_exp_avg_sq(float* out) const;

  /// One subgroup's optimizer state in host memory: `size` fp32 values of each (read-only).
  struct HostState {
    const float* master;
    const float* exp_avg;
    const float* exp_avg_sq;
    std::size_t size;
  };
  /// Calls fn with every subgroup's state in host memory, in subgroup order, without copying it
  /// (what a checkpoint writer streams to its file: no second copy of 12 bytes per parameter). The
  /// host copies are brought up to date and held for reading while fn runs (no step may run then).
  /// With OptimizerOptions::compact_master the masters are rebuilt from the caller's parameters into
  /// buffers of their own first (4 bytes per parameter, all subgroups at once): ResourceError,
  /// without calling fn, when host memory lacks them. An exception from fn propagates, after the
  /// state is released. Throws Error, without calling fn, while an update phase is open or still
  /// running (as read_master).
  void with_host_state(const std::function<void(const std::vector<HostState>&)>& fn) const;

  /// Step count of every subgroup, in subgroup order.
  std::vector<std::int64_t> step_counts() const;
  /// Points the optimizer at other gradient buffers from the next update phase on: grads[i] is
  /// tensor i's gradient now (one pointer per tensor of the construction, in its order; the same
  /// dtype, element count and memory kind as then). For a caller whose framework allocates the
  /// gradients anew every step (PyTorch after zero_grad(set_to_none=True)): it hands them over
  /// instead of copying them into fixed buffers, so that they need not live between steps. Throws
  /// Error, nothing changed, when grads has not one pointer
  /// per tensor, a tensor with elements gets a null pointer, two tensors' gradients share memory
  /// (as the constructor refuses), or an update phase is open or still running (finish_step_async
  /// without wait_step).
  void set_gradients(const std::vector<void*>& grads);
  /// Copies the fp32 master parameters of flat elements [begin, end) (the flat order of the
  /// tensors given at construction) into out (end - begin floats, host memory).
  /// Throws Error when the range is not inside num_params() or an update phase is open or running.
  void read_master_range(std::size_t begin, std::size_t end, float* out) const;
  /// Replaces the fp32 master parameters of flat elements [begin, end) by values (end - begin
  /// floats, host memory); the moments, the step counts and the caller's parameters stay (with
  /// OptimizerOptions::compact_master the caller's parameters of the range are written with the
  /// values' rounding, which is where that form keeps the masters' high halves: the same bits as the
  /// full form from the next step on). For a caller whose parameters were written outside the
  /// optimizer: their masters follow without a whole load_state. Throws Error, nothing changed, when
  /// the range is not inside num_params(), a value is not finite (NaN or inf, as load_state refuses
  /// them; values null for a non-empty range too) or an update phase is open or running.
  void write_master_range(std::size_t begin, std::size_t end, const float* values);
  /// Replaces the whole optimizer state (a checkpoint being resumed): master, exp_avg, exp_avg_sq
  /// (num_params() floats each, host memory, flat order) and each subgroup's step count; then
  /// writes the master parameters, rounded to the caller's dtype, into the caller's parameter
  /// buffers, so that training continues exactly where the checkpoint was taken.
  /// Throws Error, changing nothing, when steps has not num_subgroups() entries, a step count is
  /// negative or above 2^53, a value is not finite (or exp_avg_sq negative), or a pointer is null.
  void load_state(const float* master, const float* exp_avg, const float* exp_avg_sq,
                  const std::vector<std::int64_t>& steps);
  /// One subgroup's optimizer state in host memory, writable: `size` fp32 values of each.
  struct HostStateOut {
    float* master;
    float* exp_avg;
    float* exp_avg_sq;
    std::size_t size;
  };
  /// load_state without the flat arrays: `fill` is called with every subgroup's host buffers (held
  /// for writing; device copies invalidated) and must write all of them; then the step counts are
  /// set and the caller's parameters written, as load_state does. A checkpoint reader fills them
  /// from its files directly (no second copy of 12 bytes per parameter).
  /// Throws Error, changing nothing, when steps has not num_subgroups() entries or a step count is
  /// negative or above 2^53. If fill throws, the exception propagates and the state is partly replaced: the
  /// optimizer is then marked broken (step() throws Error saying so) until a later load replaces the
  /// whole state (a step that failed keeps it broken: create a new Optimizer).
  void load_state_in_place(const std::vector<std::int64_t>& steps,
                           const std::function<void(const std::vector<HostStateOut>&)>& fill);

  /// Replaces the hyper-parameters from the next step() on (a learning-rate schedule; the binding
  /// passes torch's param_groups here). Throws Error, changing nothing, when validate_adam_hyper does.
  void set_hyper(const AdamHyper& h);
  /// The hyper-parameters the next step() uses.
  const AdamHyper& hyper() const;

  /// Forces (or, with PlanOverride::none, releases) the plan of a plan with the model's rates (dos,
  /// static:R, greedy: PlanNeeds::rates) from the next step(). Throws Error for another policy or a
  /// value out of range.
  void set_plan_override(const PlanOverride& o);
  /// From the next step() on, records every task of the phase and samples the bus counters
  /// (StepStats::timeline, StepStats::bus); costs a sampling thread while a phase runs.
  void set_timeline(bool on);
  /// The rates the `dos` model uses now (calibrated, then refined after each step).
  const Rates& rates() const;
  /// The rates as calibrated at start-up (or given in OptimizerOptions::rates), before any
  /// refinement: the lower bound (StepStats::lower_bound_seconds) takes each rate at the better of
  /// these and rates() (models/resource_model.h, lower_bound with two rate sets).
  const Rates& calibrated_rates() const;
  /// How step() carries a plan out, for the phase simulation (models/phase_sim.h): the submission
  /// order, the lookahead and the update budget (0 and 0 without a CUDA worker), and which
  /// subgroups' state has no valid copy on the GPU now (Execution::state_off_gpu, from StarPU;
  /// during a phase, as it was when the phase began; empty without a CUDA worker). From the thread
  /// that calls step() (or begin_step/finish_step), not beside those calls.
  Execution execution() const;
  /// The workload the model sees (subgroup sizes, where the caller's buffers live).
  const Workload& workload() const;
  /// The plan the next step() would carry out with the rates as they are now (StepStats::plan);
  /// empty under a StarPU policy. Throws Error (naming the plan) when the plan cannot
  /// decide. From the thread that calls step() (or begin_step/finish_step), not beside those
  /// calls: it takes the decision made ahead for the next phase (PlanNeeds::decided_ahead),
  /// waiting for it when it is still being made, or decides and keeps the decision for that phase.
  std::vector<PlanSide> next_plan() const;

  struct Impl;

 private:
  // measures link_share on its scratch optimizer's phases, from the rates it has just calibrated
  friend Rates calibrate_rates(Runtime&, std::size_t, DType, MemoryKind, bool, bool, Rates*, bool);
  std::unique_ptr<Impl> impl_;
};

/// Validates Adam hyper-parameters as torch.optim.Adam does; throws Error naming the bad value. Also
/// refuses lr, eps, weight_decay, lr x weight_decay or the first step's step size lr / (1 - beta1)
/// beyond fp32's range (above 3.4e38), which the fp32 kernels would turn into inf or NaN
/// parameters at the first step, and an eps > 0 that rounds to 0 in fp32 (about 7.1e-46 and below: a
/// zero gradient's update would be 0 / 0).
void validate_adam_hyper(const AdamHyper& h);

/// Measures the rates of the resource model on this machine: U_c from an all-CPU phase of the real
/// codelets and task graph on scratch subgroups of `subgroup_elems` elements (the caller's dtype and
/// memory kind; 8 of them unless DOS_CALIBRATION_SUBGROUPS gives a multiple of 4 from 8 to 32),
/// U_c_dma from a phase where the CPU updates 1/4 of them while 3/4 stream (2 and 6 at the default;
/// each the median of the repetitions of its phase, 3 unless DOS_CALIBRATION_REPS gives 1 to 99; U_c_dma then
/// fitted with the phase simulation; the phases under a GPU update budget of what StarPU may still
/// allocate less kStarpuDeviceMargin, at least one scratch subgroup), U_g and D_c
/// from the CUDA kernels timed with events, B_h2d and B_d2h from copies both ways at once
/// (cudaMemcpyAsync on two streams; StarPU's one-way bus calibration in a build without CUDA
/// kernels), and link_share by the rule DOS_CALIBRATE_LINK_SHARE picks (read once): by default
/// (unset, empty or "estimate") estimated_link_share of the rates above, U_c_dma / U_c within
/// [1/16, 1] (models/resource_model.h gives the GPU machine's evidence); "placeholder": 1
/// (kUnmeasuredLinkShare); "measure" (or "1"): measured last, from 5 phases of the spread plan whose
/// simulated streams run longest beside CPU Adam, each refined from the rates above as an
/// optimizer's first phases are (models/refinement.h; the median of those that sized a measure,
/// capped at U_c / U_c_dma; the placeholder when fewer than 3 did); "dma": measured last, from the
/// links' rate (full-duplex copies in a loop, codelets/dma_loop.h) beside 6 phases with every
/// scratch subgroup on the CPU against alone, by link_share_from_dma (the estimate, said so on
/// standard error when verbose, when that measure cannot be made). link_share is then refined
/// online by the Optimizer from what each phase's resources were busy doing. An optimizer does not
/// count the calibration's link_share as a measure: its first phases that stream replace it
/// (initial_link_share_record). Needs a model policy (dos, static:R) and a CUDA worker; takes a few seconds (pinning the
/// scratch state: 16 bytes of pinned host memory per element in bf16 or fp16, so about four times as
/// long at 32 scratch subgroups as at 8). The result is cached in $DOS_CACHE_DIR (default $XDG_CACHE_HOME/dos-runtime,
/// else ~/.cache/dos-runtime), one file per host and configuration, with the refined rates beside
/// the calibrated ones; `force` measures again. A cache file that is not one (what load_rates
/// refuses, but for implausible_rate's range: corrupt, edited, rates beyond the model's bounds) is
/// measured again and replaced, with a warning on stderr giving the reason whatever `verbose` says;
/// a cache that cannot be written is said so too. Returns the rates to plan with (refined ones when
/// the cache has them); *calibrated (when not null) gets the calibration's own, which the lower
/// bound uses so that it does not move from run to run.
/// compact_master: the scratch optimizer keeps its masters in compact form
/// (OptimizerOptions::compact_master), so that U_c and U_c_dma are its CPU Adam's; its own cache file.
/// Throws Error when there is no CUDA worker, the policy is not a model policy,
/// DOS_CALIBRATE_LINK_SHARE names no rule, DOS_CALIBRATION_REPS is not a whole number from 1 to 99
/// or DOS_CALIBRATION_SUBGROUPS not a multiple of 4 from 8 to 32 (both read only where a
/// calibration runs), subgroup_elems is 0, or the scratch's parameter and gradient buffers cannot
/// be allocated; ResourceError when host memory for the scratch's optimizer state cannot be had.
/// Both scratch errors begin with what the calibration asked for (its subgroups and their
/// elements, and DOS_CALIBRATION_SUBGROUPS where it set them).
Rates calibrate_rates(Runtime& runtime, std::size_t subgroup_elems, DType dtype, MemoryKind memory, bool force,
                      bool verbose, Rates* calibrated = nullptr, bool compact_master = false);

/// The cache file of calibrate_rates for this runtime and configuration: rates-KEY.json in the cache
/// folder, KEY naming the host, the workers, the dtype, the memory kind, the subgroup size, the
/// node's ranks when more than one, and the calibration's link_share rule (DOS_CALIBRATE_LINK_SHARE,
/// calibrate_rates): "-link_share_estimate" for the default estimate, "-link_share" for measure (or
/// 1), "-link_share_dma" for dma, nothing for placeholder (the name of every rates file written before the estimate, whose
/// calibrations gave the placeholder), so that a calibration made under one rule is read only under
/// it; then "-scratchN" where DOS_CALIBRATION_SUBGROUPS gives N other than the default 8 (so that a
/// calibration on more scratch subgroups is read only under the same N); "-compact" last for a
/// calibration of the compact master. Throws Error when DOS_CALIBRATE_LINK_SHARE names no rule or
/// DOS_CALIBRATION_SUBGROUPS is not a multiple of 4 from 8 to 32.
std::string rates_cache_path(const Runtime& runtime, std::size_t subgroup_elems, DType dtype, MemoryKind memory,
                             bool compact_master = false);

/// Reads a rates file in the format of calibrate_rates' cache: a JSON object with U_c, U_c_dma, U_g,
/// D_c (params/s), B_h2d and B_d2h (bytes/s), the rates to plan with, and optionally the same under
/// "calibrated" (the calibration's own). Returns the rates to plan with; *calibrated (when not null)
/// gets the "calibrated" ones, or the same rates when the file has none.
/// Throws Error naming the path (and the key, where one is at fault) when it cannot be read, is not
/// a JSON object, gives a key twice in one object, has a key other than those (and link_share;
/// keys are case-sensitive), a value that is not a number, a rate not > 0, a rate outside [1e6,
/// 1e16] (implausible_rate: other units, 4.1 for 4.1e9), or rates beyond the model's bounds
/// (rate_bounds_error: link_share above U_c / U_c_dma or below 1/16, U_c_dma above U_c).
Rates load_rates(const std::string& path, Rates* calibrated = nullptr);

/// Writes `rates` (the ones to plan with) and `calibrated` (the calibration's own) to the cache file
/// `path` atomically (creating its folder). Throws std::runtime_error naming the path when it
/// cannot be written.
void save_rates(const std::string& path, const Rates& rates, const Rates& calibrated);

}  // namespace dos
