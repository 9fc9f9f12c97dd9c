// st-compare A B [MAX_REL]: compares two safetensors files tensor by tensor (same names, dtypes,
// shapes). Without MAX_REL they must be bit-identical; with it, every fp32 element must satisfy
// |a - b| <= MAX_REL * max(|a|, |b|), and a NaN or inf matches only the same bits; tensors of other
// dtypes must be bit-identical either way. Prints the largest differences. Exit 0: equal / within
// tolerance; 1: different; 2: unreadable input.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: st-compare A.safetensors B.safetensors [MAX_REL]\n");
    return 2;
  }
  std::map<std::string, dos::SafetensorIn> a, b;
  try {
    a = dos::read_safetensors(argv[1]);
    b = dos::read_safetensors(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "st-compare: %s\n", e.what());
    return 2;
  }
  const bool exact = argc == 3;
  const double max_rel = exact ? 0.0 : std::atof(argv[3]);
  if (a.size() != b.size()) {
    std::printf("different tensor counts: %zu vs %zu\n", a.size(), b.size());
    return 1;
  }
  size_t n = 0, differing = 0, differing_other = 0;  // the latter: tensors other than F32 (compared bit for bit)
  double worst_abs = 0, worst_rel = 0;
  for (const auto& [name, ta] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.dtype != ta.dtype || it->second.shape != ta.shape ||
        it->second.data.size() != ta.data.size()) {
      std::printf("tensor %s: missing or of another dtype/shape in %s\n", name.c_str(), argv[2]);
      return 1;
    }
    if (ta.dtype != "F32") {
      if (ta.data != it->second.data) {
        ++differing_other;
        std::printf("tensor %s (%s): differs (tensors other than F32 must be bit-identical)\n", name.c_str(),
                    ta.dtype.c_str());
      }
      continue;
    }
    const size_t cnt = ta.data.size() / 4;
    for (size_t i = 0; i < cnt; ++i) {
      float x, y;
      std::memcpy(&x, ta.data.data() + 4 * i, 4);
      std::memcpy(&y, it->second.data.data() + 4 * i, 4);
      ++n;
      if (std::memcmp(&x, &y, 4) == 0) continue;
      ++differing;
      if (!std::isfinite(x) || !std::isfinite(y)) {  // a NaN or inf that the other file lacks: never within tolerance
        worst_abs = worst_rel = INFINITY;
        continue;
      }
      const double d = std::fabs(double(x) - double(y));
      const double rel = d / std::max(std::fabs(double(x)), std::fabs(double(y)));
      worst_abs = std::max(worst_abs, d);
      worst_rel = std::max(worst_rel, rel);
    }
  }
  std::printf("%zu elements, %zu differ; largest |a-b| %.3g, largest relative difference %.3g\n", n, differing,
              worst_abs, worst_rel);
  if (differing_other > 0) return 1;
  if (exact) return differing == 0 ? 0 : 1;
  return worst_rel <= max_rel ? 0 : 1;
}
