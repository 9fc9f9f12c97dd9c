// The online refinement of the model's rates (refinement.h).
#include "refinement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace dos {

namespace {

void require_complete(const Rates& r) {
  if (!rates_complete(r)) throw std::invalid_argument("refine_rates: every rate must be a positive number");
}

// The bounds, on the final rates (each depends on the other): below its floor U_c_dma no longer
// changes host memory's M (it is at what CPU Adam or both links get alone) and refining further
// would only drift; above its cap link_share gives the links more than they ask. Raising U_c_dma
// lowers link_share's cap and lowering link_share raises U_c_dma's floor: a few rounds settle.
void settle_bounds(const Workload& w, Rates& q, std::size_t cpu_workers) {
  for (int round = 0; round < 4; ++round) {
    q.link_share = std::min(highest_link_share(q), std::max(kLowestLinkShare, q.link_share));
    q.U_c_dma = std::min(q.U_c, std::max(q.U_c_dma, lowest_distinct_u_c_dma(w, q, cpu_workers)));
  }
  q.link_share = std::min(highest_link_share(q), q.link_share);
}

// The most a link may be raised to: kLinkCeiling times its calibrated rate, or no bound (infinity)
// where the calibrated rate is not a positive number.
double link_ceiling(double calibrated_rate) {
  return calibrated_rate > 0 && std::isfinite(calibrated_rate) ? kLinkCeiling * calibrated_rate
                                                               : std::numeric_limits<double>::infinity();
}
}  // namespace

bool calibration_apart(const Rates& rates, const Rates& calibrated) noexcept {
  for (auto f : {&Rates::U_c, &Rates::U_c_dma, &Rates::U_g, &Rates::D_c, &Rates::B_h2d, &Rates::B_d2h, &Rates::link_share})
    if (!(rates.*f == calibrated.*f)) return true;
  return false;
}

Rates cap_links(const Workload& w, const Rates& r, const Rates& calibrated, std::size_t cpu_workers) {
  require_complete(r);
  Rates q = r;
  q.B_h2d = std::min(q.B_h2d, link_ceiling(calibrated.B_h2d));
  q.B_d2h = std::min(q.B_d2h, link_ceiling(calibrated.B_d2h));
  if (q.B_h2d != r.B_h2d || q.B_d2h != r.B_d2h) settle_bounds(w, q, cpu_workers);
  return q;
}

StreamEndAt simulated_stream_end(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r,
                                 const Execution& e) {
  return [w, plan, r, e](double share) {
    Rates q = r;
    q.link_share = share;
    try {
      return simulate_phase(w, plan, q, e).stream_end;
    } catch (const std::exception&) {
      return std::nan("");
    }
  };
}

double link_share_at_stream_end(const StreamEndAt& stream_end_at, double measured_end, double current, double cap) {
  const double nan = std::nan("");
  if (!(measured_end > 0) || !std::isfinite(measured_end) || !(cap >= kLowestLinkShare) || !std::isfinite(cap) ||
      !(current >= kLowestLinkShare && current <= cap))
    return nan;
  const double at_current = stream_end_at(current);
  if (!std::isfinite(at_current)) return nan;
  if (std::fabs(at_current - measured_end) <= 5e-3 * measured_end) return current;
  const bool more = measured_end < at_current;  // ended earlier than at the plan's share: more share
  double lo = more ? current : kLowestLinkShare, hi = more ? cap : current;  // the end at lo not earlier than at hi
  const double far = stream_end_at(more ? hi : lo);
  if (!std::isfinite(far)) return nan;
  if (more && measured_end < far) return HUGE_VAL;
  if (!more && measured_end > far) return 0;
  while (hi - lo > 1e-4) {
    const double mid = 0.5 * (lo + hi), end = stream_end_at(mid);
    if (!std::isfinite(end)) return nan;
    (end > measured_end ? lo : hi) = mid;  // still later than measured: more share
  }
  return 0.5 * (lo + hi);
}

double idle_seconds(const std::vector<BusySpan>& spans, double from, double to) {
  if (!std::isfinite(from) || !std::isfinite(to))
    throw std::invalid_argument("idle_seconds: the window's bounds must be finite numbers of seconds");
  for (const BusySpan& b : spans)
    if (!(b.end >= b.start) || !std::isfinite(b.start) || !std::isfinite(b.end))
      throw std::invalid_argument("idle_seconds: a busy span must have finite bounds and end no earlier than it starts");
  if (to <= from) return 0;
  std::vector<BusySpan> sorted(spans);
  std::sort(sorted.begin(), sorted.end(), [](const BusySpan& a, const BusySpan& b) { return a.start < b.start; });
  double busy = 0, reached = from;  // the union's part in [from, reached] is counted
  for (const BusySpan& b : sorted) {
    const double start = std::max(b.start, reached), end = std::min(b.end, to);
    if (end > start) {
      busy += end - start;
      reached = end;
    }
  }
  return std::max(0.0, (to - from) - busy);
}

Refined refine_rates(const Workload& w, const Rates& r, const PhaseMeasure& m, const Simulation& sim,
                     std::size_t cpu_workers, bool link_share_measured, bool u_c_measured, const Rates* calibrated,
                     const StreamEndAt* stream_end_at) {
  require_complete(r);
  Refined out{r, false};
  Rates& q = out.rates;
  // a step moves a rate by at most a factor of 2 towards what it measured, and half way to that
  auto within_2x = [](double rate, double measured) {
    return std::min(kRefinementStep * rate, std::max(rate / kRefinementStep, measured));
  };
  auto blend = [&](double& rate, double measured) {
    if (!(measured > 0) || !std::isfinite(measured)) return;
    rate = 0.5 * (rate + within_2x(rate, measured));
    out.applied = true;
  };
  const double adam = m.cpu_adam_seconds;  // CPU Adam alone: the model counts nothing else
  const bool measured_alone = m.streamed > 0 && m.alone_seconds >= 2e-3 && m.alone_params > 0;
  bool u_c_direct = false;  // a measure of U_c applied: from a phase that streamed nothing, or alone
  if (m.streamed == 0 && sim.cpu > 0 && adam > 0) {
    const double measured = q.U_c * sim.cpu / adam;
    // the simulated CPU Adam mostly without DMA (not beside a resident upload, whose share of host
    // memory depends on link_share too), over a phase long enough to measure by
    const bool direct = sim.cpu_beside_dma <= 0.5 * sim.cpu && adam >= 2e-3;
    if (!u_c_measured && direct && std::isfinite(measured) && measured > 0) {
      // the first: nothing of this optimizer's to average with. The CPU's speed, so U_c_dma moves
      // by the same factor (the simulated CPU time then matches the measured one to first order)
      const double f = within_2x(q.U_c, measured) / q.U_c;
      q.U_c *= f;
      q.U_c_dma *= f;
      out.applied = true;
      u_c_direct = true;
    } else {
      blend(q.U_c, measured);
      u_c_direct = direct && out.applied;
    }
  } else if (sim.cpu_beside_dma > 0.2 * sim.cpu && adam > 0) {
    // the simulated split of the CPU's work, at the rates the plan was made with
    const double sim_alone = sim.cpu - sim.cpu_beside_dma;
    const double beside = adam - sim_alone;
    if (beside > 0.2 * sim.cpu_beside_dma) {
      const double u_dma = q.U_c_dma * sim.cpu_beside_dma / beside;
      if (u_dma > q.U_c && !measured_alone) blend(q.U_c, u_dma);  // alone is at least as fast
      blend(q.U_c_dma, u_dma);
    }
  }
  if (measured_alone) {
    const double measured_per_param = m.alone_seconds / m.alone_params;
    if (sim.cpu_after_stream > 0 && sim.cpu_after_stream_params > 0)
      blend(q.U_c, r.U_c * (sim.cpu_after_stream / sim.cpu_after_stream_params) / measured_per_param);
    else
      blend(q.U_c, 1 / measured_per_param);
    u_c_direct = true;
  }
  out.u_c_measured = u_c_measured || u_c_direct;
  q.U_c_dma = std::min(q.U_c_dma, q.U_c);
  if (m.streamed > 0 && sim.stream_end > 0 && m.stream_end_seconds > 0 && m.eager_writeback) {
    auto scale_links = [&](double f) {  // both links towards f times their rate
      blend(q.B_h2d, q.B_h2d * f);
      blend(q.B_d2h, q.B_d2h * f);
    };
    const double beside = sim.stream_beside_cpu, alone = sim.stream_alone;
    if (beside > alone) {
      // The streams ran mostly beside CPU Adam: their rate there is link_share x f x B (f: CPU
      // Adam's fraction, host_shares), so link_share takes the error. The seconds alone and the
      // waits are taken as simulated; the beside seconds are what the measured end leaves.
      const double waits = std::max(0.0, sim.stream_end - beside - alone);
      const double left = m.stream_end_seconds - waits - alone;
      // left <= 0: the streams ended before the seconds alone and the waits were over, a measure
      // of no size; twice link_share stands in for it, blended, and is not link_share's measure
      const bool sized = left > 0;
      // Above U_c / U_c_dma the links get all they ask beside CPU Adam at U_c_dma: a larger share
      // changes nothing, so what the measure asks beyond it goes to B itself; so does what it asks
      // below the floor.
      const double cap = highest_link_share(q);
      const double formula = sized ? q.link_share * beside / left : 2 * q.link_share;
      double share = formula;
      if (stream_end_at && sized) {
        // the simulation at the rates the plan was made with (r), within r's own cap; a share above
        // the refined rates' cap is at least that cap (the mismatch of the two caps is no measure
        // of B)
        const double cap_r = highest_link_share(r);
        const double simulated = link_share_at_stream_end(*stream_end_at, m.stream_end_seconds,
                                                          std::min(cap_r, std::max(kLowestLinkShare, r.link_share)), cap_r);
        if (simulated == HUGE_VAL) share = std::max(cap, formula);
        else if (simulated == 0) share = std::min(kLowestLinkShare, formula);
        else if (std::isfinite(simulated)) share = std::min(simulated, cap);
      }
      out.link_share_asked = share;
      const double bounded = std::min(cap, std::max(kLowestLinkShare, share));
      if (link_share_measured || !sized) {
        blend(q.link_share, bounded);
      } else {  // the placeholder: nothing to average with, but a step of at most a factor of 2
        q.link_share = within_2x(q.link_share, bounded);
        out.applied = true;
      }
      out.link_share_applied = sized;
      const double rest = share > cap ? share / cap : share < kLowestLinkShare ? share / kLowestLinkShare : 1.0;
      const double h2d_before = q.B_h2d, d2h_before = q.B_d2h;
      if (rest != 1.0) scale_links(rest);
      // what the share could not take raises a link at most to its ceiling, or leaves one above it
      if (calibrated) {
        q.B_h2d = std::min(q.B_h2d, std::max(h2d_before, link_ceiling(calibrated->B_h2d)));
        q.B_d2h = std::min(q.B_d2h, std::max(d2h_before, link_ceiling(calibrated->B_d2h)));
      }
    } else {
      scale_links(sim.stream_end / m.stream_end_seconds);
    }
  }
  settle_bounds(w, q, cpu_workers);
  out.link_share_measured = link_share_measured || out.link_share_applied;
  return out;
}

Refined refine_after_phase(const Workload& w, const Rates& r, const PhaseMeasure& m, const Simulation& sim,
                           std::size_t cpu_workers, bool link_share_measured, bool first_streamed,
                           bool u_c_measured, const Rates* calibrated, const StreamEndAt* stream_end_at,
                           bool provisional_lowers_only) {
  if (!first_streamed || link_share_measured)
    return refine_rates(w, r, m, sim, cpu_workers, link_share_measured, u_c_measured, calibrated, stream_end_at);
  Refined out = refine_rates(w, r, m, sim, cpu_workers, false, u_c_measured, calibrated, stream_end_at);
  if (provisional_lowers_only && link_share_is_measured(r) && out.link_share_asked > r.link_share) {
    // the measure (or the stand-in) is not taken: the links as they were (the share rule is all
    // that changed B in this step), within the bounds of the refined rates
    out.rates.link_share = r.link_share;
    out.rates.B_h2d = r.B_h2d;
    out.rates.B_d2h = r.B_d2h;
    settle_bounds(w, out.rates, cpu_workers);
    out.link_share_applied = false;
  }
  out.link_share_provisional = out.link_share_applied;
  out.link_share_applied = false;
  out.link_share_measured = false;
  return out;
}

namespace {
/// Whether a and b (positive ratios) are within factor f of each other either way.
bool within_factor(double a, double b, double f) { return a > 0 && b > 0 && a <= f * b && b <= f * a; }
bool usable_ratio(double r) { return std::isfinite(r) && r > 0; }
}  // namespace

bool hold_outlier_phase(const PhaseErrors& recent, double ratio, const std::vector<PlanSide>& plan) noexcept {
  if (!usable_ratio(ratio) || recent.count < 2 || recent.last_held || plan != recent.last_plan) return false;
  return within_factor(recent.last, recent.before_last, kSteadyRatio) && !within_factor(ratio, recent.last, kOutlierRatio);
}

PhaseErrors record_phase_error(const PhaseErrors& recent, double ratio, bool held, const std::vector<PlanSide>& plan) {
  PhaseErrors out;
  out.count = recent.count + 1;
  out.before_last = recent.last;
  out.last = usable_ratio(ratio) ? ratio : 0;
  out.last_held = held;
  out.last_plan = plan;
  return out;
}

bool link_share_is_measured(const Rates& r) { return r.link_share != kUnmeasuredLinkShare; }

LinkShareRecord initial_link_share_record(const Rates& rates, const Rates& calibrated) noexcept {
  LinkShareRecord out;
  // the calibration's value as rates_to_save keeps it: capped at the rates' own U_c / U_c_dma
  const double kept = std::min(calibrated.link_share, highest_link_share(rates));
  if (rates.link_share == calibrated.link_share || (kept < calibrated.link_share && rates.link_share == kept)) {
    out.measured = false;
    out.provisional = link_share_is_measured(calibrated) ? rates.link_share : 0;
  } else {
    out.measured = link_share_is_measured(rates);
  }
  return out;
}

LinkShareRecord record_phase(const LinkShareRecord& before, const Refined& r) noexcept {
  LinkShareRecord out = before;
  out.measured = r.link_share_measured;
  if (r.link_share_provisional) out.provisional = r.rates.link_share;
  return out;
}

Rates rates_to_save(const Rates& r, const LinkShareRecord& rec) noexcept {
  Rates out = r;
  if (!rec.measured)  // the provisional value within the final rates' cap, as every refined link_share is
    out.link_share = rec.provisional > 0 ? std::min(rec.provisional, highest_link_share(out)) : kUnmeasuredLinkShare;
  return out;
}

}  // namespace dos
