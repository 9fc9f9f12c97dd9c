// The runtime's own parameter upload (runtime/param_upload.h): each job's `done` runs once, in the
// order the jobs were queued, also for jobs still queued when the uploader is destroyed; an upload
// that cannot be made reports why and no bytes; with a GPU, the bytes land where the segments say
// (two segments, an odd element count, 16-bit elements) and nothing else of the destination moves.
// Without CUDA in the build the uploader refuses to exist. The GPU case skips without a GPU.
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cmocka_cpp.h"
#include "param_upload.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

using dos::detail::ParamUploader;

struct Record {
  std::mutex mu;
  std::vector<int> order;
  std::vector<ParamUploader::Result> results;
};

#if defined(DOS_HAVE_CUDA)

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Jobs whose destination is host memory cannot be uploaded: each reports an error and 0 bytes, each
// done runs once and in queue order, and destroying the uploader right after queueing them still
// runs every one (on a machine without a GPU, the CUDA calls themselves fail, with the same outcome).
void test_errors_in_order(void**) {
  std::vector<std::uint16_t> host(1000, 7), not_gpu(1000, 0);
  dos::Segment seg{not_gpu.data(), nullptr, 0, 1000};
  dos::ScatterArgs args{&seg, 1, dos::DType::bf16};
  Record rec;
  {
    ParamUploader up;
    for (int j = 0; j < 5; ++j)
      up.enqueue({&args, host.data(), [&rec, j](const ParamUploader::Result& r) {
                    std::lock_guard<std::mutex> g(rec.mu);
                    rec.order.push_back(j);
                    rec.results.push_back(r);
                  }});
  }  // the destructor finishes the queue
  assert_int_equal(rec.order.size(), 5);
  for (int j = 0; j < 5; ++j) {
    assert_int_equal(rec.order[std::size_t(j)], j);
    const ParamUploader::Result& r = rec.results[std::size_t(j)];
    assert_false(r.error.empty());
    assert_int_equal(r.bytes, 0);
    assert_true(r.end_us >= r.start_us);
  }
  for (std::uint16_t v : not_gpu) assert_int_equal(v, 0);  // nothing was written to the host "destination"
}

// A real upload: two segments of one subgroup (3 and 1998 elements, packed in the staging buffer at
// offsets 0 and 3) into two places of a device buffer; read back, the segments hold the staged bits
// and the elements around them keep their fill.
void test_upload_on_gpu(void**) {
  if (!have_gpu()) skip();
  const std::size_t n = 4096, a = 3, b = 1998;
  std::uint16_t* staging = nullptr;
  assert_int_equal(cudaMallocHost(reinterpret_cast<void**>(&staging), (a + b) * 2), cudaSuccess);
  for (std::size_t i = 0; i < a + b; ++i) staging[i] = std::uint16_t(0x3f80 + i);
  std::uint16_t* dev = nullptr;
  assert_int_equal(cudaMalloc(reinterpret_cast<void**>(&dev), n * 2), cudaSuccess);
  assert_int_equal(cudaMemset(dev, 0xff, n * 2), cudaSuccess);
  dos::Segment segs[2] = {{dev + 10, nullptr, 0, a}, {dev + 1000, nullptr, a, b}};
  dos::ScatterArgs args{segs, 2, dos::DType::bf16};
  Record rec;
  {
    ParamUploader up;
    up.enqueue({&args, staging, [&rec](const ParamUploader::Result& r) {
                  std::lock_guard<std::mutex> g(rec.mu);
                  rec.results.push_back(r);
                }});
  }
  assert_int_equal(rec.results.size(), 1);
  assert_true(rec.results[0].error.empty());
  assert_int_equal(rec.results[0].bytes, (a + b) * 2);
  std::vector<std::uint16_t> back(n);
  assert_int_equal(cudaMemcpy(back.data(), dev, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t want = 0xffff;
    if (i >= 10 && i < 10 + a) want = staging[i - 10];
    if (i >= 1000 && i < 1000 + b) want = staging[a + (i - 1000)];
    if (back[i] != want) fail_msg("element %zu: %#x, want %#x", i, unsigned(back[i]), unsigned(want));
  }
  cudaFree(dev);
  cudaFreeHost(staging);
}

#else

void test_needs_cuda(void**) {
  bool threw = false;
  try {
    ParamUploader up;
  } catch (const std::logic_error&) {
    threw = true;
  }
  assert_true(threw);
}

#endif

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
#if defined(DOS_HAVE_CUDA)
      cmocka_unit_test(test_errors_in_order),
      cmocka_unit_test(test_upload_on_gpu),
#else
      cmocka_unit_test(test_needs_cuda),
#endif
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
