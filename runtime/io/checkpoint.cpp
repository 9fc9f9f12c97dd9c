// Checkpoints of the optimizer state (checkpoint.h): the folder's checks and its save (the load:
// checkpoint_load.cpp).
#include "checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "atomic_file.h"
#include "checkpoint_format.h"
#include "checksum.h"
#include "partition.h"
#include "safetensors.h"
#include "state_check.h"
#include "temp_cleanup.h"

namespace dos {
using namespace checkpoint_io;
namespace {



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




/// The index: the job's fields and the ranks' ranges and files ("ranks"): every rank's when the
/// whole job saved together (all_ranks), else this one's (a lone shard run with --shard R/W). The
/// top-level begin, end and rank are the first entry's, as a one-rank checkpoint has them; save_id:
/// the save's identity, as every rank file records it (save_id_of).
nlohmann::ordered_json to_json(const CheckpointInfo& i, bool all_ranks, const std::string& save_id) {
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
          {"save_id", save_id}, {"files", files}, {"ranks", ranks}};
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
    // the new folder takes the old one's mode (take_folder_attributes), and the old one's files must
    // be removed after the swap: a folder its owner may not write is the user's protection
    if ((st.st_mode & S_IWUSR) == 0 || ::access(dir.c_str(), W_OK) != 0)
      throw Error("will not write the checkpoint " + dir + ": the folder is write-protected (mode " +
                  [&] { char m[8]; std::snprintf(m, sizeof m, "%o", unsigned(st.st_mode & 07777)); return std::string(m); }() +
                  "); make it writable (chmod u+w) or give another folder");
    const std::string why = foreign_content(dir);
    if (!why.empty())
      throw Error("will not write the checkpoint into " + dir + ": " + why +
                  "; saving replaces the whole folder, which would delete it: give a new or empty folder, or the folder "
                  "of a previous checkpoint");
  }
}

namespace {

/// The save's identity, which its index and every rank file record, so that a rank file from
/// another save (copied in, or a job whose ranks resumed different checkpoints) is refused at load:
/// the random 6-character suffix of the save's temporary folder (DIR.tmp-XXXXXX), which every rank
/// writes into.
std::string save_id_of(const std::string& tmp) { return tmp.size() >= 6 ? tmp.substr(tmp.size() - 6) : tmp; }

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
                       {"save_id", save_id_of(tmp)},
                       {"iteration", std::to_string(info.iteration)},
                       {"checksum", kChecksumName},
                       {"checksum_block_elements", std::to_string(kBlockElements)},
                       {"step.xxh3", checksum_hex(checksum(steps.data(), steps.size() * 8))},
                       {"subgroup_sizes.xxh3", checksum_hex(checksum(sizes.data(), sizes.size() * 8))}});
  });
}

/// A new empty folder named prefix + 6 random letters and digits (make_fresh_path), made by mkdir(2)
/// with mode 0777 so that it gets exactly the permissions (umask, default ACLs) of any folder the
/// user makes; "" with errno set when it cannot be made. With `guard`, registered for removal on
/// SIGINT and SIGTERM before it is made (make_fresh_path), *guard holding the registration.
std::string make_fresh_dir(const std::string& prefix, TempPathGuard* guard = nullptr) {
  std::string name;
  const auto mk = [](const std::string& path) { return ::mkdir(path.c_str(), 0777); };
  return make_fresh_path(prefix, true, mk, &name, guard) == 0 ? name : std::string();
}

/// Gives the new checkpoint folder `tmp` the group and permission bits of the folder it will
/// replace at `dir` (a folder the user made for it, perhaps shared with a project's group and
/// setgid so that files made in it take that group): the group first, then the mode with the
/// owner's rwx added (the files are still to be written), so that the files written next inherit
/// the group as they would in `dir`. Nothing when `dir` is not a folder. A group the user may not
/// give (not a member) is named in a warning and the folder keeps its own. Returns the mode to
/// set once the files are written (finish_folder_attributes), 0 when there is none.
mode_t take_folder_attributes(const std::string& tmp, const std::string& dir) {
  struct stat want, got;
  if (::stat(dir.c_str(), &want) != 0 || !S_ISDIR(want.st_mode) || ::stat(tmp.c_str(), &got) != 0) return 0;
  if (want.st_gid != got.st_gid && ::chown(tmp.c_str(), (uid_t)-1, want.st_gid) != 0)
    std::fprintf(stderr, "[dos] warning: the checkpoint %s cannot keep its folder's group (%u): %s; it gets %u\n",
                 dir.c_str(), unsigned(want.st_gid), std::strerror(errno), unsigned(got.st_gid));
  const mode_t mode = want.st_mode & 07777;
  if (::chmod(tmp.c_str(), mode | S_IRWXU) != 0) return 0;
  return mode;
}

/// Sets `tmp`'s permission bits to `mode` (take_folder_attributes's) once its files are written;
/// nothing when mode is 0. A failure is named in a warning (the checkpoint itself is whole).
void finish_folder_attributes(const std::string& tmp, mode_t mode) {
  if (mode != 0 && ::chmod(tmp.c_str(), mode) != 0)
    std::fprintf(stderr, "[dos] warning: could not give the checkpoint folder mode %o: %s\n", unsigned(mode),
                 std::strerror(errno));
}

/// Removes `path` and everything in it; a warning on standard error when some of it stays.
/// Returns whether it is gone.
bool remove_tree(const std::string& path, const char* what) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec)
    std::fprintf(stderr, "[dos] warning: could not remove %s %s: %s (remove it by hand)\n", what, path.c_str(),
                 ec.message().c_str());
  return !ec;
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
/// (folders that hold only checkpoint files and no index.json, last changed before `before`),
/// naming each. One with an index.json is complete (a save killed between its index and its swap,
/// or a copy the user made under such a name): it is kept and named, never removed.
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
      if (!older || !foreign_content(full).empty()) continue;
      if (::access((full + "/index.json").c_str(), F_OK) == 0)
        std::fprintf(stderr, "[dos] note: %s holds a complete checkpoint (an earlier save of %s killed before its "
                     "swap, or a copy): kept; remove it when it is no longer needed\n", full.c_str(), dir.c_str());
      else
        stale.push_back(full);
    }
    ::closedir(d);
  }
  for (const std::string& f : stale)
    if (remove_tree(f, "the temporary folder of an interrupted save"))
      std::fprintf(stderr, "[dos] removed %s, the temporary folder of an earlier save of %s that did not finish\n",
                   f.c_str(), dir.c_str());
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
  const std::string index = to_json(info, all_ranks, save_id_of(tmp)).dump(2) + "\n";
  write_file_atomically(tmp + "/index.json", {{index.data(), index.size()}});
}

/// save_checkpoint's checks before any work, on this rank: the folder (check_checkpoint_dir), the
/// numbers of `info` (check_info), and that `info` describes `opt` (its range holds
/// opt.num_params() elements, its subgroup size and dtype are the optimizer's: else the
/// checkpoint could never be resumed). Throws Error naming the first failure.
void check_save(const std::string& dir, const Optimizer& opt, const CheckpointInfo& info) {
  check_checkpoint_dir(dir);
  check_info(info);
  {  // the job described must be this optimizer's: else the checkpoint could never be resumed
    const std::size_t n = info.end - info.begin, ns = opt.num_subgroups();
    if (n != opt.num_params())
      throw Error("will not save the checkpoint: its range [" + std::to_string(info.begin) + ", " +
                  std::to_string(info.end) + ") holds " + std::to_string(n) + " parameters, the optimizer " +
                  std::to_string(opt.num_params()) + "; describe this optimizer's shard (CheckpointInfo begin, end)");
    if (ns > 0 && (ns > 1 ? opt.subgroup_size(0) != info.subgroup_size : opt.subgroup_size(0) > info.subgroup_size))
      throw Error("will not save the checkpoint: CheckpointInfo says subgroups of " + std::to_string(info.subgroup_size) +
                  " elements, the optimizer's are of " + std::to_string(opt.subgroup_size(0)) +
                  ": give its OptimizerOptions::subgroup_size");
    if (info.dtype != dtype_name(opt.dtype()))
      throw Error("will not save the checkpoint: CheckpointInfo says dtype '" + info.dtype + "', the optimizer's is " +
                  dtype_name(opt.dtype()));
  }
}

}  // namespace

void save_checkpoint(const std::string& dir_given, const Optimizer& opt, const CheckpointInfo& info,
                     const CheckpointRanks* ranks) {
  const std::string dir = without_trailing_slashes(dir_given);
  std::string refused;  // this rank's refusal before any work: under a job, every rank must hear of it
  try {
    check_save(dir, opt, info);
  } catch (const std::exception& e) {
    refused = e.what();
  }
  if (info.world > 1 && ranks && !ranks->all_ok(refused.empty()))
    throw Error(refused.empty() ? "another rank refused to save the checkpoint " + dir + " (see its message); the "
                                  "previous checkpoint is left in place"
                                : refused);
  if (!refused.empty()) throw Error(refused);
  struct timespec started;
  ::clock_gettime(CLOCK_REALTIME, &started);
  if (info.world > 1 && ranks) {
    // every rank writes into rank 0's new folder (mkdtemp: a fresh name even where process ids
    // repeat); its 6-character suffix travels packed in an integer, -1 when rank 0 failed
    std::string why;
    long long packed = -1;
    mode_t folder_mode = 0;
    TempPathGuard made_guard;
    if (info.rank == 0) {
      const std::string made = make_fresh_dir(dir + ".tmp-", &made_guard);
      if (!made.empty()) {
        folder_mode = take_folder_attributes(made, dir);
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
    // a SIGINT or SIGTERM removes it (rank 0 registered it before making it)
    TempPathGuard guard = info.rank == 0 ? std::move(made_guard) : TempPathGuard(tmp, true);
    try {
      write_rank_file(tmp, opt, info);
    } catch (const std::exception& e) {
      why = std::string("rank ") + std::to_string(info.rank) + " cannot write its checkpoint file: " + e.what();
    }
    const bool written = ranks->all_ok(why.empty());
    if (written && info.rank == 0) {
      try {
        write_index(tmp, info, true);
        finish_folder_attributes(tmp, folder_mode);
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
  TempPathGuard guard;  // a SIGINT or SIGTERM removes the folder, registered before it is made
  const std::string tmp = make_fresh_dir(dir + ".tmp-", &guard);
  if (tmp.empty()) throw Error("cannot create a folder next to " + dir + ": " + std::strerror(errno));
  const mode_t folder_mode = take_folder_attributes(tmp, dir);
  try {
    write_rank_file(tmp, opt, info);
    write_index(tmp, info, false);
  } catch (const std::exception& e) {
    remove_tree(tmp, "the failed save's temporary folder");
    throw Error(std::string("cannot write the checkpoint: ") + e.what());
  }
  finish_folder_attributes(tmp, folder_mode);
  swap_in(tmp, dir);
  guard.release();
  remove_stale_temporaries(dir, started);
}

}  // namespace dos
