// dos-bench stream: the runtime's streaming of optimizer state through the GPU against the PCIe
// roof measured in the same process (a benchmark that catches a regression of the streaming).
//
// The roof is cudaMemcpyAsync between pinned host memory and the device, both directions at once
// (dos::benchmark_pcie). The runtime runs the `gpu` policy (every subgroup streamed: its fp32
// state goes up and comes back, 12 B/param each way; the gradients and parameters stay on the GPU,
// where the caller's buffers are) on scratch bf16 parameters in device memory, once per streaming
// variant (lookahead, write-back), and reports the bytes StarPU moved each way per second of
// update phase, and that rate as a % of the roof.
#include "stream_bench.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "adam.h"
#include "dos.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace dos_bench {

int run_stream(const StreamOptions& o) {
#if !defined(DOS_HAVE_CUDA)
  (void)o;
  std::fprintf(stderr, "dos-bench stream: this build has no CUDA\n");
  return 1;
#else
  dos::PcieRoof roof;
  const std::size_t roof_bytes = std::size_t(1) << 30;
  if (dos::benchmark_pcie(roof_bytes, &roof) != 0) {
    std::fprintf(stderr, "dos-bench stream: no usable GPU (the PCIe roof could not be measured)\n");
    return 1;
  }
  dos::RuntimeOptions ro;
  ro.policy = "gpu";
  ro.verbose = false;
  dos::Runtime rt(ro);
  if (rt.cuda_workers() == 0) {
    std::fprintf(stderr, "dos-bench stream: StarPU has no CUDA worker\n");
    return 1;
  }
  const std::size_t n = o.n;
  void *params = nullptr, *grads = nullptr;
  if (cudaMalloc(&params, n * 2) != cudaSuccess || cudaMalloc(&grads, n * 2) != cudaSuccess ||
      cudaMemset(params, 0, n * 2) != cudaSuccess || cudaMemset(grads, 0, n * 2) != cudaSuccess) {
    std::fprintf(stderr, "dos-bench stream: cannot allocate %zu bf16 parameters and gradients on the GPU\n", n);
    return 1;
  }
  struct Result {
    StreamVariant v;
    double seconds, h2d, d2h;
  };
  std::vector<Result> results;
  for (const StreamVariant& v : o.variants) {
    dos::OptimizerOptions oo;
    oo.subgroup_size = o.subgroup_size;
    oo.dtype = dos::DType::bf16;
    oo.memory = dos::MemoryKind::cuda;
    oo.verbose = false;
    oo.stream_lookahead = unsigned(v.lookahead);
    oo.eager_writeback = v.eager;
    dos::Optimizer opt(rt, {{params, grads, n}}, oo);
    std::vector<dos::StepStats> st;
    for (int i = 0; i < o.iterations + 1; ++i) st.push_back(opt.step());  // the first pays allocations
    std::sort(st.begin() + 1, st.end(), [](const dos::StepStats& a, const dos::StepStats& b) { return a.seconds < b.seconds; });
    const dos::StepStats& med = st[1 + (st.size() - 1) / 2];
    results.push_back({v, med.seconds, double(med.bytes_h2d) / med.seconds, double(med.bytes_d2h) / med.seconds});
  }
  cudaFree(params);
  cudaFree(grads);
  if (o.json) {
    nlohmann::ordered_json j = {{"params", n}, {"subgroup_size", o.subgroup_size},
                                {"roof", {{"h2d", roof.h2d}, {"d2h", roof.d2h}, {"duplex_h2d", roof.duplex_h2d},
                                          {"duplex_d2h", roof.duplex_d2h}}},
                                {"runs", nlohmann::ordered_json::array()}};
    for (const Result& r : results)
      j["runs"].push_back({{"lookahead", r.v.lookahead}, {"writeback", r.v.eager ? "eager" : "end"},
                           {"update_seconds_median", r.seconds}, {"h2d_bytes_per_s", r.h2d}, {"d2h_bytes_per_s", r.d2h},
                           {"percent_of_duplex_roof_h2d", 100 * r.h2d / roof.duplex_h2d},
                           {"percent_of_duplex_roof_d2h", 100 * r.d2h / roof.duplex_d2h}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("dos-bench stream: %zu bf16 parameters in subgroups of %zu, policy gpu (all streamed), median of %d "
              "iterations after the first\n", n, o.subgroup_size, o.iterations);
  std::printf("roof (cudaMemcpyAsync, pinned, %zu MiB): H2D alone %.1f GB/s, D2H alone %.1f GB/s, both at once "
              "%.1f + %.1f GB/s\n", roof_bytes >> 20, roof.h2d / 1e9, roof.d2h / 1e9, roof.duplex_h2d / 1e9,
              roof.duplex_d2h / 1e9);
  std::printf("%-10s %-10s %10s %10s %10s %9s %9s\n", "lookahead", "writeback", "update s", "H2D GB/s", "D2H GB/s",
              "% roof up", "% roof dn");
  for (const Result& r : results)
    std::printf("%-10d %-10s %10.4f %10.1f %10.1f %8.1f%% %8.1f%%\n", r.v.lookahead, r.v.eager ? "eager" : "end",
                r.seconds, r.h2d / 1e9, r.d2h / 1e9, 100 * r.h2d / roof.duplex_h2d, 100 * r.d2h / roof.duplex_d2h);
  return 0;
#endif
}

}  // namespace dos_bench
