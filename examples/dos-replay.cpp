// dos-replay: a dos-train report's update phases replayed through the model's refinement
// (models/refinement.h), to see what each phase's measure of link_share was and what the other
// measure would have made of it.
//
//   dos-replay REPORT.json [--first-link-shares L1,L2,...]
//
// For each phase of the report (its "iterations"), in order: the plan as it ran (the
// "placement": c on the CPU, s streamed, r resident), simulated (models/phase_sim.h) at the rates
// the phase began with; what it measured (the CPU Adam tasks' busy seconds, the stream's end: the
// report's "stream_end_seconds", or, in reports without it, the phase's end, which is the stream's
// where a phase ends with its streams; the busy seconds printed beside the simulation's CPU Adam
// and its part beside DMA; where the report has it, the seconds CPU Adam did not run
// before that end, "cpu_adam_idle_before_stream_end_seconds", beside the simulation's
// Simulation::cpu_idle_before_stream_end); then refine_after_phase on them twice, with the formula
// (DOS_LINK_SHARE_MEASURE=beside, the runtime's default) and with the simulated measure
// (simulated), and the link_share each leaves beside the report's own ("rates_after", when the
// report has it). The rates a phase began with: the report's "calibrated_rates" for the first,
// then the report's "rates_after" of the phase before where the report has them (each phase
// replayed on its own: a replay of the formula then gives the report's step, to the measure's
// precision), else the formula's replayed rates (a chain, which drifts from the run's where the
// runtime refined U_c from CPU Adam tasks that ran after the streams: the report does not hold
// those tasks). A phase the run did not refine (skipped, overlapped with the caller's work, or held
// as an outlier) is said so and leaves the rates as they were. The stream end is taken less the
// phase's set-up (its reported prediction less the simulation of its plan at the rates before,
// as the runtime adds it), as the runtime measures it. The workload and execution follow the
// report as dos-train --plan-only builds them (parameters, subgroups, dtype, master, where the
// caller's memory is, the gradients' transfer, the update budget, lookahead, submit order, CPU
// workers and threads, the copy rule, the write-back; the runtime's own copies taken as on, as
// without DOS_PARAM_UPLOAD or DOS_GRAD_DOWNLOAD): the resident subgroups' states off the GPU until
// a phase has run (not skipped), and after it a compact master's P in the host staging for the
// subgroups the last phase that ran (not skipped) updated on the CPU, as the runtime keeps it. The
// first phase's rates are the report's calibrated ones: a run that started from an earlier run's
// rates cache began elsewhere (said on the first line). The first streamed phase's measure of
// link_share follows the report's "first_link_share" (the run's DOS_FIRST_LINK_SHARE: "lower",
// the runtime's default, replays refine_after_phase's provisional_lowers_only; "whole", the rule
// before, as does a report without the field, which predates the switch).
//
// --first-link-shares L1,L2,...: the first phase replayed (the first the run refined: not
// skipped, overlapped with the caller's work or held as an outlier) also simulated, as it ran
// (its placement and set-up), at the rates it began with but for link_share at each L (each
// within the model's bounds: at least kLowestLinkShare, at most U_c / U_c_dma of those rates),
// with the run's prediction's error against each: how far the phase would have run from its
// prediction had its links got that share beside CPU Adam (how close the calibration's link_share
// must be for the first phase's prediction).
//
// Exit status 0 (also for -h or --help, which print the options); 2 for a command line it cannot
// use (no report, a share that is not a finite number above 0 or lies outside the model's bounds
// for the first phase's rates, a report with no phase refined or without a prediction for the
// option: said on stderr before anything is printed), or when the file cannot be read or is not
// a dos-train report of a run with a CUDA worker (what is wrong, and in which iteration, is named
// on stderr; the phases printed before it stay on stdout).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "adam.h"
#include "copy_rules.h"
#include "number_text.h"
#include "partition.h"
#include "phase_sim.h"
#include "refinement.h"
#include "resource_model.h"

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error(what); }

/// A value of --first-link-shares that the phase's rates do not allow (the report itself is fine)
struct ShareError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

template <std::size_t N>
std::string text(const json& j, const char* key, const char* where, const char* const (&values)[N]) {
  const json& v = field(j, key, where);
  std::string list;
  for (const char* x : values) {
    if (v.is_string() && v.get<std::string>() == x) return x;
    list += std::string(list.empty() ? "" : ", ") + x;
  }
  bad(std::string(where) + "'s \"" + key + "\" is " + v.dump() + ", not one of " + list);
}

dos::Rates rates_of(const json& j, const std::string& where) {
  const char* w = where.c_str();
  const dos::Rates r{number(j, "U_c", w),   number(j, "U_c_dma", w), number(j, "U_g", w),   number(j, "D_c", w),
                     number(j, "B_h2d", w), number(j, "B_d2h", w),   number(j, "link_share", w)};
  if (!dos::rates_complete(r)) bad(where + " holds a rate that is not a positive number");
  const std::string why = dos::rate_bounds_error(r);
  if (!why.empty()) bad(where + ": " + why);
  return r;
}

std::vector<dos::PlanSide> plan_of(const json& it, const char* key, std::size_t n, const std::string& where) {
  const json& v = field(it, key, where.c_str());
  if (!v.is_string()) bad(where + "'s \"" + key + "\" is not a string of c, s and r");
  std::vector<dos::PlanSide> plan;
  for (char c : v.get<std::string>()) {
    if (c != 'c' && c != 's' && c != 'r')
      bad(where + "'s \"" + key + "\" holds byte " + std::to_string(int((unsigned char)c)) + " (c, s or r expected)");
    plan.push_back(c == 'c' ? dos::PlanSide::cpu : c == 's' ? dos::PlanSide::gpu_streamed : dos::PlanSide::gpu_resident);
  }
  if (plan.size() != n)
    bad(where + "'s \"" + key + "\" has " + std::to_string(plan.size()) + " sides for " + std::to_string(n) + " subgroups");
  return plan;
}

bool flag(const json& it, const char* key) { return it.contains(key) && it.at(key).is_boolean() && it.at(key).get<bool>(); }

/// Why the run refined nothing after iteration `it` (update_phase.cpp, plan_step.cpp): "skipped",
/// "overlapped with the caller's work" or "held as an outlier"; nullptr when it refined.
const char* not_refined(const json& it) {
  return flag(it, "skipped") ? "skipped" : flag(it, "overlapped") ? "overlapped with the caller's work"
         : flag(it, "refinement_held")  ? "held as an outlier" : nullptr;
}

/// Replays the report `r` (the file comment above); `first_link_shares` (each > 0): the first phase
/// the run refined simulated again at each. Throws std::runtime_error naming what is wrong with the
/// report; ShareError, before printing anything, for a share outside the model's bounds for that
/// phase's rates, or a report with no refined phase or no prediction there.
void replay(const json& r, const std::vector<double>& first_link_shares) {
  const char* top = "the report";
  const std::size_t n = count(r, "subgroups", top), s = count(r, "subgroup_size", top);
  const std::size_t params = count(r, "params", top);
  // as dos-train partitions (dos::partition_subgroups): at most kMaxSubgroups subgroups, the last
  // one holding the remainder (without products that could wrap: n subgroups of s hold params when
  // n = ceil(params / s))
  if (n == 0 || n > dos::kMaxSubgroups || s == 0 || params == 0 || params > dos::kMaxTotalElements || s > params ||
      n != (params - 1) / s + 1)
    bad("the report's params, subgroups and subgroup_size do not describe a partition (subgroups 1 to 2^20, the "
        "last one of 1 to subgroup_size parameters)");
  if (count(r, "cuda_workers", top) == 0) bad("the report is of a run without a CUDA worker: the model did not refine");
  dos::Workload w;
  for (const dos::SubgroupLayout& l : dos::partition_subgroups({params}, s)) w.sizes.push_back(l.size);
  const std::string dtype = text(r, "dtype", top, {"fp32", "bf16", "fp16"});
  w.param_bytes = dtype == "fp32" ? 4 : 2;
  w.grad_bytes = text(r, "grad_transfer", top, {"native", "fp32"}) == "native" ? w.param_bytes : 4;
  w.compact_master = text(r, "master", top, {"full", "compact"}) == "compact";
  w.caller_on_gpu = text(r, "caller_memory", top, {"cuda", "host"}) == "cuda";
  dos::Execution e;
  e.update_budget = count(r, "gpu_update_budget", top);
  e.lookahead = count(r, "stream_lookahead", top);
  e.cpu_workers = count(r, "cpu_workers", top);
  e.cpu_team_threads = count(r, "cpu_threads", top);
  if (e.cpu_workers == 0 || e.cpu_workers > 1024 || e.cpu_team_threads > 4096)
    bad("the report's cpu_workers (1 to 1024) or cpu_threads (at most 4096) is out of range");
  e.cpu_work_item = dos::kCpuWorkItem;
  e.order = text(r, "submit_order", top, {"plan", "cpu-first"}) == "cpu-first" ? dos::SubmitOrder::cpu_first
                                                                              : dos::SubmitOrder::plan;
  const std::string copy_by = text(r, "copy_by", top, dos::kCopyByValues);
  const bool eager = text(r, "writeback", top, {"eager", "end"}) == "eager";
  e.own_param_upload = w.caller_on_gpu;
  e.own_grad_download = w.caller_on_gpu && w.grad_bytes == w.param_bytes;
  e.grad_download_by_copy_engine = dos::copies_by_copy_engine(copy_by.c_str(), false);
  e.param_upload_by_copy_engine = dos::copies_by_copy_engine(copy_by.c_str(), true);
  dos::stage_cpu_copies(w, e.own_grad_download, e.own_param_upload, w.caller_on_gpu);
  const dos::Rates calibrated = rates_of(field(r, "calibrated_rates", top), "the report's calibrated_rates");
  const bool lowers_only = r.contains("first_link_share") && text(r, "first_link_share", top, {"whole", "lower"}) == "lower";
  const json& its = field(r, "iterations", top);
  if (!its.is_array() || its.empty()) bad("the report's iterations are not a list of phases");
  // the first iteration the run refined: where --first-link-shares acts. No phase before it
  // refined, so it begins at the calibrated rates: the shares are checked against them here,
  // before anything is printed
  std::size_t first_ran = its.size();
  for (std::size_t i = 0; i < its.size() && first_ran == its.size(); ++i)
    if (its[i].is_object() && !not_refined(its[i])) first_ran = i;
  if (!first_link_shares.empty()) {
    if (first_ran == its.size())
      throw ShareError("--first-link-shares: the run refined after no phase (each skipped, overlapped or held as an "
                       "outlier), so there is no first phase to simulate; leave the option out");
    if (!its[first_ran].contains("predicted_seconds") || !its[first_ran].at("predicted_seconds").is_number() ||
        !(its[first_ran].at("predicted_seconds").get<double>() > 0))
      throw ShareError("--first-link-shares: iteration " + std::to_string(first_ran + 1) +
                       " of the report holds no prediction (a run under a policy other than dos or static:R), "
                       "so there is no error to give; leave the option out");
    const double cap = dos::highest_link_share(calibrated);
    for (double share : first_link_shares)
      if (!(share >= dos::kLowestLinkShare && share <= cap)) {
        char bounds[96];
        std::snprintf(bounds, sizeof bounds, "from 1/16 = 0.0625 to U_c / U_c_dma = %.4f", cap);
        throw ShareError("--first-link-shares " + dos::shortest_text(share) + " lies outside the model's bounds for " +
                         "the first phase's rates (the report's calibrated rates): " + bounds +
                         "; give shares within them");
      }
  }
  std::printf("%zu parameters, %zu subgroups; the first phase from the calibrated rates (link_share %.4f; a run "
              "that started from a rates cache began elsewhere)%s\n",
              params, n, calibrated.link_share,
              lowers_only ? "; a first streamed phase's measure above it not taken (first_link_share lower)" : "");
  dos::Rates before = calibrated;
  bool measured = dos::initial_link_share_record(calibrated, calibrated).measured, first = true, u_c = false;
  // the placement of the last phase that ran (not skipped); empty before one has (n >= 1): once
  // one has, the resident states are up and a compact master's CPU subgroups have P on the host
  std::vector<dos::PlanSide> last_ran;
  for (std::size_t i = 0; i < its.size(); ++i) {
    const json& it = its[i];
    const std::string where = "iteration " + std::to_string(i + 1) + " of the report";
    const char* wh = where.c_str();
    if (!it.is_object()) bad(where + " is not an object");
    const std::size_t k = count(it, "iteration", wh);
    const bool has_after = it.contains("rates_after");
    const dos::Rates after = has_after ? rates_of(it.at("rates_after"), where + "'s rates_after") : before;
    const char* why = not_refined(it);
    if (why) {  // the runtime refined nothing after it (update_phase.cpp, plan_step.cpp)
      std::printf("phase %zu: %s, not refined by the run; link_share stays %.4f\n", k, why, before.link_share);
      if (!flag(it, "skipped")) {  // a phase that ran and streamed allocated the streamed state's buffers
        last_ran = plan_of(it, "placement", n, where);
        for (dos::PlanSide p : last_ran) first = first && p != dos::PlanSide::gpu_streamed;
      }
      continue;
    }
    const std::vector<dos::PlanSide> plan = plan_of(it, "placement", n, where);
    const std::vector<dos::PlanSide> planned = plan_of(it, "plan", n, where);
    dos::PhaseMeasure m;
    for (dos::PlanSide p : plan) m.streamed += p == dos::PlanSide::gpu_streamed;
    m.eager_writeback = eager;
    m.cpu_adam_seconds = number(it, "cpu_adam_seconds", wh);
    const double seconds = number(it, "update_seconds", wh);
    if (!(seconds > 0) || !(m.cpu_adam_seconds >= 0)) bad(where + " has update_seconds <= 0 or cpu_adam_seconds < 0");
    // the first phase that runs brings the resident states up; after it a compact master's
    // subgroups updated on the CPU in the last phase that ran have their P in the host staging (as
    // the runtime keeps it: nothing writes the parameters between dos-train's phases)
    dos::Execution ek = e;
    if (last_ran.empty()) ek.state_off_gpu.assign(n, true);
    if (w.compact_master)
      for (dos::PlanSide p : last_ran) ek.params_on_host.push_back(p == dos::PlanSide::cpu);
    last_ran = plan;
    const dos::Simulation sim = dos::simulate_phase(w, plan, before, ek);
    // the set-up, which the runtime adds to its prediction (of the plan before the tail binding)
    // and takes off the stream's end
    const double predicted = planned == plan ? sim.total : dos::simulate_phase(w, planned, before, ek).total;
    const double reported = number(it, "predicted_seconds", wh), setup = std::max(0.0, reported - predicted);
    const bool end_known = it.contains("stream_end_seconds");
    const double end = end_known ? number(it, "stream_end_seconds", wh) : m.streamed ? seconds : 0;
    if (end < 0 || end > 1.01 * seconds) bad(where + "'s stream end lies outside [0, 1.01 x update_seconds]");
    m.stream_end_seconds = end > setup ? end - setup : 0;
    const dos::StreamEndAt at = dos::simulated_stream_end(w, plan, before, ek);
    const bool first_streamed = first && m.streamed > 0;
    const dos::Refined f = dos::refine_after_phase(w, before, m, sim, e.cpu_workers, measured, first_streamed, u_c,
                                                   &calibrated, nullptr, lowers_only);
    const dos::Refined g = dos::refine_after_phase(w, before, m, sim, e.cpu_workers, measured, first_streamed, u_c,
                                                   &calibrated, &at, lowers_only);
    std::printf("phase %zu: %zu of %zu streamed; measured %.4f s, stream end %.4f s%s (set-up %.4f s off); simulated "
                "at the rates before %.4f s (stream end %.4f: %.4f beside CPU Adam, %.4f alone)\n",
                k, m.streamed, n, seconds, end, end_known ? "" : " (the phase's end)", setup, sim.total, sim.stream_end,
                sim.stream_beside_cpu, sim.stream_alone);
    std::printf("  CPU Adam busy %.4f s (simulated %.4f s, %.4f of it beside DMA)\n", m.cpu_adam_seconds, sim.cpu,
                sim.cpu_beside_dma);
    if (it.contains("cpu_adam_idle_before_stream_end_seconds") && m.streamed > 0)
      std::printf("  CPU Adam idle before the stream end %.4f s (simulated %.4f s)\n",
                  number(it, "cpu_adam_idle_before_stream_end_seconds", wh), sim.cpu_idle_before_stream_end);
    std::printf("  link_share %.4f -> formula %.4f, simulated %.4f", before.link_share, f.rates.link_share,
                g.rates.link_share);
    if (has_after) std::printf("; the run's %.4f", after.link_share);
    std::printf("\n");
    if (i == first_ran)
      for (double share : first_link_shares) {
        dos::Rates at = before;  // the calibrated rates (checked above)
        at.link_share = share;
        const dos::Simulation s_at = dos::simulate_phase(w, plan, at, ek);
        const double total = setup + s_at.total;
        std::printf("  at link_share %.4f: simulated %.4f s (stream end %.4f); the run's prediction %.4f s %+.1f%% "
                    "against it\n", share, total, s_at.stream_end, reported, 100 * (reported / total - 1));
      }
    first = first && m.streamed == 0;
    measured = f.link_share_measured;
    u_c = f.u_c_measured;
    before = has_after ? after : f.rates;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: dos-replay REPORT.json [--first-link-shares L1,L2,...] (REPORT.json: a dos-train --report file)";
  CLI::App app{"dos-replay: a dos-train report's update phases replayed through the model's refinement"};
  std::string path;
  std::vector<double> shares;
  app.add_option("report", path, "a dos-train --report file")->required();
  app.add_option("--first-link-shares", shares,
                 "the first phase that ran also simulated at each of these link_shares (comma-separated, each within "
                 "the model's bounds for its rates), with the run's prediction's error against each")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check([](const std::string& v) -> std::string {
        // CLI11 converts after its checks: a plain decimal (dos-train's rule for numbers), above 0
        double x = 0;
        if (!dos::parse_decimal(v, &x) || !(x > 0))
          return "'" + v + "' is not a finite number above 0 (a link_share, such as 0.8)";
        return "";
      });
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s\ndos-replay: %s\n", usage, e.what());
    return 2;
  }
  try {
    std::ifstream in(path);
    if (!in) bad("cannot read it");
    json r;
    try {
      r = json::parse(in);
    } catch (const json::exception& x) {
      bad(std::string("it is not JSON (") + x.what() + ")");
    }
    replay(r, shares);
  } catch (const ShareError& x) {
    std::fprintf(stderr, "dos-replay: %s: %s\n", path.c_str(), x.what());
    return 2;
  } catch (const std::exception& x) {
    std::fprintf(stderr, "dos-replay: %s: %s; give a dos-train --report file\n", path.c_str(), x.what());
    return 2;
  }
  return 0;
}
