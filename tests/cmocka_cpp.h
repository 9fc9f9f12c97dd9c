// CMocka from C++: the header needs these includes first and has no extern "C" of its own.
#pragma once
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <stdexcept>

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
