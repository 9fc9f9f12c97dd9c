// See cpu_team.h.
#include "cpu_team.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "kernels/adam.h"
#include "kernels/env_choice.h"

namespace dos {
namespace {
thread_local std::vector<int> tl_team_cores;  // per CPU worker thread
thread_local int tl_bound_core = -1;          // per thread: the core it was bound to
std::atomic<std::uint64_t> g_team_bindings{0};  // bind_worker_team's fork-joins, every worker
}  // namespace

std::uint64_t worker_team_bindings() { return g_team_bindings.load(std::memory_order_relaxed); }

bool bind_this_thread(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) return false;
  tl_bound_core = core;
  return true;
}

void set_worker_team_cores(const std::vector<int>& cores) { tl_team_cores = cores; }

void bind_worker_team() {
  if (tl_team_cores.empty()) return;
  g_team_bindings.fetch_add(1, std::memory_order_relaxed);
  const std::vector<int>* cores = &tl_team_cores;  // the worker's list, read by its team's threads
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    if (t < int(cores->size()) && tl_bound_core != (*cores)[t]) bind_this_thread((*cores)[t]);
  }
}

const char* team_bind_mode() {
  static const char* const mode =
      detail::env_choice("DOS_TEAM_BIND", {"forking", "every-task"}, 0, "forking is used") == 1 ? "every-task" : "forking";
  return mode;
}

void bind_worker_team_for(std::size_t largest, std::size_t element_bytes) {
  static const bool every = std::strcmp(team_bind_mode(), "every-task") == 0;
  const bool forks = element_bytes == 0 ? cpu_kernel_forks(largest) : cpu_copy_forks(largest * element_bytes);
  if (every || forks) bind_worker_team();
}

bool release_caller_openmp_threads() noexcept {
  if (omp_in_parallel()) return false;
  return omp_pause_resource_all(omp_pause_soft) == 0;
}

bool openmp_binds() { return omp_get_proc_bind() != omp_proc_bind_false; }

int team_threads_per_worker(int given, int omp_threads, bool unbound, std::size_t process_cores, int ncuda,
                            int caller_cores, int workers) {
  const int w = workers > 0 ? workers : 1;
  int cores = given;
  if (cores <= 0 && omp_threads > 0) cores = omp_threads;
  if (cores <= 0 && unbound) cores = w;
  if (cores <= 0) cores = std::max(1, int(process_cores) - ncuda - std::max(0, caller_cores));
  return std::max(1, cores / w);
}

std::vector<int> allowed_cores() {
  std::vector<int> out;
  const omp_proc_bind_t bind = omp_get_proc_bind();
  // close, spread (and true) spread a team over the places; master (primary) puts it on the
  // master's own place, which the calling thread's mask below names
  if (bind != omp_proc_bind_false && bind != omp_proc_bind_master && omp_get_num_places() > 0) {
    // libgomp binds the initial thread to the first place when it starts, so the calling thread's
    // mask would say one place; the places cover the process's cores (made from the mask it started with)
    std::vector<char> seen;
    for (int p = 0; p < omp_get_num_places(); ++p) {
      std::vector<int> ids(std::size_t(omp_get_place_num_procs(p)));
      if (!ids.empty()) omp_get_place_proc_ids(p, ids.data());
      for (const int c : ids)
        if (c >= 0) {
          if (std::size_t(c) >= seen.size()) seen.resize(std::size_t(c) + 1, 0);
          seen[std::size_t(c)] = 1;
        }
    }
    for (std::size_t c = 0; c < seen.size(); ++c)
      if (seen[c]) out.push_back(int(c));
    if (!out.empty()) return out;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

std::string core_list_string(const std::vector<int>& cores) {
  std::string s;
  for (std::size_t i = 0; i < cores.size();) {
    std::size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(cores[i]);
    if (j > i) s += "-" + std::to_string(cores[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace dos
