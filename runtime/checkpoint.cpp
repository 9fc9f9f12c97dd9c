#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "atomic_file.h"
#include "partition.h"
#include "safetensors.h"

namespace dos {
namespace {

constexpr const char* kFormat = "deep-optimizer-states checkpoint v1";

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
  return {{"format", kFormat},       {"model", i.model}, {"params_total", i.params_total}, {"begin", ranks[0]["begin"]},
          {"end", ranks[0]["end"]},  {"rank", ranks[0]["rank"]}, {"world", i.world},       {"subgroup_size", i.subgroup_size},
          {"dtype", i.dtype},        {"iteration", i.iteration}, {"seed", i.seed},
          {"grad_parts", i.grad_parts}, {"files", files}, {"ranks", ranks}};
}

std::string describe(const CheckpointInfo& i) {
  return "model " + i.model + " (" + std::to_string(i.params_total) + " parameters), subgroups of " +
         std::to_string(i.subgroup_size) + ", " + i.dtype + ", seed " + std::to_string(i.seed) +
         ", gradients summed over " + std::to_string(i.grad_parts) + (i.grad_parts == 1 ? " part" : " parts");
}

}  // namespace

void check_checkpoint_dir(const std::string& dir_given) {
  if (dir_given.empty()) throw Error("the checkpoint folder name is empty");
  const std::string dir = without_trailing_slashes(dir_given);
  try {
    check_parent_writable(dir, "the checkpoint " + dir);
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw Error("cannot write the checkpoint " + dir + ": it exists and is not a folder");
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
  opt.with_host_state([&](const std::vector<Optimizer::HostState>& state) {
    using Pieces = std::vector<std::pair<const void*, std::size_t>>;
    Pieces master, m, v;
    for (const Optimizer::HostState& sg : state) {
      master.emplace_back(sg.master, sg.size * 4);
      m.emplace_back(sg.exp_avg, sg.size * 4);
      v.emplace_back(sg.exp_avg_sq, sg.size * 4);
    }
    write_safetensors(tmp + "/" + rank_file(info.rank, info.world),
                      {{"master", "F32", {std::int64_t(n)}, nullptr, n * 4, master},
                       {"exp_avg", "F32", {std::int64_t(n)}, nullptr, n * 4, m},
                       {"exp_avg_sq", "F32", {std::int64_t(n)}, nullptr, n * 4, v},
                       {"step", "I64", {ns}, steps.data(), steps.size() * 8},
                       {"subgroup_sizes", "I64", {ns}, sizes.data(), sizes.size() * 8}},
                      {{"format", kFormat}, {"begin", std::to_string(info.begin)}, {"end", std::to_string(info.end)}});
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

void write_index(const std::string& tmp, const CheckpointInfo& info, bool all_ranks) {
  const std::string index = to_json(info, all_ranks).dump(2) + "\n";
  write_file_atomically(tmp + "/index.json", {{index.data(), index.size()}});
}

}  // namespace

void save_checkpoint(const std::string& dir_given, const Optimizer& opt, const CheckpointInfo& info,
                     const CheckpointRanks* ranks) {
  const std::string dir = without_trailing_slashes(dir_given);
  check_checkpoint_dir(dir);
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
  try {
    write_rank_file(tmp, opt, info);
    write_index(tmp, info, false);
  } catch (const std::exception& e) {
    remove_tree(tmp, "the failed save's temporary folder");
    throw Error(std::string("cannot write the checkpoint: ") + e.what());
  }
  swap_in(tmp, dir);
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
    got.params_total = j.at("params_total").get<std::size_t>();
    got.begin = j.at("begin").get<std::size_t>();
    got.end = j.at("end").get<std::size_t>();
    got.rank = j.at("rank").get<std::size_t>();
    got.world = j.at("world").get<std::size_t>();
    got.subgroup_size = j.at("subgroup_size").get<std::size_t>();
    got.dtype = j.at("dtype").get<std::string>();
    got.iteration = j.at("iteration").get<std::int64_t>();
    got.seed = j.at("seed").get<std::uint64_t>();
    got.grad_parts = j.value("grad_parts", std::size_t(1));  // absent before it was recorded
    // the old ranks' ranges and files (older indexes: only the top-level one)
    for (const auto& r : j.contains("ranks") ? j.at("ranks") : nlohmann::json::array({j})) {
      RankEntry e{r.at("begin").get<std::size_t>(), r.at("end").get<std::size_t>(),
                  r.value("file", rank_file(r.at("rank").get<std::size_t>(), got.world))};
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
      got.grad_parts != expect.grad_parts)
    throw Error("cannot resume: the checkpoint in " + dir + " is of " + describe(got) + "; this run is " +
                describe(expect) + ": resume with the same model, --subgroup-size, --dtype and --seed, and with the "
                "checkpoint's --grad-parts " + std::to_string(got.grad_parts) +
                " (any number of ranks can resume it with that)");

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
  for (const Piece& p : pieces) {  // one old file at a time
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
  opt.load_state_in_place(steps, [&](const std::vector<Optimizer::HostStateOut>& state) {
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      const std::string path = dir + "/" + p.entry->file;
      try {
        const SafetensorsReader file(path);
        if (file.identity() != identities[k])
          throw std::runtime_error(path + " changed while it was being read (another job saving into " + dir + "?)");
        for (std::size_t i = std::size_t(std::upper_bound(starts.begin(), starts.end(), p.lo) - starts.begin()) - 1;
             i < ns && starts[i] < p.hi; ++i) {
          const std::size_t a = std::max(p.lo, starts[i]), b = std::min(p.hi, starts[i + 1]);
          const std::uint64_t from = std::uint64_t(a - p.entry->begin) * 4;
          const std::size_t into = a - starts[i], bytes = (b - a) * 4;
          file.read("master", from, state[i].master + into, bytes);
          file.read("exp_avg", from, state[i].exp_avg + into, bytes);
          file.read("exp_avg_sq", from, state[i].exp_avg_sq + into, bytes);
        }
      } catch (const std::exception& e) {
        throw Error(std::string("cannot resume: ") + e.what() + " (the optimizer's state is now incomplete: stop)");
      }
    }
  });
  return got;
}

}  // namespace dos
