// The overlapped update (Optimizer::begin_step / gradients_final / finish_step) against the plain
// step(): two optimizers over equal caller tensors of odd sizes, one stepped plainly, one with its
// gradients declared final piece by piece in backward's order (last elements first) while the
// caller keeps working, through every verdict: kept, changed after the declaration (the caller
// rescales its gradients in place, as global-norm clipping does), skipped (a non-finite gradient);
// parameters, master, exp_avg, exp_avg_sq and step counts must be the same bits after every step.
// Every other step ends with finish_step_async, as when the next forward overlaps the phase: each
// range's parameters must hold the plain step's bits as soon as wait_parameters returns for it.
// Both are also checked against the plain double-precision AdamW of reference.h, so that two
// equally wrong runs cannot pass. Then the API's bad input.
//
//   test_overlap POLICY MEMORY   POLICY: cpu, gpu, dmda, dos, ...; MEMORY: host or cuda
// Exits 77 (skip) when the run needs a GPU and there is none.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "caller_buffers.h"
#include "cmocka_cpp.h"
#include "dos.h"
#include "reference.h"

namespace {

std::string g_policy, g_memory;
dos::Runtime* g_rt = nullptr;

const std::vector<size_t> kSizes = {1, 1000, 17, 4099, 16, 2, 1025, 3};
constexpr size_t kSubgroup = 1024;

/// bf16 caller buffers (tests/caller_buffers.h) seen as vectors of bf16 bits, and as the
/// optimizer's tensors (kSizes).
struct Caller : test::CallerBuffers {
  Caller(size_t n, bool cuda) : test::CallerBuffers(n, 2, cuda) {}
  void put(void* dst, const std::vector<uint16_t>& src) { test::CallerBuffers::put(dst, src.data()); }
  std::vector<uint16_t> get(const void* src) {
    std::vector<uint16_t> out(n);
    test::CallerBuffers::get(out.data(), src);
    return out;
  }
  std::vector<dos::TensorView> views() const {
    std::vector<dos::TensorView> v;
    size_t off = 0;
    for (size_t s : kSizes) {
      v.push_back(dos::TensorView{static_cast<char*>(param) + off * 2, static_cast<char*>(grad) + off * 2, s});
      off += s;
    }
    return v;
  }
};

uint16_t bf16(float x) {
  const float r = ref::round_to_bf16(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t b) { return ref::bf16_bits_to_float(b); }

/// Deterministic gradient of element i at step t (bf16), some of them large so that a rescale
/// changes their bits.
float grad_value(size_t i, int t) {
  const double x = std::sin(0.37 * double(i) + 1.3 * double(t)) * (i % 7 == 0 ? 3.0 : 0.01);
  return float(x);
}

std::vector<float> read(dos::Optimizer& o, void (dos::Optimizer::*fn)(float*) const) {
  std::vector<float> v(o.num_params());
  (o.*fn)(v.data());
  return v;
}

void expect_same_bits(dos::Optimizer& a, dos::Optimizer& b, Caller& ca, Caller& cb, const char* when) {
  const auto check = [&](const std::vector<float>& x, const std::vector<float>& y, const char* what) {
    assert_int_equal(x.size(), y.size());
    if (std::memcmp(x.data(), y.data(), x.size() * 4) != 0) {
      for (size_t i = 0; i < x.size(); ++i)
        if (std::memcmp(&x[i], &y[i], 4) != 0) {
          std::fprintf(stderr, "%s: %s differs at %zu: %.9g vs %.9g\n", when, what, i, x[i], y[i]);
          break;
        }
      fail();
    }
  };
  check(read(a, &dos::Optimizer::read_master), read(b, &dos::Optimizer::read_master), "master");
  check(read(a, &dos::Optimizer::read_exp_avg), read(b, &dos::Optimizer::read_exp_avg), "exp_avg");
  check(read(a, &dos::Optimizer::read_exp_avg_sq), read(b, &dos::Optimizer::read_exp_avg_sq), "exp_avg_sq");
  const auto pa = ca.get(ca.param), pb = cb.get(cb.param);
  if (pa != pb) {
    std::fprintf(stderr, "%s: the caller's parameters differ\n", when);
    fail();
  }
  assert_true(a.step_counts() == b.step_counts());
}

template <class F>
void expect_error(F f, const char* what) {
  try {
    f();
  } catch (const dos::Error& e) {
    std::printf("refused as expected (%s): %s\n", what, e.what());
    return;
  }
  std::fprintf(stderr, "no error for %s\n", what);
  fail();
}

void test_overlap_same_bits(void**) {
  size_t n = 0;
  for (size_t s : kSizes) n += s;
  const bool cuda = g_memory == "cuda";
  Caller ca(n, cuda), cb(n, cuda);
  std::vector<uint16_t> p0(n);
  for (size_t i = 0; i < n; ++i) p0[i] = bf16(float(std::cos(0.11 * double(i))));
  ca.put(ca.param, p0);
  cb.put(cb.param, p0);
  dos::OptimizerOptions oo;
  oo.adam = dos::AdamHyper{1e-2, 0.9, 0.999, 1e-8, 0.1, true};
  oo.subgroup_size = kSubgroup;
  oo.dtype = dos::DType::bf16;
  oo.memory = cuda ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  oo.verbose = false;
  // fixed rates: the plan does not depend on a calibration (which would differ between the two)
  oo.rates = dos::Rates{1e9, 8e8, 1e11, 1e11, 2e10, 2e10};
  oo.speculate_streamed = true;  // the GPU side of the speculation too (the default)
  dos::Optimizer plain(*g_rt, ca.views(), oo);
  dos::Optimizer over(*g_rt, cb.views(), oo);

  // the reference: double-precision AdamW on the values the caller's bf16 buffers hold
  const ref::Hyper h{1e-2, 0.9, 0.999, 1e-8, 0.1, true};
  std::vector<double> rp(n), rm(n, 0.0), rv(n, 0.0);
  for (size_t i = 0; i < n; ++i) rp[i] = from_bf16(p0[i]);
  long rt = 0;

  enum Kind { keep, changed, skip, keep_partial, keep_threads };
  const Kind steps[] = {keep, changed, skip, keep, keep_partial, changed, keep, keep_threads};
  size_t speculated_total = 0, redone_total = 0;
  int t = 0;
  for (Kind k : steps) {
    ++t;
    std::vector<uint16_t> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = bf16(grad_value(i, t));
    if (k == skip) g[n / 3] = 0x7fc0;  // a NaN: the step is skipped
    // the rescale of a "changed" step (as clipping does: every gradient times one coefficient)
    std::vector<uint16_t> scaled(n);
    for (size_t i = 0; i < n; ++i) scaled[i] = bf16(from_bf16(g[i]) * 0.25f);

    // plain: the caller decides first, then steps (or not)
    if (k != skip) {
      ca.put(ca.grad, k == changed ? scaled : g);
      const dos::StepStats s = plain.step();
      assert_false(s.overlapped);
      assert_int_equal(s.speculated, 0);
    }
    // overlapped: gradients declared final as backward would make them, last elements first, in
    // pieces that do not follow the subgroups' bounds
    cb.put(cb.grad, g);
    over.begin_step();
    assert_true(over.step_open());
    const size_t declared = k == keep_partial ? n / 2 : n;  // the rest is final at finish_step
    std::vector<std::pair<size_t, size_t>> pieces;
    size_t hi = n;
    size_t piece = 613;
    while (hi > n - declared) {
      const size_t lo = hi > n - declared + piece ? hi - piece : n - declared;
      pieces.push_back({lo, hi});
      hi = lo;
      piece = piece * 3 % 1000 + 1;
    }
    if (k == keep_threads) {  // two threads declaring alternate pieces at once
      std::atomic<int> failures{0};
      auto declare_every_other = [&](size_t first) {
        for (size_t p = first; p < pieces.size(); p += 2) {
          try {
            over.gradients_final(pieces[p].first, pieces[p].second);
          } catch (const std::exception&) {
            ++failures;
          }
        }
      };
      std::thread t0(declare_every_other, 0), t1(declare_every_other, 1);
      t0.join();
      t1.join();
      assert_int_equal(failures.load(), 0);
    } else {
      for (const auto& p : pieces) over.gradients_final(p.first, p.second);
    }
    dos::StepVerdict v = dos::StepVerdict::keep;
    if (k == changed) {
      cb.put(cb.grad, scaled);  // after the declaration: every speculative update must be redone
      v = dos::StepVerdict::changed;
    }
    if (k == skip) v = dos::StepVerdict::skip;
    dos::StepStats s;
    if (t % 2 == 0) {
      // the next forward overlapping the phase: finish_step_async, then each range's parameters as
      // forward would read them (first elements first), then the rest of the phase
      over.finish_step_async(v);
      assert_true(over.step_open());
      expect_error([&] { over.begin_step(); }, "begin_step while the phase runs");
      expect_error([&] { over.step(); }, "step() while the phase runs");
      expect_error([&] { over.gradients_final(0, 1); }, "gradients_final after finish_step_async");
      expect_error([&] { over.wait_parameters(0, n + 1); }, "wait_parameters beyond the parameters");
      const std::vector<uint16_t> want = ca.get(ca.param);  // the plain optimizer has stepped
      for (size_t lo = 0; lo < n; lo += 777) {
        const size_t hi = std::min(n, lo + 777);
        over.wait_parameters(lo, hi);
        const std::vector<uint16_t> got = cb.get(cb.param);  // only [lo, hi) is final yet
        for (size_t i = lo; i < hi; ++i)
          if (got[i] != want[i]) {
            std::fprintf(stderr, "step %d: parameter %zu is %#x after wait_parameters, %#x in the plain run\n", t, i,
                         got[i], want[i]);
            fail();
          }
      }
      s = over.wait_step();
      expect_error([&] { over.wait_step(); }, "wait_step twice");
    } else {
      s = over.finish_step(v);
    }
    assert_false(over.step_open());
    assert_true(s.overlapped);
    assert_true(s.skipped == (k == skip));
    if (k == changed) assert_int_equal(s.redone, s.speculated);
    else assert_int_equal(s.redone, 0);
    assert_true(s.hidden_params <= n);
    assert_true(s.exposed_seconds >= 0 && s.exposed_seconds <= s.seconds);
    speculated_total += s.speculated;
    redone_total += s.redone;
    if (k != skip) {
      ++rt;
      for (size_t i = 0; i < n; ++i)
        ref::adam_step(rp[i], rm[i], rv[i], from_bf16(k == changed ? scaled[i] : g[i]), h, rt);
    }
    expect_same_bits(plain, over, ca, cb, "after a step");
  }
  // every policy speculates: the CPU's subgroups on the CPU, the streamed ones on the GPU
  assert_true(speculated_total > 0);
  assert_true(redone_total > 0);
  std::printf("speculated %zu subgroup updates over %d steps, %zu redone\n", speculated_total, t, redone_total);
  for (int64_t c : over.step_counts()) assert_int_equal(c, rt);

  // both against the double-precision reference (bf16 parameters: 2 ulps of bf16 after a few steps;
  // the moments: a few fp32 ulps per step of the largest term, the gradient's size included)
  const std::vector<float> master = read(over, &dos::Optimizer::read_master);
  const std::vector<float> m = read(over, &dos::Optimizer::read_exp_avg);
  const std::vector<float> v = read(over, &dos::Optimizer::read_exp_avg_sq);
  for (size_t i = 0; i < n; ++i) {
    const double gs = i % 7 == 0 ? 3.0 : 0.01;  // the gradients' scale (grad_value)
    const double tol = 1e-6 + 2e-5 * std::fabs(rp[i]);
    const double tol_m = rt * 4 * ref::ulp(float(std::fabs(rm[i]) + 0.1 * gs));
    const double tol_v = rt * 4 * ref::ulp(float(rv[i] + 0.001 * gs * gs)) + 1e-12;
    if (std::fabs(double(master[i]) - rp[i]) > tol || std::fabs(double(m[i]) - rm[i]) > tol_m ||
        std::fabs(double(v[i]) - rv[i]) > tol_v) {
      std::fprintf(stderr, "element %zu: master %.9g (reference %.9g), exp_avg %.9g (%.9g), exp_avg_sq %.9g (%.9g)\n",
                   i, master[i], rp[i], m[i], rm[i], v[i], rv[i]);
      fail();
    }
  }
}

void test_overlap_bad_input(void**) {
  size_t n = 0;
  for (size_t s : kSizes) n += s;
  Caller c(n, g_memory == "cuda");
  std::vector<uint16_t> zeros(n, 0);
  c.put(c.param, zeros);
  c.put(c.grad, zeros);
  dos::OptimizerOptions oo;
  oo.subgroup_size = kSubgroup;
  oo.memory = g_memory == "cuda" ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  oo.verbose = false;
  oo.rates = dos::Rates{1e9, 8e8, 1e11, 1e11, 2e10, 2e10};
  dos::Optimizer o(*g_rt, c.views(), oo);
  expect_error([&] { o.gradients_final(0, 1); }, "gradients_final outside a step");
  expect_error([&] { o.finish_step(); }, "finish_step without begin_step");
  expect_error([&] { o.wait_step(); }, "wait_step without finish_step_async");
  o.wait_parameters(0, n);  // no phase runs: the parameters are current
  expect_error([&] { o.wait_parameters(3, 2); }, "wait_parameters of a reversed range");
  o.begin_step();
  expect_error([&] { o.begin_step(); }, "begin_step twice");
  expect_error([&] { o.gradients_final(0, n + 1); }, "a range beyond the parameters");
  expect_error([&] { o.gradients_final(5, 4); }, "an empty, reversed range");
  expect_error([&] { o.wait_parameters(0, 1); }, "wait_parameters before finish_step_async");
  o.gradients_final(0, 10);
  expect_error([&] { o.gradients_final(9, 11); }, "an element declared final twice");
  expect_error([&] { o.step(); }, "step() while a step is open");
  expect_error([&] { o.set_hyper(dos::AdamHyper{}); }, "set_hyper while a step is open");
  std::vector<float> buf(n);
  expect_error([&] { o.read_master(buf.data()); }, "reading the state while a step is open");
  expect_error([&] { o.load_state(buf.data(), buf.data(), buf.data(), o.step_counts()); },
               "load_state while a step is open");
  const dos::StepStats s = o.finish_step();
  assert_false(s.skipped);
  for (int64_t k : o.step_counts()) assert_int_equal(k, 1);  // still usable: the step ran whole
  o.step();
  for (int64_t k : o.step_counts()) assert_int_equal(k, 2);
  o.step_async();  // a plain step left running: not an overlapped phase
  expect_error([&] { o.step_async(); }, "step_async while a phase runs");
  const dos::StepStats sa = o.wait_step();
  assert_false(sa.overlapped);
  for (int64_t k : o.step_counts()) assert_int_equal(k, 3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s POLICY MEMORY\n", argv[0]);
    return 2;
  }
  g_policy = argv[1];
  g_memory = argv[2];
  int ndev = 0;
#if defined(DOS_HAVE_CUDA)
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
#endif
  if ((g_policy == "gpu" || g_memory == "cuda") && ndev == 0) {
    std::printf("skip: policy %s with %s memory needs a CUDA device and there is none\n", g_policy.c_str(),
                g_memory.c_str());
    return 77;
  }
  dos::RuntimeOptions ro;
  ro.policy = g_policy;
  ro.cpu_threads = 2;
  ro.verbose = false;
  try {
    dos::Runtime rt(ro);
    g_rt = &rt;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_same_bits),
        cmocka_unit_test(test_overlap_bad_input),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
  } catch (const dos::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
