#include "checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "atomic_file.h"
#include "safetensors.h"

namespace dos {
namespace {

constexpr const char* kFormat = "deep-optimizer-states checkpoint v1";

std::string rank_file(std::size_t rank, std::size_t world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05zu-of-%05zu.safetensors", rank, world);
  return name;
}

nlohmann::ordered_json to_json(const CheckpointInfo& i) {
  return {{"format", kFormat},       {"model", i.model}, {"params_total", i.params_total}, {"begin", i.begin},
          {"end", i.end},            {"rank", i.rank},   {"world", i.world},               {"subgroup_size", i.subgroup_size},
          {"dtype", i.dtype},        {"iteration", i.iteration}, {"seed", i.seed},
          {"files", {rank_file(i.rank, i.world)}}};
}

std::string describe(const CheckpointInfo& i) {
  return "model " + i.model + " (" + std::to_string(i.params_total) + " parameters), shard " + std::to_string(i.rank) +
         "/" + std::to_string(i.world) + " [" + std::to_string(i.begin) + ", " + std::to_string(i.end) +
         "), subgroups of " + std::to_string(i.subgroup_size) + ", " + i.dtype + ", seed " + std::to_string(i.seed);
}

}  // namespace

void check_checkpoint_dir(const std::string& dir) {
  if (dir.empty()) throw Error("the checkpoint folder name is empty");
  try {
    check_parent_writable(dir, "the checkpoint " + dir);
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw Error("cannot write the checkpoint " + dir + ": it exists and is not a folder");
}

void save_checkpoint(const std::string& dir, const Optimizer& opt, const CheckpointInfo& info) {
  check_checkpoint_dir(dir);
  const std::size_t n = opt.num_params();
  std::vector<float> master(n), m(n), v(n);
  opt.read_master(master.data());
  opt.read_exp_avg(m.data());
  opt.read_exp_avg_sq(v.data());
  const std::vector<std::int64_t> steps = opt.step_counts();
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < opt.num_subgroups(); ++i) sizes.push_back(std::int64_t(opt.subgroup_size(i)));

  std::string tmpl = dir + ".tmp-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw Error("cannot create a folder next to " + dir + ": " + std::strerror(errno));
  const std::string tmp = buf.data();
  try {
    const std::int64_t ns = std::int64_t(steps.size());
    write_safetensors(tmp + "/" + rank_file(info.rank, info.world),
                      {{"master", "F32", {std::int64_t(n)}, master.data(), n * 4},
                       {"exp_avg", "F32", {std::int64_t(n)}, m.data(), n * 4},
                       {"exp_avg_sq", "F32", {std::int64_t(n)}, v.data(), n * 4},
                       {"step", "I64", {ns}, steps.data(), steps.size() * 8},
                       {"subgroup_sizes", "I64", {ns}, sizes.data(), sizes.size() * 8}},
                      {{"format", kFormat}});
    const std::string index = to_json(info).dump(2) + "\n";
    write_file_atomically(tmp + "/index.json", {{index.data(), index.size()}});
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    throw Error(std::string("cannot write the checkpoint: ") + e.what());
  }
  // swap: the old checkpoint aside, the new one in, the old one removed
  std::string old;
  struct stat st;
  if (::lstat(dir.c_str(), &st) == 0) {
    old = dir + ".old-" + std::to_string(::getpid());
    if (::rename(dir.c_str(), old.c_str()) != 0) {
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
      throw Error("cannot move the previous checkpoint " + dir + " aside: " + std::strerror(errno));
    }
  }
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (!old.empty()) ::rename(old.c_str(), dir.c_str());  // put the previous one back
    throw Error("cannot put the checkpoint in place at " + dir + ": " + why);
  }
  if (!old.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(old, ec);
  }
}

CheckpointInfo load_checkpoint(const std::string& dir, Optimizer& opt, const CheckpointInfo& expect) {
  std::ifstream f(dir + "/index.json");
  if (!f) throw Error("cannot resume: " + dir + "/index.json does not exist (is " + dir + " a checkpoint folder?)");
  CheckpointInfo got;
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
  } catch (const std::exception& e) {
    throw Error("cannot resume: " + dir + "/index.json is malformed: " + e.what());
  }
  if (got.model != expect.model || got.params_total != expect.params_total || got.begin != expect.begin ||
      got.end != expect.end || got.rank != expect.rank || got.world != expect.world ||
      got.subgroup_size != expect.subgroup_size || got.dtype != expect.dtype || got.seed != expect.seed)
    throw Error("cannot resume: the checkpoint in " + dir + " is of " + describe(got) + "; this run is " +
                describe(expect) + ": resume with the same model, --shard, --subgroup-size, --dtype and --seed");
  std::map<std::string, SafetensorIn> t;
  try {
    t = read_safetensors(dir + "/" + rank_file(got.rank, got.world));
  } catch (const std::exception& e) {
    throw Error(std::string("cannot resume: ") + e.what());
  }
  const std::size_t n = opt.num_params(), ns = opt.num_subgroups();
  auto need = [&](const char* name, const char* dtype, std::size_t count, std::size_t esz) -> const SafetensorIn& {
    auto it = t.find(name);
    if (it == t.end() || it->second.dtype != dtype || it->second.data.size() != count * esz)
      throw Error(std::string("cannot resume: tensor '") + name + "' of " + dir + " is missing or of the wrong size");
    return it->second;
  };
  const SafetensorIn &master = need("master", "F32", n, 4), &m = need("exp_avg", "F32", n, 4),
                     &v = need("exp_avg_sq", "F32", n, 4), &step = need("step", "I64", ns, 8);
  std::vector<std::int64_t> steps(ns);
  std::memcpy(steps.data(), step.data.data(), ns * 8);
  opt.load_state(reinterpret_cast<const float*>(master.data.data()), reinterpret_cast<const float*>(m.data.data()),
                 reinterpret_cast<const float*>(v.data.data()), steps);
  return got;
}

}  // namespace dos
