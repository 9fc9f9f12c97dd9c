// dos-train: the main job. Runs N training iterations of a transformer's update phase on the
// runtime, with forward and backward emulated (deterministic gradients from --seed written into
// caller-owned buffers, on the GPU when there is one). See --help.
//
// This file is the run's flow (run, at its end, one step per function above it): the model and the
// job, the runtime and the buffers, the iterations, the outputs. The command line is in options.h,
// --plan-only in plan_only.h, the ranks' job check in job_agreement.h, the job's shard of the model
// and the caller-owned buffers in shard.h, the iteration loop and --sweep in iterations.h, what is
// printed and written about the run in report.h, the gradients and the parameters' broadcast around
// each update in step_io.h, and rank placement and the data-parallel loops in the library
// (runtime/parallel/parallel.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "atomic_file.h"
#include "checkpoint.h"
#include "checkpoint_format.h"
#include "comm.h"
#include "compute_emulator.h"
#include "dos.h"
#include "iterations.h"
#include "job_agreement.h"
#include "memory_check.h"
#include "model_config.h"
#include "options.h"
#include "parallel/parallel.h"
#include "partition.h"
#include "plan.h"
#include "plan_only.h"
#include "report.h"
#include "safetensors.h"
#include "shard.h"
#include "step_io.h"
#include "temp_cleanup.h"

namespace {

using dos::DType;
using dos_train::allocate_buffers;
using dos_train::Args;
using dos_train::backward_ranges;
using dos_train::Buffers;
using dos_train::Checked;
using dos_train::element_counts;
using dos_train::fail;
using dos_train::free_buffers;
using dos_train::Job;
using dos_train::ModelConfig;
using dos_train::ParamTensor;
using dos_train::parse_count;
using dos_train::parse_fraction;
using dos_train::parse_seed;
using dos_train::parse_shard;
using dos_train::shard_tensors;
using dos_train::ShardTensor;
using dos_train::tensor_views;

/// The data-parallel job when dos-train runs under an MPI launcher (null: one process).
std::unique_ptr<dos::Comm> g_comm;

/// Under an MPI launcher of two ranks or more, each rank writes its own --report, --save-params
/// and --timeline (dos::rank_path: PATH.rank-RRRRR-of-WWWWW). Throws nothing but std::bad_alloc.
void name_outputs_per_rank(Args& a) {
  if (g_comm && g_comm->size() > 1) {  // every rank writes its own files
    for (std::string* p : {&a.report, &a.save_params, &a.timeline})
      if (!p->empty()) *p = dos::rank_path(*p, std::size_t(g_comm->rank()), std::size_t(g_comm->size()));
  }
}

/// Data parallelism: under an MPI launcher the job's ranks own one shard each (ZeRO partitioning).
/// Sets j's rank and world to the MPI job's and --shard to match (as the reports and messages name
/// it). Throws std::runtime_error when --shard disagrees with the job, with --sweep, with more than
/// 2048 ranks, or with more ranks than the model has subgroups.
void take_shard_from_mpi_job(Args& a, Job& j) {
  if (a.shard != "0/1" && (j.rank != std::size_t(g_comm->rank()) || j.world != std::size_t(g_comm->size())))
    fail("--shard " + a.shard + " disagrees with the MPI job (rank " + std::to_string(g_comm->rank()) + " of " +
         std::to_string(g_comm->size()) + "): leave --shard out when running under mpirun or srun");
  j.rank = std::size_t(g_comm->rank());
  j.world = std::size_t(g_comm->size());
  if (!a.sweep.empty()) fail("--sweep works with one rank only: leave it out under MPI");
  a.shard = std::to_string(j.rank) + "/" + std::to_string(j.world);  // as the reports and messages name it
  const std::size_t sg_total = (j.total + j.subgroup - 1) / j.subgroup;
  if (j.world > 2048)
    fail(std::to_string(j.world) + " ranks: at most 2048 (the emulated gradients' sums over ranks are exact up to "
         "2048 parts)");
  if (j.world > sg_total)
    fail(std::to_string(j.world) + " ranks for a model of " + std::to_string(j.total) + " parameters in " +
         std::to_string(sg_total) + " subgroup(s) of " + a.subgroup_size +
         " elements: a rank would hold less than one subgroup; use at most " + std::to_string(sg_total) +
         (sg_total == 1 ? " rank" : " ranks") + ", or --subgroup-size " + std::to_string(j.total / j.world) +
         " or less (a checkpoint resumes only with its own subgroup size)");
}

/// Validates everything that decides the job before any work: the model (--preset or --config),
/// --seed, --shard (or the MPI job's, which sets a.seed and may set a.shard), --subgroup-size,
/// --grad-parts, --comm, then every other option (check_options). Throws std::runtime_error (or
/// what the model's and the runtime's checks throw) naming the option at fault.
Job resolve_job(Args& a) {
  Job j;
  j.cfg = a.config.empty() ? dos_train::preset(a.preset) : dos_train::load_hf_config(a.config);
  j.all = dos_train::param_tensors(j.cfg);
  j.total = dos_train::count_params(j.all, j.cfg.name);
  a.seed = parse_seed(a.seed_text);
  parse_shard(a.shard, &j.rank, &j.world);
  j.subgroup = parse_count(a.subgroup_size, "--subgroup-size");
  j.dp = g_comm && g_comm->size() > 1;
  if (j.dp) take_shard_from_mpi_job(a, j);
  if (a.grad_parts < 0 || a.grad_parts > 2048)
    fail("--grad-parts must be 0 (the default: one part per rank) or in [1, 2048] (the data-parallel ranks whose "
         "gradients are summed), got " + std::to_string(a.grad_parts));
  if (!j.dp && (a.comm == "mpi" || a.comm == "nccl"))
    fail("--comm " + a.comm + " chooses the collectives of an MPI job, and this is one process (start it with mpirun "
         "or srun --mpi=pmix, or leave --comm out)");
  // the emulated gradient sums `parts` contributions; under MPI rank r adds parts
  // [r * parts / W, (r + 1) * parts / W) (default: one part per rank), so that a job resumed on
  // another number of ranks with the checkpoint's --grad-parts sees the same gradients
  j.parts = a.grad_parts > 0 ? std::size_t(a.grad_parts) : j.dp ? j.world : 1;
  j.parts_begin = j.dp ? j.rank * j.parts / j.world : 0;
  j.parts_end = j.dp ? (j.rank + 1) * j.parts / j.world : j.parts;
  j.range = dos::shard_range(j.total, j.rank, j.world);
  j.n = j.range.end - j.range.begin;
  j.c = dos_train::check_options(a);
  return j;
}

/// Under MPI, before any other collective: ranks given different jobs would corrupt or hang it.
/// Collective. Throws std::runtime_error naming the options whose values differ between ranks.
void check_ranks_agree(const Args& a, const Job& j) {
  const std::string disagreement =
      dos_train::job_disagreement(*g_comm, dos_train::job_fields(a, j.cfg, j.c, j.subgroup, j.parts));
  if (!disagreement.empty()) fail(disagreement);
}

/// The runtime's options for this rank's job, before the rank's placement (place_rank_on_node):
/// the policy, the workers and threads, and with a GPU update budget StarPU's GPU memory limit
/// (bytes: the budgets' worst case and its own margin). Throws nothing but std::bad_alloc.
dos::RuntimeOptions runtime_options(const Args& a, const Job& j) {
  dos::RuntimeOptions ro;
  ro.policy = a.policy;
  ro.cpu_threads = a.cpu_threads;
  ro.caller_cores = j.c.overlap ? 1 : 0;  // the thread that runs backward keeps a core of its own
  ro.cpu_workers = a.cpu_workers;
  ro.ncuda = a.ncuda;
  ro.verbose = !a.quiet;
  if (j.c.update_budget > 0)  // StarPU keeps what it freed up to this limit: the budgets' worst case, and its own
    ro.gpu_memory_limit =
        dos::gpu_memory_for_budgets(j.n, j.subgroup, dos::dtype_size(j.c.dtype),
                                    a.grad_transfer == "native" ? dos::dtype_size(j.c.dtype) : 4, j.c.update_budget,
                                    j.c.resident_budget, j.c.overlap && a.speculate_streamed == "on") +
        dos::kStarpuDeviceMargin;
  return ro;
}

/// Under MPI: this rank's GPU and cores on its node (dos::choose_gpu, dos::place_rank) into *ro,
/// the placement's warnings printed on stderr. Collective. Returns the placement. Throws what
/// choose_gpu and place_rank throw.
dos::Placement place_rank_on_node(const Args& a, dos::RuntimeOptions* ro) {
  ro->cuda_device = dos::choose_gpu(*g_comm, a.ncuda);
  ro->node_ranks = g_comm->local_size();
  dos::Placement placement = dos::place_rank(*g_comm, ro->cuda_device);
  ro->unbound_reason = placement.unbound_reason;  // oversubscribed: unbound, one thread per worker
  for (const std::string& w : placement.warnings)
    std::fprintf(stderr, "dos-train: warning: rank %d: %s\n", g_comm->rank(), w.c_str());
  return placement;
}

/// Whether the model's buffers go in GPU memory: --device cuda, or auto with a CUDA worker; never
/// in a build without CUDA. Throws std::runtime_error for --device cuda without a CUDA worker.
bool model_on_gpu(const Args& a, const dos::Runtime& rt) {
  bool on_gpu = a.device == "cuda" || (a.device == "auto" && rt.cuda_workers() > 0);
  if (on_gpu && rt.cuda_workers() == 0) fail("--device cuda: no CUDA worker (no GPU, or a build without CUDA)");
#if !defined(DOS_HAVE_CUDA)
  on_gpu = false;
#endif
  return on_gpu;
}

/// Prints dos-train's line: the model, this shard, the optimizer, the dtype, where the buffers are,
/// the policy and, with --master compact, the master's form.
void print_run_line(const Args& a, const Job& j, const dos::Runtime& rt, bool on_gpu) {
  std::printf("dos-train: %s (%s, %zu layers, hidden %lld), %zu of %zu parameters (shard %s), %s, "
              "subgroups of %zu, %s on the %s, policy %s (StarPU: %s)%s\n",
              j.cfg.name.c_str(), j.cfg.arch.c_str(), std::size_t(j.cfg.layers), (long long)j.cfg.hidden, j.n,
              j.total, a.shard.c_str(), a.optimizer == "adamw" ? "AdamW" : "Adam", j.subgroup, a.dtype.c_str(),
              on_gpu ? "GPU" : "host", rt.policy().c_str(), rt.running_policy().c_str(),
              a.master == "compact" ? ", compact master" : "");
}

/// Under MPI: the data-parallel collectives, NCCL on the GPU buffers when every rank can (--comm
/// auto) or --comm nccl asks, else MPI through host memory (null returned); then the ranks printed
/// (print_ranks). Collective. Throws std::runtime_error for --comm nccl where NCCL cannot run
/// (saying why), and what starting NCCL throws.
std::unique_ptr<dos::DeviceComm> start_collectives(const Args& a, const Job& j, int cuda_device,
                                                   const dos::Placement& placement, bool on_gpu) {
  std::unique_ptr<dos::DeviceComm> dcomm;
  const bool can = on_gpu && dos::have_nccl() && cuda_device >= 0 && !placement.gpu_shared;
  if (a.comm == "nccl" && !can)
    fail(std::string("--comm nccl: ") +
         (!dos::have_nccl() ? "this dos-train was built without NCCL"
          : placement.gpu_shared ? "this rank shares its GPU with another rank of the node (NCCL needs one GPU per rank)"
                                 : "the model's buffers are not on a GPU here (--device host, --ncuda 0, or no GPU)") +
         "; use --comm mpi");
  if (a.comm == "nccl" || (a.comm == "auto" && g_comm->all_ok(can))) dcomm = dos::make_nccl_comm(*g_comm, cuda_device);
  dos_train::print_ranks(*g_comm, j.total, placement.words,
                         dcomm ? dcomm->name() + " on GPU buffers" : g_comm->name() + " on host buffers");
  return dcomm;
}

/// StepIO's setup for this rank's job (the buffers, params and grads, not yet set).
dos_train::StepIO::Setup step_io_setup(const Args& a, const Job& j, dos::DeviceComm* device, bool on_gpu) {
  dos_train::StepIO::Setup s;
  s.comm = j.dp ? g_comm.get() : nullptr;
  s.device = device;
  s.total = j.total;
  s.rank = j.rank;
  s.world = j.world;
  s.dtype = j.c.dtype;
  s.on_gpu = on_gpu;
  s.seed = a.seed;
  s.parts = j.parts;
  s.parts_begin = j.parts_begin;
  s.parts_end = j.parts_end;
  s.nan_at = std::uint64_t(a.nan_gradient_at);
  return s;
}

/// Host memory before anything large is allocated (the node's ranks together under MPI:
/// collective), and GPU memory where the emulated compute shares the GPU with an update budget (a
/// warning on stderr). io: step_io_setup's; starpu_limit: RuntimeOptions::gpu_memory_limit, bytes.
/// Throws std::runtime_error when the host memory does not suffice (check_host_need) or CUDA fails.
void check_memory(const Args& a, const Job& j, const dos_train::StepIO::Setup& io,
                  [[maybe_unused]] std::size_t starpu_limit, [[maybe_unused]] bool on_gpu) {
  dos_train::RunMemory need;
  need.io = io;
  need.subgroup = j.subgroup;
  need.native_grads = a.grad_transfer == "native";
  need.save_params = !a.save_params.empty();
  // the compact master's masters rebuilt whole for a checkpoint written or read (with_host_state,
  // load_state_in_place)
  need.compact_state_copy = a.master == "compact" && (!a.save_state.empty() || !a.resume.empty());
  need.model = j.cfg.name;
  need.shard = a.shard;
  dos_train::check_host_need(need);
#if defined(DOS_HAVE_CUDA)
  const std::string gpu_warning = on_gpu && a.emulate_compute
                                      ? dos_train::gpu_need_warning(need, j.cfg, a.tokens, starpu_limit,
                                                                    a.gpu_update_budget, a.gpu_resident_budget,
                                                                    j.c.update_budget)
                                      : "";
  if (!gpu_warning.empty())
    std::fprintf(stderr, "dos-train: warning%s: %s\n", j.dp ? (" (rank " + std::to_string(j.rank) + ")").c_str() : "",
                 gpu_warning.c_str());
#endif
}

/// The optimizer's options for this rank's job: the hyper-parameters, the subgroups, the dtype,
/// where the buffers are, the rates and budgets, and how the update runs.
dos::OptimizerOptions optimizer_options(const Args& a, const Job& j, bool on_gpu) {
  const Checked& c = j.c;
  dos::OptimizerOptions oo;
  oo.adam = c.hyper;
  oo.subgroup_size = j.subgroup;
  oo.dtype = c.dtype;
  oo.memory = on_gpu ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  oo.recalibrate = a.recalibrate;
  if (!a.rates.empty()) oo.rates = c.rates;  // the model's plans use them instead of calibrating
  // a rates file is started from as from the rates cache (its calibration's link_share and U_c not
  // counted as measures); six numbers count as measures
  if (c.rates_from_file) oo.calibrated_rates = c.calibrated;
  oo.verbose = !a.quiet;
  oo.gpu_resident_budget = c.resident_budget;
  oo.gpu_update_budget = c.update_budget;
  oo.stream_lookahead = unsigned(a.stream_lookahead);
  oo.tail_subgroups = c.tail_subgroups;
  oo.eager_writeback = a.writeback == "eager";
  oo.native_grads = a.grad_transfer == "native";
  oo.compact_master = c.compact_master;
  oo.urgent_writeback = a.urgent_writeback;
  oo.submit_order = a.submit_order == "plan" ? dos::SubmitOrder::plan : dos::SubmitOrder::cpu_first;
  oo.speculation_budget = c.speculation_budget;
  oo.speculate_streamed = a.speculate_streamed == "on";
  return oo;
}

/// Forward and backward emulated with the model's GEMMs (--emulate-compute): cuBLAS on the GPU,
/// a scaled-down stand-in (--cpu-scale) on the CPU; its line printed. Null without
/// --emulate-compute. Throws std::runtime_error when CUDA or cuBLAS cannot start.
std::unique_ptr<dos_train::ComputeEmulator> make_compute(const Args& a, const ModelConfig& cfg, DType dtype,
                                                         bool on_gpu) {
  std::unique_ptr<dos_train::ComputeEmulator> compute;
  if (a.emulate_compute) {
    const bool gpu_compute = on_gpu;
    compute = std::make_unique<dos_train::ComputeEmulator>(
        dos_train::forward_gemms(cfg), a.tokens,
        gpu_compute ? dos_train::make_cuda_backend(dtype) : dos_train::make_cpu_backend(), gpu_compute ? 1 : a.cpu_scale);
    std::printf("compute: forward and backward emulated with %s GEMMs of %zu layers (+ head), %lld tokens per "
                "iteration%s\n",
                gpu_compute ? "cuBLAS" : "CPU stand-in", std::size_t(cfg.layers), (long long)compute->tokens(),
                gpu_compute ? "" : (" (every dimension divided by " + std::to_string(a.cpu_scale) + ")").c_str());
  }
  return compute;
}

/// What a checkpoint of this rank's job records (and a resumed one must match), its iteration not
/// yet set.
dos::CheckpointInfo checkpoint_info(const Args& a, const Job& j) {
  dos::CheckpointInfo info;
  info.model = j.cfg.name;
  info.architecture = dos_train::describe_architecture(j.cfg);
  info.params_total = j.total;
  info.begin = j.range.begin;
  info.end = j.range.end;
  info.rank = j.rank;
  info.world = j.world;
  info.subgroup_size = j.subgroup;
  info.dtype = a.dtype;
  info.seed = a.seed;
  info.grad_parts = j.parts;
  info.optimizer = dos::moment_hyper_text(j.c.hyper);
  info.step_hyper = dos::step_hyper_text(j.c.hyper);
  return info;
}

/// --resume: the optimizer's state from the checkpoint `a.resume`, which must match `info`
/// (dos::load_checkpoint re-shards it to this job); prints a note when it was trained with other
/// step hyper-parameters, and "resumed ..." once every rank has (collective under MPI). Returns the
/// iteration it was saved after. Throws what load_checkpoint throws.
std::int64_t resume_from_checkpoint(const Args& a, const Job& j, dos::Optimizer& opt, const dos::CheckpointInfo& info) {
  const dos::CheckpointInfo got = dos::load_checkpoint(a.resume, opt, info);
  const std::int64_t first_iteration = got.iteration;
  if (!got.step_hyper.empty() && got.step_hyper != info.step_hyper && j.rank == 0)
    std::printf("note: the checkpoint was trained with %s; this run goes on from it with %s\n",
                got.step_hyper.c_str(), info.step_hyper.c_str());
  if (j.dp) g_comm->all_ok(true);  // "resumed" only once every rank has (a rank that failed aborts the job)
  std::printf("resumed from %s after iteration %lld\n", a.resume.c_str(), (long long)first_iteration);
  return first_iteration;
}

/// --k or --gpu-fraction: the plan overridden on `opt` (a stride, or a streamed fraction); nothing
/// without either. Throws std::runtime_error for a value that is not a number or a fraction.
void apply_plan_override(const Args& a, dos::Optimizer& opt) {
  if (!a.k.empty() || !a.gpu_fraction.empty()) {
    dos::PlanOverride o;
    o.kind = a.k.empty() ? dos::PlanOverride::fraction : dos::PlanOverride::stride;
    o.value = parse_fraction(a.k.empty() ? a.gpu_fraction : a.k, a.k.empty() ? "--gpu-fraction" : "--k");
    opt.set_plan_override(o);
  }
}

/// Throws std::runtime_error when --nan-gradient-at names none of this run's iterations (those
/// after first_iteration: --iterations, times the --sweep entries).
void check_nan_gradient_at(const Args& a, std::int64_t first_iteration) {
  const std::int64_t last =
      first_iteration + std::int64_t(a.iterations) * std::int64_t(std::max<std::size_t>(1, a.sweep.size()));
  if (a.nan_gradient_at > 0 && (a.nan_gradient_at <= first_iteration || a.nan_gradient_at > last))
    fail("--nan-gradient-at " + std::to_string(a.nan_gradient_at) + " is not one of this run's iterations (" +
         std::to_string(first_iteration + 1) + " to " + std::to_string(last) + "): it would never fire");
}

/// A diverged run (master parameters inf or NaN) is reported, and nothing of it is saved: throws
/// std::runtime_error after iteration `it` when a master parameter of this shard is inf or NaN,
/// naming how many, the first, and the likely cause (--nan-gradient-at without --max-grad-norm,
/// --eps 0, or the run's --lr or --weight-decay).
void check_masters_finite(const Args& a, const Job& j, dos::Optimizer& opt, std::int64_t it) {
  std::size_t nonfinite = 0, first_bad = 0;
  float first_value = 0;
  auto count = [&](const float* master, std::size_t size, std::size_t at) {
    for (std::size_t k = 0; k < size; ++k)
      if (!std::isfinite(master[k]) && nonfinite++ == 0) first_bad = at + k, first_value = master[k];
  };
  if (a.master == "compact") {  // the masters rebuilt one subgroup at a time (with_host_state: all at once)
    std::vector<float> buf;
    for (std::size_t s = 0, at = 0; s < opt.num_subgroups(); at += opt.subgroup_size(s), ++s) {
      buf.resize(opt.subgroup_size(s));
      opt.read_master_range(at, at + buf.size(), buf.data());
      count(buf.data(), buf.size(), j.range.begin + at);
    }
  } else {
    opt.with_host_state([&](const std::vector<dos::Optimizer::HostState>& state) {
      std::size_t at = j.range.begin;
      for (const dos::Optimizer::HostState& sg : state) {
        count(sg.master, sg.size, at);
        at += sg.size;
      }
    });
  }
  if (nonfinite > 0)
    fail("after iteration " + std::to_string(it) + ", " + std::to_string(nonfinite) + " of the " + std::to_string(j.n) +
         " master parameters are inf or NaN (the first, element " + std::to_string(first_bad) + ", is " +
         std::to_string(first_value) + "): " +
         (a.nan_gradient_at > 0 && a.max_grad_norm == 0
              ? "--nan-gradient-at put a NaN into the gradients and without --max-grad-norm nothing skips that step "
                "(give --max-grad-norm N to have a non-finite gradient's step skipped)"
              : a.eps == 0
                    ? "the run diverged; with --eps 0 a parameter whose gradient and second moment are 0 becomes "
                      "0 / 0 = NaN (give --eps > 0, e.g. 1e-8)"
                    : "the run diverged (lower --lr or --weight-decay)") +
         "; nothing was saved");
}

/// --save-params: this shard's fp32 master parameters as a safetensors file, written but not put in
/// place (PendingFile::commit); a tensor cut by the shard is saved as its part, flat, with its
/// offset in the metadata. Null without --save-params. Throws std::runtime_error when the file
/// cannot be written.
std::unique_ptr<dos::PendingFile> prepare_params_file(const Args& a, const Job& j,
                                                      const std::vector<ShardTensor>& tensors, dos::Optimizer& opt) {
  if (a.save_params.empty()) return nullptr;
  std::vector<float> master(j.n);
  opt.read_master(master.data());
  std::vector<dos::SafetensorOut> out;
  std::map<std::string, std::string> meta = {{"model", j.cfg.name}, {"shard", a.shard},
                                             {"format", "fp32 master parameters after the last iteration"}};
  for (const ShardTensor& st : tensors) {
    const std::vector<std::int64_t> shape = st.whole() ? st.t.shape : std::vector<std::int64_t>{std::int64_t(st.count)};
    if (!st.whole()) meta[st.t.name + ".offset"] = std::to_string(st.tensor_offset);
    out.push_back({st.t.name, "F32", shape, master.data() + (st.global_begin - j.range.begin), st.count * sizeof(float)});
  }
  return dos::prepare_safetensors(a.save_params, out, meta);
}

/// What the run produced, for its report: the iterations' rows, the sweep and the main run's summary.
struct RunResults {
  const dos_train::IterationLog* log = nullptr;
  const nlohmann::ordered_json* sweep = nullptr;  ///< the report's "sweep" (empty without --sweep)
  const dos_train::Summary* summary = nullptr;    ///< null for a sweep (no main run)
  const dos_train::ComputeEmulator* compute = nullptr;
};

/// --report: the run's JSON (report_json), written but not put in place (PendingFile::commit). Null
/// without --report. Throws std::runtime_error when the file cannot be written.
std::unique_ptr<dos::PendingFile> prepare_report(const Args& a, const Job& j, bool on_gpu, const dos::Runtime& rt,
                                                 const dos::Optimizer& opt, const RunResults& r) {
  if (a.report.empty()) return nullptr;
  dos_train::RunFacts facts;
  facts.args = &a;
  facts.model = &j.cfg;
  facts.total = j.total;
  facts.n = j.n;
  facts.subgroup = j.subgroup;
  facts.resident_budget = j.c.resident_budget;
  facts.update_budget = j.c.update_budget;
  facts.tail_subgroups = j.c.tail_subgroups;
  facts.on_gpu = on_gpu;
  const nlohmann::ordered_json rep = dos_train::report_json(facts, rt, opt, *r.log, *r.sweep, r.summary, r.compute);
  const std::string text = rep.dump(2) + "\n";
  return std::make_unique<dos::PendingFile>(a.report, dos::Chunks{{text.data(), text.size()}});
}

/// --save-state: the optimizer's state after iteration `it` saved as a checkpoint folder (every
/// rank's part, collective under MPI), and its line printed. Throws what dos::save_checkpoint
/// throws.
void save_state(const Args& a, const Job& j, const dos::Optimizer& opt, dos::CheckpointInfo info, std::int64_t it) {
  info.iteration = it;
  dos::CheckpointRanks ranks_io;
  if (j.dp) {
    ranks_io.all_ok = [](bool ok) { return g_comm->all_ok(ok); };
    ranks_io.from_rank0 = [](long long v) {
      g_comm->broadcast(&v, sizeof v, 0);
      return v;
    };
  }
  dos::save_checkpoint(a.save_state, opt, info, j.dp ? &ranks_io : nullptr);
  std::printf("saved the optimizer state after iteration %lld to %s\n", (long long)it, a.save_state.c_str());
}

/// --timeline: the last recorded iteration's JSON (timeline_json; it: its number), written but not
/// put in place (PendingFile::commit). Null without --timeline. Throws std::runtime_error when the
/// file cannot be written.
std::unique_ptr<dos::PendingFile> prepare_timeline(const Args& a, const Job& j, const dos::Runtime& rt,
                                                   const dos::Optimizer& opt, const dos_train::IterationLog& log,
                                                   std::int64_t it) {
  if (a.timeline.empty()) return nullptr;
  const std::string text = dos_train::timeline_json(rt, opt, log, it, j.n);
  return std::make_unique<dos::PendingFile>(a.timeline, dos::Chunks{{text.data(), text.size()}});
}

/// The run: the job checked, then (unless --plan-only) the runtime, the buffers and the optimizer,
/// the iterations (or the sweep), the summary, and the outputs. Returns the exit status, 0. Throws
/// std::runtime_error (or the runtime's dos::Error) with the message to print.
int run(const Args& args) {
  Args a = args;
  name_outputs_per_rank(a);
  // ---- validate everything before any work --------------------------------------------------
  const Job job = resolve_job(a);
  if (job.dp) check_ranks_agree(a, job);  // before any other collective
  const std::vector<ShardTensor> tensors = shard_tensors(job.all, job.range);
  if (a.plan_only)
    return dos_train::run_plan_only(a, job.c, job.cfg.name, element_counts(tensors), job.total, job.subgroup);
  // a checkpoint of another model or setting is said before any memory is counted or taken
  if (!a.resume.empty()) dos::check_resumable(a.resume, checkpoint_info(a, job));
  // ---- runtime and caller-owned buffers ------------------------------------------------------
  dos::RuntimeOptions ro = runtime_options(a, job);
  const dos::Placement placement = job.dp ? place_rank_on_node(a, &ro) : dos::Placement{};
  // what can be told before StarPU starts; the whole need, the node's ranks together, below
  dos_train::check_state_lower_bound(job.n, job.subgroup, job.c.dtype, a.grad_transfer == "native", job.cfg.name,
                                     a.shard);
  dos::Runtime rt(ro);
  dos::remove_temporaries_on_signal();  // after StarPU's own handlers, which it then calls
  const bool on_gpu = model_on_gpu(a, rt);
  print_run_line(a, job, rt, on_gpu);
  // The data-parallel collectives: NCCL on the GPU buffers when every rank can (--comm auto), else
  // MPI through host memory.
  const std::unique_ptr<dos::DeviceComm> dcomm =
      job.dp ? start_collectives(a, job, ro.cuda_device, placement, on_gpu) : nullptr;
  dos_train::StepIO::Setup io_setup = step_io_setup(a, job, dcomm.get(), on_gpu);
  check_memory(a, job, io_setup, ro.gpu_memory_limit, on_gpu);
  const Buffers buffers = allocate_buffers(job, tensors, a.seed, on_gpu);
  const std::vector<dos::TensorView> views = tensor_views(tensors, job.range, buffers, dos::dtype_size(job.c.dtype));
  const dos::OptimizerOptions oo = optimizer_options(a, job, on_gpu);
  // the node's ranks calibrate (when they do) at the same time: the rates then include the other
  // ranks' DMA and CPU Adam on the shared host memory
  if (job.dp) g_comm->all_ok(true);
  dos::Optimizer opt(rt, views, oo);
  const std::unique_ptr<dos_train::ComputeEmulator> compute = make_compute(a, job.cfg, job.c.dtype, on_gpu);
  if (!a.timeline.empty()) opt.set_timeline(true);
  const dos::CheckpointInfo ckpt = checkpoint_info(a, job);
  const std::int64_t first_iteration = a.resume.empty() ? 0 : resume_from_checkpoint(a, job, opt, ckpt);

  // ---- iterations ------------------------------------------------------------------------------
  dos_train::print_resident_plan(rt, opt, job.n);
  apply_plan_override(a, opt);
  dos_train::print_model_choice(rt, opt);
  check_nan_gradient_at(a, first_iteration);
  io_setup.params = buffers.params;
  io_setup.grads = buffers.grads;
  dos_train::StepIO io(io_setup);
  dos_train::IterationLog log(rt, compute.get(), on_gpu, job.total, job.dp ? job.world : 0,
                              dcomm ? dcomm->name() : job.dp ? g_comm->name() : std::string());
  // iterations numbered across resumes: the gradients depend on the number
  dos_train::TrainingLoop loop({&opt, &io, &log, compute.get(), backward_ranges(job.cfg, tensors, job.range), job.n,
                                job.c.overlap, a.max_grad_norm, first_iteration});
  const nlohmann::ordered_json sweep = a.sweep.empty() ? nlohmann::ordered_json::array()
                                                       : dos_train::run_sweep(loop, opt, a.sweep, a.iterations, job.n);
  const std::vector<dos::StepStats> main_run =
      a.sweep.empty() ? loop.run(a.iterations, "") : std::vector<dos::StepStats>{};
  const dos_train::Summary summary = dos_train::print_summary(main_run, log, job.n, opt.num_subgroups(), a.iterations,
                                                              compute.get(), on_gpu);

  // ---- outputs ---------------------------------------------------------------------------------
  check_masters_finite(a, job, opt, loop.iteration());
  // Outputs are written to temporary files first and put in place together: a failure leaves
  // neither behind.
  const std::unique_ptr<dos::PendingFile> params_file = prepare_params_file(a, job, tensors, opt);
  const std::unique_ptr<dos::PendingFile> report_file =
      prepare_report(a, job, on_gpu, rt, opt, {&log, &sweep, main_run.empty() ? nullptr : &summary, compute.get()});
  if (!a.save_state.empty()) save_state(a, job, opt, ckpt, loop.iteration());
  const std::unique_ptr<dos::PendingFile> timeline_file = prepare_timeline(a, job, rt, opt, log, loop.iteration());
  if (params_file) params_file->commit();
  if (report_file) report_file->commit();
  if (timeline_file) timeline_file->commit();
  if (params_file)
    std::printf("saved %zu fp32 master parameters to %s%s\n", job.n, a.save_params.c_str(),
                job.dp ? " (each rank its own shard's file: .rank-RRRRR-of-WWWWW)" : "");
  free_buffers(buffers);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int rc = dos_train::parse_command_line(argc, argv, a); rc >= 0) return rc;
  if (!a.copy_by.empty()) {  // read once by the runtime, at its first copy; set before MPI starts threads
    const char* env = std::getenv("DOS_COPY_BY");
    if (env && *env && a.copy_by != env && !a.quiet)
      std::fprintf(stderr, "dos-train: DOS_COPY_BY=%s is replaced by --copy-by %s\n", env, a.copy_by.c_str());
    setenv("DOS_COPY_BY", a.copy_by.c_str(), 1);
  }
  try {
    if (dos::launched_by_mpi() && dos::have_mpi()) {
      g_comm = dos::make_mpi_comm();
      if (g_comm->rank() != 0 && g_comm->size() > 1 && !std::freopen("/dev/null", "w", stdout))
        std::fprintf(stderr, "dos-train: warning: rank %d could not silence its standard output\n", g_comm->rank());
    }
    if (!g_comm && dos::launcher_tasks() > 1)  // several copies, each training the whole model alone
      throw std::runtime_error(
          "started as " + std::to_string(dos::launcher_tasks()) + " tasks without MPI (" +
          (dos::have_mpi() ? std::string("srun without --mpi=pmix or pmi2?")
                           : std::string("this dos-train was built without MPI: install libopenmpi-dev and rebuild "
                                         "with scripts/setup.sh build")) +
          "): each would train the whole model and overwrite the others' files");
    const int rc = run(a);
    g_comm.reset();  // MPI_Finalize
    return rc;
  } catch (const std::exception& e) {
    if (g_comm && g_comm->size() > 1) {
      std::fprintf(stderr, "dos-train: error on rank %d of %d: %s\n", g_comm->rank(), g_comm->size(), e.what());
      std::fflush(stderr);
      // The other ranks may be waiting in a collective: end the job. A failure every rank learns of
      // (a checkpoint's) is reported by the rank it happened on too: give its message a moment to
      // get out before the abort takes the job down.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      g_comm->abort(1);
    }
    std::fprintf(stderr, "dos-train: error: %s\n", e.what());
    return 1;
  }
}
