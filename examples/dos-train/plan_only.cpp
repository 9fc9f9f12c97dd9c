// dos-train --plan-only (plan_only.h).
#include "plan_only.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "atomic_file.h"
#include "cpu_team.h"
#include "dos.h"
#include "number_text.h"
#include "partition.h"
#include "policy.h"
#include "refinement.h"

namespace dos_train {

dos::Rates parse_rates(const std::string& text, dos::Rates* calibrated, bool* from_file) {
  if (from_file) *from_file = false;
  const std::string forms =
      "give U_c,U_c_dma,U_g,D_c,B_h2d,B_d2h (Gparams/s, Gparams/s, Gparams/s, Gparams/s, GB/s, GB/s; e.g. "
      "--rates 4.1,2.9,60,300,50,50), optionally a seventh number, link_share (the links' share of host memory "
      "beside CPU Adam; 1 when not given), or the path of a rates file (the calibration cache's JSON)";
  if (std::filesystem::is_regular_file(text)) {
    dos::Rates r, c;
    try {
      r = dos::load_rates(text, &c);
    } catch (const dos::Error& e) {  // load_rates also refuses rates in other units (implausible_rate)
      throw std::runtime_error(std::string("--rates: ") + e.what());
    }
    if (calibrated) *calibrated = c;
    if (from_file) *from_file = true;
    return r;
  }
  std::vector<double> v;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string field = text.substr(at, comma - at);
    // blanks around a number are taken ("4, 3"); the number itself is a plain decimal (no hexadecimal,
    // inf or nan), read whatever the locale's decimal point
    const char* blanks = " \t\n\v\f\r";
    const std::size_t first = field.find_first_not_of(blanks);
    const std::string number = first == std::string::npos ? std::string()
                                                          : field.substr(first, field.find_last_not_of(blanks) - first + 1);
    double x = 0;
    const bool parsed = dos::parse_decimal(number, &x);
    if (!parsed && dos::is_decimal_number(number))
      throw std::runtime_error("--rates '" + text + "': '" + number + "' is beyond what a double holds: " + forms);
    if (!parsed) {
      // a single word that is no number was most likely meant as a file
      if (text.find(',') == std::string::npos)
        throw std::runtime_error("--rates '" + text + "': " +
                                 (std::filesystem::exists(text) ? "not a regular file" : "no such file") +
                                 ", and not six or seven numbers: " + forms);
      throw std::runtime_error("--rates '" + text + "' is neither a file nor six or seven numbers ('" + field +
                               "' is not a number): " + forms);
    }
    v.push_back(x);
    at = comma + 1;
  }
  if (v.size() != 6 && v.size() != 7)
    throw std::runtime_error("--rates '" + text + "' has " + std::to_string(v.size()) + " numbers, not 6 or 7: " +
                             forms);
  for (const double x : v)  // before the units are applied: 1e300 Gparams/s is finite, its params/s not
    if (!(x > 0) || !std::isfinite(x))
      throw std::runtime_error("--rates '" + text + "': every rate must be a finite number > 0");
  dos::Rates r{v[0] * 1e9, v[1] * 1e9, v[2] * 1e9, v[3] * 1e9, v[4] * 1e9, v[5] * 1e9};
  if (v.size() == 7) r.link_share = v[6];
  if (const std::string name = dos::implausible_rate(r); !name.empty())
    throw std::runtime_error("--rates '" + text + "': " + name + " lies outside [0.001, 1e7] (Gparams/s or GB/s): " +
                             forms);
  if (const std::string e = dos::rate_bounds_error(r); !e.empty())
    throw std::runtime_error("--rates '" + text + "': " + e);
  if (calibrated) *calibrated = r;
  return r;
}

nlohmann::ordered_json show_plan(PlanOnly& p) {
  const dos::PolicyChoice choice = dos::parse_policy(p.policy);
  if (!choice.plan)
    throw std::runtime_error("--plan-only: policy " + p.policy + " is a StarPU policy, which places each task as it "
                             "comes: there is no plan to show before it runs; choose a plan (" + dos::plan_usages() + ")");
  const dos::Plan& plan = *choice.plan;
  const dos::PlanNeeds needs = plan.needs();
  if (needs.rates && !p.rates)
    throw std::runtime_error("--plan-only: plan " + p.policy + " needs the model's rates: give --rates " +
                             "U_c,U_c_dma,U_g,D_c,B_h2d,B_d2h (Gparams/s x4, GB/s x2) or --rates FILE.json");
  dos::Workload& w = p.workload;
  try {
    dos::apply_gpu_budgets(w, &plan, p.budgets);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (p.budgets.update > 0 && !w.may_stream) {  // as a run says it (OptimizerOptions::gpu_update_budget)
    std::size_t need_streamed = 0;
    for (std::size_t sz : w.sizes)
      need_streamed = std::max(need_streamed, dos::subgroup_footprint(w, sz, dos::PlanSide::gpu_streamed));
    std::printf("note: the GPU update budget (%s) is below one streamed subgroup's %s: every update that is not "
                "resident runs on the CPU\n", dos::gb_text(double(p.budgets.update)).c_str(),
                dos::gb_text(double(need_streamed)).c_str());
  }
  const std::vector<dos::PlanSide> sides = plan.decide(dos::PlanInput{w, needs.rates ? p.rates : nullptr, p.execution});
  if (const std::string e = dos::plan_contract_error(plan, w, sides); !e.empty()) throw std::runtime_error(e);
  std::size_t count[3] = {0, 0, 0};
  double params[3] = {0, 0, 0};
  for (std::size_t i = 0; i < sides.size(); ++i) {
    count[int(sides[i])] += 1;
    params[int(sides[i])] += double(w.sizes[i]);
  }
  const std::string letters = dos::plan_letters(sides);
  std::printf("plan %s for %s: %zu subgroups (caller's buffers on the %s): %zu on the CPU (%.4g params), %zu streamed "
              "(%.4g), %zu resident on the GPU (%.4g)\n",
              p.policy.c_str(), p.model.c_str(), sides.size(), w.caller_on_gpu ? "GPU" : "host", count[0], params[0],
              count[1], params[1], count[2], params[2]);
  std::printf("plan: one letter per subgroup: c CPU, s streamed through the GPU, r resident on the GPU\n");
  for (std::size_t at = 0; at < letters.size(); at += 64)
    std::printf("plan %6zu: %s\n", at, letters.substr(at, 64).c_str());
  nlohmann::ordered_json out = {{"model", p.model}, {"policy", p.policy}, {"subgroups", sides.size()},
                                {"subgroup_sizes", w.sizes}, {"caller_memory", w.caller_on_gpu ? "cuda" : "host"},
                                {"plan", letters}, {"planned_cpu", count[0]}, {"planned_streamed", count[1]},
                                {"planned_resident", count[2]}};
  if (!p.rates) {
    std::printf("prediction: none (give --rates for the simulated time and the lower bound)\n");
    return out;
  }
  const dos::Rates& r = *p.rates;
  std::printf("rates: U_c %.2f Gparams/s alone, %.2f under DMA; U_g %.1f; D_c %.1f; B %.1f GB/s H2D, %.1f GB/s D2H; "
              "links' share beside CPU Adam %.3g\n",
              r.U_c / 1e9, r.U_c_dma / 1e9, r.U_g / 1e9, r.D_c / 1e9, r.B_h2d / 1e9, r.B_d2h / 1e9, r.link_share);
  dos::Simulation sim;
  try {
    sim = dos::simulate_phase(w, sides, r, p.execution);
  } catch (const std::logic_error&) {  // a simulation that cannot progress: the resource bound, as the runtime does
    const dos::Prediction pr = dos::predict(w, sides, r);
    sim.total = pr.total;
    sim.cpu = pr.cpu;
    sim.h2d = pr.h2d;
    sim.d2h = pr.d2h;
    sim.gpu = pr.gpu;
  }
  const double bound = p.calibrated ? dos::lower_bound(w, *p.calibrated, r, 1) : dos::lower_bound(w, r);
  std::printf("predicted %.4f s (simulated, %s-bound; busy: cpu %.4f s, h2d %.4f s, d2h %.4f s, gpu %.4f s); lower bound "
              "%.4f s\n",
              sim.total, sim.busiest(), sim.cpu, sim.h2d, sim.d2h, sim.gpu, bound);
  out["predicted_seconds"] = sim.total;
  out["bound_by"] = sim.busiest();
  out["busy_seconds"] = {{"cpu", sim.cpu}, {"h2d", sim.h2d}, {"d2h", sim.d2h}, {"gpu", sim.gpu}};
  out["lower_bound_seconds"] = bound;
  out["rates"] = {{"U_c", r.U_c}, {"U_c_dma", r.U_c_dma}, {"U_g", r.U_g}, {"D_c", r.D_c}, {"B_h2d", r.B_h2d},
                  {"B_d2h", r.B_d2h}, {"link_share", r.link_share}};
  return out;
}

int run_plan_only(const Args& a, const Checked& c, const std::string& model, const std::vector<std::size_t>& numels,
                  std::size_t total, std::size_t subgroup) {
  const std::size_t n = std::accumulate(numels.begin(), numels.end(), std::size_t(0));
  const dos::DType dtype = c.dtype;
  dos::Rates rates = c.rates, calibrated_rates = c.calibrated;
  PlanOnly po;
  po.model = model;
  po.policy = dos::resolve_policy(a.policy);
  for (const dos::SubgroupLayout& l : dos::partition_subgroups(numels, subgroup)) po.workload.sizes.push_back(l.size);
  po.workload.caller_on_gpu = a.device != "host";
  po.workload.param_bytes = dos::dtype_size(dtype);
  po.workload.grad_bytes = a.grad_transfer == "native" ? dos::dtype_size(dtype) : 4;
  po.workload.compact_master = c.compact_master;
  po.budgets = dos::GpuBudgets{c.resident_budget, c.update_budget};
  po.execution.order = a.submit_order == "plan" ? dos::SubmitOrder::plan : dos::SubmitOrder::cpu_first;
  po.execution.lookahead = unsigned(a.stream_lookahead);
  po.execution.update_budget = c.update_budget;
  // the CPU team's threads per worker as the runtime would take them on this machine, with --ncuda
  // CUDA workers (one when not given: the GPU machine's one GPU) and, with the update overlapped, one
  // core for the caller (dos-train's own choices)
  const char* omp = std::getenv("OMP_NUM_THREADS");
  po.execution.cpu_workers = std::size_t(std::max(1, a.cpu_workers));
  po.execution.cpu_team_threads = std::size_t(dos::team_threads_per_worker(
      a.cpu_threads, omp ? std::max(0, std::atoi(omp)) : 0, false, dos::allowed_cores().size(),
      a.ncuda >= 0 ? a.ncuda : 1, c.overlap ? 1 : 0, a.cpu_workers));
  po.execution.cpu_work_item = dos::kCpuWorkItem;
  po.execution.own_param_upload = po.workload.caller_on_gpu && dos::runtime_uploads_params();
  // the runtime's own gradient download needs no conversion: the gradients keep the parameters' dtype
  po.execution.own_grad_download = po.workload.caller_on_gpu && dos::runtime_downloads_grads() &&
                                   po.workload.grad_bytes == po.workload.param_bytes;
  po.execution.grad_download_by_copy_engine = dos::runtime_copies_by_copy_engine(false);
  po.execution.param_upload_by_copy_engine = dos::runtime_copies_by_copy_engine(true);
  // the first iteration: no subgroup's state is on the GPU yet, the resident ones' must come up;
  // a later one: the resident states are on the GPU (the streamed ones go home after each phase)
  po.execution.state_off_gpu.assign(po.workload.sizes.size(), a.plan_phase == "first");
  // a compact master's CPU subgroups: their parameters in the host staging from the phase before in
  // a later phase (a plan that keeps its sides), not yet in the first
  if (c.compact_master && a.plan_phase != "first") po.execution.params_on_host.assign(po.workload.sizes.size(), true);
  dos::stage_cpu_copies(po.workload, po.execution.own_grad_download, po.execution.own_param_upload,
                        po.workload.caller_on_gpu && dos::runtime_downloads_grads());
  if (!a.rates.empty()) {
    // as the runtime starts from a rates file: its links held to its calibrated rates where those
    // are apart (models/refinement.h, cap_links)
    if (dos::calibration_apart(rates, calibrated_rates))
      rates = dos::cap_links(po.workload, rates, calibrated_rates, po.execution.cpu_workers);
    po.rates = &rates, po.calibrated = &calibrated_rates;
  }
  std::printf("dos-train --plan-only: %s, %zu of %zu parameters (shard %s), %s, subgroups of %zu, phase: %s\n",
              model.c_str(), n, total, a.shard.c_str(), a.dtype.c_str(), subgroup,
              a.plan_phase == "first" ? "first (resident state, if any, uploaded during it)"
                                      : "later (resident state already on the GPU)");
  nlohmann::ordered_json rep = show_plan(po);
  rep["params_total"] = total;
  rep["params"] = n;
  rep["shard"] = a.shard;
  rep["dtype"] = a.dtype;
  rep["subgroup_size"] = subgroup;
  rep["plan_phase"] = a.plan_phase;
  if (!a.report.empty()) {
    const std::string text = rep.dump(2) + "\n";
    dos::write_file_atomically(a.report, {{text.data(), text.size()}});
  }
  return 0;
}

}  // namespace dos_train
