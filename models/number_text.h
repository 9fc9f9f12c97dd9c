// Numbers in messages: the fewest decimal digits that give a double back.
//
// Contract: header only, no state; used where an error message names a value a caller gave, so
// that a value just beside a bound (1e-9 below 0, a bit below 1/16) is not printed as the bound
// itself (std::to_string prints -1e-9 as -0.000000).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace dos {

/// `x` in the fewest significant digits, 6 to 17, that strtod reads back as `x` exactly ("%.*g":
/// 0.0625, -1e-09, 0.062499999999999993 for the double just below 1/16); "nan", "inf" or "-inf"
/// for those. Throws nothing but std::bad_alloc.
inline std::string shortest_text(double x) {
  char text[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, x);
    if (std::strtod(text, nullptr) == x) break;
  }
  return text;
}

}  // namespace dos
