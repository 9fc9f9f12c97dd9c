// CMocka from C++: the header needs these includes first and has no extern "C" of its own.
#pragma once
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>
#include <stdexcept>

/// Fails the test unless |a - b| <= tol, compared in double precision (cmocka's assert_float_equal
/// compares as float: 256 apart counts as equal near 4e9). Use through ASSERT_NEAR.
inline void assert_near_at(double a, double b, double tol, const char* file, int line) {
  if (!(std::fabs(a - b) <= tol)) fail_msg("%s:%d: %.17g and %.17g differ by more than %g", file, line, a, b, tol);
}
#define ASSERT_NEAR(a, b, tol) assert_near_at((a), (b), (tol), __FILE__, __LINE__)

/// True when f() throws std::invalid_argument (for the tests of input checks).
template <class F>
bool throws_invalid_argument(F f) {
  try {
    f();
  } catch (const std::invalid_argument&) {
    return true;
  }
  return false;
}
