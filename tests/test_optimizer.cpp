// The runtime end to end: Runtime + Optimizer over caller tensors of odd sizes (subgroups spanning
// tensors, tails), several steps, against the plain double-precision AdamW of reference.h; where
// each update ran; the PCIe bytes StarPU counted against models/traffic.h; bad API input.
//
//   test_optimizer POLICY MEMORY DTYPE OPT  POLICY: cpu, gpu, dmda, ...; MEMORY: host or cuda;
//                                           DTYPE: fp32, fp16 or bf16; OPT: adamw or adam
// Exits 77 (skip) when the run needs a GPU and there is none.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(DOS_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "caller_buffers.h"
#include "cmocka_cpp.h"
#include "dos.h"
#include "plan.h"
#include "reference.h"
#include "traffic.h"

namespace {

std::string g_policy, g_memory;
bool g_decoupled = true;
dos::DType g_dtype = dos::DType::bf16;
dos::Runtime* g_rt = nullptr;

const std::vector<size_t> kSizes = {1, 1000, 17, 0, 4099, 16, 2, 1025};
constexpr size_t kSubgroup = 1024;
constexpr int kSteps = 4;

float decode(const std::vector<uint16_t>& b16, const std::vector<float>& b32, size_t i) {
  if (g_dtype == dos::DType::fp32) return b32[i];
  return g_dtype == dos::DType::fp16 ? ref::f16_bits_to_float(b16[i]) : ref::bf16_bits_to_float(b16[i]);
}
void encode(std::vector<uint16_t>& b16, std::vector<float>& b32, size_t i, float x) {
  if (g_dtype == dos::DType::fp32) b32[i] = x;
  else if (g_dtype == dos::DType::fp16) b16[i] = ref::float_to_f16_bits(x);
  else {
    const float r = ref::round_to_bf16(x);
    uint32_t u;
    std::memcpy(&u, &r, 4);
    b16[i] = uint16_t(u >> 16);
  }
}

/// Marsaglia's xorshift64 from seed s: each call gives a double uniform in [-0.5, 0.5).
struct XorShift {
  uint64_t s;
  double operator()() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return double(s >> 11) / 9007199254740992.0 - 0.5;
  }
};

/// Caller-side buffers of the run's dtype (tests/caller_buffers.h).
struct CallerBuffers : test::CallerBuffers {
  CallerBuffers(size_t n, bool cuda) : test::CallerBuffers(n, dos::dtype_size(g_dtype), cuda) {}
};

/// The parameters of all kSizes' tensors together.
size_t total_params() {
  size_t n = 0;
  for (size_t s : kSizes) n += s;
  return n;
}

/// One view per tensor of kSizes, laid out one after another in buf's parameter and gradient buffers.
std::vector<dos::TensorView> tensor_views(const CallerBuffers& buf) {
  std::vector<dos::TensorView> views;
  size_t off = 0;
  for (size_t sz : kSizes) {
    views.push_back({static_cast<char*>(buf.param) + off * buf.esz, static_cast<char*>(buf.grad) + off * buf.esz, sz});
    off += sz;
  }
  return views;
}

void test_adamw_against_reference(void**) {
  const size_t n = total_params();
  const bool cuda = g_memory == "cuda";
  CallerBuffers buf(n, cuda);
  std::vector<uint16_t> p16(n), g16(n);
  std::vector<float> p32(n), g32(n);
  XorShift next{88172645463325252ull};
  for (size_t i = 0; i < n; ++i) encode(p16, p32, i, float(next()));
  const void* hostp = g_dtype == dos::DType::fp32 ? static_cast<void*>(p32.data()) : p16.data();
  const void* hostg = g_dtype == dos::DType::fp32 ? static_cast<void*>(g32.data()) : g16.data();
  buf.put(buf.param, hostp);

  const std::vector<dos::TensorView> views = tensor_views(buf);
  dos::OptimizerOptions oo;
  oo.adam.lr = double(1e-2f);
  oo.adam.beta1 = double(0.9f);
  oo.adam.beta2 = double(0.999f);
  oo.adam.eps = double(1e-8f);
  oo.adam.weight_decay = double(0.01f);
  oo.adam.decoupled = g_decoupled;
  oo.subgroup_size = kSubgroup;
  oo.dtype = g_dtype;
  oo.memory = cuda ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  dos::Optimizer opt(*g_rt, views, oo);
  assert_int_equal(opt.num_params(), n);
  assert_int_equal(opt.num_subgroups(), (n + kSubgroup - 1) / kSubgroup);

  std::vector<double> pr(n), mr(n, 0), vr(n, 0);
  for (size_t i = 0; i < n; ++i) pr[i] = decode(p16, p32, i);
  const ref::Hyper h{oo.adam.lr, oo.adam.beta1, oo.adam.beta2, oo.adam.eps, oo.adam.weight_decay, g_decoupled};
  const bool gpu_ok = g_rt->cuda_workers() > 0;
  // dos: a forced half-and-half plan, so that the placement can be checked subgroup by subgroup
  std::vector<dos::PlanSide> want_plan(opt.num_subgroups(), dos::PlanSide::cpu);
  if (g_policy == "dos") {
    opt.set_plan_override({dos::PlanOverride::fraction, 0.5});
    if (gpu_ok) want_plan = dos::spread_plan(opt.num_subgroups(), (opt.num_subgroups() + 1) / 2);
  }
  for (int t = 1; t <= kSteps; ++t) {
    for (size_t i = 0; i < n; ++i) encode(g16, g32, i, float(next() * 0.02));
    buf.put(buf.grad, hostg);
    const dos::StepStats st = opt.step();
    for (size_t i = 0; i < n; ++i) ref::adam_step(pr[i], mr[i], vr[i], decode(g16, g32, i), h, t);
    // where the updates ran
    assert_int_equal(st.subgroups_cpu + st.subgroups_gpu, opt.num_subgroups());
    if (g_policy == "cpu") assert_int_equal(st.subgroups_gpu, 0);
    if (g_policy == "gpu") assert_int_equal(st.subgroups_cpu, 0);
    if (!gpu_ok) assert_int_equal(st.subgroups_gpu, 0);
    if (g_policy == "dos") {
      // every Adam task ran on the side its plan named (the executing worker, from StarPU)
      assert_true(st.placement == want_plan);
    }
    // PCIe bytes, under every policy: exactly what models/traffic.h says for the sides the updates
    // ran on (each subgroup's executing worker, as StarPU reports it)
    assert_int_equal(st.placement.size(), opt.num_subgroups());
    uint64_t h2d = 0, d2h = 0;
    size_t on_gpu = 0;
    for (size_t sg = 0; sg < opt.num_subgroups(); ++sg) {
      const bool gpu = st.placement[sg] != dos::PlanSide::cpu;
      on_gpu += gpu;
      const dos::PcieBytes b =
          dos::subgroup_pcie_bytes(gpu, cuda, buf.esz, opt.subgroup_size(sg), opt.workload().grad_bytes);
      h2d += b.h2d;
      d2h += b.d2h;
    }
    assert_int_equal(on_gpu, st.subgroups_gpu);
    std::printf("  step %d: H2D %llu B (model %llu), D2H %llu B (model %llu), %zu of %zu subgroups on the GPU\n", t,
                (unsigned long long)st.bytes_h2d, (unsigned long long)h2d, (unsigned long long)st.bytes_d2h,
                (unsigned long long)d2h, on_gpu, opt.num_subgroups());
    assert_int_equal(st.bytes_h2d, h2d);
    assert_int_equal(st.bytes_d2h, d2h);
  }
  for (size_t sg = 0; sg < opt.num_subgroups(); ++sg) assert_int_equal(opt.step_count(sg), kSteps);

  std::vector<float> master(n), m(n), v(n);
  opt.read_master(master.data());
  opt.read_exp_avg(m.data());
  opt.read_exp_avg_sq(v.data());
  buf.get(const_cast<void*>(hostp), buf.param);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    // rounding of p, m, v per step (see test_kernels.cpp); Adam's coupled L2 gradient g + wd p is
    // rounded too: its relative error is at most ref::ulp(|g| + |wd p|) / |g + wd p|, which the
    // multi-step trajectory carries into p; the gradients here are at least 1e-5 away from
    // cancelling it for all but a few elements, so 1e-4 lr per step covers it (an error in the
    // formula, such as Adam run as AdamW, is of the order of wd * lr = 1e-4 lr per step, 10x more).
    const double bound = kSteps * (2 * ref::ulp(float(pr[i])) + (g_decoupled ? 1e-5 : 1e-4) * h.lr);
    worst = std::max(worst, std::fabs(master[i] - pr[i]) / bound);
    assert_true(std::fabs(m[i] - mr[i]) <= kSteps * 4 * ref::ulp(float(std::fabs(mr[i]) + 0.02)));
    assert_true(std::fabs(v[i] - vr[i]) <= kSteps * 4 * ref::ulp(float(vr[i])) + 1e-12);
    // the caller's parameters: the master rounded to the caller's dtype, exactly
    std::vector<uint16_t> w16(1);
    std::vector<float> w32(1);
    encode(w16, w32, 0, master[i]);
    const float want = decode(w16, w32, 0), got = decode(p16, p32, i);
    assert_memory_equal(&want, &got, 4);
  }
  std::printf("  %zu params, %zu subgroups, policy %s, %s memory, %s: worst master error / bound %.3f\n", n,
              opt.num_subgroups(), g_policy.c_str(), g_memory.c_str(), dos::dtype_name(g_dtype), worst);
  assert_true(worst <= 1.0);
}

template <class F>
void expect_error(F f, const char* what) {
  bool threw = false;
  try {
    f();
  } catch (const dos::Error& e) {
    threw = true;
    std::printf("  %s -> %s\n", what, e.what());
  }
  if (!threw) {
    std::fprintf(stderr, "no dos::Error for %s\n", what);
    fail();
  }
}

void test_bad_input(void**) {
  std::vector<float> p(10), g(10);
  dos::OptimizerOptions oo;
  oo.dtype = dos::DType::fp32;
  oo.subgroup_size = 4;
  expect_error([&] { dos::Optimizer o(*g_rt, {}, oo); }, "no tensors");
  expect_error([&] { dos::Optimizer o(*g_rt, {{nullptr, g.data(), 10}}, oo); }, "null parameter pointer");
  dos::OptimizerOptions z = oo;
  z.subgroup_size = 0;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, z); }, "subgroup size 0");
  dos::OptimizerOptions bad = oo;
  bad.adam.lr = -1;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "negative learning rate");
  bad = oo;
  bad.adam.beta2 = 1.0;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "beta2 = 1");
  // rates given in part, or beyond the model's bounds, are refused (not calibrated over silently)
  bad = oo;
  bad.rates.U_c = 4e9;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "rates given in part");
  bad = oo;
  bad.rates.link_share = 0.7;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "link_share alone");
  bad = oo;
  bad.rates = dos::Rates{2e9, 3e9, 1e11, 1e11, 5e10, 5e10};
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "U_c_dma above U_c");
  bad.rates = dos::Rates{4e9, 3e9, 1e11, 1e11, 5e10, 5e10, std::nextafter(dos::kLowestLinkShare, 0.0)};
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "link_share below 1/16");
  // a rates file's calibrated rates: only beside rates, whole and within the bounds
  bad = oo;
  bad.calibrated_rates = dos::Rates{4e9, 3e9, 1e11, 1e11, 5e10, 5e10};
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "calibrated rates without rates");
  bad.rates = dos::Rates{4e9, 3e9, 1e11, 1e11, 5e10, 5e10};
  bad.calibrated_rates.B_d2h = 0;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "calibrated rates in part");
  bad.calibrated_rates = dos::Rates{2e9, 3e9, 1e11, 1e11, 5e10, 5e10};
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "calibrated U_c_dma above U_c");
  bad = oo;  // fp32 parameters
  bad.compact_master = true;
  expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "compact master with fp32 parameters");
  if (g_rt->cuda_workers() == 0) {
    bad = oo;
    bad.memory = dos::MemoryKind::cuda;
    expect_error([&] { dos::Optimizer o(*g_rt, {{p.data(), g.data(), 10}}, bad); }, "GPU memory without a CUDA worker");
  }
}

// The caller's parameters p_i = 0.001 (i % p_period) - p_offset and gradients g_i = 0.0001
// (i % g_period) - g_offset, n of each in the run's dtype, written into buf.
void fill_buffers(CallerBuffers& buf, size_t n, int p_period, double p_offset, int g_period, double g_offset) {
  std::vector<uint16_t> p16(n), g16(n);
  std::vector<float> p32(n), g32(n);
  for (size_t i = 0; i < n; ++i) {
    encode(p16, p32, i, float(0.001 * double(i % size_t(p_period)) - p_offset));
    encode(g16, g32, i, float(0.0001 * double(i % size_t(g_period)) - g_offset));
  }
  buf.put(buf.param, g_dtype == dos::DType::fp32 ? static_cast<void*>(p32.data()) : p16.data());
  buf.put(buf.grad, g_dtype == dos::DType::fp32 ? static_cast<void*>(g32.data()) : g16.data());
}

// The run's dtype and memory, subgroups of kSubgroup, Adam's defaults.
dos::OptimizerOptions small_subgroup_options() {
  dos::OptimizerOptions oo;
  oo.subgroup_size = kSubgroup;
  oo.dtype = g_dtype;
  oo.memory = g_memory == "cuda" ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  return oo;
}

// Where each subgroup's state has a valid copy (Optimizer::execution().state_off_gpu, what the
// phase simulation charges a resident subgroup's first upload by): no flags without a CUDA worker;
// with one, every state off the GPU before the first phase, then on it only for the subgroups the
// plan kept resident, still there after the masters were read on the host, off it again once they
// were written there, and back on after the next phase. Policy dos only (a forced half-and-half
// plan of the subgroups that are not resident).
void test_state_off_gpu(void**) {
  if (g_policy != "dos") {
    std::printf("  policy %s: no resident state\n", g_policy.c_str());
    return;
  }
  const size_t n = total_params();
  CallerBuffers buf(n, g_memory == "cuda");
  fill_buffers(buf, n, 97, 0.05, 13, 0.0006);
  const std::vector<dos::TensorView> views = tensor_views(buf);
  dos::OptimizerOptions oo = small_subgroup_options();
  oo.gpu_resident_budget = 2 * 12 * int64_t(kSubgroup) + 360;  // two subgroups' state and their padding
  dos::Optimizer opt(*g_rt, views, oo);
  opt.set_plan_override({dos::PlanOverride::fraction, 0.5});
  const size_t ns = opt.num_subgroups();
  if (g_rt->cuda_workers() == 0) {
    assert_true(opt.execution().state_off_gpu.empty());
    opt.step();
    assert_true(opt.execution().state_off_gpu.empty());
    return;
  }
  std::vector<bool> flags = opt.execution().state_off_gpu;
  assert_int_equal(flags.size(), ns);
  for (size_t i = 0; i < ns; ++i) assert_true(flags[i]);
  const dos::StepStats st = opt.step();
  assert_int_equal(st.placement.size(), ns);
  size_t resident = 0;
  std::vector<bool> want(ns);
  for (size_t i = 0; i < ns; ++i) {
    want[i] = st.placement[i] != dos::PlanSide::gpu_resident;
    resident += want[i] ? 0 : 1;
  }
  std::printf("  %zu of %zu subgroups resident\n", resident, ns);
  assert_true(resident > 0 && resident < ns);
  assert_true(opt.execution().state_off_gpu == want);
  std::vector<float> master(n);
  opt.read_master(master.data());
  assert_true(opt.execution().state_off_gpu == want);
  opt.write_master_range(0, n, master.data());
  flags = opt.execution().state_off_gpu;
  for (size_t i = 0; i < ns; ++i) assert_true(flags[i]);
  opt.step();
  assert_true(opt.execution().state_off_gpu == want);
}

// The `dos` plan decided ahead (PlanNeeds::decided_ahead, scheduler/plan_prefetch.h): every phase
// runs the plan of the model's search at the rates, workload and execution it begins with
// (choose_plan_simulated called here before each step), and from the second phase on it takes the
// decision made when the phase before ended, with its rates refined. Without a CUDA worker no plan
// is asked: plan_seconds 0, nothing decided ahead. Policy dos only (no plan override).
void test_plan_decided_ahead(void**) {
  if (g_policy != "dos") {
    std::printf("  policy %s: no plan of the model\n", g_policy.c_str());
    return;
  }
  const size_t n = total_params();
  CallerBuffers buf(n, g_memory == "cuda");
  fill_buffers(buf, n, 89, 0.04, 11, 0.0005);
  const std::vector<dos::TensorView> views = tensor_views(buf);
  const dos::OptimizerOptions oo = small_subgroup_options();
  dos::Optimizer opt(*g_rt, views, oo);
  for (int t = 1; t <= 4; ++t) {
    std::vector<dos::PlanSide> want(opt.num_subgroups(), dos::PlanSide::cpu);
    if (g_rt->cuda_workers() > 0) want = dos::choose_plan_simulated(opt.workload(), opt.rates(), opt.execution()).plan;
    const dos::StepStats st = opt.step();
    std::printf("  step %d: plan %s, decided ahead %d, %.1f us on the plan\n", t, dos::plan_letters(st.plan).c_str(),
                int(st.plan_decided_ahead), 1e6 * st.plan_seconds);
    assert_true(st.plan == want);
    if (g_rt->cuda_workers() == 0) {
      assert_false(st.plan_decided_ahead);
      assert_true(st.plan_seconds == 0);
    } else {
      assert_true(st.plan_decided_ahead == (t > 1));
      if (t == 1) assert_true(st.plan_seconds > 0);  // the search, microseconds at least
    }
  }
}

}  // namespace

// The compact master (OptimizerOptions::compact_master) against the full one, bf16 only: two
// optimizers over caller buffers of the same values (kSizes: segments starting at odd elements of
// their subgroups) take the same gradients; after every step the caller's parameters are the same
// bits, and the PCIe bytes StarPU counted are those of models/traffic.h's compact form for where the
// updates ran; then the masters, exp_avg and exp_avg_sq read back (read_master, with_host_state,
// read_master_range) are the same bits; a range of masters written in both (write_master_range)
// reads back as written and, after one more step, gives the same parameters and state; a whole state
// loaded into both (load_state) gives the same parameters at once and the same state after a step.
void test_compact_master_same_bits(void**) {
  if (g_dtype != dos::DType::bf16) {
    std::printf("  %s parameters: the compact master is for bf16 only\n", dos::dtype_name(g_dtype));
    return;
  }
  const size_t n = total_params();
  const bool cuda = g_memory == "cuda";
  CallerBuffers full_buf(n, cuda), compact_buf(n, cuda);
  std::vector<uint16_t> p16(n), g16(n), got_full(n), got_compact(n);
  std::vector<float> p32(n), g32(n);
  XorShift next{0x9E3779B97F4A7C15ull};
  for (size_t i = 0; i < n; ++i) encode(p16, p32, i, float(next()));
  full_buf.put(full_buf.param, p16.data());
  compact_buf.put(compact_buf.param, p16.data());
  dos::OptimizerOptions oo = small_subgroup_options();
  oo.adam.lr = 1e-2;
  oo.adam.weight_decay = 0.01;
  oo.adam.decoupled = g_decoupled;
  dos::Optimizer full(*g_rt, tensor_views(full_buf), oo);
  oo.compact_master = true;
  dos::Optimizer compact(*g_rt, tensor_views(compact_buf), oo);
  if (g_policy == "dos") {
    full.set_plan_override({dos::PlanOverride::fraction, 0.5});
    compact.set_plan_override({dos::PlanOverride::fraction, 0.5});
  }
  auto same_params = [&](const char* when) {
    full_buf.get(got_full.data(), full_buf.param);
    compact_buf.get(got_compact.data(), compact_buf.param);
    for (size_t i = 0; i < n; ++i)
      if (got_full[i] != got_compact[i]) {
        std::fprintf(stderr, "%s: parameter %zu is 0x%04x in compact form, 0x%04x in full form\n", when, i,
                     got_compact[i], got_full[i]);
        fail();
      }
  };
  auto step_both = [&](const char* when) {
    for (size_t i = 0; i < n; ++i) encode(g16, g32, i, float(next() * 0.02));
    full_buf.put(full_buf.grad, g16.data());
    compact_buf.put(compact_buf.grad, g16.data());
    full.step();
    const std::vector<bool> on_host = compact.execution().params_on_host;  // P in the staging already
    assert_int_equal(on_host.size(), compact.num_subgroups());
    const dos::StepStats st = compact.step();
    same_params(when);
    // with a GPU, dos's half-streamed plan and StarPU's gpu policy run the compact GPU kernels
    // (not under a forced all-CPU plan)
    bool plan_on_gpu = false;
    for (dos::PlanSide s : st.plan) plan_on_gpu = plan_on_gpu || s != dos::PlanSide::cpu;
    if (g_rt->cuda_workers() > 0 && ((g_policy == "dos" && plan_on_gpu) || g_policy == "gpu")) assert_true(st.subgroups_gpu > 0);
    uint64_t h2d = 0, d2h = 0;
    for (size_t sg = 0; sg < compact.num_subgroups(); ++sg) {
      const dos::PcieBytes b = dos::subgroup_pcie_bytes(st.placement[sg] != dos::PlanSide::cpu, cuda, 2,
                                                        compact.subgroup_size(sg), compact.workload().grad_bytes, true,
                                                        on_host[sg]);
      h2d += b.h2d;
      d2h += b.d2h;
    }
    std::printf("  %s: compact H2D %llu B (model %llu), D2H %llu B (model %llu), %zu subgroups on the GPU\n", when,
                (unsigned long long)st.bytes_h2d, (unsigned long long)h2d, (unsigned long long)st.bytes_d2h,
                (unsigned long long)d2h, st.subgroups_gpu);
    assert_int_equal(st.bytes_h2d, h2d);
    assert_int_equal(st.bytes_d2h, d2h);
    // under a plan, a subgroup updated on the CPU keeps its new parameters in the host staging for
    // the next phase (its next CPU update brings none down); a streamed one, or any under StarPU's
    // own policies (no plan), does not
    const std::vector<bool> now = compact.execution().params_on_host;
    for (size_t sg = 0; sg < compact.num_subgroups(); ++sg)
      assert_true(now[sg] == (!st.plan.empty() && st.plan[sg] == dos::PlanSide::cpu));
  };
  auto none_on_host = [&](const char* when) {  // the masters written: the staging holds no P
    for (bool b : compact.execution().params_on_host)
      if (b) {
        std::fprintf(stderr, "%s: a subgroup still counts its parameters in the host staging\n", when);
        fail();
      }
  };
  auto same_state = [&](const char* when) {
    std::vector<float> a(n), b(n);
    for (int k = 0; k < 3; ++k) {
      (k == 0 ? full.read_master(a.data()) : k == 1 ? full.read_exp_avg(a.data()) : full.read_exp_avg_sq(a.data()));
      (k == 0 ? compact.read_master(b.data()) : k == 1 ? compact.read_exp_avg(b.data()) : compact.read_exp_avg_sq(b.data()));
      if (std::memcmp(a.data(), b.data(), n * 4) != 0) {
        std::fprintf(stderr, "%s: slice %d of the state differs between the forms\n", when, k);
        fail();
      }
    }
  };
  for (int t = 1; t <= kSteps; ++t) step_both(("step " + std::to_string(t)).c_str());
  {  // reading the masters keeps a CPU subgroup's P in the staging (the next step's bytes and bits
     // above check that P against the full form)
    const std::vector<bool> kept = compact.execution().params_on_host;
    same_state("after the steps");
    assert_true(compact.execution().params_on_host == kept);
  }
  if (g_policy == "dos") {
    // Sides that change from phase to phase: every subgroup (none resident here) on the
    // CPU, then all streamed (with the caller on the GPU: the direct path writes P there), then on
    // the CPU again, whose Adam must read the P the GPU wrote, not the one its staging kept two
    // phases before; then stride plans that swap sides. A skip of the P download where the staging
    // is stale gives other bits than the full form (same_params) or other bus bytes.
    const double fractions[] = {0.0, 1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0};
    int k = 0;
    for (double f : fractions) {
      full.set_plan_override({dos::PlanOverride::fraction, f});
      compact.set_plan_override({dos::PlanOverride::fraction, f});
      step_both(("alternating sides, fraction " + std::to_string(f) + " #" + std::to_string(k++)).c_str());
    }
    for (double stride : {2.0, 3.0, 2.0}) {  // stride plans: the streamed ones every k-th
      full.set_plan_override({dos::PlanOverride::stride, stride});
      compact.set_plan_override({dos::PlanOverride::stride, stride});
      step_both(("stride " + std::to_string(stride)).c_str());
    }
    full.set_plan_override({dos::PlanOverride::fraction, 0.5});
    compact.set_plan_override({dos::PlanOverride::fraction, 0.5});
    // a skipped overlapped phase keeps the flags (P untouched), and an asynchronous step follows
    const std::vector<bool> before = compact.execution().params_on_host;
    full.begin_step();
    compact.begin_step();
    full.finish_step(dos::StepVerdict::skip);
    compact.finish_step(dos::StepVerdict::skip);
    assert_true(compact.execution().params_on_host == before);
    same_params("after a skipped phase");
    for (size_t i = 0; i < n; ++i) encode(g16, g32, i, float(next() * 0.02));
    full_buf.put(full_buf.grad, g16.data());
    compact_buf.put(compact_buf.grad, g16.data());
    full.step_async();
    full.wait_step();
    compact.step_async();
    compact.wait_step();
    same_params("after an asynchronous step");
    step_both("the step after an asynchronous one");
  }
  same_state("after the sides changed");
  {  // the masters moved off their bf16 values: some r bits are set, and the low halves are not all 0
    std::vector<float> master(n);
    compact.read_master(master.data());
    size_t up = 0, off_grid = 0;
    compact_buf.get(got_compact.data(), compact_buf.param);
    for (size_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &master[i], 4);
      off_grid += (u & 0xffffu) != 0;
      up += (u >> 16) != got_compact[i];
    }
    std::printf("  %zu of %zu masters off the bf16 grid, %zu rounded up\n", off_grid, n, up);
    assert_true(off_grid > n / 2 && up > n / 8);
  }
  {  // with_host_state: the compact form's masters rebuilt, exp_avg and exp_avg_sq as they are
    std::vector<float> a, b;
    for (dos::Optimizer* o : {&full, &compact})
      o->with_host_state([&](const std::vector<dos::Optimizer::HostState>& st) {
        std::vector<float>& out = o == &full ? a : b;
        for (const auto& sg : st)
          for (const float* part : {sg.master, sg.exp_avg, sg.exp_avg_sq}) out.insert(out.end(), part, part + sg.size);
      });
    assert_int_equal(a.size(), 3 * n);
    assert_memory_equal(a.data(), b.data(), a.size() * 4);
  }
  {  // a range of masters written (its ends inside subgroups), then one step
    std::vector<float> w(n - 8);
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(next());
    full.write_master_range(3, n - 5, w.data());
    compact.write_master_range(3, n - 5, w.data());
    none_on_host("after write_master_range");
    // (the full form leaves the caller's parameters as they were until the next step; the compact
    // form writes their rounding, which the next step reads)
    std::vector<float> r(n - 8);
    compact.read_master_range(3, n - 5, r.data());
    assert_memory_equal(r.data(), w.data(), w.size() * 4);
    step_both("the step after write_master_range");
    same_state("after write_master_range and a step");
  }
  {  // a state loaded (the full optimizer's own, its masters moved off the grid), then one step
    std::vector<float> master(n), m(n), v(n);
    full.read_master(master.data());
    full.read_exp_avg(m.data());
    full.read_exp_avg_sq(v.data());
    for (size_t i = 0; i < n; ++i) master[i] = master[i] * 1.001f + 1e-6f;
    const std::vector<int64_t> steps = full.step_counts();
    full.load_state(master.data(), m.data(), v.data(), steps);
    compact.load_state(master.data(), m.data(), v.data(), steps);
    none_on_host("after load_state");
    same_params("after load_state");
    std::vector<float> back(n);
    compact.read_master(back.data());
    assert_memory_equal(back.data(), master.data(), n * 4);
    step_both("the step after load_state");
    same_state("after load_state and a step");
  }
  {  // a NaN master loaded in place has no compact form: Error, and no step until a whole state is
     // loaded, which mends it
    std::vector<float> master(n), m(n), v(n);
    full.read_master(master.data());
    full.read_exp_avg(m.data());
    full.read_exp_avg_sq(v.data());
    const std::vector<int64_t> steps = full.step_counts();
    expect_error(
        [&] {
          compact.load_state_in_place(steps, [&](const std::vector<dos::Optimizer::HostStateOut>& st) {
            size_t at = 0;
            for (const auto& sg : st) {
              std::memcpy(sg.master, master.data() + at, sg.size * 4);
              std::memcpy(sg.exp_avg, m.data() + at, sg.size * 4);
              std::memcpy(sg.exp_avg_sq, v.data() + at, sg.size * 4);
              at += sg.size;
            }
            st.back().master[st.back().size - 1] = std::nanf("");
          });
        },
        "a NaN master loaded in place into the compact form");
    expect_error([&] { compact.step(); }, "a step after that load");
    compact.load_state(master.data(), m.data(), v.data(), steps);
    step_both("the step after a whole state loaded again");
    same_state("after that step");
  }
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: test_optimizer POLICY host|cuda fp32|fp16|bf16 adamw|adam\n");
    return 2;
  }
  g_decoupled = std::string(argv[4]) != "adam";
  g_policy = argv[1];
  g_memory = argv[2];
  const std::string dt = argv[3];
  g_dtype = dt == "fp32" ? dos::DType::fp32 : dt == "fp16" ? dos::DType::fp16 : dos::DType::bf16;
  const bool needs_gpu = g_policy == "gpu" || g_memory == "cuda";
  int ndev = 0;
#if defined(DOS_HAVE_CUDA)
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
#endif
  if (needs_gpu && ndev == 0) {
    std::printf("skip: policy %s with %s memory needs a CUDA device and there is none\n", g_policy.c_str(), g_memory.c_str());
    return 77;
  }
  // An unknown policy is refused before StarPU starts.
  try {
    dos::RuntimeOptions bad_options;
    bad_options.policy = "no-such-policy";
    dos::Runtime bad(bad_options);
    std::fprintf(stderr, "an unknown policy was accepted\n");
    return 1;
  } catch (const dos::Error& e) {
    std::printf("  unknown policy -> %s\n", e.what());
  }
  dos::RuntimeOptions ro;
  ro.policy = g_policy;
  dos::Runtime rt(ro);
  g_rt = &rt;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw_against_reference),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_state_off_gpu),
      cmocka_unit_test(test_plan_decided_ahead),
      cmocka_unit_test(test_compact_master_same_bits),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
