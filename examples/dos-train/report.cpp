// What dos-train prints and writes about a run (report.h).
#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "adam.h"
#include "cpu_team.h"
#include "parallel/parallel.h"
#include "plan.h"
#include "rates_json.h"
#include "resource_model.h"

namespace dos_train {

namespace {

/// The median of `v` (sorted here); 0 when empty.
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// The steps the summaries count: those after the first (which pays allocations), or the one step
/// there is.
std::vector<const dos::StepStats*> after_first(const std::vector<dos::StepStats>& steps) {
  std::vector<const dos::StepStats*> out;
  for (std::size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) out.push_back(&steps[i]);
  return out;
}

}  // namespace

namespace {

/// The median of one figure of the steps after the first (after_first).
double median_after_first(const std::vector<dos::StepStats>& steps, double dos::StepStats::*figure) {
  std::vector<double> t;
  for (const dos::StepStats* s : after_first(steps)) t.push_back(s->*figure);
  return median(std::move(t));
}

}  // namespace

double median_update_seconds(const std::vector<dos::StepStats>& steps) {
  return median_after_first(steps, &dos::StepStats::seconds);
}

double median_predicted_seconds(const std::vector<dos::StepStats>& steps) {
  return median_after_first(steps, &dos::StepStats::predicted_seconds);
}

double median_prediction_error(const std::vector<dos::StepStats>& steps) {
  std::vector<double> e;
  for (const dos::StepStats* s : after_first(steps))
    if (s->seconds > 0 && s->predicted_seconds > 0) e.push_back(s->predicted_seconds / s->seconds - 1);
  return e.empty() ? std::nan("") : median(std::move(e));
}

double mean_update_seconds(const std::vector<dos::StepStats>& steps) {
  const std::vector<const dos::StepStats*> counted = after_first(steps);
  double mean = 0;
  for (const dos::StepStats* s : counted) mean += s->seconds;
  return counted.empty() ? 0.0 : mean / double(counted.size());
}

void print_ranks(dos::Comm& comm, std::size_t total, const std::string& words, const std::string& backend) {
  const std::size_t world = std::size_t(comm.size());
  char mine[160];
  std::snprintf(mine, sizeof mine, "%s", words.c_str());
  std::vector<char> all(sizeof mine * world);
  dos::gather_from_each(comm, mine, all.data(), sizeof mine);
  std::printf("data parallel: %zu ranks (%d on this node), gradients reduced and parameters broadcast through %s\n",
              world, comm.local_size(), backend.c_str());
  for (std::size_t r = 0; r < world; ++r) {
    const dos::ShardRange sr = dos::shard_range(total, r, world);
    std::printf("  rank %zu: shard [%zu, %zu), %s\n", r, sr.begin, sr.end, all.data() + r * sizeof mine);
  }
}

void print_resident_plan(const dos::Runtime& rt, const dos::Optimizer& opt, std::size_t n) {
  if (!(rt.plan() && rt.plan()->needs().resident == dos::ResidentState::own && rt.cuda_workers() > 0)) return;
  const auto plan = opt.next_plan();  // a plan that keeps its own subgroups resident: say which
  std::size_t ncpu = 0, pcpu = 0;
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (plan[i] == dos::PlanSide::cpu) ++ncpu, pcpu += opt.subgroup_size(i);
  std::printf("%s: %zu of %zu subgroups on the CPU (%.3f of the subgroups, %.3f of the parameters); the other %zu "
              "keep their state resident on the GPU\n",
              rt.policy().c_str(), ncpu, plan.size(), double(ncpu) / double(plan.size()), double(pcpu) / double(n),
              plan.size() - ncpu);
}

void print_model_choice(const dos::Runtime& rt, const dos::Optimizer& opt) {
  if (!(rt.model_policy() && rt.cuda_workers() > 0)) return;
  const dos::Rates& r = opt.rates();
  const dos::Execution ex = opt.execution();
  const dos::Workload& w = opt.workload();
  const dos::Choice c = dos::choose_plan_simulated(w, r, ex);
  const std::size_t ns = opt.num_subgroups();
  // A stride or an all-streamed plan streams subgroups; when the GPU update budget holds none, no
  // such plan can run, and its prediction would only mislead.
  const double all_cpu = dos::simulate_phase(w, dos::spread_plan(ns, 0), r, ex).total;
  char streaming[160];
  if (w.may_stream) {
    const dos::StrideChoice k = dos::choose_stride_simulated(w, r, ex);
    std::snprintf(streaming, sizeof streaming, "best stride k = %zu (%.2f s); all on the CPU %.2f s; all streamed %.2f s",
                  k.k, k.predicted.total, all_cpu, dos::simulate_phase(w, dos::spread_plan(ns, ns), r, ex).total);
  } else {
    std::snprintf(streaming, sizeof streaming,
                  "no stride and no streamed subgroup (the GPU update budget holds none); all on the CPU %.2f s", all_cpu);
  }
  std::printf("model: U_c %.2f Gparams/s alone, %.2f under DMA; U_g %.1f; D_c %.1f; B %.1f GB/s H2D, %.1f GB/s D2H; "
              "links' share beside CPU Adam %.3g\n"
              "model: best plan streams %zu of %zu subgroups (%.2f s predicted, %s-bound); %s; lower bound %.2f s\n",
              r.U_c / 1e9, r.U_c_dma / 1e9, r.U_g / 1e9, r.D_c / 1e9, r.B_h2d / 1e9, r.B_d2h / 1e9, r.link_share, c.streamed,
              ns, c.predicted.total, c.predicted.bound_by().c_str(), streaming,
              dos::lower_bound(w, opt.calibrated_rates(), opt.rates(), rt.cpu_workers()));
}

IterationLog::IterationLog(const dos::Runtime& rt, const ComputeEmulator* compute, bool on_gpu, std::size_t total,
                           std::size_t world, std::string comm_backend)
    : cpu_workers_(rt.cpu_workers()),
      cuda_workers_(rt.cuda_workers()),
      compute_(compute),
      on_gpu_(on_gpu),
      total_(total),
      world_(world),
      comm_backend_(std::move(comm_backend)) {}

void IterationLog::note_rates_after(const dos::Rates& rates) {
  if (!rows_.empty() && dos::rates_complete(rates)) rows_.back()["rates_after"] = dos::rates_to_json(rates);
}

void IterationLog::add(std::int64_t it, const std::string& label, const dos::StepStats& s, const ComputeTimes& ct,
                       double iter_s, double comm_s, const GradientCheck& gc) {
  const ComputeEmulator* compute = compute_;
  const bool on_gpu = on_gpu_, dp = world_ > 0;
  const std::uint64_t peak = compute ? std::max<std::uint64_t>(ct.peak_bytes, compute->used_bytes()) : 0;
  // model FLOPs as usually counted for MFU: 6 x parameters x tokens
  // (the CPU stand-in's shapes are scaled down: its figure is the FLOPs it did per second)
  const double tflops = !compute ? 0.0
                        : on_gpu ? 6.0 * double(total_) * double(compute->tokens()) / iter_s / 1e12
                                 : ct.flops / iter_s / 1e12;
  if (!s.timeline.empty() || !s.bus.empty()) last_tasks_ = s.timeline, last_bus_ = s.bus;
  // a skipped update (StepStats::skipped) may have taken no time at all: its rates are 0
  const double per_s = s.seconds > 0 ? 1.0 / s.seconds : 0.0;
  const double gps = s.skipped ? 0.0 : double(s.params) * per_s / 1e9;
  const double cpu_busy = cpu_workers_ ? s.cpu_busy_seconds * per_s / cpu_workers_ : 0.0;
  const double gpu_busy = cuda_workers_ ? s.gpu_busy_seconds * per_s / cuda_workers_ : 0.0;
  // an overlapped phase's seconds begin with backward, and it refines no rates: its prediction is
  // that of the same plan run alone after backward, which is what the text says
  char model[200] = "";
  if (s.predicted_seconds > 0)
    std::snprintf(model, sizeof model, "  predicted %.4f s (%s%s)  lower bound %.4f s%s", s.predicted_seconds,
                  s.bound_by.c_str(), s.overlapped ? "; for the phase alone after backward" : "",
                  s.lower_bound_seconds, s.refinement_held ? "  (outlier: not refined)" : "");
  char comp[420] = "";
  if (compute)
    std::snprintf(comp, sizeof comp,
                  "  forward %.4f s (waited %.4f s for parameters)  backward %.4f s (GEMMs %.4f s, launches %.4f s, "
                  "gradients released %.4f s)  iteration %.4f s  peak %s %.3g GB  %.3g model TFLOPs",
                  ct.forward, ct.forward_wait, ct.backward, ct.backward_device, ct.backward_launch, ct.backward_release,
                  iter_s,
                  on_gpu ? "GPU" : "host (activations)", peak / 1e9, tflops);
  if (dp) {
    const std::size_t used = std::strlen(comp);
    std::snprintf(comp + used, sizeof comp - used, "  comm %.4f s (%zu ranks)", comm_s, world_);
  }
  char over[200] = "";
  if (s.overlapped)
    std::snprintf(over, sizeof over, "  overlapped: exposed %.4f s, hidden %.0f%% of the parameters (%zu speculated, %zu "
                  "redone)", s.exposed_seconds, s.params ? 100.0 * double(s.hidden_params) / double(s.params) : 0.0,
                  s.speculated, s.redone);
  if (gc.checked) {
    const std::size_t used = std::strlen(over);
    std::snprintf(over + used, sizeof over - used, "  grad norm %.4g%s", gc.norm,
                  s.skipped ? " (not finite: update skipped)" : gc.coef < 1 ? " (clipped)" : "");
  }
  char tail[64] = "";
  if (s.tail_bound > 0) std::snprintf(tail, sizeof tail, "; tail %zu bound, %zu moved", s.tail_bound, s.tail_moved);
  // under a StarPU policy there is no plan (s.plan empty): StarPU placed every task itself
  char planned[96] = "(no plan: StarPU placed the tasks)";
  if (!s.plan.empty() || s.subgroups_cpu + s.subgroups_gpu == 0)
    std::snprintf(planned, sizeof planned, "(plan: %zu streamed, %zu resident%s)", s.planned_streamed, s.planned_resident,
                  tail);
  std::printf("iter %3lld%s  update %8.4f s  %7.3f Gparams/s  subgroups cpu %zu gpu %zu %s%s  H2D %.3f GB %.1f GB/s  "
              "D2H %.3f GB %.1f GB/s  busy cpu %3.0f%% gpu %3.0f%%%s%s\n",
              (long long)it, label.c_str(), s.seconds, gps, s.subgroups_cpu, s.subgroups_gpu, planned, model, s.bytes_h2d / 1e9, s.bytes_h2d * per_s / 1e9, s.bytes_d2h / 1e9,
              s.bytes_d2h * per_s / 1e9, 100 * cpu_busy, 100 * gpu_busy, comp, over);
  nlohmann::ordered_json row = {{"iteration", it}, {"label", label}, {"update_seconds", s.seconds}, {"gparams_per_s", gps},
                                {"subgroups_cpu", s.subgroups_cpu}, {"subgroups_gpu", s.subgroups_gpu},
                                {"planned_streamed", s.planned_streamed}, {"planned_resident", s.planned_resident},
                                {"plan", dos::plan_letters(s.plan)}, {"placement", dos::plan_letters(s.placement)},
                                {"predicted_seconds", s.predicted_seconds}, {"lower_bound_seconds", s.lower_bound_seconds},
                                {"bytes_h2d", s.bytes_h2d}, {"bytes_d2h", s.bytes_d2h},
                                {"cpu_busy_fraction", cpu_busy}, {"gpu_busy_fraction", gpu_busy},
                                {"starpu_gpu_bytes_end", s.gpu_bytes_end}, {"window_peak_bytes", s.window_peak_bytes}};
  row["cpu_adam_seconds"] = s.cpu_adam_seconds;
  row["tail_bound"] = s.tail_bound;
  row["tail_moved"] = s.tail_moved;
  row["refinement_held"] = s.refinement_held;
  row["stream_end_seconds"] = s.stream_end_seconds;
  row["cpu_adam_idle_before_stream_end_seconds"] = s.cpu_adam_idle_before_stream_end_seconds;
  row["plan_seconds"] = s.plan_seconds;
  row["plan_decided_ahead"] = s.plan_decided_ahead;
  row["longest_download_seconds"] = s.longest_download_seconds;
  row["longest_download_bytes"] = s.longest_download_bytes;
  row["downloads_dodge_writebacks"] = s.downloads_dodge_writebacks;
  row["overlapped"] = s.overlapped;
  row["exposed_seconds"] = s.exposed_seconds;
  row["speculated"] = s.speculated;
  row["hidden_params"] = s.hidden_params;
  row["redone"] = s.redone;
  row["skipped"] = s.skipped;
  if (gc.checked) {
    row["grad_norm"] = std::isfinite(gc.norm) ? nlohmann::ordered_json(gc.norm) : nlohmann::ordered_json(nullptr);
    row["clip_coef"] = gc.coef;
  }
  if (dp) {
    row["comm_seconds"] = comm_s;
    row["comm_backend"] = comm_backend_;
  }
  if (compute) {
    row["forward_seconds"] = ct.forward;
    row["forward_wait_seconds"] = ct.forward_wait;
    row["backward_seconds"] = ct.backward;
    row["backward_device_seconds"] = ct.backward_device;
    row["backward_launch_seconds"] = ct.backward_launch;
    row["backward_release_seconds"] = ct.backward_release;
    row["iteration_seconds"] = iter_s;
    row["peak_gpu_bytes"] = peak;
    row["model_tflops"] = tflops;
  }
  rows_.push_back(row);
  std::fflush(stdout);
}

double IterationLog::median_field(const char* key) const {
  std::vector<double> v;
  for (std::size_t i = rows_.size() > 1 ? 1 : 0; i < rows_.size(); ++i)
    if (rows_[i].contains(key)) v.push_back(rows_[i][key].get<double>());
  return median(std::move(v));
}

nlohmann::ordered_json print_sweep(const std::vector<SweepRow>& rows, std::size_t n, std::size_t subgroups,
                                   int iterations) {
  nlohmann::ordered_json sweep = nlohmann::ordered_json::array();
  if (rows.empty()) return sweep;
  double best = rows[0].median;
  for (const SweepRow& r : rows) best = std::min(best, r.median);
  const std::string over = iterations > 1 ? "medians of iterations 2.." + std::to_string(iterations) : "iteration 1";
  std::printf("sweep (%zu parameters, %zu subgroups, %s of each; pred. error: the median of "
              "each iteration's prediction against its own seconds):\n",
              n, subgroups, over.c_str());
  std::printf("  %-8s %9s %12s %12s %12s %10s %12s\n", "fraction", "streamed", "update s", "predicted s", "lower bound",
              "vs fastest", "pred. error");
  for (const SweepRow& r : rows) {
    char error[32] = "           -";
    if (std::isfinite(r.error)) std::snprintf(error, sizeof error, "%+11.1f%%", 100.0 * r.error);
    std::printf("  %-8s %9zu %12.4f %12.4f %12.4f %9.1f%% %s\n", r.entry.c_str(), r.streamed, r.median, r.predicted,
                r.bound, 100.0 * (r.median / best - 1.0), error);
    sweep.push_back({{"entry", r.entry}, {"streamed", r.streamed}, {"update_seconds_median", r.median},
                     {"predicted_seconds", r.predicted}, {"lower_bound_seconds", r.bound},
                     {"prediction_error_median", std::isfinite(r.error) ? nlohmann::ordered_json(r.error)
                                                                        : nlohmann::ordered_json(nullptr)}});
  }
  return sweep;
}

Summary print_summary(const std::vector<dos::StepStats>& steps, const IterationLog& log, std::size_t n,
                      std::size_t subgroups, int iterations, const ComputeEmulator* compute, bool on_gpu) {
  Summary s;
  if (steps.empty()) return s;
  s.median = median_update_seconds(steps);
  s.mean = mean_update_seconds(steps);
  std::printf("summary: %zu parameters, %zu subgroup%s, %d iteration%s: update median %.4f s, mean %.4f s "
              "(iterations %s), %.3f Gparams/s at the median\n",
              n, subgroups, subgroups == 1 ? "" : "s", iterations, iterations == 1 ? "" : "s", s.median, s.mean,
              steps.size() > 1 ? "2.." : "1", double(n) / s.median / 1e9);
  // medians of the compute figures over the same iterations (after the first)
  const bool overlapped = steps.back().overlapped;
  if (compute)
    std::printf("summary: iteration median %.4f s (forward %.4f s, backward %.4f s, update %.4f s%s), %.3g model TFLOPs, "
                "peak %s memory %.3g GB\n",
                log.median_field("iteration_seconds"), log.median_field("forward_seconds"),
                log.median_field("backward_seconds"), overlapped ? log.median_field("exposed_seconds") : s.median,
                overlapped ? " exposed after backward: the update overlapped it" : "", log.median_field("model_tflops"),
                on_gpu ? "GPU" : "host (activations)", log.median_field("peak_gpu_bytes") / 1e9);
  return s;
}

nlohmann::ordered_json report_json(const RunFacts& f, const dos::Runtime& rt, const dos::Optimizer& opt,
                                   const IterationLog& log, const nlohmann::ordered_json& sweep,
                                   const Summary* summary, const ComputeEmulator* compute) {
  const Args& a = *f.args;
  nlohmann::ordered_json rep = {
      {"model", f.model->name}, {"arch", f.model->arch}, {"params_total", f.total}, {"params", f.n}, {"shard", a.shard},
      {"dtype", a.dtype}, {"optimizer", a.optimizer}, {"subgroup_size", f.subgroup},
      {"subgroups", opt.num_subgroups()}, {"policy", rt.policy()}, {"starpu_policy", rt.running_policy()},
      {"cpu_workers", rt.cpu_workers()}, {"cuda_workers", rt.cuda_workers()}, {"cpu_threads", rt.cpu_threads()},
      {"caller_memory", f.on_gpu ? "cuda" : "host"}, {"seed", a.seed}, {"iterations", log.rows()},
      {"sweep", sweep}};
  if (summary) {  // a sweep's figures are in "sweep"
    rep["summary"] = {{"update_seconds_median", summary->median}, {"update_seconds_mean", summary->mean},
                      {"gparams_per_s_median", double(f.n) / summary->median / 1e9}};
    if (compute) {
      rep["summary"]["iteration_seconds_median"] = log.median_field("iteration_seconds");
      rep["summary"]["forward_seconds_median"] = log.median_field("forward_seconds");
      rep["summary"]["backward_seconds_median"] = log.median_field("backward_seconds");
      rep["summary"]["exposed_seconds_median"] = log.median_field("exposed_seconds");
      rep["summary"]["model_tflops_median"] = log.median_field("model_tflops");
      rep["summary"]["peak_gpu_bytes_median"] = log.median_field("peak_gpu_bytes");
      rep["summary"]["tokens_per_iteration"] = compute->tokens();
    }
  }
  rep["gpu_resident_budget"] = f.resident_budget;
  rep["gpu_update_budget"] = f.update_budget;
  rep["stream_lookahead"] = a.stream_lookahead;
  rep["tail_subgroups"] = f.tail_subgroups;
  rep["writeback"] = a.writeback;
  rep["grad_transfer"] = a.grad_transfer;
  rep["master"] = a.master;
  rep["copy_by"] = dos::runtime_copy_by();  // --copy-by has set DOS_COPY_BY before the runtime read it
  rep["cpu_schedule"] = dos::cpu_adam_schedule();  // DOS_CPU_SCHEDULE
  rep["link_share_measure"] = dos::runtime_link_share_measure();  // DOS_LINK_SHARE_MEASURE
  rep["first_link_share"] = dos::runtime_first_link_share();      // DOS_FIRST_LINK_SHARE
  rep["team_bind"] = dos::team_bind_mode();        // DOS_TEAM_BIND
  rep["urgent_writeback"] = a.urgent_writeback;
  rep["submit_order"] = a.submit_order;
  if (dos::rates_complete(opt.rates()) && dos::rates_complete(opt.calibrated_rates())) {
    rep["rates"] = dos::rates_to_json(opt.rates());
    rep["calibrated_rates"] = dos::rates_to_json(opt.calibrated_rates());
  }
  return rep;
}

std::string timeline_json(const dos::Runtime& rt, const dos::Optimizer& opt, const IterationLog& log,
                          std::int64_t it, std::size_t n) {
  nlohmann::ordered_json tasks = nlohmann::ordered_json::array(), bus = nlohmann::ordered_json::array();
  for (const dos::TimelineTask& t : log.last_tasks())
    tasks.push_back({{"lane", t.lane}, {"what", t.what}, {"subgroup", t.subgroup}, {"start", t.start}, {"end", t.end}});
  for (const dos::BusSample& b : log.last_bus()) bus.push_back({b.t, b.h2d, b.d2h});
  nlohmann::ordered_json tl = {{"policy", rt.policy()}, {"iteration", it}, {"params", n},
                               {"subgroups", opt.num_subgroups()}, {"tasks", tasks},
                               {"bus_columns", {"seconds", "h2d_bytes", "d2h_bytes"}}, {"bus", bus}};
  return tl.dump() + "\n";
}

}  // namespace dos_train
