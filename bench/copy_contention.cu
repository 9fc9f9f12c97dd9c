// copy-contention: how long one subgroup-sized copy takes on a stream of its own while another
// stream keeps the same PCIe direction busy with a deep queue of large copies (what StarPU's one
// transfer stream per direction does while it prefetches streamed state), by cudaMemcpyAsync and
// by pcie_copy_cuda (codelets/kernels/pcie_copy.h: the GPU's cores move the bytes) with several
// grid sizes. Measurement program for the GPU machine; prints one line per case.
//
// Host buffers are pinned as the runtime pins them (posix_memalign, then cudaHostRegister with
// cudaHostRegisterPortable, as StarPU's starpu_memory_pin does). Background: `--depth` copies of
// `--chunk-mb` MB queued at once on stream A, then `--refill` more issued one every `--refill-ms`
// from the probe's issue on (a queue kept full, as StarPU's prefetches keep it); the probe,
// `--probe-mb` MB, is issued `--delay-ms` after the first background copies. If the probe ends
// only with the refills, the other stream starves it. Per case: the probe's latency (issue to
// completion, ms) and rate (GB/s, 1e9 bytes), and the background's overall rate. Both directions.
// First, a check of pcie_copy_cuda's bytes at odd offsets and lengths, both directions.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pcie_copy.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = cudaError_t(x);                                                           \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

char* pinned(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) std::exit(1);
  std::memset(p, 0, bytes);
  CK(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
  return static_cast<char*>(p);
}

// pcie_copy_cuda at host offset ho, device offset dof, n bytes, both ways: only [offset, offset+n)
// of the destination changes, and it holds the source's bytes.
bool check(char* h, char* h_dev, char* d, std::size_t ho, std::size_t dof, std::size_t n, cudaStream_t s) {
  const std::size_t span = 4096;
  std::vector<char> ref(span), got(span);
  for (std::size_t i = 0; i < span; ++i) h[i] = char(i * 7 + 1), ref[i] = char(i * 13 + 5);
  CK(cudaMemcpy(d, ref.data(), span, cudaMemcpyHostToDevice));
  CK(dos::pcie_copy_cuda(d + dof, h_dev + ho, n, true, 3, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(got.data(), d, span, cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < span; ++i) {
    const char want = (i >= dof && i < dof + n) ? h[ho + i - dof] : ref[i];
    if (got[i] != want) return std::printf("check up %zu %zu %zu: byte %zu wrong\n", ho, dof, n, i), false;
  }
  for (std::size_t i = 0; i < span; ++i) h[i] = ref[i];  // host gets a known fill, the device keeps its bytes
  CK(dos::pcie_copy_cuda(h_dev + ho, d + dof, n, false, 3, s));
  CK(cudaStreamSynchronize(s));
  for (std::size_t i = 0; i < span; ++i) {
    const char want = (i >= ho && i < ho + n) ? got[dof + i - ho] : ref[i];
    if (h[i] != want) return std::printf("check down %zu %zu %zu: byte %zu wrong\n", ho, dof, n, i), false;
  }
  return true;
}

int main(int argc, char** argv) {
  std::size_t chunk_mb = 496, probe_mb = 248;
  int depth = 10, delay_ms = 20, refill = 20, refill_ms = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    long v = std::atol(argv[i + 1]);
    if (k == "--chunk-mb") chunk_mb = std::size_t(v);
    else if (k == "--probe-mb") probe_mb = std::size_t(v);
    else if (k == "--depth") depth = int(v);
    else if (k == "--delay-ms") delay_ms = int(v);
    else if (k == "--refill") refill = int(v);
    else if (k == "--refill-ms") refill_ms = int(v);
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  const std::size_t chunk = chunk_mb << 20, probe = probe_mb << 20;
  char* h_bg = pinned(chunk * 2);
  char* h_probe = pinned(probe + 4096);
  char *d_bg, *d_probe, *h_probe_dev;
  CK(cudaMalloc(&d_bg, chunk * 2));
  CK(cudaMalloc(&d_probe, probe + 4096));
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h_probe_dev), h_probe, 0));
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  int ok = 0, cases = 0;
  for (std::size_t ho : {0, 2, 15, 16})
    for (std::size_t dof : {0, 6, 16, 17})
      for (std::size_t n : {1, 2, 15, 16, 17, 33, 1000, 2049}) ok += check(h_probe, h_probe_dev, d_probe, ho, dof, n, b), ++cases;
  std::printf("pcie_copy_cuda check: %d of %d cases right\n", ok, cases);
  cudaEvent_t bg_done, probe_done;
  CK(cudaEventCreateWithFlags(&bg_done, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&probe_done, cudaEventDisableTiming));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMemcpy(d_bg, h_bg, chunk, cudaMemcpyHostToDevice));
  const unsigned grids[] = {0, unsigned(sms) / 4, unsigned(sms) / 2, unsigned(sms), 2 * unsigned(sms), 4 * unsigned(sms)};
  for (int up = 1; up >= 0; --up)
    for (int bg = 0; bg <= 1; ++bg)
      for (unsigned g : grids) {
        const auto t_bg = clk::now();
        auto issue_bg = [&](int q) {
          char* hs = h_bg + (q % 2) * chunk;
          char* ds = d_bg + (q % 2) * chunk;
          if (up) CK(cudaMemcpyAsync(ds, hs, chunk, cudaMemcpyHostToDevice, a));
          else CK(cudaMemcpyAsync(hs, ds, chunk, cudaMemcpyDeviceToHost, a));
        };
        std::thread refiller;
        if (bg) {
          for (int q = 0; q < depth; ++q) issue_bg(q);
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          refiller = std::thread([&] {
            for (int q = 0; q < refill; ++q) {
              std::this_thread::sleep_for(std::chrono::milliseconds(refill_ms));
              issue_bg(depth + q);
            }
            CK(cudaEventRecord(bg_done, a));
          });
        }
        const auto t0 = clk::now();
        if (g == 0) {
          if (up) CK(cudaMemcpyAsync(d_probe, h_probe, probe, cudaMemcpyHostToDevice, b));
          else CK(cudaMemcpyAsync(h_probe, d_probe, probe, cudaMemcpyDeviceToHost, b));
        } else {
          // odd offsets, as a subgroup's segment may have: host +2 bytes, device +6
          if (up) CK(dos::pcie_copy_cuda(d_probe + 6, h_probe_dev + 2, probe, true, g, b));
          else CK(dos::pcie_copy_cuda(h_probe_dev + 2, d_probe + 6, probe, false, g, b));
        }
        CK(cudaEventRecord(probe_done, b));
        CK(cudaEventSynchronize(probe_done));
        const double probe_ms = ms_since(t0);
        std::printf("%s %-11s %-10s probe %4zu MB in %7.1f ms (%5.1f GB/s)", up ? "H2D" : "D2H",
                    g == 0 ? "memcpy" : ("kernel:" + std::to_string(g)).c_str(), bg ? "background" : "alone",
                    probe_mb, probe_ms, probe / probe_ms / 1e6);
        if (bg) {
          refiller.join();
          CK(cudaEventSynchronize(bg_done));
          std::printf("; background %d x %zu MB ended %7.1f ms after the probe's issue (%5.1f GB/s overall)",
                      depth + refill, chunk_mb, ms_since(t0),
                      (double(depth + refill) * chunk + probe) / ms_since(t_bg) / 1e6);
        }
        std::printf("\n");
      }
  return ok == cases ? 0 : 1;
}
