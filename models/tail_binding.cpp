// Late binding of a plan's tail (tail_binding.h).
#include "tail_binding.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dos {

namespace {
void check(const SideOutlook& s, const char* side) {
  for (double v : {s.left, s.pace, s.drain, s.lead})
    if (!(std::isfinite(v) && v >= 0))
      throw std::invalid_argument(std::string("tail binding: the ") + side +
                                  "'s outlook needs finite, non-negative left, pace, drain and lead");
}
}  // namespace

PlanSide bind_tail(std::size_t n, const SideOutlook& cpu, const SideOutlook& stream) {
  check(cpu, "CPU");
  check(stream, "stream");
  const double p = double(n);
  return cpu.left + p * (cpu.pace + cpu.drain) <= stream.left + p * (stream.pace + stream.drain) ? PlanSide::cpu
                                                                                                  : PlanSide::gpu_streamed;
}

bool tail_due(std::size_t n, const SideOutlook& cpu, const SideOutlook& stream) {
  check(cpu, "CPU");
  check(stream, "stream");
  const double p = double(n);
  return cpu.left <= cpu.lead * p * cpu.pace || stream.left <= stream.lead * p * stream.pace;
}

}  // namespace dos
