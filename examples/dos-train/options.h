// dos-train's command line: the options (Args), their parsing and help text (parse_command_line),
// the parsers of their values, and the checks made before any work (check_options,
// check_distinct_outputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dos.h"

namespace dos_train {

/// Every option of dos-train as given on the command line (see parse_command_line for each one's
/// meaning, unit and default).
struct Args {
  std::string preset = "gpt2-124m";
  std::string config;
  int iterations = 5;
  std::string subgroup_size = "16777216";
  std::string policy;
  std::string dtype = "bf16";
  std::string optimizer = "adamw";
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  std::string seed_text = "0";  ///< --seed as given; parsed into seed (parse_seed)
  std::uint64_t seed = 0;
  std::string shard = "0/1";
  std::string device = "auto";
  std::string report;
  std::string save_params;
  int cpu_threads = 0;
  int cpu_workers = 0;
  int ncuda = -1;
  bool quiet = false;
  std::string k, gpu_fraction;
  std::string save_state, resume;
  std::string sweep_text;          ///< --sweep as given: comma-separated entries
  std::vector<std::string> sweep;  ///< --sweep's entries (split by validate; none may be empty)
  bool recalibrate = false;
  bool plan_only = false;
  std::string plan_phase = "first";  ///< --plan-phase: "first" or "later" (the phase --plan-only simulates)
  std::string rates;  ///< --rates as given: six numbers or a rates file (plan_only.h)
  std::string gpu_resident_budget, gpu_update_budget;
  int stream_lookahead = 3;
  std::string tail_subgroups = "auto";  ///< --tail-subgroups as given: "auto" or a count (Checked::tail_subgroups)
  std::string writeback = "eager";
  std::string grad_transfer = "native";
  std::string master = "full";  ///< --master: full (fp32 masters) or compact (OptimizerOptions::compact_master)
  std::string copy_by;  ///< --copy-by: "" (as DOS_COPY_BY says, else adaptive), adaptive, memcpy-down, auto, kernel, memcpy, memcpy-up
  bool urgent_writeback = false;
  std::string submit_order = "plan";
  std::string timeline;
  int grad_parts = 0;
  std::string comm = "auto";
  bool emulate_compute = false;
  long long tokens = 4096;
  int cpu_scale = 32;
  std::string overlap = "auto";   ///< --overlap: the update overlapped with backward (on), after it (off); auto: on with --emulate-compute
  double max_grad_norm = 0;       ///< --max-grad-norm: global-norm clipping; 0: none
  long long nan_gradient_at = 0;  ///< --nan-gradient-at: the iteration whose gradient gets a NaN; 0: none
  std::string speculation_budget; ///< --speculation-budget as given (bytes); empty: the runtime's default
  std::string speculate_streamed = "on";  ///< --speculate-streamed: streamed subgroups speculated on the GPU too
};

/// Parses the command line into `a` (CLI11; a later option wins over an earlier one). Returns -1
/// when the run should go on, else the exit status to end with at once: 0 after printing --help,
/// CLI11's status after its message for an unknown or malformed option, 1 after a message on stderr
/// for an empty --config or an empty output path. Values are checked later (check_options).
int parse_command_line(int argc, char** argv, Args& a);

/// Throws std::runtime_error(msg): how every check of dos-train reports a bad value.
[[noreturn]] void fail(const std::string& msg);

/// A number of elements: "16777216", "1e8", "1.6e7"; a whole number in [1, 9e15]. Throws
/// std::runtime_error naming the option `what` and quoting `s` otherwise.
std::size_t parse_count(const std::string& s, const char* what);

/// --seed: a whole number in [0, 2^64 - 1] written in decimal digits. Throws std::runtime_error
/// quoting `s` otherwise.
std::uint64_t parse_seed(const std::string& s);

/// --shard R/W: rank R of W ranks (0 <= R < W) into *rank and *world. Throws std::runtime_error
/// quoting `s` when it is not of that form or R is out of range.
void parse_shard(const std::string& s, std::size_t* rank, std::size_t* world);

/// A byte count: a number with an optional unit (B, KB, MB, GB, TB in powers of 1000; KiB, MiB,
/// GiB, TiB in powers of 1024): "40GB", "31.5GB", "4e10", "10GiB"; at most 9e18 bytes. Throws
/// std::runtime_error naming the option `what` otherwise.
std::size_t parse_bytes(const std::string& s, const char* what);

/// A number ("0.5") or a fraction ("1/3"), unchecked for range. Throws std::runtime_error naming
/// the option `what` when `s` is neither (or the denominator is 0).
double parse_fraction(const std::string& s, const char* what);

/// --dtype: fp32, fp16 or bf16. Throws std::runtime_error quoting `s` otherwise.
dos::DType parse_dtype(const std::string& s);

/// The option values that do not depend on the model or the job, parsed and checked
/// (check_options).
struct Checked {
  dos::DType dtype = dos::DType::bf16;
  dos::AdamHyper hyper;               ///< --lr, --beta1, --beta2, --eps, --weight-decay, --optimizer
  dos::Rates rates{}, calibrated{};   ///< --rates (zero when not given)
  bool rates_from_file = false;       ///< --rates names a rates file (its calibrated rates are its own)
  std::int64_t resident_budget = -1;  ///< --gpu-resident-budget, bytes; -1 when not given
  std::size_t update_budget = 0;      ///< --gpu-update-budget, bytes; 0 when not given (no limit)
  std::int64_t speculation_budget = -1;  ///< --speculation-budget, bytes; -1 when not given
  /// --tail-subgroups: OptimizerOptions::tail_subgroups. "auto" gives kAutoTailSubgroups with
  /// --policy dos, a plan of the model's own choosing (no --k, --gpu-fraction or --sweep) and the
  /// update after backward (overlap off), else 0.
  std::size_t tail_subgroups = 0;
  /// --overlap resolved: on, or auto with --emulate-compute and without --sweep (and not with --master
  /// compact, which has no speculative update).
  bool overlap = false;
  bool compact_master = false;  ///< --master compact
};

/// The subgroups --tail-subgroups auto leaves to late binding: measured on the GPU machine on the
/// 20B quarter (35 subgroups of 1.24e8), where 6 gave phases 1.8-7.2% shorter than the plan as made
/// while the model's first plans were unbalanced; since the refinement balances them (its first
/// link_share measure taken whole), within the spread of the plan as made either way (README).
inline constexpr std::size_t kAutoTailSubgroups = 6;

/// Checks every option that does not depend on the model or the MPI job, in a fixed order (the
/// first problem is the one reported), prints warnings for unusual hyper-parameters on stderr,
/// and checks that the output files can be written (without writing them). Throws
/// std::runtime_error (or dos::Error from the runtime's own checks) naming the option at fault.
Checked check_options(const Args& a);

/// Throws std::runtime_error, before the run, when two of the output paths (--report,
/// --save-params, --timeline) name one file (the same path spelled two ways, or hard links to one
/// file: device and inode compared), when one of them names an input (--config, a --rates file) or
/// lies inside the checkpoint folder that --resume reads or the one --save-state replaces, or when
/// an input lies inside the --save-state folder.
void check_distinct_outputs(const Args& a);

/// The absolute path of `p` with symbolic links and ".." resolved as far as it exists (the rest
/// appended), so that two spellings of one path give the same string; where a part cannot be read,
/// the absolute path normalised lexically; `p` itself when even that fails. Throws nothing.
std::string resolved_path(const std::string& p);

}  // namespace dos_train
