// The Optimizer: its construction (the subgroups' host state and StarPU handles, the master
// parameters, the rates), the task helpers, and the state as the caller reads, loads and sets it.
// The update phase is in update_phase.cpp; each step's plan and the rates' refinement in
// plan_step.cpp.
#include <starpu.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "../codelets/codelets.h"
#include "../codelets/kernels/env_choice.h"
#include "../scheduler/policy.h"
#include "dos.h"
#include "number_text.h"
#include "optimizer_impl.h"
#include "partition.h"
#include "runtime_impl.h"
#include "state_check.h"

namespace dos {
using namespace detail;

// ---------------------------------------------------------------------------------------------
// Validation

void validate_adam_hyper(const AdamHyper& h) {
  auto bad = [](const std::string& what) { throw Error("invalid Adam hyper-parameter: " + what); };
  if (!(h.lr >= 0) || !std::isfinite(h.lr)) bad("learning rate must be a finite number >= 0, got " + shortest_text(h.lr));
  if (!(h.eps >= 0) || !std::isfinite(h.eps)) bad("eps must be a finite number >= 0, got " + shortest_text(h.eps));
  if (!(h.beta1 >= 0 && h.beta1 < 1)) bad("beta1 must be in [0, 1), got " + shortest_text(h.beta1));
  if (!(h.beta2 >= 0 && h.beta2 < 1)) bad("beta2 must be in [0, 1), got " + shortest_text(h.beta2));
  if (!(h.weight_decay >= 0) || !std::isfinite(h.weight_decay))
    bad("weight_decay must be a finite number >= 0, got " + shortest_text(h.weight_decay));
  // the kernels compute in fp32: a value (or lr x weight_decay) beyond its range makes every
  // parameter inf or NaN at the first step
  // (the first step's step size lr / (1 - beta1), the largest of all steps': its bias correction
  // 1 - beta1^t is smallest at t = 1)
  const std::pair<const char*, double> fp32[] = {{"learning rate", h.lr}, {"weight_decay", h.weight_decay},
                                                 {"eps", h.eps}, {"learning rate x weight_decay", h.lr * h.weight_decay},
                                                 {"the first step's step size lr / (1 - beta1)", h.lr / (1 - h.beta1)}};
  for (const auto& [name, v] : fp32)
    if (v > FLT_MAX) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "%s %g overflows fp32 (at most 3.4e38): every parameter would become inf or NaN",
                    name, v);
      bad(msg);
    }
  // eps is the only term of the denominator where the second moment is 0 (a zero gradient): a
  // value > 0 that fp32 rounds to 0 (below about 7e-46) gives 0 / 0, NaN parameters, at the first step
  if (h.eps > 0 && float(h.eps) == 0.0f) {
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "eps %g rounds to 0 in fp32, in which the update is computed (the smallest positive fp32 is "
                  "1.4e-45, which values from about 7.1e-46 round to): a zero gradient would make its parameters "
                  "NaN; give eps 0 deliberately or a value of at least 1e-45",
                  h.eps);
    bad(msg);
  }
}

namespace {

/// What is wrong when two of `tensors` (elements of `esz` bytes) share memory: two parameter
/// ranges that overlap, or two gradient ranges (a parameter and a gradient may: the binding's
/// placeholder until set_gradients), naming the two tensors; "" when none do. Tensors of no
/// element are left out. Throws nothing but std::bad_alloc.
std::string shared_memory_error(const std::vector<TensorView>& tensors, std::size_t esz) {
  struct Span {
    bool grad;  // parameters first, then gradients: each kind by address
    std::uintptr_t lo, hi;
    std::size_t tensor;
    bool operator<(const Span& o) const { return grad != o.grad ? o.grad : lo < o.lo; }
  };
  std::vector<Span> spans;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel == 0) continue;
    for (const bool grad : {false, true}) {
      const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(grad ? tensors[i].grad : tensors[i].param);
      spans.push_back({grad, lo, lo + tensors[i].numel * esz, i});
    }
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t k = 1; k < spans.size(); ++k)
    if (spans[k].grad == spans[k - 1].grad && spans[k].lo < spans[k - 1].hi) {
      const char* what = spans[k].grad ? "gradients" : "parameters";
      return "tensor " + std::to_string(spans[k - 1].tensor) + "'s " + what + " and tensor " +
             std::to_string(spans[k].tensor) + "'s " + what +
             " share memory: each element's parameter and gradient must be its own (give each tensor once)";
    }
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Optimizer

namespace detail {

void submit(struct starpu_task* t, const char* what) {
  const int ret = starpu_task_submit(t);
  if (ret != 0) throw Error(std::string("StarPU refused the ") + what + " task (error " + std::to_string(ret) + ")");
}

std::vector<unsigned> cuda_memory_nodes() {
  std::vector<unsigned> nodes;
  for (unsigned w = 0; w < starpu_worker_get_count(); ++w)
    if (starpu_worker_get_type(int(w)) == STARPU_CUDA_WORKER) nodes.push_back(starpu_worker_get_memory_node(w));
  return nodes;
}

}  // namespace detail

Optimizer::Impl::Impl() { ++g_live_optimizers; }
Optimizer::Impl::~Impl() {
  starpu_task_wait_for_all();  // nothing may still use the buffers freed below
  open.reset();
  if (refined && !rates_path.empty()) {
    try {  // the next run starts from what this one learned
      // a link_share that no phase measured goes back as a first streamed phase's provisional
      // measure, or else as the placeholder (rates_to_save)
      save_rates(rates_path, rates_to_save(rates, link_share_record), calibrated_rates);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[dos] warning: could not save the refined rates: %s\n", e.what());
    }
  }
  sgs.clear();
  if (--g_live_optimizers == 0 && g_shutdown_deferred) {
    g_shutdown_deferred = false;
    starpu_shutdown();
  }
}

struct starpu_task* Optimizer::Impl::make_task(struct starpu_codelet* cl, void* arg, const TaskHint* hint,
                                               uint32_t where) {
  struct starpu_task* t = starpu_task_create();
  t->cl = cl;
  t->cl_arg = arg;
  t->cl_arg_size = 0;
  t->cl_arg_free = 0;
  t->where = where;
  if (use_hints) t->sched_data = const_cast<TaskHint*>(hint);
  return t;
}

struct starpu_task* Optimizer::Impl::adam_task(Subgroup* sg, struct starpu_codelet* cl, void* arg, uint32_t where,
                                               void (*done)(void*)) {
  struct starpu_task* t = make_task(cl, arg, &sg->hint_update, where);
  t->handles[0] = sg->h_state;
  t->callback_func = done;
  t->callback_arg = sg;
  return t;
}

void Optimizer::Impl::with_master_handles(const std::function<void(Subgroup*, starpu_data_handle_t)>& submit_for) {
  std::vector<starpu_data_handle_t> handles;
  handles.reserve(sgs.size());  // no allocation between a register and its bookkeeping
  auto end = [&] {
    starpu_task_wait_for_all();
    for (starpu_data_handle_t h : handles) starpu_data_unregister(h);  // what a task wrote comes home
  };
  try {
    for (auto& sg : sgs) {
      starpu_data_handle_t h = nullptr;
      starpu_vector_data_register(&h, STARPU_MAIN_RAM, uintptr_t(sg->master()), sg->size, sizeof(float));
      handles.push_back(h);
      submit_for(sg.get(), h);
    }
  } catch (...) {
    end();
    throw;
  }
  end();
}

template <class State, class Fn>
void Optimizer::Impl::hold_state(starpu_data_access_mode mode, Fn&& fn) const {
  if (opt.compact_master) {
    // the masters rebuilt into buffers of their own (allocated before anything is touched), the
    // state held as below, and the masters split back after fn when it may have written them
    check_host_memory(nparams * sizeof(float),
                      "the compact master's masters rebuilt in host memory while the state is read or written (" +
                          std::to_string(nparams) + " fp32 values)");
    std::vector<std::vector<float>> masters(sgs.size());
    for (std::size_t k = 0; k < sgs.size(); ++k) masters[k].resize(sgs[k]->size);
    if (mode != STARPU_W)
      for (std::size_t k = 0; k < sgs.size(); ++k) compact_masters(sgs[k].get(), 0, sgs[k]->size, masters[k].data(), false);
    std::size_t k = 0;
    hold_full_or_compact<State>(mode, [&](Subgroup*) { return masters[k++].data(); }, fn);
    if (mode != STARPU_R)
      for (std::size_t j = 0; j < sgs.size(); ++j) compact_masters(sgs[j].get(), 0, sgs[j]->size, masters[j].data(), true);
    return;
  }
  hold_full_or_compact<State>(mode, [](Subgroup* sg) { return sg->master(); }, fn);
}

template <class State, class Master, class Fn>
void Optimizer::Impl::hold_full_or_compact(starpu_data_access_mode mode, Master&& master_of, Fn&& fn) const {
  std::vector<State> state;
  std::vector<starpu_data_handle_t> held;
  state.reserve(sgs.size());
  held.reserve(sgs.size());  // no allocation between an acquire and its bookkeeping
  struct Release {
    std::vector<starpu_data_handle_t>& held;
    ~Release() {
      for (starpu_data_handle_t h : held) starpu_data_release(h);
    }
  } release{held};
  for (const auto& sg : sgs) {
    starpu_data_acquire(sg->h_state, mode);
    held.push_back(sg->h_state);
    state.push_back({master_of(sg.get()), sg->exp_avg(), sg->exp_avg_sq(), sg->size});
  }
  fn(state);
}

void Optimizer::Impl::read_state(float* out, std::size_t slice) const {
  require_no_open_step("reading the optimizer state");
  for (const auto& sg : sgs) {
    if (slice == 0 && opt.compact_master) {
      compact_masters(sg.get(), 0, sg->size, out + sg->begin, false);
      continue;
    }
    starpu_data_acquire(sg->h_state, STARPU_R);  // waits for the tasks writing it, fetches it home
    std::memcpy(out + sg->begin, sg->state.ptr + slice * sg->stride, sg->size * sizeof(float));
    starpu_data_release(sg->h_state);
  }
}

Optimizer::Optimizer(Runtime& runtime, const std::vector<TensorView>& tensors, const OptimizerOptions& options)
    : impl_(new Impl) {
  Impl& I = *impl_;
  I.rt.model = runtime.model_policy();
  I.rt.threads = runtime.cpu_threads();
  I.opt = options;
  I.tensors = tensors;
  validate_adam_hyper(options.adam);
  if (options.compact_master && options.dtype != DType::bf16)
    throw Error(std::string("the compact master needs bf16 parameters (each master is rebuilt from its bf16 "
                            "rounding), got ") + dtype_name(options.dtype) + ": drop compact_master (--master compact)");
  {  // the model's rates: given whole (each > 0 and within the model's bounds), or not at all
    const Rates& r = options.rates;
    const bool none = r.U_c == 0 && r.U_c_dma == 0 && r.U_g == 0 && r.D_c == 0 && r.B_h2d == 0 && r.B_d2h == 0 &&
                      r.link_share == kUnmeasuredLinkShare;
    if (!none && !rates_complete(r))
      throw Error("OptimizerOptions::rates is given in part: give U_c, U_c_dma, U_g, D_c (params/s), B_h2d and "
                  "B_d2h (bytes/s) all finite and > 0 (link_share at least 1/16 and at most U_c / U_c_dma; 1 when not measured), or leave "
                  "them all at their defaults to have them calibrated");
    if (!none)
      if (const std::string e = rate_bounds_error(r); !e.empty()) throw Error("OptimizerOptions::rates: " + e);
    const Rates& c = options.calibrated_rates;
    const bool no_cal = c.U_c == 0 && c.U_c_dma == 0 && c.U_g == 0 && c.D_c == 0 && c.B_h2d == 0 && c.B_d2h == 0 &&
                        c.link_share == kUnmeasuredLinkShare;
    if (!no_cal && none)
      throw Error("OptimizerOptions::calibrated_rates is given without rates: give both from a rates file "
                  "(load_rates), or neither");
    if (!no_cal && !rates_complete(c))
      throw Error("OptimizerOptions::calibrated_rates is given in part: give all of them (a rates file's "
                  "calibrated rates, load_rates), or leave them at their defaults");
    if (!no_cal)
      if (const std::string e = rate_bounds_error(c); !e.empty())
        throw Error("OptimizerOptions::calibrated_rates: " + e);
  }
  if (tensors.empty()) throw Error("no tensors given to the optimizer");
  std::vector<std::size_t> numels;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel > 0 && (!tensors[i].param || !tensors[i].grad))
      throw Error("tensor " + std::to_string(i) + " has a null parameter or gradient pointer");
    numels.push_back(tensors[i].numel);
  }
  std::vector<SubgroupLayout> layout;
  try {
    layout = partition_subgroups(numels, options.subgroup_size);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  for (std::size_t n : numels) I.nparams += n;
  // no memory written twice: the tensors' parameter ranges apart, and their gradient ranges (a
  // gradient pointer may be its parameter's until set_gradients: the binding's placeholder)
  if (const std::string e = shared_memory_error(tensors, dtype_size(options.dtype)); !e.empty()) throw Error(e);
  if (options.memory == MemoryKind::cuda) {
    if (runtime.cuda_workers() == 0)
      throw Error("the parameters live in GPU memory but the runtime has no CUDA worker");
    I.where_caller = STARPU_CUDA;
  }
  const std::size_t esz = dtype_size(options.dtype);
  // The staged gradient: fp32, or the parameters' dtype (native_grads: half the bytes for 16-bit).
  const DType grad_dtype = options.native_grads ? options.dtype : DType::fp32;
  const std::size_t gsz = dtype_size(grad_dtype);
  {  // three page-aligned buffers per subgroup (alloc_host): count the rounding of small subgroups too
    const std::size_t page = 4096;
    auto pages = [&](std::size_t bytes) { return (bytes + page - 1) / page * page; };
    std::size_t need = 0;
    for (const SubgroupLayout& l : layout)
      need += pages(state_bytes_for(l.size)) + pages(l.size * gsz) + pages(l.size * esz);
    check_host_memory(need, "the optimizer state of " + std::to_string(I.nparams) + " parameters in " +
                                std::to_string(layout.size()) + " subgroups");
  }
  // Each subgroup is its own StarPU data handles and tasks: past a few thousand of them their cost
  // outweighs the updates' (on a 2-core machine, the tiny preset in subgroups of 100 elements,
  // 5412 of them: an update phase of 0.76 s against 0.002 s in one subgroup, and 150 MB more host
  // memory, about 28 KB and 0.14 ms per subgroup).
  if (options.verbose && layout.size() > kManySubgroups)
    std::fprintf(stderr,
                 "[dos] warning: %zu subgroups of %zu elements: each is its own StarPU data and tasks, which cost "
                 "tens of KB of host memory and a fraction of a millisecond per update phase; subgroups of 1e6 "
                 "elements or more keep that small\n",
                 layout.size(), std::size_t(options.subgroup_size));
  const PolicyChoice choice = runtime.impl().choice;
  I.choice = choice;
  I.use_hints = !choice.builtin();
  I.workload.caller_on_gpu = options.memory == MemoryKind::cuda;
  I.workload.param_bytes = esz;
  I.workload.grad_bytes = gsz;
  I.workload.compact_master = options.compact_master;
  for (const SubgroupLayout& l : layout) I.workload.sizes.push_back(l.size);
  {  // GPU budgets (OptimizerOptions): what may stay resident, and whether one streamed subgroup fits
    const bool gpu = runtime.cuda_workers() > 0;
    if (options.gpu_resident_budget < -1)
      throw Error("the GPU resident budget must be >= 0 bytes (or -1: not given), got " +
                  std::to_string(options.gpu_resident_budget));
    if (options.gpu_update_budget > 0 && !options.eager_writeback)
      throw Error("a GPU update budget needs the eager write-back (a subgroup's GPU memory is given back when its "
                  "state is home): drop the budget or keep eager_writeback");
    I.cuda_nodes = cuda_memory_nodes();
    // a CPU subgroup's staging on the GPU, for the footprints: none where the runtime copies itself,
    // which it does under a plan only (StarPU's own policies stage by tasks)
    const bool planned = choice.plan != nullptr;
    stage_cpu_copies(I.workload, planned && I.own_grad_download(), planned && I.own_param_upload(),
                     planned && I.own_param_download());
    if (gpu) {
      try {
        apply_gpu_budgets(I.workload, choice.plan.get(), GpuBudgets{options.gpu_resident_budget, options.gpu_update_budget});
      } catch (const std::invalid_argument& e) {
        throw Error(e.what());
      }
    }
    if (gpu && options.gpu_update_budget > 0 && !I.workload.may_stream && options.verbose) {
      std::size_t need_streamed = 0;
      for (std::size_t sz : I.workload.sizes)
        need_streamed = std::max(need_streamed, subgroup_footprint(I.workload, sz, PlanSide::gpu_streamed));
      std::fprintf(stderr, "[dos] the GPU update budget (%s) is below one streamed subgroup's %s: every update "
                           "that is not resident runs on the CPU\n", gb_text(double(options.gpu_update_budget)).c_str(),
                   gb_text(double(need_streamed)).c_str());
    }
  }

  if (runtime.model_policy()) detail::check_calibration_switches();  // refused here too where no calibration runs
  if (runtime.model_policy() && runtime.cuda_workers() > 0) {
    const Rates& r = options.rates;
    const bool given = rates_complete(r);
    // rates from a rates file, with its calibrated rates: started from as from the rates cache
    const bool from_file = given && rates_complete(options.calibrated_rates);
    if (given) {
      I.rates = r;
      I.calibrated_rates = from_file ? options.calibrated_rates : r;
    } else {
      // scratch subgroups as large as the workload's (at most 2^24 elements: a few seconds), before
      // this optimizer's state is allocated (a calibration that fails then fails before the
      // allocation, and its scratch is freed before the state's peak). On the GPU machine the
      // calibrated CPU Adam rate differed by up to 1.7x between processes, calibrated before the
      // allocation or after it; the refinement (refine) measures U_c in the phases' own tasks.
      const std::size_t largest = *std::max_element(I.workload.sizes.begin(), I.workload.sizes.end());
      const std::size_t cal = std::min<std::size_t>(largest, std::size_t(1) << 24);
      I.rates = calibrate_rates(runtime, cal, options.dtype, options.memory, options.recalibrate, options.verbose,
                                &I.calibrated_rates, options.compact_master);
      I.rates_path = rates_cache_path(runtime, cal, options.dtype, options.memory, options.compact_master);
    }
    // the links held to the calibration's (models/refinement.h, kLinkCeiling) where there is one: a
    // calibration, the cache, or a rates file whose calibrated rates are apart; the cache or such a
    // file may hold links refined past the ceiling before the share rule held them
    I.holds_links = !given || (from_file && calibration_apart(r, options.calibrated_rates));
    if (I.holds_links) I.rates = cap_links(I.workload, I.rates, I.calibrated_rates, runtime.cpu_workers());
    I.have_rates = true;
    // rates given: a link_share other than 1 is a measure; calibrated, from the cache or from a
    // rates file: the calibration's own measure is not counted until a phase measures it
    // (models/refinement.h)
    const bool as_measures = given && !from_file;
    I.link_share_record = as_measures ? LinkShareRecord{link_share_is_measured(I.rates), 0}
                                      : initial_link_share_record(I.rates, I.calibrated_rates);
    I.u_c_measured = as_measures;
  }

  for (std::size_t s = 0; s < layout.size(); ++s) {
    auto sg = std::make_unique<Subgroup>();
    sg->begin = layout[s].begin;
    sg->size = layout[s].size;
    sg->stride = state_stride_for(sg->size);
    sg->state = alloc_host(state_bytes_for(sg->size));
    sg->grad32 = alloc_host(sg->size * gsz);
    sg->param16 = alloc_host(sg->size * esz);
    if (options.compact_master)  // the compact layout (codelets.h): its head in the master's slot, ending at exp_avg
      starpu_vector_data_register(&sg->h_state, STARPU_MAIN_RAM, uintptr_t(sg->compact_base()),
                                  compact_head_floats(sg->stride) + 2 * sg->stride, sizeof(float));
    else
      starpu_vector_data_register(&sg->h_state, STARPU_MAIN_RAM, uintptr_t(sg->state.ptr), 3 * sg->stride,
                                  sizeof(float));
    // Staging buffers live in host memory allocated (and pinned) once. Left to StarPU (home node
    // -1, dropped after each phase), their host copies were allocated and pinned again every
    // iteration: the cpu policy's update phase for 1.68e9 parameters took 5.38 s on the GPU
    // machine, 0.58 s with this (docs/measured-2026-11-30.md, "History"). Their contents are
    // dropped after use (invalidate), so nothing is ever written back for them.
    starpu_vector_data_register(&sg->h_grad32, STARPU_MAIN_RAM, uintptr_t(sg->grad32.ptr), sg->size, gsz);
    starpu_vector_data_register(&sg->h_param16, STARPU_MAIN_RAM, uintptr_t(sg->param16.ptr), sg->size, esz);
    for (const Piece& p : layout[s].pieces) {
      const TensorView& t = tensors[p.tensor];
      sg->segs.push_back(Segment{static_cast<char*>(t.param) + p.tensor_offset * esz,
                                 static_cast<char*>(t.grad) + p.tensor_offset * esz, p.offset, p.count});
      sg->seg_src.emplace_back(p.tensor, p.tensor_offset);
    }
    sg->gather_grads = GatherArgs{sg->segs.data(), sg->segs.size(), options.dtype, false, grad_dtype};
    sg->gather_params = GatherArgs{sg->segs.data(), sg->segs.size(), options.dtype, true};
    sg->gather_p16 = GatherArgs{sg->segs.data(), sg->segs.size(), options.dtype, true, options.dtype};
    sg->scatter = ScatterArgs{sg->segs.data(), sg->segs.size(), options.dtype};
    sg->adam_direct = AdamDirectArgs{&sg->adam, sg->segs.data(), sg->segs.size(), options.dtype};
    sg->adam.param_dtype = options.dtype;
    sg->adam.grad_dtype = grad_dtype;
    sg->adam.state_stride = sg->stride;
    sg->adam.compact = options.compact_master;
    sg->hint_update = TaskHint{Side::cpu, unsigned(s)};
    sg->hint_io = TaskHint{Side::any, unsigned(s)};
    sg->hint_scatter = TaskHint{Side::any, unsigned(s)};
    sg->hint_scatter.urgent = options.urgent_writeback;
    sg->window = &I.window;  // the GPU update budget's window, reset at every step
    I.sgs.push_back(std::move(sg));
  }
  // fp32 master parameters from the caller's parameters, converted where they live (a compact state
  // needs nothing: its zeroed lo and r bits make each master the caller's parameter exactly)
  if (!options.compact_master) I.with_master_handles([&](Subgroup* sg, starpu_data_handle_t master) {
    struct starpu_task* t = I.make_task(&gather_cl, &sg->gather_params, &sg->hint_io, I.where_caller);
    t->handles[0] = master;
    submit(t, "master-parameter initialisation");
  });
}

Optimizer::~Optimizer() = default;

std::vector<std::int64_t> Optimizer::step_counts() const {
  std::vector<std::int64_t> out;
  for (const auto& sg : impl_->sgs) out.push_back(sg->step);
  return out;
}

void Optimizer::set_gradients(const std::vector<void*>& grads) {
  Impl& I = *impl_;
  I.require_no_open_step("set_gradients");
  if (grads.size() != I.tensors.size())
    throw Error("set_gradients: " + std::to_string(grads.size()) + " gradient pointers for the optimizer's " +
                std::to_string(I.tensors.size()) + " tensors: give one per tensor, in the order of construction");
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (I.tensors[i].numel > 0 && !grads[i])
      throw Error("set_gradients: tensor " + std::to_string(i) + " (" + std::to_string(I.tensors[i].numel) +
                  " elements) has a null gradient pointer");
  const std::size_t esz = dtype_size(I.opt.dtype);
  {  // the same refusal as at construction: no two tensors' gradients in one place
    std::vector<TensorView> now = I.tensors;
    for (std::size_t i = 0; i < grads.size(); ++i) now[i].grad = grads[i];
    if (const std::string e = shared_memory_error(now, esz); !e.empty()) throw Error("set_gradients: " + e);
  }
  // (no task of this optimizer reads the old buffers: a phase's tasks have ended when it closes,
  // and one still running was refused above)
  for (std::size_t i = 0; i < grads.size(); ++i) I.tensors[i].grad = grads[i];
  for (auto& sg : I.sgs)
    for (std::size_t k = 0; k < sg->segs.size(); ++k)
      sg->segs[k].grad = static_cast<char*>(I.tensors[sg->seg_src[k].first].grad) + sg->seg_src[k].second * esz;
}

void Optimizer::load_state(const float* master, const float* exp_avg, const float* exp_avg_sq,
                           const std::vector<std::int64_t>& steps) {
  if (impl_->nparams > 0 && (!master || !exp_avg || !exp_avg_sq))
    throw Error("load_state: a null master, exp_avg or exp_avg_sq pointer (each must hold num_params() floats)");
  // an Adam state holds finite values and a second moment >= 0: anything else is a damaged or
  // foreign state, refused before a value is replaced (what the Python binding checks, for every
  // caller of the C ABI)
  const std::size_t n = impl_->nparams;
  const std::pair<const char*, const float*> parts[] = {{"master", master}, {"exp_avg", exp_avg},
                                                        {"exp_avg_sq", exp_avg_sq}};
  for (int k = 0; k < 3; ++k) {
    const float* v = parts[k].second;
    const bool second_moment = k == 2;
    const std::size_t first_bad = first_bad_state_value(v, n, second_moment);
    if (first_bad < n)
      throw Error(std::string("the state to load has ") + parts[k].first + " = " + shortest_text(v[first_bad]) +
                  " at element " + std::to_string(first_bad) + ": an Adam state holds finite numbers" +
                  (second_moment ? " and a second moment >= 0" : "") + " (a damaged or foreign state?)");
  }
  std::size_t at = 0;  // subgroups are consecutive in the flat order
  load_state_in_place(steps, [&](const std::vector<HostStateOut>& state) {
    for (const HostStateOut& sg : state) {
      std::memcpy(sg.master, master + at, sg.size * sizeof(float));
      std::memcpy(sg.exp_avg, exp_avg + at, sg.size * sizeof(float));
      std::memcpy(sg.exp_avg_sq, exp_avg_sq + at, sg.size * sizeof(float));
      at += sg.size;
    }
  });
}


void Optimizer::load_state_in_place(const std::vector<std::int64_t>& steps,
                                    const std::function<void(const std::vector<HostStateOut>&)>& fill) {
  Impl& I = *impl_;
  I.require_no_open_step("load_state");
  if (steps.size() != I.sgs.size())
    throw Error("the state to load has " + std::to_string(steps.size()) + " subgroup step counts; this optimizer has " +
                std::to_string(I.sgs.size()) + " subgroups");
  for (std::int64_t st : steps)
    if (st < 0 || st > (std::int64_t(1) << 53))
      throw Error("a subgroup step count in the state to load is " + std::string(st < 0 ? "negative" : "above 2^53") +
                  " (" + std::to_string(st) + ")");
  starpu_task_wait_for_all();
  bool filling = false;  // fill has begun: the state may be partly replaced
  try {
    I.hold_state<HostStateOut>(STARPU_W, [&](const std::vector<HostStateOut>& state) {  // device copies invalidated
      filling = true;
      fill(state);
    });
  } catch (const std::exception& e) {
    // partly replaced (by fill, or a compact state's split back after it): this optimizer must not
    // step again; a failed step's mark stays
    if (filling && (I.broken.empty() || load_mends(I.broken))) I.broken = std::string(kLoadFailed) + e.what();
    throw;
  }
  // the whole state replaced: a load that failed part-way before is mended (a failed step is not:
  // what it left besides the state is unknown)
  if (load_mends(I.broken)) I.broken.clear();
  for (std::size_t i = 0; i < I.sgs.size(); ++i) I.sgs[i]->step = steps[i];
  // the caller's parameters: the loaded master rounded to their dtype, written where they live
  // (a compact state's split wrote them already, hold_state)
  if (!I.opt.compact_master) I.with_master_handles([&](Subgroup* sg, starpu_data_handle_t master) {
    struct starpu_task* c = I.make_task(&cast_cl, &sg->adam, &sg->hint_io, I.where_caller);
    c->handles[0] = master;
    c->handles[1] = sg->h_param16;
    submit(c, "parameter cast");
    struct starpu_task* s = I.make_task(&scatter_cl, &sg->scatter, &sg->hint_io, I.where_caller);
    s->handles[0] = sg->h_param16;
    submit(s, "parameter write-back");
    starpu_data_invalidate_submit(sg->h_param16);
  });
}

void Optimizer::set_plan_override(const PlanOverride& o) {
  if (!impl_->rt.model_policy())
    throw Error("a forced plan (--k, --gpu-fraction) needs a plan with the model's rates (--policy dos), not " +
                impl_->choice.name);
  if (o.kind == PlanOverride::fraction && !(o.value >= 0 && o.value <= 1))
    throw Error("the streamed fraction must be in [0, 1], got " + std::to_string(o.value));
  if (o.kind == PlanOverride::stride && !(o.value >= 1 && o.value == std::floor(o.value)))
    throw Error("the stride k must be a whole number >= 1, got " + std::to_string(o.value));
  impl_->override_ = o;
}
void Optimizer::set_timeline(bool on) { impl_->timeline_on = on; }
void Optimizer::set_hyper(const AdamHyper& h) {
  impl_->require_no_open_step("set_hyper");
  validate_adam_hyper(h);
  impl_->opt.adam = h;  // step() derives each subgroup's constants from it
}
const AdamHyper& Optimizer::hyper() const { return impl_->opt.adam; }
const Rates& Optimizer::rates() const { return impl_->rates; }
const Workload& Optimizer::workload() const { return impl_->workload; }
const Rates& Optimizer::calibrated_rates() const { return impl_->calibrated_rates; }
Execution Optimizer::execution() const { return impl_->execution(); }
std::vector<PlanSide> Optimizer::next_plan() const { return impl_->make_plan(); }

std::size_t Optimizer::num_params() const { return impl_->nparams; }
DType Optimizer::dtype() const { return impl_->opt.dtype; }
std::size_t Optimizer::num_subgroups() const { return impl_->sgs.size(); }
std::size_t Optimizer::subgroup_size(std::size_t i) const { return impl_->sgs.at(i)->size; }
std::int64_t Optimizer::step_count(std::size_t i) const { return impl_->sgs.at(i)->step; }
void Optimizer::with_host_state(const std::function<void(const std::vector<HostState>&)>& fn) const {
  impl_->require_no_open_step("with_host_state");
  impl_->hold_state<HostState>(STARPU_R, fn);  // waits for the tasks writing the state, fetches it home
}

void Optimizer::Impl::copy_master_range(std::size_t begin, std::size_t end, float* at,
                                        enum starpu_data_access_mode mode, const char* what) const {
  require_no_open_step(what);
  if (begin > end || end > nparams)
    throw Error(std::string(what) + ": the range [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") is not inside the optimizer's " + std::to_string(nparams) + " parameters");
  // a write takes the values load_state accepts: an inf or NaN master would make every later step NaN
  if (mode != STARPU_R)
    if (const std::size_t k = first_bad_state_value(at, end - begin, false); k < end - begin)
      throw Error(std::string(what) + ": the value for element " + std::to_string(begin + k) + " is " +
                  std::to_string(at[k]) + "; a master parameter must be finite (nothing was written)");
  for (const auto& sg : sgs) {
    const std::size_t lo = std::max(begin, sg->begin), hi = std::min(end, sg->begin + sg->size);
    if (lo >= hi) continue;
    if (opt.compact_master) {
      compact_masters(sg.get(), lo - sg->begin, hi - sg->begin, at + (lo - begin), mode != STARPU_R);
      continue;
    }
    starpu_data_acquire(sg->h_state, mode);  // waits for the tasks using it, fetches it home
    float* m = sg->master() + (lo - sg->begin);
    if (mode == STARPU_R) std::memcpy(at + (lo - begin), m, (hi - lo) * sizeof(float));
    else std::memcpy(m, at + (lo - begin), (hi - lo) * sizeof(float));
    starpu_data_release(sg->h_state);
  }
}

void Optimizer::read_master_range(std::size_t begin, std::size_t end, float* out) const {
  impl_->copy_master_range(begin, end, out, STARPU_R, "read_master_range");
}

void Optimizer::write_master_range(std::size_t begin, std::size_t end, const float* values) {
  if (begin < end && !values) throw Error("write_master_range: values is null");
  impl_->copy_master_range(begin, end, const_cast<float*>(values), STARPU_RW, "write_master_range");
}

void Optimizer::read_master(float* out) const { impl_->read_state(out, 0); }
void Optimizer::read_exp_avg(float* out) const { impl_->read_state(out, 1); }
void Optimizer::read_exp_avg_sq(float* out) const { impl_->read_state(out, 2); }

}  // namespace dos
