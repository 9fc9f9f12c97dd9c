// CPU kernels against the independent references in reference.h: the 16-bit conversions, and
// Adam/AdamW over sizes with every kind of tail, for fp32, fp16 and bf16 gradients, several steps.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "adam.h"
#include "cmocka_cpp.h"
#include "reference.h"

using dos::DType;

namespace {


// Every fp16 bit pattern decodes exactly like _Float16.
void test_f16_decode_exhaustive(void**) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float a = dos::f16_to_f32(uint16_t(b)), r = ref::f16_bits_to_float(uint16_t(b));
    if (std::isnan(r)) assert_true(std::isnan(a));
    else assert_memory_equal(&a, &r, 4);
  }
}

// fp32 -> fp16 and fp32 -> bf16 round to nearest even like the references, over a sweep of
// 2^24 fp32 bit patterns (every 256th) plus the boundary cases.
void test_f32_to_16bit_sweep(void**) {
  std::vector<uint32_t> patterns;
  for (uint64_t u = 0; u < (1ull << 32); u += 251) patterns.push_back(uint32_t(u));
  const float specials[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                            6.1035156e-5f, 6.1035152e-5f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1e-45f,
                            3.4028235e38f, 3.3895314e38f, 3.3961e38f, -0.0f, INFINITY, -INFINITY};
  for (float s : specials) {
    uint32_t u;
    std::memcpy(&u, &s, 4);
    patterns.push_back(u);
    patterns.push_back(u ^ 0x80000000u);
  }
  for (uint32_t u : patterns) {
    float x;
    std::memcpy(&x, &u, 4);
    const uint16_t h = dos::f32_to_f16(x), hr = ref::float_to_f16_bits(x);
    if (std::isnan(x)) {
      assert_true(std::isnan(ref::f16_bits_to_float(h)));
    } else if (h != hr) {
      std::fprintf(stderr, "fp16 mismatch for %a (0x%08x): got 0x%04x want 0x%04x\n", double(x), u, h, hr);
      fail();
    }
    const float b = dos::bf16_to_f32(dos::f32_to_bf16(x)), br = ref::round_to_bf16(x);
    if (std::isnan(x)) {
      assert_true(std::isnan(b));
    } else if (std::memcmp(&b, &br, 4) != 0) {
      std::fprintf(stderr, "bf16 mismatch for %a: got %a want %a\n", double(x), double(b), double(br));
      fail();
    }
  }
}

// Deterministic pseudo-random values (xorshift), independent of the code under test.
struct Rng {
  uint64_t s;
  double uniform() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return double(s >> 11) * (1.0 / 9007199254740992.0);
  }
  double normal() { return std::sqrt(-2.0 * std::log(uniform() + 1e-300)) * std::cos(6.283185307179586 * uniform()); }
};

struct Case {
  size_t n;
  DType grad;
  DType param;
  bool decoupled;
};

void check_step(const Case& c, const ref::Hyper& h, const std::vector<float>& p, const std::vector<float>& m,
                const std::vector<float>& v, const std::vector<double>& pr, const std::vector<double>& mr,
                const std::vector<double>& vr, const std::vector<double>& mabs, const std::vector<double>& vabs,
                const std::vector<double>& grel, const std::vector<uint16_t>& out16, const std::vector<float>& out32,
                double* worst_p, double* worst_m, double* worst_v);

// Runs `steps` steps of the kernel. Before each step the reference takes the kernel's current
// state (so rounding does not compound across steps and each step's arithmetic is checked on its
// own, with the bias corrections of its step count t), computes the step in double, and the
// kernel's result must be within, per element:
//   |m - m_ref| <= 4 ref::ulp(M),  M = beta1 |m| + (1 - beta1)(|g| + |wd p|)   (m may cancel to ~0)
//   |v - v_ref| <= 4 ref::ulp(V),  V = beta2 v + (1 - beta2)(|g| + |wd p|)^2
//   |p - p_ref| <= 2 ref::ulp(p_ref) + lr * (1e-5 + 4 r)
//       r = ref::ulp(|g| + |wd p|) / |g + wd p|: the relative rounding error of the fp32 gradient of
//       Adam's coupled L2 (0 for AdamW, whose gradient is exact), which the update inherits.
// and the 16-bit parameter copy must be the master rounded to nearest even, exactly.
void run_case(const Case& c, int steps) {
  // The kernels take the hyper-parameters as fp32 (as torch's fp32 kernels do); the reference gets
  // the same fp32-representable values, so a difference is the kernel's arithmetic, not the inputs.
  const ref::Hyper h{double(1e-3f), double(0.9f), double(0.999f), double(1e-8f), double(0.1f), c.decoupled};
  dos::AdamHyper dh;
  dh.lr = h.lr;
  dh.beta1 = h.beta1;
  dh.beta2 = h.beta2;
  dh.eps = h.eps;
  dh.weight_decay = h.weight_decay;
  dh.decoupled = h.decoupled;
  Rng rng{0x1234567ull + c.n * 31 + int(c.grad) * 7 + c.decoupled};
  std::vector<float> p(c.n), m(c.n, 0.0f), v(c.n, 0.0f);
  std::vector<double> pr(c.n), mr(c.n), vr(c.n), mabs(c.n), vabs(c.n), grel(c.n);
  for (size_t i = 0; i < c.n; ++i) p[i] = float(rng.normal());
  double worst_p = 0, worst_m = 0, worst_v = 0;
  std::vector<uint16_t> g16(c.n), out16(c.n);
  std::vector<float> g32(c.n), out32(c.n);
  const bool out_is_32 = c.param == DType::fp32;
  for (int t = 1; t <= steps; ++t) {
    for (size_t i = 0; i < c.n; ++i) {
      const float g = float(rng.normal() * 1e-2 * (1 + (i % 5)));
      if (c.grad == DType::fp32) g32[i] = g;
      else if (c.grad == DType::fp16) g16[i] = ref::float_to_f16_bits(g);
      else {
        const float r = ref::round_to_bf16(g);
        uint32_t u;
        std::memcpy(&u, &r, 4);
        g16[i] = uint16_t(u >> 16);
      }
    }
    for (size_t i = 0; i < c.n; ++i) {
      pr[i] = p[i];
      mr[i] = m[i];
      vr[i] = v[i];
    }
    const void* gp = c.grad == DType::fp32 ? static_cast<const void*>(g32.data()) : g16.data();
    void* op = out_is_32 ? static_cast<void*>(out32.data()) : out16.data();
    // the out-of-place kernel (speculative updates) from the same state: the same bits, inputs untouched
    const std::vector<float> p_in = p, m_in = m, v_in = v;
    std::vector<float> p_o(c.n), m_o(c.n), v_o(c.n), out32_o(c.n);
    std::vector<uint16_t> out16_o(c.n);
    void* op_o = out_is_32 ? static_cast<void*>(out32_o.data()) : out16_o.data();
    dos::adam_step_into_cpu(p_in.data(), m_in.data(), v_in.data(), p_o.data(), m_o.data(), v_o.data(), gp, c.grad, op_o,
                            c.param, c.n, dos::make_adam_step_params(dh, t));
    dos::adam_step_cpu(p.data(), m.data(), v.data(), gp, c.grad, op, c.param, c.n, dos::make_adam_step_params(dh, t));
    assert_memory_equal(p_o.data(), p.data(), c.n * 4);
    assert_memory_equal(m_o.data(), m.data(), c.n * 4);
    assert_memory_equal(v_o.data(), v.data(), c.n * 4);
    if (out_is_32) assert_memory_equal(out32_o.data(), out32.data(), c.n * 4);
    else assert_memory_equal(out16_o.data(), out16.data(), c.n * 2);
    for (size_t i = 0; i < c.n; ++i) assert_true(double(p_in[i]) == pr[i] && double(m_in[i]) == mr[i] && double(v_in[i]) == vr[i]);
    for (size_t i = 0; i < c.n; ++i) {
      const double g = c.grad == DType::fp32 ? g32[i]
                       : c.grad == DType::fp16 ? ref::f16_bits_to_float(g16[i])
                                               : ref::bf16_bits_to_float(g16[i]);
      const double l2 = c.decoupled ? 0.0 : std::fabs(h.weight_decay * pr[i]);
      const double terms = std::fabs(g) + l2;
      grel[i] = c.decoupled ? 0.0 : ref::ulp(float(terms)) / std::max(std::fabs(g + h.weight_decay * pr[i]), 1e-30);
      mabs[i] = h.beta1 * std::fabs(mr[i]) + (1.0 - h.beta1) * terms;
      vabs[i] = h.beta2 * vr[i] + (1.0 - h.beta2) * terms * terms;
      ref::adam_step(pr[i], mr[i], vr[i], g, h, t);
    }
    check_step(c, h, p, m, v, pr, mr, vr, mabs, vabs, grel, out16, out32, &worst_p, &worst_m, &worst_v);
  }
  std::printf("  n=%-9zu grad=%s param=%s %s: worst error / bound over %d steps: p %.3f m %.3f v %.3f\n", c.n,
              dos::dtype_name(c.grad), dos::dtype_name(c.param), c.decoupled ? "AdamW" : "Adam ", steps, worst_p,
              worst_m, worst_v);
  assert_true(worst_p <= 1.0);
  assert_true(worst_m <= 1.0);
  assert_true(worst_v <= 1.0);
}

void check_step(const Case& c, const ref::Hyper& h, const std::vector<float>& p, const std::vector<float>& m,
                const std::vector<float>& v, const std::vector<double>& pr, const std::vector<double>& mr,
                const std::vector<double>& vr, const std::vector<double>& mabs, const std::vector<double>& vabs,
                const std::vector<double>& grel, const std::vector<uint16_t>& out16, const std::vector<float>& out32,
                double* worst_p, double* worst_m, double* worst_v) {
  const bool out_is_32 = c.param == DType::fp32;
  for (size_t i = 0; i < c.n; ++i) {
    const double ep = std::fabs(p[i] - pr[i]) / (2 * ref::ulp(float(pr[i])) + h.lr * (1e-5 + 4 * grel[i]));
    const double em = std::fabs(m[i] - mr[i]) / (4 * ref::ulp(float(mabs[i])));
    const double ev = std::fabs(v[i] - vr[i]) / (4 * ref::ulp(float(vabs[i])));
    *worst_p = std::max(*worst_p, ep);
    *worst_m = std::max(*worst_m, em);
    *worst_v = std::max(*worst_v, ev);
    float want;
    if (c.param == DType::fp32) want = p[i];
    else if (c.param == DType::fp16) want = ref::f16_bits_to_float(ref::float_to_f16_bits(p[i]));
    else want = ref::round_to_bf16(p[i]);
    const float got = out_is_32 ? out32[i]
                      : c.param == DType::fp16 ? ref::f16_bits_to_float(out16[i])
                                               : ref::bf16_bits_to_float(out16[i]);
    if (std::memcmp(&got, &want, 4) != 0) {
      std::fprintf(stderr, "n=%zu i=%zu: 16-bit copy %a, want %a\n", c.n, i, double(got), double(want));
      fail();
    }
  }
}

void test_adam_small_sizes(void**) {
  const size_t sizes[] = {1, 7, 15, 16, 17, 1023, 1025, 16384 + 3, 3 * 16384 + 17};
  const DType dts[] = {DType::fp32, DType::fp16, DType::bf16};
  for (size_t n : sizes)
    for (DType g : dts)
      for (int dec = 0; dec < 2; ++dec) run_case({n, g, g, bool(dec)}, 5);
}

void test_adam_mixed_dtypes(void**) {
  run_case({1025, DType::fp32, DType::bf16, true}, 3);
  run_case({1025, DType::bf16, DType::fp32, false}, 3);
  run_case({1025, DType::fp16, DType::bf16, true}, 3);
}

void test_adam_large(void**) {
  // above 10^7 elements, one dtype per optimizer flavour
  run_case({10000019, DType::bf16, DType::bf16, true}, 3);
  run_case({10000019, DType::fp16, DType::fp16, false}, 3);
  run_case({10000019, DType::fp32, DType::fp32, true}, 2);
}

// Non-finite master parameters (a diverged run, or a checkpoint that holds them) where the
// gradient gets no L2 term: AdamW, and Adam without weight decay. torch adds weight_decay * p to the
// gradient only where weight_decay != 0, so an infinite master leaves exp_avg and exp_avg_sq finite
// and the master infinite; 0 * inf would make them NaN. Each case runs the kernel twice, on masters
// holding +inf, -inf and NaN at a few places (in the first work item's vector body, the second's
// vector body and its scalar tail) and on the same masters with 1.0 there: exp_avg and exp_avg_sq
// must not differ anywhere, and match the double-precision reference at those places; the other
// masters must not differ; +inf and -inf stay, NaN stays NaN; the bf16 copy rounds them as they are.
void test_adam_nonfinite_master(void**) {
  const size_t n = 16384 + 37;
  const size_t at[] = {3, 16384 + 20, 16384 + 35};
  const float bad[] = {INFINITY, -INFINITY, NAN};
  struct Flavour {
    bool decoupled;
    double wd;
  };
  for (const Flavour f : {Flavour{true, 0.1}, Flavour{true, 0.0}, Flavour{false, 0.0}}) {
    dos::AdamHyper h;
    h.decoupled = f.decoupled;
    h.weight_decay = f.wd;
    Rng rng{0xfeedull + f.decoupled};
    std::vector<float> pa(n), g(n);
    for (size_t i = 0; i < n; ++i) {
      pa[i] = float(rng.normal());
      g[i] = float(rng.normal() * 1e-2);
    }
    std::vector<float> pb = pa, ma(n, 0.0f), va(n, 0.0f);
    for (int k = 0; k < 3; ++k) {
      pa[at[k]] = bad[k];
      pb[at[k]] = 1.0f;
    }
    std::vector<float> mb = ma, vb = va, pi = pa, mi = ma, vi = va;
    std::vector<uint16_t> outa(n), outb(n), outi(n);
    for (long t = 1; t <= 3; ++t) {
      const auto sp = dos::make_adam_step_params(h, t);
      std::vector<float> pi_in = pi, mi_in = mi, vi_in = vi;
      dos::adam_step_into_cpu(pi_in.data(), mi_in.data(), vi_in.data(), pi.data(), mi.data(), vi.data(), g.data(),
                              DType::fp32, outi.data(), DType::bf16, n, sp);
      const double m_prev = ma[at[0]], v_prev = va[at[0]];
      dos::adam_step_cpu(pa.data(), ma.data(), va.data(), g.data(), DType::fp32, outa.data(), DType::bf16, n, sp);
      dos::adam_step_cpu(pb.data(), mb.data(), vb.data(), g.data(), DType::fp32, outb.data(), DType::bf16, n, sp);
      assert_memory_equal(ma.data(), mb.data(), n * 4);
      assert_memory_equal(va.data(), vb.data(), n * 4);
      assert_memory_equal(mi.data(), ma.data(), n * 4);
      assert_memory_equal(vi.data(), va.data(), n * 4);
      // the reference at the first infinite master: exp_avg and exp_avg_sq as for any master
      double pr = INFINITY, mr = m_prev, vr = v_prev;
      const ref::Hyper rh{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled};
      ref::adam_step(pr, mr, vr, g[at[0]], rh, t);
      assert_true(std::isinf(pr) && pr > 0);
      assert_true(std::fabs(ma[at[0]] - mr) <= 4 * ref::ulp(float(std::fabs(mr) + std::fabs(g[at[0]]))));
      assert_true(std::fabs(va[at[0]] - vr) <= 4 * ref::ulp(float(vr)));
      for (size_t i = 0; i < n; ++i) {
        assert_true(std::isfinite(ma[i]) && std::isfinite(va[i]));
        const bool injected = i == at[0] || i == at[1] || i == at[2];
        if (!injected) {
          assert_true(std::memcmp(&pa[i], &pb[i], 4) == 0);
          assert_int_equal(outa[i], outb[i]);
        }
      }
      assert_true(std::isinf(pa[at[0]]) && pa[at[0]] > 0 && std::isinf(pa[at[1]]) && pa[at[1]] < 0);
      assert_true(std::isnan(pa[at[2]]) && std::isnan(pi[at[2]]));
      assert_true(std::isinf(pi[at[0]]) && pi[at[0]] > 0 && std::isinf(pi[at[1]]) && pi[at[1]] < 0);
      assert_int_equal(outa[at[0]], 0x7f80);
      assert_int_equal(outa[at[1]], 0xff80);
      assert_true((outa[at[2]] & 0x7f80) == 0x7f80 && (outa[at[2]] & 0x7f) != 0);
    }
  }
}

void test_adam_no_param_copy(void**) {
  // param_out == nullptr: state updated, nothing else written; same values as with a copy
  const size_t n = 1031;
  std::vector<float> p1(n), m1(n, 0), v1(n, 0), g(n);
  for (size_t i = 0; i < n; ++i) {
    p1[i] = float(i) * 1e-3f - 0.5f;
    g[i] = float((i * 7919) % 101) * 1e-4f - 5e-3f;
  }
  std::vector<float> p2 = p1, m2 = m1, v2 = v1, out(n);
  dos::AdamHyper h;
  const auto sp = dos::make_adam_step_params(h, 1);
  dos::adam_step_cpu(p1.data(), m1.data(), v1.data(), g.data(), DType::fp32, nullptr, DType::fp32, n, sp);
  dos::adam_step_cpu(p2.data(), m2.data(), v2.data(), g.data(), DType::fp32, out.data(), DType::fp32, n, sp);
  assert_memory_equal(p1.data(), p2.data(), n * 4);
  assert_memory_equal(m1.data(), m2.data(), n * 4);
  assert_memory_equal(p2.data(), out.data(), n * 4);
}

void test_param_copy_misaligned(void**) {
  // The parameter copy at every byte offset of a 64-byte line (each element size, each gradient
  // type), several chunks long: the copy is the master rounded (fp32: equal), in place and out of
  // place, and the bytes around it are left as they were.
  std::printf("  parameter copy stores on this CPU: %s\n", dos::cpu_param_copy_stores());
  const size_t n = 2 * 16384 + 37;
  dos::AdamHyper h;
  const auto sp = dos::make_adam_step_params(h, 3);
  for (DType gd : {DType::fp32, DType::fp16, DType::bf16})
    for (DType pd : {DType::bf16, DType::fp32, DType::fp16})
      for (size_t shift = 0; shift < 64; shift += dos::dtype_size(pd))
        for (int into = 0; into < 2; ++into) {
          std::vector<float> p(n), m(n, 0.01f), v(n, 1e-4f), g(n), p_o(n), m_o(n), v_o(n);
          std::vector<uint16_t> g16(n);
          for (size_t i = 0; i < n; ++i) {
            p[i] = float(i % 977) * 1e-3f - 0.4f;
            g[i] = float((i * 7919) % 101) * 1e-4f - 5e-3f;
            if (gd == DType::fp16) g16[i] = ref::float_to_f16_bits(g[i]);
            else {
              const float r = ref::round_to_bf16(g[i]);
              uint32_t u;
              std::memcpy(&u, &r, 4);
              g16[i] = uint16_t(u >> 16);
            }
          }
          const void* gp = gd == DType::fp32 ? static_cast<const void*>(g.data()) : g16.data();
          const size_t bytes = n * dos::dtype_size(pd);
          std::vector<unsigned char> raw(bytes + 64 + 128, 0xA5);
          const size_t base = (64 - reinterpret_cast<std::uintptr_t>(raw.data()) % 64) % 64;  // a line's start
          unsigned char* out = raw.data() + base + shift;
          if (into)
            dos::adam_step_into_cpu(p.data(), m.data(), v.data(), p_o.data(), m_o.data(), v_o.data(), gp, gd, out, pd, n,
                                    sp);
          else
            dos::adam_step_cpu(p.data(), m.data(), v.data(), gp, gd, out, pd, n, sp);
          const std::vector<float>& master = into ? p_o : p;
          for (size_t i = 0; i < n; ++i) {
            float got;
            if (pd == DType::fp32) std::memcpy(&got, out + 4 * i, 4);
            else {
              uint16_t b;
              std::memcpy(&b, out + 2 * i, 2);
              got = pd == DType::bf16 ? ref::bf16_bits_to_float(b) : ref::f16_bits_to_float(b);
            }
            const float want = pd == DType::fp32 ? master[i]
                               : pd == DType::bf16 ? ref::round_to_bf16(master[i])
                                                   : ref::f16_bits_to_float(ref::float_to_f16_bits(master[i]));
            if (std::memcmp(&got, &want, 4) != 0) {
              std::fprintf(stderr, "%s gradient, %s copy at byte offset %zu (%s): element %zu is %a, want %a\n",
                           dos::dtype_name(gd), dos::dtype_name(pd), shift, into ? "out of place" : "in place", i,
                           double(got), double(want));
              fail();
            }
          }
          for (size_t i = 0; i < raw.size(); ++i)
            if (i < base + shift || i >= base + shift + bytes) assert_int_equal(raw[i], 0xA5);
        }
}

void test_adam_into_misaligned_state(void**) {
  // The out-of-place step's new state at every 4-byte offset of a 64-byte line (each of master,
  // exp_avg, exp_avg_sq at its own offset), several work items and blocks long with a tail: the same
  // bits as the step in place, the inputs left as they were, and the guard bytes before and after
  // each output untouched (the head before a vector boundary and the tail are written apart).
  std::printf("  out-of-place step reads: %s\n", dos::adam_into_reads());
  const size_t n = 2 * 16384 + 2048 + 37;
  dos::AdamHyper h;
  h.weight_decay = 0.01;
  const auto sp = dos::make_adam_step_params(h, 2);
  std::vector<float> p(n), m(n), v(n);
  std::vector<uint16_t> g16(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = float(i % 977) * 1e-3f - 0.4f;
    m[i] = float(i % 13) * 1e-3f - 6e-3f;
    v[i] = float(i % 7) * 1e-5f;
    const float r = ref::round_to_bf16(float((i * 7919) % 101) * 1e-4f - 5e-3f);
    uint32_t u;
    std::memcpy(&u, &r, 4);
    g16[i] = uint16_t(u >> 16);
  }
  const std::vector<float> p0 = p, m0 = m, v0 = v;
  std::vector<uint16_t> copy_ref(n), copy(n);
  std::vector<float> pr = p, mr = m, vr = v;
  dos::adam_step_cpu(pr.data(), mr.data(), vr.data(), g16.data(), DType::bf16, copy_ref.data(), DType::bf16, n, sp);
  constexpr size_t kGuard = 128;
  for (size_t shift = 0; shift < 64; shift += 4) {
    const size_t shifts[3] = {shift, (shift + 20) % 64, (shift + 44) % 64};
    std::vector<unsigned char> raw[3];
    float* outs[3];
    for (int k = 0; k < 3; ++k) {
      raw[k].assign(n * 4 + 2 * kGuard + 64, 0xA5);
      const size_t base = (64 - reinterpret_cast<std::uintptr_t>(raw[k].data()) % 64) % 64 + kGuard;
      outs[k] = reinterpret_cast<float*>(raw[k].data() + base + shifts[k]);
    }
    dos::adam_step_into_cpu(p.data(), m.data(), v.data(), outs[0], outs[1], outs[2], g16.data(), DType::bf16,
                            copy.data(), DType::bf16, n, sp);
    const std::vector<float>* want[3] = {&pr, &mr, &vr};
    for (int k = 0; k < 3; ++k) {
      if (std::memcmp(outs[k], want[k]->data(), n * 4) != 0) {
        std::fprintf(stderr, "output %d at byte offset %zu differs from the step in place\n", k, shifts[k]);
        fail();
      }
      const unsigned char* first = reinterpret_cast<const unsigned char*>(outs[k]);
      for (size_t i = 0; i < raw[k].size(); ++i) {
        const unsigned char* at = raw[k].data() + i;
        if (at < first || at >= first + n * 4) assert_int_equal(raw[k][i], 0xA5);
      }
    }
    assert_memory_equal(copy.data(), copy_ref.data(), n * 2);
    assert_memory_equal(p.data(), p0.data(), n * 4);
    assert_memory_equal(m.data(), m0.data(), n * 4);
    assert_memory_equal(v.data(), v0.data(), n * 4);
  }
}

void test_convert_to_f32(void**) {
  std::printf("  fp16 conversions on this CPU: %s\n", dos::f16_conversion_isa());
  for (size_t n : {size_t(1), size_t(17), size_t(65536), size_t(16384 * 5 + 5)}) {
    std::vector<uint16_t> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = uint16_t((i * 40503u) & 0xffffu);
    std::vector<float> a(n), b(n);
    dos::convert_to_f32_cpu(src.data(), DType::fp16, a.data(), n);
    dos::convert_to_f32_cpu(src.data(), DType::bf16, b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const float ra = ref::f16_bits_to_float(src[i]), rb = ref::bf16_bits_to_float(src[i]);
      assert_true((std::isnan(ra) && std::isnan(a[i])) || std::memcmp(&ra, &a[i], 4) == 0);
      assert_true((std::isnan(rb) && std::isnan(b[i])) || std::memcmp(&rb, &b[i], 4) == 0);
    }
  }
}

}  // namespace

void test_schedule_switch(void**) {
  // the work items' schedule is the one the environment asks for (the other tests then check the
  // same references under it): DOS_CPU_SCHEDULE=static, else dynamic
  const char* env = std::getenv("DOS_CPU_SCHEDULE");
  const bool want_static = env && std::strcmp(env, "static") == 0;
  std::printf("  CPU Adam's schedule: %s\n", dos::cpu_adam_schedule());
  assert_string_equal(dos::cpu_adam_schedule(), want_static ? "static" : "dynamic");
  // and the out-of-place step's way of reading the old state: DOS_ADAM_INTO=copy, else direct
  const char* into = std::getenv("DOS_ADAM_INTO");
  assert_string_equal(dos::adam_into_reads(), into && std::strcmp(into, "copy") == 0 ? "copy" : "direct");
}

int main() {
  // a run that forces an fp16 path must test that path: where the processor lacks it, the whole
  // run is skipped (exit 77), not passed on another path
  if (const char* want = std::getenv("DOS_F16_ISA"); want && std::string(want) != dos::f16_conversion_isa()) {
    std::printf("DOS_F16_ISA=%s: the processor lacks this path (it has %s); skipped\n", want, dos::f16_conversion_isa());
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_switch),
      cmocka_unit_test(test_f16_decode_exhaustive), cmocka_unit_test(test_f32_to_16bit_sweep),
      cmocka_unit_test(test_convert_to_f32),        cmocka_unit_test(test_adam_no_param_copy),
      cmocka_unit_test(test_adam_small_sizes),      cmocka_unit_test(test_adam_mixed_dtypes),
      cmocka_unit_test(test_adam_large),            cmocka_unit_test(test_param_copy_misaligned),
      cmocka_unit_test(test_adam_nonfinite_master), cmocka_unit_test(test_adam_into_misaligned_state),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
