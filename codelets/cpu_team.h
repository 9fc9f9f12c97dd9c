// The OpenMP team a CPU codelet runs its kernel with: which cores its threads are bound to.
//
// StarPU runs one "fat" CPU worker (or a few) whose codelets open an OpenMP parallel region. With
// StarPU's own binding, the team would inherit the worker's single-core mask and pile onto one
// core (seen with StarPU 1.3), so the runtime starts StarPU with STARPU_WORKERS_NOBIND=1
// and binds threads itself: each CUDA worker's driver thread to a core of its own, and thread t of
// CPU worker w's team to core (w * team_size + t) of the cores that are left. Pinned threads stay
// on their core: two of them never share one, and with DOS_CPU_SCHEDULE=static each thread updates
// the range whose pages it first touched (the CPU Adam kernel hands its work items out one at a time
// by default: cpu_adam_schedule, codelets/kernels/adam.h). On the GPU machine, at commit f62fde5, a
// quarter of Llama-2 7B's update phase under the cpu policy took 0.563 s with 15 bound threads and
// 0.593 s with 15 unbound ones (DOS_BIND=0) (docs/measured-2026-11-30.md, "Kernels against the
// memory roofs").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dos {

/// Binding of the calling StarPU CPU worker's OpenMP team to `cores` (OS processor numbers, one per
/// team thread, thread t on cores[t]); an empty vector leaves the team unbound. Set on each CPU
/// worker thread by the runtime (thread-local: each worker has its own), before any task runs.
void set_worker_team_cores(const std::vector<int>& cores);

/// Binds each thread of the calling worker's current OpenMP team that is not yet on its core (one
/// fork-join, a few microseconds, and a system call only the first time a thread is seen): the
/// runtime calls it on each CPU worker when it sets the team up, so every team thread is bound
/// before any task runs, and bind_worker_team_for calls it again before a kernel that forks, in
/// case libgomp has replaced a thread. Does nothing for an unbound worker. Never fails: a refused
/// binding (a core outside the process's cpuset) leaves that thread unbound.
void bind_worker_team();

/// bind_worker_team() before a CPU codelet's kernel, only when that kernel opens a parallel region:
/// `largest` is the largest array the codelet hands one kernel call, in elements; element_bytes 0
/// for the elementwise kernels of kernels/adam.h (Adam, the conversions, zero_fill_cpu:
/// cpu_kernel_forks(largest)), or the element size of a copy_cpu call (cpu_copy_forks(largest *
/// element_bytes)). The binding's fork-join wakes every thread of the team, which then spin for a
/// while (libgomp's spin wait) beside the runtime's copy thread and the CUDA worker, so a kernel
/// too small to fork skips it; its team stays bound from the runtime's set-up. Measured on the GPU
/// machine (16 cores, a team of 15, 55 subgroups of 10007 under --policy cpu): update phases of
/// 4.9-8.0 ms with a binding before every task (3 ms stalls of the gradient downloads in its
/// timeline; 3.6 ms with a team of 4), 2.3-2.4 ms with this rule, alternating in one process set; a
/// CPU task's cost above StarPU's empty task 41-49 -> 11-12 us. With team_bind_mode() "every-task"
/// it binds before every kernel whatever its size, as the runtime did before this rule.
void bind_worker_team_for(std::size_t largest, std::size_t element_bytes = 0);

/// How many times bind_worker_team has forked a bound worker's team (every CPU worker's calls
/// together, the runtime's set-up included) since the process started: what a test counts. Throws
/// nothing.
std::uint64_t worker_team_bindings();

/// DOS_TEAM_BIND in the environment, read once (a measurement switch, the same bits either way):
/// "every-task" (bind before every CPU task's kernel, the rule before bind_worker_team_for's) or
/// "forking" (the default: unset, empty or "forking"); any other value is named in a warning on
/// standard error and "forking" is used. The runtime reads it when it sets its CPU workers up.
const char* team_bind_mode();

/// Frees the calling thread's idle OpenMP threads, those its own parallel regions left waiting in
/// libgomp's pool (omp_pause_resource_all(omp_pause_soft)); its next parallel region starts them
/// again (new threads: their thread-local data and any affinity set by hand start afresh).
/// Why (libgomp's rule, with OMP_WAIT_POLICY unset): once libgomp's managed threads (the initial
/// thread and every pool's extra threads; threads that only start regions, as StarPU's workers, do
/// not count) outnumber the cores of the process's affinity mask at load time, every thread's spin
/// wait between parallel regions drops from GOMP_SPINCOUNT (300000) to about 100 iterations, so the
/// CPU workers' teams sleep between kernels and each kernel's fork waits for its threads to wake.
/// One parallel region of 2 or more threads on a caller's thread (a dos-train pass over the
/// parameters, Debian's torch on the same libgomp, a checkpoint's state check) keeps such a pool
/// for that thread's life. (OMP_WAIT_POLICY=passive: no spinning at all, nothing to gain;
/// active: about 1000.) Measured on a 2-core machine: a worker team of 2's parallel region took 3.7
/// us with no other pool and 30-60 us beside a caller's pool of 2, 3.7 us once it was freed; the
/// tiny preset's update phase under the cpu policy (55 subgroups of 10007) 8.2-8.6 -> 1.5-1.7 ms,
/// its whole iteration 12.0-14.2 -> 8.6-9.9 ms: the team, no longer throttled, spins after the
/// phase's last kernel (up to about 7.6 ms here) beside the caller's next pass over the cores
/// (GOMP_SPINCOUNT=1000 brought the iteration to 5.7-6.4 ms). The pause itself costs tens of us,
/// the pool's new threads at the caller's next region about as much again.
/// Affects only the libgomp this library links: a caller on another OpenMP runtime (pip's torch
/// bundles its own libgomp) is left alone, and so is a clang/libomp build's semantics, not
/// described here. Returns true when libgomp accepted the pause (also when there was nothing to
/// free); false inside a parallel region, even an inactive one (libgomp refuses, nothing is
/// freed). Never throws.
bool release_caller_openmp_threads() noexcept;

/// Binds the calling thread to one core (OS processor number). Returns false if the system refused.
bool bind_this_thread(int core);

/// Whether the OpenMP runtime binds its threads itself (OMP_PROC_BIND other than false, or
/// OMP_PLACES given without it: omp_get_proc_bind() is not omp_proc_bind_false).
bool openmp_binds();

/// The OS processor numbers this process may run on, ascending: the calling thread's affinity mask,
/// or, where the OpenMP runtime binds with close, spread or true and has places, the union of its
/// places' processors (libgomp binds the initial thread to the first place at start, so that
/// thread's mask then names one place only; the places are made from the mask the process started
/// with). Under master (primary) binding every team thread shares the master's place: the calling
/// thread's mask, that place, is what a team can use.
std::vector<int> allowed_cores();

/// OpenMP threads of each CPU worker's team, the rule RuntimeOptions::cpu_threads documents (runtime/
/// dos.h): the cores are `given` when > 0, else `omp_threads` ($OMP_NUM_THREADS's value) when > 0,
/// else one per worker when `unbound` (processes oversubscribing the cores), else the process's
/// `process_cores` less one per CUDA worker (`ncuda`) and less `caller_cores`; shared evenly by the
/// `workers` CPU workers (0 counts as 1); at least 1. Pure: reads nothing, throws nothing.
int team_threads_per_worker(int given, int omp_threads, bool unbound, std::size_t process_cores, int ncuda,
                            int caller_cores, int workers);

/// "a-b,c" form of a core list, for messages.
std::string core_list_string(const std::vector<int>& cores);

}  // namespace dos
