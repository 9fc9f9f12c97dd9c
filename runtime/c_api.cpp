// The C ABI of the runtime (dos_c.h): every entry point catches every exception and turns it into
// a status code and a thread-local message, so that no C++ exception or type crosses the boundary.
//
// Between calls, StarPU's workers are paused (starpu_pause): StarPU 1.3's drivers poll for tasks
// in a tight loop unless built with --enable-blocking-drivers, and a caller that computes between
// update phases (a PyTorch training loop: forward and backward on the same cores) lost most of
// its CPU to them (a tiny GPT on the 2-core CI machine: forward+backward 4 s instead of 0.35 s per
// step). Every entry point that may submit StarPU work resumes the workers first. A
// phase left running (dos_optimizer_finish_step_async, dos_optimizer_step_async) pauses them again
// as soon as its tasks have ended, from a thread of its own, not at dos_optimizer_wait_step: the
// caller's next forward and backward run between the two.
#include "dos_c.h"

#include <starpu.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "c_api_convert.h"
#include "dos.h"

struct dos_runtime {
  std::unique_ptr<dos::Runtime> rt;
};
struct Active;
struct dos_optimizer {
  // Declared first, destroyed last: StarPU's workers stay awake while `opt` is torn down.
  std::unique_ptr<Active> open_phase;  // the workers held running while an overlapped phase is open
  // A phase left running: holds the phase's Active until the phase's tasks have ended
  // (Optimizer::wait_step_work). Joined before wait_step and before `opt` goes.
  std::thread pauser;
  std::unique_ptr<dos::Optimizer> opt;
  std::size_t ntensors = 0;  // the tensors it was created over (checked before a caller's array is read)
  // The last ended phase's timeline (dos_optimizer_last_timeline) and start (runtime clock, s).
  std::vector<dos::TimelineTask> last_timeline;
  double last_started_at = 0;
  void join_pauser() {
    if (pauser.joinable()) pauser.join();
  }
  ~dos_optimizer();
};

namespace {

thread_local std::string g_last_error;

// StarPU is up while a runtime made here lives, or while optimizers made here outlive it (the
// Runtime defers starpu_shutdown to the last Optimizer).
std::mutex g_mu;
int g_runtimes = 0, g_optimizers = 0, g_active = 0;
bool g_paused = false;

}  // namespace

/// Workers running for the lifetime of this object (nestable, thread-safe); paused again when the
/// last one ends and StarPU is still up. An open overlapped phase holds one from
/// dos_optimizer_begin_step to dos_optimizer_finish_step: its speculative updates run on the CPU
/// workers while the caller computes.
struct Active {
  Active() {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_paused) {
      starpu_resume();
      g_paused = false;
    }
    ++g_active;
  }
  ~Active() {
    std::lock_guard<std::mutex> l(g_mu);
    if (--g_active == 0 && (g_runtimes > 0 || g_optimizers > 0) && !g_paused) {
      starpu_pause();
      g_paused = true;
    }
  }
  Active(const Active&) = delete;
  Active& operator=(const Active&) = delete;
};

dos_optimizer::~dos_optimizer() {
  join_pauser();
  // an open phase is dropped (as DOS_VERDICT_SKIP) before the optimizer goes: nothing of it is kept
  if (opt && opt->step_open()) {
    try {
      if (opt->step_running()) opt->wait_step();  // a phase finished asynchronously runs to its end
      else opt->finish_step(dos::StepVerdict::skip);
    } catch (...) {
    }
  }
  opt.reset();
}

namespace {

void count(int* counter, int delta) {
  std::lock_guard<std::mutex> l(g_mu);
  *counter += delta;
}

/// Deletes a handle made by one of the create functions (StarPU resumed while it runs, a throwing
/// destructor swallowed: destroy functions cannot report) and takes it off the live count.
template <class Handle>
void destroy_handle(Handle* h, int* counter) {
  if (!h) return;
  Active active;
  try {
    delete h;
  } catch (...) {
  }
  count(counter, -1);
}

int fail(int code, const std::string& msg) {
  g_last_error = msg;
  return code;
}

/// Runs f, mapping exceptions to status codes, the message led by the C call's name `fn`:
/// dos::Error and std::invalid_argument are bad input when `invalid_is_input` (creation,
/// set_hyper); dos::ResourceError (StarPU, host memory) and everything else are runtime failures.
template <class F>
int guarded(const char* fn, F&& f, bool invalid_is_input = true) {
  try {
    f();
    return DOS_OK;
  } catch (const std::invalid_argument& e) {
    return fail(DOS_E_INVALID, dos::c_api::named(fn, e.what()));
  } catch (const dos::ResourceError& e) {
    return fail(DOS_E_RUNTIME, dos::c_api::named(fn, e.what()));
  } catch (const dos::UsageError& e) {
    return fail(DOS_E_INVALID, dos::c_api::named(fn, e.what(), true));
  } catch (const dos::Error& e) {
    return fail(invalid_is_input ? DOS_E_INVALID : DOS_E_RUNTIME, dos::c_api::named(fn, e.what()));
  } catch (const std::bad_alloc&) {
    return fail(DOS_E_RUNTIME, dos::c_api::named(fn, "out of host memory"));
  } catch (const std::exception& e) {
    return fail(DOS_E_RUNTIME, dos::c_api::named(fn, e.what()));
  } catch (...) {
    return fail(DOS_E_RUNTIME, dos::c_api::named(fn, "unknown C++ exception"));
  }
}

/// copy_stats, keeping the phase's timeline and start in `opt` for dos_optimizer_last_timeline.
void keep_stats(dos_optimizer* opt, const dos::StepStats& s, dos_step_stats* stats) {
  opt->last_timeline = s.timeline;
  opt->last_started_at = s.started_at;
  dos::c_api::copy_stats(s, stats);
}

/// DOS_E_INVALID naming `fn` when a phase of `opt` is open (the calls that read or replace the
/// state, the hyper-parameters or run a plain step), else DOS_OK.
int refuse_if_open(const dos_optimizer* opt, const char* fn) {
  if (opt && opt->opt && opt->opt->step_running())
    return fail(DOS_E_INVALID, std::string(fn) + ": an update phase still runs (dos_optimizer_finish_step_async or "
                                                 "dos_optimizer_step_async without dos_optimizer_wait_step): wait "
                                                 "for it first");
  if (opt && opt->opt && opt->opt->step_open())
    return fail(DOS_E_INVALID, std::string(fn) + ": an update phase is open (dos_optimizer_begin_step without "
                                                 "dos_optimizer_finish_step, or a dos_optimizer_step that another "
                                                 "thread is running): finish it first (an optimizer takes one call "
                                                 "at a time)");
  return DOS_OK;
}

/// Opens a phase with `open` (begin_step or step_async; `fn` names the C call in messages): StarPU's
/// workers are held running from then until the phase closes (finish_step or wait_step).
template <class F>
int open_phase(dos_optimizer* opt, const char* fn, F&& open) {
  if (!opt) return fail(DOS_E_INVALID, std::string(fn) + ": optimizer is NULL");
  if (refuse_if_open(opt, fn) != DOS_OK) return DOS_E_INVALID;
  auto active = std::make_unique<Active>();
  const int rc = guarded(fn, open, false);
  if (rc == DOS_OK) opt->open_phase = std::move(active);
  return rc;
}

/// A phase of `opt` left running: its hold on the workers (open_phase) moves to a thread that
/// releases it once the phase's tasks have ended, so that StarPU's workers stop polling while the
/// caller computes. Without a thread (the system refuses one) the hold stays until wait_step.
void pause_when_done(dos_optimizer* opt) {
  opt->join_pauser();  // the previous phase's, long done
  std::unique_ptr<Active> hold = std::move(opt->open_phase);
  try {
    dos::Optimizer* o = opt->opt.get();
    Active* a = hold.get();
    opt->pauser = std::thread([o, a] {
      o->wait_step_work();
      delete a;
    });
    hold.release();  // the thread deletes it
  } catch (...) {  // std::system_error, std::bad_alloc: the hold stays until wait_step
    opt->open_phase = std::move(hold);
  }
}


}  // namespace

extern "C" {

int dos_c_abi_version(void) { return DOS_C_ABI_VERSION; }
size_t dos_step_stats_size(void) { return sizeof(dos_step_stats); }
const char* dos_last_error(void) { return g_last_error.c_str(); }

int dos_gpu_memory_for_budgets(size_t elements, size_t subgroup_size, size_t param_bytes, size_t grad_bytes,
                               uint64_t update_budget, int64_t resident_budget, int speculative, size_t* out) {
  if (!out) return fail(DOS_E_INVALID, "dos_gpu_memory_for_budgets: out is NULL");
  *out = 0;
  return guarded("dos_gpu_memory_for_budgets", [&] {
    *out = dos::gpu_memory_for_budgets(elements, subgroup_size, param_bytes, grad_bytes,
                                       update_budget > SIZE_MAX ? SIZE_MAX : std::size_t(update_budget),
                                       resident_budget, speculative != 0);
  });
}

size_t dos_starpu_device_margin(void) { return dos::kStarpuDeviceMargin; }

namespace {
/// dos_runtime_create[_for_caller] (`fn` names the C call in messages).
int create_runtime(const char* fn, const char* policy, int cpu_threads, int caller_cores, int cpu_workers, int ncuda,
                   int verbose, dos_runtime** out) {
  if (!out) return fail(DOS_E_INVALID, std::string(fn) + ": out is NULL");
  *out = nullptr;
  if (caller_cores < 0)
    return fail(DOS_E_INVALID, std::string(fn) + ": caller_cores must be >= 0 (cores left to the caller's "
                               "threads), got " + std::to_string(caller_cores));
  Active active;
  return guarded(fn, [&] {
    dos::RuntimeOptions o;
    o.policy = policy ? policy : "";
    o.cpu_threads = cpu_threads;
    o.caller_cores = caller_cores;
    o.cpu_workers = cpu_workers;
    o.ncuda = ncuda;
    o.verbose = verbose != 0;
    auto h = std::make_unique<dos_runtime>();
    h->rt = std::make_unique<dos::Runtime>(o);
    count(&g_runtimes, 1);
    *out = h.release();
  });
}
}  // namespace

int dos_runtime_create(const char* policy, int cpu_threads, int cpu_workers, int ncuda, int verbose,
                       dos_runtime** out) {
  return create_runtime("dos_runtime_create", policy, cpu_threads, 0, cpu_workers, ncuda, verbose, out);
}

int dos_runtime_create_for_caller(const char* policy, int cpu_threads, int caller_cores, int cpu_workers, int ncuda,
                                  int verbose, dos_runtime** out) {
  return create_runtime("dos_runtime_create_for_caller", policy, cpu_threads, caller_cores, cpu_workers, ncuda,
                        verbose, out);
}

void dos_runtime_destroy(dos_runtime* rt) { destroy_handle(rt, &g_runtimes); }

int dos_runtime_running_policy(const dos_runtime* rt, char* buf, size_t len) {
  if (!rt || !buf || len == 0) return fail(DOS_E_INVALID, "dos_runtime_running_policy: NULL argument or empty buffer");
  return guarded("dos_runtime_running_policy", [&] {
    const std::string p = rt->rt->running_policy();
    std::strncpy(buf, p.c_str(), len - 1);
    buf[len - 1] = '\0';
  });
}

int dos_runtime_workers(const dos_runtime* rt, unsigned* cpu_workers, unsigned* cuda_workers, int* cpu_threads) {
  if (!rt) return fail(DOS_E_INVALID, "dos_runtime_workers: runtime is NULL");
  return guarded("dos_runtime_workers", [&] {
    if (cpu_workers) *cpu_workers = rt->rt->cpu_workers();
    if (cuda_workers) *cuda_workers = rt->rt->cuda_workers();
    if (cpu_threads) *cpu_threads = rt->rt->cpu_threads();
  });
}

size_t dos_optimizer_options_size(void) { return sizeof(dos_optimizer_options); }

int dos_optimizer_options_init(dos_optimizer_options* options) {
  if (!options) return fail(DOS_E_INVALID, "dos_optimizer_options_init: options is NULL");
  dos::c_api::default_options(options);
  return DOS_OK;
}

int dos_optimizer_create(dos_runtime* rt, size_t ntensors, void* const* params, void* const* grads,
                         const size_t* numels, const dos_optimizer_options* options, dos_optimizer** out) {
  if (!out) return fail(DOS_E_INVALID, "dos_optimizer_create: out is NULL");
  *out = nullptr;
  if (!rt) return fail(DOS_E_INVALID, "dos_optimizer_create: runtime is NULL");
  if (ntensors > 0 && (!params || !grads || !numels))
    return fail(DOS_E_INVALID, "dos_optimizer_create: NULL pointer array");
  if (!options)
    return fail(DOS_E_INVALID, "dos_optimizer_create: options is NULL (fill a struct dos_optimizer_options with "
                               "dos_optimizer_options_init)");
  dos::OptimizerOptions o;
  const std::string bad = dos::c_api::check_options(*options, o);
  if (!bad.empty()) return fail(DOS_E_INVALID, "dos_optimizer_create: " + bad);
  Active active;
  return guarded("dos_optimizer_create", [&] {
    std::vector<dos::TensorView> tv(ntensors);
    for (size_t i = 0; i < ntensors; ++i) tv[i] = dos::TensorView{params[i], grads[i], numels[i]};
    auto h = std::make_unique<dos_optimizer>();
    h->opt = std::make_unique<dos::Optimizer>(*rt->rt, tv, o);
    h->ntensors = ntensors;
    count(&g_optimizers, 1);
    *out = h.release();
  });
}

void dos_optimizer_destroy(dos_optimizer* opt) { destroy_handle(opt, &g_optimizers); }

int dos_optimizer_set_hyper(dos_optimizer* opt, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int decoupled) {
  if (!opt) return fail(DOS_E_INVALID, "dos_optimizer_set_hyper: optimizer is NULL");
  if (refuse_if_open(opt, "dos_optimizer_set_hyper") != DOS_OK) return DOS_E_INVALID;
  if (decoupled != 0 && decoupled != 1)
    return fail(DOS_E_INVALID, "dos_optimizer_set_hyper: decoupled must be 0 or 1 (0: Adam, 1: AdamW), got " +
                                   std::to_string(decoupled));
  return guarded("dos_optimizer_set_hyper", [&] { opt->opt->set_hyper(dos::c_api::make_hyper(lr, beta1, beta2, eps, weight_decay, decoupled)); });
}

int dos_optimizer_step(dos_optimizer* opt, dos_step_stats* stats) {
  if (!opt) return fail(DOS_E_INVALID, "dos_optimizer_step: optimizer is NULL");
  if (refuse_if_open(opt, "dos_optimizer_step") != DOS_OK) return DOS_E_INVALID;
  Active active;
  return guarded("dos_optimizer_step", [&] { keep_stats(opt, opt->opt->step(), stats); }, false);
}


int dos_optimizer_step_async(dos_optimizer* opt) {
  const int rc = open_phase(opt, "dos_optimizer_step_async", [&] { opt->opt->step_async(); });
  if (rc == DOS_OK) pause_when_done(opt);
  return rc;
}

int dos_optimizer_begin_step(dos_optimizer* opt) {
  return open_phase(opt, "dos_optimizer_begin_step", [&] { opt->opt->begin_step(); });
}

int dos_optimizer_gradients_final(dos_optimizer* opt, size_t begin, size_t end) {
  if (!opt) return fail(DOS_E_INVALID, "dos_optimizer_gradients_final: optimizer is NULL");
  if (!opt->opt->step_open())
    return fail(DOS_E_INVALID, "dos_optimizer_gradients_final: no update phase is open (call "
                               "dos_optimizer_begin_step first)");
  const size_t n = opt->opt->num_params();
  if (begin > end || end > n)
    return fail(DOS_E_INVALID, "dos_optimizer_gradients_final: the range [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") is not inside the optimizer's " + std::to_string(n) +
                                   " parameters (begin <= end <= num_params)");
  try {
    opt->opt->gradients_final(begin, end);
    return DOS_OK;
  } catch (const std::exception& e) {
    // an element declared twice leaves the phase open (bad input); a failed submission closes it
    // and marks the optimizer broken
    const bool still_open = opt->opt->step_open();
    if (!still_open) opt->open_phase.reset();
    return fail(still_open ? DOS_E_INVALID : DOS_E_RUNTIME, dos::c_api::named("dos_optimizer_gradients_final", e.what(),
                                                                    dynamic_cast<const dos::UsageError*>(&e) != nullptr));
  } catch (...) {
    if (!opt->opt->step_open()) opt->open_phase.reset();
    return fail(DOS_E_RUNTIME, "dos_optimizer_gradients_final: unknown C++ exception");
  }
}

namespace {
/// The verdict of dos_optimizer_finish_step[_async] (`fn` names the call in the message); false
/// with the error set when it is none of the three or no phase is open.
bool finish_verdict(dos_optimizer* opt, int verdict, const char* fn, dos::StepVerdict* out) {
  if (!opt) return fail(DOS_E_INVALID, std::string(fn) + ": optimizer is NULL"), false;
  if (!opt->opt->step_open())
    return fail(DOS_E_INVALID, std::string(fn) + ": no update phase is open (call dos_optimizer_begin_step first)"),
           false;
  if (opt->opt->step_running())
    return fail(DOS_E_INVALID, std::string(fn) + ": the phase was finished by dos_optimizer_finish_step_async (call "
                                                 "dos_optimizer_wait_step)"),
           false;
  if (verdict != DOS_VERDICT_KEEP && verdict != DOS_VERDICT_CHANGED && verdict != DOS_VERDICT_SKIP)
    return fail(DOS_E_INVALID, std::string(fn) + ": verdict must be DOS_VERDICT_KEEP (0), DOS_VERDICT_CHANGED (1) or "
                                                 "DOS_VERDICT_SKIP (2), got " + std::to_string(verdict)),
           false;
  *out = verdict == DOS_VERDICT_KEEP      ? dos::StepVerdict::keep
         : verdict == DOS_VERDICT_CHANGED ? dos::StepVerdict::changed
                                          : dos::StepVerdict::skip;
  return true;
}
}  // namespace

int dos_optimizer_finish_step(dos_optimizer* opt, int verdict, dos_step_stats* stats) {
  dos::StepVerdict v;
  if (!finish_verdict(opt, verdict, "dos_optimizer_finish_step", &v)) return DOS_E_INVALID;
  Active active;  // held past the release of the phase's own, until the end of this call
  const int rc = guarded("dos_optimizer_finish_step", [&] { keep_stats(opt, opt->opt->finish_step(v), stats); }, false);
  if (!opt->opt->step_open()) opt->open_phase.reset();  // closed: done, or failed (the optimizer is then broken)
  return rc;
}

int dos_optimizer_finish_step_async(dos_optimizer* opt, int verdict) {
  dos::StepVerdict v;
  if (!finish_verdict(opt, verdict, "dos_optimizer_finish_step_async", &v)) return DOS_E_INVALID;
  const int rc = guarded("dos_optimizer_finish_step_async", [&] { opt->opt->finish_step_async(v); }, false);
  if (!opt->opt->step_open()) opt->open_phase.reset();  // failed: the optimizer is broken
  else pause_when_done(opt);
  return rc;
}

int dos_optimizer_wait_parameters(dos_optimizer* opt, size_t begin, size_t end) {
  if (!opt) return fail(DOS_E_INVALID, "dos_optimizer_wait_parameters: optimizer is NULL");
  if (begin > end || end > opt->opt->num_params())
    return fail(DOS_E_INVALID, "dos_optimizer_wait_parameters: the range [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") is not inside the optimizer's " +
                                   std::to_string(opt->opt->num_params()) + " parameters");
  if (opt->opt->step_open() && !opt->opt->step_running())
    return fail(DOS_E_INVALID, "dos_optimizer_wait_parameters: the open phase is not finished (call "
                               "dos_optimizer_finish_step_async first)");
  return guarded("dos_optimizer_wait_parameters", [&] { opt->opt->wait_parameters(begin, end); }, true);
}

int dos_optimizer_wait_step(dos_optimizer* opt, dos_step_stats* stats) {
  if (!opt) return fail(DOS_E_INVALID, "dos_optimizer_wait_step: optimizer is NULL");
  if (!opt->opt->step_running())
    return fail(DOS_E_INVALID, "dos_optimizer_wait_step: no phase was finished by dos_optimizer_finish_step_async");
  opt->join_pauser();  // the phase's tasks have ended
  Active active;       // the workers may have been paused since: awake for the rest of the phase's closing
  const int rc = guarded("dos_optimizer_wait_step", [&] { keep_stats(opt, opt->opt->wait_step(), stats); }, false);
  if (!opt->opt->step_open()) opt->open_phase.reset();
  return rc;
}

int dos_optimizer_set_timeline(dos_optimizer* opt, int on) {
  if (!opt) return fail(DOS_E_INVALID, "dos_optimizer_set_timeline: optimizer is NULL");
  if (on != 0 && on != 1) return fail(DOS_E_INVALID, "dos_optimizer_set_timeline: on must be 0 or 1, got " + std::to_string(on));
  if (refuse_if_open(opt, "dos_optimizer_set_timeline") != DOS_OK) return DOS_E_INVALID;
  opt->opt->set_timeline(on == 1);
  return DOS_OK;
}

int dos_optimizer_last_timeline(const dos_optimizer* opt, dos_timeline_task* tasks, size_t capacity, size_t* count,
                                double* started_at) {
  if (!opt || !count) return fail(DOS_E_INVALID, "dos_optimizer_last_timeline: optimizer or count is NULL");
  if (!tasks && capacity > 0)
    return fail(DOS_E_INVALID, "dos_optimizer_last_timeline: tasks is NULL with a capacity of " + std::to_string(capacity));
  const std::vector<dos::TimelineTask>& tl = opt->last_timeline;
  for (size_t i = 0; i < tl.size() && i < capacity; ++i) {
    const dos::TimelineTask& t = tl[i];
    tasks[i].lane = t.lane == "gpu" ? DOS_LANE_GPU : t.lane == "h2d" ? DOS_LANE_H2D : t.lane == "d2h" ? DOS_LANE_D2H
                    : t.lane == "writeback" ? DOS_LANE_WRITEBACK : DOS_LANE_CPU;
    tasks[i].kind = t.what == "adam_spec" ? DOS_TASK_ADAM_SPEC
                    : t.what == "gather"  ? DOS_TASK_GATHER
                    : t.what == "scatter" ? DOS_TASK_SCATTER
                    : t.what == "state"   ? DOS_TASK_STATE
                                          : DOS_TASK_ADAM;
    tasks[i].subgroup = t.subgroup;
    tasks[i].start = t.start;
    tasks[i].end = t.end;
  }
  *count = tl.size();
  if (started_at) *started_at = opt->last_started_at;
  return DOS_OK;
}

double dos_clock_seconds(void) { return dos::clock_seconds(); }

int dos_optimizer_step_open(const dos_optimizer* opt) { return opt && opt->opt->step_open() ? 1 : 0; }

size_t dos_optimizer_num_params(const dos_optimizer* opt) { return opt ? opt->opt->num_params() : 0; }
size_t dos_optimizer_num_subgroups(const dos_optimizer* opt) { return opt ? opt->opt->num_subgroups() : 0; }

int dos_optimizer_subgroup_sizes(const dos_optimizer* opt, size_t* out) {
  if (!opt || !out) return fail(DOS_E_INVALID, "dos_optimizer_subgroup_sizes: NULL argument");
  return guarded("dos_optimizer_subgroup_sizes", [&] {
    for (size_t i = 0; i < opt->opt->num_subgroups(); ++i) out[i] = opt->opt->subgroup_size(i);
  });
}

int dos_optimizer_step_counts(const dos_optimizer* opt, int64_t* out) {
  if (!opt || !out) return fail(DOS_E_INVALID, "dos_optimizer_step_counts: NULL argument");
  if (refuse_if_open(opt, "dos_optimizer_step_counts") != DOS_OK) return DOS_E_INVALID;
  return guarded("dos_optimizer_step_counts", [&] {
    const std::vector<std::int64_t> s = opt->opt->step_counts();
    for (size_t i = 0; i < s.size(); ++i) out[i] = s[i];
  });
}

int dos_optimizer_read_state(const dos_optimizer* opt, int which, float* out) {
  if (!opt || !out) return fail(DOS_E_INVALID, "dos_optimizer_read_state: NULL argument");
  if (which < 0 || which > 2)
    return fail(DOS_E_INVALID, "dos_optimizer_read_state: which must be 0 (master), 1 (exp_avg) or 2 (exp_avg_sq)");
  if (refuse_if_open(opt, "dos_optimizer_read_state") != DOS_OK) return DOS_E_INVALID;
  Active active;
  return guarded(
      "dos_optimizer_read_state",
      [&] {
        if (which == 0) opt->opt->read_master(out);
        else if (which == 1) opt->opt->read_exp_avg(out);
        else opt->opt->read_exp_avg_sq(out);
      },
      false);
}

int dos_optimizer_load_state(dos_optimizer* opt, const float* master, const float* exp_avg,
                             const float* exp_avg_sq, const int64_t* steps, size_t nsteps) {
  if (!opt || !master || !exp_avg || !exp_avg_sq || (nsteps > 0 && !steps))
    return fail(DOS_E_INVALID, "dos_optimizer_load_state: NULL argument");
  if (refuse_if_open(opt, "dos_optimizer_load_state") != DOS_OK) return DOS_E_INVALID;
  // the count first: `steps` is read for nsteps entries, which must be the array's own length
  if (nsteps != opt->opt->num_subgroups())
    return fail(DOS_E_INVALID, "dos_optimizer_load_state: nsteps is " + std::to_string(nsteps) +
                                   "; this optimizer has " + std::to_string(opt->opt->num_subgroups()) +
                                   " subgroups: give one step count per subgroup (dos_optimizer_num_subgroups)");
  Active active;
  return guarded("dos_optimizer_load_state", [&] {
    opt->opt->load_state(master, exp_avg, exp_avg_sq, std::vector<std::int64_t>(steps, steps + nsteps));
  });
}

int dos_optimizer_read_masters(const dos_optimizer* opt, size_t begin, size_t end, float* out) {
  if (!opt || (end > begin && !out)) return fail(DOS_E_INVALID, "dos_optimizer_read_masters: NULL argument");
  if (refuse_if_open(opt, "dos_optimizer_read_masters") != DOS_OK) return DOS_E_INVALID;
  Active active;
  return guarded("dos_optimizer_read_masters", [&] { opt->opt->read_master_range(begin, end, out); });
}

int dos_optimizer_write_masters(dos_optimizer* opt, size_t begin, size_t end, const float* values) {
  if (!opt || (end > begin && !values)) return fail(DOS_E_INVALID, "dos_optimizer_write_masters: NULL argument");
  if (refuse_if_open(opt, "dos_optimizer_write_masters") != DOS_OK) return DOS_E_INVALID;
  Active active;
  return guarded("dos_optimizer_write_masters", [&] { opt->opt->write_master_range(begin, end, values); });
}

int dos_optimizer_set_gradients(dos_optimizer* opt, size_t ntensors, void* const* grads) {
  if (!opt || (ntensors > 0 && !grads)) return fail(DOS_E_INVALID, "dos_optimizer_set_gradients: NULL argument");
  if (refuse_if_open(opt, "dos_optimizer_set_gradients") != DOS_OK) return DOS_E_INVALID;
  // the count first: `grads` is read for ntensors entries, which must be the array's own length
  if (ntensors != opt->ntensors)
    return fail(DOS_E_INVALID, "dos_optimizer_set_gradients: ntensors is " + std::to_string(ntensors) +
                                   "; this optimizer was created over " + std::to_string(opt->ntensors) +
                                   " tensors: give one gradient pointer per tensor, in the order of creation");
  return guarded("dos_optimizer_set_gradients", [&] { opt->opt->set_gradients(std::vector<void*>(grads, grads + ntensors)); });
}

}  // extern "C"
