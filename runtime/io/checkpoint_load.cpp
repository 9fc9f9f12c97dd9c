// Resuming a checkpoint (checkpoint.h, load_checkpoint): the index and every rank file it needs
// checked first, then this rank's elements read straight into the optimizer's host buffers.
#include "checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint_format.h"
#include "checksum.h"
#include "safetensors.h"
#include "state_check.h"

namespace dos {
using namespace checkpoint_io;

namespace {

std::string range_str(std::size_t begin, std::size_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

/// One entry of the index's "ranks": an old rank's flat element range and its file.
struct RankEntry {
  std::size_t begin, end;
  std::string file;
};

/// A checkpoint's index.json, read and checked against `expect` (load_checkpoint's first checks).
struct Index {
  CheckpointInfo got;
  std::string save_id;
  std::vector<RankEntry> entries;
};

/// Reads `dir`/index.json into an Index and checks that `expect` can resume from it (the same
/// model, parameters, subgroup size, dtype, seed, gradient parts, architecture and optimizer).
/// Throws Error ("cannot resume: ...") as load_checkpoint documents for those checks.
Index read_index(const std::string& dir, const CheckpointInfo& expect) {
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
  Index index;
  CheckpointInfo& got = index.got;
  std::string& save_id = index.save_id;  // "" in checkpoints saved before it was recorded
  std::vector<RankEntry>& entries = index.entries;
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
    if (j.contains("save_id")) save_id = j.at("save_id").get<std::string>();
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
      (!got.architecture.empty() && !expect.architecture.empty() && got.architecture != expect.architecture)) {
    // what differs first, each with both values: the full descriptions below are long
    std::string differs;
    auto note = [&](const char* what, const std::string& a, const std::string& b) {
      if (a != b) differs += std::string(differs.empty() ? "" : "; ") + what + " " + a + " there, " + b + " here";
    };
    note("model", got.model, expect.model);
    note("parameters", std::to_string(got.params_total), std::to_string(expect.params_total));
    note("subgroup size", std::to_string(got.subgroup_size), std::to_string(expect.subgroup_size));
    note("dtype", got.dtype, expect.dtype);
    note("seed", std::to_string(got.seed), std::to_string(expect.seed));
    note("gradient parts", std::to_string(got.grad_parts), std::to_string(expect.grad_parts));
    if (!got.architecture.empty() && !expect.architecture.empty()) note("architecture", got.architecture, expect.architecture);
    throw Error("cannot resume: the checkpoint in " + dir + " differs from this run in: " + differs + ". It is of " +
                describe(got) + "; this run is " + describe(expect) + ": resume with the same model, --subgroup-size, --dtype and --seed, and with the "
                "checkpoint's --grad-parts " + std::to_string(got.grad_parts) +
                " (any number of ranks can resume it with that)");
  }
  if (!got.optimizer.empty() && !expect.optimizer.empty() && got.optimizer != expect.optimizer)
    throw Error("cannot resume: the checkpoint in " + dir + " was trained with " + got.optimizer + "; this run asks for " +
                expect.optimizer + ": resume with the same optimizer, betas (and for Adam weight decay), which made "
                "its exp_avg and exp_avg_sq (the learning rate, eps and AdamW's weight decay may change)");
  return index;
}

}  // namespace

CheckpointInfo check_resumable(const std::string& dir, const CheckpointInfo& expect) {
  return read_index(dir, expect).got;
}

CheckpointInfo load_checkpoint(const std::string& dir, Optimizer& opt, const CheckpointInfo& expect) {
  Index index = read_index(dir, expect);
  const CheckpointInfo& got = index.got;
  const std::string& save_id = index.save_id;
  std::vector<RankEntry>& entries = index.entries;

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
      // and which save it belongs to: a file of another save (copied in) or another iteration is refused
      const auto id = meta.find("save_id"), at = meta.find("iteration");
      if (!save_id.empty() && (id == meta.end() || id->second != save_id))
        throw Error("cannot resume: " + path + " belongs to another save than the index of " + dir + " (save " +
                    (id == meta.end() ? std::string("unrecorded") : id->second) + ", the index's " + save_id +
                    "): a rank file copied in from another checkpoint? Resume from a checkpoint folder as one save "
                    "wrote it");
      if (at != meta.end() && at->second != std::to_string(got.iteration))
        throw Error("cannot resume: " + path + " was saved after iteration " + at->second + " but the index of " + dir +
                    " says " + std::to_string(got.iteration) + " (the index edited, or a file of another save?)");
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
