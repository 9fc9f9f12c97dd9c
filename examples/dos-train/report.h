// What dos-train prints and writes about a run: the set-up lines (the ranks, the plan, the model's
// choice), one line and one JSON row per iteration (IterationLog), the sweep table, the summary,
// the --report JSON and the --timeline JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm.h"
#include "compute_emulator.h"
#include "dos.h"
#include "model_config.h"
#include "options.h"

namespace dos_train {

/// The median of the update seconds (StepStats::seconds) of `steps` after the first (the first
/// pays allocations), or of the one step there is; 0 when empty.
double median_update_seconds(const std::vector<dos::StepStats>& steps);

/// The median of the predicted seconds over the same iterations as median_update_seconds; 0 when
/// empty (or when no iteration has a prediction: they are 0 then).
double median_predicted_seconds(const std::vector<dos::StepStats>& steps);

/// The mean of the same update seconds as median_update_seconds; 0 when empty.
double mean_update_seconds(const std::vector<dos::StepStats>& steps);

/// Prints "data parallel: W ranks ..." and one line per rank (its shard of `total` parameters and
/// its placement, `words`, gathered from every rank) on stdout. `backend`: the collectives' name
/// and buffers ("NCCL 2.27.7 on GPU buffers"). Collective over `comm` (every rank calls it; rank 0's
/// stdout is the one that shows). Throws std::runtime_error when the gather fails.
void print_ranks(dos::Comm& comm, std::size_t total, const std::string& words, const std::string& backend);

/// Prints, for a plan that keeps its own subgroups resident on the GPU, how many subgroups the next
/// update runs on the CPU and that the others stay resident; nothing otherwise (or without a CUDA
/// worker). `n`: this shard's parameters.
void print_resident_plan(const dos::Runtime& rt, const dos::Optimizer& opt, std::size_t n);

/// Prints the model's rates and its choices ("model: ..." lines: the best plan, the best stride,
/// all on the CPU, all streamed, the lower bound, seconds) for a policy with a model and a CUDA
/// worker; nothing otherwise. When the GPU update budget holds no streamed subgroup
/// (Workload::may_stream false), it says so instead of predicting a stride and all streamed, plans
/// that cannot run under that budget.
void print_model_choice(const dos::Runtime& rt, const dos::Optimizer& opt);

/// What the iteration's gradient check found (--max-grad-norm): checked: whether it ran; norm: the
/// global L2 norm of the gradients before clipping (inf or NaN: the update was skipped); coef: the
/// clipping coefficient applied (1: none).
struct GradientCheck {
  bool checked = false;
  double norm = 0;
  float coef = 1;
};

/// One line per iteration on stdout and one row per iteration for the report.
class IterationLog {
 public:
  /// total: the model's parameters (all shards, for the model TFLOPs); compute: the forward and
  /// backward emulator, null without --emulate-compute (kept, not owned); world: the ranks of the
  /// data-parallel job, 0 for one process; comm_backend: the collectives' name ("MPI: ...",
  /// "NCCL 2.27.7"), shown only under data parallelism.
  IterationLog(const dos::Runtime& rt, const ComputeEmulator* compute, bool on_gpu, std::size_t total,
               std::size_t world, std::string comm_backend);

  /// Prints iteration `it`'s line (`label` after its number: " [0.5]" in a sweep) and keeps its row
  /// and, when the step recorded one, its timeline. ct: forward and backward (zero without
  /// --emulate-compute); iteration_seconds: the whole iteration, wall; comm_seconds: in the
  /// data-parallel collectives; gc: the gradient check. An overlapped update (StepStats::overlapped)
  /// also shows the part of it exposed after backward, the share of the parameters whose update
  /// was hidden, and the speculative updates made and redone. Flushes stdout.
  void add(std::int64_t it, const std::string& label, const dos::StepStats& s, const ComputeTimes& ct,
           double iteration_seconds, double comm_seconds, const GradientCheck& gc = {});

  /// Adds to the last row the model's rates as they stand after its phase (the optimizer's rates()
  /// once the phase's refinement ran: params/s and bytes/s, as the report's "rates"), as
  /// "rates_after", so that each phase's plan can be simulated again at the rates that made the
  /// next one; nothing when there is no row or the rates are not complete (no model). Throws
  /// nothing but std::bad_alloc.
  void note_rates_after(const dos::Rates& rates);

  /// Every iteration's row, in order (the report's "iterations").
  const nlohmann::ordered_json& rows() const { return rows_; }
  /// The median of `key` over the rows after the first (the rows that have it); 0 when none has it.
  double median_field(const char* key) const;
  /// The tasks and bus samples of the last step that recorded a timeline (Optimizer::set_timeline).
  const std::vector<dos::TimelineTask>& last_tasks() const { return last_tasks_; }
  const std::vector<dos::BusSample>& last_bus() const { return last_bus_; }

 private:
  unsigned cpu_workers_, cuda_workers_;
  const ComputeEmulator* compute_;
  bool on_gpu_;
  std::size_t total_, world_;
  std::string comm_backend_;
  nlohmann::ordered_json rows_ = nlohmann::ordered_json::array();
  std::vector<dos::TimelineTask> last_tasks_;
  std::vector<dos::BusSample> last_bus_;
};

/// One entry of --sweep: the streamed fraction as given ("0.5", "model"), the subgroups its plan
/// streamed in the last iteration, the median update seconds and the median prediction over the
/// same iterations (after the first; median_update_seconds, median_predicted_seconds), the lower
/// bound in the last iteration (seconds), and error: the median over those iterations of each
/// iteration's prediction against its own measured seconds (predicted / measured - 1; 0.05: 5% too
/// slow).
struct SweepRow {
  std::string entry;
  std::size_t streamed;
  double median, predicted, bound, error;
};

/// The median over the iterations after the first (all of them when there is one) of predicted /
/// measured - 1, each iteration's prediction against its own update seconds; NaN when no iteration
/// has a prediction (a run without the model's rates).
double median_prediction_error(const std::vector<dos::StepStats>& steps);

/// Prints the sweep's table (each entry against the fastest) and returns it as the report's
/// "sweep" array. n: this shard's parameters; subgroups: their number; iterations: per entry.
nlohmann::ordered_json print_sweep(const std::vector<SweepRow>& rows, std::size_t n, std::size_t subgroups,
                                   int iterations);

/// The figures of the main run (not a sweep) that the summary line and the report show: medians and
/// mean over the iterations after the first, seconds.
struct Summary {
  double median = 0, mean = 0;
};

/// Prints the "summary:" line(s) of the main run: the update's median and mean over `steps`, and
/// with --emulate-compute the iteration's medians (from `log`). n: this shard's parameters.
Summary print_summary(const std::vector<dos::StepStats>& steps, const IterationLog& log, std::size_t n,
                      std::size_t subgroups, int iterations, const ComputeEmulator* compute, bool on_gpu);

/// What the --report JSON says of the run besides the iterations.
struct RunFacts {
  const Args* args = nullptr;          ///< the options (after the job has set --shard)
  const ModelConfig* model = nullptr;
  std::size_t total = 0, n = 0;        ///< parameters: the model's, this shard's
  std::size_t subgroup = 0;            ///< --subgroup-size, elements
  std::int64_t resident_budget = -1;   ///< bytes, -1: none given
  std::size_t update_budget = 0;       ///< bytes, 0: none given
  std::size_t tail_subgroups = 0;      ///< --tail-subgroups as resolved (auto: 6 or 0)
  bool on_gpu = false;                 ///< the model's buffers are in GPU memory
};

/// The --report JSON: the run's facts, the runtime's set-up, the iterations' rows, the sweep, and
/// for a main run the summary (with --emulate-compute, the compute medians too). With a plan that
/// uses the model's rates (dos, static:R, greedy): "rates", those after the last step's refinement,
/// and "calibrated_rates", those it started from, each with U_c, U_c_dma, U_g, D_c (params/s),
/// B_h2d, B_d2h (bytes/s) and link_share, as the rates cache's file writes them (--rates FILE
/// reads such an object).
nlohmann::ordered_json report_json(const RunFacts& f, const dos::Runtime& rt, const dos::Optimizer& opt,
                                   const IterationLog& log, const nlohmann::ordered_json& sweep,
                                   const Summary* summary, const ComputeEmulator* compute);

/// The --timeline JSON (one line of text): the last recorded iteration's tasks per worker and the
/// PCIe byte samples (columns seconds, h2d_bytes, d2h_bytes). it: the last iteration's number;
/// n: this shard's parameters.
std::string timeline_json(const dos::Runtime& rt, const dos::Optimizer& opt, const IterationLog& log,
                          std::int64_t it, std::size_t n);

}  // namespace dos_train
