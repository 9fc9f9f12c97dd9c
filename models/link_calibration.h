// The calibration's PCIe rates from several readings of the link, and when a reading is too low to
// keep. Pure functions: no StarPU, no CUDA, no clocks; the calibration measures (benchmark_pcie in
// codelets/kernels/adam.h), this decides.
//
// Why it matters: the online refinement raises a link's rate at most to kLinkCeiling times its
// calibrated rate (refinement.h), so a calibration that reads the link low holds every later plan
// of the run, and of every run that starts from the rates cache, to stream less than the link
// carries. Measured on an H100 machine: one calibration read 24.8 / 30.4 GB/s (host to device /
// device to host, both at once) where another, an hour earlier on the same machine, read 48.2 /
// 51.2; the plans of that run streamed 10-15 of 35 subgroups. Only the rates both at once were
// recorded: their sum, 55.2 GB/s, is one direction's rate alone on that machine, as if the two
// directions had not run at once. Why is not known; hence both kinds of reading are checked.
#pragma once

#include <string>
#include <vector>

namespace dos {

/// One reading of the link, bytes/s (0: not measured): each direction alone (h2d, d2h) and both at
/// once (duplex_h2d, duplex_d2h), as benchmark_pcie measures them.
struct LinkReading {
  double h2d = 0, d2h = 0, duplex_h2d = 0, duplex_d2h = 0;
};

/// A reading is low when one of its rates lies below this fraction (unitless) of the reference's
/// rate for that direction. The reference is StarPU's own bus calibration, one direction at a time
/// (starpu_transfer_bandwidth, in LinkReading's h2d and d2h). Measured on the GPU machines' H100s:
/// StarPU's figures 53.6 / 54.1 GB/s, one direction alone 55.1-55.4, both at once 47.2-49.6 host to
/// device and 51.1-51.8 device to host (0.88-0.96 of StarPU's); the low calibration above read
/// 0.46 and 0.56 of them. A link that cannot carry both directions at once near its one-way rate
/// at 75% of StarPU's one-way figure reads low every time: its calibrations then take
/// kMostLinkReadings measures and warn, and its rates are kept all the same (the best reading's).
inline constexpr double kLowLinkFraction = 0.75;

/// The most measures of the link the calibration makes (failed ones included): a first one, then
/// more while the best reading so far is low (read_link). Five measures 250 ms apart take 1 s of
/// pauses plus the measures (each pins 512 MiB and makes nine copies of 256 MiB): long enough to
/// outlast another process's burst of copies; a slowdown that lasts longer is left to the warning.
/// A runtime of several ranks on one node (RuntimeOptions::node_ranks > 1) is not checked: its
/// ranks calibrate at once on links they share, below StarPU's single-process figures by design;
/// the calibration reads the link once there and warns of nothing.
inline constexpr int kMostLinkReadings = 5;

/// Whether `reading` is low against `reference` (StarPU's one-way rates in its h2d and d2h,
/// bytes/s; its duplex fields unused): a direction's one-way rate, or its rate both at once, below
/// kLowLinkFraction times the reference's rate for that direction. A reference rate that is not a
/// positive finite number makes that direction never low (nothing to compare with); so does a rate
/// in `reading` that is not a positive number (0: not measured; a cached calibration has its rates
/// both at once only). Throws nothing.
bool link_reading_low(const LinkReading& reading, const LinkReading& reference) noexcept;

/// The best of `readings` (bytes/s): each one-way rate the largest over the readings, and the rates
/// both at once the pair of one reading (both directions share the link, so the best of each taken
/// apart may be a pair no reading reached): of the readings whose two rates both at once are not
/// low against `reference` (as link_reading_low judges them), the one whose two add up to the
/// most; when every reading's are low, the largest sum of all. A reading slowed by something outside
/// the link (another process's copies, a brief stall) then moves nothing, and a healthy pair is kept
/// over a low one of a larger sum. Empty: every field 0. Throws nothing.
LinkReading best_link_reading(const std::vector<LinkReading>& readings, const LinkReading& reference) noexcept;

/// The calibration's link rates from `measure`, a function that measures the link once into its
/// LinkReading* argument and returns false when it could not (then nothing is counted), and
/// `pause`, called with no argument before each measure after the first (the caller's wait between
/// them). Measures once; a first measure that fails ends it (the caller keeps what it had); then,
/// while link_reading_low(best so far, reference) and fewer than kMostLinkReadings measures were
/// made, pauses and measures again. *readings_taken (when not null) gets the readings counted;
/// *low (when not null) whether the best stayed low, when one was counted: the caller then warns
/// (low_link_warning). Returns best_link_reading of the readings counted against `reference`
/// (bytes/s, all four rates);
/// every field 0 when none was. Throws what measure or pause throw, and std::bad_alloc.
template <class Measure, class Pause>
LinkReading read_link(Measure&& measure, Pause&& pause, const LinkReading& reference, int* readings_taken,
                      bool* low) {
  std::vector<LinkReading> readings;
  for (int tries = 0; tries < kMostLinkReadings; ++tries) {
    if (tries > 0) {
      // no reading yet (the first measure failed): nothing is low, so this ends it too
      if (!link_reading_low(best_link_reading(readings, reference), reference)) break;
      pause();
    }
    LinkReading r;
    if (measure(&r)) readings.push_back(r);
  }
  const LinkReading best = best_link_reading(readings, reference);
  if (readings_taken) *readings_taken = int(readings.size());
  if (low) *low = !readings.empty() && link_reading_low(best, reference);
  return best;
}

/// The warning (one line, no newline) for link rates that read low (link_reading_low(best,
/// reference) true; otherwise the text names no rate): `best` the reading (bytes/s; a rate that is
/// not low is left out), `reference` StarPU's one-way rates (bytes/s), each low rate named beside
/// StarPU's figure for its direction (printed in GB/s). `readings_taken` the readings `best` is the
/// best of, or 0 or less when the rates come from the rates cache rather than from this process's
/// calibration; `cache_path` the rates cache file the calibration writes: every later run of this
/// configuration starts from it. It says what to do: delete that file or calibrate again once the
/// machine is quiet, have StarPU measure its bus again if its figures are stale
/// (STARPU_BUS_CALIBRATE=1), and that a link which cannot carry both directions at once at 75% of
/// its one-way figure reads low every time. Throws what std::string throws (std::bad_alloc,
/// std::length_error).
std::string low_link_warning(const LinkReading& best, const LinkReading& reference, int readings_taken,
                             const std::string& cache_path);

}  // namespace dos
