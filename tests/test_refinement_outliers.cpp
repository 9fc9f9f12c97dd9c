// Part of the refinement test (test_refinement.cpp runs these): the outlier rule
// (models/refinement.h, hold_outlier_phase) by hand, then phases of the 20B quarter and the GPT of
// 1.01e9 parameters on a machine that behaves as the phase simulation says, one phase or several
// slowed: held or refined, against the machine's best; and the idle measure (idle_seconds).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "cmocka_cpp.h"
#include "phase_sim.h"
#include "refinement.h"
#include "refinement_fixtures.h"

using dos::PlanSide;
using namespace refinement_fixtures;

// The outlier rule by hand: held only after two phases recorded whose ratios (measured /
// predicted) are within 1.15x of each other, the last not held and under the same plan, and this
// one more than 1.3x off the last either way; relative, so a model steadily 20% off holds as an
// exact one does; a held phase is recorded, the next is not held whatever its ratio; a ratio that
// is not a positive finite number is never held and no later phase is steady with it.
void test_hold_outlier_phase(void**) {
  using P = PlanSide;
  const std::vector<P> plan{P::cpu, P::gpu_streamed, P::cpu}, other{P::cpu, P::cpu, P::gpu_streamed};
  dos::PhaseErrors e;
  assert_false(dos::hold_outlier_phase(e, 2.0, plan));  // nothing recorded yet
  e = dos::record_phase_error(e, 1.05, false, plan);
  assert_false(dos::hold_outlier_phase(e, 2.0, plan));  // one phase only
  e = dos::record_phase_error(e, 0.92, false, plan);   // 1.05 / 0.92 = 1.14: steady
  assert_int_equal(e.count, 2);
  assert_true(dos::hold_outlier_phase(e, 1.2, plan));    // 1.2 / 0.92 = 1.30(4)
  assert_true(dos::hold_outlier_phase(e, 0.7, plan));    // 0.92 / 0.7 = 1.31
  assert_false(dos::hold_outlier_phase(e, 1.19, plan));  // 1.29: refined
  assert_false(dos::hold_outlier_phase(e, 0.71, plan));  // 1.296: refined
  assert_false(dos::hold_outlier_phase(e, 2.0, other));  // another plan than the last phase's: refined
  for (double bad : {std::nan(""), 0.0, -1.0, HUGE_VAL}) assert_false(dos::hold_outlier_phase(e, bad, plan));
  const dos::PhaseErrors held = dos::record_phase_error(e, 1.64, true, plan);
  assert_true(held.last_held);
  ASSERT_NEAR(held.last, 1.64, 0.0);
  ASSERT_NEAR(held.before_last, 0.92, 0.0);
  assert_false(dos::hold_outlier_phase(held, 1.64, plan));  // the second in a row: refined
  assert_false(dos::hold_outlier_phase(held, 0.92, plan));
  // after it, the held phase's ratio is one of the last two: not steady, nothing held
  const dos::PhaseErrors next = dos::record_phase_error(held, 1.0, false, plan);
  assert_false(dos::hold_outlier_phase(next, 2.0, plan));
  assert_true(dos::hold_outlier_phase(dos::record_phase_error(next, 1.02, false, plan), 2.0, plan));
  // at the thresholds exactly (IEEE doubles, the same on every machine): 1.15x apart is steady,
  // 1.3x off either way is refined, a hair beyond 1.3x is held
  const dos::PhaseErrors edge = dos::record_phase_error(dos::record_phase_error({}, 1.0, false, plan), 1.15, false, plan);
  assert_true(dos::hold_outlier_phase(edge, 1.15 * 1.3 * 1.0001, plan));
  const dos::PhaseErrors one = dos::record_phase_error(dos::record_phase_error({}, 1.0, false, plan), 1.0, false, plan);
  assert_false(dos::hold_outlier_phase(one, 1.3, plan));
  assert_false(dos::hold_outlier_phase(one, 1.0 / 1.3, plan));
  assert_true(dos::hold_outlier_phase(one, 1.3 * 1.0001, plan));
  // two phases not steady (1.16x apart): not held
  const dos::PhaseErrors loose = dos::record_phase_error(dos::record_phase_error({}, 1.16, false, plan), 1.0, false, plan);
  assert_false(dos::hold_outlier_phase(loose, 2.0, plan));
  // a model steadily 20% fast (ratios 1.2): a phase at 1.2 x 1.31 is held, one at 1.5 (1.25x) not
  const dos::PhaseErrors biased = dos::record_phase_error(dos::record_phase_error({}, 1.2, false, plan), 1.21, false, plan);
  assert_true(dos::hold_outlier_phase(biased, 1.21 * 1.31, plan));
  assert_false(dos::hold_outlier_phase(biased, 1.5, plan));
  // a ratio that could not be had is recorded as 0: no later phase is steady with it
  const dos::PhaseErrors unknown = dos::record_phase_error(dos::record_phase_error({}, 1.0, false, plan), std::nan(""), false, plan);
  ASSERT_NEAR(unknown.last, 0.0, 0.0);
  assert_false(dos::hold_outlier_phase(unknown, 2.0, plan));
  assert_false(dos::hold_outlier_phase(dos::record_phase_error(unknown, 1.0, false, plan), 2.0, plan));
}

namespace {

// The 1.01e9-parameter GPT of the README (20 subgroups of 5e7 and one of 7e6, bf16 parameters and
// gradients on the GPU, the runtime's own gradient downloads by the copy engine and parameter
// uploads), at the rates an H100 machine's run of it wrote (U_c 4.85e9, U_c_dma 3.65e9, B 42.8 /
// 51.2 GB/s, link_share 0.87; U_g and D_c as kRates).
dos::Workload gpt_1b() {
  dos::Workload w;
  w.sizes.assign(20, 50000000);
  w.sizes.push_back(7000000);
  w.grad_bytes = 2;
  w.cpu_grads_staged_on_gpu = w.cpu_params_staged_on_gpu = false;
  return w;
}
dos::Execution gpt_1b_execution() {
  dos::Execution e;
  e.own_param_upload = e.own_grad_download = e.grad_download_by_copy_engine = true;
  return e;
}
const dos::Rates kGptRates{4.85e9, 3.65e9, 1.3e11, 4.9e11, 4.28e10, 5.12e10, 0.87};

/// The outlier rule's two machines: the GPT above and the 20B quarter at kRates, each with its
/// workload, execution and true rates.
struct OutlierCase {
  const char* name;
  dos::Workload w;
  dos::Execution e;
  dos::Rates truth;
};
std::vector<OutlierCase> outlier_cases() {
  return {{"GPT 1.01e9", gpt_1b(), gpt_1b_execution(), kGptRates}, {"20B quarter", quarter_20b(), budget_40gb(), kRates}};
}

/// Phases of dos's own plans on a machine at `truth`, except phases `from`..`to` (counted from 0)
/// whose CPU Adam runs at `slow` times its rate (U_c and U_c_dma) and links at `links` times theirs, from rates equal to the
/// machine's, refined after each phase as the optimizer does, with the outlier rule (`hold`) or
/// without it. Returns each phase's measured seconds, its streamed subgroups and whether it was held.
struct PhaseRun {
  std::vector<double> seconds;
  std::vector<std::size_t> streamed;
  std::vector<bool> held;
};
PhaseRun slow_phases(const dos::Workload& w, const dos::Execution& e, const dos::Rates& truth, int phases, int from,
                     int to, double slow, bool hold, double links = 1.0) {
  dos::Rates r = truth, slowed = truth;
  slowed.U_c *= slow;
  slowed.U_c_dma *= slow;
  slowed.B_h2d *= links;
  slowed.B_d2h *= links;
  dos::PhaseErrors errors;
  PhaseRun out;
  for (int phase = 0; phase < phases; ++phase) {
    const std::vector<PlanSide> plan = dos::choose_plan_simulated(w, r, e).plan;
    const dos::Simulation sim = dos::simulate_phase(w, plan, r, e);
    double seconds = 0;
    const dos::PhaseMeasure m = measure_on(w, plan, phase >= from && phase <= to ? slowed : truth, e, &seconds);
    out.seconds.push_back(seconds);
    out.streamed.push_back(m.streamed);
    const double ratio = seconds / sim.total;
    const bool held = hold && dos::hold_outlier_phase(errors, ratio, plan);
    errors = dos::record_phase_error(errors, ratio, held, plan);
    out.held.push_back(held);
    if (!held) r = dos::refine_rates(w, r, m, sim).rates;
  }
  return out;
}

}  // namespace

// One phase whose CPU Adam ran at a fraction of its speed (the H100 run of the GPT: 1.9 Gparams/s
// in one phase where the others ran 3.3-3.8), on the GPT and on the 20B quarter: refined as any
// phase, it moves the plans after it, which then run slower than the machine's best for several
// phases; held by the outlier rule, the plan stays (each later phase within 0.5% of the best). A
// machine whose CPU stays that slow is followed with the rule too, one phase later: by the tenth
// phase after the change both run within 1% of the slow machine's best. Printed: each case's
// phases from the one before the slow one, seconds (streamed subgroups), both ways.
void test_one_slow_phase(void**) {
  const int phases = 15, slow_at = 4;
  for (const OutlierCase& c : outlier_cases()) {
    const double best = dos::choose_plan_simulated(c.w, c.truth, c.e).predicted.total;
    for (double slow : {0.4, 0.55}) {
      double worst[2] = {0, 0};
      for (int hold = 0; hold < 2; ++hold) {
        const PhaseRun run = slow_phases(c.w, c.e, c.truth, phases, slow_at, slow_at, slow, hold);
        std::printf("  %s, phase %d's CPU at %.2fx, %s:", c.name, slow_at, slow, hold ? "held   " : "refined");
        for (int p = slow_at - 1; p < phases; ++p) std::printf(" %.4f (%zu)", run.seconds[p], run.streamed[p]);
        for (int p = slow_at + 1; p < phases; ++p) worst[hold] = std::max(worst[hold], run.seconds[p] / best - 1);
        std::printf("; after it at worst %+.1f%% of the best\n", 100 * worst[hold]);
        ASSERT_NEAR(run.seconds[slow_at - 1] / best, 1.0, 1e-9);  // settled before it
        for (int p = 0; p < phases; ++p) assert_true(run.held[p] == (hold && p == slow_at));
      }
      assert_true(worst[1] <= 0.005);
      assert_true(worst[0] > 0.02);  // the case the rule is for: refined, the slow phase costs the next ones
    }
    // a machine whose CPU stays slow from phase 4 on: held once, then followed
    dos::Rates slowed = c.truth;
    slowed.U_c *= 0.55;
    slowed.U_c_dma *= 0.55;
    const double slow_best = dos::choose_plan_simulated(c.w, slowed, c.e).predicted.total;
    for (int hold = 0; hold < 2; ++hold) {
      const PhaseRun run = slow_phases(c.w, c.e, c.truth, phases, slow_at, phases, 0.55, hold);
      std::printf("  %s, CPU at 0.55x from phase %d on, %s:", c.name, slow_at, hold ? "held   " : "refined");
      for (int p = slow_at; p < phases; ++p) std::printf(" %.4f (%zu)", run.seconds[p], run.streamed[p]);
      std::printf("; the slow machine's best %.4f s\n", slow_best);
      assert_true(run.seconds[phases - 1] <= 1.01 * slow_best);
      for (int p = 0; p < phases; ++p) assert_true(run.held[p] == (hold && p == slow_at));
    }
  }
}

// A phase whose errors cancel (the CPU 2.5x as fast, the links at 0.8x of their rate): predicted
// within 1.3x of the phases before it, it is refined, and its rates move the next plan; the normal
// phase after it, under that other plan, is far off its prediction but is not held (another plan
// than the last phase's), so it refines the rates back at once: with the rule the phases run as
// without it. (Held, it would have kept the odd phase's plan one phase longer.)
void test_odd_phase_predicted_well(void**) {
  const int phases = 12, odd = 4;
  for (const OutlierCase& c : outlier_cases())
    for (double links : {0.6, 0.8}) {
      const PhaseRun with = slow_phases(c.w, c.e, c.truth, phases, odd, odd, 2.5, true, links);
      const PhaseRun without = slow_phases(c.w, c.e, c.truth, phases, odd, odd, 2.5, false, links);
      std::printf("  %s, phase %d's CPU at 2.5x and links at %.1fx:", c.name, odd, links);
      for (int p = odd - 1; p < phases; ++p) std::printf(" %.4f (%zu)", with.seconds[p], with.streamed[p]);
      std::printf("\n");
      assert_true(with.streamed[odd + 1] != with.streamed[odd]);  // the odd phase moved the plan
      for (int p = 0; p < phases; ++p) {
        assert_false(with.held[p]);
        ASSERT_NEAR(with.seconds[p], without.seconds[p], 0.0);
      }
    }
}

// idle_seconds against a count on a fine grid of the window (an independent reference: each
// 1e-5 s step idle when no span covers its midpoint): spans that overlap, come unsorted, reach
// outside the window or lie wholly outside it; an empty list; an empty or reversed window; bad spans.
void test_idle_seconds(void**) {
  using dos::BusySpan;
  auto grid = [](const std::vector<BusySpan>& spans, double from, double to) {
    const double step = 1e-5;
    double idle = 0;
    for (double t = from + step / 2; t < to; t += step) {
      bool busy = false;
      for (const BusySpan& b : spans) busy = busy || (b.start <= t && t < b.end);
      idle += busy ? 0 : step;
    }
    return idle;
  };
  const std::vector<std::vector<BusySpan>> cases = {
      {},
      {{0.1, 0.2}},
      {{0.3, 0.5}, {0.05, 0.15}, {0.1, 0.2}},          // unsorted, two overlapping
      {{-0.5, 0.05}, {0.9, 2.0}, {0.4, 0.41}},         // reaching out of [0, 1] on both sides
      {{-1.0, -0.5}, {1.5, 2.0}},                      // wholly outside
      {{0.2, 0.6}, {0.3, 0.4}, {0.25, 0.35}, {0.6, 0.7}},  // nested and touching
  };
  for (const auto& spans : cases) {
    const double got = dos::idle_seconds(spans, 0.0, 1.0), want = grid(spans, 0.0, 1.0);
    std::printf("  %zu spans: idle %.5f s (grid %.5f s)\n", spans.size(), got, want);
    ASSERT_NEAR(got, want, 2e-4);
  }
  assert_true(dos::idle_seconds({{0.3, 0.5}}, 0.0, 1.0) == 0.8);
  assert_true(dos::idle_seconds({{0.3, 0.5}, {0.1, 0.2}}, 0.0, 1.0) > 0.69999 &&
              dos::idle_seconds({{0.3, 0.5}, {0.1, 0.2}}, 0.0, 1.0) < 0.70001);
  assert_true(dos::idle_seconds({{0.3, 0.5}}, 0.4, 0.4) == 0);   // an empty window
  assert_true(dos::idle_seconds({{0.3, 0.5}}, 0.6, 0.2) == 0);   // a reversed one
  assert_true(dos::idle_seconds({{0.0, 2.0}}, 0.5, 1.5) == 0);   // covered
  bool threw = false;
  try {
    dos::idle_seconds({{0.5, 0.4}}, 0.0, 1.0);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  assert_true(threw);
  threw = false;
  try {
    dos::idle_seconds({}, 0.0, std::nan(""));
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  assert_true(threw);
}
