// dos-bench kernels: the update phase's kernels against the memory roofs measured in the same run.
//
//   CPU roofs, each a kernel that moves the same bytes as the kernels it is the roof of, in the
//   same chunks and OpenMP schedule, with no arithmetic to speak of:
//     - "adam bytes": reads g (fp32), p, m, v and writes p, m, v in place and a 16-bit copy, the
//       access pattern of Adam with an fp32 gradient and a 16-bit parameter copy (30 B/param).
//       Adam's rows are compared with it: % of roof = (B/param x Gparams/s) / roof GB/s.
//     - "copy": memcpy of n fp32 (reads 4, writes 4 B/element, write-allocate included, like the
//       conversions, which read one array and write another). The conversions are compared with it.
//   A STREAM-like triad (a = b + s c, 12 B counted, the write-allocate read not counted) is printed
//   for reference only: it undercounts the bytes the memory really moves, so it is not a roof.
//   GPU (when built with CUDA and a device is present): a device-to-device copy gives the
//   device-memory roof; the CUDA Adam and conversion kernels are compared with it.
//
// Prints a table, or JSON with --json. Times are the best of --reps runs. Kernels only: no StarPU.
//
// dos-bench stream: the runtime streaming optimizer state through the GPU against the PCIe roof
// (stream_bench.h).
//
// dos-bench overhead: the runtime's cost per task and per subgroup with tiny subgroups, beside an
// empty StarPU task in the same process (overhead_bench.h).
//
// dos-bench host: CPU Adam and full-duplex PCIe DMA sharing host memory, alone and at once, per
// host page backing and team size (host_bench.h).
//
// dos-bench plan: the `dos` plan's search at every phase's start (choose_plan_simulated) beside one
// simulation of a phase and the phase it plans (plan_bench.h).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "adam.h"
#include "compact_master.h"
#include "host_bench.h"
#include "overhead_bench.h"
#include "plan_bench.h"
#include "stream_bench.h"
#include "cpu_team.h"
#include "dos.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_of(int reps, F f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Row {
  std::string side, kernel, dtype;
  std::size_t n;
  double seconds, bytes_per_param, roof_gbs;
};

constexpr std::size_t kChunk = 1 << 14;  // elements per OpenMP work item, as in the CPU kernels

#define BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/// The "adam bytes" roof: Adam's access pattern (fp32 gradient, 16-bit copy) with one add per array.
BENCH_CLONES void adam_bytes_roof(float* __restrict p, float* __restrict m, float* __restrict v,
                                  const float* __restrict g, std::uint16_t* __restrict out, std::size_t n) {
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t end = std::min(n, (c + 1) * kChunk);
    for (std::size_t i = c * kChunk; i < end; ++i) {
      const float gi = g[i];
      const float pi = p[i] + gi;
      p[i] = pi;
      m[i] = m[i] + gi;
      v[i] = v[i] + gi;
      std::uint32_t u;
      std::memcpy(&u, &pi, 4);
      out[i] = std::uint16_t(u >> 16);
    }
  }
}

void* alloc_touched(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) {
    std::fprintf(stderr, "dos-bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  char* c = static_cast<char*>(p);
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < bytes; i += 4096) c[i] = 0;  // first touch by the threads that use it
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dos-bench kernels: kernel rates beside the memory roofs measured in the same run; dos-bench stream: "
               "the runtime streaming optimizer state through the GPU beside the PCIe roof; dos-bench overhead: the "
               "runtime's cost per task beside StarPU's empty task; dos-bench host: CPU Adam and DMA sharing host "
               "memory; dos-bench plan: the dos plan's search per phase beside one simulation of the phase"};
  std::string sub;
  double n_d = 1 << 27;
  int reps = 5;
  bool json = false;
  app.add_option("what", sub,
                 "what to benchmark: kernels, stream (the runtime's PCIe streaming), overhead (the runtime's cost "
                 "per task beside an empty StarPU task), host (CPU Adam and PCIe DMA sharing host memory), or plan (the "
                 "dos plan's search per phase)")
      ->required();
  app.add_option("--n", n_d, "elements per kernel call (stream: parameters, default 1.6e9)");
  app.add_option("--reps", reps, "kernels: runs per kernel (default 5, the best is kept); stream: timed iterations per "
                 "variant (default 5); host: timed calls (default 5, the median is kept); overhead: timed phases "
                 "(default 20, the median is kept); plan: timed searches per subgroup count (default 20, the "
                 "median is kept)");
  app.add_flag("--json", json, "print JSON instead of a table");
  double subgroup_d = 67108864;
  std::vector<std::string> stream_variants = {"0:end", "0:eager", "3:eager", "3:end", "8:eager"};
  app.add_option("--subgroup-size", subgroup_d, "elements per subgroup (stream: the default shown; overhead: 10007; "
                 "plan: 1e8)")->capture_default_str();
  app.add_option("--variants", stream_variants, "stream: LOOKAHEAD:WRITEBACK (eager or end) runs, e.g. 3:eager 0:end")
      ->capture_default_str();
  std::vector<double> subgroups_v;
  int empty_tasks = 2000;
  app.add_option("--subgroups", subgroups_v, "overhead: subgroups per phase (one count, default 55); plan: subgroup "
                 "counts, one row each (default 55 300 1000)");
  app.add_option("--empty-tasks", empty_tasks, "overhead: empty StarPU tasks per worker kind")->capture_default_str();
  std::vector<int> host_threads;
  std::vector<std::string> host_pages = {"4k", "huge"};
  app.add_option("--threads", host_threads, "host: OpenMP team sizes (default: every core the process may use but one)");
  app.add_option("--pages", host_pages,
                 "host: host memory kinds, each STATE or STATE/DMA with a kind 4k, huge or cuda (cudaHostAlloc)")
      ->capture_default_str()
      ->check(CLI::IsMember({"4k", "huge", "cuda", "4k/cuda", "cuda/4k", "huge/cuda", "cuda/huge", "4k/huge",
                             "huge/4k"}));
  std::vector<std::string> host_states = {"full"};
  app.add_option("--state", host_states,
                 "host: CPU Adam's state forms, one row each: full (fp32 master, bf16 copy written) or compact "
                 "(bf16 P, master's low halves and rounding bits: compact_master.h)")
      ->capture_default_str()
      ->check(CLI::IsMember({"full", "compact"}));
  double dma_seconds = 0;
  app.add_option("--dma-seconds", dma_seconds,
                 "host: only the full-duplex DMA loop, this long, its rate per half second (run another program's "
                 "CPU work beside it)");
  std::vector<double> dma_ring_mib = {0};
  app.add_option("--dma-ring-mib", dma_ring_mib,
                 "host: the DMA loop's host memory, one measurement each: 0 for 1 GiB per direction in 64 MiB "
                 "copies, N for one N MiB ring both directions share in copies of N/4 MiB")
      ->capture_default_str();
  std::vector<std::string> dma_directions = {"both"};
  app.add_option("--dma-directions", dma_directions,
                 "host: the DMA loop's directions, one measurement each: both (full duplex), h2d or d2h (that "
                 "direction alone, as a phase's state write-backs run once its uploads are done)")
      ->capture_default_str()
      ->check(CLI::IsMember({"both", "h2d", "d2h"}));
  CLI11_PARSE(app, argc, argv);
  if (sub != "kernels" && sub != "stream" && sub != "overhead" && sub != "host" && sub != "plan") {
    std::fprintf(stderr, "dos-bench: unknown benchmark '%s': use kernels, stream, overhead, host or plan\n", sub.c_str());
    return 1;
  }
  {  // an option of another benchmark would be ignored: refuse it, naming the benchmarks that take it
    const std::vector<std::pair<const char*, std::vector<std::string>>> takes = {
        {"--n", {"kernels", "stream", "host"}},
        {"--subgroup-size", {"stream", "overhead", "plan"}},
        {"--variants", {"stream"}},
        {"--subgroups", {"overhead", "plan"}},
        {"--empty-tasks", {"overhead"}},
        {"--threads", {"host"}},
        {"--pages", {"host"}},
        {"--state", {"host"}},
        {"--dma-seconds", {"host"}},
        {"--dma-ring-mib", {"host"}},
        {"--dma-directions", {"host"}}};
    for (const auto& [opt, subs] : takes)
      if (app.count(opt) && std::find(subs.begin(), subs.end(), sub) == subs.end()) {
        std::string list;
        for (const std::string& x : subs) list += (list.empty() ? "" : ", ") + x;
        std::fprintf(stderr, "dos-bench %s: %s is an option of %s only: leave it out\n", sub.c_str(), opt, list.c_str());
        return 1;
      }
  }
  if (sub == "host") {
    dos_bench::HostOptions ho;
    if (app.count("--n") == 0) n_d = 5e8;
    if (!(n_d >= 1 && n_d <= 4e9) || n_d != std::floor(n_d) || reps < 1) {
      std::fprintf(stderr, "dos-bench host: --n must be a whole number in [1, 4e9] and --reps >= 1 (got --n %g, --reps %d)\n",
                   n_d, reps);
      return 1;
    }
    ho.n = std::size_t(n_d);
    ho.reps = reps;
    ho.threads = host_threads;
    if (ho.threads.empty()) ho.threads = {int(dos::allowed_cores().size()) - 1};
    ho.pages = host_pages;
    ho.states = host_states;
    ho.json = json;
    if (!(dma_seconds >= 0 && dma_seconds <= 3600)) {
      std::fprintf(stderr, "dos-bench host: --dma-seconds must be in [0, 3600]\n");
      return 1;
    }
    if (dma_seconds > 0 && (dma_seconds < 0.5 || json)) {
      std::fprintf(stderr, "dos-bench host: --dma-seconds prints one line per half second: give at least 0.5, "
                           "without --json\n");
      return 1;
    }
    ho.dma_seconds = dma_seconds;
    ho.dma_directions = dma_directions;
    if (dma_seconds > 0 && app.count("--dma-ring-mib") > 0) {
      std::fprintf(stderr, "dos-bench host: --dma-seconds runs the DMA loop over 1 GiB buffers only: leave out "
                           "--dma-ring-mib\n");
      return 1;
    }
    ho.dma_rings.clear();
    for (double r : dma_ring_mib) {
      // whole KiB only, so that the bytes are exact; run_host checks the ring's own rule
      if (!(r >= 0 && r <= 4096 && std::fmod(r * 1024, 1) == 0)) {
        std::fprintf(stderr, "dos-bench host: --dma-ring-mib %g: give 0 or a size in [0.0625, 4096] MiB that is a "
                             "multiple of 16 KiB\n", r);
        return 1;
      }
      ho.dma_rings.push_back(std::size_t(r * 1024) << 10);
    }
    return dos_bench::run_host(ho);
  }
  if (sub == "plan") {
    dos_bench::PlanOptions po;
    if (app.count("--subgroup-size") == 0) subgroup_d = 1e8;
    if (!subgroups_v.empty()) po.subgroups.clear();
    for (double s : subgroups_v) {
      if (!(s >= 1 && s <= 1e5) || s != std::floor(s)) {
        std::fprintf(stderr, "dos-bench plan: --subgroups takes whole numbers in [1, 1e5], got %g\n", s);
        return 1;
      }
      po.subgroups.push_back(std::size_t(s));
    }
    if (!(subgroup_d >= 1 && subgroup_d <= 1e10) || subgroup_d != std::floor(subgroup_d) || reps < 1) {
      std::fprintf(stderr,
                   "dos-bench plan: --subgroup-size must be a whole number in [1, 1e10] and --reps >= 1 (got "
                   "--subgroup-size %g, --reps %d)\n",
                   subgroup_d, reps);
      return 1;
    }
    po.subgroup_size = std::size_t(subgroup_d);
    po.reps = app.count("--reps") ? reps : 20;
    po.json = json;
    return dos_bench::run_plan(po);
  }
  if (sub == "overhead") {
    dos_bench::OverheadOptions oo;
    if (app.count("--subgroup-size") == 0) subgroup_d = 10007;
    if (subgroups_v.size() > 1) {
      std::fprintf(stderr, "dos-bench overhead: --subgroups takes one count\n");
      return 1;
    }
    const double subgroups_d = subgroups_v.empty() ? 55 : subgroups_v[0];
    if (!(subgroup_d >= 1 && subgroup_d <= 1e9) || !(subgroups_d >= 1 && subgroups_d <= 1e5) || reps < 1 ||
        empty_tasks < 1 || subgroup_d != std::floor(subgroup_d) || subgroups_d != std::floor(subgroups_d)) {
      std::fprintf(stderr, "dos-bench overhead: --subgroup-size must be a whole number in [1, 1e9], --subgroups a whole "
                           "number in [1, 1e5], --reps and --empty-tasks >= 1\n");
      return 1;
    }
    oo.subgroup_size = std::size_t(subgroup_d);
    oo.subgroups = std::size_t(subgroups_d);
    oo.phases = app.count("--reps") ? reps : 20;
    oo.empty_tasks = empty_tasks;
    oo.json = json;
    try {
      return dos_bench::run_overhead(oo);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dos-bench overhead: %s\n", e.what());
      return 1;
    }
  }
  if (sub == "stream") {
    dos_bench::StreamOptions so;
    if (app.count("--n") == 0) n_d = 1.6e9;
    if (!(n_d >= 1 && n_d <= 1e11) || n_d != std::floor(n_d) || !(subgroup_d >= 1 && subgroup_d <= n_d) ||
        subgroup_d != std::floor(subgroup_d) || reps < 1) {
      std::fprintf(stderr, "dos-bench stream: --n must be a whole number in [1, 1e11], --subgroup-size a whole "
                           "number in [1, n], --reps >= 1\n");
      return 1;
    }
    so.n = std::size_t(n_d);
    so.subgroup_size = std::size_t(subgroup_d);
    so.iterations = reps;
    so.json = json;
    for (const std::string& v : stream_variants) {
      const auto colon = v.find(':');
      const std::string la = v.substr(0, colon), wb = colon == std::string::npos ? "" : v.substr(colon + 1);
      char* end = nullptr;
      const long l = std::strtol(la.c_str(), &end, 10);
      if (la.empty() || *end || l < 0 || l > 1000 || (wb != "eager" && wb != "end")) {
        std::fprintf(stderr, "dos-bench stream: a variant is LOOKAHEAD:WRITEBACK (0-1000, eager or end), got '%s'\n",
                     v.c_str());
        return 1;
      }
      so.variants.push_back({int(l), wb == "eager"});
    }
    try {
      return dos_bench::run_stream(so);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dos-bench stream: %s\n", e.what());
      return 1;
    }
  }
  if (sub != "kernels") {
    std::fprintf(stderr, "dos-bench: unknown benchmark '%s': use kernels, stream, overhead, host or plan\n", sub.c_str());
    return 1;
  }
  if (app.count("--n") == 0) n_d = 1 << 27;
  if (!(n_d >= 1 && n_d <= 4e9) || n_d != std::floor(n_d) || reps < 1) {
    std::fprintf(stderr, "dos-bench: --n must be a whole number in [1, 4e9] and --reps >= 1 (got --n %g, --reps %d)\n",
                 n_d, reps);
    return 1;
  }
  const std::size_t n = std::size_t(n_d);
  std::vector<Row> rows;
  try {  // the CPU side's arrays at their peak (the compact rows' seven more beside the first six): 37 bytes per element
    dos::check_host_memory(n * 37, "dos-bench kernels --n " + std::to_string(n) + " (37 bytes per element)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dos-bench kernels: %s\n", e.what());
    return 1;
  }

  // ---- CPU ----
  float* p = static_cast<float*>(alloc_touched(n * 4));
  float* m = static_cast<float*>(alloc_touched(n * 4));
  float* v = static_cast<float*>(alloc_touched(n * 4));
  float* g32 = static_cast<float*>(alloc_touched(n * 4));
  void* g16 = alloc_touched(n * 2);
  void* out16 = alloc_touched(n * 2);
  const double triad = best_of(reps, [&] {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) p[i] = m[i] + 1.5f * v[i];
  });
  rows.push_back({"cpu", "triad (info)", "fp32", n, triad, 12, 12.0 * double(n) / triad / 1e9});
  std::memset(p, 0, n * 4);
  std::memset(m, 0, n * 4);
  std::memset(v, 0, n * 4);
  std::memset(g32, 0, n * 4);
  const double adam_roof_s = best_of(reps, [&] { adam_bytes_roof(p, m, v, g32, static_cast<std::uint16_t*>(out16), n); });
  const double roof_adam = 30.0 * double(n) / adam_roof_s / 1e9;
  rows.push_back({"cpu", "adam bytes (roof)", "fp32 grad + 16-bit copy", n, adam_roof_s, 30, roof_adam});
  const double cpu_copy_s = best_of(reps, [&] { dos::copy_cpu(p, g32, n * 4); });  // the kernels' chunked copy
  const double roof_copy = 8.0 * double(n) / cpu_copy_s / 1e9;
  rows.push_back({"cpu", "copy (roof)", "fp32", n, cpu_copy_s, 8, roof_copy});
  std::memset(p, 0, n * 4);
  const dos::AdamStepParams sp = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  struct AdamVariant {
    const char* label;
    const void* grad;
    dos::DType grad_dtype;
    void* copy;  // nullptr: no parameter copy
    dos::DType copy_dtype;
    double bytes_per_param;
  };
  using dos::DType;
  const AdamVariant variants[] = {{"fp32 grad, no copy", g32, DType::fp32, nullptr, DType::fp32, 28},
                                  {"bf16 grad + bf16 copy", g16, DType::bf16, out16, DType::bf16, 28},
                                  {"fp16 grad + fp16 copy", g16, DType::fp16, out16, DType::fp16, 28},
                                  {"fp32 grad + bf16 copy", g32, DType::fp32, out16, DType::bf16, 30},
                                  {"fp32 grad + fp16 copy", g32, DType::fp32, out16, DType::fp16, 30}};
  for (const AdamVariant& a : variants)
    rows.push_back({"cpu", "adam", a.label, n,
                    best_of(reps, [&] { dos::adam_step_cpu(p, m, v, a.grad, a.grad_dtype, a.copy, a.copy_dtype, n, sp); }),
                    a.bytes_per_param, roof_adam});
  {  // the out-of-place update of speculative steps (adam_step_into_cpu): the same bytes moved
    const std::size_t bytes = (n * 4 + 63) / 64 * 64;
    float* p2 = static_cast<float*>(std::aligned_alloc(64, bytes));
    float* m2 = static_cast<float*>(std::aligned_alloc(64, bytes));
    float* v2 = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (p2 && m2 && v2) {
      for (float* q : {p2, m2, v2}) dos::zero_fill_cpu(q, n);  // first touch by the threads that write it
      rows.push_back({"cpu", "adam out of place", std::string("bf16 grad + bf16 copy, ") + dos::adam_into_reads(), n,
                      best_of(reps, [&] { dos::adam_step_into_cpu(p, m, v, p2, m2, v2, g16, DType::bf16, out16, DType::bf16, n, sp); }),
                      28, roof_adam});
    }
    for (float* q : {p2, m2, v2}) std::free(q);
  }
  {  // the compact master (compact_master.h): its step in place, and out of place (a speculative
     // step's; DOS_COMPACT_INTO says how it writes), bf16 gradients, beside the same roof. Both
     // must move 26.25 bytes per parameter (14.125 in, 12.125 out); "cache" moves about 10 more
    const std::size_t nb = dos::compact_round_up_bytes(n);
    auto* pc = static_cast<std::uint16_t*>(alloc_touched(n * 2));
    auto* lo = static_cast<std::uint16_t*>(alloc_touched(n * 2));
    auto* r = static_cast<std::uint8_t*>(alloc_touched(nb));
    auto* lo2 = static_cast<std::uint16_t*>(alloc_touched(n * 2));
    auto* r2 = static_cast<std::uint8_t*>(alloc_touched(nb));
    float* m2 = static_cast<float*>(alloc_touched(n * 4));
    float* v2 = static_cast<float*>(alloc_touched(n * 4));
    std::memset(g16, 0, n * 2);
    rows.push_back({"cpu", "adam compact", "bf16 grad, in place", n,
                    best_of(reps, [&] { dos::adam_step_compact_cpu(pc, lo, r, m, v, g16, DType::bf16, n, sp); }), 26.25,
                    roof_adam});
    rows.push_back({"cpu", "adam compact out of place", std::string("bf16 grad, ") + dos::compact_into_writes(), n,
                    best_of(reps, [&] { dos::adam_step_compact_into_cpu(lo, r, m, v, pc, lo2, r2, m2, v2, g16, DType::bf16, n, sp); }),
                    26.25, roof_adam});
    for (void* q : {static_cast<void*>(pc), static_cast<void*>(lo), static_cast<void*>(r), static_cast<void*>(lo2),
                    static_cast<void*>(r2), static_cast<void*>(m2), static_cast<void*>(v2)})
      std::free(q);
  }
  for (dos::DType t : {dos::DType::bf16, dos::DType::fp16}) {
    const std::string name = dos::dtype_name(t);
    rows.push_back({"cpu", "convert", name + " -> fp32", n,
                    best_of(reps, [&] { dos::convert_to_f32_cpu(g16, t, g32, n); }), 6, roof_copy});
    rows.push_back({"cpu", "convert", "fp32 -> " + name, n,
                    best_of(reps, [&] { dos::convert_from_f32_cpu(g32, out16, t, n); }), 6, roof_copy});
  }
  for (void* q : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v), static_cast<void*>(g32), g16, out16})
    std::free(q);

  // ---- GPU ----
#if defined(DOS_HAVE_CUDA)
  double copy_s = 0;
  if (dos::benchmark_cuda_copy(n * 4, &copy_s) == 0) {
    const double roof_gpu = 8.0 * double(n) / copy_s / 1e9;  // reads and writes n * 4 bytes
    rows.push_back({"gpu", "d2d copy (roof)", "fp32", n, copy_s, 8, roof_gpu});
    for (dos::DType t : {dos::DType::fp32, dos::DType::bf16, dos::DType::fp16}) {
      double adam_s = 0, conv_s = 0, store_s = 0;
      if (dos::benchmark_cuda_kernels(n, t, &adam_s, &conv_s, &store_s) != 0) break;
      const double gb = double(dos::dtype_size(t));
      const std::string name = dos::dtype_name(t);
      rows.push_back({"gpu", "adam", name + " grad + " + name + " copy", n, adam_s, 24 + 2 * gb, roof_gpu});
      if (t == dos::DType::fp32) continue;  // fp32 -> fp32 would be a copy
      rows.push_back({"gpu", "convert", name + " -> fp32", n, conv_s, gb + 4, roof_gpu});
      rows.push_back({"gpu", "convert", "fp32 -> " + name, n, store_s, gb + 4, roof_gpu});
    }
  }
#endif

  if (json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const Row& r : rows)
      j.push_back({{"side", r.side}, {"kernel", r.kernel}, {"dtype", r.dtype}, {"elements", r.n}, {"seconds", r.seconds},
                   {"gparams_per_s", double(r.n) / r.seconds / 1e9},
                   {"gb_per_s", r.bytes_per_param * double(r.n) / r.seconds / 1e9}, {"bytes_per_param", r.bytes_per_param},
                   {"roof_gb_per_s", r.roof_gbs},
                   {"percent_of_roof", 100.0 * r.bytes_per_param * double(r.n) / r.seconds / 1e9 / r.roof_gbs}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("dos-bench kernels: %zu elements, best of %d, %d OpenMP threads\n", n, reps, omp_get_max_threads());
  std::printf("%-4s %-18s %-24s %10s %10s %9s %6s %8s\n", "side", "kernel", "dtype", "seconds", "Gparams/s", "GB/s",
              "B/par", "% roof");
  for (const Row& r : rows) {
    const double gps = double(r.n) / r.seconds / 1e9, gbs = r.bytes_per_param * gps;
    std::printf("%-4s %-18s %-24s %10.5f %10.3f %9.1f %6.0f %7.1f%%\n", r.side.c_str(), r.kernel.c_str(), r.dtype.c_str(),
                r.seconds, gps, gbs, r.bytes_per_param, 100.0 * gbs / r.roof_gbs);
  }
  return 0;
}
