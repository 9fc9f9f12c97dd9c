// dos-train --plan-only: a plan and its prediction without a GPU and without StarPU's update phase.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "options.h"
#include "plan.h"

namespace dos_train {

/// Parses --rates: either six comma-separated numbers "U_c,U_c_dma,U_g,D_c,B_h2d,B_d2h" in Gparams/s
/// (the first four) and GB/s (the last two), the units of dos-train's "model:" line, or the path of
/// a rates file in the calibration cache's format (dos::load_rates: params/s and bytes/s, with the
/// calibration's own rates under "calibrated"). Returns the rates to plan with, in params/s and
/// bytes/s; *calibrated gets the ones the lower bound uses (the file's "calibrated", else the same);
/// *from_file (when not null) whether `text` named a rates file. Each number is a plain decimal
/// (dos::is_decimal_number: no hexadecimal, inf or nan; blanks around it are taken), read with '.' as
/// the decimal point whatever the locale.
/// Throws std::runtime_error naming the value and both accepted forms when it is neither, when a
/// rate is not a finite positive number, or when one lies outside [1e6, 1e16] per second (a
/// thousandth to ten million Gparams/s or GB/s: a mistake of units, such as a file in Gparams/s).
dos::Rates parse_rates(const std::string& text, dos::Rates* calibrated, bool* from_file = nullptr);

/// What --plan-only shows. model: the model's name; policy: the --policy text (must name a plan);
/// workload: subgroup sizes (elements), caller_on_gpu, param_bytes and grad_bytes set (resident and
/// may_stream are set here from budgets); budgets: the GPU budgets in bytes; execution: how the
/// runtime would carry the plan out; rates, calibrated: the rates to plan with and the lower
/// bound's (params/s, bytes/s), or null when none were given.
struct PlanOnly {
  std::string model, policy;
  dos::Workload workload;
  dos::GpuBudgets budgets;
  dos::Execution execution;
  const dos::Rates* rates = nullptr;
  const dos::Rates* calibrated = nullptr;
};

/// Asks the plan for the next phase as the runtime would with a CUDA worker (none is needed here),
/// prints it on standard output (per subgroup, one letter: c CPU, s streamed, r resident), and, with
/// rates, its simulated time per resource (models/phase_sim.h) and the lower bound. Returns the same
/// as JSON for --report. Throws std::runtime_error when the policy is not a plan (a StarPU policy
/// has no plan before it runs), when the plan needs rates and none were given, or when the budgets
/// or the plan refuse (the message says why).
nlohmann::ordered_json show_plan(PlanOnly& p);

/// --plan-only: the plan the first iteration of this rank's shard (--plan-phase later: a later one)
/// would carry out, without a runtime or buffers. Prints a line naming the run, then show_plan's,
/// and writes show_plan's JSON with the run's facts to --report when given. a: the options (after
/// the job has set --shard); c: check_options(a); model: the model's name; numels: the elements of
/// each tensor (or part of one) in this rank's shard, in the model's order; total: the model's
/// parameters (all shards); subgroup: elements per subgroup. Returns the exit status, 0. Throws what
/// show_plan throws, std::invalid_argument from dos::partition_subgroups, and std::runtime_error
/// when the report cannot be written.
int run_plan_only(const Args& a, const Checked& c, const std::string& model, const std::vector<std::size_t>& numels,
                  std::size_t total, std::size_t subgroup);

}  // namespace dos_train
