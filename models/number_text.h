// Numbers in messages and in what callers type: the fewest decimal digits that give a double back,
// and whether a text is a plain decimal number.
//
// Contract: header only, no state; used where an error message names a value a caller gave, so
// that a value just beside a bound (1e-9 below 0, a bit below 1/16) is not printed as the bound
// itself (std::to_string prints -1e-9 as -0.000000). Neither function reads the C locale: '.' is
// the decimal point whatever LC_NUMERIC says (a process embedding the library, such as Python
// after locale.setlocale(locale.LC_ALL, ""), may have set one whose point is ',').
#pragma once

#include <charconv>
#include <string>
#include <system_error>

namespace dos {

/// `x` in the fewest significant digits, 6 to 17, that read back as `x` exactly, written as
/// printf's "%.*g" does in the C locale (0.0625, -1e-09, 0.06249999999999999 for the double just
/// below 1/16); "nan", "-nan", "inf" or "-inf" for those. Throws nothing but std::bad_alloc.
inline std::string shortest_text(double x) {
  char text[40];
  std::size_t n = 0;
  for (int digits = 6; digits <= 17; ++digits) {
    n = std::size_t(std::to_chars(text, text + sizeof text, x, std::chars_format::general, digits).ptr - text);
    double back = 0;
    if (std::from_chars(text, text + n, back).ec == std::errc() && back == x) break;
  }
  return std::string(text, n);
}

/// Whether `s` is a decimal number as a person writes one, all of it: an optional sign, digits
/// with at most one '.' (at least one digit), and an optional exponent (e or E, an optional sign,
/// digits): "0.5", "-1e-9", ".25", "3.", "1E+8". Refused where strtod would read something: blanks
/// before or after, hexadecimal ("0x1p-1"), "inf", "nan", an empty string. Throws nothing.
inline bool is_decimal_number(const std::string& s) {
  std::size_t i = 0, digits = 0;
  const auto is_digit = [&](std::size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  while (is_digit(i)) ++i, ++digits;
  if (i < s.size() && s[i] == '.') ++i;
  while (is_digit(i)) ++i, ++digits;
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!is_digit(i)) return false;
    while (is_digit(i)) ++i;
  }
  return i == s.size();
}

/// Reads `s` into *v when it is a decimal number (is_decimal_number) that a double holds, rounded
/// to the nearest double as strtod rounds it: false, *v untouched, when it is not one or when it
/// lies beyond a double's range either way (1e400; 1e-400, which would read as 0; a subnormal
/// such as 1e-310 is read). '.' is the
/// decimal point under every locale (std::from_chars). Throws nothing.
inline bool parse_decimal(const std::string& s, double* v) {
  if (!is_decimal_number(s)) return false;
  const char* first = s.data() + (s[0] == '+' ? 1 : 0);  // from_chars takes '-' but not '+'
  const char* last = s.data() + s.size();
  double x = 0;
  const auto [end, ec] = std::from_chars(first, last, x);
  if (ec != std::errc() || end != last) return false;
  *v = x;
  return true;
}

}  // namespace dos
