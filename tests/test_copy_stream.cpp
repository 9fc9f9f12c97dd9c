// The runtime's own copies between GPU tensors and host staging (runtime/copy_stream.h): each job's
// `done` runs once, in the order the jobs were queued, also for jobs still queued when the
// CopyStream is destroyed; a copy that cannot be made reports why and no bytes; with a GPU, the
// bytes land where the segments say, both ways (two segments, an odd element count, 16-bit
// elements up, 16-bit gradients down; pinned staging, copied by the kernel, with segments whose
// host and device addresses differ modulo 16 bytes, and pageable staging, copied by
// cudaMemcpyAsync) and nothing else of the destination moves; many jobs queued at once (taken by
// the thread as one batch, issued together, waited for in order) land as each would alone, with a
// failing job among them failing alone and the spans one after the other; each result says whether
// the copy engine made it. Without CUDA in the build the CopyStream refuses to exist. The GPU cases
// skip without a GPU. download_starved's rule is checked everywhere.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cmocka_cpp.h"
#include "copy_stream.h"

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

using dos::detail::CopyStream;

struct Record {
  std::mutex mu;
  std::vector<int> order;
  std::vector<CopyStream::Result> results;
};

#if defined(DOS_HAVE_CUDA)

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// A job of one direction over segs, recording its result in rec under tag j.
CopyStream::Job job(CopyStream::Direction dir, const dos::Segment* segs, std::size_t nseg, void* host, Record& rec,
                    int j) {
  CopyStream::Job jb;
  jb.dir = dir;
  jb.segs = segs;
  jb.nseg = nseg;
  jb.elem_bytes = 2;
  jb.host = host;
  jb.done = [&rec, j](const CopyStream::Result& r) {
    std::lock_guard<std::mutex> g(rec.mu);
    rec.order.push_back(j);
    rec.results.push_back(r);
  };
  return jb;
}

// Jobs whose GPU side is host memory cannot be copied, either way: each reports an error and 0
// bytes, each done runs once and in queue order, and destroying the CopyStream right after queueing
// them still runs every one (on a machine without a GPU, the CUDA calls themselves fail, with the
// same outcome). Neither side is written.
void test_errors_in_order(void**) {
  std::vector<std::uint16_t> host(1000, 7), not_gpu(1000, 0);
  dos::Segment seg{not_gpu.data(), not_gpu.data(), 0, 1000};
  Record rec;
  {
    CopyStream cs;
    for (int j = 0; j < 6; ++j)
      cs.enqueue(job(j % 2 ? CopyStream::Direction::to_host : CopyStream::Direction::to_gpu, &seg, 1, host.data(), rec, j));
  }  // the destructor finishes the queue
  assert_int_equal(rec.order.size(), 6);
  for (int j = 0; j < 6; ++j) {
    assert_int_equal(rec.order[std::size_t(j)], j);
    const CopyStream::Result& r = rec.results[std::size_t(j)];
    assert_false(r.error.empty());
    assert_int_equal(r.bytes, 0);
    assert_true(r.end_us >= r.start_us);
  }
  for (std::uint16_t v : not_gpu) assert_int_equal(v, 0);  // nothing was written to the "GPU" side
  for (std::uint16_t v : host) assert_int_equal(v, 7);     // nor to the host side
}

/// One job through a CopyStream of its own, waited for (the destructor drains the queue): it must
/// end once, without an error, having copied `bytes`, by the copy engine when `by_engine` (the
/// default DOS_COPY_BY: downloads and unpinned staging) and by the kernel otherwise.
void copy_one(CopyStream::Direction dir, const dos::Segment* segs, std::size_t nseg, void* host, std::size_t bytes,
              bool by_engine) {
  Record rec;
  {
    CopyStream cs;
    cs.enqueue(job(dir, segs, nseg, host, rec, 0));
  }
  assert_int_equal(rec.results.size(), 1);
  if (!rec.results[0].error.empty()) fail_msg("copy failed: %s", rec.results[0].error.c_str());
  assert_int_equal(rec.results[0].bytes, bytes);
  assert_int_equal(rec.results[0].by_engine, by_engine);
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
  copy_one(CopyStream::Direction::to_gpu, segs, 2, staging, (a + b) * 2, false);
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

// A real download: the gradients of two segments (1 and 2047 elements) at two places of a device
// buffer, packed into a staging buffer at offsets 0 and 1; the staging holds the device's bits
// there, and its element past the end keeps its fill.
void test_download_on_gpu(void**) {
  if (!have_gpu()) skip();
  const std::size_t n = 8192, a = 1, b = 2047;
  std::vector<std::uint16_t> grads(n);
  for (std::size_t i = 0; i < n; ++i) grads[i] = std::uint16_t(0xbf00 + 3 * i);
  std::uint16_t* dev = nullptr;
  assert_int_equal(cudaMalloc(reinterpret_cast<void**>(&dev), n * 2), cudaSuccess);
  assert_int_equal(cudaMemcpy(dev, grads.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  std::uint16_t* staging = nullptr;
  assert_int_equal(cudaMallocHost(reinterpret_cast<void**>(&staging), (a + b + 1) * 2), cudaSuccess);
  for (std::size_t i = 0; i < a + b + 1; ++i) staging[i] = 0x1234;
  dos::Segment segs[2] = {{nullptr, dev + 4000, 0, a}, {nullptr, dev + 17, a, b}};
  copy_one(CopyStream::Direction::to_host, segs, 2, staging, (a + b) * 2, true);
  assert_int_equal(staging[0], grads[4000]);
  for (std::size_t i = 0; i < b; ++i)
    if (staging[a + i] != grads[17 + i]) fail_msg("element %zu: %#x, want %#x", a + i, unsigned(staging[a + i]), unsigned(grads[17 + i]));
  assert_int_equal(staging[a + b], 0x1234);
  cudaFree(dev);
  cudaFreeHost(staging);
}

// Staging that is not pinned (pageable memory: the runtime could not pin it) has no device
// pointer and goes by cudaMemcpyAsync: an upload from a std::vector lands all the same.
void test_pageable_staging(void**) {
  if (!have_gpu()) skip();
  const std::size_t n = 1001;
  std::vector<std::uint16_t> staging(n);
  for (std::size_t i = 0; i < n; ++i) staging[i] = std::uint16_t(0x4000 + 5 * i);
  std::uint16_t* dev = nullptr;
  assert_int_equal(cudaMalloc(reinterpret_cast<void**>(&dev), (n + 8) * 2), cudaSuccess);
  assert_int_equal(cudaMemset(dev, 0, (n + 8) * 2), cudaSuccess);
  dos::Segment seg{dev + 3, nullptr, 0, n};
  copy_one(CopyStream::Direction::to_gpu, &seg, 1, staging.data(), n * 2, true);
  std::vector<std::uint16_t> back(n + 8);
  assert_int_equal(cudaMemcpy(back.data(), dev, (n + 8) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t i = 0; i < n + 8; ++i) {
    const std::uint16_t want = i >= 3 && i < 3 + n ? staging[i - 3] : 0;
    if (back[i] != want) fail_msg("element %zu: %#x, want %#x", i, unsigned(back[i]), unsigned(want));
  }
  cudaFree(dev);
}

// 40 jobs queued back to back (the thread takes them in one or more batches: each issued together,
// waited for in order), uploads and downloads of 1..40 odd-sized elements at distinct places, with a job
// whose GPU side is host memory at position 7: every other job copies its bytes and only those,
// the failing one reports an error and 0 bytes and writes nothing, every done runs once in queue
// order, and each span starts no earlier than the one before it on the stream ended (one stream
// runs them in turn; the failing job went on none).
void test_batch_on_gpu(void**) {
  if (!have_gpu()) skip();
  const int jobs = 40;
  const std::size_t stride = 64;  // elements per job's region, on both sides
  std::uint16_t *staging = nullptr, *dev = nullptr;
  assert_int_equal(cudaMallocHost(reinterpret_cast<void**>(&staging), jobs * stride * 2), cudaSuccess);
  assert_int_equal(cudaMalloc(reinterpret_cast<void**>(&dev), jobs * stride * 2), cudaSuccess);
  std::vector<std::uint16_t> dev_init(jobs * stride);
  for (std::size_t i = 0; i < dev_init.size(); ++i) {
    staging[i] = std::uint16_t(0x1000 + i);
    dev_init[i] = std::uint16_t(0x8000 + 7 * i);
  }
  assert_int_equal(cudaMemcpy(dev, dev_init.data(), dev_init.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<std::uint16_t> not_gpu(stride, 0);
  std::vector<dos::Segment> segs(jobs);
  Record rec;
  {
    CopyStream cs;
    for (int j = 0; j < jobs; ++j) {
      const std::size_t count = std::size_t(j % 37) + 1, at = std::size_t(j) * stride;
      segs[std::size_t(j)] = j == 7 ? dos::Segment{not_gpu.data(), not_gpu.data(), at, count}
                                    : dos::Segment{dev + at + 1, dev + at + 1, at, count};
      cs.enqueue(job(j % 2 ? CopyStream::Direction::to_host : CopyStream::Direction::to_gpu, &segs[std::size_t(j)], 1,
                     staging, rec, j));
    }
  }
  assert_int_equal(rec.order.size(), jobs);
  std::vector<std::uint16_t> back(jobs * stride);
  assert_int_equal(cudaMemcpy(back.data(), dev, back.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int j = 0; j < jobs; ++j) {
    assert_int_equal(rec.order[std::size_t(j)], j);
    const CopyStream::Result& r = rec.results[std::size_t(j)];
    const std::size_t count = std::size_t(j % 37) + 1, at = std::size_t(j) * stride;
    if (j == 7) {
      assert_false(r.error.empty());
      assert_int_equal(r.bytes, 0);
    } else {
      if (!r.error.empty()) fail_msg("job %d failed: %s", j, r.error.c_str());
      assert_int_equal(r.bytes, count * 2);
    }
    // the job before it on the stream: job 7 issued nothing, so job 8's span follows job 6's
    const int before = j == 8 ? 6 : j - 1;
    if (j > 0 && j != 7 && r.start_us < rec.results[std::size_t(before)].end_us)
      fail_msg("job %d's span starts at %.1f us, before job %d's ended (%.1f us)", j, r.start_us, before,
               rec.results[std::size_t(before)].end_us);
    assert_true(r.end_us >= r.start_us);
    const bool up = j % 2 == 0;
    for (std::size_t i = 0; i + 1 < stride; ++i) {
      // device element at + 1 + i took staging[at + i] on an upload; staging[at + i] took the
      // device's at + 1 + i on a download; everything else kept its fill
      const bool in = j != 7 && i < count;
      const std::uint16_t want_dev = up && in ? std::uint16_t(0x1000 + at + i) : dev_init[at + 1 + i];
      if (back[at + 1 + i] != want_dev)
        fail_msg("job %d, device element %zu: %#x, want %#x", j, at + 1 + i, unsigned(back[at + 1 + i]), unsigned(want_dev));
      const std::uint16_t want_host = !up && in ? dev_init[at + 1 + i] : std::uint16_t(0x1000 + at + i);
      if (staging[at + i] != want_host)
        fail_msg("job %d, staging element %zu: %#x, want %#x", j, at + i, unsigned(staging[at + i]), unsigned(want_host));
    }
  }
  for (std::uint16_t v : not_gpu) assert_int_equal(v, 0);
  cudaFree(dev);
  cudaFreeHost(staging);
}

#else

void test_needs_cuda(void**) {
  bool threw = false;
  try {
    CopyStream up;
  } catch (const std::logic_error&) {
    threw = true;
  }
  assert_true(threw);
}

#endif

// download_starved against its rule worked by hand: a download starves when it took more than the
// floor and more than 10 times its bytes at B_d2h (50 GB/s here: 248 MB in 4.96 ms, so 49.6 ms),
// never without a rate or for a time that is not a number
void test_download_starved(void**) {
  using dos::detail::download_starved;
  const double B = 50e9;
  const std::size_t big = 248000000, small = 20000;
  assert_true(download_starved(0.542, big, B, 0.1));    // the 542 ms wait measured on an H100
  assert_false(download_starved(0.0138, big, B, 0.1));  // the longest on an H200 where none waited
  assert_false(download_starved(0.099, big, B, 0.1));   // above 10x, below the floor
  assert_true(download_starved(0.101, big, B, 0.1));
  assert_false(download_starved(0.0495, big, B, 0.0));  // just under 10x
  assert_true(download_starved(0.0497, big, B, 0.0));
  assert_true(download_starved(5e-6, small, B, 0.0));   // 20 kB: 0.4 us at B, so 4 us
  assert_false(download_starved(3e-6, small, B, 0.0));
  assert_false(download_starved(10.0, big, 0.0, 0.1));  // no rate: never
  assert_false(download_starved(10.0, big, -1.0, 0.1));
  assert_false(download_starved(std::nan(""), big, B, 0.1));
  assert_true(download_starved(0.2, 0, B, 0.1));  // nothing copied, yet 200 ms from issue to end
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
#if defined(DOS_HAVE_CUDA)
      cmocka_unit_test(test_errors_in_order),
      cmocka_unit_test(test_upload_on_gpu),
      cmocka_unit_test(test_download_on_gpu),
      cmocka_unit_test(test_pageable_staging),
      cmocka_unit_test(test_batch_on_gpu),
#else
      cmocka_unit_test(test_needs_cuda),
#endif
      cmocka_unit_test(test_download_starved),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
