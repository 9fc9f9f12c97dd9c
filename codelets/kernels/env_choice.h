// Measurement switches: environment variables that pick between ways of doing the same work (same
// results), e.g. DOS_CPU_SCHEDULE, DOS_NT_STORES, DOS_TEAM_BIND, DOS_COPY_BY, DOS_PARAM_UPLOAD.
// Each caller reads its switch once into a static, so that a bad value is named once (DOS_BIND:
// at each start of the runtime).
// Here, in the lowest room (no StarPU, the standard library only), so that the kernels, the
// codelets and the runtime read their switches the same way. Internal (not installed).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace dos::detail {

/// env_index's answer for a variable that is unset or empty.
inline constexpr int kEnvUnset = -1;
/// env_index's answer for a value that is none of those accepted.
inline constexpr int kEnvOther = -2;

/// The position in `values` of the environment variable `name`'s value (exact, case-sensitive);
/// kEnvUnset when it is unset or empty, kEnvOther when it is none of `values`. Reads the
/// environment at each call and prints nothing.
inline int env_index(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  if (!v || !*v) return kEnvUnset;
  int i = 0;
  for (const char* k : values) {
    if (std::strcmp(v, k) == 0) return i;
    ++i;
  }
  return kEnvOther;
}

/// "a, b, c": the accepted values as a warning or an error names them.
inline std::string env_values_text(std::initializer_list<const char*> values) {
  std::string s;
  for (const char* k : values) s += (s.empty() ? "" : ", ") + std::string(k);
  return s;
}

/// A switch that takes one of `values`: the position of the environment variable `name`'s value
/// in `values`, or `fallback` (the default: a position in `values`, or any other number the
/// caller gives meaning to) when it is unset or empty. A value that is none of `values` gives
/// `fallback` too, with a warning on standard error that names the variable, its value and the
/// accepted values, then `instead` (what is used in its place):
///   [dos] warning: NAME=VALUE is not one of A, B; INSTEAD
/// Reads the environment at each call: a caller that reads its switch once keeps the answer in a
/// static (one warning).
inline int env_choice(const char* name, std::initializer_list<const char*> values, int fallback,
                      const char* instead) {
  const int i = env_index(name, values);
  if (i >= 0) return i;
  if (i == kEnvOther)
    std::fprintf(stderr, "[dos] warning: %s=%s is not %s%s; %s\n", name, std::getenv(name),
                 values.size() == 1 ? "" : "one of ", env_values_text(values).c_str(), instead);
  return fallback;
}

/// Whether `v` (not null) reads as a whole number from lo to hi (std::strtol's reading, base 10,
/// the whole value; a value beyond long's range reads as its bound, so outside any narrower
/// range); the number in *n when it does. Prints nothing.
inline bool whole_number_in(const char* v, long lo, long hi, long* n) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) return false;
  *n = x;
  return true;
}

/// A switch that takes a whole number: the environment variable `name`'s value when it is one from
/// lo to hi (std::strtol's reading, base 10, the whole value), or `fallback` when it is unset or
/// empty. Any other value gives `fallback` too, with a warning on standard error that names the
/// variable, its value, the range and `instead` (what is used in its place):
///   [dos] warning: NAME='VALUE' is not a whole number from LO to HI: ignored (INSTEAD)
/// Reads the environment at each call: a caller that reads its switch once keeps the answer in a
/// static (one warning).
inline long env_whole(const char* name, long lo, long hi, long fallback, const char* instead) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  long n = 0;
  if (whole_number_in(v, lo, hi, &n)) return n;
  std::fprintf(stderr, "[dos] warning: %s='%s' is not a whole number from %ld to %ld: ignored (%s)\n", name, v, lo, hi,
               instead);
  return fallback;
}

/// A kernel's instruction-set path out of three, names[0] (plain code), names[1] and names[2] (the
/// best), has[k] saying whether the processor has path k (has[0] true): the best it has, or, with
/// the environment variable `name` set to one of the names (tests), that path where the processor
/// has it. Asked for a path it lacks, the best it has at or below the request (names[1] for
/// names[2], then plain code), with a warning on standard error naming the request and `what`
/// (e.g. "the fp16 conversions use") with the path taken:
///   [dos] warning: NAME=VALUE: this processor lacks it; WHAT PATH
/// A value that is none of the names gives the best path, with env_choice's warning. Returns the
/// path's position in names; reads the environment at each call (a caller keeps the answer).
inline int isa_choice(const char* name, const char* const names[3], const bool has[3], const char* what) {
  const int best = has[2] ? 2 : has[1] ? 1 : 0;
  const std::string instead = std::string(what) + " " + names[best];
  const int want = env_choice(name, {names[0], names[1], names[2]}, -1, instead.c_str());
  const int got = want == 0 ? 0 : has[2] && (want == -1 || want == 2) ? 2 : has[1] ? 1 : 0;
  if (want >= 0 && want != got)
    std::fprintf(stderr, "[dos] warning: %s=%s: this processor lacks it; %s %s\n", name, names[want], what, names[got]);
  return got;
}

}  // namespace dos::detail
