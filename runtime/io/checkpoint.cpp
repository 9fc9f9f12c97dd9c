// Checkpoints of the optimizer state (checkpoint.h): the folder's checks, its save and its load.
#include "checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "atomic_file.h"
#include "checksum.h"
#include "partition.h"
#include "safetensors.h"
#include "state_check.h"
#include "temp_cleanup.h"

namespace dos {
namespace {

constexpr const char* kFormat = "deep-optimizer-states checkpoint v1";
/// Elements per checksummed block of master, exp_avg and exp_avg_sq (4 MiB of fp32).
constexpr std::size_t kBlockElements = std::size_t(1) << 20;
/// The largest count a checkpoint may record (exact in a double).
constexpr std::uint64_t kMaxCount = std::uint64_t(1) << 53;
const char* const kStateTensors[3] = {"master", "exp_avg", "exp_avg_sq"};

std::string float_str(float v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.9g", double(v));
  return s;
}

/// A file name of a checkpoint folder: index.json, rank-RRRRR-of-WWWWW.safetensors, or either
/// followed by the temporary suffix .tmp.XXXXXX of a write that did not finish.
bool checkpoint_file_name(const std::string& name) {
  std::string base = name;
  const auto t = name.find(".tmp.");
  if (t != std::string::npos) {
    if (name.size() != t + 11) return false;
    base = name.substr(0, t);
  }
  if (base == "index.json") return true;
  if (base.size() != std::strlen("rank-00000-of-00000.safetensors")) return false;
  for (std::size_t k = 0; k < base.size(); ++k) {
    const char want = "rank-#####-of-#####.safetensors"[k];
    if (want == '#' ? !std::isdigit((unsigned char)base[k]) : base[k] != want) return false;
  }
  return true;
}

/// Why the folder `dir` is not one of our checkpoints (a file of another kind in it, or an
/// index.json of another format); "" when it is one, or empty.
std::string foreign_content(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return std::string("it cannot be listed (") + std::strerror(errno) + ")";
  std::vector<std::string> names;
  while (const struct dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    struct stat st;
    if (!checkpoint_file_name(n) || ::lstat((dir + "/" + n).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return "it holds '" + n + "'" + (names.size() > 1 ? " (and " + std::to_string(names.size() - 1) + " more)" : "") +
             ", which is not part of a checkpoint";
  }
  if (std::find(names.begin(), names.end(), "index.json") != names.end()) {
    std::ifstream f(dir + "/index.json");
    std::string format;
    try {
      const nlohmann::json j = nlohmann::json::parse(f);
      format = j.at("format").get<std::string>();
    } catch (const std::exception&) {
    }
    if (format != kFormat) return "its index.json is not a checkpoint index of this program";
  }
  return std::string();
}

/// `j[key]` as a whole number in [lo, hi]; throws std::runtime_error quoting the value as written.
std::uint64_t json_count(const nlohmann::json& j, const char* key, std::uint64_t lo, std::uint64_t hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() < lo || v.get<std::uint64_t>() > hi)
    throw std::runtime_error("field '" + std::string(key) + "' must be a whole number in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + v.dump());
  return v.get<std::uint64_t>();
}

/// `dir` without trailing slashes ("ck/" -> "ck"), so that "DIR.tmp-..." lands beside it.
std::string without_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string rank_file(std::size_t rank, std::size_t world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05zu-of-%05zu.safetensors", rank, world);
  return name;
}

/// The index: the job's fields and the ranks' ranges and files ("ranks"): every rank's when the
/// whole job saved together (all_ranks), else this one's (a lone shard run with --shard R/W). The
/// top-level begin, end and rank are the first entry's, as a one-rank checkpoint has them.
nlohmann::ordered_json to_json(const CheckpointInfo& i, bool all_ranks) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array(), files = nlohmann::ordered_json::array();
  for (std::size_t r = all_ranks ? 0 : i.rank; r < (all_ranks ? i.world : i.rank + 1); ++r) {
    const ShardRange s = all_ranks ? shard_range(i.params_total, r, i.world) : ShardRange{i.begin, i.end};
    ranks.push_back({{"rank", r}, {"begin", s.begin}, {"end", s.end}, {"file", rank_file(r, i.world)}});
    files.push_back(rank_file(r, i.world));
  }
  return {{"format", kFormat},       {"model", i.model}, {"architecture", i.architecture},
          {"params_total", i.params_total}, {"begin", ranks[0]["begin"]},
          {"end", ranks[0]["end"]},  {"rank", ranks[0]["rank"]}, {"world", i.world},       {"subgroup_size", i.subgroup_size},
          {"dtype", i.dtype},        {"iteration", i.iteration}, {"seed", i.seed},
          {"grad_parts", i.grad_parts}, {"optimizer", i.optimizer}, {"step_hyper", i.step_hyper},
          {"files", files}, {"ranks", ranks}};
}

std::string describe(const CheckpointInfo& i) {
  return "model " + i.model + " (" + (i.architecture.empty() ? "" : i.architecture + ", ") +
         std::to_string(i.params_total) + " parameters), subgroups of " +
         std::to_string(i.subgroup_size) + ", " + i.dtype + ", seed " + std::to_string(i.seed) +
         ", gradients summed over " + std::to_string(i.grad_parts) + (i.grad_parts == 1 ? " part" : " parts");
}

}  // namespace

std::string moment_hyper_text(const AdamHyper& h) {
  char t[160];
  if (h.decoupled)
    std::snprintf(t, sizeof t, "adamw beta1=%.17g beta2=%.17g", h.beta1, h.beta2);
  else
    std::snprintf(t, sizeof t, "adam beta1=%.17g beta2=%.17g weight_decay=%.17g", h.beta1, h.beta2, h.weight_decay);
  return t;
}

std::string step_hyper_text(const AdamHyper& h) {
  char t[160];
  if (h.decoupled)
    std::snprintf(t, sizeof t, "lr=%.17g eps=%.17g weight_decay=%.17g", h.lr, h.eps, h.weight_decay);
  else
    std::snprintf(t, sizeof t, "lr=%.17g eps=%.17g", h.lr, h.eps);
  return t;
}

void check_checkpoint_dir(const std::string& dir_given) {
  if (dir_given.empty()) throw Error("the checkpoint folder name is empty");
  const std::string dir = without_trailing_slashes(dir_given);
  try {
    check_parent_writable(dir, "the checkpoint " + dir);
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
  const auto slash = dir.find_last_of('/');
  const std::string last = slash == std::string::npos ? dir : dir.substr(slash + 1);
  if (last == "." || last == ".." || dir == "/")
    throw Error("will not write the checkpoint at " + dir_given + ": saving replaces the whole folder, and " + dir_given +
                " names " + (dir == "/" ? "the root folder" : last == "." ? "a folder through '.' (the current one?)" : "a parent folder through '..'") +
                ": give the checkpoint a folder of its own (e.g. " + (dir == "/" ? std::string("/ckpt") : dir + "/ckpt") + ")");
  struct stat st;
  if (::lstat(dir.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const std::filesystem::path target = std::filesystem::canonical(dir, ec);
      throw Error("will not write the checkpoint at " + dir + ": it is a symbolic link" +
                  (ec ? std::string(" (to nothing that exists)") : " to " + target.string()) +
                  ", and saving replaces the folder by renaming a new one into its place, which would replace the "
                  "link itself: give the folder the link points to" +
                  (ec ? std::string() : " (" + target.string() + ")"));
    }
    if (!S_ISDIR(st.st_mode)) throw Error("cannot write the checkpoint " + dir + ": it exists and is not a folder");
    const std::string why = foreign_content(dir);
    if (!why.empty())
      throw Error("will not write the checkpoint into " + dir + ": " + why +
                  "; saving replaces the whole folder, which would delete it: give a new or empty folder, or the folder "
                  "of a previous checkpoint");
  }
}

namespace {

/// This rank's file of the checkpoint, into folder `tmp`: the state streamed from the optimizer's
/// own host buffers, subgroup by subgroup (no second copy of it in memory).
void write_rank_file(const std::string& tmp, const Optimizer& opt, const CheckpointInfo& info) {
  const std::size_t n = opt.num_params();
  const std::vector<std::int64_t> steps = opt.step_counts();
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < opt.num_subgroups(); ++i) sizes.push_back(std::int64_t(opt.subgroup_size(i)));
  const std::int64_t ns = std::int64_t(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i] < 0 || steps[i] > info.iteration)
      throw Error("will not save the checkpoint: subgroup " + std::to_string(i) + " has taken " +
                  std::to_string(steps[i]) + " Adam step(s), outside [0, " + std::to_string(info.iteration) +
                  "] (the iterations done); the previous checkpoint is left in place");
  opt.with_host_state([&](const std::vector<Optimizer::HostState>& state) {
    using Pieces = std::vector<std::pair<const void*, std::size_t>>;
    Pieces pieces[3];
    std::size_t at = info.begin;  // the first element of the subgroup, in the whole model
    for (const Optimizer::HostState& sg : state) {
      const float* arrays[3] = {sg.master, sg.exp_avg, sg.exp_avg_sq};
      for (int t = 0; t < 3; ++t) {
        // a diverged run is reported, not saved: its checkpoint would not resume
        const std::size_t bad = first_bad_state_value(arrays[t], sg.size, t == 2);
        if (bad < sg.size)
          throw Error("will not save the checkpoint: element " + std::to_string(at + bad) + " of " + kStateTensors[t] +
                      " is " + float_str(arrays[t][bad]) + " (the run diverged: lower --lr or --weight-decay, or "
                      "resume from an earlier checkpoint); the previous checkpoint is left in place");
        pieces[t].emplace_back(arrays[t], sg.size * 4);
      }
      at += sg.size;
    }
    std::vector<std::uint64_t> sums[3];
    std::vector<SafetensorOut> out;
    for (int t = 0; t < 3; ++t) out.push_back({kStateTensors[t], "F32", {std::int64_t(n)}, nullptr, n * 4, pieces[t]});
    out.push_back({"step", "I64", {ns}, steps.data(), steps.size() * 8});
    out.push_back({"subgroup_sizes", "I64", {ns}, sizes.data(), sizes.size() * 8});
    for (int t = 0; t < 3; ++t) {
      sums[t] = block_checksums(pieces[t], kBlockElements * 4);
      out.push_back({std::string(kStateTensors[t]) + ".xxh3", "U64", {std::int64_t(sums[t].size())}, sums[t].data(),
                     sums[t].size() * 8});
    }
    write_safetensors(tmp + "/" + rank_file(info.rank, info.world), out,
                      {{"format", kFormat},
                       {"begin", std::to_string(info.begin)},
                       {"end", std::to_string(info.end)},
                       {"checksum", kChecksumName},
                       {"checksum_block_elements", std::to_string(kBlockElements)},
                       {"step.xxh3", checksum_hex(checksum(steps.data(), steps.size() * 8))},
                       {"subgroup_sizes.xxh3", checksum_hex(checksum(sizes.data(), sizes.size() * 8))}});
  });
}

/// A new empty folder named prefix + 6 random letters and digits (a fresh name even where process
/// ids repeat, as in containers), made by mkdir(2) with mode 0777 so that it gets exactly the
/// permissions (umask, default ACLs) of any folder the user makes; "" with errno set when it cannot
/// be made.
std::string make_fresh_dir(const std::string& prefix) {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = prefix;
    for (int k = 0; k < 6; ++k) name += kChars[rd() % (sizeof kChars - 1)];
    if (::mkdir(name.c_str(), 0777) == 0) return name;
    if (errno != EEXIST) return std::string();
  }
  errno = EEXIST;
  return std::string();
}

/// Removes `path` and everything in it; a warning on standard error when some of it stays.
void remove_tree(const std::string& path, const char* what) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec)
    std::fprintf(stderr, "[dos] warning: could not remove %s %s: %s (remove it by hand)\n", what, path.c_str(),
                 ec.message().c_str());
}

/// The swap of the new checkpoint folder `tmp` in at `dir`. Where `dir` exists, the two are
/// exchanged at once (renameat2 RENAME_EXCHANGE: there is never a moment without a checkpoint at
/// `dir`) and the previous one, now at `tmp`, removed; where the filesystem cannot exchange, the
/// previous one goes aside into a fresh DIR.old-XXXXXX first. Throws Error when a step fails, with
/// `tmp` removed and the previous checkpoint in place (or, if even that fails, the message says
/// where it is).
void swap_in(const std::string& tmp, const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      remove_tree(tmp, "the new checkpoint's temporary folder");
      throw Error("cannot put the checkpoint in place at " + dir + ": " + why);
    }
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree(tmp, "the previous checkpoint");
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    const std::string why = std::strerror(errno);
    remove_tree(tmp, "the new checkpoint's temporary folder");
    throw Error("cannot put the checkpoint in place at " + dir + ": " + why);
  }
  const std::string old = make_fresh_dir(dir + ".old-");
  // rename(2) replaces an empty folder: the previous checkpoint takes the fresh name
  if (old.empty() || ::rename(dir.c_str(), old.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (!old.empty()) ::rmdir(old.c_str());
    remove_tree(tmp, "the new checkpoint's temporary folder");
    throw Error("cannot move the previous checkpoint " + dir + " aside: " + why);
  }
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    remove_tree(tmp, "the new checkpoint's temporary folder");
    std::string restore;
    if (::rename(old.c_str(), dir.c_str()) != 0)
      restore = "; the previous checkpoint could not be put back and is in " + old + " (" + std::strerror(errno) + ")";
    throw Error("cannot put the checkpoint in place at " + dir + ": " + why + restore);
  }
  remove_tree(old, "the previous checkpoint");
}

/// Removes the DIR.tmp-XXXXXX folders beside `dir` that saves killed before they finished left
/// (folders that hold only checkpoint files, last changed before `before`), naming each.
void remove_stale_temporaries(const std::string& dir, const struct timespec& before) {
  const auto slash = dir.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
  const std::string prefix = (slash == std::string::npos ? dir : dir.substr(slash + 1)) + ".tmp-";
  std::vector<std::string> stale;
  if (DIR* d = ::opendir(parent.c_str())) {
    while (const struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string full = parent + "/" + name;
      struct stat st;
      if (::lstat(full.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      const bool older = st.st_mtim.tv_sec < before.tv_sec ||
                         (st.st_mtim.tv_sec == before.tv_sec && st.st_mtim.tv_nsec < before.tv_nsec);
      if (older && foreign_content(full).empty()) stale.push_back(full);
    }
    ::closedir(d);
  }
  for (const std::string& f : stale) {
    remove_tree(f, "the temporary folder of an interrupted save");
    std::fprintf(stderr, "[dos] removed %s, the temporary folder of an earlier save of %s that did not finish\n",
                 f.c_str(), dir.c_str());
  }
}

/// Throws Error when a number of `info` is out of the ranges CheckpointInfo states.
void check_info(const CheckpointInfo& info) {
  auto out_of = [](const char* what, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
    if (v < lo || v > hi)
      throw Error("will not save the checkpoint: " + std::string(what) + " " + std::to_string(v) + " is outside [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  out_of("params_total", info.params_total, 1, kMaxCount);
  out_of("subgroup_size", info.subgroup_size, 1, kMaxCount);
  out_of("world", info.world, 1, std::uint64_t(1) << 20);
  out_of("rank", info.rank, 0, info.world - 1);
  out_of("grad_parts", info.grad_parts, 1, 2048);
  if (info.iteration < 0 || std::uint64_t(info.iteration) > kMaxCount)
    throw Error("will not save the checkpoint: iteration " + std::to_string(info.iteration) + " is outside [0, 2^53]");
  if (info.begin >= info.end || info.end > info.params_total)
    throw Error("will not save the checkpoint: range [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                ") is not inside the model's " + std::to_string(info.params_total) + " parameters");
}

void write_index(const std::string& tmp, const CheckpointInfo& info, bool all_ranks) {
  const std::string index = to_json(info, all_ranks).dump(2) + "\n";
  write_file_atomically(tmp + "/index.json", {{index.data(), index.size()}});
}

}  // namespace

void save_checkpoint(const std::string& dir_given, const Optimizer& opt, const CheckpointInfo& info,
                     const CheckpointRanks* ranks) {
  const std::string dir = without_trailing_slashes(dir_given);
  check_checkpoint_dir(dir);
  check_info(info);
  struct timespec started;
  ::clock_gettime(CLOCK_REALTIME, &started);
  if (info.world > 1 && ranks) {
    // every rank writes into rank 0's new folder (mkdtemp: a fresh name even where process ids
    // repeat); its 6-character suffix travels packed in an integer, -1 when rank 0 failed
    std::string why;
    long long packed = -1;
    if (info.rank == 0) {
      const std::string made = make_fresh_dir(dir + ".tmp-");
      if (!made.empty()) {
        packed = 0;
        for (std::size_t k = made.size() - 6; k < made.size(); ++k) packed = (packed << 8) | (unsigned char)made[k];
      } else {
        why = "cannot create a folder next to " + dir + ": " + std::strerror(errno);
      }
    }
    packed = ranks->from_rank0(packed);  // every rank sees rank 0's failure (-1) and stops here
    if (packed < 0) throw Error(why.empty() ? "rank 0 could not create the new checkpoint folder next to " + dir : why);
    std::string suffix(6, ' ');
    for (std::size_t k = 0; k < 6; ++k) suffix[5 - k] = char((packed >> (8 * k)) & 0xff);
    const std::string tmp = dir + ".tmp-" + suffix;
    TempPathGuard guard(tmp, true);  // a SIGINT or SIGTERM removes it
    try {
      write_rank_file(tmp, opt, info);
    } catch (const std::exception& e) {
      why = std::string("rank ") + std::to_string(info.rank) + " cannot write its checkpoint file: " + e.what();
    }
    const bool written = ranks->all_ok(why.empty());
    if (written && info.rank == 0) {
      try {
        write_index(tmp, info, true);
        swap_in(tmp, dir);
        remove_stale_temporaries(dir, started);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (info.rank == 0 && (!written || !why.empty()))  // nothing half-written stays behind
      remove_tree(tmp, "the failed save's temporary folder");
    if (!ranks->all_ok(why.empty()))
      throw Error(why.empty() ? "another rank failed to write the checkpoint " + dir + " (see its message); the "
                                "previous checkpoint is left in place"
                              : "cannot write the checkpoint: " + why);
    return;
  }
  const std::string tmp = make_fresh_dir(dir + ".tmp-");
  if (tmp.empty()) throw Error("cannot create a folder next to " + dir + ": " + std::strerror(errno));
  TempPathGuard guard(tmp, true);  // a SIGINT or SIGTERM removes it
  try {
    write_rank_file(tmp, opt, info);
    write_index(tmp, info, false);
  } catch (const std::exception& e) {
    remove_tree(tmp, "the failed save's temporary folder");
    throw Error(std::string("cannot write the checkpoint: ") + e.what());
  }
  swap_in(tmp, dir);
  guard.release();
  remove_stale_temporaries(dir, started);
}

namespace {

std::string range_str(std::size_t begin, std::size_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

/// One entry of the index's "ranks": an old rank's flat element range and its file.
struct RankEntry {
  std::size_t begin, end;
  std::string file;
};

}  // namespace

CheckpointInfo load_checkpoint(const std::string& dir, Optimizer& opt, const CheckpointInfo& expect) {
  std::ifstream f(dir + "/index.json");
  if (!f) {
    const std::string why = std::strerror(errno);
    // a save killed at the wrong moment leaves its folders beside DIR: name those that are complete
    std::string found;
    std::error_code ec;
    const std::filesystem::path d = std::filesystem::path(without_trailing_slashes(dir));
    const std::string base = d.filename().string();
    for (const auto& e : std::filesystem::directory_iterator(d.has_parent_path() ? d.parent_path() : ".", ec)) {
      const std::string name = e.path().filename().string();
      if ((name.rfind(base + ".tmp-", 0) == 0 || name.rfind(base + ".old-", 0) == 0) &&
          std::filesystem::exists(e.path() / "index.json", ec))
        found += (found.empty() ? "" : ", ") + e.path().string();
    }
    throw Error("cannot resume: cannot read " + dir + "/index.json: " + why + " (is " + dir +
                " a checkpoint folder?)" +
                (found.empty() ? std::string() : "; complete checkpoint folders beside it, left by an interrupted save: " +
                                                     found + " (check one and rename it to " + dir + ")"));
  }
  CheckpointInfo got;
  std::vector<RankEntry> entries;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.at("format").get<std::string>() != kFormat) throw std::runtime_error("unknown format");
    got.model = j.at("model").get<std::string>();
    if (j.contains("architecture")) got.architecture = j.at("architecture").get<std::string>();
    got.params_total = json_count(j, "params_total", 1, kMaxCount);
    got.begin = json_count(j, "begin", 0, got.params_total);
    got.end = json_count(j, "end", 0, got.params_total);
    got.world = json_count(j, "world", 1, std::uint64_t(1) << 20);
    got.rank = json_count(j, "rank", 0, got.world - 1);
    got.subgroup_size = json_count(j, "subgroup_size", 1, kMaxCount);
    got.dtype = j.at("dtype").get<std::string>();
    got.iteration = std::int64_t(json_count(j, "iteration", 0, kMaxCount));
    got.seed = json_count(j, "seed", 0, UINT64_MAX);
    got.grad_parts = j.contains("grad_parts") ? json_count(j, "grad_parts", 1, 2048) : 1;  // absent before it was recorded
    if (j.contains("optimizer")) got.optimizer = j.at("optimizer").get<std::string>();  // absent before it was recorded
    if (j.contains("step_hyper")) got.step_hyper = j.at("step_hyper").get<std::string>();
    // the old ranks' ranges and files (older indexes: only the top-level one)
    for (const auto& r : j.contains("ranks") ? j.at("ranks") : nlohmann::json::array({j})) {
      if (r.contains("file") && !r.at("file").is_string()) throw std::runtime_error("a rank's 'file' must be a string");
      RankEntry e{json_count(r, "begin", 0, got.params_total), json_count(r, "end", 0, got.params_total),
                  r.contains("file") ? r.at("file").get<std::string>()
                                     : rank_file(json_count(r, "rank", 0, got.world - 1), got.world)};
      if (e.begin >= e.end || e.end > got.params_total)
        throw std::runtime_error("rank range " + range_str(e.begin, e.end) + " outside the model's " +
                                 std::to_string(got.params_total) + " parameters");
      if (e.file.empty() || e.file.find('/') != std::string::npos)
        throw std::runtime_error("bad rank file name '" + e.file + "'");
      entries.push_back(e);
    }
  } catch (const std::exception& e) {
    throw Error("cannot resume: " + dir + "/index.json is malformed: " + e.what());
  }
  if (got.model != expect.model || got.params_total != expect.params_total ||
      got.subgroup_size != expect.subgroup_size || got.dtype != expect.dtype || got.seed != expect.seed ||
      got.grad_parts != expect.grad_parts ||
      (!got.architecture.empty() && !expect.architecture.empty() && got.architecture != expect.architecture))
    throw Error("cannot resume: the checkpoint in " + dir + " is of " + describe(got) + "; this run is " +
                describe(expect) + ": resume with the same model, --subgroup-size, --dtype and --seed, and with the "
                "checkpoint's --grad-parts " + std::to_string(got.grad_parts) +
                " (any number of ranks can resume it with that)");
  if (!got.optimizer.empty() && !expect.optimizer.empty() && got.optimizer != expect.optimizer)
    throw Error("cannot resume: the checkpoint in " + dir + " was trained with " + got.optimizer + "; this run asks for " +
                expect.optimizer + ": resume with the same optimizer, betas (and for Adam weight decay), which made "
                "its exp_avg and exp_avg_sq (the learning rate, eps and AdamW's weight decay may change)");

  // This rank's elements [lo, hi) come from the old ranks whose ranges cover them: pieces of
  // (entry, lo, hi), in order, covering [expect.begin, expect.end) exactly.
  const std::size_t n = opt.num_params(), ns = opt.num_subgroups();
  if (expect.end - expect.begin != n)
    throw Error("cannot resume: this rank's range " + range_str(expect.begin, expect.end) + " does not hold its " +
                std::to_string(n) + " parameters");
  std::sort(entries.begin(), entries.end(), [](const RankEntry& a, const RankEntry& b) { return a.begin < b.begin; });
  struct Piece {
    const RankEntry* entry;
    std::size_t lo, hi;
  };
  std::vector<Piece> pieces;
  std::size_t cursor = expect.begin;
  for (const RankEntry& e : entries) {
    if (e.end <= cursor) continue;
    if (cursor >= expect.end || e.begin > cursor) break;
    pieces.push_back({&e, cursor, std::min(e.end, expect.end)});
    cursor = pieces.back().hi;
  }
  if (cursor < expect.end) {
    std::size_t gap_end = expect.end;
    for (const RankEntry& e : entries)
      if (e.begin > cursor) gap_end = std::min(gap_end, e.begin);
    throw Error("cannot resume: the checkpoint in " + dir + " (saved by " + std::to_string(got.world) +
                " rank(s); its index lists " + std::to_string(entries.size()) + ") has no state for elements " +
                range_str(cursor, gap_end) + " of this rank's range " + range_str(expect.begin, expect.end) +
                " (a lone --shard run saves only its own range: resume it with the same --shard)");
  }

  // This rank's subgroups: consecutive from expect.begin; starts[i] is subgroup i's first element.
  std::vector<std::size_t> starts(ns + 1, expect.begin);
  for (std::size_t i = 0; i < ns; ++i) starts[i + 1] = starts[i] + opt.subgroup_size(i);
  if (starts[ns] != expect.end)
    throw Error("cannot resume: this rank's subgroups do not cover its range " + range_str(expect.begin, expect.end));

  // Pass 1: every file checked and the step counts mapped (small reads only); nothing is loaded
  // into the optimizer unless all of it is right.
  std::vector<std::int64_t> steps(ns);
  std::vector<std::size_t> step_from(ns), step_to(ns);  // elements the subgroup's step was taken from
  std::vector<bool> have(ns, false);
  std::vector<std::vector<std::uint64_t>> identities;  // pass 2 must read the files pass 1 checked
  // each piece's file's block checksums of master, exp_avg, exp_avg_sq (none: saved before they were)
  struct Sums {
    std::size_t block = kBlockElements;
    bool present = false;
    std::vector<std::uint64_t> blocks[3];
  };
  std::vector<Sums> sums(pieces.size());
  for (std::size_t pk = 0; pk < pieces.size(); ++pk) {  // one old file at a time
    const Piece& p = pieces[pk];
    const std::string path = dir + "/" + p.entry->file;
    const std::size_t count = p.entry->end - p.entry->begin;
    std::vector<std::uint8_t> step_bytes, size_bytes;
    std::size_t old_ns = 0;
    try {
      const SafetensorsReader file(path);  // only this rank's elements are read (pread)
      identities.push_back(file.identity());
      auto need = [&](const char* name, const char* dtype, std::size_t elems, std::size_t esz) {
        auto it = file.tensors().find(name);
        if (it == file.tensors().end() || it->second.dtype != dtype || it->second.end - it->second.begin != elems * esz)
          throw Error(std::string("cannot resume: tensor '") + name + "' of " + path +
                      " is missing or of the wrong size (its index entry says elements " +
                      range_str(p.entry->begin, p.entry->end) + ")");
      };
      // the file says which elements it holds: an index that lies, or files swapped, are refused
      const auto& meta = file.metadata();
      const auto b = meta.find("begin"), e = meta.find("end");
      if (b != meta.end() && e != meta.end() &&
          (b->second != std::to_string(p.entry->begin) || e->second != std::to_string(p.entry->end)))
        throw Error("cannot resume: " + path + " holds elements [" + b->second + ", " + e->second +
                    ") but the index of " + dir + " says " + range_str(p.entry->begin, p.entry->end) +
                    " (files renamed or swapped?)");
      need("master", "F32", count, 4);
      need("exp_avg", "F32", count, 4);
      need("exp_avg_sq", "F32", count, 4);
      const auto st = file.tensors().find("step");
      old_ns = st == file.tensors().end() ? 0 : (st->second.end - st->second.begin) / 8;
      need("step", "I64", old_ns, 8);
      need("subgroup_sizes", "I64", old_ns, 8);
      step_bytes.resize(old_ns * 8);
      size_bytes.resize(old_ns * 8);
      file.read("step", 0, step_bytes.data(), step_bytes.size());
      file.read("subgroup_sizes", 0, size_bytes.data(), size_bytes.size());
      const auto kind = meta.find("checksum");
      if (kind == meta.end()) {
        std::fprintf(stderr, "[dos] warning: %s holds no checksums (saved by an older version): its data cannot be "
                     "verified, only their values are checked\n", path.c_str());
      } else {
        if (kind->second != kChecksumName)
          throw Error("cannot resume: " + path + " records checksums of kind '" + kind->second + "'; this program "
                      "knows " + kChecksumName);
        Sums& sm = sums[pk];
        sm.present = true;
        const auto blk = meta.find("checksum_block_elements");
        char* endp = nullptr;
        const unsigned long long b = blk == meta.end() ? 0 : std::strtoull(blk->second.c_str(), &endp, 10);
        if (blk == meta.end() || blk->second.empty() || *endp || b < 1 || b > (1ull << 30))
          throw Error("cannot resume: " + path + ": metadata checksum_block_elements must be a whole number in [1, "
                      "2^30]" + (blk == meta.end() ? std::string(", and is missing") : ", got '" + blk->second + "'"));
        sm.block = std::size_t(b);
        for (int t = 0; t < 3; ++t) {
          const std::string name = std::string(kStateTensors[t]) + ".xxh3";
          const std::size_t nb = (count + sm.block - 1) / sm.block;
          need(name.c_str(), "U64", nb, 8);
          sm.blocks[t].resize(nb);
          file.read(name, 0, sm.blocks[t].data(), nb * 8);
        }
        for (const auto& [name, bytes] : {std::make_pair("step", &step_bytes), std::make_pair("subgroup_sizes", &size_bytes)}) {
          const auto want = meta.find(std::string(name) + ".xxh3");
          const std::string got_sum = checksum_hex(checksum(bytes->data(), bytes->size()));
          if (want == meta.end() || want->second != got_sum)
            throw Error("cannot resume: " + path + ": tensor '" + name + "' fails its checksum (recorded " +
                        (want == meta.end() ? std::string("none") : want->second) + ", computed " + got_sum +
                        "): the file is damaged; resume from another checkpoint");
        }
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(std::string("cannot resume: ") + e.what());
    }
    // every old subgroup overlapping [lo, hi) gives its step to the new subgroups it overlaps, which
    // must not get two different ones
    const std::string bad_sizes =
        "cannot resume: the subgroup sizes in " + path + " do not add up to its " + std::to_string(count) + " elements";
    std::size_t ob = p.entry->begin;
    for (std::size_t k = 0; k < old_ns; ++k) {
      std::int64_t size, step;
      std::memcpy(&size, size_bytes.data() + k * 8, 8);
      std::memcpy(&step, step_bytes.data() + k * 8, 8);
      if (size <= 0 || std::size_t(size) > p.entry->end - ob) throw Error(bad_sizes);
      if (step < 0 || step > got.iteration)
        throw Error("cannot resume: " + path + ": tensor 'step': subgroup " + std::to_string(k) + " has taken " +
                    std::to_string(step) + " Adam step(s), outside [0, " + std::to_string(got.iteration) +
                    "] (the iterations its index.json records): the checkpoint is damaged");
      const std::size_t oe = ob + std::size_t(size), lo = std::max(ob, p.lo), hi = std::min(oe, p.hi);
      for (std::size_t i = std::size_t(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin()) - 1;
           lo < hi && i < ns && starts[i] < hi; ++i) {
        const std::size_t a = std::max(lo, starts[i]), b = std::min(hi, starts[i + 1]);
        if (!have[i]) {
          have[i] = true, steps[i] = step, step_from[i] = a, step_to[i] = b;
        } else if (steps[i] != step) {
          throw Error("cannot resume: in the checkpoint in " + dir + ", elements " + range_str(step_from[i], step_to[i]) +
                      " have taken " + std::to_string(steps[i]) + " Adam step(s) and elements " + range_str(a, b) +
                      " " + std::to_string(step) + ", but this job's subgroup " + range_str(starts[i], starts[i + 1]) +
                      " would hold both (a subgroup has one step count): resume with the " +
                      std::to_string(got.world) + " rank(s) that saved it");
        }
      }
      ob = oe;
    }
    if (ob != p.entry->end) throw Error(bad_sizes);
  }
  // Pass 2: each file's elements of this rank read straight into the optimizer's host buffers
  // (pread, subgroup by subgroup: no second copy of the state in memory).
  // Each block of the old file that holds elements of this rank is read whole, its checksum and its
  // values checked, and this rank's elements of it copied into the subgroups they belong to.
  opt.load_state_in_place(steps, [&](const std::vector<Optimizer::HostStateOut>& state) {
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      const Sums& sm = sums[k];
      const std::string path = dir + "/" + p.entry->file;
      try {
        const SafetensorsReader file(path);
        if (file.identity() != identities[k])
          throw std::runtime_error(path + " changed while it was being read (another job saving into " + dir + "?)");
        const std::size_t count = p.entry->end - p.entry->begin;
        const std::size_t first = p.lo - p.entry->begin, last = p.hi - p.entry->begin;  // in the old file
        std::vector<float> block(std::min(sm.block, count));
        for (int t = 0; t < 3; ++t) {
          for (std::size_t b0 = first / sm.block * sm.block; b0 < last; b0 += sm.block) {
            const std::size_t b1 = std::min(b0 + sm.block, count);
            file.read(kStateTensors[t], std::uint64_t(b0) * 4, block.data(), (b1 - b0) * 4);
            const std::string where = path + ": tensor '" + kStateTensors[t] + "', elements " + range_str(b0, b1);
            if (sm.present) {
              const std::uint64_t h = checksum(block.data(), (b1 - b0) * 4);
              if (h != sm.blocks[t][b0 / sm.block])
                throw std::runtime_error(where + " fail their checksum (recorded " +
                                         checksum_hex(sm.blocks[t][b0 / sm.block]) + ", computed " + checksum_hex(h) +
                                         "): the file is damaged; resume from another checkpoint");
            }
            const std::size_t lo = std::max(b0, first), hi = std::min(b1, last);  // this rank's part
            const std::size_t bad = first_bad_state_value(block.data() + (lo - b0), hi - lo, t == 2);
            if (bad < hi - lo)
              throw std::runtime_error(path + ": tensor '" + kStateTensors[t] + "': element " +
                                       std::to_string(lo + bad) + " is " + float_str(block[lo - b0 + bad]) + " (" +
                                       (t == 2 ? "exp_avg_sq must be finite and >= 0" : "must be finite") +
                                       "): the checkpoint is damaged or its run diverged");
            // copy [lo, hi) (old file's numbering) into this rank's subgroups
            const std::size_t glo = p.entry->begin + lo, ghi = p.entry->begin + hi;
            for (std::size_t i = std::size_t(std::upper_bound(starts.begin(), starts.end(), glo) - starts.begin()) - 1;
                 i < ns && starts[i] < ghi; ++i) {
              const std::size_t a = std::max(glo, starts[i]), b = std::min(ghi, starts[i + 1]);
              float* dst[3] = {state[i].master, state[i].exp_avg, state[i].exp_avg_sq};
              std::memcpy(dst[t] + (a - starts[i]), block.data() + (a - p.entry->begin - b0), (b - a) * 4);
            }
          }
        }
      } catch (const std::exception& e) {
        throw Error(std::string("cannot resume: ") + e.what() + " (the optimizer's state is now incomplete: stop)");
      }
    }
  });
  return got;
}

}  // namespace dos
