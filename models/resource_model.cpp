#include "resource_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "adam.h"
#include "number_text.h"
#include "traffic.h"

namespace dos {

std::string Prediction::bound_by() const {
  if (total == cpu) return "cpu";
  if (total == h2d) return "h2d";
  if (total == d2h) return "d2h";
  if (total == host) return "host";
  return busiest_resource(cpu, h2d, d2h, gpu);
}

const char* busiest_resource(double cpu, double h2d, double d2h, double gpu) {
  const double m = std::max(std::max(cpu, gpu), std::max(h2d, d2h));
  if (m == cpu) return "cpu";
  if (m == h2d) return "h2d";
  if (m == d2h) return "d2h";
  return "gpu";
}

double cpu_adam_host_bytes(const Workload& w) {
  return w.compact_master ? 20.25 + double(w.grad_bytes) + 2.0 * double(w.param_bytes)
                          : 24.0 + double(w.grad_bytes) + double(w.param_bytes);
}

double lowest_distinct_u_c_dma(const Workload& w, const Rates& r, std::size_t cpu_workers) {
  const double cpu = double(std::max<std::size_t>(1, cpu_workers)) * r.U_c * cpu_adam_host_bytes(w);
  const double links = r.B_h2d + r.B_d2h;
  return r.U_c * std::min(1.0, std::max(cpu, links) / (cpu + r.link_share * links));
}

double highest_link_share(const Rates& r) { return r.U_c / r.U_c_dma; }

double estimated_link_share(const Rates& r) {
  if (!(r.U_c > 0 && std::isfinite(r.U_c) && r.U_c_dma > 0 && std::isfinite(r.U_c_dma)))
    throw std::invalid_argument("estimated_link_share needs U_c and U_c_dma positive and finite (params/s), got " +
                                std::to_string(r.U_c) + " and " + std::to_string(r.U_c_dma));
  return std::min(kUnmeasuredLinkShare, std::max(kLowestLinkShare, r.U_c_dma / r.U_c));
}

double link_share_from_dma(double dma_beside, double dma_alone, const Rates& r) {
  for (double x : {dma_beside, dma_alone, r.U_c, r.U_c_dma})
    if (!(x > 0 && std::isfinite(x)))
      throw std::invalid_argument("link_share_from_dma needs the links' rates beside CPU Adam and alone (bytes/s), U_c "
                                  "and U_c_dma (params/s) positive and finite, got " + std::to_string(dma_beside) +
                                  ", " + std::to_string(dma_alone) + ", " + std::to_string(r.U_c) + " and " +
                                  std::to_string(r.U_c_dma));
  const double share = (dma_beside / dma_alone) / (r.U_c_dma / r.U_c);
  return std::min(highest_link_share(r), std::max(kLowestLinkShare, share));
}

std::string rate_bounds_error(const Rates& r) {
  if (r.U_c_dma > r.U_c) return "U_c_dma (CPU Adam beside DMA) cannot exceed U_c (alone)";
  if (r.link_share > highest_link_share(r))
    return "link_share cannot exceed U_c / U_c_dma = " + std::to_string(highest_link_share(r)) +
           " (beyond it the links would get more than they ask beside CPU Adam)";
  if (r.link_share < kLowestLinkShare)
    return "link_share cannot be below 1/16 = 0.0625, the least the model tells apart (got " +
           shortest_text(r.link_share) + "; 1 when the links' share was not measured)";
  return "";
}

std::string implausible_rate(const Rates& r) {
  const std::pair<const char*, double> rates[] = {{"U_c", r.U_c}, {"U_c_dma", r.U_c_dma}, {"U_g", r.U_g},
                                                  {"D_c", r.D_c}, {"B_h2d", r.B_h2d}, {"B_d2h", r.B_d2h}};
  for (const auto& [name, x] : rates)
    if (!(x >= kLowestPlausibleRate && x <= kHighestPlausibleRate)) return name;
  return "";
}

double host_bandwidth(const Workload& w, const Rates& r) {
  const double cpu = r.U_c * cpu_adam_host_bytes(w), links = r.B_h2d + r.B_d2h;
  return std::max((r.U_c_dma / r.U_c) * (cpu + r.link_share * links), std::max(cpu, links));
}

HostShares host_shares(double cpu_ask, double links_ask, double host_bytes_per_s, double link_share) {
  if (!(cpu_ask >= 0) || !(links_ask >= 0) || !std::isfinite(cpu_ask) || !std::isfinite(links_ask))
    throw std::invalid_argument("host_shares: the asks must be finite and >= 0");
  if (!(host_bytes_per_s > 0) || !std::isfinite(host_bytes_per_s) || !(link_share > 0) || !std::isfinite(link_share))
    throw std::invalid_argument("host_shares: host memory's bandwidth and link_share must be positive numbers");
  HostShares s;
  if (cpu_ask + links_ask <= host_bytes_per_s) return s;
  if (cpu_ask == 0) {
    s.links = host_bytes_per_s / links_ask;
    return s;
  }
  if (links_ask == 0) {
    s.cpu = host_bytes_per_s / cpu_ask;
    return s;
  }
  s.cpu = host_bytes_per_s / (cpu_ask + link_share * links_ask);
  s.links = link_share * s.cpu;
  if (s.links > 1) {  // the links get all they ask, CPU Adam the rest (less than its ask: the asks exceed M)
    s.links = 1;
    s.cpu = (host_bytes_per_s - links_ask) / cpu_ask;
  } else if (s.cpu > 1) {
    s.cpu = 1;
    s.links = (host_bytes_per_s - cpu_ask) / links_ask;
  }
  return s;
}

bool rates_complete(const Rates& r) {
  for (double x : {r.U_c, r.U_c_dma, r.U_g, r.D_c, r.B_h2d, r.B_d2h, r.link_share})
    if (!(x > 0) || !std::isfinite(x)) return false;
  return true;
}

namespace {

void check_rates(const Rates& r) {
  if (!rates_complete(r))
    throw std::invalid_argument("resource model: every rate (U_c, U_c_dma, U_g, D_c, B_h2d, B_d2h, link_share) must be > 0");
}

/// `rates` for k CPU workers side by side (0 counts as 1): the CPU's rates, and so its host
/// traffic, k times one worker's.
Rates with_cpu_workers(Rates r, std::size_t cpu_workers) {
  const double k = double(std::max<std::size_t>(1, cpu_workers));
  r.U_c *= k;
  r.U_c_dma *= k;
  return r;
}

}  // namespace

Prediction predict_split(const Workload& w, double n_cpu, double n_streamed, const Rates& r, double n_resident) {
  check_rates(r);
  Prediction p;
  p.cpu_params = n_cpu;
  p.streamed_params = n_streamed;
  p.resident_params = n_resident;
  // bytes per parameter each way, from traffic.h (the full form's, linear in n, so per-parameter
  // figures suffice; the compact form's state at its 10.125 B per parameter, padding left out, and
  // its P up beside a GPU update's gradient with the caller on the host; a CPU subgroup's P is taken
  // in the host staging already, the steady state of a plan that keeps its sides:
  // Execution::params_on_host)
  const PcieBytes per_gpu = subgroup_pcie_bytes(true, w.caller_on_gpu, w.param_bytes, 1, w.grad_bytes);
  const PcieBytes per_cpu = subgroup_pcie_bytes(false, w.caller_on_gpu, w.param_bytes, 1, w.grad_bytes);
  const double state = state_bytes_per_param(w), p_extra = w.compact_master ? double(w.param_bytes) : 0.0;
  const double gpu_h2d = double(per_gpu.h2d) - 12.0 + state + (w.caller_on_gpu ? 0.0 : p_extra);
  const double gpu_d2h = double(per_gpu.d2h) - 12.0 + state;
  const double cpu_h2d = double(per_cpu.h2d), cpu_d2h = double(per_cpu.d2h);
  // a resident subgroup moves no state, but the caller's gradient up and parameters down when the
  // caller's buffers are on the host (its GPU update's bytes less the state's each way)
  const double res_h2d = gpu_h2d - state, res_d2h = gpu_d2h - state;
  const double up = gpu_h2d * n_streamed + cpu_h2d * n_cpu + res_h2d * n_resident;
  const double down = gpu_d2h * n_streamed + cpu_d2h * n_cpu + res_d2h * n_resident;
  p.h2d = up / r.B_h2d;
  p.d2h = down / r.B_d2h;
  p.host = (n_cpu * cpu_adam_host_bytes(w) + up + down) / host_bandwidth(w, r);
  // the GPU stages the gradients of CPU-updated subgroups (unless the runtime downloads them itself:
  // cpu_grads_staged_on_gpu false); GPU-updated ones read the caller's own (the direct path)
  const double n_conv = w.caller_on_gpu && w.cpu_grads_staged_on_gpu ? n_cpu : 0.0;
  p.gpu = (n_streamed + n_resident) / r.U_g + n_conv / r.D_c;
  const double t_dma = std::max(p.h2d, p.d2h);
  const double contended = n_cpu / r.U_c_dma;
  p.cpu = contended <= t_dma ? contended : t_dma + (n_cpu - r.U_c_dma * t_dma) / r.U_c;
  p.total = std::max(std::max(std::max(p.cpu, p.gpu), std::max(p.h2d, p.d2h)), p.host);
  return p;
}

Prediction predict(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r) {
  if (plan.size() != w.sizes.size())
    throw std::invalid_argument("resource model: the plan has " + std::to_string(plan.size()) + " sides for " +
                                std::to_string(w.sizes.size()) + " subgroups");
  double n[3] = {0, 0, 0};
  for (std::size_t i = 0; i < plan.size(); ++i) n[int(plan[i])] += double(w.sizes[i]);
  return predict_split(w, n[0], n[1], r, n[2]);
}

std::vector<PlanSide> spread_plan(std::size_t n, std::size_t m) {
  std::vector<PlanSide> p(n, PlanSide::cpu);
  if (m > n) m = n;
  for (std::size_t i = 0; i < n; ++i)
    if (((i + 1) * m) / n > (i * m) / n) p[i] = PlanSide::gpu_streamed;
  return p;
}

std::vector<PlanSide> stride_plan(std::size_t n, std::size_t k) {
  if (k == 0) throw std::invalid_argument("stride k must be at least 1");
  std::vector<PlanSide> p(n, PlanSide::cpu);
  for (std::size_t i = 0; i < n; ++i)
    if ((i + 1) % k == 0) p[i] = PlanSide::gpu_streamed;
  return p;
}

std::vector<PlanSide> static_plan(std::size_t n, double cpu_share) {
  if (!(cpu_share >= 0.0 && cpu_share <= 1.0))
    throw std::invalid_argument("static ratio R (the CPU share) must be in [0, 1], got " + std::to_string(cpu_share));
  const std::size_t ncpu = std::size_t(std::llround(cpu_share * double(n)));
  std::vector<PlanSide> p(n, PlanSide::gpu_resident);
  for (std::size_t i = 0; i < ncpu && i < n; ++i) p[i] = PlanSide::cpu;
  return p;
}

std::size_t subgroup_state_bytes(const Workload& w, std::size_t n) {
  return w.compact_master ? compact_state_bytes_for(n) : state_bytes_for(n);
}

std::size_t resident_subgroups(const std::vector<std::size_t>& sizes, std::size_t budget_bytes, bool compact_master) {
  Workload w;
  w.compact_master = compact_master;
  std::size_t used = 0, count = 0;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    const std::size_t bytes = subgroup_state_bytes(w, *it);
    if (bytes > budget_bytes - used) break;
    used += bytes;
    ++count;
  }
  return count;
}

Choice choose_plan_by(const Workload& w, const std::function<Prediction(const std::vector<PlanSide>&)>& eval) {
  Choice best;
  const std::size_t n = w.sizes.size();
  const std::size_t resident = std::min(w.resident, n), free = n - resident;
  const std::size_t top = w.may_stream ? free : 0;
  bool any = false;
  auto consider_plan = [&](std::vector<PlanSide> plan) {
    plan.resize(n, PlanSide::gpu_resident);
    const std::size_t m = std::size_t(std::count(plan.begin(), plan.end(), PlanSide::gpu_streamed));
    const Prediction p = eval(plan);
    if (!any || p.total < best.predicted.total || (p.total == best.predicted.total && m < best.streamed)) {
      best.plan = std::move(plan);
      best.streamed = m;
      best.predicted = p;
      any = true;
    }
    return p.total;
  };
  // The spread plans' totals by streamed count, once evaluated: the golden section and the last
  // scan below come back to counts already tried. eval gives the same prediction for the same plan,
  // and a plan considered again never displaces the best (the same total and count), so none is
  // evaluated twice.
  std::vector<double> spread_total(top + 1, 0.0);
  std::vector<bool> spread_known(top + 1, false);
  auto consider = [&](std::size_t m) {
    if (!spread_known[m]) {
      spread_total[m] = consider_plan(spread_plan(free, m));
      spread_known[m] = true;
    }
    return spread_total[m];
  };
  // The paper's strides k = 2..kStrides stream other subgroups than the spread plans of the same
  // count when the sizes differ (a short last subgroup): candidates too, unless the stride is the
  // spread plan of its count (free a multiple of k) and that was evaluated.
  constexpr std::size_t kStrides = 8;
  auto consider_strides = [&] {
    for (std::size_t k = 2; k <= std::min(top, kStrides); ++k) {
      std::vector<PlanSide> plan = stride_plan(free, k);
      const std::size_t m = std::size_t(std::count(plan.begin(), plan.end(), PlanSide::gpu_streamed));
      if (spread_known[m] && plan == spread_plan(free, m)) continue;
      consider_plan(std::move(plan));
    }
  };
  constexpr std::size_t kGrid = 64;
  if (top <= kGrid) {
    for (std::size_t m = 0; m <= top; ++m) consider(m);
    consider_strides();
    return best;
  }
  // Many subgroups: every plan would cost (n + 1) evaluations of n subgroups each. A grid of kGrid + 1
  // streamed counts, then a golden-section search between the grid points around the best (the
  // predicted time against the streamed count has one minimum in every case measured).
  std::size_t best_at = 0;
  double best_t = 0;
  for (std::size_t g = 0; g <= kGrid; ++g) {
    const std::size_t m = top * g / kGrid;
    const double t = consider(m);
    if (g == 0 || t < best_t) best_t = t, best_at = g;
  }
  std::size_t lo = top * (best_at == 0 ? 0 : best_at - 1) / kGrid, hi = top * std::min(best_at + 1, kGrid) / kGrid;
  while (hi - lo > 3) {
    const std::size_t a = lo + (hi - lo) * 382 / 1000, b = hi - (hi - lo) * 382 / 1000;
    if (consider(a) <= consider(b)) hi = b;
    else lo = a;
  }
  for (std::size_t m = lo; m <= hi; ++m) consider(m);
  consider_strides();
  return best;
}

Choice choose_plan(const Workload& w, const Rates& r) {
  return choose_plan_by(w, [&](const std::vector<PlanSide>& plan) { return predict(w, plan, r); });
}

StrideChoice choose_stride(const Workload& w, const Rates& r) {
  return choose_stride_by(w, [&](const std::vector<PlanSide>& plan) { return predict(w, plan, r); });
}

StrideChoice choose_stride_by(const Workload& w,
                              const std::function<Prediction(const std::vector<PlanSide>&)>& eval) {
  StrideChoice best;
  const std::size_t n = w.sizes.size();
  for (std::size_t k = 1; k <= std::max<std::size_t>(n, 1); ++k) {
    const Prediction p = eval(stride_plan(n, k));
    if (k == 1 || p.total <= best.predicted.total) {
      best.k = k;
      best.predicted = p;
    }
  }
  return best;
}

double lower_bound(const Workload& w, const Rates& rates, std::size_t cpu_workers, double cold_resident_params) {
  const Rates r = with_cpu_workers(rates, cpu_workers);
  double total = 0, resident = 0;
  const std::size_t n = w.sizes.size(), nres = std::min(w.resident, n);
  for (std::size_t i = 0; i < n; ++i) (i < n - nres ? total : resident) += double(w.sizes[i]);
  if (!(cold_resident_params >= 0) || !std::isfinite(cold_resident_params) || cold_resident_params > resident)
    throw std::invalid_argument("lower bound: the resident state to bring up (" + std::to_string(cold_resident_params) +
                                " parameters) must be a finite count between 0 and the resident subgroups' " +
                                std::to_string(resident) + " parameters");
  // the resident state still to come up: 12 B per parameter up, through StarPU's stream with the
  // streamed states' 12 B (the runtime's own parameter uploads may run beside that stream, so they
  // are not added to it), and through host memory; with none, that stream term is within p.h2d
  const double cold_bytes = state_bytes_per_param(w) * cold_resident_params;
  const double cold_host = cold_bytes / host_bandwidth(w, r);
  // each resource's whole work at its best rate: CPU Adam at U_c, the links at B, host memory at M
  auto bound = [&](double n_cpu, double n_streamed) {
    const Prediction p = predict_split(w, n_cpu, n_streamed, r, resident);
    const double state_up = (state_bytes_per_param(w) * n_streamed + cold_bytes) / r.B_h2d;
    return std::max(std::max(n_cpu / r.U_c, p.gpu), std::max(std::max(p.h2d, state_up), std::max(p.d2h, p.host + cold_host)));
  };
  double best = bound(total, 0);
  const int steps = w.may_stream ? 10000 : 0;
  for (int i = 1; i <= steps; ++i) {
    const double f = double(i) / steps;
    best = std::min(best, bound(total * (1 - f), total * f));
  }
  return best;
}

double lower_bound(const Workload& w, const Rates& calibrated, const Rates& refined, std::size_t cpu_workers,
                   double cold_resident_params) {
  check_rates(calibrated);
  check_rates(refined);
  Rates a = with_cpu_workers(calibrated, cpu_workers);
  const Rates b = with_cpu_workers(refined, cpu_workers);
  // the calibration's link_share is no counted measure (an estimate, or a measure on scratch
  // phases): it counts as at least the placeholder, so that no prior makes the bound higher
  a.link_share = std::max(a.link_share, kUnmeasuredLinkShare);
  Rates best;
  best.U_c = std::max(a.U_c, b.U_c);
  best.U_g = std::max(a.U_g, b.U_g);
  best.D_c = std::max(a.D_c, b.D_c);
  best.B_h2d = std::max(a.B_h2d, b.B_h2d);
  best.B_d2h = std::max(a.B_d2h, b.B_d2h);
  best.link_share = std::max(a.link_share, b.link_share);
  // U_c_dma enters the bound only through host_bandwidth: the one that gives the higher M of the two
  const double m = std::max(host_bandwidth(w, a), host_bandwidth(w, b));
  const double demand = best.U_c * cpu_adam_host_bytes(w) + best.link_share * (best.B_h2d + best.B_d2h);
  best.U_c_dma = best.U_c * std::min(1.0, m / demand);
  return lower_bound(w, best, 1, cold_resident_params);
}

}  // namespace dos
