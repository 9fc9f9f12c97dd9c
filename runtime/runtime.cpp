// The runtime core: StarPU's lifetime, the worker threads' binding and the scheduling policy's
// selection (Runtime). The optimizer is in optimizer.cpp and update_phase.cpp.
#include <omp.h>
#include <unistd.h>
#include <starpu.h>
#include <starpu_profiling.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../codelets/codelets.h"
#include "../codelets/cpu_team.h"
#include "../codelets/kernels/env_choice.h"
#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>

#include "../codelets/kernels/adam.h"
#include "../codelets/kernels/pcie_copy.h"
#endif
#include "../scheduler/policy.h"
#include "dos.h"
#include "runtime_impl.h"

namespace dos {

// ---------------------------------------------------------------------------------------------
// Runtime
// (Runtime::Impl, which the Optimizer reads too, is in runtime_impl.h.)

// StarPU runs once per process: one live Runtime at a time. An Optimizer needs StarPU until it is
// destroyed: a Runtime destroyed first defers starpu_shutdown to the last Optimizer.
namespace {
int g_live_runtimes = 0;
}  // namespace
namespace detail {  // shared with Optimizer::Impl (runtime_impl.h)
int g_live_optimizers = 0;
bool g_shutdown_deferred = false;
}  // namespace detail
using namespace detail;

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
  team_bind_mode();  // DOS_TEAM_BIND read (and a bad value named) now, whatever the tasks' sizes
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

/// What preload_cuda_worker found on the CUDA workers: one line per worker whose device could not
/// load a kernel (empty: every worker loaded every kernel). Written under mu.
struct KernelPreload {
  std::mutex mu;
  std::string failures;
};

/// Runs on each CUDA worker's driver thread: loads the runtime's kernels into its device's context
/// (preload_adam_kernels in codelets/kernels/adam.h says why). A failure is noted in the
/// KernelPreload and cleared from the thread's last CUDA error, which the codelets read after each
/// launch: the worker goes on as before the preload, its kernels left to their first launch.
void preload_cuda_worker(void* arg) {
#if defined(DOS_HAVE_CUDA)
  auto* p = static_cast<KernelPreload*>(arg);
  const int adam = preload_adam_kernels(), copy = preload_pcie_copy_kernels();
  if (adam == 0 && copy == 0) return;
  (void)cudaGetLastError();
  const int e = adam != 0 ? adam : copy;
  const char* what = adam != 0 && copy != 0 ? "the Adam, conversion and PCIe copy kernels"
                     : adam != 0            ? "the Adam and conversion kernels"
                                            : "the PCIe copy kernels";
  int dev = -1, major = 0, minor = 0;
  const bool cc = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  (void)cudaGetLastError();
  const bool no_code = e == int(cudaErrorNoKernelImageForDevice) || e == int(cudaErrorInvalidDeviceFunction);
  std::string line = std::string("[dos] warning: ") + what + " could not be loaded on CUDA device " +
                     std::to_string(starpu_worker_get_devid(starpu_worker_get_id())) + " (" +
                     cudaGetErrorString(cudaError_t(e)) +
                     "): a task that launches one there will abort the process (with the model's buffers on that "
                     "GPU, the CPU-updated subgroups' gradient and parameter copies launch them too)";
  if (no_code)
    line += std::string("; this build has no code for that GPU") +
            (cc ? " (compute capability " + std::to_string(major) + "." + std::to_string(minor) +
                      "): add " + std::to_string(major) + std::to_string(minor) +
                      " to meson's gpu_arch option (default 80,90; meson configure build -Dgpu_arch=80,90," +
                      std::to_string(major) + std::to_string(minor) + ") and rebuild"
                : ": add its compute capability to meson's gpu_arch option and rebuild") +
            ", or leave the GPU out (CUDA_VISIBLE_DEVICES, or no CUDA worker: dos-train --ncuda 0)";
  std::lock_guard<std::mutex> g(p->mu);
  p->failures += line + "\n";
#else
  (void)arg;
#endif
}

}  // namespace

std::string resolve_policy(const std::string& given) {
  if (!given.empty()) return given;
  const char* env = std::getenv("STARPU_SCHED");
  return env && *env ? env : "cpu";
}

namespace {
/// StarPU 1.3.10 keeps its performance models and bus calibration under $STARPU_PERF_MODEL_DIR, else
/// HOME/.starpu/sampling with HOME the first of $XDG_CACHE_HOME, $STARPU_HOME, $HOME, $TMPDIR,
/// $TEMP, $TMP, /tmp (src/common/utils.c: _starpu_get_home_path; src/core/perfmodel/perfmodel.c:
/// _starpu_set_perf_model_dirs, which also makes codelets/45 and bus in it), and aborts the process
/// (STARPU_ABORT, a backtrace) when it cannot create them: a read-only home on a cluster. Made here
/// first, so that such a home is an Error that says what to set; also a bus folder that cannot be
/// written without this host's calibration in it, and, where a StarPU policy places the tasks
/// (starpu_places: it writes the codelets' models at shutdown), a codelets folder that cannot be. (A StarPU configured with its own
/// --with-perf-model-dir may look elsewhere: STARPU_PERF_MODEL_DIR then names a folder for both.)
void check_starpu_folders(bool starpu_places) {
  std::string dir;
  const char* from = "STARPU_PERF_MODEL_DIR";
  // a variable set but empty counts as set, as StarPU's getenv reads it
  if (const char* p = std::getenv("STARPU_PERF_MODEL_DIR")) {
    dir = p;
  } else {
    const char* home = nullptr;
    for (const char* name : {"XDG_CACHE_HOME", "STARPU_HOME", "HOME", "TMPDIR", "TEMP", "TMP"})
      if (const char* v = std::getenv(name)) {
        home = v;
        from = name;
        break;
      }
    if (!home) home = "/tmp", from = "the fallback /tmp";
    dir = std::string(home) + "/.starpu/sampling";
  }
  const std::string advice = ": it would abort the process. Set STARPU_PERF_MODEL_DIR to a writable folder (StarPU "
                             "prefers $XDG_CACHE_HOME, then $STARPU_HOME, then $HOME for it otherwise)";
  for (const std::string& sub : {dir, dir + "/codelets/45", dir + "/bus"}) {
    std::error_code ec;
    std::filesystem::create_directories(sub, ec);
    if (ec || !std::filesystem::is_directory(sub))
      throw Error("StarPU keeps its performance models and bus calibration in " + dir + " (from " + from +
                  ") and cannot create " + sub + (ec ? " (" + ec.message() + ")" : " (not a folder)") + advice);
  }
  // a folder that exists but cannot be written: StarPU calibrates the bus, and writes the result
  // there, unless this host's calibration is there already (files named after the host)
  const std::string bus = dir + "/bus";
  if (::access(bus.c_str(), W_OK) != 0) {
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    bool calibrated = false;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(bus, ec))
      if (e.path().filename().string().rfind(std::string(host) + ".", 0) == 0) calibrated = true;
    if (!calibrated)
      throw Error("StarPU keeps its bus calibration in " + bus + " (from " + from + "), which holds none for this "
                  "host (" + host + ") and cannot be written, so StarPU could not save the calibration it makes" +
                  advice);
  }
  // a StarPU policy that places the tasks itself (dmda, ...) calibrates the codelets' performance
  // models and writes them when StarPU shuts down, aborting there when it cannot
  const std::string codelets = dir + "/codelets/45";
  if (starpu_places && ::access(codelets.c_str(), W_OK) != 0)
    throw Error("StarPU's own policies write the tasks' performance models into " + codelets + " (from " + from +
                ") when StarPU shuts down, and it cannot be written" + advice);
}
}  // namespace

Runtime::Runtime(const RuntimeOptions& options) : impl_(new Impl) {
  if (g_live_runtimes > 0)
    throw Error("a dos::Runtime already exists in this process (StarPU runs once per process): use that one");
  if (g_shutdown_deferred)
    throw Error("the previous dos::Runtime was destroyed, but StarPU still runs for " +
                std::to_string(g_live_optimizers) + " Optimizer(s) that outlived it: destroy them before making a "
                "new Runtime");
  // The options and the environment's worker counts are checked before anything is changed (the
  // environment included), so that a refused Runtime leaves the process as it was.
  const std::vector<int> process_cores = allowed_cores();  // before StarPU starts its threads
  if (options.cpu_threads < 0)
    throw Error("cpu_threads must be >= 0 (0: automatic), got " + std::to_string(options.cpu_threads));
  {
    // above the process's cores its threads share cores (a warning below: an affinity narrowed by
    // OMP_PROC_BIND or a rank's placement may be the caller's intent); far above the machine's, a
    // mistake
    const std::size_t machine = std::max<std::size_t>(std::thread::hardware_concurrency(), process_cores.size());
    if (machine > 0 && std::size_t(options.cpu_threads) > 4 * machine)
      throw Error("cpu_threads " + std::to_string(options.cpu_threads) + " is more than 4 times the " +
                  std::to_string(machine) + " cores of this machine, most likely a mistake: give the " +
                  std::to_string(process_cores.empty() ? machine : process_cores.size()) +
                  " cores this process may use or fewer (0: automatic; up to " + std::to_string(4 * machine) +
                  " are taken, their threads sharing cores)");
  }
  if (options.cpu_workers < 0) throw Error("cpu_workers must be >= 0, got " + std::to_string(options.cpu_workers));
  if (options.ncuda < -1)
    throw Error("ncuda must be >= -1 (-1: one CUDA worker per visible GPU, 0: none), got " +
                std::to_string(options.ncuda));
  if (options.node_ranks < 1) throw Error("node_ranks must be >= 1, got " + std::to_string(options.node_ranks));
  // StarPU's worker counts from the environment: StarPU aborts the process on one that is not a
  // whole number (its STARPU_ASSERT), so they are checked here first
  for (const char* name : {"STARPU_NCPU", "STARPU_NCPUS", "STARPU_NCUDA"})
    if (const char* v = std::getenv(name); v && *v) {
      long n = 0;
      if (!detail::whole_number_in(v, 0, LONG_MAX, &n))
        throw Error(std::string("the environment's ") + name + "=" + v +
                    " is not a worker count (a whole number >= 0): correct it or unset it");
    }
  if (!process_cores.empty() && std::size_t(options.cpu_threads) > process_cores.size() && options.verbose)
    std::fprintf(stderr, "[dos] warning: cpu_threads %d is more than the %zu cores this process may use: CPU Adam's "
                         "threads will share cores (slower)\n", options.cpu_threads, process_cores.size());
  const char* env_sched = std::getenv("STARPU_SCHED");
  const std::string requested = resolve_policy(options.policy);
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
  // before this constructor changes the environment: a refusal leaves it as it was
  check_starpu_folders(impl_->choice.builtin());
  // ...and only for starpu_init: the caller's STARPU_SCHED comes back when this constructor ends
  // (a later Runtime given no policy reads it again)
  struct RestoreSched {
    bool had;
    std::string value;
    ~RestoreSched() {
      if (had) setenv("STARPU_SCHED", value.c_str(), 1);
    }
  } restore_sched{env_sched != nullptr, env_sched ? env_sched : ""};
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
    // StarPU reads its limit in MiB (src/drivers/cuda/driver_cuda.c), rounded up here so that the
    // budgets fit; the option wins over the environment, with a word when they differ.
    const std::size_t l = options.gpu_memory_limit;  // MiB rounded up, at most what StarPU's int holds
    const std::string mib = std::to_string(std::min<std::size_t>(l / (1u << 20) + (l % (1u << 20) != 0), INT_MAX));
    const char* env_limit = std::getenv("STARPU_LIMIT_CUDA_MEM");
    if (env_limit && mib != env_limit && options.verbose)
      std::fprintf(stderr, "[dos] warning: STARPU_LIMIT_CUDA_MEM=%s is replaced by the GPU budgets (%s MiB)\n",
                   env_limit, mib.c_str());
    setenv("STARPU_LIMIT_CUDA_MEM", mib.c_str(), 1);
  }

  struct starpu_conf conf;
  starpu_conf_init(&conf);
  if (impl_->choice.builtin()) {  // a registered StarPU policy by its struct, a built-in by its name
    conf.sched_policy = impl_->choice.starpu_policy;
    conf.sched_policy_name = conf.sched_policy ? nullptr : impl_->choice.name.c_str();
  } else {
    conf.sched_policy_name = nullptr;
    conf.sched_policy = &placement_policy;
  }
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
  node_ranks_ = options.node_ranks;
  const int ret = starpu_init(&conf);
  if (ret == 0) ++g_live_runtimes;
  if (ret == -ENODEV) throw ResourceError("StarPU found no worker to run on (starpu_init returned -ENODEV)");
  if (ret != 0) throw ResourceError("StarPU failed to start (starpu_init returned " + std::to_string(ret) + ")");

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
  // CPU workers asked for, in StarPU's precedence (its environment overrides its conf:
  // src/core/workers.c; STARPU_NCPU before the older STARPU_NCPUS): StarPU 1.3 starts fewer where
  // it counts fewer cores (or its build's STARPU_MAXCPUS), and says so only on a line of its own
  {
    long asked = options.cpu_workers;
    std::string from = "cpu_workers " + std::to_string(asked);
    for (const char* name : {"STARPU_NCPUS", "STARPU_NCPU"})  // the later one wins
      if (const char* v = std::getenv(name); v && *v) {
        asked = std::strtol(v, nullptr, 10);
        from = std::string("the environment's ") + name + "=" + v;
      }
    const long started = long(starpu_cpu_worker_get_count());
    if (options.cpu_workers > 0 && asked != options.cpu_workers && options.verbose)
      std::fprintf(stderr, "[dos] warning: %s overrides cpu_workers %d (StarPU's environment wins over its "
                           "configuration): %ld CPU worker(s) started\n", from.c_str(), options.cpu_workers, started);
    if (asked > 0 && started < asked) {
      starpu_shutdown();
      --g_live_runtimes;
      throw Error(from + " asks for " + std::to_string(asked) + " CPU workers and StarPU started " +
                  std::to_string(started) + " (it starts at most one per core it counts on this machine): ask for at "
                  "most " + std::to_string(started));
    }
  }
  if (options.ncuda > 0 && options.cuda_device < 0 && int(ncuda) < options.ncuda) {
    starpu_shutdown();
    --g_live_runtimes;
    throw Error("ncuda " + std::to_string(options.ncuda) + " CUDA workers were asked for and StarPU started " +
                std::to_string(ncuda) + " (one per GPU it sees, within $STARPU_NCUDA, $STARPU_WORKERS_CUDAID and "
                "$CUDA_VISIBLE_DEVICES when set): ask for at most " + std::to_string(ncuda) +
                ", or -1 for one per visible GPU");
  }
  // The runtime's kernels are loaded now, before any transfer is queued: under CUDA's lazy loading
  // a kernel's first launch could otherwise wait behind the first phase's state uploads.
  // DOS_PRELOAD_KERNELS=0 leaves them to their first launch (a measurement switch).
  // A device that cannot load them (a build without code for it) is warned about, not refused: work
  // that launches no kernel there (every update on the CPU with the model's buffers in host memory)
  // runs as before.
  static const bool preload_kernels = detail::env_choice("DOS_PRELOAD_KERNELS", {"0", "1"}, 1, "1 is used") == 1;
  if (ncuda > 0 && preload_kernels) {
    KernelPreload preload;
    starpu_execute_on_each_worker(preload_cuda_worker, &preload, STARPU_CUDA);
    if (!preload.failures.empty()) std::fputs(preload.failures.c_str(), stderr);
  }
  // OpenMP threads per CPU worker: the cores (given, $OMP_NUM_THREADS, one per worker for processes
  // that oversubscribe the cores, or all but one per CUDA worker and the caller's) shared among the
  // CPU workers.
  const char* env_omp = std::getenv("OMP_NUM_THREADS");
  const int omp = env_omp ? std::max(0, std::atoi(env_omp)) : 0;
  if (options.cpu_threads <= 0 && omp > 0 && !process_cores.empty() && std::size_t(omp) > process_cores.size() &&
      options.verbose)
    std::fprintf(stderr, "[dos] warning: OMP_NUM_THREADS=%s is more than the %zu cores this process may use: CPU "
                         "Adam's threads will share cores (slower); give at most %zu, or unset it\n",
                 env_omp, process_cores.size(), process_cores.size());
  const int ncpuw = int(starpu_cpu_worker_get_count());
  const int threads = team_threads_per_worker(options.cpu_threads, omp, !options.unbound_reason.empty(),
                                              process_cores.size(), int(ncuda), options.caller_cores, ncpuw);
  cpu_threads_ = threads;
  WorkerSetup ws;
  ws.threads = threads;
  // Binding (cpu_team.h): each CUDA driver thread on a core of its own (the first cores of the
  // process's set), the CPU workers' teams on the cores after them, one thread per core. Skipped
  // when OpenMP binds its threads (OMP_PROC_BIND other than false, or OMP_PLACES: openmp_binds), when DOS_BIND=0, or when the
  // cores are too few for one each.
  const bool bind_off = detail::env_choice("DOS_BIND", {"0", "1"}, 1, "the threads are bound as without it") == 0;
  const bool user_binds = openmp_binds();
  const std::size_t needed = ncuda + std::size_t(ncpuw) * std::size_t(threads);
  if (user_binds) binding_ = "OpenMP's own (OMP_PROC_BIND/OMP_PLACES)";
  else if (!options.unbound_reason.empty()) binding_ = "none (" + options.unbound_reason + ")";
  else if (bind_off) binding_ = "none (DOS_BIND=0)";
  else if (process_cores.size() < needed)
    binding_ = "none (" + std::to_string(needed) + " threads, " + std::to_string(process_cores.size()) + " cores)";
  else {
    DriverSetup ds;
    ds.cores.assign(process_cores.begin(), process_cores.begin() + ncuda);
    if (ncuda > 0) cuda_driver_core_ = ds.cores.front();
    if (ncuda > 0) starpu_execute_on_each_worker(setup_cuda_worker, &ds, STARPU_CUDA);
    ws.team_cores.assign(process_cores.begin() + ncuda, process_cores.begin() + std::ptrdiff_t(needed));
    binding_ = (ncuda ? "CUDA driver(s) on core " + core_list_string(ds.cores) + ", " : std::string()) +
               "CPU team(s) on cores " + core_list_string(ws.team_cores);
  }
  starpu_execute_on_each_worker(setup_cpu_worker, &ws, STARPU_CPU);
  // (threads beyond the process's cores were warned about above, with their cause)
  if (ws.min_cores.load() < threads && options.verbose &&
      (process_cores.empty() || std::size_t(threads) <= process_cores.size()))
    std::fprintf(stderr, "[dos] warning: a CPU worker may run on only %d core(s) but has %d OpenMP threads: its threads "
                         "share cores (is STARPU_WORKERS_NOBIND=0 or a cgroup limiting the process?)\n",
                 ws.min_cores.load(), threads);
  worker_cores_ = ws.min_cores.load();
  omp_team_ = ws.team.load();
  // StarPU's task profiling stays off: the runtime clocks its tasks itself (task_clock.h), because
  // StarPU 1.3 (and 1.4 before 1.4.5) reads the GPU's energy counter through NVML around every CUDA
  // task when profiling is on, which costs milliseconds per task on some machines. STARPU_PROFILING=1
  // in the environment turns it on anyway: say what that costs (whatever the verbosity: a warning).
  if (ncuda > 0 && starpu_profiling_status_get() == STARPU_PROFILING_ENABLE)
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

double clock_seconds() { return 1e-6 * starpu_timing_now(); }

std::size_t gpu_memory_for_budgets(std::size_t elements, std::size_t subgroup_size, std::size_t param_bytes,
                                   std::size_t grad_bytes, std::size_t update_budget, std::int64_t resident_budget,
                                   bool speculative) {
  if (subgroup_size == 0) throw Error("gpu_memory_for_budgets: subgroup_size must be >= 1");
  if (resident_budget < -1)
    throw Error("gpu_memory_for_budgets: resident_budget must be -1 (none), 0 or a byte count, got " +
                std::to_string(resident_budget));
  for (const std::size_t b : {param_bytes, grad_bytes})
    if (b != 2 && b != 4)
      throw Error("gpu_memory_for_budgets: param_bytes and grad_bytes must be 2 or 4, got " + std::to_string(b));
  if (update_budget == 0 || elements == 0) return 0;
  const std::size_t kMax = std::numeric_limits<std::size_t>::max();
  const auto times = [&](std::size_t n, std::size_t f) { return f != 0 && n > kMax / f ? kMax : n * f; };
  const auto plus = [&](std::size_t a, std::size_t b) { return a > kMax - b ? kMax : a + b; };
  std::size_t f = 12 + grad_bytes + param_bytes;
  if (speculative) f += 16 + param_bytes;
  // a state buffer's padding beyond its 12 bytes per element (state_bytes_for): of the first
  // subgroup, and of all of them (full ones and the tail); twice with the shadow state
  // (state_bytes_for(n) - 12 n, taken on n % 16 so that it cannot overflow for any n)
  const auto pad = [](std::size_t n) { return state_bytes_for(n % 16) - 12 * (n % 16); };
  const std::size_t first = std::min(subgroup_size, elements);
  const std::size_t pad_all = plus(times(elements / subgroup_size, pad(subgroup_size)), pad(elements % subgroup_size));
  const std::size_t copies = speculative ? 2 : 1;
  const std::size_t budget = speculative ? times(update_budget, 2) : update_budget;
  const std::size_t one = plus(times(first, f), copies * pad(first));
  const std::size_t all = plus(times(elements, f), times(pad_all, copies));
  const std::size_t phase = std::min(std::max(budget, one), all);
  const std::uint64_t r = resident_budget <= 0 ? 0 : std::uint64_t(resident_budget);
  const std::size_t state = plus(times(elements, 12), pad_all);
  const std::size_t resident = std::size_t(std::min<std::uint64_t>(r, state));
  return plus(phase, resident);
}

}  // namespace dos
