// dos-bench host: CPU Adam (the runtime's kernel, adam_step_cpu, and with --state compact the
// compact master's, adam_step_compact_cpu) and full-duplex PCIe DMA (cudaMemcpyAsync both ways, as
// a streamed subgroup's state moves) sharing host memory, alone and at the same time, for each host
// page backing and OpenMP team size asked for. No StarPU: the kernel and the copies as the update
// phase runs them, without the runtime's scheduling, so that the figures say what host memory gives
// when both compete. Without a usable GPU only CPU Adam alone is measured (then the exit status is 1).
//
// CPUs: the DMA threads on the first logical CPU the process may use, the CPU team on the next ones,
// one thread per logical CPU (as the runtime binds its CUDA driver thread and its CPU team; with
// SMT, siblings share a core).
#include "host_bench.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "adam.h"
#include "bench_stats.h"
#include "compact_master.h"
#include "cpu_team.h"
#include "dma_loop.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace dos_bench {

#if !defined(DOS_HAVE_CUDA)
int run_host(const HostOptions&) {
  std::fprintf(stderr, "dos-bench host: this build has no CUDA\n");
  return 1;
}
#else
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kHuge = std::size_t(2) << 20;

/// Host memory of the asked kind, its pages touched by the calling thread's bound team (for "4k"
/// and "huge", where that places them; cudaHostAlloc places its own), pinned for DMA (unless asked
/// not to: without a GPU).
struct Buffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  bool pinned = false, by_cuda = false, registered = false;
  bool ready = false;  ///< allocated, and pinned where asked
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  /// kind: "4k", "huge" (posix_memalign, advised, pinned by cudaHostRegister unless pin is false:
  /// without a GPU) or "cuda" (cudaHostAlloc).
  Buffer(std::size_t n, const std::string& kind, bool pin = true) : bytes((n + kHuge - 1) / kHuge * kHuge) {
    by_cuda = kind == "cuda";
    if (by_cuda) {
      if (cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault) != cudaSuccess) ptr = nullptr;
    } else if (posix_memalign(&ptr, kind == "huge" ? kHuge : 4096, bytes) != 0) {
      ptr = nullptr;
    }
    if (!ptr) return;
    if (!by_cuda) madvise(ptr, bytes, kind == "huge" ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    char* c = static_cast<char*>(ptr);
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < bytes; i += 4096) c[i] = 0;
    registered = !by_cuda && pin && cudaHostRegister(ptr, bytes, cudaHostRegisterDefault) == cudaSuccess;
    pinned = by_cuda || registered;
    ready = pinned || !pin;
  }
  ~Buffer() {
    if (by_cuda) {
      cudaFreeHost(ptr);
      return;
    }
    if (registered) cudaHostUnregister(ptr);
    std::free(ptr);
  }
};

/// AnonHugePages of /proc/self/smaps_rollup, bytes (0 when unreadable).
std::size_t anon_huge_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  std::size_t kb = 0;
  while (f >> key) {
    if (key == "AnonHugePages:") {
      f >> kb;
      return kb * 1024;
    }
    f.ignore(1 << 20, '\n');
  }
  return 0;
}

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s.empty() ? "(unreadable)" : s;
}

/// Prints a DMA loop's failed CUDA call, if any; returns whether there was one.
bool dma_failed(const dos::DmaLoop& dma) {
  if (dma.error() == 0) return false;
  std::fprintf(stderr, "dos-bench host: the DMA loop failed: %s\n", dma.error_string());
  return true;
}

/// DmaLoop's directions for a --dma-directions value: "both" 3, "h2d" 1, "d2h" 2; 0 for another.
int direction_mask(const std::string& d) { return d == "both" ? 3 : d == "h2d" ? 1 : d == "d2h" ? 2 : 0; }

}  // namespace

int run_host(const HostOptions& o) {
  if (o.dma_directions.empty()) {
    std::fprintf(stderr, "dos-bench host: give at least one --dma-directions value (both, h2d or d2h)\n");
    return 1;
  }
  for (const std::string& d : o.dma_directions)
    if (direction_mask(d) == 0) {
      std::fprintf(stderr, "dos-bench host: --dma-directions %s: give both, h2d or d2h\n", d.c_str());
      return 1;
    }
  for (std::size_t r : o.dma_rings)
    if (r != 0 && (r < (std::size_t(64) << 10) || r % (std::size_t(16) << 10) != 0)) {
      std::fprintf(stderr, "dos-bench host: a DMA ring of %zu bytes (%g MiB): give 0 or at least 64 KiB, a multiple "
                           "of 16 KiB (four slots of whole 4 KiB pages)\n", r, double(r) / double(1 << 20));
      return 1;
    }
  if (o.states.empty()) {
    std::fprintf(stderr, "dos-bench host: give at least one --state value (full or compact)\n");
    return 1;
  }
  for (const std::string& st : o.states)
    if (st != "full" && st != "compact") {
      std::fprintf(stderr, "dos-bench host: --state %s: give full or compact\n", st.c_str());
      return 1;
    }
  int ndev = 0;
  const bool gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
  if (!gpu && o.dma_seconds > 0) {
    std::fprintf(stderr, "dos-bench host: no usable GPU\n");
    return 1;
  }
  if (!gpu)
    for (const std::string& pages : o.pages)
      if (pages.find("cuda") != std::string::npos) {
        std::fprintf(stderr, "dos-bench host: no usable GPU, and --pages %s needs one (cudaHostAlloc)\n", pages.c_str());
        return 1;
      }
  // the team on the cores after the DMA thread's; without a GPU (no DMA thread) from the first
  const std::vector<int> cores = dos::allowed_cores();
  const int first = gpu ? 1 : 0;
  for (int t : o.threads)
    if (t < 1 || std::size_t(t + first) > cores.size()) {
      if (gpu)
        std::fprintf(stderr, "dos-bench host: a team of %d threads needs %d cores (one for the DMA thread); this "
                             "process may use %zu: give --threads between 1 and %zu\n",
                     t, t + 1, cores.size(), cores.size() - 1);
      else
        std::fprintf(stderr, "dos-bench host: a team of %d threads needs %d cores; this process may use %zu: give "
                             "--threads between 1 and %zu\n", t, t, cores.size(), cores.size());
      return 1;
    }
  if (!gpu)
    std::fprintf(stderr, "dos-bench host: no usable GPU: CPU Adam alone only, in memory that is not pinned, its team "
                         "from the first core; the DMA measurements are not made (exit status 1)\n");
  if (o.dma_seconds > 0) {
    const std::string kind = o.pages.front().substr(o.pages.front().find('/') + 1);
    Buffer up(std::size_t(1) << 30, kind), down(std::size_t(1) << 30, kind);
    if (!up.ready || !down.ready) {
      std::fprintf(stderr, "dos-bench host: cannot allocate and pin 2 GiB of host memory\n");
      return 1;
    }
    const int dirs = direction_mask(o.dma_directions.front());
    dos::DmaLoop dma(up.ptr, up.bytes, down.ptr, down.bytes, o.dma_bytes, cores[0], 0, dirs);
    if (!dma.start()) return dma_failed(dma), 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the threads started
    const double t0 = dos::DmaLoop::now_s();
    double t_prev = t0;
    std::size_t c_prev = dma.completed();
    for (double t = 0.5; t <= o.dma_seconds + 1e-9 && !dma_failed(dma); t += 0.5) {
      std::this_thread::sleep_until(Clock::now() + std::chrono::duration<double>(t0 + t - dos::DmaLoop::now_s()));
      const double tn = dos::DmaLoop::now_s();
      const std::size_t cn = dma.completed();
      std::printf("dma t=%6.1f s: %5.1f GB/s %s\n", t, dma.rate(c_prev, t_prev, cn, tn) / 1e9,
                  dirs == 3 ? "each way" : dirs == 1 ? "host to device" : "device to host");
      std::fflush(stdout);
      t_prev = tn;
      c_prev = cn;
    }
    dma.finish();
    return dma_failed(dma) ? 1 : 0;
  }
  const std::size_t n = o.n;
  const dos::AdamStepParams sp = dos::make_adam_step_params(dos::AdamHyper{}, 10);
  // host bytes per parameter updated, full form: 12 of state read and written, 2 of gradient read,
  // 2 of copy written, and with ordinary stores the copy's lines read first (adam.h,
  // cpu_param_copy_stores). Compact form (compact_master.h): gradient 2, exp_avg and exp_avg_sq 8,
  // lo 2, r 1/8 and P 2 read; the same but the gradient written, every array read before it is
  // written (no store reads a line the kernel did not read): 26.25 whatever the stores
  const std::string stores = dos::cpu_param_copy_stores();
  const double bpp_full = stores.rfind("non-temporal", 0) == 0 ? 28 : 30, bpp_compact = 26.25;
  auto bytes_per_param = [&](const std::string& st) { return st == "compact" ? bpp_compact : bpp_full; };
  const bool any_compact = std::find(o.states.begin(), o.states.end(), "compact") != o.states.end();
  nlohmann::ordered_json out = {{"params", n},
                                {"bytes_per_param", bpp_full},
                                {"param_copy_stores", stores},
                                {"gpu", gpu},
                                {"thp_enabled", read_line("/sys/kernel/mm/transparent_hugepage/enabled")},
                                {"thp_defrag", read_line("/sys/kernel/mm/transparent_hugepage/defrag")},
                                {"runs", nlohmann::ordered_json::array()}};
  if (!o.json) {
    std::printf("dos-bench host: CPU Adam (bf16 gradients; full: fp32 state and a bf16 copy, copy stores %s: %.0f "
                "B/param; compact: bf16 P, lo, r, exp_avg, exp_avg_sq: %.2f B/param) on %zu parameters",
                stores.c_str(), bpp_full, bpp_compact, n);
    if (gpu)
      std::printf(" beside full-duplex DMA (%zu MiB copies where no ring is named), median of %d calls; DMA thread on "
                  "CPU %d; THP %s\n", o.dma_bytes >> 20, o.reps, cores[0], out["thp_enabled"].get<std::string>().c_str());
    else
      std::printf(", alone (no GPU), median of %d calls; THP %s\n", o.reps, out["thp_enabled"].get<std::string>().c_str());
  }
  for (const std::string& pages : o.pages) {
    const std::size_t slash = pages.find('/');
    const std::string state_kind = pages.substr(0, slash), dma_kind = slash == std::string::npos ? state_kind : pages.substr(slash + 1);
    const std::size_t huge_before = anon_huge_bytes();
    // the team that first touches the state is the largest asked for, bound as it will run
    const int touch_threads = *std::max_element(o.threads.begin(), o.threads.end());
    omp_set_num_threads(touch_threads);
#pragma omp parallel
    dos::bind_this_thread(cores[first + omp_get_thread_num()]);
    // the forms share exp_avg, exp_avg_sq, the gradient and the bf16 buffer (full: the copy written;
    // compact: P read and written); the compact form adds lo and r (zeros: a master of 0)
    Buffer master(n * 4, state_kind, gpu), m(n * 4, state_kind, gpu), v(n * 4, state_kind, gpu),
        g(n * 2, state_kind, gpu), p(n * 2, state_kind, gpu);
    Buffer lo(any_compact ? n * 2 : 0, state_kind, gpu), rbits(any_compact ? dos::compact_round_up_bytes(n) : 0,
                                                              state_kind, gpu);
    const std::size_t dma_total = gpu ? std::max<std::size_t>(o.dma_bytes, std::size_t(1) << 30) : 0;
    Buffer up(dma_total, dma_kind, gpu), down(dma_total, dma_kind, gpu);
    std::vector<std::unique_ptr<Buffer>> rings;  // one per --dma-ring size above 0, shared by both directions
    for (std::size_t r : o.dma_rings)
      rings.push_back(r && gpu ? std::make_unique<Buffer>(r, dma_kind) : nullptr);
    std::vector<const Buffer*> all = {&master, &m, &v, &g, &p};
    if (any_compact) all.insert(all.end(), {&lo, &rbits});
    if (gpu) all.insert(all.end(), {&up, &down});
    for (const auto& r : rings)
      if (r) all.push_back(r.get());
    std::size_t all_bytes = 0;
    for (const Buffer* b : all) {
      if (!b->ready) {
        std::fprintf(stderr, "dos-bench host: cannot allocate%s %zu bytes of host memory (%s pages)\n",
                     gpu ? " and pin" : "", b->bytes, pages.c_str());
        return 1;
      }
      all_bytes += b->bytes;
    }
    const std::size_t huge_after = anon_huge_bytes();
    const double huge_share = double(huge_after - std::min(huge_after, huge_before)) / double(all_bytes);
    // without a GPU: one pass, CPU Adam alone
    const std::size_t passes = gpu ? rings.size() * o.dma_directions.size() : 1;
    for (std::size_t k = 0; k < passes; ++k) {
      // each ring with each set of directions; ring 0: each direction over its own 1 GiB in copies
      // of dma_bytes; a ring: both directions over the same buffer in copies of a quarter of it (a
      // staging ring of four slots)
      const std::size_t ri = k / o.dma_directions.size();
      const std::string& dir_name = o.dma_directions[k % o.dma_directions.size()];
      const int dirs = direction_mask(dir_name);
      const char* way = dirs == 3 ? "each way" : dirs == 1 ? "host to device only" : "device to host only";
      const std::size_t ring_bytes = o.dma_rings[ri];
      const Buffer* dma_up = rings[ri] ? rings[ri].get() : &up;
      const Buffer* dma_down = rings[ri] ? rings[ri].get() : &down;
      const std::size_t copy = rings[ri] ? ring_bytes / 4 : o.dma_bytes;
      char ring_text[96];
      std::snprintf(ring_text, sizeof ring_text, "both ways over one %g MiB ring, %zu KiB copies",
                    double(ring_bytes) / double(1 << 20), copy >> 10);
      const std::string ring_name =
          rings[ri] ? ring_text : "over 1 GiB each way, " + std::to_string(copy >> 20) + " MiB copies";
      // DMA alone
      double dma_alone = 0;
      if (gpu) {
        dos::DmaLoop dma(dma_up->ptr, dma_up->bytes, dma_down->ptr, dma_down->bytes, copy, cores[0],
                           rings[ri] ? ring_bytes : 0, dirs);
        if (!dma.start()) return dma_failed(dma), 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const double t0 = dos::DmaLoop::now_s();
        const std::size_t c0 = dma.completed();
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        dma_alone = dma.rate(c0, t0, dma.completed(), dos::DmaLoop::now_s());
        dma.finish();
        if (dma_failed(dma)) return 1;
      }
      if (!o.json) {
        if (gpu)
          std::printf("\npages %s (%.0f%% of the buffers in huge pages), DMA %s, %s: DMA alone %.1f GB/s\n", pages.c_str(),
                      100 * huge_share, ring_name.c_str(), way, dma_alone / 1e9);
        else
          std::printf("\npages %s (%.0f%% of the buffers in huge pages), no DMA (no GPU)\n", pages.c_str(),
                      100 * huge_share);
        std::printf("%-8s %-8s %14s %14s %12s %14s %14s\n", "state", "threads", "alone Gp/s", "beside Gp/s", "DMA GB/s",
                    "host GB/s", "alone host");
      }
      for (int threads : o.threads) {
        omp_set_num_threads(threads);
#pragma omp parallel
        dos::bind_this_thread(cores[first + omp_get_thread_num()]);
        for (const std::string& state : o.states) {
          const double bpp = bytes_per_param(state);
          auto call = [&] {
            if (state == "compact")
              dos::adam_step_compact_cpu(static_cast<std::uint16_t*>(p.ptr), static_cast<std::uint16_t*>(lo.ptr),
                                         static_cast<std::uint8_t*>(rbits.ptr), static_cast<float*>(m.ptr),
                                         static_cast<float*>(v.ptr), g.ptr, dos::DType::bf16, n, sp);
            else
              dos::adam_step_cpu(static_cast<float*>(master.ptr), static_cast<float*>(m.ptr), static_cast<float*>(v.ptr),
                                 g.ptr, dos::DType::bf16, p.ptr, dos::DType::bf16, n, sp);
          };
          auto timed = [&](std::vector<double>& times) {
            for (int r = 0; r < o.reps; ++r) {
              const double t0 = dos::DmaLoop::now_s();
              call();
              times.push_back(dos::DmaLoop::now_s() - t0);
            }
          };
          std::vector<double> t_alone, t_both;
          call();  // untimed: pages and caches warm
          timed(t_alone);
          const double u_alone = double(n) / median(t_alone);
          nlohmann::ordered_json row = {{"pages", pages},
                                        {"huge_page_share", huge_share},
                                        {"state", state},
                                        {"bytes_per_param", bpp},
                                        {"threads", threads},
                                        {"adam_alone_params_per_s", u_alone}};
          if (!gpu) {
            out["runs"].push_back(row);
            if (!o.json)
              std::printf("%-8s %-8d %14.2f %14s %12s %14s %14.1f\n", state.c_str(), threads, u_alone / 1e9, "-", "-",
                          "-", bpp * u_alone / 1e9);
            continue;
          }
          dos::DmaLoop dma(dma_up->ptr, dma_up->bytes, dma_down->ptr, dma_down->bytes, copy, cores[0],
                           rings[ri] ? ring_bytes : 0, dirs);
          if (!dma.start()) return dma_failed(dma), 1;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          call();
          const double w0 = dos::DmaLoop::now_s();
          const std::size_t c0 = dma.completed();
          timed(t_both);
          const double dma_both = dma.rate(c0, w0, dma.completed(), dos::DmaLoop::now_s());
          dma.finish();
          if (dma_failed(dma)) return 1;
          const double u_both = double(n) / median(t_both);
          const double host_both = bpp * u_both + dma.directions() * dma_both;
          row["dma_ring_bytes"] = ring_bytes;
          row["dma_directions"] = dir_name;
          row["dma_alone_bytes_per_s_each_way"] = dma_alone;
          row["adam_beside_dma_params_per_s"] = u_both;
          row["dma_beside_adam_bytes_per_s_each_way"] = dma_both;
          row["host_bytes_per_s_both"] = host_both;
          out["runs"].push_back(row);
          if (!o.json)
            std::printf("%-8s %-8d %14.2f %14.2f %12.1f %14.1f %14.1f\n", state.c_str(), threads, u_alone / 1e9,
                        u_both / 1e9, dma_both / 1e9, host_both / 1e9, bpp * u_alone / 1e9);
        }
      }
    }
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return gpu ? 0 : 1;
}
#endif

}  // namespace dos_bench
