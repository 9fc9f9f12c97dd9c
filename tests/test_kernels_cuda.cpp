// CUDA kernels against the CPU kernels (themselves tested against the double-precision and
// bit-level references in test_kernels): the same bits, since both sides do the same fp32
// operations in the same order (--fmad=false, -ffp-contract=off). Covers the vector path (16-byte
// aligned buffers), the scalar path (buffers offset by 1-3 elements), every tail length, every
// gradient and parameter dtype, several steps, and the conversions over special values. And the
// copy kernel between pinned host and device memory (pcie_copy.h) at every small misalignment;
// Adam without a parameter copy, and a dtype outside DType's values refused by every launch;
// infinite masters (without an L2 term) in the Adam comparison. And the compact-master Adam
// (compact_master.h) against adam_step_compact_cpu: P, lo, the packed r bits (no byte beyond
// ceil(n / 8) written), exp_avg, exp_avg_sq, over sizes around warps and bytes.
// Exits 77 (skip) without a CUDA device.
#include <algorithm>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "adam.h"
#include "cmocka_cpp.h"
#include "compact_master.h"
#include "pcie_copy.h"

using dos::DType;

namespace {

/// Device buffer of `bytes`, plus `offset_bytes` of slack in front (to misalign on purpose).
struct DevBuf {
  char* base = nullptr;
  std::size_t offset = 0;
  DevBuf(std::size_t bytes, std::size_t offset_bytes) : offset(offset_bytes) {
    assert_int_equal(cudaMalloc(&base, bytes + offset_bytes + 16), cudaSuccess);
  }
  ~DevBuf() { cudaFree(base); }
  void* ptr() const { return base + offset; }
  void put(const void* src, std::size_t bytes) {
    assert_int_equal(cudaMemcpy(ptr(), src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void get(void* dst, std::size_t bytes) const {
    assert_int_equal(cudaMemcpy(dst, ptr(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

std::vector<std::uint8_t> random_grads(std::size_t n, DType t, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::uint8_t> out(n * dos::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const float x = nd(rng) * (i % 7 == 0 ? 1e-3f : 1.0f);
    if (t == DType::fp32) std::memcpy(&out[4 * i], &x, 4);
    else {
      const std::uint16_t h = t == DType::bf16 ? dos::f32_to_bf16(x) : dos::f32_to_f16(x);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

void expect_same_bits(const void* a, const void* b, std::size_t bytes, const char* what, std::size_t n,
                      std::size_t offset) {
  if (std::memcmp(a, b, bytes) != 0) {
    std::size_t i = 0;
    while (static_cast<const char*>(a)[i] == static_cast<const char*>(b)[i]) ++i;
    std::fprintf(stderr, "%s differs at byte %zu (n %zu, offset %zu elements)\n", what, i, n, offset);
    fail();
  }
}

void test_adam_cuda_equals_cpu(void**) {
  std::mt19937 rng(7);
  const std::size_t sizes[] = {1, 3, 4, 5, 6, 8, 15, 17, 1023, 4099, 65536 + 7, (1u << 20) + 3};
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16})
    for (DType pt : {DType::fp32, DType::bf16, DType::fp16})
      for (std::size_t n : sizes)
        for (std::size_t off : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(4)}) {
          dos::AdamHyper h;
          h.lr = 1e-3;
          h.weight_decay = (n % 2) ? 0.1 : 0.0;
          h.decoupled = (n % 3) != 0;
          std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
          std::normal_distribution<float> nd(0.0f, 0.5f);
          for (float& x : p) x = nd(rng);
          // infinite masters where the gradient gets no L2 term (AdamW, Adam without weight decay):
          // both kernels leave the moments finite and the master infinite (a NaN would not do here:
          // the CPU and the GPU give NaNs different payloads)
          if ((h.decoupled || h.weight_decay == 0) && n >= 2) {
            p[0] = INFINITY;
            p[n - 1] = -INFINITY;
          }
          const std::size_t gs = dos::dtype_size(gt), ps = dos::dtype_size(pt);
          DevBuf dp(4 * n, 4 * off), dm(4 * n, 4 * off), dv(4 * n, 4 * off), dg(gs * n, gs * off), dout(ps * n, ps * off);
          dp.put(p.data(), 4 * n);
          dm.put(m.data(), 4 * n);
          dv.put(v.data(), 4 * n);
          std::vector<std::uint8_t> out_cpu(ps * n), out_gpu(ps * n);
          for (std::int64_t step = 1; step <= 3; ++step) {
            const auto g = random_grads(n, gt, rng);
            dg.put(g.data(), g.size());
            const dos::AdamStepParams sp = dos::make_adam_step_params(h, step);
            dos::adam_step_cpu(p.data(), m.data(), v.data(), g.data(), gt, out_cpu.data(), pt, n, sp);
            assert_int_equal(dos::adam_step_cuda(static_cast<float*>(dp.ptr()), static_cast<float*>(dm.ptr()),
                                                 static_cast<float*>(dv.ptr()), dg.ptr(), gt, dout.ptr(), pt, n, sp,
                                                 nullptr),
                             0);
          }
          std::vector<float> pg(n), mg(n), vg(n);
          dp.get(pg.data(), 4 * n);
          dm.get(mg.data(), 4 * n);
          dv.get(vg.data(), 4 * n);
          dout.get(out_gpu.data(), ps * n);
          expect_same_bits(p.data(), pg.data(), 4 * n, "master", n, off);
          expect_same_bits(m.data(), mg.data(), 4 * n, "exp_avg", n, off);
          expect_same_bits(v.data(), vg.data(), 4 * n, "exp_avg_sq", n, off);
          expect_same_bits(out_cpu.data(), out_gpu.data(), ps * n, "16-bit copy", n, off);
        }
}

// Conversions both ways over random values plus specials (zeros, subnormals of both formats,
// rounding ties, overflow, inf), every tail, aligned and misaligned: the CPU kernels' bits.
void test_conversions_cuda_equal_cpu(void**) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits;
  const std::size_t sizes[] = {1, 2, 4, 7, 64, 4097, (1u << 18) + 1};
  for (std::size_t n : sizes)
    for (std::size_t off : {std::size_t(0), std::size_t(1), std::size_t(2)}) {
      std::vector<float> src(n);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u = bits(rng);
        if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x00400000u;  // keep NaN out: its payload is not compared
        if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xff800000u;
        std::memcpy(&src[i], &u, 4);
        if (i % 5 == 1) src[i] = std::ldexp(float(int(u % 4096)), -24 - int(u % 5));  // fp16 subnormals, ties
        if (i % 11 == 2) src[i] = (u % 2 ? 65520.0f : -65519.0f);
      }
      for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
        const std::size_t es = dos::dtype_size(t);
        std::vector<std::uint8_t> narrow_cpu(es * n), narrow_gpu(es * n);
        dos::convert_from_f32_cpu(src.data(), narrow_cpu.data(), t, n);
        DevBuf d32(4 * n, 4 * off), d16(es * n, es * off);
        d32.put(src.data(), 4 * n);
        assert_int_equal(dos::convert_from_f32_cuda(static_cast<const float*>(d32.ptr()), d16.ptr(), t, n, nullptr), 0);
        d16.get(narrow_gpu.data(), es * n);
        expect_same_bits(narrow_cpu.data(), narrow_gpu.data(), es * n, "fp32 -> 16-bit", n, off);
        std::vector<float> wide_cpu(n), wide_gpu(n);
        dos::convert_to_f32_cpu(narrow_cpu.data(), t, wide_cpu.data(), n);
        assert_int_equal(cudaMemset(d32.ptr(), 0xff, 4 * n), cudaSuccess);
        assert_int_equal(dos::convert_to_f32_cuda(d16.ptr(), t, static_cast<float*>(d32.ptr()), n, nullptr), 0);
        d32.get(wide_gpu.data(), 4 * n);
        expect_same_bits(wide_cpu.data(), wide_gpu.data(), 4 * n, "16-bit -> fp32", n, off);
      }
    }
  // every fp16 bit pattern, NaNs included, widens to the CPU's bits
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) all[b] = std::uint16_t(b);
  std::vector<float> wide_cpu(65536), wide_gpu(65536);
  dos::convert_to_f32_cpu(all.data(), DType::fp16, wide_cpu.data(), 65536);
  DevBuf d16(2 * 65536, 0), d32(4 * 65536, 0);
  d16.put(all.data(), 2 * 65536);
  assert_int_equal(dos::convert_to_f32_cuda(d16.ptr(), DType::fp16, static_cast<float*>(d32.ptr()), 65536, nullptr), 0);
  d32.get(wide_gpu.data(), 4 * 65536);
  // NaN: both sides NaN (the CPU's F16C/AVX-512 conversion quiets signalling NaNs, the scalar code
  // keeps their payload, as test_kernels allows); every other pattern: the same bits.
  for (std::uint32_t b = 0; b < 65536; ++b) {
    if (std::isnan(wide_cpu[b])) {
      assert_true(std::isnan(wide_gpu[b]));
    } else if (std::memcmp(&wide_cpu[b], &wide_gpu[b], 4) != 0) {
      std::fprintf(stderr, "fp16 pattern 0x%04x: CPU %a, GPU %a\n", b, double(wide_cpu[b]), double(wide_gpu[b]));
      fail();
    }
  }
}

// pcie_copy_cuda both ways between pinned host memory (its mapped pointer) and device memory, at
// every pair of host and device offsets 0..17 bytes (co-aligned modulo 16 or not), lengths around
// the 16-byte unit and long ones, with 1 and 3 blocks: the destination's range holds the source's
// bytes and every byte around it keeps its fill.
void test_pcie_copy(void**) {
  const std::size_t span = 8192;
  char* h = nullptr;
  assert_int_equal(cudaMallocHost(reinterpret_cast<void**>(&h), span), cudaSuccess);
  char* h_dev = nullptr;
  assert_int_equal(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h_dev), h, 0), cudaSuccess);
  DevBuf d(span, 0);
  std::vector<char> fill(span), got(span), src(span);
  for (std::size_t i = 0; i < span; ++i) fill[i] = char(i * 13 + 5), src[i] = char(i * 7 + 1);
  for (unsigned blocks : {1u, 3u})
    for (std::size_t ho = 0; ho < 18; ++ho)
      for (std::size_t dof = 0; dof < 18; ++dof)
        for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(15), std::size_t(16), std::size_t(17),
                              std::size_t(31), std::size_t(4097), std::size_t(8000)}) {
          // up: host bytes src -> device, device pre-filled
          std::memcpy(h, src.data(), span);
          d.put(fill.data(), span);
          assert_int_equal(dos::pcie_copy_cuda(static_cast<char*>(d.ptr()) + dof, h_dev + ho, n, true, blocks, nullptr), 0);
          assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
          d.get(got.data(), span);
          for (std::size_t i = 0; i < span; ++i) {
            const char want = i >= dof && i < dof + n ? src[ho + i - dof] : fill[i];
            if (got[i] != want) fail_msg("up: host +%zu, device +%zu, %zu bytes: byte %zu wrong", ho, dof, n, i);
          }
          // down: device bytes src -> host, host pre-filled
          d.put(src.data(), span);
          std::memcpy(h, fill.data(), span);
          assert_int_equal(dos::pcie_copy_cuda(h_dev + ho, static_cast<char*>(d.ptr()) + dof, n, false, blocks, nullptr), 0);
          assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
          for (std::size_t i = 0; i < span; ++i) {
            const char want = i >= ho && i < ho + n ? src[dof + i - ho] : fill[i];
            if (h[i] != want) fail_msg("down: host +%zu, device +%zu, %zu bytes: byte %zu wrong", ho, dof, n, i);
          }
        }
  cudaFreeHost(h);
}

/// Preloading every kernel succeeds on the device (run first, before any test launches one). Its
/// effect, the first phase's kernels not waiting behind the state transfers, is a time: dos-train's
/// first iteration with and without DOS_PRELOAD_KERNELS=0 shows it, not this test.
void test_preload(void**) {
  assert_int_equal(dos::preload_adam_kernels(), 0);
  assert_int_equal(dos::preload_pcie_copy_kernels(), 0);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
}

// Adam with no parameter copy (param_out nullptr), every gradient dtype, aligned and not, odd
// sizes: the CPU kernel's bits; and a dtype outside DType's values refused by every launch
// (cudaErrorInvalidValue, nothing launched, nothing written).
void test_adam_cuda_no_copy_and_bad_dtype(void**) {
  std::mt19937 rng(13);
  dos::AdamHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16})
    for (std::size_t n : {std::size_t(5), std::size_t(4099)})
      for (std::size_t off : {std::size_t(0), std::size_t(1)}) {
        std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
        std::normal_distribution<float> nd(0.0f, 0.5f);
        for (float& x : p) x = nd(rng);
        const std::size_t gs = dos::dtype_size(gt);
        DevBuf dp(4 * n, 4 * off), dm(4 * n, 4 * off), dv(4 * n, 4 * off), dg(gs * n, gs * off);
        dp.put(p.data(), 4 * n);
        dm.put(m.data(), 4 * n);
        dv.put(v.data(), 4 * n);
        for (std::int64_t step = 1; step <= 2; ++step) {
          const auto g = random_grads(n, gt, rng);
          dg.put(g.data(), g.size());
          const dos::AdamStepParams sp = dos::make_adam_step_params(h, step);
          dos::adam_step_cpu(p.data(), m.data(), v.data(), g.data(), gt, nullptr, DType::bf16, n, sp);
          assert_int_equal(dos::adam_step_cuda(static_cast<float*>(dp.ptr()), static_cast<float*>(dm.ptr()),
                                               static_cast<float*>(dv.ptr()), dg.ptr(), gt, nullptr, DType::bf16, n,
                                               sp, nullptr),
                           0);
        }
        std::vector<float> pg(n), mg(n), vg(n);
        dp.get(pg.data(), 4 * n);
        dm.get(mg.data(), 4 * n);
        dv.get(vg.data(), 4 * n);
        expect_same_bits(p.data(), pg.data(), 4 * n, "master (no copy)", n, off);
        expect_same_bits(m.data(), mg.data(), 4 * n, "exp_avg (no copy)", n, off);
        expect_same_bits(v.data(), vg.data(), 4 * n, "exp_avg_sq (no copy)", n, off);
      }
  const std::size_t n = 64;
  const DType bad = static_cast<DType>(7);
  DevBuf dp(4 * n, 0), dm(4 * n, 0), dv(4 * n, 0), dg(4 * n, 0), dout(4 * n, 0);
  const std::vector<float> ones(n, 1.0f);
  dp.put(ones.data(), 4 * n);
  const dos::AdamStepParams sp = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  float* fp = static_cast<float*>(dp.ptr());
  float* fm = static_cast<float*>(dm.ptr());
  float* fv = static_cast<float*>(dv.ptr());
  assert_int_equal(dos::adam_step_cuda(fp, fm, fv, dg.ptr(), bad, dout.ptr(), DType::fp32, n, sp, nullptr),
                   cudaErrorInvalidValue);
  assert_int_equal(dos::adam_step_cuda(fp, fm, fv, dg.ptr(), DType::fp32, dout.ptr(), bad, n, sp, nullptr),
                   cudaErrorInvalidValue);
  assert_int_equal(dos::convert_to_f32_cuda(dg.ptr(), bad, fm, n, nullptr), cudaErrorInvalidValue);
  assert_int_equal(dos::convert_from_f32_cuda(fp, dout.ptr(), bad, n, nullptr), cudaErrorInvalidValue);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> back(n);
  dp.get(back.data(), 4 * n);
  expect_same_bits(ones.data(), back.data(), 4 * n, "master after refused launches", n, 0);
}

// The compact-master Adam on the GPU against adam_step_compact_cpu (tested against adam_step_cpu in
// test_compact_master), bit for bit, every gradient dtype, Adam and AdamW, 3 steps, sizes around a
// warp's 32 elements and r's bytes, unaligned arrays; the bytes after r's ceil(n / 8) untouched. And
// n == 0 and a bad gradient dtype: nothing launched.
void test_adam_compact_cuda_equals_cpu(void**) {
  std::mt19937 rng(17);
  const std::size_t sizes[] = {1, 7, 8, 9, 31, 32, 33, 63, 65, 1023, 4099, 65536 + 7, (1u << 20) + 3};
  constexpr std::size_t kGuard = 64;
  for (DType gt : {DType::bf16, DType::fp16, DType::fp32})
    for (std::size_t n : sizes)
      for (std::size_t off : {std::size_t(0), std::size_t(1)}) {
        dos::AdamHyper h;
        h.weight_decay = 0.1;
        h.decoupled = (n % 2) != 0;
        std::normal_distribution<float> nd(0.0f, 0.5f);
        std::uniform_int_distribution<int> expo(-30, 30);
        std::vector<std::uint16_t> p(n), lo(n);
        std::vector<float> m(n, 0.0f), v(n, 0.0f);
        const std::size_t nb = dos::compact_round_up_bytes(n);
        std::vector<std::uint8_t> r(nb + kGuard, 0xA5);
        for (std::size_t i = 0; i < n; ++i) {
          float x = std::ldexp(nd(rng), expo(rng));
          std::uint32_t u;
          std::memcpy(&u, &x, 4);
          if (i % 8 == 5) u = (u & 0xffff0000u) | 0x8000u;  // rounding ties
          if (h.decoupled && n >= 3 && i == n - 2) u = 0xff800000u;  // -inf (no L2 term)
          p[i] = dos::f32_to_bf16(dos::bits_f32(u));
          std::uint16_t l;
          std::uint32_t b;
          dos::compact_split(u, p[i], &l, &b);
          lo[i] = l;
          if (i % 8 == 0) r[i / 8] = 0;
          r[i / 8] |= std::uint8_t(b << (i % 8));
        }
        // the last byte's unused bits set: each kernel must write them 0, not keep them
        if (n % 8) r[nb - 1] |= std::uint8_t(0xff << (n % 8));
        DevBuf dp(2 * n, 2 * off), dlo(2 * n, 2 * off), dr(nb + kGuard, 0), dm(4 * n, 4 * off), dv(4 * n, 4 * off),
            dg(4 * n, 4 * off);
        dp.put(p.data(), 2 * n);
        dlo.put(lo.data(), 2 * n);
        dr.put(r.data(), r.size());
        dm.put(m.data(), 4 * n);
        dv.put(v.data(), 4 * n);
        for (std::int64_t step = 1; step <= 3; ++step) {
          const auto g = random_grads(n, gt, rng);
          dg.put(g.data(), g.size());
          const dos::AdamStepParams sp = dos::make_adam_step_params(h, step);
          dos::adam_step_compact_cpu(p.data(), lo.data(), r.data(), m.data(), v.data(), g.data(), gt, n, sp);
          assert_int_equal(dos::adam_step_compact_cuda(static_cast<std::uint16_t*>(dp.ptr()),
                                                       static_cast<std::uint16_t*>(dlo.ptr()),
                                                       static_cast<std::uint8_t*>(dr.ptr()), static_cast<float*>(dm.ptr()),
                                                       static_cast<float*>(dv.ptr()), dg.ptr(), gt, n, sp, nullptr),
                           0);
        }
        std::vector<std::uint16_t> pg(n), lg(n);
        std::vector<std::uint8_t> rg(nb + kGuard);
        std::vector<float> mg(n), vg(n);
        dp.get(pg.data(), 2 * n);
        dlo.get(lg.data(), 2 * n);
        dr.get(rg.data(), rg.size());
        dm.get(mg.data(), 4 * n);
        dv.get(vg.data(), 4 * n);
        expect_same_bits(p.data(), pg.data(), 2 * n, "compact P", n, off);
        expect_same_bits(lo.data(), lg.data(), 2 * n, "compact lo", n, off);
        expect_same_bits(r.data(), rg.data(), rg.size(), "compact r bits and the guard bytes after them", n, off);
        expect_same_bits(m.data(), mg.data(), 4 * n, "compact exp_avg", n, off);
        expect_same_bits(v.data(), vg.data(), 4 * n, "compact exp_avg_sq", n, off);
      }
  const dos::AdamStepParams sp = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  assert_int_equal(dos::adam_step_compact_cuda(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, DType::bf16, 0, sp,
                                               nullptr),
                   0);
  DevBuf d(64, 0);
  std::uint16_t* q = static_cast<std::uint16_t*>(d.ptr());
  float* f = static_cast<float*>(d.ptr());
  assert_int_equal(dos::adam_step_compact_cuda(q, q, static_cast<std::uint8_t*>(d.ptr()), f, f, f,
                                               static_cast<DType>(7), 4, sp, nullptr),
                   cudaErrorInvalidValue);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

// adam_step_compact_cuda_at over a subgroup cut into segments starting at every residue mod 32
// (lengths 1 to 70, and long ones), launched one after another on one stream in a shuffled order,
// against adam_step_compact_cpu on the whole subgroup: P, lo, exp_avg, exp_avg_sq and r's bytes the
// same bits after each of 3 steps, r's words beyond the subgroup's last one untouched; a
// misaligned r and a bad gradient dtype launch nothing.
void test_adam_compact_cuda_segments(void**) {
  std::mt19937 rng(29);
  constexpr std::size_t kGuard = 64;
  for (DType gt : {DType::bf16, DType::fp32})
    for (std::size_t n : {std::size_t(1), std::size_t(45), std::size_t(4099), std::size_t(200003), std::size_t(3000017)}) {
      dos::AdamHyper h;
      h.weight_decay = 0.1;
      std::normal_distribution<float> nd(0.0f, 0.5f);
      std::vector<std::uint16_t> p(n), lo(n);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      const std::size_t words = (n + 31) / 32, nb = dos::compact_round_up_bytes(n);
      std::vector<std::uint8_t> r(4 * words + kGuard, 0xA5);
      std::fill(r.begin(), r.begin() + long(4 * words), std::uint8_t(0));  // bits beyond n: 0, as the CPU writes them
      for (std::size_t i = 0; i < n; ++i) {
        const float x = nd(rng);
        std::uint32_t u;
        std::memcpy(&u, &x, 4);
        p[i] = dos::f32_to_bf16(x);
        std::uint16_t l;
        std::uint32_t b;
        dos::compact_split(u, p[i], &l, &b);
        lo[i] = l;
        r[i / 8] |= std::uint8_t(b << (i % 8));
      }
      DevBuf dp(2 * n, 0), dlo(2 * n, 0), dr(r.size(), 0), dm(4 * n, 0), dv(4 * n, 0), dg(4 * n, 0);
      dp.put(p.data(), 2 * n);
      dlo.put(lo.data(), 2 * n);
      dr.put(r.data(), r.size());
      dm.put(m.data(), 4 * n);
      dv.put(v.data(), 4 * n);
      std::vector<std::size_t> cuts{0};
      // the largest subgroup also gets a segment of 2e6 elements from element 37: more than one
      // grid-stride trip of the kernel
      if (n > 2000000) cuts.insert(cuts.end(), {37, 37 + 2000000});
      while (cuts.back() < n) cuts.push_back(std::min(n, cuts.back() + (rng() % 4 == 0 ? 1 + rng() % 50000 : 1 + rng() % 70)));
      std::vector<std::size_t> order(cuts.size() - 1);
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::shuffle(order.begin(), order.end(), rng);
      const std::size_t gsz = dos::dtype_size(gt);
      for (std::int64_t step = 1; step <= 3; ++step) {
        const auto g = random_grads(n, gt, rng);
        dg.put(g.data(), g.size());
        const dos::AdamStepParams sp = dos::make_adam_step_params(h, step);
        dos::adam_step_compact_cpu(p.data(), lo.data(), r.data(), m.data(), v.data(), g.data(), gt, n, sp);
        for (std::size_t k : order) {
          const std::size_t a = cuts[k], c = cuts[k + 1] - a;
          assert_int_equal(dos::adam_step_compact_cuda_at(static_cast<std::uint16_t*>(dp.ptr()) + a,
                                                          static_cast<std::uint16_t*>(dlo.ptr()) + a,
                                                          static_cast<std::uint8_t*>(dr.ptr()), a,
                                                          static_cast<float*>(dm.ptr()) + a,
                                                          static_cast<float*>(dv.ptr()) + a,
                                                          static_cast<const char*>(dg.ptr()) + a * gsz, gt, c, sp, nullptr),
                           0);
        }
      }
      std::vector<std::uint16_t> pg(n), lg(n);
      std::vector<std::uint8_t> rg(r.size());
      std::vector<float> mg(n), vg(n);
      dp.get(pg.data(), 2 * n);
      dlo.get(lg.data(), 2 * n);
      dr.get(rg.data(), rg.size());
      dm.get(mg.data(), 4 * n);
      dv.get(vg.data(), 4 * n);
      expect_same_bits(p.data(), pg.data(), 2 * n, "segmented compact P", n, 0);
      expect_same_bits(lo.data(), lg.data(), 2 * n, "segmented compact lo", n, 0);
      expect_same_bits(r.data(), rg.data(), nb, "segmented compact r bits", n, 0);
      expect_same_bits(r.data() + 4 * words, rg.data() + 4 * words, kGuard, "the guard bytes after r's words", n, 0);
      expect_same_bits(m.data(), mg.data(), 4 * n, "segmented compact exp_avg", n, 0);
      expect_same_bits(v.data(), vg.data(), 4 * n, "segmented compact exp_avg_sq", n, 0);
      std::printf("  n=%zu grad=%s: %zu segments in a shuffled order, the same bits as the CPU on the whole subgroup\n", n,
                  dos::dtype_name(gt), order.size());
    }
  const dos::AdamStepParams sp = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  DevBuf d(256, 0);
  std::uint16_t* q = static_cast<std::uint16_t*>(d.ptr());
  float* f = static_cast<float*>(d.ptr());
  auto* b = static_cast<std::uint8_t*>(d.ptr());
  assert_int_equal(dos::adam_step_compact_cuda_at(q, q, b + 1, 3, f, f, f, DType::bf16, 4, sp, nullptr),
                   cudaErrorMisalignedAddress);
  assert_int_equal(dos::adam_step_compact_cuda_at(q, q, b, 3, f, f, f, static_cast<DType>(7), 4, sp, nullptr),
                   cudaErrorInvalidValue);
  assert_int_equal(dos::adam_step_compact_cuda_at(nullptr, nullptr, nullptr, 3, nullptr, nullptr, nullptr, DType::bf16, 0,
                                                  sp, nullptr),
                   0);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_preload),
      cmocka_unit_test(test_adam_cuda_equals_cpu),
      cmocka_unit_test(test_conversions_cuda_equal_cpu),
      cmocka_unit_test(test_pcie_copy),
      cmocka_unit_test(test_adam_cuda_no_copy_and_bad_dtype),
      cmocka_unit_test(test_adam_compact_cuda_equals_cpu),
      cmocka_unit_test(test_adam_compact_cuda_segments),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
