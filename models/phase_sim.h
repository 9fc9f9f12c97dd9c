// An event-driven simulation of one update phase: the plan's subgroups going through the shared
// resources in the order the runtime submits them. Pure functions: no StarPU, no clocks.
//
// What predict() (resource_model.h) leaves out and this keeps:
//   - order: the runtime submits the subgroups in a SubmitOrder; the CUDA worker and the CPU worker
//     each run their tasks first in, first out, and a task at the head of a worker's queue that
//     waits for its data holds back every task behind it (StarPU's drivers fetch one task's input
//     at a time);
//   - the pipeline's fill and drain: the first streamed subgroup's state must arrive before the GPU
//     has anything to do, the last one's must still go back; the CPU waits for its first gradient
//     and its last subgroup's parameters still go up;
//   - host memory shared by CPU Adam and DMA, moment by moment: CPU Adam asks for U_c x (24 + gb +
//     pb) bytes/s of host traffic, each PCIe direction for its B; when what is running asks for
//     more than the host delivers, M, CPU Adam gets a fraction f of what it asked and the links
//     link_share x f of theirs (host_shares), so CPU Adam and the links slow down together. M is
//     calibrated by U_c_dma, the CPU's rate with both directions streaming: M = U_c_dma / U_c x
//     (U_c (24 + gb + pb) + link_share (B_h2d + B_d2h)). (On the GPU machine the
//     13B quarter's mixed phases moved 38-43 GB/s each way while CPU Adam ran, 49 without it, and
//     CPU Adam ran at 2.98 instead of 3.92 Gparams/s: both about 0.77 of their rate alone.)
//   - the GPU update budget: a subgroup is submitted only when its footprint fits, and prefetches
//     take theirs only while room for one more subgroup is left (the runtime's AdmissionWindow).
//
// The resources and what each subgroup asks of them (n its parameters, gb the staged gradient's
// bytes per parameter, pb the parameters' bytes per parameter; caller on the GPU):
//   CPU subgroup:      GPU: staging n / D_c;  D2H: gb n;  CPU: Adam on n;  H2D: pb n;  GPU: write-back
//                      (with Execution::own_grad_download: D2H gb n from its submission, no staging
//                      on the GPU, beside StarPU's stream or, by the copy engine, in its queue; with
//                      Execution::own_param_upload: H2D pb n beside StarPU's stream or in its
//                      queue, no write-back)
//   streamed subgroup: H2D: 12 n (prefetched);  GPU: Adam n / U_g;  D2H: 12 n
//   resident subgroup: GPU: Adam n / U_g (with Execution::state_off_gpu: H2D 12 n first, asked for at
//                      its submission)
// (caller in host memory: a CPU subgroup is the CPU Adam alone; a streamed one moves 12 + gb up and
// 12 + pb down; a resident one gb up (12 + gb when its state is off the GPU) and pb down). With
// Workload::compact_master the state's 12 is 10.125 (state_bytes_per_param) and P travels with the
// gradient: a CPU subgroup's D2H is (gb + pb) n (gb n when Execution::params_on_host flags it), a
// streamed one's H2D with the caller in host memory 10.125 + gb + pb. Each
// PCIe direction serves its transfers one at a time in the order they were asked for, at B_h2d or
// B_d2h.
#pragma once

#include <cstddef>
#include <vector>

#include "resource_model.h"

namespace dos {

/// The order in which the runtime submits an update phase's subgroups (OptimizerOptions::
/// submit_order). cpu_first: the subgroups that are not streamed first (index order), then the
/// streamed ones, when the update budget holds the former's staging beside the streaming window;
/// otherwise, and for plan: index order.
enum class SubmitOrder { cpu_first, plan };

/// How the runtime carries a plan out, beyond the plan itself. order: SubmitOrder;
/// lookahead: streamed subgroups whose state is prefetched ahead of the one being submitted;
/// update_budget: the GPU update budget in bytes (0: none); cpu_workers: StarPU CPU workers, each
/// running its Adam tasks one after another at U_c (the placement policy gives subgroup i's to
/// worker i % cpu_workers), all at once beside each other (0 counts as 1). One GPU and one PCIe
/// pair are modelled: a process drives one GPU.
struct Execution {
  SubmitOrder order = SubmitOrder::plan;
  std::size_t lookahead = 3;
  std::size_t update_budget = 0;
  std::size_t cpu_workers = 1;
  /// Threads of each CPU worker's team (Runtime::cpu_threads) and the elements of one work item of
  /// the CPU Adam kernel (kCpuWorkItem, codelets/kernels/adam.h: the team takes a subgroup's
  /// elements in items of this many, a subgroup of at most one item on the worker's own thread). A
  /// subgroup of n parameters keeps at most ceil(n / cpu_work_item) threads busy and ends no sooner
  /// than one thread takes for its largest item, so its Adam runs at
  ///   cpu_team_share(n) = n / max(n, cpu_team_threads x min(n, cpu_work_item))
  /// of the worker's rate (1 from cpu_team_threads x cpu_work_item parameters on; the worker's rate
  /// taken as shared evenly by its threads: one thread at 1 / cpu_team_threads of it). It still asks
  /// host memory for the whole team's traffic, an over-count that matters only where host memory
  /// binds, which a phase of such small subgroups does not. cpu_team_threads <= 1 or
  /// cpu_work_item 0: no limit (every subgroup at the worker's rate). On the GPU machine, subgroups
  /// of 10007 parameters (one item) on one worker of 15 threads took 26-45 us each against 2 us at the
  /// team's rate: about the 30 us of one thread at 1/15 of it.
  std::size_t cpu_team_threads = 1;
  std::size_t cpu_work_item = 0;
  /// With the caller on the GPU: a CPU subgroup's new parameters go up by the runtime's own copy
  /// (CopyStream, a kernel: no copy engine) as soon as its Adam ends, beside StarPU's host-to-device
  /// stream (at B_h2d alone, B_h2d / 2 while StarPU's stream carries data, which keeps its B_h2d),
  /// and the subgroup is done then; false: they go up on StarPU's stream behind what was asked
  /// before them, and a write-back task on the GPU's queue waits for them.
  bool own_param_upload = false;
  /// With the caller on the GPU: a CPU subgroup's gradients go down by the runtime's own copy
  /// (CopyStream) as soon as the subgroup is submitted, beside StarPU's device-to-host stream (at
  /// B_d2h alone, B_d2h / 2 beside it, which keeps its B_d2h), with no staging task on the GPU; false: a
  /// staging task in the GPU's queue, then StarPU's device-to-host stream behind what was asked
  /// before. The runtime does this only when the gradients keep the caller's dtype.
  bool own_grad_download = false;
  /// With own_grad_download: the runtime's gradient downloads go by the GPU's copy engine
  /// (cudaMemcpyAsync; dos::runtime_copies_by_copy_engine, the runtime's default), which serves them
  /// and StarPU's device-to-host stream one at a time in the order asked, at B_d2h: a download asked
  /// for after a streamed state's write-back waits behind it. false: by a kernel, beside StarPU's
  /// stream, as own_grad_download says.
  bool grad_download_by_copy_engine = false;
  /// With own_param_upload: the runtime's parameter uploads go by the copy engine, behind every
  /// streamed state StarPU asked to bring up before them, at B_h2d (DOS_COPY_BY=memcpy or
  /// memcpy-up). false: by a kernel, beside StarPU's stream, as own_param_upload says (the
  /// runtime's default).
  bool param_upload_by_copy_engine = false;
  /// Per subgroup (w.sizes' order): its optimizer state has no valid copy on the GPU when the phase
  /// starts. A resident subgroup flagged so first brings its 12 n bytes of state up on StarPU's
  /// host-to-device stream, asked for at its submission (with the caller in host memory, together
  /// with its gradient; the runtime's task is pushed, and its inputs fetched, once the gradient is
  /// staged), before its Adam can run: the first phase that keeps it resident, or one after its host
  /// copy was written (a checkpoint load, new master parameters). Other sides ignore the flag: a
  /// streamed subgroup is charged its 12 n both ways, a CPU one nothing, even when an earlier plan
  /// left its state on the GPU (a plan override that stops keeping subgroups resident: the one phase
  /// that brings those states home costs more than simulated). Empty: every resident subgroup's
  /// state is on the GPU (the steady state). The runtime asks StarPU where each state is when the
  /// phase begins.
  std::vector<bool> state_off_gpu;
  /// Per subgroup (w.sizes' order), with Workload::compact_master: the host staging holds the
  /// caller's current parameters (P) when the phase starts (the subgroup was updated on the CPU in
  /// the phase before, and nothing has written them since), so a CPU update brings no P down; the
  /// other CPU subgroups bring theirs down beside the gradient (pb n more D2H). Ignored for other
  /// sides and without the compact master. Empty: none holds it (every CPU subgroup brings P down).
  std::vector<bool> params_on_host;
};

/// The share of its CPU worker's Adam rate that a subgroup of n parameters runs at under e
/// (Execution::cpu_team_threads): in (0, 1], exactly 1 when e sets no limit or n >= cpu_team_threads
/// x cpu_work_item. Throws nothing.
double cpu_team_share(const Execution& e, std::size_t n);

/// GPU bytes subgroup of n parameters on `side` holds while in flight (the runtime's footprint):
/// its state buffer when streamed (state_bytes_for(n): 12 n and the slices' padding, at most 180;
/// compact_state_bytes_for(n) with Workload::compact_master),
/// plus (gb + pb) n of gradient and parameter staging unless its update reads and writes the
/// caller's buffers where they are (caller on the GPU and update there), or the caller is on the
/// host and the update on the CPU; a CPU subgroup with the caller on the GPU counts only the
/// staging the runtime keeps there (Workload::cpu_grads_staged_on_gpu, cpu_params_staged_on_gpu).
std::size_t subgroup_footprint(const Workload& w, std::size_t n, PlanSide side);

/// Whether the runtime submits this plan CPU subgroups first (Execution::order cpu_first, at least
/// one subgroup streamed, and the budget holds every non-streamed subgroup's footprint plus
/// lookahead + 1 of the largest footprint).
bool submits_cpu_first(const Workload& w, const std::vector<PlanSide>& plan, const Execution& e);

/// The subgroups' indices in the order the runtime submits them: index order, or, when cpu_first,
/// the subgroups that are not streamed (index order) and then the streamed ones (index order).
std::vector<std::size_t> submission_order(const std::vector<PlanSide>& plan, bool cpu_first);

/// What the simulation found. total: the phase's seconds (the last piece of work's end);
/// cpu, h2d, d2h, gpu: seconds each resource was busy (cpu: summed over the CPU workers); cpu_beside_dma: the part of cpu spent beside
/// DMA (at U_c_dma); stream_end: when the last streamed
/// subgroup's state was back in host memory (0: none streamed); cpu_first: the order it simulated.
struct Simulation {
  double total = 0, cpu = 0, h2d = 0, d2h = 0, gpu = 0;
  double cpu_beside_dma = 0;  // of cpu: the seconds CPU Adam ran while a PCIe direction transferred
  double stream_end = 0;
  /// The CPU Adam pieces that began at or after stream_end (none when nothing streamed): their
  /// seconds (summed) and parameters, each subgroup's n counted as n / cpu_team_share(e, n) (the
  /// parameters the worker's whole team would update in that time: n for every subgroup at or above
  /// the team's limit), so that seconds / parameters is the worker's time per parameter at the team's
  /// rate, as U_c counts it. What they ran beside (the CPU subgroups' own gradient and
  /// parameter copies, with the caller on the host the resident subgroups' ones, and the uploads of
  /// resident states not yet on the GPU that were still going; no streamed state) is what the
  /// runtime's CPU Adam tasks that began after the last streamed write-back ran beside: the
  /// refinement compares the two (refinement.h).
  double cpu_after_stream = 0, cpu_after_stream_params = 0;
  /// Seconds of [0, stream_end] during which StarPU's streams carried optimizer state (a streamed
  /// subgroup's either way, a resident one's up when Execution::state_off_gpu flags it), with CPU
  /// Adam running on some CPU worker (stream_beside_cpu) or on none (stream_alone). The rest of
  /// [0, stream_end] the streams waited (the pipeline's fill, a GPU Adam, the update budget).
  double stream_beside_cpu = 0, stream_alone = 0;
  /// Seconds of [0, stream_end] in which no CPU worker ran an Adam (0 when nothing streamed): the
  /// counterpart of the runtime's StepStats::cpu_adam_idle_before_stream_end_seconds. At most
  /// stream_end - stream_beside_cpu (CPU Adam may run while the streams wait).
  double cpu_idle_before_stream_end = 0;
  bool cpu_first = false;
  /// The busiest resource's name ("cpu", "h2d", "d2h" or "gpu"): the one the phase waits on most.
  const char* busiest() const;
};

/// Simulates one update phase of `plan` (one side per subgroup of w.sizes) on rates r.
/// Throws std::invalid_argument when the plan's length differs from w.sizes, a rate is not
/// positive, or e.state_off_gpu or e.params_on_host has neither 0 nor w.sizes.size() flags.
Simulation simulate_phase(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r, const Execution& e);

/// The plan of least simulated time among those choose_plan (resource_model.h) considers (the last
/// w.resident subgroups resident, spread_plan(n - resident, m) for every m and the strides k = 2..8;
/// only m = 0 when !w.may_stream; ties: fewer streamed). Choice::predicted carries the simulation's figures:
/// total, and each resource's busy seconds. Each candidate is simulated once, on scratch memory
/// kept from one candidate to the next, with what depends only on w, r and e worked out once: the
/// figures are simulate_phase's for that plan, to the bit. Throws what simulate_phase throws.
Choice choose_plan_simulated(const Workload& w, const Rates& r, const Execution& e);

/// The paper's stride k in [1, n] of least simulated time (ties: larger k), with its simulated
/// time in StrideChoice::predicted.total (and each resource's busy seconds), each stride simulated
/// as choose_plan_simulated simulates its candidates.
StrideChoice choose_stride_simulated(const Workload& w, const Rates& r, const Execution& e);

}  // namespace dos
