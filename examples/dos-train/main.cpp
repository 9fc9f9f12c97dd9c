// dos-train: the main job. Runs N training iterations of a transformer's update phase on the
// runtime, with forward and backward emulated (deterministic gradients from --seed written into
// caller-owned buffers, on the GPU when there is one). See --help.
//
// This file is the run's flow: the model and the job, the runtime and the buffers, the iterations
// (iterations.h), the outputs. The command line is in options.h, what is printed and written about
// the run in report.h, the gradients and the parameters' broadcast around each update in step_io.h,
// and rank placement and the data-parallel loops in the library (runtime/parallel/parallel.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "emulate.h"
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
#include "step_io.h"
#include "temp_cleanup.h"

namespace {

using dos::DType;
using dos_train::Args;
using dos_train::Checked;
using dos_train::fail;
using dos_train::ModelConfig;
using dos_train::ParamTensor;
using dos_train::parse_count;
using dos_train::parse_fraction;
using dos_train::parse_seed;
using dos_train::parse_shard;

/// The data-parallel job when dos-train runs under an MPI launcher (null: one process).
std::unique_ptr<dos::Comm> g_comm;

/// A tensor, or the part of it that falls in this rank's shard.
struct ShardTensor {
  ParamTensor t;
  std::size_t global_begin;   // flat index of its first element in the whole model
  std::size_t tensor_offset;  // first element inside the tensor
  std::size_t count;
  bool whole() const { return tensor_offset == 0 && count == t.numel(); }
};

std::vector<ShardTensor> shard_tensors(const std::vector<ParamTensor>& all, dos::ShardRange r) {
  std::vector<ShardTensor> out;
  std::size_t flat = 0;
  for (const ParamTensor& t : all) {
    const std::size_t b = std::max(flat, r.begin), e = std::min(flat + t.numel(), r.end);
    if (b < e) out.push_back({t, b, b - flat, e - b});
    flat += t.numel();
  }
  return out;
}

/// Initial value of element i of the piece `st`: a function of its index in the whole model, so that
/// every shard starts from its slice of the unsharded model's parameters.
float init_value(const ShardTensor& st, std::size_t i, std::uint64_t seed) {
  switch (st.t.kind) {
    case dos_train::TensorKind::norm: return 1.0f;
    case dos_train::TensorKind::bias: return 0.0f;
    default: return dos_train::normal_like(seed, 1, st.global_begin + i) * 0.02f;
  }
}

void* host_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) fail("cannot allocate " + std::to_string(bytes) + " bytes");
  return p;
}

/// The elements of each of `tensors`, in order.
std::vector<std::size_t> element_counts(const std::vector<ShardTensor>& tensors) {
  std::vector<std::size_t> numels;
  for (const ShardTensor& st : tensors) numels.push_back(st.count);
  return numels;
}

int run(const Args& args) {
  Args a = args;
  if (g_comm && g_comm->size() > 1) {  // every rank writes its own files
    for (std::string* p : {&a.report, &a.save_params, &a.timeline})
      if (!p->empty()) *p = dos::rank_path(*p, std::size_t(g_comm->rank()), std::size_t(g_comm->size()));
  }
  // ---- validate everything before any work --------------------------------------------------
  ModelConfig cfg = a.config.empty() ? dos_train::preset(a.preset) : dos_train::load_hf_config(a.config);
  const std::vector<ParamTensor> all = dos_train::param_tensors(cfg);
  const std::size_t total = dos_train::count_params(all, cfg.name);
  a.seed = parse_seed(a.seed_text);
  std::size_t rank = 0, world = 1;
  parse_shard(a.shard, &rank, &world);
  const std::size_t subgroup = parse_count(a.subgroup_size, "--subgroup-size");
  // Data parallelism: under an MPI launcher the job's ranks own one shard each (ZeRO partitioning).
  const bool dp = g_comm && g_comm->size() > 1;
  if (dp) {
    if (a.shard != "0/1" && (rank != std::size_t(g_comm->rank()) || world != std::size_t(g_comm->size())))
      fail("--shard " + a.shard + " disagrees with the MPI job (rank " + std::to_string(g_comm->rank()) + " of " +
           std::to_string(g_comm->size()) + "): leave --shard out when running under mpirun or srun");
    rank = std::size_t(g_comm->rank());
    world = std::size_t(g_comm->size());
    if (!a.sweep.empty()) fail("--sweep works with one rank only: leave it out under MPI");
    a.shard = std::to_string(rank) + "/" + std::to_string(world);  // as the reports and messages name it
    const std::size_t sg_total = (total + subgroup - 1) / subgroup;
    if (world > 2048)
      fail(std::to_string(world) + " ranks: at most 2048 (the emulated gradients' sums over ranks are exact up to "
           "2048 parts)");
    if (world > sg_total)
      fail(std::to_string(world) + " ranks for a model of " + std::to_string(total) + " parameters in " +
           std::to_string(sg_total) + " subgroup(s) of " + a.subgroup_size +
           " elements: a rank would hold less than one subgroup; use at most " + std::to_string(sg_total) +
           (sg_total == 1 ? " rank" : " ranks") + ", or --subgroup-size " + std::to_string(total / world) +
           " or less (a checkpoint resumes only with its own subgroup size)");
  }
  if (a.grad_parts < 0 || a.grad_parts > 2048)
    fail("--grad-parts must be 0 (the default: one part per rank) or in [1, 2048] (the data-parallel ranks whose "
         "gradients are summed), got " + std::to_string(a.grad_parts));
  if (!dp && (a.comm == "mpi" || a.comm == "nccl"))
    fail("--comm " + a.comm + " chooses the collectives of an MPI job, and this is one process (start it with mpirun "
         "or srun --mpi=pmix, or leave --comm out)");
  // the emulated gradient sums `parts` contributions; under MPI rank r adds parts
  // [r * parts / W, (r + 1) * parts / W) (default: one part per rank), so that a job resumed on
  // another number of ranks with the checkpoint's --grad-parts sees the same gradients
  const std::size_t parts = a.grad_parts > 0 ? std::size_t(a.grad_parts) : dp ? world : 1;
  const std::size_t my_parts_begin = dp ? rank * parts / world : 0, my_parts_end = dp ? (rank + 1) * parts / world : parts;
  const dos::ShardRange range = dos::shard_range(total, rank, world);
  const std::size_t n = range.end - range.begin;
  const Checked c = dos_train::check_options(a);
  const DType dtype = c.dtype;
  if (dp) {  // before any other collective: ranks given different jobs would corrupt or hang it
    const std::string disagreement =
        dos_train::job_disagreement(*g_comm, dos_train::job_fields(a, cfg, c, subgroup, parts));
    if (!disagreement.empty()) fail(disagreement);
  }
  const std::vector<ShardTensor> tensors = shard_tensors(all, range);
  if (a.plan_only) return dos_train::run_plan_only(a, c, cfg.name, element_counts(tensors), total, subgroup);
  // ---- runtime and caller-owned buffers ------------------------------------------------------
  const bool overlap = c.overlap;
  dos::RuntimeOptions ro;
  ro.policy = a.policy;
  ro.cpu_threads = a.cpu_threads;
  ro.caller_cores = overlap ? 1 : 0;  // the thread that runs backward keeps a core of its own
  ro.cpu_workers = a.cpu_workers;
  ro.ncuda = a.ncuda;
  ro.verbose = !a.quiet;
  if (c.update_budget > 0)  // StarPU keeps what it freed up to this limit: the budgets' worst case, and its own
    ro.gpu_memory_limit =
        dos::gpu_memory_for_budgets(n, subgroup, dos::dtype_size(dtype),
                                    a.grad_transfer == "native" ? dos::dtype_size(dtype) : 4, c.update_budget,
                                    c.resident_budget, overlap && a.speculate_streamed == "on") +
        dos::kStarpuDeviceMargin;
  dos::Placement placement;
  if (dp) {
    ro.cuda_device = dos::choose_gpu(*g_comm, a.ncuda);
    ro.node_ranks = g_comm->local_size();
    placement = dos::place_rank(*g_comm, ro.cuda_device);
    ro.unbound_reason = placement.unbound_reason;  // oversubscribed: unbound, one thread per worker
    for (const std::string& w : placement.warnings)
      std::fprintf(stderr, "dos-train: warning: rank %d: %s\n", g_comm->rank(), w.c_str());
  }
  // what can be told before StarPU starts; the whole need, the node's ranks together, below
  dos_train::check_state_lower_bound(n, subgroup, dtype, a.grad_transfer == "native", cfg.name, a.shard);
  dos::Runtime rt(ro);
  dos::remove_temporaries_on_signal();  // after StarPU's own handlers, which it then calls
  bool on_gpu = a.device == "cuda" || (a.device == "auto" && rt.cuda_workers() > 0);
  if (on_gpu && rt.cuda_workers() == 0) fail("--device cuda: no CUDA worker (no GPU, or a build without CUDA)");
#if !defined(DOS_HAVE_CUDA)
  on_gpu = false;
#endif
  const std::size_t esz = dos::dtype_size(dtype);

  std::printf("dos-train: %s (%s, %zu layers, hidden %lld), %zu of %zu parameters (shard %s), %s, "
              "subgroups of %zu, %s on the %s, policy %s (StarPU: %s)\n",
              cfg.name.c_str(), cfg.arch.c_str(), std::size_t(cfg.layers), (long long)cfg.hidden, n, total,
              a.shard.c_str(), a.optimizer == "adamw" ? "AdamW" : "Adam", subgroup, a.dtype.c_str(),
              on_gpu ? "GPU" : "host", rt.policy().c_str(), rt.running_policy().c_str());

  // The data-parallel collectives: NCCL on the GPU buffers when every rank can (--comm auto), else
  // MPI through host memory.
  std::unique_ptr<dos::DeviceComm> dcomm;
  if (dp) {
    const bool can = on_gpu && dos::have_nccl() && ro.cuda_device >= 0 && !placement.gpu_shared;
    if (a.comm == "nccl" && !can)
      fail(std::string("--comm nccl: ") +
           (!dos::have_nccl() ? "this dos-train was built without NCCL"
            : placement.gpu_shared ? "this rank shares its GPU with another rank of the node (NCCL needs one GPU per rank)"
                                   : "the model's buffers are not on a GPU here (--device host, --ncuda 0, or no GPU)") +
           "; use --comm mpi");
    if (a.comm == "nccl" || (a.comm == "auto" && g_comm->all_ok(can))) dcomm = dos::make_nccl_comm(*g_comm, ro.cuda_device);
    dos_train::print_ranks(*g_comm, total, placement.words,
                           dcomm ? dcomm->name() + " on GPU buffers" : g_comm->name() + " on host buffers");
  }

  dos_train::StepIO::Setup io_setup;
  io_setup.comm = dp ? g_comm.get() : nullptr;
  io_setup.device = dcomm.get();
  io_setup.total = total;
  io_setup.rank = rank;
  io_setup.world = world;
  io_setup.dtype = dtype;
  io_setup.on_gpu = on_gpu;
  io_setup.seed = a.seed;
  io_setup.parts = parts;
  io_setup.parts_begin = my_parts_begin;
  io_setup.parts_end = my_parts_end;
  io_setup.nan_at = std::uint64_t(a.nan_gradient_at);
  // Host memory before anything large is allocated (the node's ranks together under MPI), and GPU
  // memory where the emulated compute shares the GPU with an update budget (a warning)
  dos_train::RunMemory need;
  need.io = io_setup;
  need.subgroup = subgroup;
  need.native_grads = a.grad_transfer == "native";
  need.save_params = !a.save_params.empty();
  need.model = cfg.name;
  need.shard = a.shard;
  dos_train::check_host_need(need);
#if defined(DOS_HAVE_CUDA)
  const std::string gpu_warning = on_gpu && a.emulate_compute
                                      ? dos_train::gpu_need_warning(need, cfg, a.tokens, ro.gpu_memory_limit,
                                                                    a.gpu_update_budget, a.gpu_resident_budget, c.update_budget)
                                      : "";
  if (!gpu_warning.empty())
    std::fprintf(stderr, "dos-train: warning%s: %s\n", dp ? (" (rank " + std::to_string(rank) + ")").c_str() : "",
                 gpu_warning.c_str());
#endif
  std::vector<char> init(n * esz);
  for (const ShardTensor& st : tensors) {
    const std::size_t base = st.global_begin - range.begin;
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < st.count; ++i)
      dos::store_from_f32(init.data(), dtype, base + i, init_value(st, i, a.seed));
  }
  void *params = nullptr, *grads = nullptr;
#if defined(DOS_HAVE_CUDA)
  if (on_gpu) {
    params = dos_train::cuda_alloc(n * esz);
    grads = dos_train::cuda_alloc(n * esz);
    dos_train::cuda_copy_to_device(params, init.data(), n * esz);
  }
#endif
  if (!on_gpu) {
    params = host_alloc(n * esz);
    grads = host_alloc(n * esz);
    std::memcpy(params, init.data(), n * esz);
    // committed now, as counted: a speculative update's budget (half of what is free when it first
    // comes, before backward has written every gradient) would take untouched pages for free
    std::memset(grads, 0, n * esz);
  }
  std::vector<char>().swap(init);

  std::vector<dos::TensorView> views;
  for (const ShardTensor& st : tensors) {
    const std::size_t off = (st.global_begin - range.begin) * esz;
    views.push_back({static_cast<char*>(params) + off, static_cast<char*>(grads) + off, st.count});
  }
  dos::OptimizerOptions oo;
  oo.adam = c.hyper;
  oo.subgroup_size = subgroup;
  oo.dtype = dtype;
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
  oo.urgent_writeback = a.urgent_writeback;
  oo.submit_order = a.submit_order == "plan" ? dos::SubmitOrder::plan : dos::SubmitOrder::cpu_first;
  oo.speculation_budget = c.speculation_budget;
  oo.speculate_streamed = a.speculate_streamed == "on";
  // the node's ranks calibrate (when they do) at the same time: the rates then include the other
  // ranks' DMA and CPU Adam on the shared host memory
  if (dp) g_comm->all_ok(true);
  dos::Optimizer opt(rt, views, oo);
  // Forward and backward emulated with the model's GEMMs (--emulate-compute): cuBLAS on the GPU,
  // a scaled-down stand-in on the CPU.
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
  if (!a.timeline.empty()) opt.set_timeline(true);
  dos::CheckpointInfo job;
  job.model = cfg.name;
  job.architecture = dos_train::describe_architecture(cfg);
  job.params_total = total;
  job.begin = range.begin;
  job.end = range.end;
  job.rank = rank;
  job.world = world;
  job.subgroup_size = subgroup;
  job.dtype = a.dtype;
  job.seed = a.seed;
  job.grad_parts = parts;
  job.optimizer = dos::moment_hyper_text(c.hyper);
  job.step_hyper = dos::step_hyper_text(c.hyper);
  std::int64_t first_iteration = 0;
  if (!a.resume.empty()) {
    const dos::CheckpointInfo got = dos::load_checkpoint(a.resume, opt, job);
    first_iteration = got.iteration;
    if (!got.step_hyper.empty() && got.step_hyper != job.step_hyper && rank == 0)
      std::printf("note: the checkpoint was trained with %s; this run goes on from it with %s\n",
                  got.step_hyper.c_str(), job.step_hyper.c_str());
    if (dp) g_comm->all_ok(true);  // "resumed" only once every rank has (a rank that failed aborts the job)
    std::printf("resumed from %s after iteration %lld\n", a.resume.c_str(), (long long)first_iteration);
  }


  // ---- iterations ------------------------------------------------------------------------------
  dos_train::print_resident_plan(rt, opt, n);
  if (!a.k.empty() || !a.gpu_fraction.empty()) {
    dos::PlanOverride o;
    o.kind = a.k.empty() ? dos::PlanOverride::fraction : dos::PlanOverride::stride;
    o.value = parse_fraction(a.k.empty() ? a.gpu_fraction : a.k, a.k.empty() ? "--gpu-fraction" : "--k");
    opt.set_plan_override(o);
  }
  dos_train::print_model_choice(rt, opt);
  {
    const std::int64_t last =
        first_iteration + std::int64_t(a.iterations) * std::int64_t(std::max<std::size_t>(1, a.sweep.size()));
    if (a.nan_gradient_at > 0 && (a.nan_gradient_at <= first_iteration || a.nan_gradient_at > last))
      fail("--nan-gradient-at " + std::to_string(a.nan_gradient_at) + " is not one of this run's iterations (" +
           std::to_string(first_iteration + 1) + " to " + std::to_string(last) + "): it would never fire");
  }
  io_setup.params = params;
  io_setup.grads = grads;
  dos_train::StepIO io(io_setup);
  dos_train::IterationLog log(rt, compute.get(), on_gpu, total, dp ? world : 0,
                              dcomm ? dcomm->name() : dp ? g_comm->name() : std::string());
  // Backward's order of the gradients: the ranges (shard-local) whose gradients each group's
  // backward makes final (compute_emulator.h, backward_group), one entry per group.
  dos_train::GroupRanges release(std::size_t(cfg.layers) + 2);
  for (const ShardTensor& st : tensors) {
    const std::size_t lo = st.global_begin - range.begin;
    release[dos_train::backward_group(cfg, st.t.name)].push_back({lo, lo + st.count});
  }
  // iterations numbered across resumes: the gradients depend on the number
  dos_train::TrainingLoop loop(
      {&opt, &io, &log, compute.get(), std::move(release), n, overlap, a.max_grad_norm, first_iteration});
  const nlohmann::ordered_json sweep =
      a.sweep.empty() ? nlohmann::ordered_json::array() : dos_train::run_sweep(loop, opt, a.sweep, a.iterations, n);
  const std::vector<dos::StepStats> main_run =
      a.sweep.empty() ? loop.run(a.iterations, "") : std::vector<dos::StepStats>{};
  const std::int64_t it = loop.iteration();
  const dos_train::Summary summary =
      dos_train::print_summary(main_run, log, n, opt.num_subgroups(), a.iterations, compute.get(), on_gpu);

  // A diverged run (master parameters inf or NaN) is reported, and nothing of it is saved.
  std::size_t nonfinite = 0, first_bad = 0;
  float first_value = 0;
  opt.with_host_state([&](const std::vector<dos::Optimizer::HostState>& state) {
    std::size_t at = range.begin;
    for (const dos::Optimizer::HostState& sg : state) {
      for (std::size_t k = 0; k < sg.size; ++k)
        if (!std::isfinite(sg.master[k]) && nonfinite++ == 0) first_bad = at + k, first_value = sg.master[k];
      at += sg.size;
    }
  });
  if (nonfinite > 0)
    fail("after iteration " + std::to_string(it) + ", " + std::to_string(nonfinite) + " of the " + std::to_string(n) +
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

  // Outputs are written to temporary files first and put in place together: a failure leaves
  // neither behind.
  std::unique_ptr<dos::PendingFile> params_file, report_file;
  std::vector<float> master;
  if (!a.save_params.empty()) {
    master.resize(n);
    opt.read_master(master.data());
    std::vector<dos::SafetensorOut> out;
    std::map<std::string, std::string> meta = {{"model", cfg.name}, {"shard", a.shard},
                                               {"format", "fp32 master parameters after the last iteration"}};
    for (const ShardTensor& st : tensors) {
      const std::vector<std::int64_t> shape = st.whole() ? st.t.shape : std::vector<std::int64_t>{std::int64_t(st.count)};
      if (!st.whole()) meta[st.t.name + ".offset"] = std::to_string(st.tensor_offset);
      out.push_back({st.t.name, "F32", shape, master.data() + (st.global_begin - range.begin), st.count * sizeof(float)});
    }
    params_file = dos::prepare_safetensors(a.save_params, out, meta);
  }
  if (!a.report.empty()) {
    dos_train::RunFacts facts;
    facts.args = &a;
    facts.model = &cfg;
    facts.total = total;
    facts.n = n;
    facts.subgroup = subgroup;
    facts.resident_budget = c.resident_budget;
    facts.update_budget = c.update_budget;
    facts.tail_subgroups = c.tail_subgroups;
    facts.on_gpu = on_gpu;
    const nlohmann::ordered_json rep =
        dos_train::report_json(facts, rt, opt, log, sweep, main_run.empty() ? nullptr : &summary, compute.get());
    const std::string text = rep.dump(2) + "\n";
    report_file = std::make_unique<dos::PendingFile>(a.report, dos::Chunks{{text.data(), text.size()}});
  }
  if (!a.save_state.empty()) {
    job.iteration = it;
    dos::CheckpointRanks ranks_io;
    if (dp) {
      ranks_io.all_ok = [](bool ok) { return g_comm->all_ok(ok); };
      ranks_io.from_rank0 = [](long long v) {
        g_comm->broadcast(&v, sizeof v, 0);
        return v;
      };
    }
    dos::save_checkpoint(a.save_state, opt, job, dp ? &ranks_io : nullptr);
    std::printf("saved the optimizer state after iteration %lld to %s\n", (long long)it, a.save_state.c_str());
  }
  std::unique_ptr<dos::PendingFile> timeline_file;
  if (!a.timeline.empty()) {
    const std::string text = dos_train::timeline_json(rt, opt, log, it, n);
    timeline_file = std::make_unique<dos::PendingFile>(a.timeline, dos::Chunks{{text.data(), text.size()}});
  }
  if (params_file) params_file->commit();
  if (report_file) report_file->commit();
  if (timeline_file) timeline_file->commit();
  if (params_file)
    std::printf("saved %zu fp32 master parameters to %s%s\n", n, a.save_params.c_str(),
                dp ? " (each rank its own shard's file: .rank-RRRRR-of-WWWWW)" : "");
#if defined(DOS_HAVE_CUDA)
  if (on_gpu) {
    dos_train::cuda_free(params);
    dos_train::cuda_free(grads);
  }
#endif
  if (!on_gpu) {
    std::free(params);
    std::free(grads);
  }
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
