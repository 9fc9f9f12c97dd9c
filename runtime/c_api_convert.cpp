// Conversions between the C ABI's structs and the C++ API's types (contract in c_api_convert.h).
#include "c_api_convert.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <regex>
#include <string>
#include <utility>

#include "number_text.h"

namespace dos::c_api {

dos::AdamHyper make_hyper(double lr, double beta1, double beta2, double eps, double weight_decay, int decoupled) {
  dos::AdamHyper h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.decoupled = decoupled != 0;
  return h;
}

void copy_stats(const dos::StepStats& s, dos_step_stats* stats) {
  if (!stats) return;
  stats->seconds = s.seconds;
  stats->params = s.params;
  stats->subgroups_cpu = s.subgroups_cpu;
  stats->subgroups_gpu = s.subgroups_gpu;
  stats->bytes_h2d = s.bytes_h2d;
  stats->bytes_d2h = s.bytes_d2h;
  stats->step = s.step;
  stats->cpu_busy_seconds = s.cpu_busy_seconds;
  stats->gpu_busy_seconds = s.gpu_busy_seconds;
  stats->planned_streamed = s.planned_streamed;
  stats->planned_resident = s.planned_resident;
  stats->predicted_seconds = s.predicted_seconds;
  stats->lower_bound_seconds = s.lower_bound_seconds;
  stats->exposed_seconds = s.exposed_seconds;
  stats->speculated = s.speculated;
  stats->hidden_params = s.hidden_params;
  stats->redone = s.redone;
  stats->overlapped = s.overlapped ? 1 : 0;
  stats->skipped = s.skipped ? 1 : 0;
  stats->tail_bound = s.tail_bound;
  stats->tail_moved = s.tail_moved;
  stats->refinement_held = s.refinement_held ? 1 : 0;
  stats->plan_seconds = s.plan_seconds;
  stats->plan_decided_ahead = s.plan_decided_ahead ? 1 : 0;
  stats->longest_download_seconds = s.longest_download_seconds;
  stats->longest_download_bytes = s.longest_download_bytes;
  stats->downloads_dodge_writebacks = s.downloads_dodge_writebacks ? 1 : 0;
}

std::string check_options(const dos_optimizer_options& c, dos::OptimizerOptions& o) {
  if (c.size != sizeof(dos_optimizer_options) || c.version != DOS_OPTIMIZER_OPTIONS_VERSION)
    return "options has size " + std::to_string(c.size) + " and version " + std::to_string(c.version) +
           ", this library knows only size " + std::to_string(sizeof(dos_optimizer_options)) + " and version " +
           std::to_string(DOS_OPTIMIZER_OPTIONS_VERSION) +
           " (fill it with dos_optimizer_options_init, and build against the dos_c.h of this library)";
  auto field = [](const char* name, const std::string& range, const std::string& got) {
    return std::string("options.") + name + " must be " + range + ", got " + got;
  };
  auto boolean = [&](const char* name, int v, bool& to) {
    if (v != 0 && v != 1) return field(name, "0 or 1", std::to_string(v));
    to = v == 1;
    return std::string();
  };
  const float fmax = FLT_MAX;
  const std::pair<const char*, double> nonneg[] = {{"lr", c.lr}, {"eps", c.eps}, {"weight_decay", c.weight_decay}};
  for (const auto& [name, v] : nonneg)
    if (!(v >= 0 && v <= fmax)) return field(name, "a finite number in [0, 3.4e38] (fp32's range)", shortest_text(v));
  if (c.lr * c.weight_decay > fmax)
    return "options.lr x options.weight_decay must be at most 3.4e38 (fp32's range), got " + shortest_text(c.lr * c.weight_decay);
  const std::pair<const char*, double> betas[] = {{"beta1", c.beta1}, {"beta2", c.beta2}};
  for (const auto& [name, v] : betas)
    if (!(v >= 0 && v < 1)) return field(name, "in [0, 1)", shortest_text(v));
  std::string e;
  bool decoupled = true;
  if (!(e = boolean("decoupled", c.decoupled, decoupled)).empty()) return e;
  o.adam = make_hyper(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, decoupled ? 1 : 0);
  if (c.subgroup_size < 1) return field("subgroup_size", ">= 1 (elements)", std::to_string(c.subgroup_size));
  o.subgroup_size = c.subgroup_size;
  if (c.dtype < DOS_DTYPE_FP32 || c.dtype > DOS_DTYPE_BF16)
    return field("dtype", "DOS_DTYPE_FP32 (0), DOS_DTYPE_FP16 (1) or DOS_DTYPE_BF16 (2)", std::to_string(c.dtype));
  o.dtype = static_cast<dos::DType>(c.dtype);
  if (c.memory != DOS_MEMORY_HOST && c.memory != DOS_MEMORY_CUDA)
    return field("memory", "DOS_MEMORY_HOST (0) or DOS_MEMORY_CUDA (1)", std::to_string(c.memory));
  o.memory = c.memory == DOS_MEMORY_CUDA ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  if (c.gpu_resident_budget < -1)
    return field("gpu_resident_budget", ">= -1 (bytes; -1: not given)", std::to_string(c.gpu_resident_budget));
  o.gpu_resident_budget = c.gpu_resident_budget;
  if (c.gpu_update_budget > std::numeric_limits<std::size_t>::max())
    return field("gpu_update_budget", "at most SIZE_MAX (bytes; 0: no limit)", std::to_string(c.gpu_update_budget));
  o.gpu_update_budget = static_cast<std::size_t>(c.gpu_update_budget);
  if (c.stream_lookahead < 0 || c.stream_lookahead > 1000)
    return field("stream_lookahead", "in [0, 1000] (subgroups)", std::to_string(c.stream_lookahead));
  o.stream_lookahead = static_cast<unsigned>(c.stream_lookahead);
  if (!(e = boolean("eager_writeback", c.eager_writeback, o.eager_writeback)).empty()) return e;
  if (!(e = boolean("native_grads", c.native_grads, o.native_grads)).empty()) return e;
  if (!(e = boolean("urgent_writeback", c.urgent_writeback, o.urgent_writeback)).empty()) return e;
  if (c.submit_order != DOS_SUBMIT_ORDER_PLAN && c.submit_order != DOS_SUBMIT_ORDER_CPU_FIRST)
    return field("submit_order", "DOS_SUBMIT_ORDER_PLAN (0) or DOS_SUBMIT_ORDER_CPU_FIRST (1)",
                 std::to_string(c.submit_order));
  o.submit_order = c.submit_order == DOS_SUBMIT_ORDER_CPU_FIRST ? dos::SubmitOrder::cpu_first : dos::SubmitOrder::plan;
  const std::pair<const char*, double> rates[] = {{"U_c", c.rates.U_c}, {"U_c_dma", c.rates.U_c_dma},
                                                  {"U_g", c.rates.U_g}, {"D_c", c.rates.D_c},
                                                  {"B_h2d", c.rates.B_h2d}, {"B_d2h", c.rates.B_d2h}};
  bool all_zero = true;
  for (const auto& r : rates) all_zero = all_zero && r.second == 0;
  if (!all_zero)
    for (const auto& [name, v] : rates)
      if (!(v > 0) || !std::isfinite(v))
        return std::string("options.rates.") + name +
               " must be a finite number > 0 (parameters/s for U_*, D_c; bytes/s for B_*), or every rate 0 "
               "(calibrate), got " + shortest_text(v);
  o.rates = dos::Rates{c.rates.U_c, c.rates.U_c_dma, c.rates.U_g, c.rates.D_c, c.rates.B_h2d, c.rates.B_d2h};
  if (!(e = boolean("recalibrate", c.recalibrate, o.recalibrate)).empty()) return e;
  if (!(e = boolean("verbose", c.verbose, o.verbose)).empty()) return e;
  if (c.speculation_budget < -1)
    return field("speculation_budget", ">= -1 (bytes; -1: half of the available host memory; 0: no speculation)",
                 std::to_string(c.speculation_budget));
  o.speculation_budget = c.speculation_budget;
  if (!(e = boolean("speculate_streamed", c.speculate_streamed, o.speculate_streamed)).empty()) return e;
  if (c.tail_subgroups < 0 || c.tail_subgroups > 1000000)
    return field("tail_subgroups", "in [0, 1000000] (subgroups; 0: the plan as made)", std::to_string(c.tail_subgroups));
  o.tail_subgroups = static_cast<std::size_t>(c.tail_subgroups);
  if (!(e = boolean("compact_master", c.compact_master, o.compact_master)).empty()) return e;
  // dos::Optimizer refuses it too (a dos::Error naming dos-train's --master compact): refused here
  // first, in the struct's own terms
  if (o.compact_master && o.dtype != dos::DType::bf16)
    return "options.compact_master = 1 needs options.dtype = DOS_DTYPE_BF16 (2): each master is rebuilt from "
           "its bf16 parameter, got dtype " + std::to_string(c.dtype) + " (" + dos::dtype_name(o.dtype) +
           "); set compact_master = 0 for fp32 or fp16 parameters";
  return std::string();
}

void default_options(dos_optimizer_options* options) {
  const dos::OptimizerOptions d;
  std::memset(options, 0, sizeof *options);
  options->size = sizeof *options;
  options->version = DOS_OPTIMIZER_OPTIONS_VERSION;
  options->lr = d.adam.lr;
  options->beta1 = d.adam.beta1;
  options->beta2 = d.adam.beta2;
  options->eps = d.adam.eps;
  options->weight_decay = d.adam.weight_decay;
  options->decoupled = d.adam.decoupled ? 1 : 0;
  options->subgroup_size = d.subgroup_size;
  options->dtype = static_cast<int>(d.dtype);
  options->memory = d.memory == dos::MemoryKind::cuda ? DOS_MEMORY_CUDA : DOS_MEMORY_HOST;
  options->gpu_resident_budget = d.gpu_resident_budget;
  options->gpu_update_budget = d.gpu_update_budget;
  options->stream_lookahead = static_cast<int>(d.stream_lookahead);
  options->eager_writeback = d.eager_writeback ? 1 : 0;
  options->native_grads = d.native_grads ? 1 : 0;
  options->urgent_writeback = d.urgent_writeback ? 1 : 0;
  options->submit_order = d.submit_order == dos::SubmitOrder::cpu_first ? DOS_SUBMIT_ORDER_CPU_FIRST : DOS_SUBMIT_ORDER_PLAN;
  options->rates = dos_rates{d.rates.U_c, d.rates.U_c_dma, d.rates.U_g, d.rates.D_c, d.rates.B_h2d, d.rates.B_d2h};
  options->recalibrate = d.recalibrate ? 1 : 0;
  options->verbose = d.verbose ? 1 : 0;
  options->speculation_budget = d.speculation_budget;
  options->speculate_streamed = d.speculate_streamed ? 1 : 0;
  options->tail_subgroups = static_cast<int>(d.tail_subgroups);
  options->compact_master = d.compact_master ? 1 : 0;
}

std::string named(const char* fn, const std::string& what, bool call_hints) {
  const std::string f(fn);
  std::string method = f;  // the call's name without its object's prefix
  for (const char* prefix : {"dos_optimizer_", "dos_runtime_", "dos_"})
    if (f.rfind(prefix, 0) == 0) {
      method = f.substr(std::char_traits<char>::length(prefix));
      break;
    }
  static const std::pair<const char*, const char*> kCppNames[] = {{"read_masters", "read_master_range"},
                                                                  {"write_masters", "write_master_range"}};
  std::string leads[2] = {method, method};
  for (const auto& [c_name, cpp_name] : kCppNames)
    if (method == c_name) leads[1] = cpp_name;
  std::string text = ": " + what;
  for (const std::string& lead : leads) {
    const std::size_t n = lead.size();
    if (what.compare(0, n, lead) != 0) continue;
    const std::size_t at = what.compare(n, 3, "() ") == 0 ? n + 2 : n;  // "step() was called ..."
    if (what.compare(at, 2, ": ") == 0 || what.compare(at, 1, " ") == 0) {
      text = what.substr(at);
      break;
    }
  }
  if (call_hints && f.rfind("dos_optimizer_", 0) == 0) {
    // a name already led by dos_optimizer_ has no word boundary before it, so it is left alone
    static const std::regex kCalls(
        "\\b(begin_step|finish_step_async|finish_step|wait_step|step_async|gradients_final|wait_parameters)\\b(\\(\\))?");
    static const std::regex kStep("\\bstep\\(\\)");
    text = std::regex_replace(std::regex_replace(text, kCalls, "dos_optimizer_$1"), kStep, "dos_optimizer_step");
  }
  return f + text;
}

}  // namespace dos::c_api
