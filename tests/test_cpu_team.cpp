// The CPU team helpers (codelets/cpu_team.h): release_caller_openmp_threads frees the calling
// thread's idle OpenMP threads (counted by the kernel: /proc/self/status's Threads), refuses inside a
// parallel region, leaves another thread's team alone, and the next parallel region gets its full
// team again; Optimizer::step() and step_async() call it on the caller's thread; core_list_string's
// ranges; allowed_cores gives the cores the process started with, also where OpenMP binds its
// threads (cpu-team-places), and under master binding the initial thread's place (cpu-team-master); a CPU codelet's binding (bind_worker_team_for) starts no team thread for
// a kernel of one work item, which starts none either, and binds the whole team beyond it (with
// DOS_TEAM_BIND=every-task, cpu-team-bind-every-task, it starts the team for any size), and an
// optimizer's step binds only before the tasks whose kernels fork (worker_team_bindings). Skips (77) where the OpenMP settings cannot give teams of 4 (OMP_THREAD_LIMIT,
// OMP_MAX_ACTIVE_LEVELS=0); teams are asked for with dynamic adjustment off on every thread.
#include <omp.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cmocka_cpp.h"
#include "cpu_team.h"
#include "dos.h"
#include "kernels/adam.h"

namespace {

/// The process's threads as the kernel counts them (/proc/self/status, "Threads:").
int process_threads() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "Threads:") {
      int n = 0;
      f >> n;
      return n;
    }
    std::getline(f, key);
  }
  fail_msg("/proc/self/status has no Threads: line");
  return -1;
}

/// Waits up to 2 s for the process's thread count to reach `want` (exiting threads leave
/// asynchronously; starting ones appear so); returns the last count seen.
int wait_threads(int want) {
  int n = process_threads();
  for (int k = 0; k < 200 && n != want; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = process_threads();
  }
  return n;
}

/// Runs one parallel region of `threads` threads on the calling thread (dynamic adjustment off on
/// it); returns the team's size.
int run_region(int threads) {
  omp_set_dynamic(0);
  int seen = 0;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    seen = omp_get_num_threads();
  }
  return seen;
}

void test_frees_the_callers_pool(void**) {
  const int before = process_threads();
  assert_int_equal(run_region(4), 4);
  // libgomp keeps the 3 other threads of the team waiting in the calling thread's pool
  assert_int_equal(process_threads(), before + 3);
  assert_true(dos::release_caller_openmp_threads());
  assert_int_equal(wait_threads(before), before);
  // the next region starts its threads again, with its full team
  assert_int_equal(run_region(4), 4);
  assert_int_equal(process_threads(), before + 3);
  assert_true(dos::release_caller_openmp_threads());
  assert_int_equal(wait_threads(before), before);
  // nothing to free: still accepted
  assert_true(dos::release_caller_openmp_threads());
  assert_int_equal(process_threads(), before);
}

void test_refused_inside_a_region(void**) {
  omp_set_dynamic(0);
  const int before = process_threads();
  int refused = 0;
#pragma omp parallel num_threads(2) reduction(+ : refused)
  refused += dos::release_caller_openmp_threads() ? 0 : 1;
  assert_int_equal(refused, 2);
  // the team's pool is still there (one waiting thread), freed from outside the region
  assert_int_equal(process_threads(), before + 1);
  assert_true(dos::release_caller_openmp_threads());
  assert_int_equal(wait_threads(before), before);
}

void test_other_threads_team_kept(void**) {
  const int before = process_threads();
  // a worker thread (as a StarPU CPU worker) with a team of 3 of its own, kept while the calling
  // thread frees its pool
  int worker_team = 0, worker_after = 0;
  bool go_on = false;
  std::thread w([&] {
    worker_team = run_region(3);
    while (!__atomic_load_n(&go_on, __ATOMIC_ACQUIRE)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    worker_after = run_region(3);
  });
  // joined whatever the checks below say (a failed check returns through longjmp)
  struct Joiner {
    std::thread& t;
    bool& go;
    ~Joiner() {
      __atomic_store_n(&go, true, __ATOMIC_RELEASE);
      if (t.joinable()) t.join();
    }
  } joiner{w, go_on};
  const int with_worker = wait_threads(before + 3);  // the worker and its team's 2 others
  assert_int_equal(with_worker, before + 3);
  assert_int_equal(run_region(2), 2);  // the caller's pool: 1 more thread
  assert_int_equal(process_threads(), before + 4);
  assert_true(dos::release_caller_openmp_threads());
  assert_int_equal(wait_threads(before + 3), before + 3);  // only the caller's thread left
  __atomic_store_n(&go_on, true, __ATOMIC_RELEASE);
  w.join();
  assert_int_equal(worker_team, 3);
  assert_int_equal(worker_after, 3);
}

void test_step_frees_the_callers_pool(void**) {
  dos::RuntimeOptions ro;
  ro.policy = "cpu";
  ro.verbose = false;
  dos::Runtime rt(ro);
  std::vector<float> p(1000, 1.0f), g(1000, 0.5f);
  dos::OptimizerOptions oo;
  oo.dtype = dos::DType::fp32;
  oo.subgroup_size = 300;
  dos::Optimizer opt(rt, {{p.data(), g.data(), 1000}}, oo);
  opt.step();  // StarPU's and the workers' threads all started
  const int before = process_threads();
  assert_int_equal(run_region(3), 3);
  assert_int_equal(process_threads(), before + 2);
  opt.step();
  assert_int_equal(wait_threads(before), before);
  assert_int_equal(run_region(3), 3);
  assert_int_equal(process_threads(), before + 2);
  opt.step_async();
  opt.wait_step();
  assert_int_equal(wait_threads(before), before);
  assert_true(p[0] != 1.0f);  // the steps ran
}

/// What a worker thread (as a StarPU CPU worker, a team of 4 bound to `core`) saw of the process's
/// threads: before anything, after each call of small_then_large, and the cores its team's threads
/// were bound to after the large binding.
struct WorkerView {
  int base = 0, after_small_kernel = 0, after_small_bind = 0, after_small_copy = 0, after_small_copy_bind = 0,
      after_large = 0;
  std::vector<int> bound_cores;  // per team thread: its only allowed core, or -1
};

/// The calling thread's affinity mask when it names one core: that core, else -1.
int only_core() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) return -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) return c;
  return -1;
}

/// On a fresh thread with a team of 4 bound to `core`: the CPU kernels and the binding on one work
/// item (no team woken), then either the binding (`large_bind`) or the Adam kernel on one element
/// more (the team started).
WorkerView small_then_large(int core, bool large_bind) {
  WorkerView v;
  std::thread w([&] {
    omp_set_dynamic(0);
    omp_set_num_threads(4);
    dos::set_worker_team_cores({core, core, core, core});
    const std::size_t n = dos::kCpuWorkItem;
    std::vector<float> p(n + 1, 1.0f), m(n + 1, 0.0f), v2(n + 1, 0.0f), g(n + 1, 0.5f), out(4 * n + 8);
    const dos::AdamStepParams sp = dos::make_adam_step_params(dos::AdamHyper{}, 1);
    v.base = process_threads();
    dos::adam_step_cpu(p.data(), m.data(), v2.data(), g.data(), dos::DType::fp32, nullptr, dos::DType::fp32, n, sp);
    v.after_small_kernel = process_threads();
    dos::bind_worker_team_for(n);
    v.after_small_bind = process_threads();
    dos::copy_cpu(out.data(), p.data(), n * sizeof(float));
    v.after_small_copy = process_threads();
    dos::bind_worker_team_for(2 * n, 2);  // a copy of 2-byte elements: one work item of bytes
    v.after_small_copy_bind = process_threads();
    if (large_bind) {
      dos::bind_worker_team_for(n + 1);  // (2 * n + 1 elements of 2 bytes would fork the copy too)
    } else {
      dos::adam_step_cpu(p.data(), m.data(), v2.data(), g.data(), dos::DType::fp32, nullptr, dos::DType::fp32, n + 1, sp);
    }
    v.after_large = process_threads();
    if (large_bind) {
      v.bound_cores.assign(4, -2);
#pragma omp parallel num_threads(4)
      v.bound_cores[std::size_t(omp_get_thread_num())] = only_core();
    }
  });
  w.join();
  return v;
}

// A CPU codelet binds its worker's team only when its kernel opens a parallel region: on one work
// item (kCpuWorkItem elements) neither the kernels nor bind_worker_team_for start a thread; one
// element more starts the team in both, and the binding binds every thread of it
void test_small_kernels_wake_no_team(void**) {
  const int core = dos::allowed_cores().at(0);
  // an earlier test's runtime may still be ending its threads: wait until the count holds for 50 ms
  int before = process_threads();
  for (int k = 0; k < 100; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int now = process_threads();
    if (now == before) break;
    before = now;
  }
  const WorkerView k = small_then_large(core, false);
  assert_int_equal(wait_threads(before), before);  // the worker's pool ended with it
  const WorkerView b = small_then_large(core, true);
  assert_int_equal(wait_threads(before), before);
  for (const WorkerView* v : {&k, &b}) {
    assert_int_equal(v->base, before + 1);  // the worker thread itself
    assert_int_equal(v->after_small_kernel, v->base);
    // DOS_TEAM_BIND=every-task (cpu-team-bind-every-task): the binding forks whatever the size
    const bool every = std::string(dos::team_bind_mode()) == "every-task";
    assert_int_equal(v->after_small_bind, v->base + (every ? 3 : 0));
    assert_int_equal(v->after_small_copy, v->after_small_bind);  // the copy starts none
    assert_int_equal(v->after_small_copy_bind, v->after_small_bind);
    assert_int_equal(v->after_large, v->base + 3);
  }
  assert_int_equal(int(b.bound_cores.size()), 4);
  for (const int c : b.bound_cores) assert_int_equal(c, core);
}

/// Bindings (worker_team_bindings) during an optimizer's second step (fp32 parameters in host
/// memory, so that each CPU subgroup is one adam_direct_cl task) over n elements in subgroups of
/// `subgroup_size`.
std::uint64_t bindings_in_a_step(dos::Runtime& rt, std::size_t n, std::size_t subgroup_size,
                                 dos::DType dtype = dos::DType::fp32) {
  std::vector<float> p(n, 1.0f), g(n, 0.5f);  // room for n elements of either dtype
  dos::OptimizerOptions oo;
  oo.dtype = dtype;
  oo.subgroup_size = subgroup_size;
  dos::Optimizer opt(rt, {{p.data(), g.data(), n}}, oo);
  opt.step();
  const std::uint64_t before = dos::worker_team_bindings();
  opt.step();
  return dos::worker_team_bindings() - before;
}

// Through the runtime's codelets (each CPU subgroup's update here is three tasks: its gradients
// gathered into host staging, Adam, its parameters scattered back): a step whose subgroups are one
// work item each binds no team; with one element more, every task of those subgroups binds (fp32:
// the copies of (16384 + 1) x 4 bytes fork too), the last subgroup (1 element) none; bf16 subgroups
// of 2 x 16384 elements bind for Adam only (their 2-byte copies are one 64 KiB work item); with
// DOS_TEAM_BIND=every-task every task binds
void test_step_binds_only_forking_kernels(void**) {
  const std::uint64_t before_runtime = dos::worker_team_bindings();
  dos::RuntimeOptions ro;
  ro.policy = "cpu";
  ro.verbose = false;
  dos::Runtime rt(ro);
  if (dos::worker_team_bindings() == before_runtime) {
    std::printf("  the runtime bound no CPU team here (binding: %s): nothing to count\n", rt.binding().c_str());
    skip();
  }
  const std::size_t item = dos::kCpuWorkItem;
  const bool every = std::string(dos::team_bind_mode()) == "every-task";
  // 4 subgroups of one work item and one of 5 elements: 15 tasks
  assert_int_equal(bindings_in_a_step(rt, 4 * item + 5, item), every ? 15 : 0);
  // 4 subgroups of one work item and an element, one of 1 element: 15 tasks, 12 of them forking
  assert_int_equal(bindings_in_a_step(rt, 4 * item + 5, item + 1), every ? 15 : 12);
  // 2 bf16 subgroups of 2 work items: 6 tasks, 2 of them (Adam) forking
  assert_int_equal(bindings_in_a_step(rt, 4 * item, 2 * item, dos::DType::bf16), every ? 6 : 2);
}

/// The processors of /proc/PID/status's Cpus_allowed_list ("0-3,6"), ascending.
std::vector<int> cpus_allowed_of(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line, list;
  while (std::getline(f, line))
    if (line.rfind("Cpus_allowed_list:", 0) == 0) list = line.substr(18);
  std::vector<int> out;
  std::size_t at = 0;
  while (at < list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string r = list.substr(at, comma - at);
    const std::size_t dash = r.find('-');
    const int a = std::stoi(r), b = dash == std::string::npos ? a : std::stoi(r.substr(dash + 1));
    for (int c = a; c <= b; ++c) out.push_back(c);
    at = comma + 1;
  }
  return out;
}

// allowed_cores: the cores the process started with, also where libgomp binds (OMP_PROC_BIND,
// OMP_PLACES: run as cpu-team-places), which narrows the initial thread to its first place before
// main(); the parent (meson) still has the mask the process started with. Under master binding
// (cpu-team-master) the initial thread's place
void test_allowed_cores(void**) {
  const std::vector<int> parent = cpus_allowed_of(long(getppid()));
  const std::vector<int> got = dos::allowed_cores();
  std::printf("  OpenMP binds: %s; allowed_cores %s; parent's %s; this thread's %s\n", dos::openmp_binds() ? "yes" : "no",
              dos::core_list_string(got).c_str(), dos::core_list_string(parent).c_str(),
              dos::core_list_string(cpus_allowed_of(long(getpid()))).c_str());
  assert_true(!parent.empty());
  if (omp_get_proc_bind() == omp_proc_bind_master) {
    // master (primary) binding (cpu-team-master): every team thread shares the initial thread's
    // place, which libgomp bound it to before main(): that place is what a team can use
    assert_true(got == cpus_allowed_of(long(getpid())));
  } else {
    assert_true(got == parent);
  }
}

// Runtime::cuda_driver_core: -1 without a CUDA worker or with the threads unbound; bound, the first
// core the process started with (the parent's mask, read from /proc: the CUDA drivers take the
// first cores). Without a GPU only the first case runs.
void test_cuda_driver_core(void**) {
  dos::RuntimeOptions ro;
  ro.policy = "cpu";
  ro.verbose = false;
  dos::Runtime rt(ro);
  const bool bound = rt.binding().rfind("CUDA driver", 0) == 0;
  std::printf("  %u CUDA worker(s), binding: %s; cuda_driver_core %d\n", rt.cuda_workers(), rt.binding().c_str(),
              rt.cuda_driver_core());
  if (rt.cuda_workers() == 0 || !bound)
    assert_int_equal(rt.cuda_driver_core(), -1);
  else
    assert_int_equal(rt.cuda_driver_core(), cpus_allowed_of(long(getppid())).front());
}

void test_core_list_string(void**) {
  assert_string_equal(dos::core_list_string({}).c_str(), "");
  assert_string_equal(dos::core_list_string({3}).c_str(), "3");
  assert_string_equal(dos::core_list_string({0, 1, 2, 5, 7, 8}).c_str(), "0-2,5,7-8");
}

}  // namespace

// The team's size per worker, the rule RuntimeOptions::cpu_threads documents, worked by hand on a
// GPU machine's 16 cores with one CUDA worker.
void test_team_threads_per_worker(void**) {
  assert_int_equal(dos::team_threads_per_worker(0, 0, false, 16, 1, 0, 1), 15);   // every core but the GPU's
  assert_int_equal(dos::team_threads_per_worker(0, 0, false, 16, 1, 1, 1), 14);   // and one for the caller
  assert_int_equal(dos::team_threads_per_worker(0, 0, false, 16, 1, 0, 4), 3);    // 15 cores over 4 workers
  assert_int_equal(dos::team_threads_per_worker(6, 0, false, 16, 1, 0, 1), 6);    // given
  assert_int_equal(dos::team_threads_per_worker(6, 9, false, 16, 1, 0, 2), 3);    // given wins over $OMP_NUM_THREADS
  assert_int_equal(dos::team_threads_per_worker(0, 9, false, 16, 1, 0, 1), 9);    // $OMP_NUM_THREADS
  assert_int_equal(dos::team_threads_per_worker(0, 0, true, 16, 1, 0, 4), 1);     // oversubscribing: one per worker
  assert_int_equal(dos::team_threads_per_worker(0, 0, false, 1, 1, 1, 0), 1);     // at least one
  assert_int_equal(dos::team_threads_per_worker(3, 0, false, 16, 1, 0, 8), 1);    // fewer cores than workers
}

int main() {
  if (omp_get_thread_limit() < 6 || omp_get_max_active_levels() < 1) {
    std::printf("skip: the OpenMP settings (OMP_THREAD_LIMIT %d, OMP_MAX_ACTIVE_LEVELS %d) allow no teams of 4\n",
                omp_get_thread_limit(), omp_get_max_active_levels());
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_frees_the_callers_pool),
      cmocka_unit_test(test_refused_inside_a_region),
      cmocka_unit_test(test_other_threads_team_kept),
      cmocka_unit_test(test_step_frees_the_callers_pool),
      cmocka_unit_test(test_small_kernels_wake_no_team),
      cmocka_unit_test(test_cuda_driver_core),  // before a test that may skip() with its Runtime alive
      cmocka_unit_test(test_step_binds_only_forking_kernels),
      cmocka_unit_test(test_core_list_string),
      cmocka_unit_test(test_allowed_cores),
      cmocka_unit_test(test_team_threads_per_worker),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
