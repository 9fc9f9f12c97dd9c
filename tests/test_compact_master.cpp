// The compact master (compact_master.h): the encoding M = ((P - r) << 16) | lo over every fp32 bit
// pattern, and adam_step_compact_cpu against adam_step_cpu on the whole master, bit for bit (itself
// tested against the double-precision reference in test_kernels), and against reference.h's
// double-precision Adam within test_kernels' bound: sizes with every kind of tail, both
// optimizer flavours, every gradient dtype, several steps, masters over many exponents, both signs,
// rounding ties, zeros, subnormals and (AdamW) infinities. The packed r bits' bytes beyond
// ceil(n / 8) are never touched and the last byte's unused high bits are written 0.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "adam.h"
#include "cmocka_cpp.h"
#include "compact_master.h"
#include "reference.h"

using dos::DType;

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool is_nan_bits(std::uint32_t m) { return (m & 0x7fffffffu) > 0x7f800000u; }

/// The split of m through its own rounding, checked against the contract: r in {0, 1}, lo m's low
/// half, the join m itself, and the join rounding to P again. P is also checked against reference.h's
/// independent rounding. Returns false (and prints) on a mismatch.
bool round_trips(std::uint32_t m) {
  const std::uint16_t p = dos::f32_to_bf16(from_bits(m));
  std::uint16_t lo;
  std::uint32_t r;
  dos::compact_split(m, p, &lo, &r);
  const std::uint32_t back = dos::compact_join(p, lo, r);
  const bool ok = r <= 1 && lo == std::uint16_t(m) && back == m && dos::f32_to_bf16(from_bits(back)) == p &&
                  std::uint32_t(p) - r == (m >> 16);
  if (!ok) std::fprintf(stderr, "0x%08x: P 0x%04x lo 0x%04x r %u joined 0x%08x\n", m, p, lo, r, back);
  return ok;
}

// Every one of the 2^32 fp32 bit patterns that is not a NaN splits into (lo, r in {0, 1}) and is
// joined back bit for bit; every NaN is joined back into a NaN with its low 16 bits, as the header
// says (0x7FC0 | lo where M's high half is 0x7FC0, else 0x7FBF | lo).
void test_encoding_every_float(void**) {
  long bad = 0, nan_bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad, nan_bad)
  for (std::int64_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t low = 0; low < 65536; ++low) {
      const std::uint32_t m = (std::uint32_t(hi) << 16) | low;
      const std::uint16_t p = dos::f32_to_bf16(from_bits(m));
      std::uint16_t lo;
      std::uint32_t r;
      dos::compact_split(m, p, &lo, &r);
      const std::uint32_t back = dos::compact_join(p, lo, r);
      if (is_nan_bits(m)) {
        const std::uint32_t want = (std::uint32_t(hi) == 0x7fc0u ? 0x7fc00000u : 0x7fbf0000u) | low;
        nan_bad += p != 0x7fc0 || back != want || !is_nan_bits(back);
      } else {
        bad += r > 1 || back != m || dos::f32_to_bf16(from_bits(back)) != p;
      }
    }
  if (bad || nan_bad) std::fprintf(stderr, "%ld finite or infinite patterns and %ld NaNs wrong\n", bad, nan_bad);
  assert_int_equal(bad, 0);
  assert_int_equal(nan_bad, 0);
}

// For every bf16 pattern P that is not a NaN and a sweep of low halves, every fp32 M with that low
// half that rounds to P (by reference.h's rounding, independent of dtype.h) has its high half P or
// P - 1, and round-trips; and the named cases: the largest finite floats that round to inf, the
// subnormals, ties both ways, both zeros, both infinities.
void test_encoding_per_bf16(void**) {
  std::mt19937 rng(5);
  std::vector<std::uint16_t> los = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (int k = 0; k < 10; ++k) los.push_back(std::uint16_t(rng()));
  long found = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    if ((p & 0x7fffu) > 0x7f80u) continue;  // a NaN
    const float pv = ref::bf16_bits_to_float(std::uint16_t(p));
    for (std::uint16_t lo : los)
      for (std::uint32_t hi : {p, (p - 1) & 0xffffu, (p + 1) & 0xffffu}) {
        const std::uint32_t m = (hi << 16) | lo;
        if (is_nan_bits(m)) continue;
        const float rounded = ref::round_to_bf16(from_bits(m));
        if (bits(rounded) != bits(pv) && !(rounded == 0 && pv == 0 && std::signbit(rounded) == std::signbit(pv)))
          continue;  // M does not round to P
        assert_true(hi == p || hi == ((p - 1) & 0xffffu));  // P + 1's high half never rounds down to P
        assert_int_equal(dos::f32_to_bf16(from_bits(m)), p);
        assert_true(round_trips(m));
        ++found;
      }
  }
  assert_true(found > 65000L * 10);
  const std::uint32_t named[] = {
      0x7f7f8000u, 0x7f7fffffu, 0x7f7f7fffu, 0xff7f8000u, 0xff7fffffu,  // largest finite: round to +-inf or not
      0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x80008000u, 0x807fffffu,  // subnormals, ties
      0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u,  // ties to even: down (even) and up (odd)
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u};  // zeros, infinities
  for (std::uint32_t m : named) assert_true(round_trips(m));
  assert_int_equal(dos::f32_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);  // a tie up to inf: r 1
  // the packed layout: element i is bit i % 8 of byte i / 8
  const std::uint8_t packed[2] = {0x81, 0x02};
  assert_int_equal(dos::compact_bit(packed, 0), 1);
  assert_int_equal(dos::compact_bit(packed, 1), 0);
  assert_int_equal(dos::compact_bit(packed, 7), 1);
  assert_int_equal(dos::compact_bit(packed, 9), 1);
  assert_int_equal(dos::compact_round_up_bytes(0), 0);
  assert_int_equal(dos::compact_round_up_bytes(8), 1);
  assert_int_equal(dos::compact_round_up_bytes(9), 2);
}

/// Masters over many exponents and both signs, with every 16th a bf16 value (lo 0), every 16th a
/// rounding tie (lo 0x8000, high half even or odd), a few zeros and subnormals; with `infinities`
/// (AdamW: no L2 term), +inf and -inf at two places.
std::vector<float> make_masters(std::size_t n, std::mt19937& rng, bool infinities) {
  std::uniform_int_distribution<int> expo(-40, 40);
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i) {
    float x = std::ldexp(frac(rng), expo(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    std::uint32_t u = bits(x);
    if (i % 16 == 3) u &= 0xffff0000u;
    if (i % 16 == 5) u = (u & 0xffff0000u) | 0x8000u;
    if (i % 16 == 6) u = (u & 0xfffe0000u) | 0x18000u;
    if (i % 97 == 11) u = rng() & 0x8000ffffu;  // +-0 or a subnormal
    p[i] = from_bits(u);
  }
  if (infinities && n >= 3) {
    p[1] = INFINITY;
    p[n - 1] = -INFINITY;
  }
  return p;
}

/// fp32 gradients, rounded to `t` and stored as its bytes.
std::vector<std::uint8_t> make_grads(std::size_t n, DType t, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::uint8_t> out(n * dos::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const float x = nd(rng) * (i % 7 == 0 ? 1e-3f : 1e-2f);
    if (t == DType::fp32) std::memcpy(&out[4 * i], &x, 4);
    else {
      const std::uint16_t h = t == DType::bf16 ? bits(ref::round_to_bf16(x)) >> 16 : ref::float_to_f16_bits(x);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

double gradient_value(const std::vector<std::uint8_t>& g, DType t, std::size_t i) {
  if (t == DType::fp32) {
    float x;
    std::memcpy(&x, &g[4 * i], 4);
    return x;
  }
  std::uint16_t h;
  std::memcpy(&h, &g[2 * i], 2);
  return t == DType::bf16 ? ref::bf16_bits_to_float(h) : ref::f16_bits_to_float(h);
}

constexpr std::uint8_t kGuard = 0xA5;
constexpr std::size_t kGuardBytes = 64;

/// n parameters, `steps` steps: the compact kernel and adam_step_cpu on the whole master from the
/// same state, compared after each step bit for bit; the master against reference.h's double Adam
/// (from the state before the step) within test_kernels' bound. `offset` elements of slack in front
/// of every array but r (unaligned arrays).
void run_case(std::size_t n, DType gt, bool decoupled, int steps, std::size_t offset) {
  std::mt19937 rng(unsigned(n * 131 + int(gt) * 7 + decoupled + offset));
  dos::AdamHyper h;
  h.lr = double(1e-3f);
  h.beta1 = double(0.9f);
  h.beta2 = double(0.999f);
  h.eps = double(1e-8f);
  h.weight_decay = double(0.1f);
  h.decoupled = decoupled;
  const ref::Hyper rh{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled};
  const std::vector<float> m0 = make_masters(n, rng, decoupled);
  std::vector<float> full(m0), mf(n, 0.0f), vf(n, 0.0f);
  std::vector<std::uint16_t> pf(n);
  // compact form, arrays offset by `offset` elements; r with guard bytes after ceil(n / 8)
  const std::size_t nb = dos::compact_round_up_bytes(n);
  std::vector<std::uint16_t> pc(n + offset), lo(n + offset);
  std::vector<float> mc(n + offset, 0.0f), vc(n + offset, 0.0f);
  std::vector<std::uint8_t> r(nb + kGuardBytes, kGuard);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = bits(m0[i]);
    pc[offset + i] = dos::f32_to_bf16(m0[i]);
    std::uint16_t l;
    std::uint32_t b;
    dos::compact_split(u, pc[offset + i], &l, &b);
    lo[offset + i] = l;
    r[i / 8] = std::uint8_t(i % 8 == 0 ? b : r[i / 8] | (b << (i % 8)));
  }
  if (n % 8) r[nb - 1] |= std::uint8_t(0xff << (n % 8));  // unused high bits set: must come back 0
  double worst = 0;
  for (int t = 1; t <= steps; ++t) {
    const auto g = make_grads(n, gt, rng);
    const dos::AdamStepParams sp = dos::make_adam_step_params(h, t);
    const std::vector<float> before = full, m_before = mf, v_before = vf;
    dos::adam_step_cpu(full.data(), mf.data(), vf.data(), g.data(), gt, pf.data(), DType::bf16, n, sp);
    dos::adam_step_compact_cpu(pc.data() + offset, lo.data() + offset, r.data(), mc.data() + offset,
                               vc.data() + offset, g.data(), gt, n, sp);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t joined = dos::compact_join(pc[offset + i], lo[offset + i], dos::compact_bit(r.data(), i));
      if (pc[offset + i] != pf[i] || joined != bits(full[i]) || bits(mc[offset + i]) != bits(mf[i]) ||
          bits(vc[offset + i]) != bits(vf[i])) {
        std::fprintf(stderr, "n %zu %s %s step %d offset %zu element %zu: P 0x%04x/0x%04x master 0x%08x/0x%08x "
                             "exp_avg %a/%a exp_avg_sq %a/%a (compact/full)\n",
                     n, dos::dtype_name(gt), decoupled ? "AdamW" : "Adam", t, offset, i, pc[offset + i], pf[i], joined,
                     bits(full[i]), double(mc[offset + i]), double(mf[i]), double(vc[offset + i]), double(vf[i]));
        fail();
      }
      // reference.h's Adam in double from the state before the step (test_kernels' bound on p)
      if (!std::isfinite(before[i])) continue;
      double pr = before[i], mr = m_before[i], vr = v_before[i];
      const double gi = gradient_value(g, gt, i);
      ref::adam_step(pr, mr, vr, gi, rh, t);
      const double l2 = decoupled ? 0.0 : h.weight_decay * before[i];
      const double grel = decoupled ? 0.0 : ref::ulp(float(std::fabs(gi) + std::fabs(l2))) / std::max(std::fabs(gi + l2), 1e-30);
      const double e = std::fabs(double(full[i]) - pr) / (2 * ref::ulp(float(pr)) + h.lr * (1e-5 + 4 * grel));
      worst = std::max(worst, e);
    }
    if (n % 8) assert_int_equal(r[nb - 1] >> (n % 8), 0);
    for (std::size_t k = nb; k < r.size(); ++k) assert_int_equal(r[k], kGuard);
  }
  if (n >= 16384)
    std::printf("  n=%-7zu grad=%s %s offset %zu: same bits as adam_step_cpu over %d steps; worst error / bound "
                "against the double reference %.3f\n",
                n, dos::dtype_name(gt), decoupled ? "AdamW" : "Adam ", offset, steps, worst);
  assert_true(worst <= 1.0);
}

void test_compact_equals_full(void**) {
  std::printf("  %d OpenMP threads, schedule %s, fp16 conversions %s, r bits packed with %s\n", omp_get_max_threads(),
              dos::cpu_adam_schedule(), dos::f16_conversion_isa(), dos::compact_master_isa());
  const std::size_t sizes[] = {0, 1, 7, 8, 9, 31, 33, 16383, 16384, 16385, 3 * 16384 + 5, 150001};
  for (std::size_t n : sizes)
    for (DType gt : {DType::bf16, DType::fp16, DType::fp32})
      for (int dec = 0; dec < 2; ++dec) run_case(n, gt, bool(dec), 3, 0);
}

void test_compact_unaligned(void**) {
  for (std::size_t off : {std::size_t(1), std::size_t(3), std::size_t(7)})
    for (DType gt : {DType::bf16, DType::fp16}) run_case(2 * 16384 + 13, gt, true, 2, off);
}

/// The compact form of masters m0 (n of them): P into p, the low halves into lo, the r bits ORed into
/// r's first compact_round_up_bytes(n) bytes (which must be 0 on entry). p and lo hold n elements.
void split_masters(const std::vector<float>& m0, std::vector<std::uint16_t>& p, std::vector<std::uint16_t>& lo,
                   std::vector<std::uint8_t>& r) {
  for (std::size_t i = 0; i < m0.size(); ++i) {
    p[i] = dos::f32_to_bf16(m0[i]);
    std::uint16_t l;
    std::uint32_t b;
    dos::compact_split(bits(m0[i]), p[i], &l, &b);
    lo[i] = l;
    r[i / 8] |= std::uint8_t(b << (i % 8));
  }
}

/// Cut points of a subgroup of n elements into segments: random lengths of 1 to 40 elements and
/// long ones (so that segments start at every residue mod 8 and 32), ending at n.
std::vector<std::size_t> segment_cuts(std::size_t n, std::mt19937& rng) {
  std::vector<std::size_t> cuts{0};
  std::uniform_int_distribution<std::size_t> small(1, 40), large(1, 40000);
  while (cuts.back() < n) cuts.push_back(std::min(n, cuts.back() + (rng() % 3 == 0 ? large(rng) : small(rng))));
  return cuts;
}

// adam_step_compact_cpu_at over a subgroup cut into segments (segment_cuts), updated in a shuffled
// order, against adam_step_compact_cpu on the whole subgroup: P, lo, exp_avg, exp_avg_sq and every
// byte of r the same bits after each of 2 steps, the guard bytes after r untouched; n == 0 touches
// nothing.
void test_compact_segments(void**) {
  const auto sp0 = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  dos::adam_step_compact_cpu_at(nullptr, nullptr, nullptr, 5, nullptr, nullptr, nullptr, DType::bf16, 0, sp0);
  for (std::size_t n : {std::size_t(1), std::size_t(13), std::size_t(1000), std::size_t(3 * 16384 + 21), std::size_t(100003)})
    for (DType gt : {DType::bf16, DType::fp32}) {
      std::mt19937 rng(unsigned(n + int(gt)));
      dos::AdamHyper h;
      h.weight_decay = 0.1;
      const std::vector<float> m0 = make_masters(n, rng, true);
      const std::size_t nb = dos::compact_round_up_bytes(n);
      std::vector<std::uint16_t> p(n), lo(n);
      std::vector<std::uint8_t> r(nb + kGuardBytes, kGuard);
      std::fill(r.begin(), r.begin() + long(nb), std::uint8_t(0));
      split_masters(m0, p, lo, r);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      std::vector<std::uint16_t> ps(p), los(lo);
      std::vector<std::uint8_t> rs(r);
      std::vector<float> ms(m), vs(v);
      const std::vector<std::size_t> cuts = segment_cuts(n, rng);
      std::vector<std::size_t> order(cuts.size() - 1);
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::shuffle(order.begin(), order.end(), rng);
      for (std::int64_t t = 1; t <= 2; ++t) {
        const auto g = make_grads(n, gt, rng);
        const std::size_t gsz = dos::dtype_size(gt);
        const dos::AdamStepParams sp = dos::make_adam_step_params(h, t);
        dos::adam_step_compact_cpu(p.data(), lo.data(), r.data(), m.data(), v.data(), g.data(), gt, n, sp);
        for (std::size_t k : order) {
          const std::size_t a = cuts[k], c = cuts[k + 1] - a;
          dos::adam_step_compact_cpu_at(ps.data() + a, los.data() + a, rs.data(), a, ms.data() + a, vs.data() + a,
                                        g.data() + a * gsz, gt, c, sp);
        }
        assert_memory_equal(ps.data(), p.data(), 2 * n);
        assert_memory_equal(los.data(), lo.data(), 2 * n);
        assert_memory_equal(rs.data(), r.data(), r.size());  // r's bytes and the guard after them
        assert_memory_equal(ms.data(), m.data(), 4 * n);
        assert_memory_equal(vs.data(), v.data(), 4 * n);
      }
      if (n > 1000)
        std::printf("  n=%zu grad=%s: %zu segments in a shuffled order, the same bits as the whole subgroup\n", n,
                    dos::dtype_name(gt), order.size());
    }
}

// adam_step_compact_into_cpu (the speculative update's out-of-place step) against
// adam_step_compact_cpu on a copy of the same state: every output byte the same bits (P, lo, each
// byte of r, exp_avg, exp_avg_sq) after each of 3 steps, the outputs filled with junk first (a byte
// left unwritten would show), the input state untouched, the guard bytes after the output's r
// untouched; n == 0 touches nothing.
void test_compact_into(void**) {
  const auto sp0 = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  dos::adam_step_compact_into_cpu(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, DType::bf16, 0, sp0);
  for (std::size_t n : {std::size_t(1), std::size_t(13), std::size_t(2049), std::size_t(3 * 16384 + 21), std::size_t(150001)})
    for (DType gt : {DType::bf16, DType::fp16, DType::fp32}) {
      std::mt19937 rng(unsigned(7 * n + int(gt)));
      dos::AdamHyper h;
      h.weight_decay = 0.1;
      const std::vector<float> m0 = make_masters(n, rng, true);
      const std::size_t nb = dos::compact_round_up_bytes(n);
      // the state in place (p, lo, r, m, v) and the input of the out-of-place step (a copy of it)
      std::vector<std::uint16_t> p(n), lo(n);
      std::vector<std::uint8_t> r(nb, 0);
      split_masters(m0, p, lo, r);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      std::vector<std::uint16_t> pi(p);
      for (std::int64_t t = 1; t <= 3; ++t) {
        const auto g = make_grads(n, gt, rng);
        const dos::AdamStepParams sp = dos::make_adam_step_params(h, t);
        const std::vector<std::uint16_t> lo_in(lo), lo_keep(lo);
        const std::vector<std::uint8_t> r_in(r), r_keep(r);
        const std::vector<float> m_in(m), v_in(v), m_keep(m), v_keep(v);
        // the outputs at step t start `at` elements into their buffers (at step 2 off every 16-byte
        // boundary: the streamed stores' heads and tails), the elements before them guards
        const std::size_t at = t == 2 ? 1 : 0;
        std::vector<std::uint16_t> lo_ob(at + n, 0x5a5a);
        std::vector<std::uint8_t> r_ob(at + nb + kGuardBytes, kGuard);
        std::fill(r_ob.begin() + long(at), r_ob.begin() + long(at + nb), std::uint8_t(0x5a));
        std::vector<float> m_ob(at + n, from_bits(0x7fc05a5au)), v_ob(at + n, from_bits(0x7fc05a5au));
        std::uint16_t* lo_o = lo_ob.data() + at;
        std::uint8_t* r_o = r_ob.data() + at;
        float *m_o = m_ob.data() + at, *v_o = v_ob.data() + at;
        dos::adam_step_compact_cpu(p.data(), lo.data(), r.data(), m.data(), v.data(), g.data(), gt, n, sp);
        dos::adam_step_compact_into_cpu(lo_in.data(), r_in.data(), m_in.data(), v_in.data(), pi.data(), lo_o, r_o,
                                        m_o, v_o, g.data(), gt, n, sp);
        assert_memory_equal(pi.data(), p.data(), 2 * n);
        assert_memory_equal(lo_o, lo.data(), 2 * n);
        assert_memory_equal(r_o, r.data(), nb);
        for (std::size_t k = at + nb; k < r_ob.size(); ++k) assert_int_equal(r_ob[k], kGuard);
        assert_memory_equal(m_o, m.data(), 4 * n);
        assert_memory_equal(v_o, v.data(), 4 * n);
        if (at > 0) {  // the guards before the outputs untouched
          assert_int_equal(lo_ob[0], 0x5a5a);
          assert_int_equal(r_ob[0], kGuard);
          assert_int_equal(dos::f32_bits(m_ob[0]), 0x7fc05a5au);
          assert_int_equal(dos::f32_bits(v_ob[0]), 0x7fc05a5au);
        }
        // the input is the state before the step, as it was: a redo reads it
        assert_memory_equal(lo_in.data(), lo_keep.data(), 2 * n);
        assert_memory_equal(r_in.data(), r_keep.data(), nb);
        assert_memory_equal(m_in.data(), m_keep.data(), 4 * n);
        assert_memory_equal(v_in.data(), v_keep.data(), 4 * n);
      }
      if (n > 100000)
        std::printf("  n=%zu grad=%s: the out-of-place step gives the in-place step's bits over 3 steps\n", n,
                    dos::dtype_name(gt));
    }
}

// n == 0 touches nothing (null pointers included); a NaN master (split as the header says) comes
// back a NaN after a step, its neighbours unaffected.
void test_compact_zero_and_nan(void**) {
  const auto sp = dos::make_adam_step_params(dos::AdamHyper{}, 1);
  dos::adam_step_compact_cpu(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, DType::bf16, 0, sp);
  const std::size_t n = 17;
  std::vector<std::uint16_t> p(n), lo(n);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), g(n, 1e-2f), full(n);
  std::vector<std::uint8_t> r(dos::compact_round_up_bytes(n), 0);
  for (std::size_t i = 0; i < n; ++i) full[i] = i == 4 ? from_bits(0xffc01234u) : 0.5f + float(i);  // a negative NaN
  split_masters(full, p, lo, r);
  std::vector<float> mf = m, vf = v;
  std::vector<std::uint16_t> pf(n);
  dos::adam_step_compact_cpu(p.data(), lo.data(), r.data(), m.data(), v.data(), g.data(), DType::fp32, n, sp);
  dos::adam_step_cpu(full.data(), mf.data(), vf.data(), g.data(), DType::fp32, pf.data(), DType::bf16, n, sp);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t joined = dos::compact_join(p[i], lo[i], dos::compact_bit(r.data(), i));
    if (i == 4) {
      assert_true(is_nan_bits(joined) && p[i] == 0x7fc0);
    } else {
      assert_int_equal(joined, bits(full[i]));
      assert_int_equal(p[i], pf[i]);
    }
  }
}

}  // namespace

int main() {
  // as test_kernels: a run that forces an fp16 path the processor lacks is skipped, not passed on another
  if (const char* want = std::getenv("DOS_F16_ISA"); want && std::string(want) != dos::f16_conversion_isa()) {
    std::printf("DOS_F16_ISA=%s: the processor lacks this path (it has %s); skipped\n", want, dos::f16_conversion_isa());
    return 77;
  }
  if (const char* want = std::getenv("DOS_COMPACT_ISA"); want && std::string(want) != dos::compact_master_isa()) {
    std::printf("DOS_COMPACT_ISA=%s: the processor lacks this path (it has %s); skipped\n", want,
                dos::compact_master_isa());
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoding_every_float), cmocka_unit_test(test_encoding_per_bf16),
      cmocka_unit_test(test_compact_zero_and_nan), cmocka_unit_test(test_compact_equals_full),
      cmocka_unit_test(test_compact_unaligned),     cmocka_unit_test(test_compact_segments),
      cmocka_unit_test(test_compact_into),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
