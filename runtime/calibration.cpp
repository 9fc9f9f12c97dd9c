// Calibration of the resource model's rates with the real codelets and task graph (see
// calibrate_rates in dos.h), and its cache.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../codelets/kernels/env_choice.h"
#include "atomic_file.h"
#include "device_memory.h"
#if defined(DOS_HAVE_CUDA)
#include "../codelets/dma_loop.h"
#endif
#include "dos.h"
#include "link_calibration.h"
#include "optimizer_impl.h"
#include "rates_json.h"

#include <starpu.h>

namespace dos {
namespace {

/// The median of `v` (not empty): the middle value, or the mean of the two middle ones for an even
/// count; in v's unit.
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

std::string cache_dir() {
  if (const char* d = std::getenv("DOS_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/dos-runtime";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/dos-runtime";
}

/// The number under `key` in the JSON object `j`, named `where` + key in what it throws:
/// std::runtime_error when the key is absent or its value is not a JSON number.
double rate_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto v = j.find(key);
  if (v == j.end()) throw std::runtime_error("it has no " + where + key);
  if (!v->is_number()) throw std::runtime_error(where + key + " is not a number (it is " + v->type_name() + ")");
  return v->get<double>();
}

/// The rates of a JSON object (every key checked present and a number, named with the prefix
/// `where`: "" at the top, "calibrated." below); link_share is optional (1 when absent: files
/// written before it). Throws std::runtime_error naming the key (rate_at).
Rates rates_from_json(const nlohmann::json& j, const std::string& where) {
  Rates r{rate_at(j, "U_c", where),   rate_at(j, "U_c_dma", where), rate_at(j, "U_g", where),
          rate_at(j, "D_c", where),   rate_at(j, "B_h2d", where),   rate_at(j, "B_d2h", where)};
  if (j.contains("link_share")) r.link_share = rate_at(j, "link_share", where);
  return r;
}

/// StarPU's own bus calibration between host memory and the first CUDA worker's memory node, one
/// direction at a time (starpu_transfer_bandwidth, MB/s = bytes/us), as a LinkReading's h2d and d2h
/// in bytes/s (its rates both at once 0). Called only with a CUDA worker (calibrate_rates checks);
/// StarPU gives 0 or NaN where it has no figure, which link_reading_low then takes as no
/// reference. Throws nothing.
LinkReading starpu_bus_reading() {
  const unsigned gpu_node = unsigned(starpu_worker_get_memory_node(starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0)));
  LinkReading bus;
  bus.h2d = starpu_transfer_bandwidth(STARPU_MAIN_RAM, gpu_node) * 1e6;
  bus.d2h = starpu_transfer_bandwidth(gpu_node, STARPU_MAIN_RAM) * 1e6;
  return bus;
}

/// What the calibration checks its link readings against (link_calibration.h): `bus`, StarPU's bus
/// figures (starpu_bus_reading), or none (every field 0: nothing reads low) for a runtime of several
/// ranks on one node, whose ranks calibrate at once on links they share (kMostLinkReadings).
LinkReading link_reference(const Runtime& runtime, const LinkReading& bus) {
  return runtime.node_ranks() > 1 ? LinkReading{} : bus;
}

/// The caller-side scratch buffers of the calibration: parameters and gradients, zeroed.
struct Scratch {
  void* param = nullptr;
  void* grad = nullptr;
  bool cuda;
  Scratch(std::size_t bytes, bool on_gpu) : cuda(on_gpu) {
    if (cuda) {
      param = device_alloc_zeroed(bytes);
      try {
        grad = device_alloc_zeroed(bytes);
      } catch (...) {
        device_free(param);
        throw;
      }
    } else {
      param = std::calloc(bytes, 1);
      grad = std::calloc(bytes, 1);
      if (!param || !grad) {
        std::free(param);
        std::free(grad);
        throw Error("cannot allocate the calibration's scratch buffers");
      }
    }
  }
  ~Scratch() {
    if (cuda) {
      device_free(param);
      device_free(grad);
    } else {
      std::free(param);
      std::free(grad);
    }
  }
};

/// link_share measured on the calibration's scratch optimizer `I` (its nsub subgroups' state
/// already streamed once, so no phase below is its first that streams), from the rates `r` just
/// calibrated: `reps` phases of the spread plan whose simulated streams run longest beside CPU Adam
/// (and more beside it than without it, the refinement's condition for a link_share measure), each
/// refined from `r` with link_share at the placeholder and uncounted, as an optimizer's first
/// phases are (refine_after_phase: the measure taken whole, within a factor of 2 of 1, within
/// [1/16, U_c / U_c_dma]). A measure at that factor (kRefinementStep: 0.5 or 2) is no measure: the phase asked
/// for more than one step allows (short scratch phases whose links ran far below their rate would
/// all stop at 0.5). Returns the median of the phases that sized a measure, capped at `cap` (U_c /
/// U_c_dma of `r`: each phase's cap was that of its own refined rates, and a rates file above the
/// cap is refused on load; unitless, as Rates::link_share), or kUnmeasuredLinkShare when fewer than
/// half of them did, no plan streams beside CPU Adam, or the optimizer's plan does not refine (the
/// static:R and greedy plans); *note (when not null) gets the result and each measure, for the
/// verbose line.
double measure_link_share(Optimizer::Impl& I, Optimizer& opt, const Rates& r, double cap, std::size_t nsub, int reps,
                          std::string* note) {
  if (!I.choice.plan || !I.choice.plan->needs().refine) {
    if (note) *note = "the placeholder 1 (the plan " + I.choice.name + " does not refine its rates)";
    return kUnmeasuredLinkShare;
  }
  Rates r0 = r;
  r0.link_share = kUnmeasuredLinkShare;
  std::size_t best = 0;
  double best_beside = 0;
  for (std::size_t s = 1; s < nsub; ++s) {
    const Simulation sim = simulate_phase(opt.workload(), spread_plan(nsub, s), r0, opt.execution());
    if (sim.stream_beside_cpu > sim.stream_alone && sim.stream_beside_cpu > best_beside) {
      best = s;
      best_beside = sim.stream_beside_cpu;
    }
  }
  if (best == 0) {
    if (note) *note = "the placeholder 1 (no plan of the scratch subgroups streams beside CPU Adam)";
    return kUnmeasuredLinkShare;
  }
  opt.set_plan_override(PlanOverride{PlanOverride::fraction, double(best) / double(nsub)});
  std::vector<double> measures;
  std::string each;
  for (int rep = 0; rep < reps; ++rep) {
    I.rates = r0;
    I.link_share_record = LinkShareRecord{};
    opt.step();
    const double v = I.rates.link_share;
    const bool at_step_bound = v <= kUnmeasuredLinkShare / kRefinementStep * (1 + 1e-9) ||
                               v >= kUnmeasuredLinkShare * kRefinementStep * (1 - 1e-9);
    char text[48];
    if (I.link_share_record.measured && !at_step_bound) {
      measures.push_back(v);
      std::snprintf(text, sizeof text, "%s%.3f", rep ? " " : "", v);
    } else {
      std::snprintf(text, sizeof text, "%s%s", rep ? " " : "", I.link_share_record.measured ? "bound" : "-");
    }
    each += text;
  }
  const bool enough = 2 * measures.size() >= std::size_t(reps);
  double result = kUnmeasuredLinkShare;
  if (enough) {
    result = std::min(cap, median_of(measures));
  }
  if (note) {
    char head[200];
    std::snprintf(head, sizeof head,
                  "%.3f%s, from %zu sized measure(s) of %d phases with %zu of %zu subgroups streamed (each: ", result,
                  enough ? "" : " (the placeholder: too few sized)", measures.size(), reps, best, nsub);
    *note = std::string(head) + each + "; -: none sized, bound: at the step's factor of 2)";
  }
  return result;
}

/// link_share by the rule dma (DOS_CALIBRATE_LINK_SHARE=dma): a DmaLoop copying both ways (chunks of
/// 64 MiB over 256 MiB of pinned memory each way) beside 6 calibration phases that update every
/// subgroup on the CPU (`cpu_phase`), and alone for 0.15 s, then link_share_from_dma of the two
/// rates and `r`'s U_c, U_c_dma. The loop's threads run on `core` (the CUDA driver's, whence the
/// runtime's own copies are issued; -1: unbound). The phases' own copies (their gradients down and
/// parameters up, StepStats' bytes) count as the links' bytes; the seconds in which the CPU
/// workers ran no task (their busy time, over `cpu_workers`, against the phases' seconds) are
/// taken at the rate alone, and the rest of the bytes give the rate beside the CPU's work. It
/// returns estimated_link_share(r) instead, and `note` says why, when a CUDA call failed, the rate
/// alone is 0, the CPU was busy less than half the seconds, or the bytes left for its busy time
/// are none; otherwise `note` gives the rates.
double dma_link_share(const std::function<StepStats()>& cpu_phase, const Rates& r, unsigned cpu_workers, int core,
                      std::string* note) {
  char text[320];
#if defined(DOS_HAVE_CUDA)
  const std::size_t chunk = std::size_t(64) << 20;
  const DmaBeside alone =
      dma_rate_beside(chunk, core, [] { std::this_thread::sleep_for(std::chrono::milliseconds(150)); });
  double busy_sum = 0, bytes = 0;
  const DmaBeside beside = dma_rate_beside(chunk, core, [&] {
    for (int i = 0; i < 6; ++i) {
      const StepStats st = cpu_phase();
      busy_sum += st.cpu_busy_seconds;
      bytes += 0.5 * double(st.bytes_h2d + st.bytes_d2h);
    }
  });
  const double T = beside.seconds, busy = std::min(T, busy_sum / double(std::max(1u, cpu_workers)));
  if (alone.error == 0 && beside.error == 0 && alone.bytes_per_s_each_way > 0 && busy >= 0.5 * T && T > 0) {
    const double moved = beside.bytes_per_s_each_way * T + bytes;  // each way
    const double links = std::max(0.0, moved - alone.bytes_per_s_each_way * (T - busy)) / busy;
    if (links > 0) {
      const double share = link_share_from_dma(std::min(links, alone.bytes_per_s_each_way), alone.bytes_per_s_each_way, r);
      std::snprintf(text, sizeof text,
                    "%.3f, from the links at %.1f GB/s each way beside the CPU's work (%.0f%% of %.3f s busy) and %.1f "
                    "alone, CPU Adam keeping %.3f of its rate (U_c_dma / U_c)",
                    share, links / 1e9, 100 * busy / T, T, alone.bytes_per_s_each_way / 1e9, r.U_c_dma / r.U_c);
      *note = text;
      return share;
    }
  }
  const int e = alone.error ? alone.error : beside.error;
  std::snprintf(text, sizeof text,
                "%.3f, estimated as U_c_dma / U_c: the dma measure %s (the CPU busy %.3f of %.3f s, the links "
                "alone %.1f GB/s)",
                estimated_link_share(r), e ? "failed" : "was too small to size", busy, T,
                alone.bytes_per_s_each_way / 1e9);
#else
  (void)cpu_phase, (void)cpu_workers, (void)core;
  std::snprintf(text, sizeof text, "%.3f, estimated as U_c_dma / U_c: this build has no CUDA for the dma measure",
                estimated_link_share(r));
#endif
  *note = text;
  return estimated_link_share(r);
}

// How the calibration gives link_share (DOS_CALIBRATE_LINK_SHARE, read once): estimate (unset or
// empty, the default): estimated_link_share of the calibrated rates; placeholder: 1
// (kUnmeasuredLinkShare, the rule before the estimate); measure (or 1, its older spelling):
// measure_link_share on scratch phases; dma: dma_link_share, the links' rate beside CPU-only phases
// against alone. Each rule's rates files get their own name (rates_cache_path),
// so that a run never plans from a calibration made under another rule; the placeholder's is the
// name without a suffix, which every rates file written before the estimate has. Throws Error naming the
// variable for any other value.
enum class LinkShareRule { estimate, placeholder, measure, dma };

LinkShareRule link_share_rule() {
  static const LinkShareRule rule = [] {
    const int i = detail::env_index("DOS_CALIBRATE_LINK_SHARE", {"estimate", "placeholder", "measure", "1", "dma"});
    if (i == detail::kEnvUnset || i == 0) return LinkShareRule::estimate;
    if (i == 1) return LinkShareRule::placeholder;
    if (i == 2 || i == 3) return LinkShareRule::measure;
    if (i == 4) return LinkShareRule::dma;
    throw Error("DOS_CALIBRATE_LINK_SHARE is '" + std::string(std::getenv("DOS_CALIBRATE_LINK_SHARE")) +
                "': it must be estimate (the default, also when unset or empty), placeholder, measure (also 1) or "
                "dma; unset it or give one of those");
  }();
  return rule;
}

// How many times the calibration repeats its all-CPU and its mixed scratch phase
// (DOS_CALIBRATION_REPS, read once): kDefaultCalibrationReps when unset or empty, else a whole
// number from 1 to kMostCalibrationReps. Each repetition costs two scratch phases: an all-CPU one
// of N S elements (N scratch subgroups, calibration_subgroups; about N S / U_c seconds: 30-50 ms
// at N = 8 and S = 2^24 on the GPU machine) and a mixed
// one; U_c and U_c_dma's starting value are the medians over them. Throws Error naming the
// variable for any other value.
constexpr int kDefaultCalibrationReps = 3, kMostCalibrationReps = 99;

/// A calibration switch that counts (the environment variable `name`, read at each call):
/// `fallback` when unset or empty, else a whole number from lo to hi that is a multiple of `step`
/// (step 1: any). Throws Error naming the variable, its value, the range ("a whole number from lo
/// to hi", or "a multiple of step from lo to hi") and `meaning` (what it counts, for the message)
/// for any other value: a leading sign or blank too, beyond whole_number_in's reading.
long calibration_count(const char* name, long lo, long hi, long step, long fallback, const std::string& meaning) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  long n = 0;
  if (*v < '0' || *v > '9' || !detail::whole_number_in(v, lo, hi, &n) || n % step != 0)
    throw Error(std::string(name) + " is '" + v + "': it must be " +
                (step == 1 ? std::string("a whole number") : "a multiple of " + std::to_string(step)) + " from " +
                std::to_string(lo) + " to " + std::to_string(hi) + " (" + meaning + "; " + std::to_string(fallback) +
                " when unset); unset it or give such a number");
  return n;
}

int calibration_reps() {
  static const int reps = int(calibration_count("DOS_CALIBRATION_REPS", 1, kMostCalibrationReps, 1,
                                                kDefaultCalibrationReps,
                                                "the calibration's repetitions of each scratch phase"));
  return reps;
}

// How many scratch subgroups the calibration's phases update (DOS_CALIBRATION_SUBGROUPS, read
// once): kDefaultCalibrationSubgroups when unset or empty, else a multiple of 4 from 8 to
// kMostCalibrationSubgroups. The mixed phase streams 3/4 of them while the CPU updates the rest
// (6 and 2 at the default), so that N subgroups time N / 4 subgroups of CPU Adam beside the DMA
// (about 10 ms at N = 8 and S = 2^24 on the GPU machine, against a 20B quarter's phase of 0.75 s
// of CPU Adam): a measuring switch for longer scratch phases. Each subgroup holds S elements of
// parameters and gradients in the model's memory (twice the dtype's bytes per element; on the GPU
// outside StarPU's limit when the model is there) and the optimizer's pinned host memory (its state
// and staging: 16 bytes per element in bf16 or fp16, 20 in fp32), so the scratch grows with N:
// about 2.5 GiB at N = 8 and S = 2^24 in bf16, 10 GiB at 32. A value other than the default gets
// rates files of its own (rates_cache_path). Throws Error naming the variable for any other value.
constexpr std::size_t kDefaultCalibrationSubgroups = 8, kMostCalibrationSubgroups = 32;

std::size_t calibration_subgroups() {
  static const std::size_t n = std::size_t(calibration_count(
      "DOS_CALIBRATION_SUBGROUPS", long(kDefaultCalibrationSubgroups), long(kMostCalibrationSubgroups), 4,
      long(kDefaultCalibrationSubgroups), "the calibration's scratch subgroups, 3/4 of them streamed in its mixed phase"));
  return n;
}

/// The GPU update budget of the calibration's scratch optimizer (OptimizerOptions::gpu_update_budget,
/// bytes): what StarPU may still allocate on the CUDA node that has least (starpu_memory_get_available:
/// its limit, STARPU_LIMIT_CUDA_MEM, STARPU_LIMIT_CUDA_<devid>_MEM or 90% of the device, less what
/// it holds, its cached free buffers included; 0 where it holds more than its limit), less
/// kStarpuDeviceMargin, and at least one streamed scratch subgroup of S elements of `dtype` (its
/// bound by gpu_memory_for_budgets, gradients counted at 4 bytes), so that the mixed phase streams;
/// 0 (no budget) where StarPU keeps no total for any CUDA node (starpu_memory_get_total < 0).
/// Unbudgeted, the mixed phase asks for 3/4 of its subgroups (six at the default 8) streamed at once, more than a limit set from
/// a run's own tight GPU budgets holds (dos-train's --gpu-update-budget sets it): there,
/// calibrating processes stopped in the scratch phases (the CUDA worker running, the caller
/// waiting, no phase ending) in about one of three. Without a limit the budget is far above the
/// scratch's need and the phases run as unbudgeted. S >= 1. Throws nothing.
std::size_t scratch_update_budget(std::size_t S, DType dtype) {
  starpu_ssize_t least = -1;
  for (unsigned node : detail::cuda_memory_nodes()) {
    if (starpu_memory_get_total(node) < 0) continue;
    const starpu_ssize_t a = std::max<starpu_ssize_t>(0, starpu_memory_get_available(node));
    if (least < 0 || a < least) least = a;
  }
  if (least < 0) return 0;
  const std::size_t one = gpu_memory_for_budgets(S, S, dtype_size(dtype), 4, 1, -1, false);
  const std::size_t free = std::size_t(least) > kStarpuDeviceMargin ? std::size_t(least) - kStarpuDeviceMargin : 0;
  return std::max(free, one);
}

}  // namespace

void detail::check_calibration_switches() {
  (void)link_share_rule();
  (void)calibration_reps();
  (void)calibration_subgroups();
}

std::string rates_cache_path(const Runtime& runtime, std::size_t S, DType dtype, MemoryKind memory, bool compact_master) {
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  const std::string key = std::string(host) + "-cpu" + std::to_string(runtime.cpu_workers()) + "x" +
                          std::to_string(runtime.cpu_threads()) + "-cuda" + std::to_string(runtime.cuda_workers()) +
                          "-" + dtype_name(dtype) + "-" + (memory == MemoryKind::cuda ? "gpu" : "host") + "-S" +
                          std::to_string(S) +
                          (runtime.node_ranks() > 1 ? "-ranks" + std::to_string(runtime.node_ranks()) : std::string()) +
                          (link_share_rule() == LinkShareRule::measure    ? "-link_share"
                           : link_share_rule() == LinkShareRule::estimate ? "-link_share_estimate"
                           : link_share_rule() == LinkShareRule::dma      ? "-link_share_dma"
                                                                          : "") +
                          (calibration_subgroups() != kDefaultCalibrationSubgroups
                               ? "-scratch" + std::to_string(calibration_subgroups())
                               : std::string()) +
                          (compact_master ? "-compact" : "");
  return cache_dir() + "/rates-" + key + ".json";
}

nlohmann::ordered_json rates_to_json(const Rates& r) {
  return {{"U_c", r.U_c},     {"U_c_dma", r.U_c_dma}, {"U_g", r.U_g},
          {"D_c", r.D_c},     {"B_h2d", r.B_h2d},     {"B_d2h", r.B_d2h},
          {"link_share", r.link_share}};
}

namespace {
/// load_rates, and *keeps_calibrated (when not null): whether the file keeps the calibration's own
/// rates apart (its "calibrated" key); a file written before that key existed holds refined rates
/// only, which say nothing of what the calibration read. `own_cache`: the file is the calibration's
/// own cache (calibrate_rates), which is not held to implausible_rate's range (a calibration on
/// subgroups of a few elements measures U_g and D_c below it) and whose errors name no remedy (the
/// caller measures again). Throws what load_rates throws.
Rates read_rates_file(const std::string& path, Rates* calibrated, bool* keeps_calibrated, bool own_cache) {
  std::ifstream f(path);
  if (!f) throw Error("cannot read the rates file " + path + ": " + std::strerror(errno));
  const std::string fix =
      own_cache ? "" : "; correct the file, or, when it is the calibration cache, delete it or measure the rates again";
  Rates r, c;
  bool has_calibrated = false;
  try {
    // a key given twice in one object would be read as its last value, silently: refused
    std::vector<std::set<std::string>> keys;  // the keys seen in each object open at this point
    std::string twice;
    const nlohmann::json::parser_callback_t note_keys = [&](int, nlohmann::json::parse_event_t event,
                                                            nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (event == E::object_start) keys.emplace_back();
      else if (event == E::object_end && !keys.empty()) keys.pop_back();
      else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && twice.empty())
        twice = parsed.get<std::string>();
      return true;
    };
    const nlohmann::json j = nlohmann::json::parse(f, note_keys);
    if (!twice.empty()) throw std::runtime_error("it gives the key '" + twice + "' twice in one object");
    if (!j.is_object()) throw std::runtime_error(std::string("it is a JSON ") + j.type_name() + ", not an object");
    has_calibrated = j.contains("calibrated");
    if (has_calibrated && !j.at("calibrated").is_object())
      throw std::runtime_error(std::string("its 'calibrated' is a JSON ") + j.at("calibrated").type_name() +
                               ", not an object with the same keys");
    // a key the file format does not have (a typo: "u_c" beside "U_c") would be ignored: refused
    const auto unknown = [](const nlohmann::json& o, bool top) -> std::string {
      for (const auto& [k, v] : o.items())
        if (k != "U_c" && k != "U_c_dma" && k != "U_g" && k != "D_c" && k != "B_h2d" && k != "B_d2h" &&
            k != "link_share" && !(top && k == "calibrated"))
          return k;
      return "";
    };
    if (const std::string bad = unknown(j, true); !bad.empty())
      throw std::runtime_error("it has a key '" + bad + "' that is not one of U_c, U_c_dma, U_g, D_c, B_h2d, B_d2h, "
                               "link_share, calibrated (keys are case-sensitive)");
    if (const std::string bad = has_calibrated ? unknown(j.at("calibrated"), false) : ""; !bad.empty())
      throw std::runtime_error("its 'calibrated' has a key '" + bad + "' that is not one of U_c, U_c_dma, U_g, D_c, "
                               "B_h2d, B_d2h, link_share (keys are case-sensitive)");
    r = rates_from_json(j, "");
    c = has_calibrated ? rates_from_json(j.at("calibrated"), "calibrated.") : r;
  } catch (const std::exception& e) {
    throw Error("the rates file " + path + " is not a rates file (a JSON object with U_c, U_c_dma, U_g, D_c in "
                "params/s, B_h2d, B_d2h in bytes/s, optionally link_share, and optionally the same under "
                "'calibrated'): " + e.what());
  }
  for (const auto& [x, which] : {std::pair<const Rates*, std::string>{&r, ""}, {&c, "calibrated."}}) {
    if (!rates_complete(*x))
      throw Error("the rates file " + path + " has a rate" + (which.empty() ? "" : " under 'calibrated'") +
                  " that is not a positive number (U_c, U_c_dma, U_g, D_c, B_h2d, B_d2h and link_share when "
                  "given must all be > 0)" + fix);
    if (const std::string name = own_cache ? "" : implausible_rate(*x); !name.empty())
      throw Error("the rates file " + path + " gives " + which + name + " outside [1e6, 1e16]: a rates file is in "
                  "params/s and bytes/s (4.1e9, not 4.1, for 4.1 Gparams/s; the six numbers of dos-train's --rates "
                  "are in Gparams/s and GB/s)" + fix);
    if (const std::string e = rate_bounds_error(*x); !e.empty())
      throw Error("the rates file " + path + (which.empty() ? "" : " (its 'calibrated')") + ": " + e + fix);
  }
  if (keeps_calibrated) *keeps_calibrated = has_calibrated;
  if (calibrated) *calibrated = c;
  return r;
}
}  // namespace

Rates load_rates(const std::string& path, Rates* calibrated) {
  return read_rates_file(path, calibrated, nullptr, false);
}

void save_rates(const std::string& path, const Rates& r, const Rates& calibrated) {
  std::filesystem::create_directories(path.substr(0, path.rfind('/')));  // throws on failure
  nlohmann::ordered_json j = rates_to_json(r);
  j["calibrated"] = rates_to_json(calibrated);
  const std::string text = j.dump(2) + "\n";
  write_file_atomically(path, {{text.data(), text.size()}});
}

Rates calibrate_rates(Runtime& runtime, std::size_t S, DType dtype, MemoryKind memory, bool force, bool verbose,
                      Rates* calibrated, bool compact_master) {
  if (S == 0) throw Error("calibrate_rates: subgroup_elems must be >= 1 (elements per scratch subgroup), got 0");
  if (runtime.cuda_workers() == 0) throw Error("calibrating the model's rates needs a CUDA worker; there is none");
  if (!runtime.model_policy())
    throw Error("calibrating the model's rates needs the dos (or static:R) policy, not " + runtime.policy());
  const std::string path = rates_cache_path(runtime, S, dtype, memory, compact_master), dir = path.substr(0, path.rfind('/'));
  if (!force && std::ifstream(path)) {
    try {
      Rates c;
      bool keeps_calibrated = false;
      const Rates r = read_rates_file(path, &c, &keeps_calibrated, true);
      if (calibrated) *calibrated = c;
      if (verbose) {
        const char* reps = std::getenv("DOS_CALIBRATION_REPS");
        const char* subgroups = std::getenv("DOS_CALIBRATION_SUBGROUPS");
        const bool has_reps = reps && *reps, has_subgroups = subgroups && *subgroups;
        std::fprintf(stderr, "[dos] model rates from %s (--recalibrate measures them again%s)\n", path.c_str(),
                     has_reps && has_subgroups ? "; DOS_CALIBRATION_REPS and DOS_CALIBRATION_SUBGROUPS act only then"
                     : has_reps                ? "; DOS_CALIBRATION_REPS acts only then"
                     : has_subgroups           ? "; DOS_CALIBRATION_SUBGROUPS acts only then"
                                               : "");
      }
      // a calibration that read the link low holds this run's links too (kLinkCeiling): said again
      const LinkReading cached{0, 0, c.B_h2d, c.B_d2h}, reference = link_reference(runtime, starpu_bus_reading());
      if (keeps_calibrated && link_reading_low(cached, reference))
        std::fprintf(stderr, "%s\n", low_link_warning(cached, reference, 0, path).c_str());
      return r;
    } catch (const Error& e) {
      // said whatever the verbosity: the calibration that follows replaces the file
      std::fprintf(stderr, "[dos] warning: %s; measuring the rates again, which replaces that file\n", e.what());
    }
  }

  // nsub scratch subgroups; the mixed phase streams `streamed` of them (3/4) while the CPU updates the rest
  const std::size_t nsub = calibration_subgroups(), streamed = 3 * nsub / 4, n = nsub * S;
  // where the scratch cannot be had, the error says it is the calibration's (not the model's state,
  // whose advice, fewer parameters per process, would not help) and what asks for its size; the
  // Optimizer builds the calibration before it allocates its own state
  const std::string whose =
      "calibrating the model's rates on " + std::to_string(nsub) + " scratch subgroups of " + std::to_string(S) +
      " elements (the calibration's own, freed when it ends" +
      (nsub != kDefaultCalibrationSubgroups
           ? "; DOS_CALIBRATION_SUBGROUPS=" + std::to_string(nsub) + " asks for them: unset it (8) or give a smaller "
             "multiple of 4 for less memory"
           : std::string()) +
      "): ";
  std::unique_ptr<Scratch> scratch;
  try {
    scratch = std::make_unique<Scratch>(n * dtype_size(dtype), memory == MemoryKind::cuda);
  } catch (const Error& e) {
    throw Error(whose + e.what());
  }
  const Scratch& buf = *scratch;
  OptimizerOptions o;
  o.subgroup_size = S;
  o.dtype = dtype;
  o.memory = memory;
  o.rates = Rates{1, 1, 1, 1, 1, 1};  // placeholders: the plans below are forced
  o.gpu_update_budget = scratch_update_budget(S, dtype);
  o.verbose = false;
  o.compact_master = compact_master;
  std::unique_ptr<Optimizer> scratch_optimizer;
  try {
    scratch_optimizer = std::make_unique<Optimizer>(runtime, std::vector<TensorView>{{buf.param, buf.grad, n}}, o);
  } catch (const ResourceError& e) {
    throw ResourceError(whose + e.what());
  }
  Optimizer& opt = *scratch_optimizer;
  auto phase = [&](double fraction) {
    opt.set_plan_override(PlanOverride{PlanOverride::fraction, fraction});
    return opt.step();
  };
  phase(0.75);  // warm-up: device buffers allocated, streams started
  phase(0.0);
  Rates r;
  // calibration_reps() repetitions of an all-CPU phase and a mixed one: U_c and U_c_dma's starting
  // value come from the median busy time of the repetitions that measured one, so that one
  // repetition slowed or sped by something outside the phase moves neither; U_c_dma is then fitted
  // below
  const int repetitions = calibration_reps();
  std::vector<double> alone_busy, mixed_busy_reps;  // the CPU's Adam busy time of each repetition, seconds
  std::string reps;                                 // each repetition's figures, for the verbose line
  for (int rep = 0; rep < repetitions; ++rep) {
    const StepStats cpu = phase(0.0);  // every subgroup on the CPU: its Adam tasks' busy time
    if (cpu.cpu_adam_seconds > 0) alone_busy.push_back(cpu.cpu_adam_seconds);
    const StepStats mixed = phase(0.75);  // nsub - streamed subgroups on the CPU while `streamed` stream
    if (mixed.cpu_adam_seconds > 0) mixed_busy_reps.push_back(mixed.cpu_adam_seconds);
    char line[160];
    std::snprintf(line, sizeof line, "%s%.2f alone (phase %.3f s), %.2f mixed (phase %.3f s)", rep ? "; " : "",
                  cpu.cpu_adam_seconds > 0 ? 1e-9 * double(n) / cpu.cpu_adam_seconds : 0.0, cpu.seconds,
                  mixed.cpu_adam_seconds > 0 ? 1e-9 * double(nsub - streamed) * double(S) / mixed.cpu_adam_seconds : 0.0,
                  mixed.seconds);
    reps += line;
  }
  if (verbose)
    std::fprintf(stderr, "[dos] calibration's CPU Adam, Gparams/s per repetition (each rate the median): %s\n",
                 reps.c_str());
  if (!alone_busy.empty()) r.U_c = double(n) / median_of(alone_busy);
  // The CPU's busy time in the mixed phase, its median repetition's (seconds; 1e30: none measured)
  const double mixed_busy = mixed_busy_reps.empty() ? 1e30 : median_of(mixed_busy_reps);
  // A first guess: the CPU's rate over the whole mixed phase. Part of that phase's CPU work may run
  // beside one link or none, so U_c_dma is then fitted below with the phase simulation.
  r.U_c_dma = mixed_busy < 1e30 ? double(nsub - streamed) * double(S) / mixed_busy : 0.0;
  // The GPU's own rates: its kernels timed with CUDA events. (A CUDA worker's busy time includes
  // the waits of its pipelined asynchronous tasks: it made GPU Adam look 100x slower than it is.)
  benchmark_gpu_rates(S, dtype, &r.U_g, &r.D_c);
  if (memory != MemoryKind::cuda) r.D_c = 1e15;  // no conversion on the GPU when the model is on the host
  // PCIe: both directions at once, as an update phase uses them: cudaMemcpyAsync of 256 MiB each
  // way on two streams (benchmark_pcie). (Short streamed phases of scratch subgroups give a third of
  // the rate that long real phases reach, so they are no measure of the link.) Without it, StarPU's
  // own bus calibration (one direction at a time, MB/s = bytes/us). The online refinement then
  // corrects B to what the runtime's streaming achieves.
  const LinkReading bus = starpu_bus_reading();
  r.B_h2d = bus.h2d;
  r.B_d2h = bus.d2h;
#if defined(DOS_HAVE_CUDA)
  {
    // read again while a rate reads below kLowLinkFraction of StarPU's own bus figure (read_link):
    // the refinement never raises a link past kLinkCeiling times what is kept here
    const LinkReading reference = link_reference(runtime, bus);
    int taken = 0;
    bool low = false;
    const LinkReading best = read_link(
        [](LinkReading* out) {
          PcieRoof roof;
          if (benchmark_pcie(std::size_t(256) << 20, &roof) != 0) return false;
          *out = LinkReading{roof.h2d, roof.d2h, roof.duplex_h2d, roof.duplex_d2h};
          return true;
        },
        [] { std::this_thread::sleep_for(std::chrono::milliseconds(250)); }, reference, &taken, &low);
    if (best.duplex_h2d > 0 && best.duplex_d2h > 0) {
      r.B_h2d = best.duplex_h2d;
      r.B_d2h = best.duplex_d2h;
    }
    if (low) std::fprintf(stderr, "%s\n", low_link_warning(best, reference, taken, path).c_str());
    if (verbose && taken == 0)
      std::fprintf(stderr, "[dos] calibration's PCIe: the copies failed; StarPU's bus calibration kept (%.1f GB/s "
                   "H2D, %.1f D2H, one direction at a time)\n", bus.h2d / 1e9, bus.d2h / 1e9);
    else if (verbose)
      std::fprintf(stderr,
                   "[dos] calibration's PCIe, GB/s, the best of %d reading%s (one way, each direction's best; both "
                   "at once, the best pair): one way %.1f H2D, %.1f D2H (StarPU's bus calibration %.1f, %.1f); both "
                   "at once %.1f, %.1f\n",
                   taken, taken == 1 ? "" : "s", best.h2d / 1e9, best.d2h / 1e9, bus.h2d / 1e9, bus.d2h / 1e9,
                   best.duplex_h2d / 1e9, best.duplex_d2h / 1e9);
  }
#endif
  r.U_c_dma = std::min(r.U_c_dma, r.U_c);
  if (!rates_complete(r)) throw Error("calibration measured a zero rate; run again with --recalibrate");
  // U_c_dma such that the phase simulation of the mixed phase keeps the CPU as busy as it was: the
  // part of its work the simulation runs beside no or one link is taken at the simulated rate, the
  // rest of the measured busy time gives the rate beside both (the online refinement's rule,
  // iterated: M, and so the share, depend on U_c_dma).
  {
    const std::vector<PlanSide> mixed_plan = spread_plan(nsub, streamed);
    for (int it = 0; it < 8; ++it) {
      const Simulation sim = simulate_phase(opt.workload(), mixed_plan, r, opt.execution());
      const double alone = sim.cpu - sim.cpu_beside_dma, beside = mixed_busy - alone;
      if (!(sim.cpu_beside_dma > 0) || !(beside > 0.2 * sim.cpu_beside_dma)) break;
      r.U_c_dma = std::min(r.U_c, std::max(lowest_distinct_u_c_dma(opt.workload(), r, opt.execution().cpu_workers),
                                           r.U_c_dma * sim.cpu_beside_dma / beside));
    }
  }
  // link_share, last: the estimate (from U_c and U_c_dma above), the placeholder, or the
  // refinement's measure on scratch phases, which simulates them at the rates above (capped at
  // U_c / U_c_dma of these rates); DOS_CALIBRATE_LINK_SHARE picks the rule (link_share_rule)
  if (link_share_rule() == LinkShareRule::estimate) {
    r.link_share = estimated_link_share(r);
    if (verbose)
      std::fprintf(stderr, "[dos] calibration's link_share: %.3f, estimated as U_c_dma / U_c (replaced by the first "
                   "phases that stream)\n", r.link_share);
  } else if (link_share_rule() == LinkShareRule::measure) {
    std::string link_note;
    r.link_share = measure_link_share(*opt.impl_, opt, r, highest_link_share(r), nsub, 5, verbose ? &link_note : nullptr);
    if (verbose) std::fprintf(stderr, "[dos] calibration's link_share: %s\n", link_note.c_str());
  } else if (link_share_rule() == LinkShareRule::dma) {
    std::string link_note;
    r.link_share = dma_link_share([&] { return phase(0.0); }, r, runtime.cpu_workers(), runtime.cuda_driver_core(),
                                  &link_note);
    if (verbose) std::fprintf(stderr, "[dos] calibration's link_share: %s\n", link_note.c_str());
  }
  if (verbose)
    std::fprintf(stderr,
                 "[dos] calibrated (%zu subgroups of %zu): U_c %.2f Gparams/s alone, %.2f under DMA; U_g %.1f Gparams/s; "
                 "D_c %.1f Gparams/s; PCIe %.1f GB/s H2D, %.1f GB/s D2H (both at once); scratch update budget %s\n",
                 nsub, S, r.U_c / 1e9, r.U_c_dma / 1e9, r.U_g / 1e9, r.D_c / 1e9, r.B_h2d / 1e9, r.B_d2h / 1e9,
                 o.gpu_update_budget ? gb_text(double(o.gpu_update_budget)).c_str() : "none");
  if (calibrated) *calibrated = r;
  try {
    save_rates(path, r, r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[dos] warning: could not cache the calibration (the next run measures the rates again): %s\n",
                 e.what());
  }
  return r;
}

}  // namespace dos
