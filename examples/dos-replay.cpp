// dos-replay: a dos-train report's update phases replayed through the model's refinement
// (models/refinement.h), to see what each phase's measure of link_share was and what the other
// measure would have made of it.
//
//   dos-replay REPORT.json
//
// For each phase of the report (its "iterations"), in order: the plan as it ran (the
// "placement": c on the CPU, s streamed, r resident), simulated (models/phase_sim.h) at the rates
// the phase began with; what it measured (the CPU Adam tasks' busy seconds, the stream's end: the
// report's "stream_end_seconds", or, in reports without it, the phase's end, which is the stream's
// where a phase ends with its streams); then refine_after_phase on them twice, with the formula
// (DOS_LINK_SHARE_MEASURE=beside, the runtime's default) and with the simulated measure
// (simulated), and the link_share each leaves beside the report's own ("rates_after", when the
// report has it). The rates a phase began with: the report's "calibrated_rates" for the first,
// then the report's "rates_after" of the phase before where the report has them (each phase
// replayed on its own: a replay of the formula then gives the report's step, to the measure's
// precision), else the formula's replayed rates (a chain, which drifts from the run's where the
// runtime refined U_c from CPU Adam tasks that ran after the streams: the report does not hold
// those tasks). The workload and execution are the report's (its parameters, subgroups, dtype,
// master, update budget, lookahead, submit order, CPU workers and threads, copy rule), the caller's
// parameters and gradients on the GPU as dos-train's emulated compute has them with a CUDA worker.
//
// Exit status 0; 2 when the file cannot be read or is not a dos-train report (what is wrong is
// named on stderr).
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adam.h"
#include "phase_sim.h"
#include "refinement.h"
#include "resource_model.h"

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error(what); }

const json& field(const json& j, const char* key, const char* where) {
  if (!j.is_object() || !j.contains(key)) bad(std::string(where) + " has no \"" + key + "\"");
  return j.at(key);
}

double number(const json& j, const char* key, const char* where) {
  const json& v = field(j, key, where);
  if (!v.is_number()) bad(std::string(where) + "'s \"" + key + "\" is not a number");
  return v.get<double>();
}

std::size_t count(const json& j, const char* key, const char* where) {
  const json& v = field(j, key, where);
  if (!v.is_number_unsigned()) bad(std::string(where) + "'s \"" + key + "\" is not a whole number >= 0");
  return v.get<std::size_t>();
}

dos::Rates rates_of(const json& j, const char* where) {
  const dos::Rates r{number(j, "U_c", where),   number(j, "U_c_dma", where), number(j, "U_g", where),
                     number(j, "D_c", where),   number(j, "B_h2d", where),   number(j, "B_d2h", where),
                     number(j, "link_share", where)};
  if (!dos::rates_complete(r)) bad(std::string(where) + " holds a rate that is not a positive number");
  return r;
}

std::vector<dos::PlanSide> plan_of(const std::string& placement, std::size_t n) {
  std::vector<dos::PlanSide> plan;
  for (char c : placement) {
    if (c != 'c' && c != 's' && c != 'r') bad("a placement holds '" + std::string(1, c) + "' (c, s or r expected)");
    plan.push_back(c == 'c' ? dos::PlanSide::cpu : c == 's' ? dos::PlanSide::gpu_streamed : dos::PlanSide::gpu_resident);
  }
  if (plan.size() != n) bad("a placement has " + std::to_string(plan.size()) + " sides for " + std::to_string(n) + " subgroups");
  return plan;
}

void replay(const json& r) {
  const char* top = "the report";
  const std::size_t n = count(r, "subgroups", top), s = count(r, "subgroup_size", top);
  const std::size_t params = count(r, "params", top);
  if (n == 0 || s == 0 || params <= (n - 1) * s) bad("the report's params, subgroups and subgroup_size do not agree");
  dos::Workload w;
  w.sizes.assign(n, s);
  w.sizes.back() = params - (n - 1) * s;
  const std::string dtype = field(r, "dtype", top).get<std::string>();
  w.param_bytes = w.grad_bytes = dtype == "fp32" ? 4 : 2;
  w.compact_master = field(r, "master", top).get<std::string>() == "compact";
  dos::Execution e;
  e.update_budget = count(r, "gpu_update_budget", top);
  e.lookahead = count(r, "stream_lookahead", top);
  e.cpu_workers = count(r, "cpu_workers", top);
  e.cpu_team_threads = count(r, "cpu_threads", top);
  e.cpu_work_item = dos::kCpuWorkItem;
  e.order = field(r, "submit_order", top).get<std::string>() == "cpu-first" ? dos::SubmitOrder::cpu_first
                                                                            : dos::SubmitOrder::plan;
  const std::string copy_by = field(r, "copy_by", top).get<std::string>();
  e.own_param_upload = e.own_grad_download = true;
  e.grad_download_by_copy_engine = copy_by != "kernel" && copy_by != "memcpy-up";
  e.param_upload_by_copy_engine = copy_by == "memcpy" || copy_by == "memcpy-up";
  const dos::Rates calibrated = rates_of(field(r, "calibrated_rates", top), "the report's calibrated_rates");
  const json& its = field(r, "iterations", top);
  if (!its.is_array() || its.empty()) bad("the report's iterations are not a list of phases");
  std::printf("%zu parameters, %zu subgroups; rates at the start (calibrated): link_share %.3f\n", params, n,
              calibrated.link_share);
  dos::Rates before = calibrated, chain = calibrated;
  bool measured = dos::initial_link_share_record(calibrated, calibrated).measured, first = true, u_c = false;
  for (const json& it : its) {
    const std::size_t k = count(it, "iteration", "an iteration");
    const std::vector<dos::PlanSide> plan = plan_of(field(it, "placement", "an iteration").get<std::string>(), n);
    dos::PhaseMeasure m;
    for (dos::PlanSide p : plan) m.streamed += p == dos::PlanSide::gpu_streamed;
    m.cpu_adam_seconds = number(it, "cpu_adam_seconds", "an iteration");
    const double seconds = number(it, "update_seconds", "an iteration");
    const bool end_known = it.contains("stream_end_seconds");
    m.stream_end_seconds = end_known ? number(it, "stream_end_seconds", "an iteration") : m.streamed ? seconds : 0;
    const dos::Simulation sim = dos::simulate_phase(w, plan, before, e);
    const dos::StreamEndAt at = [&](double x) {
      dos::Rates q = before;
      q.link_share = x;
      return dos::simulate_phase(w, plan, q, e).stream_end;
    };
    const bool first_streamed = first && m.streamed > 0;
    const dos::Refined f = dos::refine_after_phase(w, before, m, sim, e.cpu_workers, measured, first_streamed, u_c, &calibrated);
    const dos::Refined g =
        dos::refine_after_phase(w, before, m, sim, e.cpu_workers, measured, first_streamed, u_c, &calibrated, &at);
    std::printf("phase %zu: %zu of %zu streamed; measured %.4f s, stream end %.4f s%s; simulated at the rates before "
                "%.4f s (stream end %.4f: %.4f beside CPU Adam, %.4f alone)\n",
                k, m.streamed, n, seconds, m.stream_end_seconds, end_known ? "" : " (the phase's end)", sim.total,
                sim.stream_end, sim.stream_beside_cpu, sim.stream_alone);
    std::printf("  link_share %.3f -> formula %.3f, simulated %.3f", before.link_share, f.rates.link_share,
                g.rates.link_share);
    const bool has_after = it.contains("rates_after");
    const dos::Rates after = has_after ? rates_of(it.at("rates_after"), "an iteration's rates_after") : f.rates;
    if (has_after) std::printf("; the run's %.3f", after.link_share);
    std::printf("\n");
    first = first && m.streamed == 0;
    measured = f.link_share_measured;
    u_c = f.u_c_measured;
    chain = f.rates;
    before = has_after ? after : chain;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fprintf(argc == 2 ? stdout : stderr, "usage: dos-replay REPORT.json (a dos-train --report file)\n");
    return argc == 2 ? 0 : 2;
  }
  try {
    std::ifstream in(argv[1]);
    if (!in) bad("cannot read it");
    json r;
    try {
      r = json::parse(in);
    } catch (const json::exception& x) {
      bad(std::string("it is not JSON (") + x.what() + ")");
    }
    replay(r);
  } catch (const std::exception& x) {
    std::fprintf(stderr, "dos-replay: %s: %s; give a dos-train --report file\n", argv[1], x.what());
    return 2;
  }
  return 0;
}
