// The calibration's PCIe rates from several readings of the link, and when a reading is too low to
// keep. Pure functions: no StarPU, no CUDA, no clocks; the calibration measures (benchmark_pcie in
// codelets/kernels/adam.h), this decides.
//
// Why it matters: the online refinement raises a link's rate at most to kLinkCeiling times its
// calibrated rate (refinement.h), so a calibration that reads the link low holds every later plan
// to stream less than the link carries, until a phase streams alone. Measured on an H100 machine:
// one calibration read 24.8 / 30.4 GB/s (host to device / device to host, both at once) where
// another, an hour earlier on the same machine, read 48.2 / 51.2; the plans of that run streamed
// 10-15 of 35 subgroups and its phases ran at 84% of the machine's bound instead of 92%.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dos {

/// One reading of the link, bytes/s (0: not measured): each direction alone (h2d, d2h) and both at
/// once (duplex_h2d, duplex_d2h), as benchmark_pcie measures them.
struct LinkReading {
  double h2d = 0, d2h = 0, duplex_h2d = 0, duplex_d2h = 0;
};

/// A reading is low when a direction alone moved less than this fraction (unitless) of the
/// reference's rate for it. The reference is StarPU's own bus calibration, one direction at a time
/// (starpu_transfer_bandwidth). Measured on the GPU machines: one direction alone 52-55 GB/s beside
/// StarPU's figures of the same size; the low calibration above read about half. The rates alone
/// are compared, not the duplex ones, so that a link that cannot run both ways at full rate (its
/// duplex rates below its one-way ones on every reading) is not taken for a low reading.
inline constexpr double kLowLinkFraction = 0.75;

/// The most readings the calibration takes of the link: a first one, then more while the best
/// reading so far is low (link_reading_low).
inline constexpr int kMostLinkReadings = 5;

/// Whether `best` reads the link low against `reference` (StarPU's one-way rates in its h2d and
/// d2h, bytes/s): h2d or d2h below kLowLinkFraction times the reference's. A reference rate that is
/// not a positive finite number makes that direction never low (nothing to compare with); so does a
/// reading of 0 in `best` (not measured). Throws nothing.
bool link_reading_low(const LinkReading& best, const LinkReading& reference) noexcept;

/// The best of `readings`, direction by direction (the largest rate of each field over the
/// readings; the readings need not agree on which one is best): a reading slowed by something
/// outside the link (another process's copies, a brief stall) moves nothing. Empty: every field 0.
/// Throws nothing.
LinkReading best_link_reading(const std::vector<LinkReading>& readings) noexcept;

/// The calibration's link rates (bytes/s, both directions at once) from `measure`, a function that
/// reads the link once and returns false when it could not (then no reading is counted):
/// reads it once, then again while link_reading_low(best so far, reference) and fewer than
/// kMostLinkReadings readings were taken, calling `pause` (if not null) before each new reading.
/// *readings_taken gets the number of readings measured. *low gets whether the best stayed low: the
/// caller then warns that the plans will stream less than the link allows. Returns the best reading
/// (best_link_reading); every field 0 when no reading was measured. Throws what measure or pause
/// throw.
template <class Measure, class Pause>
LinkReading read_link(Measure&& measure, Pause&& pause, const LinkReading& reference, int* readings_taken,
                      bool* low) {
  std::vector<LinkReading> readings;
  int tries = 0;
  for (; tries < kMostLinkReadings; ++tries) {
    if (tries > 0) {
      if (!link_reading_low(best_link_reading(readings), reference)) break;
      pause();
    }
    LinkReading r;
    if (measure(&r)) readings.push_back(r);
  }
  const LinkReading best = best_link_reading(readings);
  if (readings_taken) *readings_taken = int(readings.size());
  if (low) *low = !readings.empty() && link_reading_low(best, reference);
  return best;
}

/// The warning line (no newline) for a calibration whose link stayed low: `best` and `reference`
/// in GB/s, the readings taken, and what to do: measure again on a quiet machine (delete
/// `cache_path`, the rates cache the calibration writes, or calibrate again: dos-train's
/// --recalibrate, OptimizerOptions::recalibrate). Throws std::bad_alloc only.
std::string low_link_warning(const LinkReading& best, const LinkReading& reference, int readings_taken,
                             const std::string& cache_path);

}  // namespace dos
