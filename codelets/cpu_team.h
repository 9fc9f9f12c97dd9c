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

#include <string>
#include <vector>

namespace dos {

/// Binding of the calling StarPU CPU worker's OpenMP team to `cores` (OS processor numbers, one per
/// team thread, thread t on cores[t]); an empty vector leaves the team unbound. Set on each CPU
/// worker thread by the runtime (thread-local: each worker has its own), before any task runs.
void set_worker_team_cores(const std::vector<int>& cores);

/// Called by the CPU codelets on a worker thread before their kernel: binds each thread of the
/// current OpenMP team that is not yet on its core (one fork-join, a few microseconds, and a
/// system call only the first time a thread is seen). Does nothing for an unbound worker. Never
/// fails: a refused binding (a core outside the process's cpuset) leaves that thread unbound.
void bind_worker_team();

/// Binds the calling thread to one core (OS processor number). Returns false if the system refused.
bool bind_this_thread(int core);

/// The OS processor numbers of the calling thread's affinity mask, ascending.
std::vector<int> allowed_cores();

/// "a-b,c" form of a core list, for messages.
std::string core_list_string(const std::vector<int>& cores);

}  // namespace dos
