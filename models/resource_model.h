// The resource model of one update phase: which subgroups are updated on the CPU and which are
// streamed through the GPU, and how long that takes. Pure functions: no StarPU, no clocks.
//
// A plan gives each subgroup a side. Its predicted update-phase time is that of the busiest shared
// resource:
//   T_h2d = bytes_h2d / B_h2d, T_d2h = bytes_d2h / B_d2h   (bytes per subgroup: traffic.h)
//   T_gpu = N_gpu / U_g + N_conv / D_c                     (GPU Adam, and the gradient staging of
//                                                          the CPU subgroups when the caller is on
//                                                          the GPU and the GPU stages them:
//                                                          N_conv = N_cpu, else 0)
//   T_cpu: CPU Adam runs at U_c_dma while the DMA engines stream (for T_dma = max(T_h2d, T_d2h))
//          and at U_c once they are done, so the CPU needs
//            N_cpu / U_c_dma                               if that ends before T_dma,
//            T_dma + (N_cpu - U_c_dma T_dma) / U_c         otherwise.
//   T_host = (N_cpu (24 + gb + pb) + bytes_h2d + bytes_d2h) / M  (host memory: host_bandwidth)
//   T = max(T_cpu, T_h2d, T_d2h, T_gpu, T_host)
// The contention term (U_c_dma < U_c) is what the paper's model leaves out: CPU Adam and the DMA
// engines share host memory, and on the GPU machine this repository's CPU Adam ran at 2.1-2.7
// Gparams/s while the streamed state moved at 37 GB/s each way, against 4.0-4.1 alone
// (docs/measured-2026-12.md, "Side by side: a quarter of the 20B preset").
// With U_c_dma = U_c the model is the paper's (Maurya et al., "Deep Optimizer States", Equation 1):
// the stride k is the plan "one subgroup in k streamed" (subgroups k-1, 2k-1, ...).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace dos {

/// The placeholder link_share (Rates' default): no measure. What the calibration gives unless it
/// measures link_share (calibrate_rates), what link_share_is_measured (models/refinement.h) takes for no
/// measure, and what the optimizer saves to the rates cache when neither the calibration nor a
/// phase measured it (rates_to_save, models/refinement.h).
inline constexpr double kUnmeasuredLinkShare = 1;

/// The lowest link_share the refinement and the calibration's estimate give: a floor for the
/// figures' sake (models/refinement.h), unitless.
inline constexpr double kLowestLinkShare = 1.0 / 16;

/// Measured rates of one rank's machine.
/// U_c: CPU Adam on one StarPU CPU worker, params/s, with no DMA running; U_c_dma: the same while H2D and D2H both stream
/// (params/s, <= U_c); U_g: GPU Adam, params/s; D_c: GPU gradient conversion to fp32, params/s;
/// B_h2d, B_d2h: PCIe bandwidth each way while both directions run and CPU Adam does not, bytes/s.
/// link_share: when CPU Adam and the links together ask host memory for more than it delivers, the
/// links get link_share times the fraction of their ask that CPU Adam gets of its own (host_shares;
/// 1: the same fraction; below 1: the CPU's cores win more of the memory controllers than the DMA
/// engines). The calibration gives estimated_link_share by default, or (DOS_CALIBRATE_LINK_SHARE)
/// kUnmeasuredLinkShare, 1, or a measure on short phases of scratch subgroups, or
/// link_share_from_dma of the links' rate beside CPU-only phases (calibrate_rates), and it is refined from the phases whose streams
/// ran beside CPU Adam (models/refinement.h), the first of them replacing the calibration's
/// value. All > 0.
struct Rates {
  double U_c = 0, U_c_dma = 0, U_g = 0, D_c = 0, B_h2d = 0, B_d2h = 0;
  double link_share = kUnmeasuredLinkShare;
};

/// True when every rate, link_share included, is a positive finite number (what predict needs).
bool rates_complete(const Rates& r);

/// Where a subgroup's update runs: on the CPU, on the GPU with its state streamed in and out, or on
/// the GPU with its state kept there between iterations (no PCIe traffic for it at all).
enum class PlanSide : unsigned char { cpu = 0, gpu_streamed = 1, gpu_resident = 2 };

/// What the model is asked about. sizes: elements per subgroup; caller_on_gpu: the model's
/// parameters and gradients live in GPU memory (their gradients are converted there);
/// param_bytes: bytes per element of the model's parameters (2 for fp16/bf16, 4 for fp32);
/// resident: how many subgroups, the last ones, keep their state on the GPU between iterations
/// (from the GPU resident budget, resident_subgroups below); may_stream: false when the GPU update
/// budget cannot hold one streamed subgroup, so that plans stream nothing.
struct Workload {
  std::vector<std::size_t> sizes;
  bool caller_on_gpu = true;
  std::size_t param_bytes = 2;
  std::size_t resident = 0;
  bool may_stream = true;
  std::size_t grad_bytes = 4;  // bytes per element of the staged gradient (traffic.h)
  /// With the caller on the GPU: whether a CPU subgroup's staged gradient (grad_bytes per element)
  /// and its staged new parameters (param_bytes) take GPU memory while it is in flight; false where
  /// the runtime copies them between the caller's GPU tensors and host staging itself
  /// (Execution::own_grad_download, Execution::own_param_upload: nothing staged on the GPU).
  bool cpu_grads_staged_on_gpu = true;
  bool cpu_params_staged_on_gpu = true;
  /// The compact master (OptimizerOptions::compact_master): a streamed state of 10.125 bytes per
  /// parameter each way (state_bytes_per_param), CPU Adam's host bytes as cpu_adam_host_bytes says,
  /// and a CPU subgroup's P down beside its gradient (traffic.h).
  bool compact_master = false;
};

/// Sets w.cpu_grads_staged_on_gpu and w.cpu_params_staged_on_gpu from the runtime's own copies of
/// a CPU subgroup: its gradient is staged on the GPU unless the runtime downloads it itself
/// (own_grad_download); its new parameters unless the runtime uploads them itself
/// (own_param_upload), and with w.compact_master its P, which comes down beside the gradient,
/// also unless the runtime downloads that itself (own_param_download). The runtime, dos-train
/// --plan-only and dos-replay each build their workload with it. Throws nothing.
inline void stage_cpu_copies(Workload& w, bool own_grad_download, bool own_param_upload, bool own_param_download) {
  w.cpu_grads_staged_on_gpu = !own_grad_download;
  w.cpu_params_staged_on_gpu = !own_param_upload || (w.compact_master && !own_param_download);
}

/// Bytes per parameter of a streamed subgroup's state, each way: 12 (fp32 master, exp_avg,
/// exp_avg_sq), or 10.125 with w.compact_master (exp_avg, exp_avg_sq, the master's low half and its
/// rounding bit; codelets/kernels/compact_master.h). Padding not counted.
inline double state_bytes_per_param(const Workload& w) { return w.compact_master ? 10.125 : 12.0; }

/// Bytes of a subgroup's state buffer of n parameters, padding included, as it takes GPU memory
/// when streamed or resident: state_bytes_for(n) (codelets/kernels/adam.h: 12 bytes per parameter,
/// each of the three fp32 slices padded to 16 elements), or compact_state_bytes_for(n)
/// (codelets/kernels/compact_master.h: about 10.125 bytes per parameter) with w.compact_master.
std::size_t subgroup_state_bytes(const Workload& w, std::size_t n);

/// How many subgroups, counted from the last one backwards, fit their state in `budget_bytes` of
/// GPU memory: the fp32 state (master, exp_avg, exp_avg_sq: 12 bytes per parameter and each slice
/// padded to 16 elements, state_bytes_for in codelets/kernels/adam.h), or with compact_master the
/// compact state (compact_state_bytes_for in codelets/kernels/compact_master.h, about 10.125 bytes
/// per parameter; subgroup_state_bytes). Taking the last ones matches DeepSpeed's ZeRO-Offload++
/// `ratio` (static_plan). Returns 0..sizes.size().
std::size_t resident_subgroups(const std::vector<std::size_t>& sizes, std::size_t budget_bytes,
                               bool compact_master = false);

/// Host memory traffic of CPU Adam, bytes per parameter: it reads the fp32 master, exp_avg and
/// exp_avg_sq and the staged gradient (w.grad_bytes) and writes the first three and the 16-bit
/// parameters (w.param_bytes): 24 + grad_bytes + param_bytes. With w.compact_master it reads and
/// writes exp_avg, exp_avg_sq (16), the low halves and r bits (4.25) and P (2 x param_bytes) and
/// reads the gradient: 20.25 + grad_bytes + 2 param_bytes (26.25 with bf16 gradients, against 28).
double cpu_adam_host_bytes(const Workload& w);

/// What host memory delivers to CPU Adam and both DMA directions together, bytes/s: CPU Adam at
/// U_c asks for U_c x cpu_adam_host_bytes, each link for its B; with both links streaming, CPU Adam
/// ran at U_c_dma, i.e. got U_c_dma / U_c of what it asked, and the links link_share times that
/// (host_shares): M = U_c_dma / U_c x (U_c x cpu_adam_host_bytes + link_share x (B_h2d + B_d2h)),
/// and at least what CPU Adam alone and both links alone were measured to get (U_c x
/// cpu_adam_host_bytes, B_h2d + B_d2h). With U_c_dma = U_c (the paper's model) and link_share 1,
/// M is their full demand: no contention.
double host_bandwidth(const Workload& w, const Rates& r);

/// The fractions of what they ask that CPU Adam (cpu) and the PCIe links (links) get from host
/// memory, each in (0, 1].
struct HostShares {
  double cpu = 1, links = 1;
};

/// How host memory of `host_bytes_per_s` (M, host_bandwidth) is shared when CPU Adam asks for
/// `cpu_ask` and the links for `links_ask` bytes/s (each >= 0): everyone gets all it asks when the
/// asks fit in M; otherwise CPU Adam gets f = M / (cpu_ask + link_share x links_ask) of its ask and
/// the links link_share x f of theirs, so that together they take M; when that would give one of
/// them more than its ask, it gets its ask and the other the rest of M. A side that asks for
/// nothing gets 1. Throws std::invalid_argument when an ask is negative, or M or link_share is not
/// a positive finite number.
HostShares host_shares(double cpu_ask, double links_ask, double host_bytes_per_s, double link_share);

/// The lowest U_c_dma the model tells apart, params/s: below U_c x max(c, l) / (c + link_share x
/// l), with c = cpu_workers x U_c x cpu_adam_host_bytes (every CPU worker's Adam asking at once, as
/// the phase simulation counts it; 0 workers count as 1) and l = B_h2d + B_d2h, host_bandwidth is
/// at its floor and no longer depends on U_c_dma; at most U_c (with link_share below 1 the ratio can
/// exceed 1: M is then at its floor whatever U_c_dma). Calibration and refinement keep U_c_dma at
/// or above it.
double lowest_distinct_u_c_dma(const Workload& w, const Rates& r, std::size_t cpu_workers = 1);

/// What is wrong with rates whose each rate is positive (rates_complete) but which break the
/// model's bounds: U_c_dma above U_c, link_share above highest_link_share, or link_share below
/// kLowestLinkShare (the least the refinement and the calibration's estimate give); "" when none.
/// Rates files and dos-train --rates are refused with this text. Throws nothing.
std::string rate_bounds_error(const Rates& r);

/// The range a rate given by hand (a rates file, dos-train --rates) must lie in, in the model's
/// units: [1e6, 1e16] params/s (U_c, U_c_dma, U_g, D_c) or bytes/s (B_h2d, B_d2h). 1e6 params/s is
/// 1000 times slower than the slowest CPU Adam measured (a 2-core machine, about 1e9), 1e16 bytes/s
/// far above any host link; a rate outside is one written in other units (4.1 for 4.1e9 params/s)
/// or a mistyped exponent. (The calibration sets D_c to 1e15 when the model is on the host: no
/// conversion on the GPU. On subgroups of fewer than about 8 elements it measures U_g and D_c below
/// 1e6, the kernels' launch dominating: its own cache is not held to this range.)
inline constexpr double kLowestPlausibleRate = 1e6, kHighestPlausibleRate = 1e16;

/// The name ("U_c", ..., "B_d2h") of the first of r's six rates outside [kLowestPlausibleRate,
/// kHighestPlausibleRate] (NaN included), or "" when all lie in it; link_share is not looked at.
/// Rates files (load_rates) and dos-train --rates are refused with it. Throws nothing.
std::string implausible_rate(const Rates& r);

/// The largest link_share the model tells apart: U_c / U_c_dma. Above it the links would get more
/// than they ask beside CPU Adam at U_c_dma (host_shares then gives them their ask), so a larger
/// share changes nothing. Rates files and --rates above it are refused; the refinement keeps
/// link_share at or below it.
double highest_link_share(const Rates& r);

/// The calibration's link_share before any phase has measured it (calibrate_rates' default rule):
/// U_c_dma / U_c, the fraction of its own rate that CPU Adam keeps beside DMA, within [1/16, 1]
/// (unitless, as Rates::link_share; 1 when U_c_dma reaches U_c). An empirical prior, not a
/// derivation: in the model, link_share 1 already gives the links the same fraction as CPU Adam,
/// yet on the GPU machine (one H200, 16 cores) the phases refined link_share to about this ratio
/// where the streams ran beside CPU Adam all along (the 20B quarter with 31.5 GB resident: 0.766
/// refined against a calibrated ratio of 0.766, and 0.831 against 0.823), and above it where part
/// of the streaming ran alone (the 13B quarter 0.86 against 0.73, the 7B quarter 1.05 against 0.74;
/// docs/measured-2026-12.md, "Link share: the calibration's estimate"). A calibrating run plans its
/// first phases at this value, which phases that stream then replace (initial_link_share_record).
/// Throws std::invalid_argument when U_c or U_c_dma is not a positive finite number.
double estimated_link_share(const Rates& r);

/// link_share from a measure of the links beside CPU Adam (the calibration's rule dma; the same
/// formula as examples/host_probe.py applies to dos-bench host's figures): the links' fraction of their own rate beside CPU Adam,
/// dma_beside / dma_alone (bytes/s each way, both directions at once), over the fraction CPU Adam
/// keeps beside the links in these rates, U_c_dma / U_c (host_shares gives the links link_share
/// times CPU Adam's fraction when both ask host memory for more than it delivers), within
/// [kLowestLinkShare, highest_link_share(r)]: the largest the model tells apart. Unitless, as
/// Rates::link_share. Throws std::invalid_argument when a rate of the two or U_c, U_c_dma is not a
/// positive finite number.
double link_share_from_dma(double dma_beside, double dma_alone, const Rates& r);

/// The predicted times of a plan, seconds, per resource and overall (the maximum). host: the
/// plan's host memory traffic (CPU Adam's and every PCIe byte) over host_bandwidth.
struct Prediction {
  double total = 0, cpu = 0, h2d = 0, d2h = 0, gpu = 0, host = 0;
  double streamed_params = 0, cpu_params = 0, resident_params = 0;
  /// Which resource bounds the phase: "cpu", "h2d", "d2h", "gpu" or "host": the one whose time is
  /// the total (predict's closed form), else (a simulated total, which is none of the busy times)
  /// busiest_resource of the busy times, as the simulation names it.
  std::string bound_by() const;
};

/// The name of the largest of four busy times, seconds: "cpu", "h2d", "d2h" or "gpu" (ties in that
/// order). What Simulation::busiest and Prediction::bound_by call a simulated phase's bound.
const char* busiest_resource(double cpu, double h2d, double d2h, double gpu);

/// Predicted update-phase time of `plan` (one side per subgroup, same length as w.sizes).
/// Throws std::invalid_argument when the lengths differ or a rate is not positive.
Prediction predict(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r);

/// The same, for a split of the work into n_cpu parameters on the CPU, n_streamed streamed and
/// n_resident resident on the GPU, regardless of subgroup boundaries (the continuous relaxation
/// used by the lower bound).
Prediction predict_split(const Workload& w, double n_cpu, double n_streamed, const Rates& r, double n_resident = 0);

/// m of n subgroups streamed, spread evenly (subgroup i is streamed when floor((i+1) m / n) >
/// floor(i m / n)); m = 0: all on the CPU, m = n: all streamed. For m = n / k this is the paper's
/// stride k (subgroups k-1, 2k-1, ...).
std::vector<PlanSide> spread_plan(std::size_t n, std::size_t m);

/// The paper's stride k >= 1: subgroup i streamed when (i + 1) % k == 0.
/// Throws std::invalid_argument when k is 0.
std::vector<PlanSide> stride_plan(std::size_t n, std::size_t k);

/// DeepSpeed's static `ratio` R (the CPU share, in [0, 1]): the first round(R n) subgroups on the
/// CPU, the others resident on the GPU. The fraction of subgroups on the CPU is within half a
/// subgroup of R, and grows with R. Throws std::invalid_argument when R is outside [0, 1].
std::vector<PlanSide> static_plan(std::size_t n, double cpu_share);

/// The plan of least predicted time: the last w.resident subgroups resident, and among the others
/// spread_plan(n - w.resident, m), m = 0..n - w.resident, and the paper's stride_plan(n - w.resident,
/// k), k = 2..8 (with subgroups of different sizes a stride can stream other subgroups than the
/// spread plan of the same count, and be faster); only m = 0 when !w.may_stream; ties: fewer
/// streamed. Choice::streamed counts the chosen plan's streamed subgroups.
struct Choice {
  std::vector<PlanSide> plan;
  std::size_t streamed = 0;
  Prediction predicted;
};
Choice choose_plan(const Workload& w, const Rates& r);

/// The same search with `eval` giving each candidate plan's prediction (its total is compared;
/// ties: fewer streamed). Up to 64 streamable subgroups every m is tried; with more, a grid of 65
/// values of m, then a golden-section search between the grid points around the best (about
/// 65 + 2 log2(n / 64) evaluations); then the strides k = 2..8 (7 evaluations more at most). eval
/// must give the same prediction for the same plan: a plan the search meets again (a count the
/// golden section comes back to, a stride that is the spread plan of its count) is not evaluated
/// again.
Choice choose_plan_by(const Workload& w, const std::function<Prediction(const std::vector<PlanSide>&)>& eval);

/// The best stride k in [1, n] by predicted time (ties: larger k), and its prediction.
struct StrideChoice {
  std::size_t k = 1;
  Prediction predicted;
};
StrideChoice choose_stride(const Workload& w, const Rates& r);

/// The same search with `eval` giving each stride plan's prediction (its total is compared; ties:
/// larger k).
StrideChoice choose_stride_by(const Workload& w, const std::function<Prediction(const std::vector<PlanSide>&)>& eval);

/// A lower bound for the update phase on the same resources, seconds: over every split of the
/// parameters between CPU and streaming, ignoring subgroup boundaries (minimised to 1e-4 of the
/// total), the least of the busiest resource's whole work at its best rate, with w.resident
/// subgroups resident and nothing streamed when !w.may_stream. What it assumes: every resource busy
/// from the first instant to the last (no pipeline fill or drain, no wait of one resource on
/// another), CPU Adam at U_c, each link at its B, the GPU at U_g and D_c, and host memory at M
/// (host_bandwidth) for CPU Adam's traffic and every PCIe byte together: contention enters only
/// through M; no GPU update budget (the admission window, which the phase simulation models, may
/// hold streamed subgroups back: under a budget that admits one at a time, one subgroup's download
/// and the next one's upload cannot overlap, and the phase then lies further above this bound).
/// cpu_workers: StarPU CPU workers running Adam beside each other at U_c each (0 counts
/// as 1). It bounds the phase simulation (phase_sim.h) of every plan with as many CPU workers and
/// the matching w.cpu_grads_staged_on_gpu (false with the runtime's own gradient downloads, which
/// convert nothing on the GPU: charging the GPU n_cpu / D_c for them had put 62-68 of 20000 random
/// small GPU-bound phases up to 3.4% under the bound).
/// cold_resident_params: parameters of resident subgroups whose state is not on the GPU when the
/// phase begins (Execution::state_off_gpu: an optimizer's first phase, or one after a checkpoint's
/// load), whose 12 bytes each go up first, as the phase simulation charges them: host memory
/// carries 12 x cold_resident_params bytes more, and the host-to-device link at least the streamed
/// states' 12 bytes per parameter and these together (StarPU's stream carries every state upload;
/// the runtime's own parameter uploads may run beside it, so the link's bound is the larger of
/// that and every byte up without them). 0 (the default) is the bound of a phase with the resident
/// state already on the GPU (every later phase).
/// Throws std::invalid_argument when a rate is not positive, or when cold_resident_params is
/// negative, not finite, or more than the parameters of the w.resident subgroups the bound keeps
/// resident (the last ones).
double lower_bound(const Workload& w, const Rates& r, std::size_t cpu_workers = 1, double cold_resident_params = 0);

/// The lower bound with the rates known two ways, seconds: lower_bound with every resource at the
/// better of its calibrated and its refined rate (after the phases run so far): U_c, U_g, D_c,
/// B_h2d, B_d2h and link_share each the higher of the two, and host memory at the higher of the two
/// host_bandwidth figures (U_c_dma chosen to give it, since the bound reads U_c_dma only there).
/// The calibrated link_share counts as at least kUnmeasuredLinkShare (1): the calibration's value
/// is an estimate or a measure on short scratch phases that no optimizer counts
/// (initial_link_share_record), and a prior below 1 would lower M and so raise the bound. Rates
/// given instead of calibrated (OptimizerOptions::rates, dos-train --rates) come here as the
/// calibrated set too, so a given link_share below 1, which the optimizer does count, is not taken
/// either: their bound is the one at link_share 1 or the refined value when higher, lower (looser)
/// than at the given share, as every calibrated run's bound was before the estimate (its
/// calibrated link_share was the placeholder 1).
/// So it is at most either one-rate bound: a rate the refinement found higher than calibrated (CPU
/// Adam measured in a phase's tasks faster than in the calibration's scratch phases) lowers it,
/// and a rate it found lower (a link's average over a phase, with its idle gaps) does not raise
/// it. cold_resident_params as in the bound above. Throws std::invalid_argument when a rate of
/// either set is not positive, and what the bound above throws.
double lower_bound(const Workload& w, const Rates& calibrated, const Rates& refined, std::size_t cpu_workers,
                   double cold_resident_params = 0);

}  // namespace dos
