// The calibration's PCIe rates from several readings (link_calibration.h).
#include "link_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "refinement.h"

namespace dos {
namespace {
// Whether `rate` lies below kLowLinkFraction of `reference`: never where either is no measure (a
// reference that is not a positive finite number, a rate of 0 or less: not measured).
bool below(double rate, double reference) {
  if (!(reference > 0) || !std::isfinite(reference) || !(rate > 0)) return false;
  return rate < kLowLinkFraction * reference;
}

// "X.X GB/s" of a rate in bytes/s
std::string gbs(double rate) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GB/s", rate / 1e9);
  return s;
}

// One direction's part of the warning: its low rates beside StarPU's figure ("" when none is low)
std::string low_part(const char* direction, double alone, double both, double reference) {
  std::string part;
  if (below(alone, reference)) part += "alone " + gbs(alone);
  if (below(both, reference)) part += std::string(part.empty() ? "" : ", ") + "both ways at once " + gbs(both);
  if (part.empty()) return part;
  return std::string(direction) + ": " + part + " against StarPU's " + gbs(reference);
}
}  // namespace

bool link_reading_low(const LinkReading& reading, const LinkReading& reference) noexcept {
  return below(reading.h2d, reference.h2d) || below(reading.d2h, reference.d2h) ||
         below(reading.duplex_h2d, reference.h2d) || below(reading.duplex_d2h, reference.d2h);
}

LinkReading best_link_reading(const std::vector<LinkReading>& readings, const LinkReading& reference) noexcept {
  LinkReading best;
  double best_sum = -1;  // the largest sum both at once so far, among healthy pairs once one is seen
  bool healthy_seen = false;
  for (const LinkReading& r : readings) {
    best.h2d = std::max(best.h2d, r.h2d);
    best.d2h = std::max(best.d2h, r.d2h);
    const bool healthy = !below(r.duplex_h2d, reference.h2d) && !below(r.duplex_d2h, reference.d2h);
    const double sum = r.duplex_h2d + r.duplex_d2h;
    if ((healthy && !healthy_seen) || (healthy == healthy_seen && sum > best_sum)) {
      best_sum = sum;
      healthy_seen = healthy_seen || healthy;
      best.duplex_h2d = r.duplex_h2d;
      best.duplex_d2h = r.duplex_d2h;
    }
  }
  return best;
}

std::string low_link_warning(const LinkReading& best, const LinkReading& reference, int readings_taken,
                             const std::string& cache_path) {
  std::string low = low_part("host to device", best.h2d, best.duplex_h2d, reference.h2d);
  const std::string d2h = low_part("device to host", best.d2h, best.duplex_d2h, reference.d2h);
  if (!d2h.empty()) low += (low.empty() ? "" : "; ") + d2h;
  char ceiling[16];
  std::snprintf(ceiling, sizeof ceiling, "%.2fx", kLinkCeiling);
  std::string w = "[dos] warning: ";
  if (readings_taken > 0) {
    w += "the calibration read PCIe low (the best of " + std::to_string(readings_taken) + " reading" +
         (readings_taken == 1 ? "" : "s") + "): ";
  } else {
    w += "the cached calibration in " + cache_path + " holds PCIe rates that are low: ";
  }
  char fraction[16];
  std::snprintf(fraction, sizeof fraction, "%.0f%%", 100 * kLowLinkFraction);
  w += low + " (below " + fraction + " of StarPU's bus calibration, one direction at a time). The refinement "
       "raises a link at most to " + ceiling + " its calibrated rate, so the plans may stream less than the link "
       "carries. ";
  w += readings_taken > 0 ? "These rates will be cached in " + cache_path + " and every later run of this "
                            "configuration starts from them: once the machine is quiet, delete that file or "
                            "calibrate again"
                          : "Once the machine is quiet, delete that file or calibrate again";
  w += " (dos-train --recalibrate, OptimizerOptions::recalibrate). If StarPU's bus figures are stale, "
       "STARPU_BUS_CALIBRATE=1 has StarPU measure them again; a link that cannot carry both directions at once "
       "at " + std::string(fraction) + " of its one-way figure reads low every time";
  return w;
}

}  // namespace dos
