// dos-train's command line (options.h): CLI11's option definitions and help text, the parsers of
// the options' values and the checks made before any work.
#include "options.h"

#include <CLI/CLI.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

#include "atomic_file.h"
#include "checkpoint.h"
#include "cpu_team.h"
#include "model_config.h"
#include "number_text.h"
#include "plan.h"
#include "plan_only.h"
#include "policy.h"

namespace dos_train {

using dos::DType;

void fail(const std::string& msg) { throw std::runtime_error(msg); }

std::size_t parse_count(const std::string& s, const char* what) {
  // Accepts "16777216", "1e8", "1.6e7"; the value must be a whole number >= 1.
  double v = 0;
  if (!dos::parse_decimal(s, &v)) fail(std::string(what) + " must be a number of elements, got '" + s + "'");
  if (v < 1) fail(std::string(what) + " must be at least 1 element, got " + s);
  if (v > 9e15) fail(std::string(what) + " must be at most 9e15 elements, got " + s);
  if (v != std::floor(v)) fail(std::string(what) + " must be a whole number of elements, got " + s);
  return std::size_t(v);
}

/// --seed: a whole number in [0, 2^64 - 1] written in decimal digits; fails quoting what was given.
std::uint64_t parse_seed(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || !std::isdigit((unsigned char)s[0]) || *end != '\0' || errno == ERANGE)
    fail("--seed must be a whole number in [0, 18446744073709551615], got '" + s + "'");
  return std::uint64_t(v);
}

std::string resolved_path(const std::string& p) {
  std::error_code ec;
  const std::filesystem::path r = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
  if (!ec) return r.lexically_normal().string();
  const std::filesystem::path a = std::filesystem::absolute(p, ec);  // a part could not be read: lexically
  return ec ? p : a.lexically_normal().string();
}

namespace {

/// True when x and y name one file: the same spelling, the same resolved path, or the same inode.
bool same_file(const std::string& x, const std::string& y) {
  struct stat sx, sy;
  const bool same_inode =
      ::stat(x.c_str(), &sx) == 0 && ::stat(y.c_str(), &sy) == 0 && sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
  return x == y || same_inode || resolved_path(x) == resolved_path(y);
}

/// True when `path` is the folder `dir` or lies inside it (both resolved).
bool inside(const std::string& path, const std::string& dir) {
  const std::string r = resolved_path(path), d = resolved_path(dir);
  return r == d || r.compare(0, d.size() + 1, d + "/") == 0;
}

}  // namespace

void check_distinct_outputs(const Args& a) {
  const std::pair<const char*, const std::string*> outs[] = {
      {"--report", &a.report}, {"--save-params", &a.save_params}, {"--timeline", &a.timeline}};
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = i + 1; j < 3; ++j) {
      const std::string &x = *outs[i].second, &y = *outs[j].second;
      if (!x.empty() && !y.empty() && same_file(x, y))
        fail(std::string(outs[i].first) + " " + x + " and " + outs[j].first + " " + y +
             " name the same file: give each output its own file");
    }
  // the inputs a run reads: an output over one of them would destroy it (--rates only when it names
  // a file, as parse_rates reads it, not six numbers)
  const bool rates_file = !a.rates.empty() && std::filesystem::is_regular_file(a.rates);
  const std::pair<const char*, const std::string*> ins[] = {{"--config", &a.config},
                                                            {"--rates", rates_file ? &a.rates : nullptr}};
  for (const auto& [opt, path] : outs) {
    if (path->empty()) continue;
    for (const auto& [in_opt, in_path] : ins)
      if (in_path && !in_path->empty() && same_file(*path, *in_path))
        fail(std::string(opt) + " " + *path + " is the file " + in_opt + " reads: write it to a file of its own");
    if (!a.resume.empty() && inside(*path, a.resume))
      fail(std::string(opt) + " " + *path + " lies in the checkpoint folder " + a.resume +
           " that --resume reads, and would overwrite a part of it: write it outside that folder");
    if (!a.save_state.empty() && inside(*path, a.save_state))
      fail(std::string(opt) + " " + *path + " lies in the checkpoint folder " + a.save_state +
           ", which --save-state replaces as a whole at the end: write it outside that folder");
  }
  if (!a.save_state.empty())
    for (const auto& [in_opt, in_path] : ins)
      if (in_path && !in_path->empty() && inside(*in_path, a.save_state))
        fail(std::string(in_opt) + " " + *in_path + " lies in the checkpoint folder " + a.save_state +
             ", which --save-state replaces as a whole at the end: keep it outside that folder");
}

void parse_shard(const std::string& s, std::size_t* rank, std::size_t* world) {
  const auto slash = s.find('/');
  char *e1 = nullptr, *e2 = nullptr;
  if (slash == std::string::npos) fail("--shard must look like R/W (rank R of W ranks, e.g. 0/4), got '" + s + "'");
  const std::string r = s.substr(0, slash), w = s.substr(slash + 1);
  errno = 0;
  const long long rv = std::strtoll(r.c_str(), &e1, 10), wv = std::strtoll(w.c_str(), &e2, 10);
  if (errno == ERANGE) fail("--shard " + s + ": a number beyond 2^63 - 1: give R/W with 0 <= R < W");
  const auto digits = [](const std::string& t) {
    return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(r) || !digits(w) || *e1 || *e2 || rv < 0 || wv < 1)
    fail("--shard must look like R/W with 0 <= R < W, got '" + s + "'");
  if (rv >= wv) fail("--shard " + s + ": rank " + r + " is out of range for " + w + " ranks (0.." + std::to_string(wv - 1) + ")");
  *rank = std::size_t(rv);
  *world = std::size_t(wv);
}

/// A byte count: a number with an optional unit (B, KB, MB, GB, TB in powers of 1000; KiB, MiB,
/// GiB, TiB in powers of 1024): "40GB", "31.5GB", "4e10", "10GiB". A number without a unit counts
/// bytes and must be whole, as must one in B ("1.5" and "1.5B" are refused: 1.5 bytes is most likely
/// 1.5 GB meant); with a larger unit the size is rounded to whole bytes. The number is a plain
/// decimal (dos::is_decimal_number: no blanks, no hexadecimal), read as under the C locale. Fails
/// naming the option: a malformed or negative size (-0 is 0), one beyond what a double holds (1e400,
/// 1e-400), one beyond 9e18 bytes, one in bytes that is not whole, one above 0 that rounds to 0
/// bytes (1e-12GB).
std::size_t parse_bytes(const std::string& s, const char* what) {
  static const std::pair<const char*, double> units[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}, {"", 1}};
  // the number is what is left before the longest unit the text ends with ("5KB": 5 and KB, not 5K and B)
  std::string number;
  double mult = -1;
  for (const auto& [unit, m] : units) {
    const std::size_t n = std::char_traits<char>::length(unit);
    if (s.size() >= n && s.compare(s.size() - n, n, unit) == 0 && dos::is_decimal_number(s.substr(0, s.size() - n))) {
      number = s.substr(0, s.size() - n);
      mult = m;
      break;
    }
  }
  double v = 0;
  if (mult < 0)
    fail(std::string(what) + " must be a size in bytes such as 40GB, 31.5GB, 4e10 or 10GiB, got '" + s + "'");
  const bool parsed = dos::parse_decimal(number, &v);
  if (v < 0 || (!parsed && number[0] == '-'))  // -0 is 0
    fail(std::string(what) + " must be a size in bytes such as 40GB, 31.5GB, 4e10 or 10GiB, got '" + s + "' (negative)");
  if (!parsed)
    fail(std::string(what) + " " + s + " is beyond what a double holds, too large or too small: give 0 or a size from "
         "1 byte to 9e18 bytes (9e9GB), such as 40GB");
  if (v * mult > 9e18)
    fail(std::string(what) + " " + s + " is beyond the largest size taken, 9e18 bytes (9e9GB): give a smaller one");
  if (mult == 1 && v != std::floor(v))
    fail(std::string(what) + " " + s + " is not a whole number of bytes (a number without a unit, or in B, counts "
         "bytes): give a larger unit, such as " + number + "GB, or whole bytes");
  if (v > 0 && std::llround(v * mult) == 0)
    fail(std::string(what) + " " + s + " is less than one byte, which would be taken as 0: give 0 or a size of at "
         "least 1 byte");
  return std::size_t(std::llround(v * mult));
}

double parse_fraction(const std::string& s, const char* what) {
  // "0.5", "1/3"
  const auto slash = s.find('/');
  double v = 0;
  if (slash == std::string::npos) {
    if (!dos::parse_decimal(s, &v))
      fail(std::string(what) + ": '" + s + "' is not a number (or beyond what a double holds)");
  } else {
    double x = 0, y = 0;
    if (!dos::parse_decimal(s.substr(0, slash), &x) || !dos::parse_decimal(s.substr(slash + 1), &y) || y == 0)
      fail(std::string(what) + ": '" + s + "' is not a fraction like 1/3");
    v = x / y;
  }
  return v;
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::fp32;
  if (s == "fp16") return DType::fp16;
  if (s == "bf16") return DType::bf16;
  fail("--dtype must be fp32, fp16 or bf16, got '" + s + "'");
}

Checked check_options(const Args& a) {
  Checked c;
  c.dtype = parse_dtype(a.dtype);
  if (a.iterations < 1) fail("--iterations must be at least 1, got " + std::to_string(a.iterations));
  if (a.optimizer != "adam" && a.optimizer != "adamw") fail("--optimizer must be adam or adamw, got '" + a.optimizer + "'");
  if (a.device != "auto" && a.device != "host" && a.device != "cuda")
    fail("--device must be auto, host or cuda, got '" + a.device + "'");
  dos::AdamHyper& hyper = c.hyper;
  hyper.lr = a.lr;
  hyper.beta1 = a.beta1;
  hyper.beta2 = a.beta2;
  hyper.eps = a.eps;
  hyper.weight_decay = a.weight_decay;
  hyper.decoupled = a.optimizer == "adamw";
  dos::validate_adam_hyper(hyper);
  if (hyper.decoupled && a.lr * a.weight_decay >= 1)
    std::fprintf(stderr, "dos-train: warning: --lr x --weight-decay = %g: each AdamW step multiplies the parameters by "
                 "(1 - %g), which does not decay them (they flip sign or grow); a usual product is below 1e-3\n",
                 a.lr * a.weight_decay, a.lr * a.weight_decay);
  if (a.lr > 1)
    std::fprintf(stderr, "dos-train: warning: --lr %g is unusually large (Adam moves each parameter by about lr "
                 "per step; usual values are 1e-5 to 1e-2)\n", a.lr);
  if (!a.k.empty() && !a.gpu_fraction.empty()) fail("give --k or --gpu-fraction, not both");
  if (!a.sweep.empty() && (!a.k.empty() || !a.gpu_fraction.empty()))
    fail("--sweep sets the streamed fraction of each of its runs: leave out --k and --gpu-fraction");
  if (!a.k.empty()) {
    const double k = parse_fraction(a.k, "--k");
    if (!(k >= 1 && k <= 1e9 && k == std::floor(k))) fail("--k must be a whole number >= 1, got " + a.k);
  }
  if (!a.gpu_fraction.empty()) {
    const double f = parse_fraction(a.gpu_fraction, "--gpu-fraction");
    if (!(f >= 0 && f <= 1)) fail("--gpu-fraction must be in [0, 1], got " + a.gpu_fraction);
  }
  for (const std::string& e : a.sweep)
    if (e.empty()) {
      fail("--sweep: an empty entry in '" + a.sweep_text + "': give fractions separated by single commas, such as 0,0.5,1");
    } else if (e != "model") {
      const double f = parse_fraction(e, "--sweep");
      if (!(f >= 0 && f <= 1)) fail("--sweep: each fraction must be in [0, 1] (or 'model'), got " + e);
    }
  const std::string policy = dos::resolve_policy(a.policy);  // the one the runtime will run
  if ((!a.k.empty() || !a.gpu_fraction.empty() || !a.sweep.empty()) && policy != "dos")
    fail("--k, --gpu-fraction and --sweep need --policy dos, got " + policy);
  if (a.plan_only && (!a.k.empty() || !a.gpu_fraction.empty() || !a.sweep.empty()))
    fail("--plan-only shows the plan's own choice: leave out --k, --gpu-fraction and --sweep");
  if (a.plan_only && (!a.timeline.empty() || !a.save_params.empty() || !a.save_state.empty() || !a.resume.empty()))
    fail("--plan-only runs no update phase, so it has no timeline, parameters or optimizer state to write or "
         "read: leave out --timeline, --save-params, --save-state and --resume (--report writes the plan)");
  if (!a.rates.empty() && a.recalibrate)
    fail("--recalibrate measures the model's rates, --rates gives them: leave out one of the two");
  if (!a.rates.empty()) c.rates = parse_rates(a.rates, &c.calibrated, &c.rates_from_file);
  if ((!a.rates.empty() || a.recalibrate) && !a.plan_only) {
    // the model's rates are read only by the plans that need them; a policy known to be without
    // them is said so (an unknown one is refused when the runtime starts)
    bool needs_rates = true;
    try {
      const dos::PolicyChoice choice = dos::parse_policy(policy);
      needs_rates = choice.plan && choice.plan->needs().rates;
    } catch (const std::invalid_argument&) {
    }
    if (!needs_rates)
      std::fprintf(stderr, "dos-train: warning: policy %s plans without the model's rates: %s changes nothing "
                           "(the plans with rates: dos, static:R, greedy)\n",
                   policy.c_str(), a.rates.empty() ? "--recalibrate" : "--rates");
  }
  if (a.cpu_threads < 0) fail("--cpu-threads must be >= 0 (0: automatic), got " + std::to_string(a.cpu_threads));
  if (const std::size_t cores = dos::allowed_cores().size(); cores > 0 && std::size_t(a.cpu_threads) > cores)
    fail("--cpu-threads " + std::to_string(a.cpu_threads) + " is more than the " + std::to_string(cores) +
         " cores this process may use: give at most " + std::to_string(cores) + " (0: automatic)");
  if (a.cpu_workers < 0) fail("--cpu-workers must be >= 0 (0: automatic), got " + std::to_string(a.cpu_workers));
  c.resident_budget =
      a.gpu_resident_budget.empty() ? -1 : std::int64_t(parse_bytes(a.gpu_resident_budget, "--gpu-resident-budget"));
  c.update_budget = a.gpu_update_budget.empty() ? 0 : parse_bytes(a.gpu_update_budget, "--gpu-update-budget");
  if (policy == "cpu" && (c.resident_budget > 0 || c.update_budget > 0))
    std::fprintf(stderr, "dos-train: warning: --policy cpu updates every subgroup on the CPU: %s changes nothing\n",
                 c.resident_budget > 0 ? "--gpu-resident-budget" : "--gpu-update-budget");
  if (!a.gpu_update_budget.empty() && c.update_budget == 0)
    fail("--gpu-update-budget must be more than 0 bytes (leave it out for no limit)");
  if (a.overlap != "auto" && a.overlap != "on" && a.overlap != "off")
    fail("--overlap must be auto, on or off, got '" + a.overlap + "'");
  if (a.master != "full" && a.master != "compact") fail("--master must be full or compact, got '" + a.master + "'");
  c.compact_master = a.master == "compact";
  if (c.compact_master && c.dtype != dos::DType::bf16)
    fail(std::string("--master compact needs bf16 parameters (each master is rebuilt from its bf16 rounding), got "
                     "--dtype ") + dos::dtype_name(c.dtype) + ": use --dtype bf16 or --master full");
  // auto: on where there is a backward to overlap, and not in a sweep (whose rows compare update
  // phases)
  c.overlap = a.overlap == "on" || (a.overlap == "auto" && a.emulate_compute && a.sweep.empty());
  if (a.tail_subgroups == "auto") {
    // the binder acts only in phases run after backward (OptimizerOptions::tail_subgroups)
    const bool own_plan =
        policy == "dos" && a.k.empty() && a.gpu_fraction.empty() && a.sweep.empty() && !c.overlap;
    c.tail_subgroups = own_plan ? kAutoTailSubgroups : 0;
  } else {
    const std::string& t = a.tail_subgroups;
    // at most 7 digits, so that std::stoul neither throws nor wraps
    const bool digits = !t.empty() && t.size() <= 7 && t.find_first_not_of("0123456789") == std::string::npos;
    c.tail_subgroups = digits ? std::stoul(t) : 0;
    if (!digits || c.tail_subgroups > 1000000)
      fail("--tail-subgroups must be auto or a whole number in [0, 1000000], got '" + t + "'");
    if (c.tail_subgroups > 0 && policy != "dos" && policy.rfind("static:", 0) != 0)
      fail("--tail-subgroups binds the tail of a model's plan: it needs --policy dos or static:R, got --policy " +
           policy);
    if (c.tail_subgroups > 0 && c.overlap)
      fail("--tail-subgroups binds the plan's tail in update phases that run after backward; with the update "
           "overlapped (--overlap on, the default with --emulate-compute) nothing would be bound: add --overlap "
           "off, or leave --tail-subgroups out");
  }
  if (a.stream_lookahead < 0 || a.stream_lookahead > 1000)
    fail("--stream-lookahead must be in [0, 1000], got " + std::to_string(a.stream_lookahead));
  if (a.grad_transfer != "fp32" && a.grad_transfer != "native")
    fail("--grad-transfer must be fp32 or native, got '" + a.grad_transfer + "'");
  if (!a.copy_by.empty() && std::none_of(std::begin(dos::kCopyByValues), std::end(dos::kCopyByValues),
                                         [&](const char* k) { return a.copy_by == k; }))
    fail("--copy-by must be adaptive, memcpy-down, auto, kernel, memcpy or memcpy-up, got '" + a.copy_by + "'");
  if (a.writeback != "eager" && a.writeback != "end") fail("--writeback must be eager or end, got '" + a.writeback + "'");
  if (c.update_budget > 0 && a.writeback != "eager") fail("--gpu-update-budget needs --writeback eager");
  if (a.tokens < 1) fail("--tokens must be at least 1, got " + std::to_string(a.tokens));
  if (a.cpu_scale < 1) fail("--cpu-scale must be at least 1, got " + std::to_string(a.cpu_scale));
  if (!(a.max_grad_norm >= 0) || !std::isfinite(a.max_grad_norm))
    fail("--max-grad-norm must be a finite number > 0 (or 0: no clipping), got " + std::to_string(a.max_grad_norm));
  if (a.nan_gradient_at < 0) fail("--nan-gradient-at must be an iteration number >= 1 (0: none), got " +
                                  std::to_string(a.nan_gradient_at));
  if (a.speculate_streamed != "on" && a.speculate_streamed != "off")
    fail("--speculate-streamed must be on or off, got '" + a.speculate_streamed + "'");
  if (!a.speculation_budget.empty())
    c.speculation_budget = std::int64_t(parse_bytes(a.speculation_budget, "--speculation-budget"));
  if (!a.timeline.empty()) dos::check_writable(a.timeline);
  if (a.comm != "auto" && a.comm != "mpi" && a.comm != "nccl")
    fail("--comm must be auto, mpi or nccl, got '" + a.comm + "'");
  if (a.ncuda < -1) fail("--ncuda must be >= -1 (-1: one per GPU), got " + std::to_string(a.ncuda));
  if (!a.report.empty() && a.report == a.save_params) fail("--report and --save-params name the same file: " + a.report);
  if (!a.timeline.empty() && (a.timeline == a.report || a.timeline == a.save_params))
    fail("--timeline names the same file as --" + std::string(a.timeline == a.report ? "report" : "save-params") + ": " +
         a.timeline);
  if (!a.save_state.empty()) dos::check_checkpoint_dir(a.save_state);
  check_distinct_outputs(a);
  if (!a.report.empty()) dos::check_writable(a.report);
  if (!a.save_params.empty()) dos::check_writable(a.save_params);
  return c;
}

int parse_command_line(int argc, char** argv, Args& a) {
  CLI::App app{
      "dos-train: runs training iterations of a transformer's optimizer update phase on the Deep Optimizer "
      "States runtime. Forward and backward are emulated: deterministic gradients from --seed (normal, std 1e-3) "
      "are written into the model's gradient buffers (GPU memory when there is a CUDA worker). Prints one line per "
      "iteration and a summary."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later option wins
  std::string presets;
  for (const auto& p : dos_train::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  app.add_option("--preset", a.preset, "model preset: " + presets)->capture_default_str();
  app.add_option("--config", a.config, "Hugging Face config.json of the model (overrides --preset)");
  app.add_option("--iterations,-n", a.iterations, "training iterations to run (>= 1)")->capture_default_str();
  app.add_option("--subgroup-size", a.subgroup_size, "elements per subgroup (>= 1; 1e8 notation accepted)")->capture_default_str();
  std::string plans;
  for (const dos::PlanEntry& e : dos::plan_registry()) plans += std::string(plans.empty() ? "" : "; ") + e.usage + ": " + e.summary;
  std::string starpu_policies;
  for (const auto* p : dos::registered_starpu_policies()) starpu_policies += std::string(", ") + p->policy_name;
  app.add_option("--policy", a.policy,
                 "scheduling policy: a plan (" + plans + "), or a StarPU policy that places the tasks itself (dmda, "
                 "dmdas, eager, lws, ..." + starpu_policies + "). Default: $STARPU_SCHED if set, else cpu");
  app.add_option("--dtype", a.dtype, "dtype of the model's parameters and gradients: bf16, fp16, fp32")->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "adamw (torch.optim.AdamW) or adam (torch.optim.Adam, L2 decay)")->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate")->capture_default_str();
  app.add_option("--beta1", a.beta1, "Adam beta1, in [0, 1)")->capture_default_str();
  app.add_option("--beta2", a.beta2, "Adam beta2, in [0, 1)")->capture_default_str();
  app.add_option("--eps", a.eps, "Adam eps (>= 0)")->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "weight decay (>= 0)")->capture_default_str();
  app.add_option("--seed", a.seed_text, "seed of the initial parameters and the emulated gradients (0 to 2^64-1)")
      ->capture_default_str();
  app.add_option("--shard", a.shard, "R/W: run rank R's 1/W of the parameters (ZeRO partitioning of the flat parameters)")
      ->capture_default_str();
  app.add_option("--device", a.device, "where the model's parameters and gradients live: auto (GPU if any), host, cuda")
      ->capture_default_str();
  app.add_option("--report", a.report, "write the per-iteration figures and the summary to this JSON file");
  app.add_option("--save-params", a.save_params, "write the final fp32 master parameters to this safetensors file");
  app.add_option("--cpu-threads", a.cpu_threads,
                 "cores for CPU Adam, shared among the CPU workers' OpenMP teams (0: $OMP_NUM_THREADS, else all "
                 "cores but one per CUDA worker)")
      ->capture_default_str();
  app.add_option("--cpu-workers", a.cpu_workers,
                 "StarPU CPU workers (0: $STARPU_NCPU if set, else 1 worker running an OpenMP team; N: N workers "
                 "sharing the --cpu-threads cores, subgroups spread over them)")
      ->capture_default_str();
  app.add_option("--ncuda", a.ncuda, "CUDA workers (-1: one per GPU, 0: none)")->capture_default_str();
  app.add_flag("--quiet,-q", a.quiet,
               "run the runtime without its verbose lines on stderr: its set-up line, its notes (that a model policy "
               "runs every update on the CPU where there is no CUDA worker, the calibration's readings) and most of "
               "its warnings; the per-iteration lines, the summary and errors still print");
  app.add_option("--k", a.k, "with --policy dos: force the paper's stride k (one subgroup in k streamed: k-1, 2k-1, ...)");
  app.add_option("--gpu-fraction", a.gpu_fraction,
                 "with --policy dos: force this fraction of the subgroups (0..1, or a/b) to be streamed through the GPU, "
                 "spread evenly");
  app.add_option("--sweep", a.sweep_text,
                 "with --policy dos: run --iterations iterations for each streamed fraction given (0..1 or a/b; "
                 "'model' for the model's own choice; comma-separated), in this one process, and print a table (not with --k or "
                 "--gpu-fraction)");
  app.add_option("--save-state", a.save_state,
                 "after the last iteration, write the whole optimizer state (fp32 master, exp_avg, exp_avg_sq, step "
                 "per subgroup) to this folder (safetensors + index.json; the previous checkpoint stays intact until "
                 "the new one is complete)");
  app.add_option("--resume", a.resume,
                 "start from the checkpoint in this folder (same model, --subgroup-size, --dtype, --seed and "
                 "--grad-parts; any number of ranks: the state is re-sharded): the run continues exactly as if it "
                 "had not stopped");
  app.add_option("--gpu-resident-budget", a.gpu_resident_budget,
                 "GPU memory the optimizer state may keep between iterations (e.g. 10GB or 10GiB; a number without "
                 "a unit counts bytes; default: none kept, pure offload). dos keeps the last subgroups that fit "
                 "resident; static:R must fit its GPU share in it");
  app.add_option("--gpu-update-budget", a.gpu_update_budget,
                 "GPU memory the update phase may use at once (e.g. 40GB; a number without a unit counts bytes; "
                 "default: no limit); StarPU's GPU memory is "
                 "capped at the two budgets together, the rest is left to forward and backward");
  app.add_option("--stream-lookahead", a.stream_lookahead,
                 "streamed subgroups whose state is prefetched ahead (0: StarPU's prefetch when a task is pushed)")
      ->capture_default_str();
  app.add_option("--tail-subgroups", a.tail_subgroups,
                 "late binding: the plan's last N CPU or streamed subgroups go, one by one while the phase runs, to "
                 "the side projected to end first at the pace each kept in the phase (0: the plan as made; the same "
                 "bits either way); auto: " + std::to_string(kAutoTailSubgroups) + " with --policy dos when the model "
                 "chooses the split (no --k, --gpu-fraction or --sweep) and the update runs after backward "
                 "(--overlap off), else 0; N > 0 with the update overlapped is refused (nothing would be bound)")
      ->capture_default_str();
  app.add_option("--writeback", a.writeback,
                 "eager: each streamed subgroup's state goes home as soon as it is updated; end: all at the end of the "
                 "phase")->capture_default_str();
  app.add_option("--grad-transfer", a.grad_transfer,
                 "how the gradients of CPU-updated subgroups cross PCIe: fp32 (converted on the GPU) or native (in "
                 "the model's dtype, widened by the CPU's Adam kernel: half the bytes for bf16/fp16)")
      ->capture_default_str();
  app.add_option("--master", a.master,
                 "how the optimizer keeps its fp32 master parameters: full (4 bytes each) or compact (bf16 only: "
                 "the low 16 bits and one rounding bit beside the model's parameter, 10.125 bytes of streamed state "
                 "per parameter instead of 12; the same bits; with --overlap on only the CPU's subgroups are updated "
                 "speculatively during backward, the streamed ones after it)")
      ->capture_default_str();
  app.add_option("--copy-by", a.copy_by,
                 "how the runtime's own copies of CPU-updated subgroups between the model's GPU tensors and host "
                 "staging go (DOS_COPY_BY, which it replaces for this run): adaptive (the default) as memcpy-down "
                 "until a gradient download by the copy engine starves (more than 100 ms and 10 times its bytes at "
                 "the model's PCIe rate, the CPU idle more than 10% of a phase run after backward, not the first "
                 "that streams), then as auto; memcpy-down the gradients down by cudaMemcpyAsync and the parameters up "
                 "by a kernel through mapped memory; auto as memcpy-down, but a gradient download issued while "
                 "streamed state is on its way home goes by the kernel (by the copy engine it may wait behind those "
                 "write-backs); kernel, memcpy and memcpy-up (measurement "
                 "switches) both by the kernel, both by cudaMemcpyAsync, or only the uploads by cudaMemcpyAsync; the "
                 "same bits every way");
  app.add_flag("--urgent-writeback", a.urgent_writeback,
               "push the CPU-updated subgroups' parameter write-back tasks ahead of the queued GPU work; only with "
               "--device host or DOS_PARAM_UPLOAD=task (otherwise the runtime copies those parameters to the GPU "
               "itself, with no task); measured slower on the GPU machine: for experiments, see README");
  app.add_option("--submit-order", a.submit_order,
                 "plan: the subgroups' tasks are submitted in subgroup order; cpu-first: the CPU-updated ones "
                 "before the streamed ones (when the GPU update budget holds both). Same results either way")
      ->check(CLI::IsMember({"cpu-first", "plan"}))
      ->capture_default_str();
  app.add_option("--timeline", a.timeline,
                 "write the last iteration's tasks (per worker) and PCIe byte samples to this JSON file");
  app.add_option("--grad-parts", a.grad_parts,
                 "the emulated gradient is the sum of this many data-parallel ranks' contributions (quantised so that "
                 "the sum is exact): a one-process run with --grad-parts W gives the bits of a W-rank MPI job; under "
                 "MPI (default: the number of ranks) rank r adds parts [r*P/W, (r+1)*P/W)");
  app.add_option("--comm", a.comm,
                 "the data-parallel collectives under MPI: nccl (GPU buffers, GPU to GPU), mpi (through host memory), "
                 "auto (nccl when every rank's buffers are on a GPU and the build has NCCL)")
      ->capture_default_str();
  app.add_flag("--emulate-compute", a.emulate_compute,
               "emulate forward and backward with the model's GEMMs (cuBLAS; a scaled-down CPU stand-in without a "
               "GPU), activations allocated in forward and freed in backward; reports forward, backward, iteration "
               "seconds, peak GPU memory and model TFLOPs");
  app.add_option("--tokens", a.tokens, "tokens per iteration for --emulate-compute (micro-batch x sequence)")
      ->capture_default_str();
  app.add_option("--cpu-scale", a.cpu_scale, "--emulate-compute without a GPU: divide every dimension by this")
      ->capture_default_str();
  app.add_option("--overlap", a.overlap,
                 "on: the update overlaps backward: each layer's gradients are declared final as its backward ends "
                 "and the subgroups whose gradients are complete are updated at once, speculatively, then kept, redone "
                 "(clipping changed the gradients) or dropped (a non-finite gradient) when every gradient is final; "
                 "the same bits as off, where the update starts after backward; auto: on with --emulate-compute "
                 "and without --sweep (without a backward there is nothing to overlap, and a sweep compares update "
                 "phases). When on, the automatic --cpu-threads leaves one core to the thread that runs backward")
      ->capture_default_str();
  app.add_option("--max-grad-norm", a.max_grad_norm,
                 "clip the gradients to this global L2 norm as torch.nn.utils.clip_grad_norm_ does (coefficient "
                 "max_norm / (norm + 1e-6) when below 1), and skip the update of an iteration whose gradients hold an "
                 "inf or NaN; 0: neither (default)");
  app.add_option("--nan-gradient-at", a.nan_gradient_at,
                 "test aid: the first gradient element of this rank's shard is NaN at this iteration (with "
                 "--max-grad-norm the iteration's update is skipped); 0: never");
  app.add_option("--speculation-budget", a.speculation_budget,
                 "host memory for the shadow state of speculative updates (--overlap on), e.g. 20GB; default: half of "
                 "the memory available when the first speculative update comes; 0: no speculative update");
  app.add_option("--speculate-streamed", a.speculate_streamed,
                 "with --overlap on: the subgroups the plan streams are updated speculatively too, on the GPU, while "
                 "backward runs (their state crosses PCIe then); off: only the CPU's subgroups")
      ->capture_default_str();
  CLI::Option* plan_only = app.add_flag(
      "--plan-only", a.plan_only,
      "print the plan of --policy for the first iteration (--plan-phase later: a later one; one letter per "
      "subgroup), its simulated time and "
      "the lower bound with --rates, and exit: no StarPU, no GPU needed. The caller's buffers are taken to be "
      "on the GPU unless --device host; the GPU budgets, --submit-order, --stream-lookahead and --grad-transfer "
      "count");
  app.add_option("--plan-phase", a.plan_phase,
                 "with --plan-only: the phase to plan and simulate: first (no state on the GPU yet: the resident "
                 "subgroups' state comes up in it) or later (every phase after the first: the resident state is "
                 "already on the GPU)")
      ->check(CLI::IsMember({"first", "later"}))
      ->needs(plan_only)
      ->capture_default_str();
  app.add_option("--rates", a.rates,
                 "the model's rates instead of calibrating: U_c,U_c_dma,U_g,D_c,B_h2d,B_d2h in Gparams/s (4) and GB/s "
                 "(2), as the 'model:' line prints them, optionally followed by link_share (1 when not given; 1 counts as unmeasured, so the first phase's measure replaces it, where another value is blended half way), or the path of a rates file (the calibration cache's JSON, "
                 "params/s and bytes/s; started from as the cache is: a link_share equal to its calibration's counts as "
                 "unmeasured)")
      ->check([](const std::string& s) {
        return s.empty() ? std::string("empty: give six (or seven) numbers or a rates file's path, or leave "
                                       "it out to calibrate")
                         : std::string();
      });
  app.add_flag("--recalibrate", a.recalibrate,
               "with --policy dos or static:R: measure the model's rates again instead of reading the cached ones");
  // the options CLI11 converts to numbers itself take plain decimals, as the ones parsed here do
  // (its conversion reads blanks before a number and hexadecimal)
  for (const char* name : {"--iterations", "--lr", "--beta1", "--beta2", "--eps", "--weight-decay", "--cpu-threads",
                           "--cpu-workers", "--ncuda", "--stream-lookahead", "--grad-parts", "--tokens", "--cpu-scale",
                           "--max-grad-norm", "--nan-gradient-at"})
    app.get_option(name)->check(CLI::Validator(
        [](std::string& s) {
          return dos::is_decimal_number(s) ? std::string()
                                           : "'" + s + "' is not a decimal number (such as 3, 0.5 or 1e-4)";
        },
        ""));
  // An empty value would read as the option left out (a value) or fail later (a path): refuse it
  // here rather than drop it silently.
  struct Valued {
    const char* opt;
    const std::string* value;
    const char* left_out;  // what leaving the option out gives; nullptr: the option takes a path
  };
  const Valued values[] = {{"--policy", &a.policy, "$STARPU_SCHED, else cpu"},
                           {"--config", &a.config, nullptr},
                           {"--k", &a.k, "the policy's own plan"},
                           {"--gpu-fraction", &a.gpu_fraction, "the policy's own plan"},
                           {"--gpu-resident-budget", &a.gpu_resident_budget, "no resident state"},
                           {"--gpu-update-budget", &a.gpu_update_budget, "no limit but StarPU's"},
                           {"--speculation-budget", &a.speculation_budget, "the runtime's default"},
                           {"--copy-by", &a.copy_by, "DOS_COPY_BY's rule, else adaptive"},
                           {"--report", &a.report, nullptr},
                           {"--save-params", &a.save_params, nullptr},
                           {"--timeline", &a.timeline, nullptr},
                           {"--save-state", &a.save_state, nullptr},
                           {"--resume", &a.resume, nullptr}};
  const auto refuse_empty = [](const Valued& v) {
    if (v.left_out)
      std::fprintf(stderr, "dos-train: error: %s needs a value, got an empty one (leave %s out for %s)\n", v.opt, v.opt,
                   v.left_out);
    else
      std::fprintf(stderr, "dos-train: error: %s needs a path, got an empty one\n", v.opt);
    return 1;
  };
  // CLI11 reads "--k=" as a value left out, or takes the next argument (even "--help") for its
  // value: every option that takes a value, given as "--name=" with nothing after, is refused here
  // (the options above with their own message), and so is an option whose value is the next
  // argument when that argument begins with "--" ("--report --help" would write a report named
  // "--help", "--report --" one named "--") or is one of dos-train's short options, alone or
  // grouped ("-n", "-n2", "-qn1"). The walk skips each value as CLI11 takes it: the argument after
  // an option that takes a value given without '=', or after a group of short options ending in one.
  const auto option_named = [&](const std::string& name) -> const CLI::Option* {
    return name.size() >= 2 && name[0] == '-' ? app.get_option_no_throw(name) : nullptr;
  };
  const auto takes_value = [&](const std::string& name) {
    const CLI::Option* o = option_named(name);
    return o && o->get_items_expected_min() > 0;
  };
  // whether CLI11 takes the argument after `arg` for a value: a long option that takes one, or a
  // group of short options ("-qn") whose last takes one (one earlier in the group takes the rest)
  const auto takes_next = [&](const std::string& arg) {
    if (arg.size() < 2 || arg[0] != '-') return false;  // a positional argument: CLI11's to refuse
    if (arg.size() == 2 || arg[1] == '-') return takes_value(arg);
    for (std::size_t k = 1; k < arg.size(); ++k) {
      const CLI::Option* o = option_named(std::string("-") + arg[k]);
      if (!o) return false;
      if (o->get_items_expected_min() > 0) return k + 1 == arg.size();
    }
    return false;
  };
  const auto paths = [&](const std::string& name) {
    for (const Valued& v : values)
      if (name == v.opt) return v.left_out == nullptr;
    return false;
  };
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      if (takes_next(arg) && ++i < argc) {  // its value, whatever it looks like, unless an option
        const std::string next = argv[i];
        const bool dashes = next.compare(0, 2, "--") == 0;
        const CLI::Option* named = option_named(next.substr(0, dashes ? next.find('=') : 2));
        if (dashes || named) {
          // the option's long name, which CLI11 reads with '=' (it does not read "-n=VALUE"); of a
          // group of short options, the last one's
          const std::string own = arg.size() > 2 && arg[1] != '-' ? std::string("-") + arg.back() : arg;
          const CLI::Option* o = option_named(own);
          const std::string lname = o && !o->get_lnames().empty() ? "--" + o->get_lnames()[0] : own;
          const std::string what =
              named ? "is an option of dos-train" : "begins with '--', as an option does (none of dos-train's)";
          const std::string path = paths(lname) ? ", a path as ./" + next : "";
          std::fprintf(stderr, "dos-train: error: %s takes a value, and the argument after it, '%s', %s: give %s VALUE "
                       "(a value that begins with '-' as %s=VALUE%s)\n",
                       arg.c_str(), next.c_str(), what.c_str(), arg.c_str(), lname.c_str(), path.c_str());
          return 1;
        }
      }
      continue;
    }
    if (arg.size() < 4 || arg.compare(0, 2, "--") != 0 || eq != arg.size() - 1) continue;
    const std::string name = arg.substr(0, eq);
    for (const Valued& v : values)
      if (name == v.opt) return refuse_empty(v);
    if (takes_value(name)) {
      std::fprintf(stderr, "dos-train: error: %s needs a value, got an empty one ('%s'): give %s VALUE, or leave it out\n",
                   name.c_str(), arg.c_str(), name.c_str());
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (app.count("--sweep")) {  // split here: an empty entry must reach the checks, not vanish
    a.sweep.clear();
    for (std::size_t from = 0;;) {
      const std::size_t comma = a.sweep_text.find(',', from);
      a.sweep.push_back(a.sweep_text.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
  }
  for (const Valued& v : values)
    if (app.count(v.opt) && v.value->empty()) return refuse_empty(v);
  return -1;
}

}  // namespace dos_train
