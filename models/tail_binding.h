// Late binding of a plan's tail: the last few subgroups of an update phase go to whichever side,
// the CPU or the GPU's stream of state, is projected to end first, decided while the phase runs from
// the pace each side has kept in it so far. A plan made in advance is only as good as the rates
// behind it: on the GPU machine the 20B quarter's CPU Adam of one 124M-parameter subgroup took from
// 29 to 58 ms from one phase to the next, so a fixed plan left one side idle for 100-160 ms at the
// end of some phases. Pure functions: no StarPU, no clocks; the runtime measures, this decides.
// Results do not depend on it: a subgroup's update gives the same bits on either side.
#pragma once

#include <cstddef>

#include "resource_model.h"

namespace dos {

/// One side of the phase as the runtime sees it mid-phase (seconds; per-parameter figures in
/// seconds per parameter). left: seconds of work already given to this side still ahead of it (its
/// subgroups submitted and not ended, at its pace); pace: seconds per parameter this side has taken
/// in this phase (the CPU: its Adam tasks' busy seconds over their parameters, divided by the CPU
/// workers; the stream: seconds between its first and last Adam ends over the parameters updated
/// between them); drain: seconds per parameter after a subgroup's update until it is done on this
/// side (the CPU: its new parameters up, pb / B_h2d; the stream: its state home, 12 / B_d2h).
/// lead: how many updates of work ahead the side needs to be given its next subgroup in time (the
/// CPU 1: its next gradients come down while its current update runs; the stream 2: the next
/// state goes up behind the one already on its way).
struct SideOutlook {
  double left = 0, pace = 0, drain = 0, lead = 1;
};

/// The side for a tail subgroup of n parameters: PlanSide::cpu when the CPU's projected end,
/// cpu.left + n (cpu.pace + cpu.drain), is not later than the stream's, stream.left + n
/// (stream.pace + stream.drain); else PlanSide::gpu_streamed (ties go to the CPU, which holds no
/// GPU memory). Throws std::invalid_argument when a figure is negative or not finite.
PlanSide bind_tail(std::size_t n, const SideOutlook& cpu, const SideOutlook& stream);

/// Whether the next tail subgroup of n parameters is due now: a side's work ahead has fallen to
/// its lead of its own updates of n parameters (left <= lead n pace). Throws std::invalid_argument
/// as bind_tail, and when a lead is negative or not finite.
bool tail_due(std::size_t n, const SideOutlook& cpu, const SideOutlook& stream);

}  // namespace dos
