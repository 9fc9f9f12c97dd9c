// Measurement switches: environment variables that pick between two ways of doing the same work
// (same results), read once by each caller into a static. Internal to the runtime (not installed).
#pragma once

#include <cstdlib>
#include <cstring>

namespace dos::detail {

/// Whether the environment variable `name` is set to exactly `value` (case-sensitive); false when
/// it is unset. Throws nothing.
inline bool env_says(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

}  // namespace dos::detail
