// The environment's switches of the runtime's model (how it measures what its refinement reads),
// read once per process. Part of the public C++ API: runtime/dos.h includes it.
#pragma once

namespace dos {

/// How the refinement measures link_share in a phase whose streams ran mostly beside CPU Adam, as
/// the environment's DOS_LINK_SHARE_MEASURE says (read once, at the first call: the first phase
/// that refines, or dos-train's report): "beside" (the default: unset, or a value other than these
/// two, with a warning on stderr), the formula of refine_rates (models/refinement.h), or
/// "simulated", link_share_at_stream_end. A measurement switch; the same results either way.
/// Throws nothing.
const char* runtime_link_share_measure();

/// What the refinement does with the first streamed phase's provisional measure of link_share
/// (refine_after_phase, models/refinement.h), as the environment's DOS_FIRST_LINK_SHARE says (read
/// once, at the first call: the first phase that refines, or dos-train's report): "lower" (the
/// default: unset, or a value other than these two, with a warning on stderr), not taken where it
/// is above the calibration's value (provisional_lowers_only), or "whole", taken whole within a
/// factor of 2 (the rule before). A measurement switch: plans and predictions may differ, the
/// parameters do not. Throws nothing.
const char* runtime_first_link_share();

}  // namespace dos
