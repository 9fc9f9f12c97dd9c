// dos-bench host (host_bench.cpp): CPU Adam and PCIe DMA sharing host memory, the resource that
// bounds a mixed update phase.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dos_bench {

/// n: parameters per CPU Adam call (bf16 gradients and parameter copy over fp32 state: 12 B of
/// state, 2 B of gradient and 2 B of copy per parameter, 28 B of host traffic per parameter
/// updated); reps: timed calls per measurement (after one untimed); threads: OpenMP team sizes to
/// try (each team bound to the cores after the DMA thread's); pages: host memory to try, each
/// "STATE" or "STATE/DMA" (the Adam state's and the DMA buffers' kinds), a kind being "4k"
/// (posix_memalign, transparent huge pages refused with MADV_NOHUGEPAGE, cudaHostRegister),
/// "huge" (2 MiB aligned, MADV_HUGEPAGE, cudaHostRegister) or "cuda" (cudaHostAlloc);
/// dma_bytes: bytes per cudaMemcpyAsync of the DMA loop; dma_rings: the host memory the DMA loop
/// cycles through, one measurement each: 0 for a buffer of 1 GiB per direction in copies of
/// dma_bytes (memory no cache holds), or a size in bytes (at least 64 KiB, a multiple of 16 KiB:
/// four slots of whole 4 KiB pages) for one buffer that both directions share in copies of a
/// quarter of it, as a staging ring of four slots would; both directions start at the first slot
/// and go round in step, so the device writes the slot it is also reading. Whether that traffic
/// costs CPU Adam on other memory shows in its rate beside it.
struct HostOptions {
  std::size_t n = 0;
  int reps = 5;
  std::vector<int> threads;
  std::vector<std::string> pages;
  std::size_t dma_bytes = std::size_t(64) << 20;
  std::vector<std::size_t> dma_rings = {0};
  /// The DMA loop's directions, one measurement each: "both" (full duplex), "h2d" or "d2h" (that
  /// direction alone: the other's buffer stays idle). Rates are per direction that runs.
  std::vector<std::string> dma_directions = {"both"};
  /// The CPU Adam's state forms, each measured after the other with the same team: "full"
  /// (adam_step_cpu: fp32 master, exp_avg, exp_avg_sq, a bf16 copy written; 28 B/param with
  /// non-temporal copy stores, else 30) and "compact" (adam_step_compact_cpu, compact_master.h:
  /// bf16 P read and written, lo, packed r bits, exp_avg, exp_avg_sq; 26.25 B/param).
  std::vector<std::string> states = {"full"};
  double dma_seconds = 0;  ///< > 0: only the DMA loop (its first dma_directions), this long, its rate printed per half second
  bool json = false;
};

/// For each page backing, DMA ring and set of DMA directions: the DMA alone (GB/s per direction
/// that runs), then for each team size and each state form CPU Adam alone and beside the DMA loop
/// (Gparams/s, median of reps; the DMA's GB/s per direction over the same interval), and the host
/// traffic of both (the form's bytes per parameter + every DMA direction that runs, GB/s). JSON rows
/// name their "state", "bytes_per_param" and "dma_directions"; the top level's "bytes_per_param" is
/// the full form's. Prints a table or JSON. Returns 0, or 1 with a message on stderr when the build
/// has no CUDA, a team size exceeds the cores the process may use less one, or memory cannot be
/// allocated or pinned, or a ring size is not one dma_rings allows, or a dma_directions value is not
/// both, h2d or d2h (or there is none), or a states value is not full or compact (or there is none).
/// Without a usable GPU it measures CPU Adam alone only (unpinned memory, the team from the first
/// core, rows without the DMA's keys; "gpu": false in JSON), says so on stderr and returns 1; --pages
/// with cuda memory and dma_seconds are then refused. With dma_seconds > 0, only the DMA loop runs (on the first page kind's memory), for
/// that long, its rate each way printed per half second: what another program's CPU work (run
/// beside it) leaves to the DMA.
int run_host(const HostOptions& o);

}  // namespace dos_bench
