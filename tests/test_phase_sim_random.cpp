// The phase simulation (models/phase_sim.h) on random phases (fixed seeds): the lower bound never
// above the simulated phase, and the plan search choosing, to the bit, as with every candidate
// simulated afresh. The cases small enough to follow by hand are in test_phase_sim.cpp and
// test_phase_sim_copies.cpp.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "cmocka_cpp.h"
#include "phase_sim.h"

namespace {

using dos::PlanSide;

/// Random draws for the tests on random phases, from one generator (a fixed seed each test).
struct Draws {
  std::mt19937_64 rng;
  explicit Draws(std::uint64_t seed) : rng(seed) {}
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); }
  double log_uniform(double a, double b) { return std::exp(uniform(std::log(a), std::log(b))); }
  bool coin() { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; }
  int pick(int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); }
  /// Rates: U_c 1e8-1e10 params/s, U_c_dma 0.3-1 of it, U_g and D_c 1e10-1e12 params/s, each link
  /// 1e9-1e11 bytes/s (log-uniform), link_share 0.05-1 of its cap U_c / U_c_dma.
  dos::Rates rates() {
    dos::Rates r;
    r.U_c = log_uniform(1e8, 1e10);
    r.U_c_dma = r.U_c * uniform(0.3, 1.0);
    r.U_g = log_uniform(1e10, 1e12);
    r.D_c = log_uniform(1e10, 1e12);
    r.B_h2d = log_uniform(1e9, 1e11);
    r.B_d2h = log_uniform(1e9, 1e11);
    r.link_share = uniform(0.05, 1.0) * r.U_c / r.U_c_dma;
    return r;
  }
  /// The runtime's own copies, each way, and whether each goes by the copy engine: four coins.
  void copies(dos::Execution& e) {
    e.own_param_upload = coin();
    e.own_grad_download = coin();
    e.param_upload_by_copy_engine = coin();
    e.grad_download_by_copy_engine = coin();
  }
};

// The lower bound against the simulation on random phases (a fixed seed): 1-10 subgroups of 1e3 to
// 1e8 parameters, the last `resident` of them resident, the others on the CPU or streamed; rates,
// dtypes, the caller's side, CPU workers, submission order, lookahead, update budget, the runtime's
// own copies and each state's place drawn at random. The bound, with the resident states off the
// GPU counted as coming up, is never above the simulated phase, and counting them never lowers it.
// (Before the bound left the GPU's gradient conversion out where the runtime downloads the
// gradients itself, and put the resident state's upload beside StarPU's stream rather than on it,
// about one phase in 300 lay under it.)
void test_bound_random_phases(void**) {
  Draws d(20261204);
  auto log_uniform = [&](double a, double b) { return d.log_uniform(a, b); };
  auto coin = [&] { return d.coin(); };
  auto pick = [&](int a, int b) { return d.pick(a, b); };
  int simulated = 0, with_cold = 0;
  for (int c = 0; c < 5000; ++c) {
    dos::Workload w;
    const int n = pick(1, 10);
    for (int i = 0; i < n; ++i) w.sizes.push_back(std::size_t(log_uniform(1e3, 1e8)));
    w.caller_on_gpu = coin();
    w.param_bytes = coin() ? 2 : 4;
    w.grad_bytes = coin() ? w.param_bytes : 4;
    w.may_stream = pick(0, 3) != 0;
    w.resident = std::size_t(pick(0, n));
    const dos::Rates r = d.rates();
    dos::Execution e;
    e.order = coin() ? dos::SubmitOrder::cpu_first : dos::SubmitOrder::plan;
    e.lookahead = std::size_t(pick(0, 4));
    e.cpu_workers = std::size_t(pick(1, 4));
    d.copies(e);
    if (pick(0, 2) == 0) e.update_budget = std::size_t(log_uniform(1e4, 2e9));
    w.cpu_grads_staged_on_gpu = !e.own_grad_download;
    w.cpu_params_staged_on_gpu = !e.own_param_upload;
    std::vector<PlanSide> plan(std::size_t(n), PlanSide::cpu);
    e.state_off_gpu.assign(std::size_t(n), false);
    double cold = 0;
    for (std::size_t i = 0; i < std::size_t(n); ++i) {
      if (i + w.resident >= std::size_t(n)) plan[i] = PlanSide::gpu_resident;
      else if (w.may_stream && coin()) plan[i] = PlanSide::gpu_streamed;
      e.state_off_gpu[i] = coin();
      if (plan[i] == PlanSide::gpu_resident && e.state_off_gpu[i]) cold += double(w.sizes[i]);
    }
    dos::Simulation s;
    try {
      s = dos::simulate_phase(w, plan, r, e);
    } catch (const std::logic_error&) {
      continue;  // a window that cannot hold what it must (the runtime refuses such a budget)
    }
    ++simulated;
    with_cold += cold > 0;
    const double warm = dos::lower_bound(w, r, e.cpu_workers), cold_bound = dos::lower_bound(w, r, e.cpu_workers, cold);
    if (cold_bound > s.total * (1 + 1e-9))
      std::fprintf(stderr, "case %d: bound %.9g above the simulated %.9g (cold %.0f)\n", c, cold_bound, s.total, cold);
    assert_true(cold_bound <= s.total * (1 + 1e-9));
    assert_true(cold_bound >= warm);
  }
  std::printf("  random phases: %d simulated, %d with resident state coming up\n", simulated, with_cold);
  assert_true(simulated > 4000);
  assert_true(with_cold > 2000);
}

// The plan search simulates its candidates one after another on the same scratch memory: on random
// phases (a fixed seed: 1-80 subgroups, a few of 150-300; rates, dtypes, the caller's side, CPU
// workers, submission order, lookahead, update budget, the runtime's own copies, resident
// subgroups and each state's place drawn at random) its choice and every figure of its prediction
// are, to the bit, those of the same search with each candidate simulated afresh by
// simulate_phase, and so are the stride search's: nothing of one candidate's simulation is left for
// the next.
void test_search_simulates_afresh(void**) {
  Draws d(20261206);
  auto log_uniform = [&](double a, double b) { return d.log_uniform(a, b); };
  auto coin = [&] { return d.coin(); };
  auto pick = [&](int a, int b) { return d.pick(a, b); };
  auto same = [](const dos::Prediction& a, const dos::Prediction& b) {
    return a.total == b.total && a.cpu == b.cpu && a.h2d == b.h2d && a.d2h == b.d2h && a.gpu == b.gpu &&
           a.host == b.host && a.streamed_params == b.streamed_params && a.cpu_params == b.cpu_params &&
           a.resident_params == b.resident_params;
  };
  int searched = 0, strides = 0;
  for (int c = 0; c < 300; ++c) {
    dos::Workload w;
    const int n = c % 30 == 29 ? pick(150, 300) : pick(1, 80);
    const std::size_t size = std::size_t(log_uniform(1e3, 2e8));
    for (int i = 0; i < n; ++i) w.sizes.push_back(coin() ? size : std::size_t(log_uniform(1e3, 2e8)));
    w.caller_on_gpu = pick(0, 3) != 0;
    w.param_bytes = coin() ? 2 : 4;
    w.grad_bytes = coin() ? w.param_bytes : 4;
    w.may_stream = pick(0, 7) != 0;
    w.resident = pick(0, 2) == 0 ? std::size_t(pick(0, n)) : 0;
    const dos::Rates r = d.rates();
    dos::Execution e;
    e.order = coin() ? dos::SubmitOrder::cpu_first : dos::SubmitOrder::plan;
    e.lookahead = std::size_t(pick(0, 4));
    e.cpu_workers = std::size_t(pick(0, 2) == 0 ? pick(0, 8) : 1);
    d.copies(e);
    if (pick(0, 2) == 0) e.update_budget = std::size_t(log_uniform(1e5, 4e10));
    w.cpu_grads_staged_on_gpu = !e.own_grad_download;
    w.cpu_params_staged_on_gpu = !e.own_param_upload;
    if (coin()) {
      e.state_off_gpu.assign(std::size_t(n), false);
      for (int i = 0; i < n; ++i) e.state_off_gpu[std::size_t(i)] = coin();
    }
    auto afresh = [&](const std::vector<PlanSide>& plan) {
      const dos::Simulation s = dos::simulate_phase(w, plan, r, e);
      dos::Prediction p = dos::predict(w, plan, r);
      p.total = s.total;
      p.cpu = s.cpu;
      p.h2d = s.h2d;
      p.d2h = s.d2h;
      p.gpu = s.gpu;
      return p;
    };
    dos::Choice want;
    try {
      want = dos::choose_plan_by(w, afresh);
    } catch (const std::logic_error&) {  // a window that cannot hold what it must: the search throws too
      bool threw = false;
      try {
        dos::choose_plan_simulated(w, r, e);
      } catch (const std::logic_error&) {
        threw = true;
      }
      assert_true(threw);
      continue;
    }
    const dos::Choice got = dos::choose_plan_simulated(w, r, e);
    if (got.plan != want.plan || !same(got.predicted, want.predicted))
      std::fprintf(stderr, "case %d (%d subgroups): the search chose %zu streamed (%.17g s), afresh %zu (%.17g s)\n", c,
                   n, got.streamed, got.predicted.total, want.streamed, want.predicted.total);
    assert_true(got.plan == want.plan);
    assert_int_equal(got.streamed, want.streamed);
    assert_true(same(got.predicted, want.predicted));
    ++searched;
    if (n <= 20) {
      const dos::StrideChoice k = dos::choose_stride_simulated(w, r, e), k_want = dos::choose_stride_by(w, afresh);
      assert_int_equal(k.k, k_want.k);
      assert_true(same(k.predicted, k_want.predicted));
      ++strides;
    }
  }
  std::printf("  %d searches and %d stride searches as with every candidate simulated afresh\n", searched, strides);
  assert_true(searched > 250);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bound_random_phases),
      cmocka_unit_test(test_search_simulates_afresh),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
