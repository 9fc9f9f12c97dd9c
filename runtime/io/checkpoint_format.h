// What a checkpoint's save (checkpoint.cpp) and load (checkpoint_load.cpp) share: the index's
// format, the state tensors' names and checksum blocks, and small formatting helpers. Internal to
// the library (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "checkpoint.h"

namespace dos::checkpoint_io {

inline constexpr const char* kFormat = "deep-optimizer-states checkpoint v1";
/// Elements per checksummed block of master, exp_avg and exp_avg_sq (4 MiB of fp32).
inline constexpr std::size_t kBlockElements = std::size_t(1) << 20;
/// The largest count a checkpoint may record (exact in a double).
inline constexpr std::uint64_t kMaxCount = std::uint64_t(1) << 53;
inline constexpr const char* kStateTensors[3] = {"master", "exp_avg", "exp_avg_sq"};

/// `v` with 9 significant digits (an fp32 value as written in messages).
inline std::string float_str(float v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.9g", double(v));
  return s;
}

/// `j[key]` as a whole number in [lo, hi]; throws std::runtime_error quoting the value as written.
inline std::uint64_t json_count(const nlohmann::json& j, const char* key, std::uint64_t lo, std::uint64_t hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() < lo || v.get<std::uint64_t>() > hi)
    throw std::runtime_error("field '" + std::string(key) + "' must be a whole number in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + v.dump());
  return v.get<std::uint64_t>();
}

/// `dir` without trailing slashes ("ck/" -> "ck"), so that "DIR.tmp-..." lands beside it.
inline std::string without_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

/// The file name of rank `rank` of `world` in a checkpoint folder: rank-RRRRR-of-WWWWW.safetensors.
inline std::string rank_file(std::size_t rank, std::size_t world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05zu-of-%05zu.safetensors", rank, world);
  return name;
}

/// The job a checkpoint (or a run) is of, for messages: model, parameters, subgroups, dtype, seed,
/// gradient parts.
inline std::string describe(const CheckpointInfo& i) {
  return "model " + i.model + " (" + (i.architecture.empty() ? "" : i.architecture + ", ") +
         std::to_string(i.params_total) + " parameters), subgroups of " +
         std::to_string(i.subgroup_size) + ", " + i.dtype + ", seed " + std::to_string(i.seed) +
         ", gradients summed over " + std::to_string(i.grad_parts) + (i.grad_parts == 1 ? " part" : " parts");
}

}  // namespace dos::checkpoint_io
