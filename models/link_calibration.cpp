// The calibration's PCIe rates from several readings (link_calibration.h).
#include "link_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dos {
namespace {
// Whether `rate` lies below kLowLinkFraction of `reference`: never where either is no measure (a
// reference that is not a positive finite number, a rate of 0 or less: not measured).
bool below(double rate, double reference) {
  if (!(reference > 0) || !std::isfinite(reference) || !(rate > 0)) return false;
  return rate < kLowLinkFraction * reference;
}
}  // namespace

bool link_reading_low(const LinkReading& best, const LinkReading& reference) noexcept {
  return below(best.h2d, reference.h2d) || below(best.d2h, reference.d2h);
}

LinkReading best_link_reading(const std::vector<LinkReading>& readings) noexcept {
  LinkReading best;
  for (const LinkReading& r : readings) {
    best.h2d = std::max(best.h2d, r.h2d);
    best.d2h = std::max(best.d2h, r.d2h);
    best.duplex_h2d = std::max(best.duplex_h2d, r.duplex_h2d);
    best.duplex_d2h = std::max(best.duplex_d2h, r.duplex_d2h);
  }
  return best;
}

std::string low_link_warning(const LinkReading& best, const LinkReading& reference, int readings_taken,
                             const std::string& cache_path) {
  char line[640];
  std::snprintf(line, sizeof line,
                "[dos] warning: the calibration read PCIe low in %d readings: one direction at a time %.1f GB/s host "
                "to device and %.1f device to host, below %.0f%% of StarPU's bus calibration (%.1f and %.1f GB/s); "
                "both at once %.1f and %.1f GB/s. The plans will stream less than the link may carry. If the "
                "machine was busy, calibrate again when it is quiet: delete %s or pass --recalibrate "
                "(OptimizerOptions::recalibrate)",
                readings_taken, best.h2d / 1e9, best.d2h / 1e9, 100 * kLowLinkFraction, reference.h2d / 1e9,
                reference.d2h / 1e9, best.duplex_h2d / 1e9, best.duplex_d2h / 1e9, cache_path.c_str());
  return line;
}

}  // namespace dos
