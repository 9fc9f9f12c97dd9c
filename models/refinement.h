// The online refinement of the model's rates: after each update phase, what the resources were
// busy doing, against what the phase simulation (phase_sim.h) says they would have been doing at
// the rates the plan was made with. Pure functions: no StarPU, no clocks; the runtime measures,
// this decides.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

#include "phase_sim.h"
#include "resource_model.h"

namespace dos {

/// The most one refinement step moves a rate: by this factor (unitless) either way towards what it
/// measured (refine_rates). A measure beyond it is cut at it, so a rate found exactly at
/// that factor of where it was says only that the measure was at least that far.
inline constexpr double kRefinementStep = 2;

/// What one update phase measured. Seconds from the phase's first submission (where the phase
/// simulation starts: the runtime takes the phase's set-up off), parameters as counts.
/// streamed: subgroups the plan streamed through the GPU; cpu_adam_seconds: the CPU Adam tasks'
/// busy seconds, summed over the CPU workers; alone_params, alone_seconds: the CPU Adam tasks that
/// began at or after the last streamed state write-back (their parameters and busy seconds; 0 when
/// none did; a subgroup of n counted as n / cpu_team_share(n), phase_sim.h, as the simulation's
/// Simulation::cpu_after_stream_params counts it, so that alone_params / alone_seconds is a rate of
/// the whole team, U_c's kind); stream_end_seconds: when the last streamed subgroup's state was back in host memory
/// (0: unknown or nothing streamed); eager_writeback: each streamed subgroup's state went home as
/// soon as its update ended (the links then run back to back until stream_end_seconds).
struct PhaseMeasure {
  std::size_t streamed = 0;
  double cpu_adam_seconds = 0;
  double alone_params = 0, alone_seconds = 0;
  double stream_end_seconds = 0;
  bool eager_writeback = true;
};

/// The rates after one phase, and whether a measurement was applied to any of them (blended, or
/// link_share's first taken whole; the value may have stayed the same; U_c_dma's clamp below does
/// not count).
struct Refined {
  Rates rates;
  bool applied = false;
  /// A measure of link_share was taken (blended, or taken whole when it had none before; not the
  /// stand-in of a phase whose streams ended too early to size one).
  bool link_share_applied = false;
  /// rates.link_share holds a measure: the link_share_measured given, or link_share_applied. What
  /// the next step's link_share_measured is.
  bool link_share_measured = false;
  /// refine_after_phase's first phase that streamed, link_share not counted, took link_share's measure
  /// whole without counting it (link_share_measured stays false): rates.link_share holds that
  /// provisional measure. record_phase keeps it, and rates_to_save saves it when no later phase
  /// measures link_share.
  bool link_share_provisional = false;
  /// What the link_share rule of refine_rates asked for in this step before its bounds and blending
  /// (unitless): the measure, or the stand-in (twice link_share) of streams that ended too early to
  /// size one; beyond the cap U_c / U_c_dma the rest goes to B. NaN where the rule did not run (no
  /// stream end, streams mostly alone, nothing streamed).
  double link_share_asked = std::numeric_limits<double>::quiet_NaN();
  /// rates.U_c holds a measure of the optimizer's own phases: the u_c_measured given, or a measure of
  /// U_c applied in this step from a phase that streamed nothing whose simulated CPU Adam ran mostly
  /// without DMA for 2 ms or more, or from CPU Adam tasks that ran after the streaming (blended:
  /// after it, a phase that streams nothing blends too). What the next step's u_c_measured is.
  bool u_c_measured = false;
};

/// One busy interval of a resource, [start, end] in seconds on any one clock (end >= start).
struct BusySpan {
  double start = 0, end = 0;
};

/// Seconds of the window [from, to] (seconds, on the spans' clock) in which none of `spans` ran:
/// to - from less the length of the spans' union clipped to the window (spans may overlap, as the
/// tasks of several CPU workers do, touch at an end, and come in any order). The runtime measures
/// with it the seconds CPU Adam did not run before the streams ended (StepStats::
/// cpu_adam_idle_before_stream_end_seconds; the phase simulation's counterpart is
/// Simulation::cpu_idle_before_stream_end). 0 when to <= from; a span with end <
/// start, or a bound that is not finite, throws std::invalid_argument. Throws std::bad_alloc (a
/// sorted copy of the spans).
double idle_seconds(const std::vector<BusySpan>& spans, double from, double to);

/// The phase simulation's stream end (Simulation::stream_end, seconds from the phase's first
/// submission) of the phase's plan at the rates the plan was made with, link_share replaced by the
/// argument (unitless); NaN when the simulation cannot progress. refine_rates' second way of
/// measuring link_share (below) reads it.
using StreamEndAt = std::function<double(double link_share)>;

/// The StreamEndAt of a phase: simulate_phase(w, plan, r with link_share replaced, e)'s stream end,
/// NaN where simulate_phase throws (a simulation that cannot progress, or memory). It keeps copies
/// of w, plan, r and e. Throws std::bad_alloc (the copies).
StreamEndAt simulated_stream_end(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r,
                                 const Execution& e);

/// The link_share at which `stream_end_at` gives `measured_end` (seconds > 0), searched from the
/// plan's own share `current` (in [kLowestLinkShare, cap]) towards the side the measure lies on:
/// `current` itself when stream_end_at(current) is within 0.5% of measured_end (the end may be
/// flat in the share over a stretch, where any share there would fit; noise of that size moves
/// nothing); else a bisection over [current, cap] (the measured end earlier: more share) or
/// [kLowestLinkShare, current] (later), within 1e-4 of a crossing. stream_end_at is mostly not
/// increasing in link_share (a larger share moves the streams faster beside CPU Adam); where the
/// FIFO order of the transfers changes or the CPU slows under host memory's floor it may rise a
/// little (up to a few percent), and the bracket from `current` then takes a crossing on the
/// measure's side. Beyond the bracket's far end: HUGE_VAL when the measured end is earlier than at
/// cap (the links did at least what the cap gives: the rest is B's), 0 when it is later than at
/// kLowestLinkShare (the rest is B's too). NaN when measured_end is not a positive number, cap is
/// below kLowestLinkShare or current lies outside [kLowestLinkShare, cap], or stream_end_at gives
/// NaN at a point read: the caller then measures as before. About 16 readings of stream_end_at
/// (the ends and the halvings). Unlike link_share x beside / (the rest of the measured end), the
/// simulation at each candidate share also moves the streams' seconds beside CPU Adam and alone: a
/// stream slowed beside the CPU runs on alone, at the link's full rate, after the CPU's end.
/// Throws what stream_end_at throws.
double link_share_at_stream_end(const StreamEndAt& stream_end_at, double measured_end, double current, double cap);

/// One step of the refinement: each rate moves half way towards what the phase measured, by at most
/// a factor of 2 (an exponential average of weight 1/2, so that one odd phase does not swing the
/// plan). `sim` is simulate_phase of the phase's plan at rates `r` (the rates the plan was made with).
///  - U_c, in a phase that streamed nothing: scaled by sim.cpu / cpu_adam_seconds. With u_c_measured
///    false (U_c is the calibration's or the rates cache's: no phase of this optimizer has measured
///    it), the simulated CPU Adam mostly without DMA (sim.cpu_beside_dma at most half of sim.cpu)
///    and cpu_adam_seconds at least 2 ms, that factor is taken whole (still at most 2 either way)
///    instead of half way, and applied to U_c_dma too: the phase's own tasks are the direct measure
///    of the CPU's speed, and what U_c held came from another process or from the calibration's
///    smaller scratch subgroups. sim.cpu_beside_dma counts every transfer beside CPU Adam: a
///    resident state's upload (a first phase with resident state is beside it all along, and its
///    CPU time depends on link_share too), and the CPU subgroups' own gradient downloads and
///    parameter uploads, which keep it below half with one CPU worker (7B 1/16 shard: 0.13-0.18 of
///    sim.cpu; the 20B quarter's later phases with 31.5 GB resident: 0.41) and above half with
///    several CPU workers each running a subgroup beside the others' copies (the 20B quarter all on
///    the CPU: 0.98 with 4 workers), where the rule then does not apply. On the GPU machine a 7B 1/16 shard under a 400 MB
///    update budget (its 5 subgroups all on the CPU) started from a U_c of 1.91 Gparams/s where its
///    phases ran CPU Adam at 2.5-2.7: blended half way, its phases were predicted +34.9, +22.3,
///    +12.0, +5.2% off; on the simulation, taken whole, the second phase is predicted within the
///    first phase's own deviation from the later ones (test_first_phases).
///  - U_c, in a phase that streamed: from the CPU Adam tasks that began after the streaming ended,
///    when they ran 2 ms or more. They ran beside the CPU subgroups' own gradient and parameter
///    copies (and the uploads of resident states not yet on the GPU still going), which share host
///    memory with them, and so do the simulation's pieces that began after its stream_end: U_c is
///    scaled by the ratio of the two per-parameter times, (sim.cpu_after_stream
///    / sim.cpu_after_stream_params) / (alone_seconds / alone_params), so that the simulation at the
///    new U_c runs those pieces at the measured speed, to first order (exactly when host memory does
///    not limit them: its share depends on U_c itself, and phase after phase the blend converges).
///    When the simulation has none, U_c is taken as the measured rate alone_params / alone_seconds.
///  - U_c_dma, in a phase that streamed: the simulation splits the CPU's work into a part beside DMA
///    (sim.cpu_beside_dma) and a part alone; the part alone is taken as simulated, the rest of the
///    measured busy time gives U_c_dma = r.U_c_dma x sim.cpu_beside_dma / (cpu_adam_seconds -
///    alone part), when that rest is above a fifth of the simulated part (below, the measure is
///    noise). When that U_c_dma exceeds U_c and no task ran alone, U_c moves towards it too (the
///    CPU did better beside the streams than U_c allows alone: U_c was measured low).
///  - The links, in a phase that streamed with eager write-backs (the links then run back to back
///    until the streaming ends), from stream_end_seconds against sim.stream_end. When the
///    simulation's streams ran more seconds beside CPU Adam than without it (sim.stream_beside_cpu
///    > sim.stream_alone): link_share, whose measure is link_share x sim.stream_beside_cpu / (the
///    measured stream end less the simulated seconds alone and waits), the streams' rate beside CPU
///    Adam being proportional to it at full contention (when nothing is left for those seconds,
///    twice link_share stands in for the measure: it is blended and is not link_share's measure).
///    Above U_c / U_c_dma (highest_link_share) the links get all they ask beside CPU Adam at
///    U_c_dma and a larger share changes nothing: a measure above that cap moves link_share
///    towards the cap and B_h2d and B_d2h by measure / cap; likewise below the floor 1/16 (a floor
///    for the figures' sake), B by measure / (1/16).
///    Otherwise B_h2d and B_d2h, scaled by sim.stream_end / stream_end_seconds. So B stays the
///    links' rate without CPU Adam (as calibrated, and as phases that stream mostly alone measure
///    it), and phases whose streams run beside CPU Adam all along do not raise it to what they
///    averaged: a plan's links are predicted as fast as they run beside the CPU and without it.
///    What this cannot tell apart: a calibrated B that is wrong, in phases that stream mostly
///    beside CPU Adam, goes into link_share (one measure, the stream's end, for two rates); the
///    plans near the ones run are then predicted right, those far from them (mostly streamed) are
///    not, until phases that stream mostly alone refine B.
///    link_share_measured false: link_share holds no counted measure (the placeholder 1, or the
///    calibration's value, its estimate or its measure on scratch phases, not counted:
///    initial_link_share_record), so the
///    step takes its measure whole (within the bounds
///    below, and still by at most a factor of 2, so that one odd first phase does not swing the
///    plan) instead of half way: there is nothing to average it with. On the GPU machine the
///    20B quarter's first measure was about 0.77 against the placeholder's 1, and half way (0.88)
///    left the next phase's prediction 9% under the measured time.
///  - Last, the bounds on the final rates: link_share in [1/16, U_c / U_c_dma] and U_c_dma in
///    [lowest_distinct_u_c_dma with cpu_workers, U_c] (below that floor the model does not depend
///    on U_c_dma); each bound depends on the other rate, so they are applied in a few rounds, the
///    cap on link_share last.
/// When nothing was measured, returns r with only the bounds applied (applied false). Throws
/// std::invalid_argument when a rate of r is not positive (rates_complete).
/// cpu_workers: the StarPU CPU workers the phase ran (as Execution::cpu_workers; for U_c_dma's floor).
/// link_share_measured: whether r.link_share holds a measure (an earlier phase's, a rates file's
/// refined value, a value given) rather than the placeholder or the calibration's uncounted
/// measure (initial_link_share_record); see the link_share rule above.
/// u_c_measured: whether r.U_c holds a measure of this optimizer's phases (Refined::u_c_measured of
/// the step before; false at an optimizer's start from calibrated or cached rates or a rates file
/// (`dos-train --rates FILE`, OptimizerOptions::calibrated_rates), true from rates given as
/// numbers); see the U_c rule above.
/// calibrated (may be null): the calibration's rates, when they are a measure apart from r's start
/// (calibration_apart). The links' rule above gives B the error link_share cannot take (a share
/// above its cap); that part of a step raises each link at most to kLinkCeiling times its calibrated
/// rate, or leaves it where it was when it is above that already. The links scaled by a phase whose
/// streams ran mostly alone (a direct measure of B) are not held. Null: nothing is held.
/// stream_end_at (may be null): when given, link_share's measure in the link_share rule above is
/// link_share_at_stream_end of the measured stream end from r.link_share within r's cap (the
/// share at which the simulation at r's rates ends its streams when they did), as the formula's
/// measure is also one at r's rates; above the refined rates' cap (U_c / U_c_dma may have moved in
/// this step) it is taken at that cap, with nothing for B. Beyond the bracket: a measured end earlier than at the
/// cap takes the formula's measure, at least the cap (the rest raises B); later than at 1/16, the
/// formula's, at most 1/16 (the rest lowers B); NaN (the simulation cannot progress): the formula
/// as it is. The rest (bounds, the blend, B taking what the share cannot) is the same. On the
/// simulation of a machine whose links get 0.3 beside CPU Adam while CPU Adam loses little
/// (test_link_share_measure), the formula counts the streams' seconds alone after the CPU's end as
/// seconds beside it and measures about 0.6 in the first phase; this measure gives the machine's
/// share (the step's factor of 2 then holds the first step). Null (the default, and the runtime's
/// unless DOS_LINK_SHARE_MEASURE=simulated): the formula.
Refined refine_rates(const Workload& w, const Rates& r, const PhaseMeasure& m, const Simulation& sim,
                     std::size_t cpu_workers = 1, bool link_share_measured = true, bool u_c_measured = true,
                     const Rates* calibrated = nullptr, const StreamEndAt* stream_end_at = nullptr);

/// The optimizer's refinement after one phase: refine_rates, with a rule for the optimizer's first
/// phase that streamed (first_streamed) while link_share holds no counted measure (the placeholder,
/// or the calibration's uncounted measure).
/// StarPU allocates the streamed states' GPU buffers in that phase; with the kernels loaded at their
/// first launch (before the runtime loaded them at its start) it ran 0-25% slower than the next ones
/// on the GPU machine (7B and 20B quarters), with them loaded at start 1% faster to 10% slower, so
/// it measures the links and the CPU beside them somewhat slower than later phases run:
///  - link_share not counted: refine_rates with it (link_share's measure
///    taken whole, within a factor of 2; the other rates blended), but the phase is not link_share's
///    first measure: link_share_measured stays false, so the next phase's measure is taken whole
///    too and replaces what the slow phase said (link_share_provisional is set: when no later phase
///    measures link_share, that provisional measure is what the rates file gets, rates_to_save).
///    Where the machine's link_share is below 1 (the
///    GPU machine's runs refined it to 0.64-0.89), the placeholder is further from what the phases
///    run at than that slow phase is: there a calibrating run's first two phases, both planned at
///    the placeholder, were predicted 7-18% too fast (a skipped first phase left the second at the
///    calibration's rates). On the simulation of the 20B quarter (test_first_phases, the first
///    phase's links at 1/1.3 to 1 of their rate): at link_share 0.7 the second phase is predicted
///    -5.4% to +2.6% off (-16.4% skipped; -11.3% to -7.7% with the first blended half way) and
///    runs 0.5-1.1% faster; at 1.0 and 1.2 the slow phase pulls link_share below the machine's, and
///    the second phase is predicted up to 10.5% too slow (0 to +5.5% skipped) and runs up to 2.0%
///    slower; the third is within 2.4% in every case (-5.4% at 0.7 skipped).
///  - link_share_measured (rates from an earlier run's file, or given): refine_rates as for any
///    later phase, blended half way. Those rates were measured in another process, and the GPU
///    machine's speed drifts between processes (CPU Adam at 2.2-4.5 Gparams/s in processes minutes
///    apart). On the simulation (test_first_phases: rates from a file with link_share 0.8, a machine
///    whose CPU has become 1.25x or 0.8x as fast and whose link_share is 0.64 or 1.0, the first
///    phase's links at 1/1.1 to 1 of their rate) the second phase runs 0.9-5.8% faster than when
///    that phase refines nothing; with the first phase at full rate this is the refinement one
///    phase ahead (the second phase gets the plan and prediction the third had). Its prediction is
///    not always nearer: at 1.25x it is -10.5% (-9.2% after a slow first phase) where refining
///    nothing left -1.1% (the file's two errors cancelling for that plan) and the third -10.5%. On
///    a machine the file describes exactly, a first phase 10% slow costs the second phase 1.4% of
///    prediction and 0.2% of time. (Refining nothing from it was the rule while first phases ran
///    up to 25% slow.)
/// Otherwise (not first_streamed, which includes a phase that streamed nothing) refine_rates with
/// link_share_measured as given. Throws what refine_rates throws.
/// u_c_measured, calibrated and stream_end_at go to refine_rates as given.
/// provisional_lowers_only (the runtime's DOS_FIRST_LINK_SHARE=lower, runtime_first_link_share):
/// in the first_streamed case above, where r.link_share holds a value other than the placeholder
/// (the calibration's), a phase whose link_share rule asked for more than r.link_share
/// (Refined::link_share_asked: a measure or the stand-in) raises neither link_share nor B:
/// link_share (at most the refined rates' cap), B_h2d and B_d2h stay r's, link_share_applied and
/// link_share_provisional are false (the next phase's measure is taken whole; the rates file keeps
/// the calibration's value), the other rates are refined as before. A measure below r.link_share
/// is taken as above; so is every measure where r.link_share is the placeholder.
/// Why: the compact master's first streamed phase brings every CPU subgroup's P down beside its
/// gradient; on an H100 (20B quarter) it measured link_share at the refined rates' cap, 1.19, where
/// the calibration said 0.80 and the later phases measured 0.81-0.93; the second phase, planned on
/// it, streamed 17 subgroups where the later plans streamed 14, ran 0.705 s against 0.543
/// predicted, and starved a gradient download, which turned the adaptive copy rule
/// (runtime_copy_by) for the rest of the process. Measured on two H100s (the same quarter, compact
/// master, three calibrating runs each way): with it every phase was predicted
/// within 10% (-4.4..+8.5%), without it each run had a phase or two off by 13-21% (the first
/// phase from a calibration that read link_share high, or a second planned at a first measure of
/// 1.04 or 1.12); the full master, one run each way, within 2.6% with it from the first phase on.
/// The runtime passes true unless DOS_FIRST_LINK_SHARE=whole; this parameter's own default, false,
/// is the rule before, for callers that name no rule.
Refined refine_after_phase(const Workload& w, const Rates& r, const PhaseMeasure& m, const Simulation& sim,
                           std::size_t cpu_workers, bool link_share_measured, bool first_streamed,
                           bool u_c_measured = true, const Rates* calibrated = nullptr,
                           const StreamEndAt* stream_end_at = nullptr, bool provisional_lowers_only = false);

/// The most the refinement's share rule lets a link rate grow: kLinkCeiling times its calibrated
/// value (unitless; refine_rates' `calibrated`, cap_links). The calibration measures each link with
/// both directions running at once; one direction alone moves a little more (on the GPU machine
/// 55.4 GB/s against 50.7 each way at once, 1.09x), and the calibration's figure has read low on
/// H100s (36.7 GB/s device to host in one calibration, where an H100's all-streamed phases moved
/// 40-42 GB/s each way), so the ceiling leaves 1.25x. Why a ceiling: in a mixed phase whose streams
/// end sooner than simulated with link_share at its cap, the share rule gives the rest of the error
/// to B, and nothing else stops it there. Measured on an H100 (the GPT shapes of 1.01e9 parameters,
/// 21 subgroups of 5e7, compact master, dos-train's sweep of streamed fractions): B_h2d grew to
/// about 80 GB/s over the mixed phases, the plan then streamed 19 of the 21 subgroups, predicted at
/// 0.122 s, and ran 0.234-0.248 s, 21.6% slower than the sweep's fastest plan (6 of 21 streamed);
/// with the ceiling, in another call, the model's choice was the sweep's fastest.
inline constexpr double kLinkCeiling = 1.25;

/// Whether `calibrated` is a measure apart from `rates` to hold their links to: some rate differs.
/// Rates given as numbers, or a rates file without calibrated rates (load_rates then gives the rates
/// themselves), are their own calibration: nothing to hold them to, and the refinement stays free
/// to raise links that start low. A calibration's own start (rates equal to it) is the caller's to
/// know: the runtime holds its links to it. Throws nothing.
bool calibration_apart(const Rates& rates, const Rates& calibrated) noexcept;

/// `r` with B_h2d and B_d2h each at most kLinkCeiling times `calibrated`'s (a calibrated rate that
/// is not a positive number caps nothing), then, where a link was capped, link_share and U_c_dma
/// brought back within their bounds as refine_rates leaves them (link_share at most
/// highest_link_share, U_c_dma at least lowest_distinct_u_c_dma of w and cpu_workers); r unchanged
/// otherwise. The runtime applies it to the rates it starts from when they come from its
/// calibration or its cache, or from a rates file whose calibrated rates are apart
/// (calibration_apart): such a file may hold links refined past the ceiling before the share rule
/// held them; `dos-train --plan-only --rates FILE` does the same. Throws std::invalid_argument when
/// a rate of r is not a positive number.
Rates cap_links(const Workload& w, const Rates& r, const Rates& calibrated, std::size_t cpu_workers = 1);

/// How recent phases went against their predictions, for the outlier rule (hold_outlier_phase):
/// each phase's ratio measured seconds / predicted seconds (unitless; the prediction is the
/// simulation of the plan as it ran, at the rates it was made with). count: phases recorded (refined
/// or held); last, before_last: the last two's ratios (0 until recorded); last_held: the last phase
/// was held; last_plan: the plan the last phase ran (PlanSide per subgroup).
struct PhaseErrors {
  std::size_t count = 0;
  double last = 0, before_last = 0;
  bool last_held = false;
  std::vector<PlanSide> last_plan;
};

/// The outlier rule's thresholds, ratios of two phases' measured / predicted ratios (unitless):
/// two phases are steady when theirs differ by at most kSteadyRatio either way, a phase is an
/// outlier when its own differs from the last phase's by more than kOutlierRatio either way.
inline constexpr double kSteadyRatio = 1.15;
inline constexpr double kOutlierRatio = 1.3;

/// Whether the optimizer refines nothing from a phase that ran `plan` and took `ratio` times its
/// prediction (measured / predicted seconds), given the phases before it (`recent`): true when the
/// last two phases recorded were steady (their ratios within kSteadyRatio of each other), the last
/// was not held and ran the same plan, and this phase's ratio is more than kOutlierRatio off the
/// last one's either way. Relative to the recent phases, so that a model that is steadily off (the
/// 20B quarter's phases were predicted 12-19% fast at 67a6646) holds a phase as far from its
/// neighbours as an exact one does; under the same plan only, since a plan that changed may be
/// predicted another way, and holding the phase after a plan change would keep that plan a phase
/// longer. Such a phase says more about itself than about the machine: the next phase refines as
/// usual and, if the machine did change, is as far off and is refined (held phases never come two
/// in a row), so a lasting change is followed one phase later. Why: on the GPU machine (an H100,
/// the 1.01e9-parameter GPT in PyTorch, 21 subgroups of 5e7) one phase ran its CPU Adam at 1.9
/// Gparams/s where the others ran 3.3-3.8 (0.300 s against about 0.20), and the refinement, taking
/// that phase's U_c half way, moved the next plans from 8 to 12 streamed subgroups, which the links
/// then bound (0.213, 0.221 s). On the simulation (test_one_slow_phase, the GPT at that run's rates
/// and the 20B quarter) one phase with the CPU at 0.4x or 0.55x its speed cost the next ten phases
/// 3.0-7.0% at worst without the rule and nothing with it; a CPU that stays at 0.55x is followed one
/// phase later; a phase whose errors cancel (the CPU 2.5x as fast and the links at 0.8x), predicted
/// well and refined, moves the plan, and the phase after it, under the new plan, is not held
/// (test_odd_phase_predicted_well). Not held: a ratio that is not a positive finite number. Throws
/// nothing.
bool hold_outlier_phase(const PhaseErrors& recent, double ratio, const std::vector<PlanSide>& plan) noexcept;

/// `recent` after one more phase: its ratio (one that is not a positive finite number is recorded
/// as 0, which no later phase is steady with), whether it was held, and its plan. Throws
/// std::bad_alloc only (the plan's copy).
PhaseErrors record_phase_error(const PhaseErrors& recent, double ratio, bool held, const std::vector<PlanSide>& plan);

/// Whether rates hold a measured link_share: false only for the placeholder, a link_share of exactly
/// 1 (the calibration gives it unless it measures link_share, and rates given without one, in
/// --rates or the C ABI, get 1). Whether an optimizer counts that measure is
/// initial_link_share_record's rule (the calibration's own value is not counted). So a rates file that an earlier run
/// refined, or rates given with a link_share other than 1, count as measured. A refined value of
/// exactly 1 is taken for the placeholder too: it is common (link_share's cap U_c / U_c_dma is 1
/// when U_c_dma reaches U_c), and the next run then takes its first measure whole, within a factor
/// of 2 of 1, where it would have blended it; the rates file does not record whether link_share
/// was measured.
bool link_share_is_measured(const Rates& r);

/// What an optimizer's phases have told about link_share, for its rates file. measured: the rates
/// hold a counted measure (initial_link_share_record of the rates it started from, then each
/// phase's Refined::link_share_measured); provisional: the last uncounted measure of link_share (a
/// share, unitless, as Rates::link_share): the calibration's, then the one a first phase that
/// streamed took whole without counting it (Refined::link_share_provisional; the value after that
/// phase's bounds, in [1/16, U_c / U_c_dma] at that phase's rates), 0 when there is none.
struct LinkShareRecord {
  bool measured = false;
  double provisional = 0;
};

/// The record an optimizer starts with, from the rates it plans with (`rates`) and the calibration's
/// own (`calibrated`, as calibrate_rates gives them; both as Rates, link_share unitless):
///  - rates.link_share equal to calibrated.link_share, or to calibrated.link_share capped at
///    highest_link_share(rates) (as rates_to_save keeps it when a phase lowered that cap): no phase
///    has measured it since the calibration. measured is false, so the optimizer's first phases
///    that stream take their own measures whole (refine_after_phase); provisional is that value
///    when the calibration gave one (its estimate or measure: calibrated.link_share not kUnmeasuredLinkShare), 0
///    otherwise, so rates_to_save keeps it when no phase measures link_share. This covers a fresh
///    calibration and a rates file whose link_share no phase moved. (A phase's measure that equals
///    it exactly is taken for it: its next run's first phases take their measures whole.)
///  - otherwise: measured is link_share_is_measured(rates) (a rates file that phases refined, or a
///    file written before the calibration measured link_share, whose calibrated link_share is the
///    placeholder), provisional 0.
/// A rates file keeps the calibration's value until --recalibrate; calibrations under each
/// link_share rule (DOS_CALIBRATE_LINK_SHARE) have files of their own (rates_cache_path),
/// so a run reads its own kind's. load_rates gives a file
/// without a "calibrated" object its own rates as the calibration's, so such a file's link_share is
/// taken for the calibration's (uncounted); `dos-train --rates FILE` passes the file's calibrated
/// rates (OptimizerOptions::calibrated_rates), so a file is started from as the cache is; rates
/// given as numbers have none, and there a link_share other than 1 counts as measured, as every
/// rate given does.
/// Why the calibration's measure is not counted: it comes from short phases of scratch subgroups
/// (calibrate_rates), and a first measure counted would be blended half way with the phases' own
/// where, while it is uncounted, the first phases replace it. Throws nothing.
LinkShareRecord initial_link_share_record(const Rates& rates, const Rates& calibrated) noexcept;

/// The record after one more phase, refined as `r` says: measured becomes r.link_share_measured;
/// provisional becomes r.rates.link_share when r.link_share_provisional, and is kept otherwise (a
/// later phase still uncounted that could size no measure moves link_share towards its stand-in,
/// which is no measure: the provisional value stays the first phase's). Throws nothing.
LinkShareRecord record_phase(const LinkShareRecord& before, const Refined& r) noexcept;

/// The rates an optimizer writes back to its rates file at its end: `r` when rec.measured;
/// otherwise `r` with link_share replaced by rec.provisional when the calibration or a first phase
/// that streamed took one (rec.provisional > 0), capped at highest_link_share of `r` (a later phase may have lowered
/// that cap by moving U_c or U_c_dma; rates files above it are refused, rate_bounds_error), else by
/// the placeholder (kUnmeasuredLinkShare). The next run takes a saved value other than 1 for a
/// measure (link_share_is_measured) and blends its own phases' measures with it, half way; a
/// provisional value of exactly 1 (the cap when U_c_dma reached U_c) is saved as 1 and taken for
/// the placeholder.
/// Why the provisional measure is kept: on the GPU machine, whose phases refine link_share to
/// 0.64-0.89, a run of two phases with 31.5 GB of the 20B quarter's state resident (the first
/// bringing it up and streaming nothing, the second the first that streams) saved the placeholder,
/// and the next runs' first phases, planned at link_share 1, were predicted 17% too fast; on
/// another machine with the provisional measure saved (0.78) the next runs predicted them -6.6% and
/// -8.2% (a calibrating run there, at the placeholder, -15.2%).
/// What it costs: that first phase may run slow, and on a machine whose link_share is 1 or more
/// a slow phase measures it low. On the simulation (test_first_phases's
/// test_provisional_link_share_saved) the next run's first phase is then predicted too slow:
/// +6.4% after a first streamed phase whose links ran at 1/1.1 of their rate on a machine of 1.0
/// (+0.3% from the placeholder), +16.5% at 1/1.3 (+0.8%), +10.2% at 1/1.3 on a machine of 1.2
/// (+3.2%); on a machine of 0.7 it is -4.2% against -18.6% from the placeholder. With the kernels
/// loaded at start, first phases that stream ran 1% faster to 10% slower than the next ones on the
/// GPU machine (7B and 20B quarters without resident state). The GPU machine's figures here, from
/// runs on two GPU machines (the 17% at bc5e312, the others at 675bd11): docs/measured-2026-12.md,
/// "At 675bd11" (also README, "At the final code (675bd11)"), and "The README's measured section
/// at 4820de6". Throws nothing.
Rates rates_to_save(const Rates& r, const LinkShareRecord& rec) noexcept;

}  // namespace dos
