// The resource model (models/resource_model.h) on known cases, with the expected figures computed
// here by hand from the model's formulas (models/resource_model.h), not by the model's code.
#include <cmath>
#include <algorithm>
#include <clocale>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cmocka_cpp.h"
#include "number_text.h"
#include "dos.h"
#include "refinement.h"
#include "resource_model.h"
#include "traffic.h"

namespace {

dos::Workload uniform(std::size_t n, std::size_t s) {
  dos::Workload w;
  w.sizes.assign(n, s);
  w.caller_on_gpu = true;
  w.param_bytes = 2;
  return w;
}

size_t count_streamed(const std::vector<dos::PlanSide>& p) {
  size_t m = 0;
  for (auto s : p) m += s == dos::PlanSide::gpu_streamed;
  return m;
}

void test_plans(void**) {
  const auto s2 = dos::stride_plan(6, 2);
  for (size_t i = 0; i < 6; ++i) assert_int_equal(int(s2[i]), i % 2 == 1 ? 1 : 0);
  // one subgroup in k streamed, spread evenly, is the paper's stride when k divides n
  for (size_t k : {1, 2, 3, 4, 6}) {
    const auto a = dos::spread_plan(12, 12 / k), b = dos::stride_plan(12, k);
    assert_true(a == b);
  }
  for (size_t m = 0; m <= 31; ++m) assert_int_equal(count_streamed(dos::spread_plan(31, m)), m);
}

// The paper's worked example without contention: 20B model at DP=4, N = 3.83e9 in 31 subgroups,
// U_c = 2.19e9 params/s, B = 20.7 GB/s each way (the paper's figures).
void test_paper_example(void**) {
  const double S = 3.83e9 / 31, Uc = 2.19e9, B = 20.7e9;
  const dos::Workload w = uniform(31, std::size_t(S));
  dos::Rates r{Uc, Uc, 1e11, 4e11, B, B};
  const dos::StrideChoice c = dos::choose_stride(w, r);
  std::printf("  paper example: best stride k = %zu, predicted %.3f s (%s-bound)\n", c.k, c.predicted.total,
              c.predicted.bound_by().c_str());
  assert_true(c.k == 2 || c.k == 3);
  // k = 3 by hand: subgroups 2, 5, ..., 29 streamed (10), 21 on the CPU
  const double s = double(std::size_t(S));
  const double t_cpu = 21 * s / Uc, t_h2d = (12 * 10 + 2 * 21) * s / B, t_d2h = (12 * 10 + 4 * 21) * s / B;
  const dos::Prediction p3 = dos::predict(w, dos::stride_plan(31, 3), r);
  assert_float_equal(p3.cpu, t_cpu, 1e-9);
  assert_float_equal(p3.h2d, t_h2d, 1e-9);
  assert_float_equal(p3.d2h, t_d2h, 1e-9);
  assert_float_equal(p3.total, std::max(t_cpu, std::max(t_h2d, t_d2h)), 1e-9);
  // k = 2: 15 streamed (1, 3, ..., 29), 16 on the CPU: D2H-bound
  const dos::Prediction p2 = dos::predict(w, dos::stride_plan(31, 2), r);
  assert_float_equal(p2.total, (12 * 15 + 4 * 16) * s / B, 1e-9);
  assert_string_equal(p2.bound_by().c_str(), "d2h");
}

// The GPU machine: PCIe 51 GB/s each way, U_c 4.1e9 alone and 2.9e9 under full-duplex DMA:
// roughly half streamed, near 0.6-0.7 s for 3.83e9 parameters.
void test_gpu_machine(void**) {
  const dos::Workload w = uniform(31, 123548387);
  const dos::Rates r{4.1e9, 2.9e9, 1e11, 4e11, 51e9, 51e9};
  const dos::Choice c = dos::choose_plan(w, r);
  const double frac = double(c.streamed) / 31;
  const double lb = dos::lower_bound(w, r);
  std::printf("  GPU machine: %zu of 31 streamed (%.2f), predicted %.3f s (%s-bound), lower bound %.3f s\n",
              c.streamed, frac, c.predicted.total, c.predicted.bound_by().c_str(), lb);
  assert_true(frac > 0.35 && frac < 0.65);
  assert_true(c.predicted.total > 0.55 && c.predicted.total < 0.7);
  assert_true(lb <= c.predicted.total + 1e-12);
  assert_true(lb > 0.95 * c.predicted.total);
  // the contention term matters: without it the model streams less and predicts too little
  const dos::Rates paper{4.1e9, 4.1e9, 1e11, 4e11, 51e9, 51e9};
  const dos::Choice cp = dos::choose_plan(w, paper);
  assert_true(cp.streamed < c.streamed);
  assert_true(cp.predicted.total < c.predicted.total);
  // by hand at 16 of 31 streamed: D2H carries 12 B for streamed and 4 B for CPU parameters
  const double s = 123548387.0;
  const dos::Prediction p16 = dos::predict(w, dos::spread_plan(31, 16), r);
  assert_float_equal(p16.d2h, (12 * 16 + 4 * 15) * s / 51e9, 1e-9);
  const double t_dma = p16.d2h, n_cpu = 15 * s;
  const double t_cpu = n_cpu / 2.9e9 <= t_dma ? n_cpu / 2.9e9 : t_dma + (n_cpu - 2.9e9 * t_dma) / 4.1e9;
  assert_float_equal(p16.cpu, t_cpu, 1e-9);
}

// The paper's stride among the plan search's candidates. Four subgroups of 1e8 and a short last one
// of 2e7, no contention (U_c_dma = U_c = 1.6e9), PCIe 20 GB/s each way: by hand, a plan with n_s
// parameters streamed and n_c on the CPU takes max(n_c / U_c, (12 n_s + 4 n_c) / B) (D2H carries
// the streamed state and the CPU subgroups' fp32 gradients; H2D less). The stride 2 (cscsc: 2e8
// streamed) takes max(0.1375, 0.164) = 0.164 s; the spread plans of 2 and 3 streamed (ccscs, cscss:
// 1.2e8 and 2.2e8) max(0.1875, 0.132) = 0.1875 s and max(0.125, 0.172) = 0.172 s: the stride wins.
void test_stride_candidate(void**) {
  dos::Workload w = uniform(5, 100000000);
  w.sizes.back() = 20000000;
  const dos::Rates r{1.6e9, 1.6e9, 1e12, 1e12, 20e9, 20e9};
  const double B = 20e9, U = 1.6e9;
  auto by_hand = [&](double ns, double nc) { return std::max(nc / U, (12 * ns + 4 * nc) / B); };
  assert_float_equal(dos::predict(w, dos::stride_plan(5, 2), r).total, by_hand(2e8, 2.2e8), 1e-9);
  assert_float_equal(dos::predict(w, dos::spread_plan(5, 2), r).total, by_hand(1.2e8, 3e8), 1e-9);
  assert_float_equal(dos::predict(w, dos::spread_plan(5, 3), r).total, by_hand(2.2e8, 2e8), 1e-9);
  const dos::Choice c = dos::choose_plan(w, r);
  assert_true(c.plan == dos::stride_plan(5, 2));
  assert_int_equal(c.streamed, 2);
  assert_float_equal(c.predicted.total, 0.164, 1e-9);
  // no streaming allowed: the strides are not candidates either
  w.may_stream = false;
  assert_true(dos::choose_plan(w, r).plan == dos::spread_plan(5, 0));
}

// The bound with calibrated and refined rates: a CPU measured faster in the phases than the
// calibration's lowers it (the 20B quarter's calibration once measured CPU Adam at 2.4 Gparams/s
// where its phases ran it at 2.9 beside DMA); links averaged lower over phases do not raise it.
void test_bound_two_rates(void**) {
  const dos::Workload w = uniform(35, 123520000);
  const dos::Rates calibrated{2.39e9, 1.62e9, 1.38e11, 4.8e11, 49.3e9, 51.1e9};
  dos::Rates faster_cpu = calibrated;
  faster_cpu.U_c = faster_cpu.U_c_dma = 3.4e9;
  dos::Rates slower_links = calibrated;
  slower_links.B_h2d = slower_links.B_d2h = 40e9;
  const double lb_cal = dos::lower_bound(w, calibrated), lb_fast = dos::lower_bound(w, faster_cpu);
  assert_true(lb_fast < 0.95 * lb_cal);
  assert_float_equal(dos::lower_bound(w, calibrated, faster_cpu, 1), lb_fast, 1e-12);
  assert_true(dos::lower_bound(w, slower_links) > lb_cal);
  assert_float_equal(dos::lower_bound(w, calibrated, slower_links, 1), lb_cal, 1e-12);
  // two CPU workers count as in the one-rate bound
  assert_float_equal(dos::lower_bound(w, calibrated, calibrated, 2), dos::lower_bound(w, calibrated, 2), 1e-12);
  // the calibration's link_share estimate (below 1) raises no bound: the calibrated side counts it
  // as the placeholder 1, where the one-rate bound of the same rates is higher (less host memory)
  dos::Rates estimated = calibrated;
  estimated.link_share = dos::estimated_link_share(calibrated);
  assert_true(estimated.link_share < 0.7);
  for (const dos::Workload& v : {w, [&] { dos::Workload h = w; h.caller_on_gpu = false; return h; }()}) {
    assert_float_equal(dos::lower_bound(v, estimated, calibrated, 1), dos::lower_bound(v, calibrated, calibrated, 1),
                       1e-12);
    assert_true(dos::lower_bound(v, estimated) > dos::lower_bound(v, calibrated) * 1.001);
  }
  // U_c refined up alone (the refinement's measure from the tasks after the streaming): the
  // one-rate bound of those rates rises (host memory M shrinks with U_c_dma / U_c), the two-rate
  // bound does not
  dos::Rates faster_alone = calibrated;
  faster_alone.U_c = 3.4e9;
  dos::Workload host = w;
  host.caller_on_gpu = false;
  for (const dos::Workload& v : {w, host}) {
    const double two = dos::lower_bound(v, calibrated, faster_alone, 1);
    assert_true(two <= dos::lower_bound(v, calibrated) * (1 + 1e-12));
    assert_true(two <= dos::lower_bound(v, faster_alone) * (1 + 1e-12));
  }
  assert_true(dos::lower_bound(host, faster_alone) > dos::lower_bound(host, calibrated));
  // each set better at one resource (no contention: host memory does not bind): the bound with the
  // better of each is below both (the lesser of the two bounds would not be)
  const dos::Rates cpu_fast{4.0e9, 4.0e9, 1.38e11, 4.8e11, 30e9, 30e9}, links_fast{2.0e9, 2.0e9, 1.38e11, 4.8e11, 60e9, 60e9};
  for (const dos::Workload& v : {w, host})
    assert_true(dos::lower_bound(v, cpu_fast, links_fast, 1) <
                0.99 * std::min(dos::lower_bound(v, cpu_fast), dos::lower_bound(v, links_fast)));
  // at most either one-rate bound, for rates drawn apart (a fixed-seed generator), 1 or 2 workers
  unsigned long long seed = 12345;
  auto draw = [&](double lo, double hi) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * double(seed >> 11) / double(1ULL << 53);
  };
  for (int i = 0; i < 200; ++i) {
    dos::Rates r[2];
    for (dos::Rates& x : r) {
      x.U_c = draw(1e9, 5e9);
      x.U_c_dma = x.U_c * draw(0.3, 1.0);
      x.U_g = draw(5e10, 2e11);
      x.D_c = draw(1e11, 6e11);
      x.B_h2d = draw(2e10, 6e10);
      x.B_d2h = draw(2e10, 6e10);
    }
    const dos::Workload& v = i % 2 ? w : host;
    const std::size_t workers = 1 + std::size_t(i % 3 == 0);
    const double two = dos::lower_bound(v, r[0], r[1], workers);
    assert_true(two <= dos::lower_bound(v, r[0], workers) * (1 + 1e-9));
    assert_true(two <= dos::lower_bound(v, r[1], workers) * (1 + 1e-9));
    assert_true(two > 0);
  }
  dos::Rates bad = calibrated;
  bad.B_h2d = 0;
  assert_true(throws_invalid_argument([&] { dos::lower_bound(w, calibrated, bad, 1); }));
}

void test_extremes(void**) {
  const dos::Workload w = uniform(16, 1 << 24);
  // a CPU much faster than the link: nothing on the GPU
  const dos::Choice fast_cpu = dos::choose_plan(w, dos::Rates{1e12, 1e12, 1e11, 4e11, 1e9, 1e9});
  assert_int_equal(fast_cpu.streamed, 0);
  // a link much faster than the CPU: everything streamed
  const dos::Choice fast_link = dos::choose_plan(w, dos::Rates{1e8, 1e8, 1e12, 4e12, 1e13, 1e13});
  assert_int_equal(fast_link.streamed, 16);
  // caller on the host: a CPU subgroup moves nothing over PCIe
  dos::Workload h = w;
  h.caller_on_gpu = false;
  const dos::Prediction p = dos::predict(h, dos::spread_plan(16, 0), dos::Rates{1e9, 1e9, 1e11, 4e11, 1e10, 1e10});
  assert_float_equal(p.h2d, 0.0, 0.0);
  assert_float_equal(p.total, 16.0 * (1 << 24) / 1e9, 1e-9);
}

// static:R fidelity: for R in {0, 0.1, ..., 1} the CPU fraction is monotone in R and within one
// subgroup of R, for several subgroup counts.
void test_static_fidelity(void**) {
  for (size_t n : {1, 7, 17, 31, 100}) {
    double last = -1;
    for (int i = 0; i <= 10; ++i) {
      const double R = i / 10.0;
      const auto p = dos::static_plan(n, R);
      size_t ncpu = 0;
      for (auto s : p) ncpu += s == dos::PlanSide::cpu;
      for (auto s : p) assert_true(s == dos::PlanSide::cpu || s == dos::PlanSide::gpu_resident);
      const double frac = double(ncpu) / double(n);
      assert_true(std::fabs(frac - R) <= 1.0 / double(n));
      assert_true(frac >= last);
      last = frac;
    }
  }
}

// GPU budgets: which subgroups fit the resident budget, and plans that keep them resident and
// stream only the others (or nothing when the update budget cannot hold one streamed subgroup).
void test_budgets(void**) {
  // 12 bytes of state per parameter, each slice padded to 16 elements (1008 and 512), counted from
  // the last subgroup; the smaller last one first
  const std::vector<std::size_t> sizes = {1000, 1000, 1000, 500};
  assert_int_equal(dos::resident_subgroups(sizes, 0), 0);
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 500), 0);  // its padding does not fit
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 512 - 1), 0);
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 512), 1);
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 1519), 1);
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 1520), 2);
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 3536 - 1), 3);
  assert_int_equal(dos::resident_subgroups(sizes, 12 * 3536), 4);
  assert_int_equal(dos::resident_subgroups(sizes, std::size_t(1) << 60), 4);
  // the compact master's state (compact_state_bytes_for, worked by hand): 1000 -> stride 1008, head
  // 504 + 32 fp32 elements padded to 544, 4 x (544 + 2 x 1008) = 10240 B; 500 -> stride 512, head
  // 256 + 16 padded to 272, 4 x (272 + 1024) = 5184 B. 15424 B holds the last two compact states,
  // but only one full one (two full need 6144 + 12096 = 18240)
  assert_int_equal(dos::resident_subgroups(sizes, 5183, true), 0);
  assert_int_equal(dos::resident_subgroups(sizes, 5184, true), 1);
  assert_int_equal(dos::resident_subgroups(sizes, 15423, true), 1);
  assert_int_equal(dos::resident_subgroups(sizes, 15424, true), 2);
  assert_int_equal(dos::resident_subgroups(sizes, 15424, false), 1);
  assert_int_equal(dos::resident_subgroups(sizes, 5184 + 3 * 10240, true), 4);

  const dos::Rates fast_link{1e8, 1e8, 1e12, 4e12, 1e13, 1e13};  // everything free is streamed
  dos::Workload w = uniform(10, 1 << 20);
  w.resident = 3;
  const dos::Choice c = dos::choose_plan(w, fast_link);
  for (size_t i = 0; i < 10; ++i)
    assert_int_equal(int(c.plan[i]), int(i < 7 ? dos::PlanSide::gpu_streamed : dos::PlanSide::gpu_resident));
  assert_int_equal(c.streamed, 7);
  // resident subgroups cost no PCIe: the prediction counts only the streamed ones' 12 B each way
  assert_float_equal(c.predicted.h2d, 7.0 * 12 * (1 << 20) / 1e13, 1e-15);
  // no room to stream: the free subgroups stay on the CPU, and the lower bound streams nothing
  w.may_stream = false;
  const dos::Choice none = dos::choose_plan(w, fast_link);
  assert_int_equal(none.streamed, 0);
  for (size_t i = 0; i < 10; ++i)
    assert_int_equal(int(none.plan[i]), int(i < 7 ? dos::PlanSide::cpu : dos::PlanSide::gpu_resident));
  const double cpu_only = 7.0 * (1 << 20) / 1e8;  // 7 subgroups at U_c
  assert_float_equal(dos::lower_bound(w, fast_link), std::max(cpu_only, none.predicted.total), 1e-12);
  assert_float_equal(none.predicted.total, cpu_only, 1e-9);
}

// The lower bound of a phase whose resident state is still in host memory (an optimizer's first
// phase): the state's 12 B per parameter go up first. By hand, 10 subgroups of s = 2^20, the last 3
// resident, nothing streamed, the caller on the GPU, U_c = U_c_dma = 1e8, B = 1e8 each way,
// link_share 1: the 7 CPU subgroups move 2 B up and 4 B down each, so H2D 14 s / B and D2H 28 s / B;
// CPU Adam 7 s / U_c; host memory (7 s x 30 + 42 s) / M with M = 30 U_c + 2 B = 3.2e9, 7.875 s /
// 1e8. Without the upload D2H binds (28 s / 1e8). The resident states coming up cross StarPU's
// stream at B at most (the CPU subgroups' parameters may go up beside it, by the runtime's own
// copies): with all 3 that is 36 s / 1e8, which binds (host memory then 9 s / 1e8); with one of
// them, 12 s < 28 s.
// (Host memory cannot bind here: with link_share 1 it gets at least 30 U_c + 2 B, and whichever
// of U_c and B is the smaller, CPU Adam or H2D then takes longer; the upload's bytes go to it too.)
void test_bound_cold_resident(void**) {
  dos::Workload w = uniform(10, 1 << 20);
  w.resident = 3;
  w.may_stream = false;
  const dos::Rates r{1e8, 1e8, 1e12, 4e12, 1e8, 1e8};
  const double s = double(1 << 20);
  assert_float_equal(dos::lower_bound(w, r), 28 * s / 1e8, 1e-12);
  assert_float_equal(dos::lower_bound(w, r, 1, 0), 28 * s / 1e8, 1e-12);
  assert_float_equal(dos::lower_bound(w, r, 1, 3 * s), 36 * s / 1e8, 1e-12);
  assert_float_equal(dos::lower_bound(w, r, 1, s), 28 * s / 1e8, 1e-12);
  // with streamed states too: CPU Adam at 1 param/s, so the bound streams all 7 free subgroups (its
  // split grid's next point, 1e-4 of them on the CPU, would take 734 s)
  // (12 B each way, the caller on the GPU); StarPU's stream then carries 12 x (7 s + 3 s) up, 120 s
  // / 1e8, against D2H's 84 s / 1e8 without the cold states (host memory, M = 2e8 + 30, a little
  // under each: 168 s and 204 s of bytes)
  dos::Workload ws = w;
  ws.may_stream = true;
  const dos::Rates slow_cpu{1, 1, 1e12, 4e12, 1e8, 1e8};
  assert_float_equal(dos::lower_bound(ws, slow_cpu), 84 * s / 1e8, 1e-9);
  assert_float_equal(dos::lower_bound(ws, slow_cpu, 1, 3 * s), 120 * s / 1e8, 1e-9);
  assert_float_equal(dos::lower_bound(w, r, r, 1, 3 * s), 36 * s / 1e8, 1e-12);
  // more than the resident parameters, negative or not a number: refused
  assert_true(throws_invalid_argument([&] { dos::lower_bound(w, r, 1, 3 * s + 1); }));
  assert_true(throws_invalid_argument([&] { dos::lower_bound(w, r, 1, -1); }));
  assert_true(throws_invalid_argument([&] { dos::lower_bound(w, r, 1, std::nan("")); }));
  assert_true(throws_invalid_argument([&] { dos::lower_bound(w, r, r, 1, 3 * s + 1); }));
  w.resident = 0;  // nothing resident: nothing can come up
  assert_true(throws_invalid_argument([&] { dos::lower_bound(w, r, 1, 1); }));
}

// The GPU's share of a CPU subgroup: converting its staged gradient (D_c), only when the GPU stages
// it. One CPU subgroup and one resident subgroup of 1e6, U_g 1e8 and D_c 1e8: the GPU takes 1e6 /
// U_g + 1e6 / D_c = 0.02 s with the gradient staged on the GPU, 0.01 s when the runtime downloads it
// itself (cpu_grads_staged_on_gpu false), and nothing for it with the caller in host memory. With
// fast links and CPU the GPU binds the plan and the bound alike: the bound's free subgroup costs the
// GPU 1e6 x 1e-8 s streamed or staged (0.02 s in all), and nothing on the CPU unstaged (0.01 s).
void test_gpu_conversion(void**) {
  dos::Workload w = uniform(2, 1000000);
  w.resident = 1;
  const dos::Rates r{1e12, 1e12, 1e8, 1e8, 1e13, 1e13};
  const std::vector<dos::PlanSide> plan = {dos::PlanSide::cpu, dos::PlanSide::gpu_resident};
  assert_float_equal(dos::predict(w, plan, r).gpu, 0.02, 1e-12);
  assert_float_equal(dos::lower_bound(w, r), 0.02, 1e-9);
  w.cpu_grads_staged_on_gpu = false;
  assert_float_equal(dos::predict(w, plan, r).gpu, 0.01, 1e-12);
  assert_float_equal(dos::lower_bound(w, r), 0.01, 1e-9);
  w.cpu_grads_staged_on_gpu = true;
  w.caller_on_gpu = false;
  assert_float_equal(dos::predict(w, plan, r).gpu, 0.01, 1e-12);
}

// The staged gradient's size in the traffic: 16-bit gradients halve a CPU subgroup's D2H.
void test_grad_bytes(void**) {
  const dos::PcieBytes f = dos::subgroup_pcie_bytes(false, true, 2, 1000, 4);
  const dos::PcieBytes n = dos::subgroup_pcie_bytes(false, true, 2, 1000, 2);
  assert_int_equal(f.d2h, 4000);
  assert_int_equal(n.d2h, 2000);
  assert_int_equal(f.h2d, 2000);
  assert_int_equal(n.h2d, 2000);
  // a GPU update with the caller on the host sends the staged gradient up
  assert_int_equal(dos::subgroup_pcie_bytes(true, false, 2, 1000, 2).h2d, 14000);
  // and the model's CPU-subgroup D2H follows w.grad_bytes
  dos::Workload w = uniform(4, 1000);
  w.grad_bytes = 2;
  const dos::Prediction p = dos::predict(w, dos::spread_plan(4, 0), dos::Rates{1, 1, 1, 1, 1e3, 1e3});
  assert_float_equal(p.d2h, 4 * 2000 / 1e3, 1e-12);
}

// The compact master's traffic (traffic.h): 1024 parameters, bf16, 16-bit gradients. A GPU update
// with the caller on the GPU moves the compact state each way: 4 x (544 head + 2 x 1024) = 10368 B
// (10.125 per parameter: lo 2048 B, r 128 B, exp_avg and exp_avg_sq 8192 B); a CPU update with the
// caller there brings P down beside the gradient (4 B per parameter down, 2 up); with the caller in
// host memory a GPU update takes the gradient and P up (10368 + 4 x 1024) and P down (10368 + 2048).
// A CPU update whose P the host staging holds already (params_on_host) brings only the gradient
// down. The split prediction counts 10.125 B per parameter (padding left out) and, for the CPU
// subgroups, the steady state: P in the host staging, nothing more down than the gradient.
void test_compact_traffic(void**) {
  const dos::PcieBytes g = dos::subgroup_pcie_bytes(true, true, 2, 1024, 2, true);
  assert_int_equal(g.h2d, 10368);
  assert_int_equal(g.d2h, 10368);
  const dos::PcieBytes c = dos::subgroup_pcie_bytes(false, true, 2, 1024, 2, true);
  assert_int_equal(c.h2d, 2048);
  assert_int_equal(c.d2h, 4096);
  const dos::PcieBytes h = dos::subgroup_pcie_bytes(true, false, 2, 1024, 2, true);
  assert_int_equal(h.h2d, 10368 + 4096);
  assert_int_equal(h.d2h, 10368 + 2048);
  assert_int_equal(dos::subgroup_pcie_bytes(false, false, 2, 1024, 2, true).h2d, 0);
  assert_int_equal(dos::subgroup_pcie_bytes(false, true, 2, 1024, 2, true, true).d2h, 2048);
  dos::Workload w = uniform(4, 1000);
  w.grad_bytes = 2;
  w.compact_master = true;
  const dos::Rates r{1, 1, 1, 1, 1e3, 1e3};
  const dos::Prediction p = dos::predict(w, dos::spread_plan(4, 2), r);  // 2 streamed, 2 on the CPU
  assert_float_equal(p.h2d, (2 * 10.125 * 1000 + 2 * 2 * 1000) / 1e3, 1e-12);
  assert_float_equal(p.d2h, (2 * 10.125 * 1000 + 2 * 2 * 1000) / 1e3, 1e-12);
}

void test_bad_input(void**) {
  const dos::Workload w = uniform(4, 100);
  assert_true(throws_invalid_argument([&] { dos::predict(w, dos::spread_plan(3, 1), dos::Rates{1, 1, 1, 1, 1, 1}); }));
  assert_true(throws_invalid_argument([&] { dos::predict(w, dos::spread_plan(4, 1), dos::Rates{0, 1, 1, 1, 1, 1}); }));
}

// The rates file (dos.h, save_rates and load_rates): written with the keys and units its readers
// expect (checked against the numbers given here, read as plain JSON), read back whole, the
// calibrated rates beside; a file whose rates break the model's bounds, are in other units, or
// whose JSON is not the format's (a key twice, a value of another type, 'calibrated' not an
// object) is refused, naming why and where.
void test_rates_file(void**) {
  char dir[] = "/tmp/dos-rates-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const std::string path = std::string(dir) + "/sub/rates.json";
  const dos::Rates r{4e9, 2.5e9, 130e9, 450e9, 50e9, 49e9, 1.25};
  const dos::Rates c{3.9e9, 2.4e9, 120e9, 400e9, 48e9, 47e9, 1.0};
  dos::save_rates(path, r, c);
  nlohmann::json j;
  std::ifstream(path) >> j;
  assert_float_equal(j.at("U_c").get<double>(), 4e9, 0);
  assert_float_equal(j.at("U_c_dma").get<double>(), 2.5e9, 0);
  assert_float_equal(j.at("U_g").get<double>(), 130e9, 0);
  assert_float_equal(j.at("D_c").get<double>(), 450e9, 0);
  assert_float_equal(j.at("B_h2d").get<double>(), 50e9, 0);
  assert_float_equal(j.at("B_d2h").get<double>(), 49e9, 0);
  assert_float_equal(j.at("link_share").get<double>(), 1.25, 0);
  assert_float_equal(j.at("calibrated").at("D_c").get<double>(), 400e9, 0);
  dos::Rates back_c;
  const dos::Rates back = dos::load_rates(path, &back_c);
  for (const auto& [got, want] : {std::pair{back, r}, std::pair{back_c, c}}) {
    assert_float_equal(got.U_c, want.U_c, 0);
    assert_float_equal(got.U_c_dma, want.U_c_dma, 0);
    assert_float_equal(got.U_g, want.U_g, 0);
    assert_float_equal(got.D_c, want.D_c, 0);
    assert_float_equal(got.B_h2d, want.B_h2d, 0);
    assert_float_equal(got.B_d2h, want.B_d2h, 0);
    assert_float_equal(got.link_share, want.link_share, 0);
  }
  j["U_c_dma"] = 5e9;  // above U_c
  std::ofstream(path) << j.dump();
  bool refused = false;
  try {
    dos::load_rates(path);
  } catch (const std::exception& e) {
    refused = std::string(e.what()).find("U_c_dma (CPU Adam beside DMA) cannot exceed U_c") != std::string::npos;
  }
  assert_true(refused);
  // a key the format does not have (a typo beside the right one), at the top or under "calibrated"
  dos::save_rates(path, r, c);  // a good file again, then one typo in one place at a time
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(path));
  for (const char* where : {"top", "calibrated"}) {
    nlohmann::json t = good;
    (std::string(where) == "top" ? t : t["calibrated"])["u_c"] = 4e9;
    std::ofstream(path) << t.dump();
    refused = false;
    try {
      dos::load_rates(path);
    } catch (const std::exception& e) {
      refused = std::string(e.what()).find("a key 'u_c' that is not one of") != std::string::npos;
    }
    assert_true(refused);
  }
  // each bad file's text, and what the refusal must say
  const std::string six = R"("U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10)";
  const std::pair<std::string, std::string> bad_files[] = {
      {"{" + six + R"(, "B_h2d": 1e7})", "gives the key 'B_h2d' twice"},  // the last would win
      {"{" + six + R"(, "calibrated": {)" + six + R"(, "U_g": 1}})", "gives the key 'U_g' twice"},
      {R"({"U_c": "4e9", "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10})",
       "U_c is not a number (it is string)"},
      {"{" + six + R"(, "link_share": true})", "link_share is not a number (it is boolean)"},
      {R"({"U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10})", "it has no B_d2h"},
      {"{" + six + R"(, "calibrated": [1]})", "its 'calibrated' is a JSON array, not an object"},
      {"{" + six + R"(, "calibrated": {"U_c": 4e9}})", "it has no calibrated.U_c_dma"},
      {"{" + six + R"(, "calibrated": {"calibrated": {}}})", "its 'calibrated' has a key 'calibrated'"},
      {"[1, 2]", "it is a JSON array, not an object"},
      // Gparams/s and GB/s where params/s and bytes/s belong, at the top and under 'calibrated'
      {R"({"U_c": 4.1, "U_c_dma": 2.9, "U_g": 60, "D_c": 300, "B_h2d": 50, "B_d2h": 50})",
       "gives U_c outside [1e6, 1e16]: a rates file is in params/s"},
      {"{" + six + R"(, "calibrated": {"U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 50}})",
       "gives calibrated.B_d2h outside [1e6, 1e16]"},
      {"{" + six + R"(, "link_share": 0.05})", "link_share cannot be below 1/16"},
  };
  for (const auto& [text, want] : bad_files) {
    std::ofstream(path) << text;
    std::string said;
    try {
      dos::load_rates(path);
    } catch (const dos::Error& e) {
      said = e.what();
    }
    if (said.find(want) == std::string::npos)
      fail_msg("the rates file %s: want a refusal saying \"%s\", got \"%s\"", text.c_str(), want.c_str(), said.c_str());
  }
  // the edges of the plausible range and of link_share's floor are accepted
  std::ofstream(path) << R"({"U_c": 1e16, "U_c_dma": 1e6, "U_g": 6e10, "D_c": 1e15, "B_h2d": 5e10, "B_d2h": 5e10, "link_share": 0.0625})";
  const dos::Rates edges = dos::load_rates(path);
  assert_true(edges.U_c == 1e16 && edges.U_c_dma == 1e6 && edges.link_share == 0.0625);
  std::remove(path.c_str());
  std::remove((std::string(dir) + "/sub").c_str());
  std::remove(dir);
}

// implausible_rate names the first of the six rates outside [1e6, 1e16] (NaN too), each rate by its
// own name, the edges inside; rate_bounds_error refuses link_share below 1/16, the floor itself not.
void test_plausible_rates(void**) {
  const dos::Rates good{4e9, 3e9, 6e10, 3e11, 5e10, 5e10, 1.0};
  assert_true(dos::implausible_rate(good).empty());
  double dos::Rates::*const fields[] = {&dos::Rates::U_c,   &dos::Rates::U_c_dma, &dos::Rates::U_g,
                                        &dos::Rates::D_c,   &dos::Rates::B_h2d,   &dos::Rates::B_d2h};
  const char* names[] = {"U_c", "U_c_dma", "U_g", "D_c", "B_h2d", "B_d2h"};
  for (std::size_t i = 0; i < 6; ++i) {
    for (double x : {std::nextafter(1e6, 0.0), std::nextafter(1e16, 1e300), std::nan(""), 0.0, -4e9}) {
      dos::Rates r = good;
      r.*fields[i] = x;
      if (dos::implausible_rate(r) != names[i]) fail_msg("%s = %g: want it named, got '%s'", names[i], x, dos::implausible_rate(r).c_str());
    }
    for (double x : {1e6, 1e16}) {
      dos::Rates r = good;
      r.*fields[i] = x;
      assert_true(dos::implausible_rate(r).empty());
    }
  }
  dos::Rates r = good;
  r.link_share = dos::kLowestLinkShare;
  assert_true(dos::rate_bounds_error(r).empty());
  r.link_share = std::nextafter(dos::kLowestLinkShare, 0.0);
  assert_true(dos::rate_bounds_error(r).find("link_share cannot be below 1/16") != std::string::npos);
}

// The calibration's link_share estimate (estimated_link_share): U_c_dma / U_c within [1/16, 1],
// refused for rates it cannot divide; and the optimizer does not count it as a measure
// (initial_link_share_record): its first phases that stream replace it.
void test_estimated_link_share(void**) {
  dos::Rates r{4e9, 3e9, 130e9, 450e9, 50e9, 49e9, 1.0};
  assert_true(dos::estimated_link_share(r) == 0.75);
  r.U_c_dma = r.U_c;
  assert_true(dos::estimated_link_share(r) == 1.0);
  r.U_c_dma = 1e8;  // 1/40 of U_c: the floor
  assert_true(dos::estimated_link_share(r) == 1.0 / 16);
  r.U_c_dma = 5e9;  // above U_c (rates that break the model's bounds): at most 1
  assert_true(dos::estimated_link_share(r) == 1.0);
  for (const double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    dos::Rates b = r;
    b.U_c_dma = bad;
    bool refused = false;
    try {
      (void)dos::estimated_link_share(b);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    assert_true(refused);
    b = r;
    b.U_c = bad;
    refused = false;
    try {
      (void)dos::estimated_link_share(b);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    assert_true(refused);
  }
  // a fresh calibration's rates: the estimate is the calibration's own value, not counted
  dos::Rates cal{4e9, 3e9, 130e9, 450e9, 50e9, 49e9, 1.0};
  cal.link_share = dos::estimated_link_share(cal);
  const dos::LinkShareRecord rec = dos::initial_link_share_record(cal, cal);
  assert_false(rec.measured);
  assert_true(rec.provisional == 0.75);
}

// The calibration's rule dma (link_share_from_dma): the share for which the model's host memory
// gives the links, beside CPU Adam at U_c_dma, the fraction of their rate alone that was measured
// (host_shares checked on the result, with the host memory host_bandwidth gives these rates); its
// bounds; its refusals.
void test_link_share_from_dma(void**) {
  dos::Workload w;
  w.sizes = {1000};
  dos::Rates r{6e9, 4.8e9, 100e9, 400e9, 40e9, 40e9, 1.0};
  // links at 23.2 of 40 GB/s beside CPU Adam, which keeps 0.8 of its rate: 0.58 / 0.8
  const double share = dos::link_share_from_dma(23.2e9, 40e9, r);
  assert_true(std::fabs(share - 0.725) < 1e-12);
  r.link_share = share;
  const double cpu_ask = r.U_c * dos::cpu_adam_host_bytes(w), links_ask = r.B_h2d + r.B_d2h;
  const dos::HostShares hs = dos::host_shares(cpu_ask, links_ask, dos::host_bandwidth(w, r), share);
  assert_true(std::fabs(hs.cpu - 0.8) < 1e-9);
  assert_true(std::fabs(hs.links - 0.58) < 1e-9);
  // links as fast beside as alone: the highest share the model tells apart, U_c / U_c_dma
  assert_true(dos::link_share_from_dma(40e9, 40e9, r) == dos::highest_link_share(r));
  // links nearly stopped: the floor
  assert_true(dos::link_share_from_dma(1e8, 40e9, r) == dos::kLowestLinkShare);
  for (const double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    int refused = 0;
    dos::Rates b = r;
    b.U_c_dma = bad;
    for (int k = 0; k < 3; ++k) {
      try {
        (void)(k == 0 ? dos::link_share_from_dma(bad, 40e9, r)
               : k == 1 ? dos::link_share_from_dma(23e9, bad, r)
                        : dos::link_share_from_dma(23e9, 40e9, b));
      } catch (const std::invalid_argument&) {
        ++refused;
      }
    }
    assert_int_equal(refused, 3);
  }
}

// is_decimal_number: what a person writes as a number, against what strtod would also read
void test_decimal_number(void**) {
  for (const char* ok : {"0", "0.5", "-1e-9", "+2", ".25", "3.", "1E+8", "16777216", "1.6e7"})
    assert_true(dos::is_decimal_number(ok));
  for (const char* bad : {"", " 0.5", "0.5 ", "0x1p-1", "0X10", "inf", "-inf", "nan", ".", "+", "-.", "1e", "1e+",
                          "1.2.3", "1e5.5", "1,5", "5x", "e5"})
    assert_false(dos::is_decimal_number(bad));
  // parse_decimal: the value of a plain decimal, none beyond a double's range (either way)
  double v = -7;
  assert_true(dos::parse_decimal("0.5", &v) && v == 0.5);
  assert_true(dos::parse_decimal("-1e-9", &v) && v == -1e-9);
  assert_true(dos::parse_decimal("16777216", &v) && v == 16777216.0);
  assert_true(dos::parse_decimal("1e308", &v) && v == 1e308);
  v = -7;
  for (const char* bad : {"1e400", "-1e400", "1e-400", "0x10", " 1", "inf", ""}) {
    assert_false(dos::parse_decimal(bad, &v));
    assert_true(v == -7);  // untouched
  }
}

// shortest_text: the fewest digits that read back, as printf's "%.*g" writes them in the C locale
void test_shortest_text(void**) {
  assert_string_equal(dos::shortest_text(0.0625).c_str(), "0.0625");
  assert_string_equal(dos::shortest_text(-1e-9).c_str(), "-1e-09");
  assert_string_equal(dos::shortest_text(0.1).c_str(), "0.1");
  assert_string_equal(dos::shortest_text(std::nextafter(0.0625, 0.0)).c_str(), "0.06249999999999999");
  assert_string_equal(dos::shortest_text(16777216.0).c_str(), "16777216");
  assert_string_equal(dos::shortest_text(HUGE_VAL).c_str(), "inf");
  for (const double x : {1.0 / 3, 2e-310, 1e308, -0.0, 123456.789e-5}) {  // each reads back exactly
    double back = 1;
    assert_true(dos::parse_decimal(dos::shortest_text(x), &back) && back == x && std::signbit(back) == std::signbit(x));
  }
}

// Under a locale whose decimal point is ',' (de_DE, compiled here by localedef into a folder of
// its own, LOCPATH), where strtod reads "0.5" as 0: parse_decimal and shortest_text keep '.'.
// Skipped when the machine has no localedef or no de_DE source (Debian's package locales).
void test_decimal_locale(void**) {
  char dir[] = "/tmp/dos-locale-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const std::string path = std::string(dir) + "/de_DE.UTF-8";
  const std::string cmd = "localedef -i de_DE -f UTF-8 '" + path + "' >/dev/null 2>&1";
  const bool built = std::system(cmd.c_str()) == 0;
  const char* old_locpath = std::getenv("LOCPATH");
  const std::string saved = old_locpath ? old_locpath : "";
  setenv("LOCPATH", dir, 1);
  const bool set = built && std::setlocale(LC_NUMERIC, "de_DE.UTF-8") != nullptr;
  const bool comma = set && std::strtod("0.5", nullptr) != 0.5;  // the locale does bite strtod
  double v = -7;
  const bool parsed = comma && dos::parse_decimal("0.5", &v);
  const std::string text = comma ? dos::shortest_text(0.0625) : "";
  std::setlocale(LC_NUMERIC, "C");
  if (old_locpath) setenv("LOCPATH", saved.c_str(), 1); else unsetenv("LOCPATH");
  std::filesystem::remove_all(dir);
  if (!comma) {
    std::fprintf(stderr, "no de_DE locale could be made here (localedef, package locales): skipped\n");
    skip();
  }
  assert_true(parsed && v == 0.5);
  assert_string_equal(text.c_str(), "0.0625");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plans),      cmocka_unit_test(test_paper_example), cmocka_unit_test(test_gpu_machine), cmocka_unit_test(test_stride_candidate), cmocka_unit_test(test_bound_two_rates),
      cmocka_unit_test(test_extremes),   cmocka_unit_test(test_static_fidelity), cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_budgets),    cmocka_unit_test(test_grad_bytes), cmocka_unit_test(test_compact_traffic),
      cmocka_unit_test(test_rates_file),       cmocka_unit_test(test_plausible_rates),
      cmocka_unit_test(test_decimal_number),     cmocka_unit_test(test_shortest_text), cmocka_unit_test(test_decimal_locale),
      cmocka_unit_test(test_bound_cold_resident),
      cmocka_unit_test(test_gpu_conversion),     cmocka_unit_test(test_estimated_link_share), cmocka_unit_test(test_link_share_from_dma),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
