// The runtime core: StarPU's lifetime, the optimizer state, and one update phase's task graph.
#include <omp.h>
#include <starpu.h>
#include <starpu_profiling.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "../codelets/codelets.h"
#include "../codelets/cpu_team.h"
#include "../codelets/task_clock.h"
#include "../scheduler/policy.h"
#include "admission.h"
#include "dos.h"
#include "partition.h"

namespace dos {

// ---------------------------------------------------------------------------------------------
// Runtime

struct Runtime::Impl {
  PolicyChoice choice;
};

namespace {
// StarPU runs once per process: one live Runtime at a time. An Optimizer needs StarPU until it is
// destroyed: a Runtime destroyed first defers starpu_shutdown to the last Optimizer.
int g_live_runtimes = 0;
int g_live_optimizers = 0;
bool g_shutdown_deferred = false;
}  // namespace

namespace {

/// Runs on each CPU worker: sets the worker thread's OpenMP team size and the cores its team is
/// bound to (worker w takes cores[w * threads, (w + 1) * threads) of `team_cores`, when binding),
/// binds the team, and records the cores the team may run on and the team size OpenMP uses.
struct WorkerSetup {
  int threads;
  std::vector<int> team_cores;  // empty: leave the teams unbound
  std::atomic<int> next{0};
  std::atomic<int> min_cores{1 << 30};
  std::atomic<int> team{0};
};
void setup_cpu_worker(void* arg) {
  auto* w = static_cast<WorkerSetup*>(arg);
  omp_set_num_threads(w->threads);
  const int index = w->next.fetch_add(1);
  int cores = int(allowed_cores().size());
  if (!w->team_cores.empty()) {
    const auto first = w->team_cores.begin() + std::ptrdiff_t(index) * w->threads;
    set_worker_team_cores(std::vector<int>(first, first + w->threads));
    bind_worker_team();
    cores = w->threads;
  }
  int cur = w->min_cores.load();
  while (cores < cur && !w->min_cores.compare_exchange_weak(cur, cores)) {
  }
  int team = 0;
#pragma omp parallel
  {
#pragma omp single
    team = omp_get_num_threads();
  }
  w->team.store(team);
}

/// Runs on each CUDA worker's driver thread: binds it to the next of the reserved cores.
struct DriverSetup {
  std::vector<int> cores;
  std::atomic<int> next{0};
};
void setup_cuda_worker(void* arg) {
  auto* d = static_cast<DriverSetup*>(arg);
  const int index = d->next.fetch_add(1);
  if (index < int(d->cores.size())) bind_this_thread(d->cores[std::size_t(index)]);
}

}  // namespace

Runtime::Runtime(const RuntimeOptions& options) : impl_(new Impl) {
  if (g_live_runtimes > 0 || g_shutdown_deferred)
    throw Error("a dos::Runtime already exists in this process (StarPU runs once per process): use that one");
  const char* env_sched = std::getenv("STARPU_SCHED");
  std::string requested = options.policy;
  if (requested.empty()) requested = env_sched && *env_sched ? env_sched : "cpu";
  try {
    impl_->choice = parse_policy(requested);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  policy_ = requested;
  if (env_sched && *env_sched && requested != env_sched && options.verbose)
    std::fprintf(stderr, "[dos] warning: STARPU_SCHED=%s is ignored: the policy given is '%s'\n", env_sched,
                 requested.c_str());
  // StarPU reads STARPU_SCHED again inside starpu_init and lets it override conf.sched_policy
  // (StarPU 1.3's src/core/sched_policy.c): the policy chosen here must be the one that runs.
  unsetenv("STARPU_SCHED");
  // One CPU worker whose codelets run an OpenMP team; its threads must not inherit the worker's
  // single-core binding (codelets/cpu_team.h).
  setenv("STARPU_WORKERS_NOBIND", "1", 0);
  // StarPU's drivers write dirty device buffers back on their own once fewer than 5% are clean
  // (starpu_memchunk_tidy, src/datawizard/memalloc.c): that copies the 16-bit parameter staging
  // buffers to the host for nothing. The runtime writes the optimizer state back itself.
  setenv("STARPU_MINIMUM_CLEAN_BUFFERS", "0", 0);
  setenv("STARPU_TARGET_CLEAN_BUFFERS", "0", 0);
  if (options.gpu_memory_limit > 0) {
    // StarPU reads its limit in MiB (src/drivers/cuda/driver_cuda.c); the option wins over the
    // environment, with a word when they differ.
    const std::string mib = std::to_string(std::max<std::size_t>(1, options.gpu_memory_limit >> 20));
    const char* env_limit = std::getenv("STARPU_LIMIT_CUDA_MEM");
    if (env_limit && mib != env_limit && options.verbose)
      std::fprintf(stderr, "[dos] warning: STARPU_LIMIT_CUDA_MEM=%s is replaced by the GPU budgets (%s MiB)\n",
                   env_limit, mib.c_str());
    setenv("STARPU_LIMIT_CUDA_MEM", mib.c_str(), 1);
  }

  const std::vector<int> process_cores = allowed_cores();  // before StarPU starts its threads

  struct starpu_conf conf;
  starpu_conf_init(&conf);
  if (impl_->choice.builtin()) {  // a registered StarPU policy by its struct, a built-in by its name
    conf.sched_policy = impl_->choice.starpu_policy;
    conf.sched_policy_name = conf.sched_policy ? nullptr : impl_->choice.name.c_str();
  } else {
    conf.sched_policy_name = nullptr;
    conf.sched_policy = &placement_policy;
  }
  if (options.cpu_workers < 0) throw Error("cpu_workers must be >= 0, got " + std::to_string(options.cpu_workers));
  if (options.cpu_workers > 0) conf.ncpus = options.cpu_workers;
  else if (!std::getenv("STARPU_NCPU") && !std::getenv("STARPU_NCPUS")) conf.ncpus = 1;
  if (options.ncuda >= 0) conf.ncuda = options.ncuda;
  if (options.cuda_device >= 0 && options.ncuda != 0) {  // this rank's GPU only
    conf.ncuda = 1;
    conf.use_explicit_workers_cuda_gpuid = 1;
    conf.workers_cuda_gpuid[0] = unsigned(options.cuda_device);
    // StarPU's environment wins over its conf (src/core/workers.c, src/core/topology.c)
    const std::pair<const char*, std::string> env[] = {{"STARPU_NCUDA", "1"},
                                                       {"STARPU_WORKERS_CUDAID", std::to_string(options.cuda_device)}};
    for (const auto& [name, want] : env) {
      const char* had = std::getenv(name);
      if (had && want != had && options.verbose)
        std::fprintf(stderr, "[dos] warning: %s=%s is replaced by %s: this process updates on GPU %d only\n", name, had,
                     want.c_str(), options.cuda_device);
      setenv(name, want.c_str(), 1);
    }
  }
  if (options.node_ranks < 1) throw Error("node_ranks must be >= 1, got " + std::to_string(options.node_ranks));
  node_ranks_ = options.node_ranks;
  const int ret = starpu_init(&conf);
  if (ret == 0) ++g_live_runtimes;
  if (ret == -ENODEV) throw Error("StarPU found no worker to run on (starpu_init returned -ENODEV)");
  if (ret != 0) throw Error("StarPU failed to start (starpu_init returned " + std::to_string(ret) + ")");

  const unsigned ncuda = starpu_cuda_worker_get_count();
  if (impl_->choice.plan && impl_->choice.plan->needs().cuda_worker && ncuda == 0) {
    starpu_shutdown();
    --g_live_runtimes;
    throw Error("policy '" + policy_ + "' needs a CUDA worker and there is none" +
                (codelets_have_cuda() ? " (no CUDA device visible)" : " (this build has no CUDA: rebuild with nvcc)") +
                ": use --policy cpu");
  }
  // StarPU's heteroprio puts every task of a priority in one bucket that every kind of worker in it
  // must be able to run (src/sched_policies/heteroprio.c asserts it, and a release build of StarPU
  // loses the task instead); the runtime's gradient staging and parameter write-back tasks run only
  // where the caller's buffers live, so with a CUDA worker they break that rule.
  if (running_policy() == "heteroprio" && ncuda > 0) {
    starpu_shutdown();
    --g_live_runtimes;
    throw Error("StarPU's heteroprio cannot run this update phase with a CUDA worker: it needs every task to be able "
                "to run on every kind of worker, and the gradient staging and parameter write-back tasks run only "
                "where the model's buffers live; use dmda, dmdas, lws or eager, or heteroprio with --ncuda 0");
  }
  // OpenMP threads per CPU worker: the cores (given, $OMP_NUM_THREADS, or all but one per CUDA
  // worker) shared among the CPU workers.
  int cores = options.cpu_threads;
  const char* env_omp = std::getenv("OMP_NUM_THREADS");
  if (cores <= 0 && env_omp && std::atoi(env_omp) > 0) cores = std::atoi(env_omp);
  if (cores <= 0) cores = int(process_cores.size()) - int(ncuda);
  const int ncpuw = int(starpu_cpu_worker_get_count());
  int threads = cores / (ncpuw > 0 ? ncpuw : 1);
  if (threads < 1) threads = 1;
  cpu_threads_ = threads;
  WorkerSetup ws;
  ws.threads = threads;
  // Binding (cpu_team.h): each CUDA driver thread on a core of its own (the first cores of the
  // process's set), the CPU workers' teams on the cores after them, one thread per core. Skipped
  // when the user binds OpenMP threads (OMP_PLACES, OMP_PROC_BIND), when DOS_BIND=0, or when the
  // cores are too few for one each.
  const char* env_bind = std::getenv("DOS_BIND");
  const bool user_binds = std::getenv("OMP_PLACES") || std::getenv("OMP_PROC_BIND");
  const std::size_t needed = ncuda + std::size_t(ncpuw) * std::size_t(threads);
  if (user_binds) binding_ = "OpenMP's own (OMP_PLACES/OMP_PROC_BIND set)";
  else if (env_bind && std::string(env_bind) == "0") binding_ = "none (DOS_BIND=0)";
  else if (process_cores.size() < needed)
    binding_ = "none (" + std::to_string(needed) + " threads, " + std::to_string(process_cores.size()) + " cores)";
  else {
    DriverSetup ds;
    ds.cores.assign(process_cores.begin(), process_cores.begin() + ncuda);
    if (ncuda > 0) starpu_execute_on_each_worker(setup_cuda_worker, &ds, STARPU_CUDA);
    ws.team_cores.assign(process_cores.begin() + ncuda, process_cores.begin() + std::ptrdiff_t(needed));
    binding_ = (ncuda ? "CUDA driver(s) on core " + core_list_string(ds.cores) + ", " : std::string()) +
               "CPU team(s) on cores " + core_list_string(ws.team_cores);
  }
  starpu_execute_on_each_worker(setup_cpu_worker, &ws, STARPU_CPU);
  if (ws.min_cores.load() < threads && options.verbose)
    std::fprintf(stderr, "[dos] warning: a CPU worker may run on only %d core(s) but has %d OpenMP threads: its threads "
                         "share cores (is STARPU_WORKERS_NOBIND=0 or a cgroup limiting the process?)\n",
                 ws.min_cores.load(), threads);
  worker_cores_ = ws.min_cores.load();
  omp_team_ = ws.team.load();
  // StarPU's task profiling stays off: the runtime clocks its tasks itself (task_clock.h), because
  // StarPU 1.3 (and 1.4 before 1.4.5) reads the GPU's energy counter through NVML around every CUDA
  // task when profiling is on, which costs milliseconds per task on some machines. STARPU_PROFILING=1
  // in the environment turns it on anyway: say what that costs.
  if (ncuda > 0 && starpu_profiling_status_get() == STARPU_PROFILING_ENABLE && options.verbose)
    std::fprintf(stderr, "[dos] warning: StarPU's task profiling is on (STARPU_PROFILING is set): StarPU 1.3 and 1.4 "
                         "before 1.4.5 then read the GPU's energy counter around every CUDA task, which can add "
                         "milliseconds per task; the runtime does not need it (unset STARPU_PROFILING)\n");

  if (ncuda == 0 && options.verbose && model_policy())
    std::fprintf(stderr, "[dos] policy %s: no CUDA worker on this machine, so every update runs on the CPU\n",
                 policy_.c_str());
  if (options.verbose)
    std::fprintf(stderr,
                 "[dos] policy %s (StarPU runs '%s'), %u CPU worker(s) x %d OpenMP threads (team of %d seen, on %d "
                 "cores), %u CUDA worker(s); binding: %s\n",
                 policy_.c_str(), running_policy().c_str(), cpu_workers(), cpu_threads_, omp_team_, worker_cores_, ncuda,
                 binding_.c_str());
}

Runtime::~Runtime() {
  --g_live_runtimes;
  if (g_live_optimizers > 0) {
    std::fprintf(stderr, "[dos] warning: the Runtime was destroyed before %d Optimizer(s): StarPU stops when the last "
                         "of them is destroyed\n", g_live_optimizers);
    g_shutdown_deferred = true;
    return;
  }
  starpu_shutdown();
}

std::string Runtime::running_policy() const {
  struct starpu_sched_policy* p = starpu_sched_ctx_get_sched_policy(0);
  return p && p->policy_name ? p->policy_name : "?";
}
bool Runtime::model_policy() const { return impl_->choice.plan && impl_->choice.plan->needs().rates; }
const Plan* Runtime::plan() const { return impl_->choice.plan.get(); }
unsigned Runtime::cpu_workers() const { return starpu_cpu_worker_get_count(); }
unsigned Runtime::cuda_workers() const { return starpu_cuda_worker_get_count(); }

// ---------------------------------------------------------------------------------------------
// Validation and host memory

void validate_adam_hyper(const AdamHyper& h) {
  auto bad = [](const std::string& what) { throw Error("invalid Adam hyper-parameter: " + what); };
  if (!(h.lr >= 0) || !std::isfinite(h.lr)) bad("learning rate must be a finite number >= 0, got " + std::to_string(h.lr));
  if (!(h.eps >= 0) || !std::isfinite(h.eps)) bad("eps must be a finite number >= 0, got " + std::to_string(h.eps));
  if (!(h.beta1 >= 0 && h.beta1 < 1)) bad("beta1 must be in [0, 1), got " + std::to_string(h.beta1));
  if (!(h.beta2 >= 0 && h.beta2 < 1)) bad("beta2 must be in [0, 1), got " + std::to_string(h.beta2));
  if (!(h.weight_decay >= 0) || !std::isfinite(h.weight_decay))
    bad("weight_decay must be a finite number >= 0, got " + std::to_string(h.weight_decay));
  // the kernels compute in fp32: a value (or lr x weight_decay) beyond its range makes every
  // parameter inf or NaN at the first step
  const std::pair<const char*, double> fp32[] = {{"learning rate", h.lr}, {"weight_decay", h.weight_decay},
                                                 {"eps", h.eps}, {"learning rate x weight_decay", h.lr * h.weight_decay}};
  for (const auto& [name, v] : fp32)
    if (v > FLT_MAX) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "%s %g overflows fp32 (at most 3.4e38): every parameter would become inf or NaN",
                    name, v);
      bad(msg);
    }
}

std::size_t host_bytes_per_param(DType dtype) { return 12 + 4 + dtype_size(dtype); }

namespace {
/// MemAvailable of /proc/meminfo, bytes; 0 when it cannot be read (not Linux).
std::size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::size_t kb = 0, avail = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  return avail;
}
}  // namespace

void check_host_memory(std::size_t bytes, const std::string& what) {
  const std::size_t avail = host_memory_available();
  if (avail == 0) return;  // cannot tell (not Linux): let the allocation decide
  if (bytes > avail) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "%s needs %.1f GB of host memory and only %.1f GB are available: run a shard of the model "
                  "(--shard R/W), a smaller model, or on a machine with more memory",
                  what.c_str(), bytes / 1e9, avail / 1e9);
    throw Error(msg);
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizer

namespace {

/// Host buffer, page-aligned, zero-filled, pinned for DMA when there is a CUDA worker and pinning
/// works (a failure to pin warns once and keeps pageable memory: slower copies, same results).
struct HostBuffer {
  float* ptr = nullptr;
  std::size_t bytes = 0;
  bool pinned = false;
  bool from_starpu = false;  // allocated by starpu_malloc_flags (DOS_HOST_ALLOC=starpu)
};

/// Measurement switch: DOS_HOST_ALLOC=starpu allocates the host buffers with starpu_malloc_flags
/// (cudaHostAlloc) instead of posix_memalign + starpu_memory_pin (cudaHostRegister), to compare
/// the DMA rates of the two kinds of pinned memory. StarPU aborts when that allocation fails.
bool host_alloc_by_starpu() {
  static const bool on = [] {
    const char* e = std::getenv("DOS_HOST_ALLOC");
    return e && std::string(e) == "starpu";
  }();
  return on && starpu_cuda_worker_get_count() > 0;
}

std::atomic<bool> g_warned_pageable{false};

struct FirstTouch {
  float* ptr;
  std::size_t n;
};
void first_touch_on_worker(void* arg) {
  auto* t = static_cast<FirstTouch*>(arg);
  bind_worker_team();
  zero_fill_cpu(t->ptr, t->n);
}

HostBuffer alloc_host(std::size_t bytes) {
  HostBuffer b;
  b.bytes = bytes;
  const std::size_t n = bytes / sizeof(float);
  void* p = nullptr;
  if (host_alloc_by_starpu()) {
    if (starpu_malloc_flags(&p, b.bytes ? b.bytes : 4096, STARPU_MALLOC_PINNED) != 0)
      throw Error("cannot allocate " + std::to_string(b.bytes) + " bytes of pinned host memory (DOS_HOST_ALLOC=starpu)");
    b.from_starpu = b.pinned = true;
  } else if (posix_memalign(&p, 4096, b.bytes ? b.bytes : 4096) != 0) {
    throw Error("cannot allocate " + std::to_string(b.bytes) + " bytes of host memory for the optimizer state");
  }
  b.ptr = static_cast<float*>(p);
  // NUMA-aware first touch: the first CPU worker's (bound) team zeroes the buffer with the Adam
  // kernel's partition, so each page lands on the NUMA node of the thread that will update it.
  FirstTouch touch{b.ptr, n};
  if (starpu_cpu_worker_get_count() > 0) {
    unsigned worker = 0;
    starpu_worker_get_ids_by_type(STARPU_CPU_WORKER, reinterpret_cast<int*>(&worker), 1);
    starpu_execute_on_specific_workers(first_touch_on_worker, &touch, 1, &worker, "dos_first_touch");
  } else {
    zero_fill_cpu(b.ptr, n);
  }
  std::memset(reinterpret_cast<char*>(b.ptr) + n * sizeof(float), 0, bytes - n * sizeof(float));
  if (starpu_cuda_worker_get_count() > 0 && !b.from_starpu) {
    b.pinned = starpu_memory_pin(b.ptr, b.bytes) == 0;
    if (!b.pinned && !g_warned_pageable.exchange(true))
      std::fprintf(stderr, "[dos] warning: could not pin %zu bytes of optimizer state: using pageable memory, "
                           "whose copies to and from the GPU are slower and synchronous\n", b.bytes);
  }
  return b;
}

void free_host(HostBuffer& b) {
  if (!b.ptr) return;
  if (b.from_starpu) {
    starpu_free_flags(b.ptr, b.bytes ? b.bytes : 4096, STARPU_MALLOC_PINNED);
    b.ptr = nullptr;
    return;
  }
  if (b.pinned) starpu_memory_unpin(b.ptr, b.bytes);
  std::free(b.ptr);
  b.ptr = nullptr;
}

struct Subgroup {
  std::size_t begin = 0, size = 0;
  std::int64_t step = 0;
  HostBuffer master, exp_avg, exp_avg_sq;
  HostBuffer grad32, param16;  // host staging of the fp32 gradient and the new parameters
  starpu_data_handle_t h_master = nullptr, h_exp_avg = nullptr, h_exp_avg_sq = nullptr;
  starpu_data_handle_t h_grad32 = nullptr, h_param16 = nullptr;
  // The shadow state of speculative updates (Optimizer::gradients_final): where adam_into_cl writes
  // the new state, swapped with the state above when the update is kept. Allocated at the
  // subgroup's first speculative update.
  HostBuffer sh_master, sh_exp_avg, sh_exp_avg_sq;
  starpu_data_handle_t sh_h_master = nullptr, sh_h_exp_avg = nullptr, sh_h_exp_avg_sq = nullptr;
  std::atomic<bool> spec_ended{false};  // the speculative Adam task of the open step has ended
  std::vector<Segment> segs;
  GatherArgs gather_grads{}, gather_params{};
  ScatterArgs scatter{};
  AdamArgs adam{};
  AdamDirectArgs adam_direct{};
  TaskHint hint_update{};  // the Adam task: the side the policy's plan names
  TaskHint hint_io{};      // conversion and write-back: wherever the caller's buffers are
  TaskHint hint_scatter{};  // the parameter write-back of an update phase: as hint_io, urgent
  std::atomic<int> ran_on{0};  // 1: CPU worker, 2: CUDA worker
  // Admission window (update budget): bytes this subgroup holds on the GPU in this phase, and the
  // pieces of work (parameter write-back task, state write-backs) still to end before it gives
  // them back.
  std::size_t footprint = 0;
  std::atomic<int> parts_left{0};
  AdmissionWindow* window = nullptr;
  struct Timeline* timeline = nullptr;
  struct PhaseBusy* busy = nullptr;  // the optimizer's busy sums of the phase

  Subgroup() = default;
  Subgroup(const Subgroup&) = delete;
  Subgroup& operator=(const Subgroup&) = delete;
  /// Unregisters the handles (the state comes home first) and frees the host buffers. The caller
  /// waits for every task touching them before (Optimizer::Impl's destructor does).
  ~Subgroup() {
    for (starpu_data_handle_t h : {h_master, h_exp_avg, h_exp_avg_sq})
      if (h) starpu_data_unregister(h);
    // scratch: nothing to bring home
    for (starpu_data_handle_t h : {h_grad32, h_param16, sh_h_master, sh_h_exp_avg, sh_h_exp_avg_sq})
      if (h) starpu_data_unregister_no_coherency(h);
    for (HostBuffer* b : {&master, &exp_avg, &exp_avg_sq, &grad32, &param16, &sh_master, &sh_exp_avg, &sh_exp_avg_sq})
      if (b->ptr) free_host(*b);
  }
};

/// Ends one piece of a subgroup's work; the last one gives its footprint back to the window.
void subgroup_part_done(Subgroup* sg) {
  if (sg->parts_left.fetch_sub(1) == 1 && sg->window) sg->window->give(sg->footprint);
}

/// Tasks of a phase, from the task clock (task_clock.h), when a timeline is asked for.
struct Timeline {
  std::mutex mu;
  double t0_us = 0;  // starpu_timing_now() when the phase began: the task clock's clock
  std::vector<TimelineTask> tasks;
  void record(const char* what, std::size_t subgroup, const task_clock::Span& span) {
    auto secs = [&](double us) { return 1e-6 * (us - t0_us); };
    std::lock_guard<std::mutex> g(mu);
    tasks.push_back(TimelineTask{span.gpu ? "gpu" : "cpu", what, subgroup, secs(span.start_us), secs(span.end_us)});
  }
};

/// Seconds one optimizer's tasks kept the workers busy during a phase, summed over workers: every
/// task on CPU workers, every task on CUDA workers, and the CPU Adam tasks alone (what the rates'
/// refinement and calibration compare with the model, which counts only Adam on the CPU).
struct PhaseBusy {
  std::mutex mu;
  double cpu = 0, gpu = 0, cpu_adam = 0;
  void reset() {
    std::lock_guard<std::mutex> g(mu);
    cpu = gpu = cpu_adam = 0;
  }
};

/// From a step task's callback: completes the task's clock record, adds it to the optimizer's busy
/// sums and, when a timeline is asked for, to the timeline.
void clock_task(Subgroup* sg, const char* what) {
  task_clock::Span span;
  if (!task_clock::finish(starpu_task_get_current(), &span)) return;
  if (sg->busy) {
    const double s = 1e-6 * (span.end_us - span.start_us);
    std::lock_guard<std::mutex> g(sg->busy->mu);
    (span.gpu ? sg->busy->gpu : sg->busy->cpu) += s;
    if (!span.gpu && std::strcmp(what, "adam") == 0) sg->busy->cpu_adam += s;
  }
  if (sg->timeline) sg->timeline->record(what, std::size_t(sg->hint_update.subgroup), span);
}

/// Counts outstanding asynchronous acquisitions and waits for them.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  int n = 0;
  double last_subgroup_part_us = 0;  // starpu_timing_now() of the last write-back that ended a subgroup's part
  void subgroup_part_ended() {
    const double now = starpu_timing_now();
    std::lock_guard<std::mutex> l(mu);
    if (now > last_subgroup_part_us) last_subgroup_part_us = now;
  }
  void add() {
    std::lock_guard<std::mutex> l(mu);
    ++n;
  }
  void done() {
    std::lock_guard<std::mutex> l(mu);
    if (--n == 0) cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return n == 0; });
  }
};

struct WriteBack {
  starpu_data_handle_t h;
  Pending* pending;
  Subgroup* sg;  // its part of the subgroup's work ends with the write-back (nullptr: none)
};

void release_after_writeback(void* arg) {
  auto* wb = static_cast<WriteBack*>(arg);
  // The host copy is valid now. After a write acquire (end-of-phase write-back) it is the only
  // one; after a read acquire (eager write-back) the device copy was marked starpu_data_wont_use,
  // so StarPU drops it first when it needs room.
  starpu_data_release(wb->h);
  Pending* p = wb->pending;
  Subgroup* sg = wb->sg;
  delete wb;
  if (sg) {
    p->subgroup_part_ended();
    subgroup_part_done(sg);
  }
  p->done();
}

/// Callback of the Adam task: which kind of worker ran it, and its timeline entry.
void record_worker(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  const int w = starpu_worker_get_id();
  sg->ran_on.store(w >= 0 && starpu_worker_get_type(w) == STARPU_CUDA_WORKER ? 2 : 1);
  clock_task(sg, "adam");
}
/// Callback of a speculative Adam task (adam_into_cl): as record_worker, and the task has ended.
void record_speculative(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  const int w = starpu_worker_get_id();
  sg->ran_on.store(w >= 0 && starpu_worker_get_type(w) == STARPU_CUDA_WORKER ? 2 : 1);
  clock_task(sg, "adam_spec");
  sg->spec_ended.store(true);
}
void record_gather(void* arg) {
  clock_task(static_cast<Subgroup*>(arg), "gather");
}
/// Callback of the Adam task of the direct path (adam_direct_cl): as record_worker, and the task is
/// one piece of the subgroup's work.
void adam_direct_done(void* arg) {
  record_worker(arg);
  subgroup_part_done(static_cast<Subgroup*>(arg));
}
/// Callback of the parameter write-back task: the timeline, and one piece of the subgroup done.
void scatter_done(void* arg) {
  auto* sg = static_cast<Subgroup*>(arg);
  clock_task(sg, "scatter");
  subgroup_part_done(sg);
}

void submit(struct starpu_task* t, const char* what) {
  const int ret = starpu_task_submit(t);
  if (ret != 0) throw Error(std::string("StarPU refused the ") + what + " task (error " + std::to_string(ret) + ")");
}

/// StarPU's bus counters reset when read: every reader goes through this accumulator, so that the
/// timeline's sampling thread and step() see the same running totals (bytes since start-up).
std::mutex g_bus_mu;
std::uint64_t g_bus_h2d = 0, g_bus_d2h = 0;
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

}  // namespace

namespace {
/// The state of an update phase between begin_step() and the end of finish_step().
struct OpenStep {
  StepStats st;
  std::uint64_t h2d0 = 0, d2h0 = 0;
  std::chrono::steady_clock::time_point t0;
  std::atomic<bool> sampling{false};
  std::thread sampler;  // the timeline's bus samples, every millisecond
  Simulation sim;
  Pending pending;
  int refused = 0;                      // asynchronous acquires StarPU refused
  std::vector<char> admitted;           // the subgroup holds its footprint in the admission window
  std::vector<std::size_t> final_elems;  // elements of the subgroup's gradient declared final
  std::map<std::size_t, std::size_t> declared;  // the ranges declared final so far: begin -> end
  std::vector<char> stepped;            // its step count went up in this step
  std::vector<char> speculated;         // its speculative update was submitted (and not redone)
  std::vector<std::size_t> spec_order;  // the speculated subgroups, in submission order
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
  /// Stops the submitter and the sampler and waits for the acquisitions still referring to `pending`.
  ~OpenStep() {
    drain();
    sampling.store(false);
    if (sampler.joinable()) sampler.join();
    pending.wait();
  }
};
}  // namespace

struct Optimizer::Impl {
  Runtime* rt = nullptr;
  OptimizerOptions opt;
  std::vector<TensorView> tensors;
  std::vector<std::unique_ptr<Subgroup>> sgs;
  std::size_t nparams = 0;
  uint32_t where_caller = STARPU_CPU;
  bool use_hints = false;
  PolicyChoice choice;
  Workload workload;
  Rates rates{};             // the rates to plan with: calibrated, then refined after every phase
  Rates calibrated_rates{};  // the calibration's own (the lower bound's, stable from run to run)
  bool have_rates = false;
  PlanOverride override_;
  std::string rates_path;  // where calibrate_rates caches the rates; refined ones go back there
  bool refined = false;
  std::vector<PlanSide> plan;  // this step's plan (empty for StarPU's built-in policies)
  std::string broken;          // why a failed step left the state inconsistent (empty: fine)
  AdmissionWindow window;      // the GPU update budget
  Timeline timeline;
  PhaseBusy busy;
  bool timeline_on = false;
  std::vector<unsigned> cuda_nodes;  // memory node of each CUDA worker, in worker-id order
  std::unique_ptr<OpenStep> open;    // the update phase between begin_step and finish_step
  std::size_t shadow_used = 0, shadow_limit = 0;  // host bytes of shadow state, and their budget
  // The previous overlapped step's gradients changed after their declaration (clipping was active):
  // this step speculates nothing, since its speculative updates would most likely be redone too
  // (clipping tends to stay active from one step to the next); the next step tries again.
  bool last_changed = false;

  // The update phase (defined below, with OpenStep).
  void begin(bool overlapped);
  void declare_final(std::size_t begin, std::size_t end);
  StepStats finish(StepVerdict verdict);
  [[noreturn]] void fail(const std::string& why);
  void require_no_open_step(const char* what) const;
  bool speculable(std::size_t i) const;
  bool ensure_shadow(Subgroup* sg);
  void speculate(OpenStep& ph, std::size_t i);
  void stage_gradient(OpenStep& ph, std::size_t i);
  void scatter_params(Subgroup* sg);
  void acquire_home(OpenStep& ph, starpu_data_handle_t h, enum starpu_data_access_mode mode, Subgroup* sg);
  void write_back(OpenStep& ph, Subgroup* sg, enum starpu_data_access_mode mode, bool part_of_subgroup);

  /// How step() carries a plan out (the phase simulation's view of it, models/phase_sim.h).
  Execution execution() const {
    Execution e;
    e.order = opt.submit_order;
    e.lookahead = cuda_nodes.empty() ? 0 : opt.stream_lookahead;
    e.update_budget = cuda_nodes.empty() ? 0 : opt.gpu_update_budget;
    e.cpu_workers = rt->cpu_workers();
    return e;
  }
  /// Whether subgroup i's update this step takes the direct path: a plan puts it on the GPU and the
  /// caller's buffers are there (CUDA worker present).
  bool direct_path(std::size_t i) const {
    return !plan.empty() && plan[i] != PlanSide::cpu && where_caller == STARPU_CUDA && !cuda_nodes.empty();
  }

  Impl() { ++g_live_optimizers; }
  ~Impl() {
    starpu_task_wait_for_all();  // nothing may still use the buffers freed below
    open.reset();
    if (refined && !rates_path.empty()) {
      try {  // the next run starts from what this one learned
        save_rates(rates_path, rates, calibrated_rates);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[dos] warning: could not save the refined rates: %s\n", e.what());
      }
    }
    sgs.clear();
    if (--g_live_optimizers == 0 && g_shutdown_deferred) {
      g_shutdown_deferred = false;
      starpu_shutdown();
    }
  }

  /// The plan of the next step: none under a StarPU policy; every update on the CPU without a CUDA
  /// worker; a forced plan (set_plan_override) spread over the subgroups that are not resident;
  /// else the plan's own decision.
  std::vector<PlanSide> make_plan() const {
    const std::size_t n = sgs.size();
    if (!choice.plan) return {};
    if (rt->cuda_workers() == 0) return std::vector<PlanSide>(n, PlanSide::cpu);
    if (override_.kind == PlanOverride::none) {
      std::vector<PlanSide> p;
      try {
        p = choice.plan->decide(PlanInput{workload, have_rates ? &rates : nullptr, execution()});
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        throw Error("plan " + choice.name + ": " + e.what());
      }
      if (p.size() != n)
        throw Error("plan " + choice.name + " gave " + std::to_string(p.size()) + " sides for " + std::to_string(n) +
                    " subgroups");
      return p;
    }
    const std::size_t res = std::min(workload.resident, n), free = n - res;
    std::vector<PlanSide> p;
    if (override_.kind == PlanOverride::fraction)
      p = spread_plan(free, workload.may_stream ? std::size_t(std::llround(override_.value * double(free))) : 0);
    else
      p = workload.may_stream ? stride_plan(free, std::size_t(override_.value)) : spread_plan(free, 0);
    p.resize(n, PlanSide::gpu_resident);
    return p;
  }

  /// Online refinement of the rates from what the resources were busy doing in the step, against
  /// what the phase simulation says they would have been doing (exponential average, weight 1/2):
  ///  - U_c from the CPU worker's busy time in phases that streamed nothing;
  ///  - U_c_dma from the CPU's busy time in phases that streamed: the simulation splits the CPU's
  ///    work into a part beside DMA and a part alone; the part alone is taken at U_c, the rest of
  ///    the measured busy time gives U_c_dma;
  ///  - B_h2d and B_d2h from when the streaming ended (the last streamed subgroup's state back in
  ///    host memory) against when the simulation ends it: the links run back to back until then.
  void refine(const StepStats& st, const Simulation& sim) {
    if (!have_rates || !choice.plan || !choice.plan->needs().refine || rt->cuda_workers() == 0) return;
    // a step moves a rate half way to what it measured, and by at most a factor of 2
    auto blend = [&](double& rate, double measured) {
      if (!(measured > 0) || !std::isfinite(measured)) return;
      rate = 0.5 * (rate + std::min(2 * rate, std::max(0.5 * rate, measured)));
      refined = true;
    };
    const double adam = st.cpu_adam_seconds;  // CPU Adam alone: the model counts nothing else
    if (st.planned_streamed == 0 && sim.cpu > 0 && adam > 0) {
      blend(rates.U_c, rates.U_c * sim.cpu / adam);
    } else if (sim.cpu_beside_dma > 0.2 * sim.cpu && adam > 0) {
      const double alone = sim.cpu - sim.cpu_beside_dma;
      const double beside = adam - alone;
      if (beside > 0.2 * sim.cpu_beside_dma) blend(rates.U_c_dma, rates.U_c_dma * sim.cpu_beside_dma / beside);
    }
    // Below this U_c_dma, host memory (host_bandwidth) is at its floor, what CPU Adam or both links
    // get alone, and the model no longer depends on U_c_dma: refining further would only drift.
    rates.U_c_dma = std::min(rates.U_c, std::max(rates.U_c_dma, lowest_distinct_u_c_dma(workload, rates)));
    if (st.planned_streamed > 0 && sim.stream_end > 0 && st.stream_end_seconds > 0 && opt.eager_writeback) {
      const double f = sim.stream_end / st.stream_end_seconds;
      blend(rates.B_h2d, rates.B_h2d * f);
      blend(rates.B_d2h, rates.B_d2h * f);
    }
  }

  struct starpu_task* make_task(struct starpu_codelet* cl, void* arg, const TaskHint* hint, uint32_t where) {
    struct starpu_task* t = starpu_task_create();
    t->cl = cl;
    t->cl_arg = arg;
    t->cl_arg_size = 0;
    t->cl_arg_free = 0;
    t->where = where;
    if (use_hints) t->sched_data = const_cast<TaskHint*>(hint);
    return t;
  }

  /// An Adam task of the plan's side on subgroup sg's state (handles 0-2: master, exp_avg,
  /// exp_avg_sq; the caller sets any others), with `done` as its callback (argument: sg).
  struct starpu_task* adam_task(Subgroup* sg, struct starpu_codelet* cl, void* arg, uint32_t where, void (*done)(void*)) {
    struct starpu_task* t = make_task(cl, arg, &sg->hint_update, where);
    t->handles[0] = sg->h_master;
    t->handles[1] = sg->h_exp_avg;
    t->handles[2] = sg->h_exp_avg_sq;
    t->callback_func = done;
    t->callback_arg = sg;
    return t;
  }

  /// After a write of the master parameters on the device side: the state lives in host memory
  /// only, as after a step (a read-write acquire on main RAM invalidates any device copy).
  void keep_master_on_host_only() {
    for (auto& sg : sgs) {
      starpu_data_acquire(sg->h_master, STARPU_RW);
      starpu_data_release(sg->h_master);
    }
  }

  /// Holds every subgroup's master, exp_avg and exp_avg_sq in host memory (acquired in `mode`:
  /// STARPU_R brings the host copies up to date, STARPU_W invalidates the device copies) and calls
  /// fn with their pointers, as a vector of State ({master, exp_avg, exp_avg_sq, size}), in subgroup
  /// (flat) order; releases them all when fn returns or throws.
  template <class State, class Fn>
  void hold_state(starpu_data_access_mode mode, Fn&& fn) const {
    std::vector<State> state;
    std::vector<starpu_data_handle_t> held;
    state.reserve(sgs.size());
    held.reserve(3 * sgs.size());  // no allocation between an acquire and its bookkeeping
    struct Release {
      std::vector<starpu_data_handle_t>& held;
      ~Release() {
        for (starpu_data_handle_t h : held) starpu_data_release(h);
      }
    } release{held};
    for (const auto& sg : sgs) {
      for (starpu_data_handle_t h : {sg->h_master, sg->h_exp_avg, sg->h_exp_avg_sq}) {
        starpu_data_acquire(h, mode);
        held.push_back(h);
      }
      state.push_back({sg->master.ptr, sg->exp_avg.ptr, sg->exp_avg_sq.ptr, sg->size});
    }
    fn(state);
  }

  void read_state(float* out, HostBuffer Subgroup::*buf, starpu_data_handle_t Subgroup::*h) const {
    require_no_open_step("reading the optimizer state");
    for (const auto& sg : sgs) {
      starpu_data_acquire(sg.get()->*h, STARPU_R);  // waits for the tasks writing it, fetches it home
      std::memcpy(out + sg->begin, (sg.get()->*buf).ptr, sg->size * sizeof(float));
      starpu_data_release(sg.get()->*h);
    }
  }
};

Optimizer::Optimizer(Runtime& runtime, const std::vector<TensorView>& tensors, const OptimizerOptions& options)
    : impl_(new Impl) {
  Impl& I = *impl_;
  I.rt = &runtime;
  I.opt = options;
  I.tensors = tensors;
  validate_adam_hyper(options.adam);
  if (tensors.empty()) throw Error("no tensors given to the optimizer");
  std::vector<std::size_t> numels;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel > 0 && (!tensors[i].param || !tensors[i].grad))
      throw Error("tensor " + std::to_string(i) + " has a null parameter or gradient pointer");
    numels.push_back(tensors[i].numel);
  }
  std::vector<SubgroupLayout> layout;
  try {
    layout = partition_subgroups(numels, options.subgroup_size);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  for (std::size_t n : numels) I.nparams += n;
  if (options.memory == MemoryKind::cuda) {
    if (runtime.cuda_workers() == 0)
      throw Error("the parameters live in GPU memory but the runtime has no CUDA worker");
    I.where_caller = STARPU_CUDA;
  }
  const std::size_t esz = dtype_size(options.dtype);
  {  // five page-aligned buffers per subgroup (alloc_host): count the rounding of small subgroups too
    const std::size_t page = 4096;
    auto pages = [&](std::size_t bytes) { return (bytes + page - 1) / page * page; };
    std::size_t need = 0;
    for (const SubgroupLayout& l : layout) need += 4 * pages(l.size * sizeof(float)) + pages(l.size * esz);
    check_host_memory(need, "the optimizer state of " + std::to_string(I.nparams) + " parameters in " +
                                std::to_string(layout.size()) + " subgroups");
  }
  const PolicyChoice choice = runtime.impl().choice;
  I.choice = choice;
  I.use_hints = !choice.builtin();
  I.workload.caller_on_gpu = options.memory == MemoryKind::cuda;
  I.workload.param_bytes = esz;
  // The staged gradient: fp32, or the parameters' dtype (native_grads: half the bytes for 16-bit).
  const DType grad_dtype = options.native_grads ? options.dtype : DType::fp32;
  const std::size_t gsz = dtype_size(grad_dtype);
  I.workload.grad_bytes = gsz;
  for (const SubgroupLayout& l : layout) I.workload.sizes.push_back(l.size);
  {  // GPU budgets (OptimizerOptions): what may stay resident, and whether one streamed subgroup fits
    const bool gpu = runtime.cuda_workers() > 0;
    if (options.gpu_resident_budget < -1)
      throw Error("the GPU resident budget must be >= 0 bytes (or -1: not given), got " +
                  std::to_string(options.gpu_resident_budget));
    if (options.gpu_update_budget > 0 && !options.eager_writeback)
      throw Error("a GPU update budget needs the eager write-back (a subgroup's GPU memory is given back when its "
                  "state is home): drop the budget or keep eager_writeback");
    if (gpu) {
      try {
        apply_gpu_budgets(I.workload, choice.plan.get(), GpuBudgets{options.gpu_resident_budget, options.gpu_update_budget});
      } catch (const std::invalid_argument& e) {
        throw Error(e.what());
      }
    }
    if (gpu && options.gpu_update_budget > 0 && !I.workload.may_stream && options.verbose) {
      std::size_t need_streamed = 0;
      for (std::size_t sz : I.workload.sizes)
        need_streamed = std::max(need_streamed, subgroup_footprint(I.workload, sz, PlanSide::gpu_streamed));
      std::fprintf(stderr, "[dos] the GPU update budget (%s) is below one streamed subgroup's %s: every update "
                           "that is not resident runs on the CPU\n", gb_text(double(options.gpu_update_budget)).c_str(),
                   gb_text(double(need_streamed)).c_str());
    }
    for (unsigned w = 0; w < starpu_worker_get_count(); ++w)
      if (starpu_worker_get_type(int(w)) == STARPU_CUDA_WORKER) I.cuda_nodes.push_back(starpu_worker_get_memory_node(w));
  }

  for (std::size_t s = 0; s < layout.size(); ++s) {
    auto sg = std::make_unique<Subgroup>();
    sg->begin = layout[s].begin;
    sg->size = layout[s].size;
    sg->master = alloc_host(sg->size * sizeof(float));
    sg->exp_avg = alloc_host(sg->size * sizeof(float));
    sg->exp_avg_sq = alloc_host(sg->size * sizeof(float));
    sg->grad32 = alloc_host(sg->size * gsz);
    sg->param16 = alloc_host(sg->size * esz);
    starpu_vector_data_register(&sg->h_master, STARPU_MAIN_RAM, uintptr_t(sg->master.ptr), sg->size, sizeof(float));
    starpu_vector_data_register(&sg->h_exp_avg, STARPU_MAIN_RAM, uintptr_t(sg->exp_avg.ptr), sg->size, sizeof(float));
    starpu_vector_data_register(&sg->h_exp_avg_sq, STARPU_MAIN_RAM, uintptr_t(sg->exp_avg_sq.ptr), sg->size,
                                sizeof(float));
    // Staging buffers live in host memory allocated (and pinned) once. Left to StarPU (home node
    // -1, dropped after each phase), their host copies were allocated and pinned again every
    // iteration: the cpu policy's update phase for 1.68e9 parameters took 5.38 s on the GPU
    // machine, 0.58 s with this (README, "Measured"). Their contents are dropped after use
    // (invalidate), so nothing is ever written back for them.
    starpu_vector_data_register(&sg->h_grad32, STARPU_MAIN_RAM, uintptr_t(sg->grad32.ptr), sg->size, gsz);
    starpu_vector_data_register(&sg->h_param16, STARPU_MAIN_RAM, uintptr_t(sg->param16.ptr), sg->size, esz);
    for (const Piece& p : layout[s].pieces) {
      const TensorView& t = tensors[p.tensor];
      sg->segs.push_back(Segment{static_cast<char*>(t.param) + p.tensor_offset * esz,
                                 static_cast<char*>(t.grad) + p.tensor_offset * esz, p.offset, p.count});
    }
    sg->gather_grads = GatherArgs{sg->segs.data(), sg->segs.size(), options.dtype, false, grad_dtype};
    sg->gather_params = GatherArgs{sg->segs.data(), sg->segs.size(), options.dtype, true};
    sg->scatter = ScatterArgs{sg->segs.data(), sg->segs.size(), options.dtype};
    sg->adam_direct = AdamDirectArgs{&sg->adam, sg->segs.data(), sg->segs.size(), options.dtype};
    sg->adam.param_dtype = options.dtype;
    sg->adam.grad_dtype = grad_dtype;
    sg->hint_update = TaskHint{Side::cpu, unsigned(s)};
    sg->hint_io = TaskHint{Side::any, unsigned(s)};
    sg->hint_scatter = TaskHint{Side::any, unsigned(s)};
    sg->hint_scatter.urgent = options.urgent_writeback;
    sg->window = &I.window;  // the GPU update budget's window, reset at every step
    I.sgs.push_back(std::move(sg));
  }
  // fp32 master parameters from the caller's parameters, converted where they live.
  for (auto& sg : I.sgs) {
    struct starpu_task* t = I.make_task(&gather_cl, &sg->gather_params, &sg->hint_io, I.where_caller);
    t->handles[0] = sg->h_master;
    submit(t, "master-parameter initialisation");
  }
  starpu_task_wait_for_all();
  I.keep_master_on_host_only();
  if (runtime.model_policy() && runtime.cuda_workers() > 0) {
    const Rates& r = options.rates;
    if (rates_complete(r)) {
      I.rates = I.calibrated_rates = r;
    } else {
      // scratch subgroups as large as the workload's (at most 2^24 elements: a few seconds)
      const std::size_t largest = *std::max_element(I.workload.sizes.begin(), I.workload.sizes.end());
      const std::size_t cal = std::min<std::size_t>(largest, std::size_t(1) << 24);
      I.rates = calibrate_rates(runtime, cal, options.dtype, options.memory, options.recalibrate, options.verbose,
                                &I.calibrated_rates);
      I.rates_path = rates_cache_path(runtime, cal, options.dtype, options.memory);
    }
    I.have_rates = true;
  }
}

Optimizer::~Optimizer() = default;

// ---------------------------------------------------------------------------------------------
// One update phase: begin_step, gradients_final (speculative updates), finish_step

namespace {
// The state write-back (docs/measured-2026-11-30.md, "Streaming optimizer state at the PCIe rate"): an
// asynchronous acquire on main RAM turns the write-back of a GPU-updated subgroup into a normal
// D2H fetch, which runs beside the H2D stream. eager: a read acquire right after the subgroup's
// tasks, then starpu_data_wont_use so StarPU drops the device copy first; else a read-write
// acquire at the end of the phase (invalidating the device copy).
// Measurement switch: DOS_WONT_USE=0 leaves starpu_data_wont_use out of the eager write-back.
bool wont_use_after_writeback() {
  static const bool on = !(std::getenv("DOS_WONT_USE") && std::string(std::getenv("DOS_WONT_USE")) == "0");
  return on;
}
}  // namespace

void Optimizer::Impl::require_no_open_step(const char* what) const {
  if (open) throw Error(std::string(what) + " while an update phase is open (begin_step without finish_step): call "
                        "finish_step first");
}

void Optimizer::Impl::acquire_home(OpenStep& ph, starpu_data_handle_t h, enum starpu_data_access_mode mode, Subgroup* sg) {
  auto* wb = new WriteBack{h, &ph.pending, sg};  // before add(): a throw here leaves the count as it was
  ph.pending.add();
  if (starpu_data_acquire_on_node_cb(h, STARPU_MAIN_RAM, mode, release_after_writeback, wb) != 0) {
    delete wb;
    ph.pending.done();
    if (sg) subgroup_part_done(sg);
    ++ph.refused;
  }
}

void Optimizer::Impl::write_back(OpenStep& ph, Subgroup* sg, enum starpu_data_access_mode mode, bool part_of_subgroup) {
  for (starpu_data_handle_t h : {sg->h_master, sg->h_exp_avg, sg->h_exp_avg_sq}) {
    acquire_home(ph, h, mode, part_of_subgroup ? sg : nullptr);
    if (part_of_subgroup && wont_use_after_writeback()) starpu_data_wont_use(h);
  }
}

bool Optimizer::Impl::speculable(std::size_t i) const {
  if (opt.speculation_budget == 0 || last_changed) return false;
  if (!plan.empty() && plan[i] == PlanSide::gpu_streamed)
    return opt.speculate_streamed && !cuda_nodes.empty() && codelets_have_cuda();
  return rt->cpu_workers() > 0 && (plan.empty() || plan[i] == PlanSide::cpu);
}

bool Optimizer::Impl::ensure_shadow(Subgroup* sg) {
  if (sg->sh_h_master) return true;
  const std::size_t bytes = 3 * sg->size * sizeof(float);
  if (shadow_limit == 0) {  // the budget, fixed at the first speculative update
    if (opt.speculation_budget > 0) {
      shadow_limit = std::size_t(opt.speculation_budget);
    } else {
      const std::size_t avail = host_memory_available();
      shadow_limit = avail ? avail / 2 : std::size_t(3) * nparams * sizeof(float);
    }
  }
  if (shadow_used + bytes > shadow_limit) return false;
  sg->sh_master = alloc_host(sg->size * sizeof(float));
  sg->sh_exp_avg = alloc_host(sg->size * sizeof(float));
  sg->sh_exp_avg_sq = alloc_host(sg->size * sizeof(float));
  starpu_vector_data_register(&sg->sh_h_master, STARPU_MAIN_RAM, uintptr_t(sg->sh_master.ptr), sg->size, sizeof(float));
  starpu_vector_data_register(&sg->sh_h_exp_avg, STARPU_MAIN_RAM, uintptr_t(sg->sh_exp_avg.ptr), sg->size, sizeof(float));
  starpu_vector_data_register(&sg->sh_h_exp_avg_sq, STARPU_MAIN_RAM, uintptr_t(sg->sh_exp_avg_sq.ptr), sg->size,
                              sizeof(float));
  shadow_used += bytes;
  return true;
}

void Optimizer::Impl::fail(const std::string& why) {
  starpu_task_wait_for_all();
  broken = why;
  open.reset();
  throw Error(why);
}

void Optimizer::Impl::begin(bool overlapped) {
  if (!broken.empty())
    throw Error("a previous step failed (" + broken + "): the optimizer state may be inconsistent; create a new Optimizer");
  require_no_open_step("begin_step");
  open = std::make_unique<OpenStep>();
  OpenStep& ph = *open;
  StepStats& st = ph.st;
  st.overlapped = overlapped;
  read_bus_bytes(&ph.h2d0, &ph.d2h0);
  busy.reset();  // nothing of this optimizer is in flight
  ph.t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> g(timeline.mu);
    timeline.tasks.clear();
    timeline.t0_us = starpu_timing_now();
  }
  // The timeline's bus samples: a thread reads the bus counters every millisecond during the phase.
  if (timeline_on) {
    ph.sampling.store(true);
    ph.sampler = std::thread([&ph] {
      while (ph.sampling.load()) {
        BusSample b;
        read_bus_bytes(&b.h2d, &b.d2h);
        b.h2d -= ph.h2d0;
        b.d2h -= ph.d2h0;
        b.t = std::chrono::duration<double>(std::chrono::steady_clock::now() - ph.t0).count();
        ph.st.bus.push_back(b);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  try {
    plan = make_plan();
  } catch (...) {
    open.reset();
    throw;
  }
  st.plan = plan;
  if (!plan.empty()) {
    for (std::size_t i = 0; i < sgs.size(); ++i) {
      sgs[i]->hint_update.side = plan[i] == PlanSide::cpu ? Side::cpu : Side::gpu;
      st.planned_streamed += plan[i] == PlanSide::gpu_streamed;
      st.planned_resident += plan[i] == PlanSide::gpu_resident;
    }
    if (have_rates) {
      try {
        ph.sim = simulate_phase(workload, plan, rates, execution());
      } catch (const std::logic_error&) {  // a simulation that cannot progress: the resource bound
        const Prediction p = predict(workload, plan, rates);
        ph.sim.total = p.total;
      }
      st.predicted_seconds = ph.sim.total;
      Workload bound_w = workload;  // a plan choosing its own resident subgroups keeps the last ones
      bound_w.resident = std::max(bound_w.resident, st.planned_resident);
      st.lower_bound_seconds = lower_bound(bound_w, calibrated_rates, rt->cpu_workers());
      st.bound_by = ph.sim.busiest();
    }
  }
  const bool gpu = !cuda_nodes.empty();
  const std::size_t n = sgs.size();
  ph.admitted.assign(n, 0);
  ph.final_elems.assign(n, 0);
  ph.stepped.assign(n, 0);
  ph.speculated.assign(n, 0);
  // The update budget bounds the subgroups in flight; lookahead prefetches take theirs only while
  // room for one more subgroup is left, so that the subgroup being submitted always gets in.
  for (std::size_t i = 0; i < n; ++i) {
    Subgroup* sg = sgs[i].get();
    sg->footprint = gpu ? subgroup_footprint(workload, sg->size, plan.empty() ? PlanSide::cpu : plan[i]) : 0;
    ph.largest_fp = std::max(ph.largest_fp, sg->footprint);
    sg->timeline = timeline_on ? &timeline : nullptr;
    sg->busy = &busy;
    sg->spec_ended.store(false);
    sg->ran_on.store(0);
  }
  window.reset(gpu ? opt.gpu_update_budget : 0);
  // Submission order (OptimizerOptions::submit_order). cpu_first: the subgroups that are not
  // streamed first, then the streamed ones. The CUDA worker runs its tasks in the order they become
  // ready, so in plan order the CPU subgroups' gradient staging waits behind every streamed Adam
  // submitted before it (and that Adam behind its state's H2D): the CPU starves while PCIe waits
  // for the CPU's gradients. Staged first, the CPU's gradients go down at once and the streamed
  // subgroups then follow each other on the link at its full rate. Only when the update budget
  // holds the CPU subgroups' staging and the streaming window together; otherwise plan order.
  ph.cpu_first = gpu && !plan.empty() && submits_cpu_first(workload, plan, execution());
  st.cpu_first = ph.cpu_first;
  if (overlapped)
    ph.submitter = std::thread([this, &ph] {
      for (;;) {
        std::size_t i;
        {
          std::unique_lock<std::mutex> l(ph.q_mu);
          ph.q_cv.wait(l, [&] { return ph.q_closed || !ph.queue.empty(); });
          if (ph.queue.empty()) return;  // closed and drained
          i = ph.queue.front();
          ph.queue.pop_front();
        }
        if (!ph.submit_error.empty()) continue;  // after a failure nothing more is submitted
        try {
          speculate(ph, i);
        } catch (const std::exception& e) {
          ph.submit_error = e.what();
        }
      }
    });
}

void Optimizer::Impl::stage_gradient(OpenStep& ph, std::size_t i) {
  Subgroup* sg = sgs[i].get();
  struct starpu_task* g = make_task(&gather_cl, &sg->gather_grads, &sg->hint_io, where_caller);
  g->handles[0] = sg->h_grad32;
  g->callback_func = record_gather;
  g->callback_arg = sg;
  submit(g, "gradient conversion");
  if ((plan.empty() ? ph.speculated[i] : plan[i] == PlanSide::cpu) && where_caller == STARPU_CUDA && !cuda_nodes.empty()) {
    // The CPU's gradient comes down as soon as it is staged: an asynchronous acquire on main RAM
    // is a fetch, which StarPU serves before prefetches; left to the Adam task's prefetch, it
    // waited behind the streamed subgroups' write-backs and the CPU idled.
    acquire_home(ph, sg->h_grad32, STARPU_R, nullptr);
  }
}

void Optimizer::Impl::scatter_params(Subgroup* sg) {
  struct starpu_task* s = make_task(&scatter_cl, &sg->scatter, &sg->hint_scatter, where_caller);
  s->handles[0] = sg->h_param16;
  s->callback_func = scatter_done;
  s->callback_arg = sg;
  submit(s, "parameter write-back");
  starpu_data_invalidate_submit(sg->h_grad32);  // both staging buffers are dropped once used
  starpu_data_invalidate_submit(sg->h_param16);
}

void Optimizer::Impl::speculate(OpenStep& ph, std::size_t i) {
  Subgroup* sg = sgs[i].get();
  if (!speculable(i) || !ensure_shadow(sg)) return;
  // A streamed subgroup is updated on the GPU: its state goes down (PCIe is idle during backward),
  // the new state is written to the shadow handles there and comes back into the host shadow at
  // once; the old state's device copy is dropped first when memory runs short.
  const bool on_gpu = !plan.empty() && plan[i] == PlanSide::gpu_streamed;
  // its share of the update budget (with the shadow state on the GPU) only if it fits now:
  // nothing gives room back before finish_step, so a speculative update never waits for it
  if (!ph.admitted[i]) {
    const std::size_t fp = sg->footprint + (on_gpu ? 3 * sg->size * sizeof(float) : 0);
    if (!window.try_take(fp, 0)) return;
    sg->footprint = fp;  // what the window gives back when the subgroup's work ends
    ph.admitted[i] = 1;
  }
  sg->step += 1;
  ph.stepped[i] = 1;
  ph.speculated[i] = 1;
  ph.spec_order.push_back(i);
  // its pieces of work: the verdict's (the parameter write-back when kept), and on the GPU the three
  // write-backs of the shadow state
  sg->parts_left.store(1 + (on_gpu ? 3 : 0));
  sg->adam.sp = make_adam_step_params(opt.adam, sg->step);
  sg->hint_update.prefetch = true;
  stage_gradient(ph, i);
  struct starpu_task* a = make_task(&adam_into_cl, &sg->adam, &sg->hint_update, on_gpu ? STARPU_CUDA : STARPU_CPU);
  a->handles[0] = sg->h_master;
  a->handles[1] = sg->h_exp_avg;
  a->handles[2] = sg->h_exp_avg_sq;
  a->handles[3] = sg->h_grad32;
  a->handles[4] = sg->h_param16;
  a->handles[5] = sg->sh_h_master;
  a->handles[6] = sg->sh_h_exp_avg;
  a->handles[7] = sg->sh_h_exp_avg_sq;
  a->callback_func = record_speculative;
  a->callback_arg = sg;
  submit(a, "speculative Adam");
  starpu_data_invalidate_submit(sg->h_grad32);  // a redo stages the gradient again
  if (on_gpu) {
    for (starpu_data_handle_t h : {sg->h_master, sg->h_exp_avg, sg->h_exp_avg_sq}) starpu_data_wont_use(h);
    for (starpu_data_handle_t h : {sg->sh_h_master, sg->sh_h_exp_avg, sg->sh_h_exp_avg_sq}) {
      acquire_home(ph, h, STARPU_R, sg);
      if (wont_use_after_writeback()) starpu_data_wont_use(h);
    }
  }
}

void Optimizer::Impl::declare_final(std::size_t begin, std::size_t end) {
  if (!open) throw Error("gradients_final outside an update phase: call begin_step first");
  if (begin > end || end > nparams)
    throw Error("gradients_final: the range [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") is not inside the optimizer's " + std::to_string(nparams) + " parameters");
  OpenStep& ph = *open;
  if (begin == end) return;
  {  // each element once per step: the range must not meet one declared before
    auto next = ph.declared.lower_bound(begin);
    const bool meets_next = next != ph.declared.end() && next->first < end;
    const bool meets_prev = next != ph.declared.begin() && std::prev(next)->second > begin;
    if (meets_next || meets_prev)
      throw Error("gradients_final: elements of [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") were declared final before in this step (each element once per step)");
    ph.declared.emplace(begin, end);
  }
  // the first subgroup ending after `begin` (subgroups are consecutive in the flat order)
  std::size_t i = std::size_t(std::upper_bound(sgs.begin(), sgs.end(), begin,
                                               [](std::size_t b, const std::unique_ptr<Subgroup>& sg) {
                                                 return b < sg->begin + sg->size;
                                               }) - sgs.begin());
  for (; i < sgs.size() && sgs[i]->begin < end; ++i) {
    Subgroup* sg = sgs[i].get();
    const std::size_t lo = std::max(begin, sg->begin), hi = std::min(end, sg->begin + sg->size);
    if (hi <= lo) continue;
    ph.final_elems[i] += hi - lo;
    if (ph.final_elems[i] == sg->size) {
      {
        std::lock_guard<std::mutex> g(ph.q_mu);
        ph.queue.push_back(i);
      }
      ph.q_cv.notify_one();
    }
  }
}

StepStats Optimizer::Impl::finish(StepVerdict verdict) {
  if (!open) throw Error("finish_step without begin_step");
  OpenStep& ph = *open;
  StepStats& st = ph.st;
  const auto t_finish = std::chrono::steady_clock::now();
  ph.drain();  // every speculative update queued so far is submitted
  if (!ph.submit_error.empty()) {
    ph.pending.wait();
    fail(ph.submit_error);
  }
  for (std::size_t i : ph.spec_order) {
    st.speculated += 1;
    if (sgs[i]->spec_ended.load()) st.hidden_params += sgs[i]->size;
  }
  const bool gpu = !cuda_nodes.empty();
  auto streamed = [&](std::size_t i) { return !plan.empty() && plan[i] == PlanSide::gpu_streamed; };
  try {
    if (verdict == StepVerdict::skip) {
      // nothing of this step is kept: the speculative results are dropped, the step counts restored
      for (std::size_t i : ph.spec_order) {
        sgs[i]->step -= 1;
        starpu_data_invalidate_submit(sgs[i]->h_param16);
        subgroup_part_done(sgs[i].get());
      }
      st.skipped = true;
    } else {
      for (std::size_t i : ph.spec_order) {
        Subgroup* sg = sgs[i].get();
        if (verdict == StepVerdict::changed) {  // redone below from the state before the step
          ph.speculated[i] = 0;
          st.redone += 1;
          starpu_data_invalidate_submit(sg->h_param16);
          continue;
        }
        // kept: the shadow holds the new state (StarPU orders these swaps after the speculative
        // task, which wrote the shadow handles, through the handles themselves)
        std::swap(sg->master, sg->sh_master);
        std::swap(sg->exp_avg, sg->sh_exp_avg);
        std::swap(sg->exp_avg_sq, sg->sh_exp_avg_sq);
        std::swap(sg->h_master, sg->sh_h_master);
        std::swap(sg->h_exp_avg, sg->sh_h_exp_avg);
        std::swap(sg->h_exp_avg_sq, sg->sh_h_exp_avg_sq);
        scatter_params(sg);
      }
      std::vector<std::size_t> stream_order;  // the streamed subgroups, in submission order
      for (std::size_t i = 0; i < sgs.size(); ++i)
        if (streamed(i)) stream_order.push_back(i);
      const std::size_t lookahead = gpu ? opt.stream_lookahead : 0;
      auto prefetch_state = [&](std::size_t i) {
        Subgroup* sg = sgs[i].get();
        if (ph.admitted[i]) return;
        if (!window.try_take(sg->footprint, window.limit ? ph.largest_fp : 0)) return;
        ph.admitted[i] = 1;
        const unsigned node = cuda_nodes[i % cuda_nodes.size()];  // the placement policy's choice
        for (starpu_data_handle_t h : {sg->h_master, sg->h_exp_avg, sg->h_exp_avg_sq})
          starpu_data_prefetch_on_node(h, node, 1);
      };
      const std::vector<std::size_t> order =
          submission_order(plan.empty() ? std::vector<PlanSide>(sgs.size(), PlanSide::cpu) : plan, ph.cpu_first);
      std::size_t next_streamed = 0;  // position in stream_order of the next streamed subgroup
      for (const std::size_t i : order) {
        Subgroup* sg = sgs[i].get();
        const bool is_streamed = streamed(i);
        if (is_streamed && lookahead > 0) {
          // this subgroup's state and that of the next `lookahead` streamed ones are on their way
          for (std::size_t q = next_streamed; q < stream_order.size() && q <= next_streamed + lookahead; ++q)
            prefetch_state(stream_order[q]);
        }
        if (is_streamed) ++next_streamed;
        if (ph.speculated[i]) continue;  // kept above
        if (!ph.admitted[i]) {
          window.take(sg->footprint);
          ph.admitted[i] = 1;
        }
        const bool eager = is_streamed && opt.eager_writeback;
        if (ph.spec_order.empty() || std::find(ph.spec_order.begin(), ph.spec_order.end(), i) == ph.spec_order.end())
          sg->parts_left.store(1 + (eager ? 3 : 0));
        else  // a redone speculative update: its verdict's piece is this write-back; its shadow's may still run
          sg->parts_left.fetch_add(eager ? 3 : 0);
        sg->hint_update.prefetch = !(is_streamed && lookahead > 0);
        if (!ph.stepped[i]) {
          sg->step += 1;
          ph.stepped[i] = 1;
        }
        sg->adam.sp = make_adam_step_params(opt.adam, sg->step);
        sg->ran_on.store(0);
        if (direct_path(i)) {
          // One task: Adam on the state, reading the caller's gradients and writing its parameters in
          // place (their dtype), so nothing but the state crosses PCIe and the CUDA worker runs one
          // task per subgroup.
          submit(adam_task(sg, &adam_direct_cl, &sg->adam_direct, STARPU_CUDA, adam_direct_done), "Adam");
          if (eager) write_back(ph, sg, STARPU_R, true);
          continue;
        }
        stage_gradient(ph, i);
        struct starpu_task* a = adam_task(sg, &adam_cl, &sg->adam, STARPU_CPU | STARPU_CUDA, record_worker);
        a->handles[3] = sg->h_grad32;
        a->handles[4] = sg->h_param16;
        submit(a, "Adam");
        scatter_params(sg);
        if (eager) write_back(ph, sg, STARPU_R, true);
      }
    }
  } catch (const std::exception& e) {
    ph.pending.wait();  // the acquires already made call back into `pending` and the subgroups
    fail(e.what());
  }
  // The phase ends when every subgroup's state is safe in host memory and nowhere else (pure
  // offload: nothing of the state stays valid on the GPU; after an eager write-back this moves no
  // data, it only invalidates the device copy). Resident subgroups keep their state on the GPU.
  for (std::size_t i = 0; i < sgs.size(); ++i) {
    if (!plan.empty() && plan[i] == PlanSide::gpu_resident) continue;
    write_back(ph, sgs[i].get(), STARPU_RW, false);
  }
  ph.pending.wait();  // every callback has run: nothing refers to `pending` any more
  if (ph.refused) fail("StarPU refused to bring " + std::to_string(ph.refused) + " buffer(s) back to host memory");
  starpu_task_wait_for_all();
  ph.sampling.store(false);
  if (ph.sampler.joinable()) ph.sampler.join();
  st.window_peak_bytes = window.limit ? window.peak : 0;
  for (unsigned node : cuda_nodes) {
    const starpu_ssize_t total = starpu_memory_get_total(node), avail = starpu_memory_get_available(node);
    if (total > 0 && avail >= 0) st.gpu_bytes_end += std::uint64_t(total - avail);
  }
  if (timeline_on) {
    std::lock_guard<std::mutex> g(timeline.mu);
    st.timeline = timeline.tasks;
  }
  const auto t_end = std::chrono::steady_clock::now();
  st.seconds = std::chrono::duration<double>(t_end - ph.t0).count();
  st.exposed_seconds = std::chrono::duration<double>(t_end - t_finish).count();
  read_bus_bytes(&st.bytes_h2d, &st.bytes_d2h);
  st.bytes_h2d -= ph.h2d0;
  st.bytes_d2h -= ph.d2h0;
  if (ph.pending.last_subgroup_part_us > 0)
    st.stream_end_seconds = 1e-6 * (ph.pending.last_subgroup_part_us - timeline.t0_us);
  {
    std::lock_guard<std::mutex> g(busy.mu);
    st.cpu_busy_seconds = busy.cpu;
    st.gpu_busy_seconds = busy.gpu;
    st.cpu_adam_seconds = busy.cpu_adam;
  }
  st.params = nparams;
  for (std::size_t i = 0; i < sgs.size(); ++i) {
    const auto& sg = sgs[i];
    if (sg->step > st.step) st.step = sg->step;
    if (st.skipped) continue;
    const bool on_gpu = sg->ran_on.load() == 2;
    (on_gpu ? st.subgroups_gpu : st.subgroups_cpu) += 1;
    st.placement.push_back(!on_gpu ? PlanSide::cpu
                                   : (!plan.empty() && plan[i] == PlanSide::gpu_resident ? PlanSide::gpu_resident
                                                                                         : PlanSide::gpu_streamed));
  }
  // Forced plans are real measurements too. The refinement reads no bus counter (which the
  // timeline's sampler also reads), so it runs with a timeline as without; not after a phase opened
  // by begin_step (its clock starts with the caller's backward, and its busy times include what the
  // caller's work slowed down) or skipped.
  last_changed = st.overlapped && verdict == StepVerdict::changed;
  if (!st.skipped && !st.overlapped) refine(st, ph.sim);
  StepStats out = std::move(st);
  open.reset();
  return out;
}

StepStats Optimizer::step() {
  impl_->begin(false);
  return impl_->finish(StepVerdict::keep);
}
void Optimizer::begin_step() { impl_->begin(true); }
void Optimizer::gradients_final(std::size_t begin, std::size_t end) { impl_->declare_final(begin, end); }
StepStats Optimizer::finish_step(StepVerdict verdict) { return impl_->finish(verdict); }
bool Optimizer::step_open() const { return impl_->open != nullptr; }

std::vector<std::int64_t> Optimizer::step_counts() const {
  std::vector<std::int64_t> out;
  for (const auto& sg : impl_->sgs) out.push_back(sg->step);
  return out;
}

void Optimizer::load_state(const float* master, const float* exp_avg, const float* exp_avg_sq,
                           const std::vector<std::int64_t>& steps) {
  std::size_t at = 0;  // subgroups are consecutive in the flat order
  load_state_in_place(steps, [&](const std::vector<HostStateOut>& state) {
    for (const HostStateOut& sg : state) {
      std::memcpy(sg.master, master + at, sg.size * sizeof(float));
      std::memcpy(sg.exp_avg, exp_avg + at, sg.size * sizeof(float));
      std::memcpy(sg.exp_avg_sq, exp_avg_sq + at, sg.size * sizeof(float));
      at += sg.size;
    }
  });
}

void Optimizer::load_state_in_place(const std::vector<std::int64_t>& steps,
                                    const std::function<void(const std::vector<HostStateOut>&)>& fill) {
  Impl& I = *impl_;
  I.require_no_open_step("load_state");
  if (steps.size() != I.sgs.size())
    throw Error("the state to load has " + std::to_string(steps.size()) + " subgroup step counts; this optimizer has " +
                std::to_string(I.sgs.size()) + " subgroups");
  for (std::int64_t st : steps)
    if (st < 0) throw Error("a subgroup step count in the state to load is negative (" + std::to_string(st) + ")");
  starpu_task_wait_for_all();
  I.hold_state<HostStateOut>(STARPU_W, [&](const std::vector<HostStateOut>& state) {  // device copies invalidated
    try {
      fill(state);
    } catch (const std::exception& e) {  // partly replaced: this optimizer must not step again
      I.broken = std::string("loading a state failed part-way: ") + e.what();
      throw;
    }
  });
  for (std::size_t i = 0; i < I.sgs.size(); ++i) I.sgs[i]->step = steps[i];
  // the caller's parameters: the loaded master rounded to their dtype, written where they live
  for (auto& sg : I.sgs) {
    struct starpu_task* c = I.make_task(&cast_cl, &sg->adam, &sg->hint_io, I.where_caller);
    c->handles[0] = sg->h_master;
    c->handles[1] = sg->h_param16;
    submit(c, "parameter cast");
    struct starpu_task* s = I.make_task(&scatter_cl, &sg->scatter, &sg->hint_io, I.where_caller);
    s->handles[0] = sg->h_param16;
    submit(s, "parameter write-back");
    starpu_data_invalidate_submit(sg->h_param16);
  }
  starpu_task_wait_for_all();
  I.keep_master_on_host_only();
}

void Optimizer::set_plan_override(const PlanOverride& o) {
  if (!impl_->rt->model_policy())
    throw Error("a forced plan (--k, --gpu-fraction) needs a plan with the model's rates (--policy dos), not " +
                impl_->choice.name);
  if (o.kind == PlanOverride::fraction && !(o.value >= 0 && o.value <= 1))
    throw Error("the streamed fraction must be in [0, 1], got " + std::to_string(o.value));
  if (o.kind == PlanOverride::stride && !(o.value >= 1 && o.value == std::floor(o.value)))
    throw Error("the stride k must be a whole number >= 1, got " + std::to_string(o.value));
  impl_->override_ = o;
}
void Optimizer::set_timeline(bool on) { impl_->timeline_on = on; }
void Optimizer::set_hyper(const AdamHyper& h) {
  impl_->require_no_open_step("set_hyper");
  validate_adam_hyper(h);
  impl_->opt.adam = h;  // step() derives each subgroup's constants from it
}
const AdamHyper& Optimizer::hyper() const { return impl_->opt.adam; }
const Rates& Optimizer::rates() const { return impl_->rates; }
const Workload& Optimizer::workload() const { return impl_->workload; }
const Rates& Optimizer::calibrated_rates() const { return impl_->calibrated_rates; }
Execution Optimizer::execution() const { return impl_->execution(); }
std::vector<PlanSide> Optimizer::next_plan() const { return impl_->make_plan(); }

std::size_t Optimizer::num_params() const { return impl_->nparams; }
std::size_t Optimizer::num_subgroups() const { return impl_->sgs.size(); }
std::size_t Optimizer::subgroup_size(std::size_t i) const { return impl_->sgs.at(i)->size; }
std::int64_t Optimizer::step_count(std::size_t i) const { return impl_->sgs.at(i)->step; }
void Optimizer::with_host_state(const std::function<void(const std::vector<HostState>&)>& fn) const {
  impl_->require_no_open_step("with_host_state");
  impl_->hold_state<HostState>(STARPU_R, fn);  // waits for the tasks writing the state, fetches it home
}

void Optimizer::read_master(float* out) const { impl_->read_state(out, &Subgroup::master, &Subgroup::h_master); }
void Optimizer::read_exp_avg(float* out) const {
  impl_->read_state(out, &Subgroup::exp_avg, &Subgroup::h_exp_avg);
}
void Optimizer::read_exp_avg_sq(float* out) const {
  impl_->read_state(out, &Subgroup::exp_avg_sq, &Subgroup::h_exp_avg_sq);
}

}  // namespace dos
