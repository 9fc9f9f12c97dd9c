// dos-train: the main job. Runs N training iterations of a transformer's update phase on the
// runtime, with forward and backward emulated (deterministic gradients from --seed written into
// caller-owned buffers, on the GPU when there is one). See --help.
#include <CLI/CLI.hpp>
#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "atomic_file.h"
#include "checkpoint.h"
#include "dos.h"
#include "comm.h"
#include "compute_emulator.h"
#include "cpu_team.h"
#include "emulate.h"
#include "resource_model.h"
#include "model_config.h"
#include "partition.h"
#include "plan.h"
#include "plan_only.h"
#include "policy.h"
#include "safetensors.h"
#include "temp_cleanup.h"

namespace {

using dos::DType;
using dos_train::ModelConfig;
using dos_train::ParamTensor;

struct Args {
  std::string preset = "gpt2-124m";
  std::string config;
  int iterations = 5;
  std::string subgroup_size = "16777216";
  std::string policy;
  std::string dtype = "bf16";
  std::string optimizer = "adamw";
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  std::string seed_text = "0";  ///< --seed as given; parsed into seed (parse_seed)
  std::uint64_t seed = 0;
  std::string shard = "0/1";
  std::string device = "auto";
  std::string report;
  std::string save_params;
  int cpu_threads = 0;
  int cpu_workers = 0;
  int ncuda = -1;
  bool quiet = false;
  std::string k, gpu_fraction;
  std::string save_state, resume;
  std::vector<std::string> sweep;
  bool recalibrate = false;
  bool plan_only = false;
  std::string rates;  ///< --rates as given: six numbers or a rates file (plan_only.h)
  std::string gpu_resident_budget, gpu_update_budget;
  int stream_lookahead = 3;
  std::string writeback = "eager";
  std::string grad_transfer = "native";
  bool urgent_writeback = false;
  std::string submit_order = "plan";
  std::string timeline;
  int grad_parts = 0;
  std::string comm = "auto";
  bool emulate_compute = false;
  long long tokens = 4096;
  int cpu_scale = 32;
};

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

/// The data-parallel job when dos-train runs under an MPI launcher (null: one process).
std::unique_ptr<dos::Comm> g_comm;

/// PATH with ".rank-RRRRR-of-WWWWW" before its extension: each rank's own output file.
std::string rank_path(const std::string& path, std::size_t rank, std::size_t world) {
  char tag[48];
  std::snprintf(tag, sizeof tag, ".rank-%05zu-of-%05zu", rank, world);
  const auto slash = path.find_last_of('/'), dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

/// This rank's GPU under MPI: the node's local rank modulo the GPUs CUDA sees (one GPU per rank
/// when the launcher shows every GPU of the node to every rank; GPU 0 when it shows one, as Slurm's
/// --gpus-per-task does); made the calling thread's current GPU. -1 without CUDA or with --ncuda 0.
int choose_gpu(const dos::Comm& comm, const Args& a) {
#if defined(DOS_HAVE_CUDA)
  if (a.ncuda == 0) return -1;
  const int count = dos_train::cuda_device_count();
  if (count == 0) return -1;
  const int gpu = comm.local_rank() % count;
  dos_train::cuda_set_device(gpu);
  return gpu;
#else
  (void)comm;
  (void)a;
  return -1;
#endif
}

/// Every rank's `bytes` bytes of `mine`, in rank order, into `all` (size() x bytes). Collective.
void gather_from_each(dos::Comm& comm, const void* mine, void* all, std::size_t bytes) {
  std::vector<dos::ShardRange> one;  // one element of `bytes` bytes per rank
  for (std::size_t r = 0; r < std::size_t(comm.size()); ++r) one.push_back({r, r + 1});
  comm.all_gather(mine, all, one, bytes);
}

/// The cores of the NUMA node(s) of the GPU at PCI bus id `bus` (hwloc: the GPU's PCI device and
/// its first non-I/O ancestor), and those nodes in words ("0", "0-1"); empty when hwloc cannot tell
/// or `bus` is empty.
std::pair<std::vector<int>, std::string> gpu_local_cores(const std::string& bus) {
  std::pair<std::vector<int>, std::string> out;
  if (bus.empty()) return out;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return out;
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) == 0) {
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topo, bus.c_str());
    hwloc_obj_t near = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : nullptr;
    if (near && near->cpuset && near->nodeset) {
      int i;
      hwloc_bitmap_foreach_begin(i, near->cpuset) out.first.push_back(i);
      hwloc_bitmap_foreach_end();
      char* nodes = nullptr;
      hwloc_bitmap_list_asprintf(&nodes, near->nodeset);
      out.second = nodes ? nodes : "";
      std::free(nodes);
    }
  }
  hwloc_topology_destroy(topo);
  return out;
}

/// A 31-bit hash of a string or of a list of core numbers (FNV-1a): keys compared across ranks.
int hash31(const std::string& text) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return int(h & 0x7fffffffu);
}
std::string core_list(const std::vector<int>& cores) {
  std::string t;
  for (int c : cores) t += std::to_string(c) + ",";
  return t;
}

/// Where this rank runs, decided with the other ranks (collective).
struct Placement {
  std::string words;       ///< "GPU 1 (NUMA node 0), cores 16-31 (16)", for rank 0's listing
  bool gpu_shared = false;  ///< another rank of this node uses the same GPU (NCCL cannot run then)
};

/// Gives this rank its cores, near its GPU. Ranks on one node whose launcher gave them the same
/// cores (plain mpirun --bind-to none) would bind their threads to the same cores: each takes its
/// own block instead, out of the cores of its GPU's NUMA node, shared only with the ranks of the
/// node whose GPUs have the same cores (so the optimizer state, first-touched by the rank's CPU
/// threads, lands on its GPU's node); where two GPUs' core sets overlap without being equal, the
/// whole set is split instead. Fewer cores than ranks: a warning and no binding. Ranks whose
/// launcher gave them cores of their own (Slurm with --cpus-per-task, mpirun --map-by ...
/// --bind-to core) keep exactly those. Also finds ranks of one node that share a GPU (warned).
Placement place_rank(dos::Comm& comm, int gpu) {
  const std::vector<int> cores = dos::allowed_cores();
#if defined(DOS_HAVE_CUDA)
  const std::string bus = gpu >= 0 ? dos_train::cuda_pci_bus_id(gpu) : std::string();
#else
  const std::string bus;
#endif
  const auto [near, nodes] = gpu_local_cores(bus);
  std::vector<int> pool;  // the cores of this rank's GPU's node(s) it may take its block from
  for (int c : cores)
    if (std::find(near.begin(), near.end(), c) != near.end()) pool.push_back(c);
  if (pool.empty()) pool = cores;
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  enum { kHost, kCores, kPool, kFirst, kLast, kBus, kFields };
  const int mine[kFields] = {hash31(host), hash31(core_list(cores)), hash31(core_list(pool)),
                             pool.empty() ? -1 : pool.front(), pool.empty() ? -1 : pool.back(),
                             bus.empty() ? -1 : hash31(bus)};
  const std::size_t world = std::size_t(comm.size());
  std::vector<int> all(kFields * world, -1);
  gather_from_each(comm, mine, all.data(), sizeof mine);
  auto field = [&](std::size_t r, int f) { return all[r * kFields + std::size_t(f)]; };
  const std::size_t me = std::size_t(comm.rank());
  Placement out;
  std::string gpu_words = gpu >= 0 ? "GPU " + std::to_string(gpu) + (nodes.empty() ? "" : " (NUMA node " + nodes + ")")
                                   : std::string("no GPU");
  // the ranks of this node launched on the same cores as this one; `overlap`: two of them have GPU
  // core sets that overlap without being equal (every rank of the group finds the same answer)
  std::vector<std::size_t> peers;
  for (std::size_t r = 0; r < world; ++r) {
    if (field(r, kHost) != mine[kHost]) continue;
    if (r != me && mine[kBus] >= 0 && field(r, kBus) == mine[kBus]) out.gpu_shared = true;
    if (field(r, kCores) == mine[kCores]) peers.push_back(r);
  }
  bool overlap = false;
  for (std::size_t i : peers)
    for (std::size_t j : peers)
      if (field(i, kPool) != field(j, kPool) && field(i, kFirst) <= field(j, kLast) && field(j, kFirst) <= field(i, kLast))
        overlap = true;
  const int sharing = int(peers.size());
  if (out.gpu_shared) {
    std::fprintf(stderr, "dos-train: warning: rank %d: another rank on this node uses the same GPU (%s): ranks share "
                 "GPUs (one rank per GPU: srun --gpus-per-task=1, or as many ranks per node as GPUs)\n",
                 comm.rank(), bus.c_str());
    gpu_words += ", shared with another rank";
  }
  if (sharing <= 1) {
    out.words = gpu_words + ", cores as launched (" + std::to_string(cores.size()) + ")";
    return out;
  }
  if (overlap) pool = cores;
  int index = 0, group = 0;
  for (std::size_t r : peers) {
    if (!overlap && field(r, kPool) != mine[kPool]) continue;
    if (r < me) ++index;
    ++group;
  }
  if (int(pool.size()) < group) {
    std::fprintf(stderr, "dos-train: warning: rank %d: %d ranks share %zu core(s): they oversubscribe the cores; "
                 "threads are left unbound (give each rank its cores: srun --cpus-per-task, mpirun --map-by)\n",
                 comm.rank(), group, pool.size());
    setenv("DOS_BIND", "0", 1);
    out.words = gpu_words + ", cores shared with other ranks (unbound)";
    return out;
  }
  const std::size_t per = pool.size() / std::size_t(group);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (std::size_t i = std::size_t(index) * per; i < std::size_t(index + 1) * per; ++i) CPU_SET(pool[i], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    std::fprintf(stderr, "dos-train: warning: rank %d: could not restrict itself to its %zu cores\n", comm.rank(), per);
    out.words = gpu_words + ", cores as launched (could not bind)";
    return out;
  }
  out.words = gpu_words + ", cores " + std::to_string(pool[std::size_t(index) * per]) + "-" +
              std::to_string(pool[std::size_t(index + 1) * per - 1]) + " (" + std::to_string(per) + ")";
  return out;
}

std::size_t parse_count(const std::string& s, const char* what) {
  // Accepts "16777216", "1e8", "1.6e7"; the value must be a whole number >= 1.
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno != 0 || !std::isfinite(v))
    fail(std::string(what) + " must be a number of elements, got '" + s + "'");
  if (v < 1) fail(std::string(what) + " must be at least 1 element, got " + s);
  if (v > 9e15) fail(std::string(what) + " must be at most 9e15 elements, got " + s);
  if (v != std::floor(v)) fail(std::string(what) + " must be a whole number of elements, got " + s);
  return std::size_t(v);
}

/// --seed: a whole number in [0, 2^64 - 1] written in decimal digits; fails quoting what was given.
std::uint64_t parse_seed(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || !std::isdigit((unsigned char)s[0]) || *end != '\0' || errno == ERANGE)
    fail("--seed must be a whole number in [0, 18446744073709551615], got '" + s + "'");
  return std::uint64_t(v);
}

/// The path of `p` with symbolic links and ".." resolved, as far as it exists (the rest appended):
/// two spellings of one path give the same string.
std::string resolved(const std::string& p) {
  std::error_code ec;
  const std::filesystem::path r = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
  return ec ? p : r.lexically_normal().string();
}

/// Fails, before the run, when two of the output paths name one file (the same path spelled two
/// ways, or hard links to one file: device and inode compared), or when an output file lies inside
/// the checkpoint folder that --save-state replaces.
void check_distinct_outputs(const Args& a) {
  const std::pair<const char*, const std::string*> outs[] = {
      {"--report", &a.report}, {"--save-params", &a.save_params}, {"--timeline", &a.timeline}};
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = i + 1; j < 3; ++j) {
      const std::string &x = *outs[i].second, &y = *outs[j].second;
      if (x.empty() || y.empty()) continue;
      struct stat sx, sy;
      const bool same_inode = ::stat(x.c_str(), &sx) == 0 && ::stat(y.c_str(), &sy) == 0 && sx.st_dev == sy.st_dev &&
                              sx.st_ino == sy.st_ino;
      if (x == y || same_inode || resolved(x) == resolved(y))
        fail(std::string(outs[i].first) + " " + x + " and " + outs[j].first + " " + y +
             " name the same file: give each output its own file");
    }
  if (a.save_state.empty()) return;
  const std::string ck = resolved(a.save_state);
  for (const auto& [opt, path] : outs) {
    if (path->empty()) continue;
    const std::string r = resolved(*path);
    if (r == ck || r.compare(0, ck.size() + 1, ck + "/") == 0)
      fail(std::string(opt) + " " + *path + " lies in the checkpoint folder " + a.save_state +
           ", which --save-state replaces as a whole at the end: write it outside that folder");
  }
}

void parse_shard(const std::string& s, std::size_t* rank, std::size_t* world) {
  const auto slash = s.find('/');
  char *e1 = nullptr, *e2 = nullptr;
  if (slash == std::string::npos) fail("--shard must look like R/W (rank R of W ranks, e.g. 0/4), got '" + s + "'");
  const std::string r = s.substr(0, slash), w = s.substr(slash + 1);
  const long long rv = std::strtoll(r.c_str(), &e1, 10), wv = std::strtoll(w.c_str(), &e2, 10);
  if (r.empty() || w.empty() || *e1 || *e2 || rv < 0 || wv < 1)
    fail("--shard must look like R/W with 0 <= R < W, got '" + s + "'");
  if (rv >= wv) fail("--shard " + s + ": rank " + r + " is out of range for " + w + " ranks (0.." + std::to_string(wv - 1) + ")");
  *rank = std::size_t(rv);
  *world = std::size_t(wv);
}

/// A byte count: a number with an optional unit (B, KB, MB, GB, TB in powers of 1000; KiB, MiB,
/// GiB, TiB in powers of 1024): "40GB", "31.5GB", "4e10", "10GiB". Fails naming the option.
std::size_t parse_bytes(const std::string& s, const char* what) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit = end ? std::string(end) : std::string();
  static const std::pair<const char*, double> units[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  double mult = -1;
  for (const auto& u : units)
    if (unit == u.first) mult = u.second;
  if (s.empty() || end == s.c_str() || errno != 0 || mult < 0 || !std::isfinite(v) || v < 0 || v * mult > 9e18)
    fail(std::string(what) + " must be a size in bytes such as 40GB, 31.5GB, 4e10 or 10GiB, got '" + s + "'");
  return std::size_t(std::llround(v * mult));
}

double parse_fraction(const std::string& s, const char* what) {
  // "0.5", "1/3"
  const auto slash = s.find('/');
  char *e1 = nullptr, *e2 = nullptr;
  double v;
  if (slash == std::string::npos) {
    v = std::strtod(s.c_str(), &e1);
    if (s.empty() || *e1) fail(std::string(what) + ": '" + s + "' is not a number");
  } else {
    const std::string a = s.substr(0, slash), b = s.substr(slash + 1);
    const double x = std::strtod(a.c_str(), &e1), y = std::strtod(b.c_str(), &e2);
    if (a.empty() || b.empty() || *e1 || *e2 || y == 0) fail(std::string(what) + ": '" + s + "' is not a fraction like 1/3");
    v = x / y;
  }
  return v;
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::fp32;
  if (s == "fp16") return DType::fp16;
  if (s == "bf16") return DType::bf16;
  fail("--dtype must be fp32, fp16 or bf16, got '" + s + "'");
}

/// A tensor, or the part of it that falls in this rank's shard.
struct ShardTensor {
  ParamTensor t;
  std::size_t global_begin;   // flat index of its first element in the whole model
  std::size_t tensor_offset;  // first element inside the tensor
  std::size_t count;
  bool whole() const { return tensor_offset == 0 && count == t.numel(); }
};

std::vector<ShardTensor> shard_tensors(const std::vector<ParamTensor>& all, dos::ShardRange r) {
  std::vector<ShardTensor> out;
  std::size_t flat = 0;
  for (const ParamTensor& t : all) {
    const std::size_t b = std::max(flat, r.begin), e = std::min(flat + t.numel(), r.end);
    if (b < e) out.push_back({t, b, b - flat, e - b});
    flat += t.numel();
  }
  return out;
}

/// Initial value of element i of the piece `st`: a function of its index in the whole model, so that
/// every shard starts from its slice of the unsharded model's parameters.
float init_value(const ShardTensor& st, std::size_t i, std::uint64_t seed) {
  switch (st.t.kind) {
    case dos_train::TensorKind::norm: return 1.0f;
    case dos_train::TensorKind::bias: return 0.0f;
    default: return dos_train::normal_like(seed, 1, st.global_begin + i) * 0.02f;
  }
}

void* host_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) fail("cannot allocate " + std::to_string(bytes) + " bytes");
  return p;
}

int run(const Args& args) {
  Args a = args;
  if (g_comm && g_comm->size() > 1) {  // every rank writes its own files
    for (std::string* p : {&a.report, &a.save_params, &a.timeline})
      if (!p->empty()) *p = rank_path(*p, std::size_t(g_comm->rank()), std::size_t(g_comm->size()));
  }
  // ---- validate everything before any work --------------------------------------------------
  ModelConfig cfg = a.config.empty() ? dos_train::preset(a.preset) : dos_train::load_hf_config(a.config);
  const std::vector<ParamTensor> all = dos_train::param_tensors(cfg);
  const std::size_t total = dos_train::count_params(all, cfg.name);
  a.seed = parse_seed(a.seed_text);
  std::size_t rank = 0, world = 1;
  parse_shard(a.shard, &rank, &world);
  const std::size_t subgroup = parse_count(a.subgroup_size, "--subgroup-size");
  // Data parallelism: under an MPI launcher the job's ranks own one shard each (ZeRO partitioning).
  const bool dp = g_comm && g_comm->size() > 1;
  if (dp) {
    if (a.shard != "0/1" && (rank != std::size_t(g_comm->rank()) || world != std::size_t(g_comm->size())))
      fail("--shard " + a.shard + " disagrees with the MPI job (rank " + std::to_string(g_comm->rank()) + " of " +
           std::to_string(g_comm->size()) + "): leave --shard out when running under mpirun or srun");
    rank = std::size_t(g_comm->rank());
    world = std::size_t(g_comm->size());
    if (!a.sweep.empty()) fail("--sweep works with one rank only: leave it out under MPI");
    a.shard = std::to_string(rank) + "/" + std::to_string(world);  // as the reports and messages name it
    const std::size_t sg_total = (total + subgroup - 1) / subgroup;
    if (world > 2048)
      fail(std::to_string(world) + " ranks: at most 2048 (the emulated gradients' sums over ranks are exact up to "
           "2048 parts)");
    if (world > sg_total)
      fail(std::to_string(world) + " ranks for a model of " + std::to_string(total) + " parameters in " +
           std::to_string(sg_total) + " subgroup(s) of " + a.subgroup_size +
           " elements: a rank would hold less than one subgroup; use at most " + std::to_string(sg_total) +
           (sg_total == 1 ? " rank" : " ranks") + ", or --subgroup-size " + std::to_string(total / world) +
           " or less (a checkpoint resumes only with its own subgroup size)");
  }
  if (a.grad_parts < 0 || a.grad_parts > 2048)
    fail("--grad-parts must be 0 (the default: one part per rank) or in [1, 2048] (the data-parallel ranks whose "
         "gradients are summed), got " + std::to_string(a.grad_parts));
  if (!dp && (a.comm == "mpi" || a.comm == "nccl"))
    fail("--comm " + a.comm + " chooses the collectives of an MPI job, and this is one process (start it with mpirun "
         "or srun --mpi=pmix, or leave --comm out)");
  // the emulated gradient sums `parts` contributions; under MPI rank r adds parts
  // [r * parts / W, (r + 1) * parts / W) (default: one part per rank), so that a job resumed on
  // another number of ranks with the checkpoint's --grad-parts sees the same gradients
  const std::size_t parts = a.grad_parts > 0 ? std::size_t(a.grad_parts) : dp ? world : 1;
  const std::size_t my_parts_begin = dp ? rank * parts / world : 0, my_parts_end = dp ? (rank + 1) * parts / world : parts;
  const dos::ShardRange range = dos::shard_range(total, rank, world);
  const std::size_t n = range.end - range.begin;
  const DType dtype = parse_dtype(a.dtype);
  if (a.iterations < 1) fail("--iterations must be at least 1, got " + std::to_string(a.iterations));
  if (a.optimizer != "adam" && a.optimizer != "adamw") fail("--optimizer must be adam or adamw, got '" + a.optimizer + "'");
  if (a.device != "auto" && a.device != "host" && a.device != "cuda")
    fail("--device must be auto, host or cuda, got '" + a.device + "'");
  dos::AdamHyper hyper;
  hyper.lr = a.lr;
  hyper.beta1 = a.beta1;
  hyper.beta2 = a.beta2;
  hyper.eps = a.eps;
  hyper.weight_decay = a.weight_decay;
  hyper.decoupled = a.optimizer == "adamw";
  dos::validate_adam_hyper(hyper);
  if (hyper.decoupled && a.lr * a.weight_decay >= 1)
    std::fprintf(stderr, "dos-train: warning: --lr x --weight-decay = %g: each AdamW step multiplies the parameters by "
                 "(1 - %g), which does not decay them (they flip sign or grow); a usual product is below 1e-3\n",
                 a.lr * a.weight_decay, a.lr * a.weight_decay);
  if (a.lr > 1)
    std::fprintf(stderr, "dos-train: warning: --lr %g is unusually large (Adam moves each parameter by about lr "
                 "per step; usual values are 1e-5 to 1e-2)\n", a.lr);
  if (!a.k.empty() && !a.gpu_fraction.empty()) fail("give --k or --gpu-fraction, not both");
  if (!a.k.empty()) {
    const double k = parse_fraction(a.k, "--k");
    if (!(k >= 1 && k <= 1e9 && k == std::floor(k))) fail("--k must be a whole number >= 1, got " + a.k);
  }
  if (!a.gpu_fraction.empty()) {
    const double f = parse_fraction(a.gpu_fraction, "--gpu-fraction");
    if (!(f >= 0 && f <= 1)) fail("--gpu-fraction must be in [0, 1], got " + a.gpu_fraction);
  }
  for (const std::string& e : a.sweep)
    if (e != "model") {
      const double f = parse_fraction(e, "--sweep");
      if (!(f >= 0 && f <= 1)) fail("--sweep: each fraction must be in [0, 1] (or 'model'), got " + e);
    }
  if ((!a.k.empty() || !a.gpu_fraction.empty() || !a.sweep.empty()) && a.policy != "dos")
    fail("--k, --gpu-fraction and --sweep need --policy dos");
  if (a.plan_only && (!a.k.empty() || !a.gpu_fraction.empty() || !a.sweep.empty()))
    fail("--plan-only shows the plan's own choice: leave out --k, --gpu-fraction and --sweep");
  dos::Rates rates{}, calibrated_rates{};
  if (!a.rates.empty()) rates = dos_train::parse_rates(a.rates, &calibrated_rates);
  if (a.cpu_threads < 0) fail("--cpu-threads must be >= 0 (0: automatic), got " + std::to_string(a.cpu_threads));
  if (const std::size_t cores = dos::allowed_cores().size(); cores > 0 && std::size_t(a.cpu_threads) > cores)
    fail("--cpu-threads " + std::to_string(a.cpu_threads) + " is more than the " + std::to_string(cores) +
         " cores this process may use: give at most " + std::to_string(cores) + " (0: automatic)");
  if (a.cpu_workers < 0) fail("--cpu-workers must be >= 0 (0: automatic), got " + std::to_string(a.cpu_workers));
  const std::int64_t resident_budget =
      a.gpu_resident_budget.empty() ? -1 : std::int64_t(parse_bytes(a.gpu_resident_budget, "--gpu-resident-budget"));
  const std::size_t update_budget = a.gpu_update_budget.empty() ? 0 : parse_bytes(a.gpu_update_budget, "--gpu-update-budget");
  if (!a.gpu_update_budget.empty() && update_budget == 0)
    fail("--gpu-update-budget must be more than 0 bytes (leave it out for no limit)");
  if (a.stream_lookahead < 0 || a.stream_lookahead > 1000)
    fail("--stream-lookahead must be in [0, 1000], got " + std::to_string(a.stream_lookahead));
  if (a.grad_transfer != "fp32" && a.grad_transfer != "native")
    fail("--grad-transfer must be fp32 or native, got '" + a.grad_transfer + "'");
  if (a.writeback != "eager" && a.writeback != "end") fail("--writeback must be eager or end, got '" + a.writeback + "'");
  if (update_budget > 0 && a.writeback != "eager") fail("--gpu-update-budget needs --writeback eager");
  if (a.tokens < 1) fail("--tokens must be at least 1, got " + std::to_string(a.tokens));
  if (a.cpu_scale < 1) fail("--cpu-scale must be at least 1, got " + std::to_string(a.cpu_scale));
  if (!a.timeline.empty()) dos::check_writable(a.timeline);
  if (a.comm != "auto" && a.comm != "mpi" && a.comm != "nccl")
    fail("--comm must be auto, mpi or nccl, got '" + a.comm + "'");
  if (a.ncuda < -1) fail("--ncuda must be >= -1 (-1: one per GPU), got " + std::to_string(a.ncuda));
  if (!a.report.empty() && a.report == a.save_params) fail("--report and --save-params name the same file: " + a.report);
  if (!a.timeline.empty() && (a.timeline == a.report || a.timeline == a.save_params))
    fail("--timeline names the same file as --" + std::string(a.timeline == a.report ? "report" : "save-params") + ": " +
         a.timeline);
  if (!a.save_state.empty()) dos::check_checkpoint_dir(a.save_state);
  check_distinct_outputs(a);
  if (!a.report.empty()) dos::check_writable(a.report);
  if (!a.save_params.empty()) dos::check_writable(a.save_params);
  if (a.plan_only) {  // no runtime, no buffers: the plan the first iteration would carry out
    dos_train::PlanOnly po;
    po.model = cfg.name;
    po.policy = a.policy.empty() ? (std::getenv("STARPU_SCHED") && *std::getenv("STARPU_SCHED") ? std::getenv("STARPU_SCHED") : "cpu") : a.policy;
    std::vector<std::size_t> numels;
    for (const ShardTensor& st : shard_tensors(all, range)) numels.push_back(st.count);
    for (const dos::SubgroupLayout& l : dos::partition_subgroups(numels, subgroup)) po.workload.sizes.push_back(l.size);
    po.workload.caller_on_gpu = a.device != "host";
    po.workload.param_bytes = dos::dtype_size(dtype);
    po.workload.grad_bytes = a.grad_transfer == "native" ? dos::dtype_size(dtype) : 4;
    po.budgets = dos::GpuBudgets{resident_budget, update_budget};
    po.execution.order = a.submit_order == "plan" ? dos::SubmitOrder::plan : dos::SubmitOrder::cpu_first;
    po.execution.lookahead = unsigned(a.stream_lookahead);
    po.execution.update_budget = update_budget;
    if (!a.rates.empty()) po.rates = &rates, po.calibrated = &calibrated_rates;
    std::printf("dos-train --plan-only: %s, %zu of %zu parameters (shard %s), %s, subgroups of %zu\n", cfg.name.c_str(),
                n, total, a.shard.c_str(), a.dtype.c_str(), subgroup);
    nlohmann::ordered_json rep = dos_train::show_plan(po);
    rep["params_total"] = total;
    rep["params"] = n;
    rep["shard"] = a.shard;
    rep["dtype"] = a.dtype;
    rep["subgroup_size"] = subgroup;
    if (!a.report.empty()) {
      const std::string text = rep.dump(2) + "\n";
      dos::write_file_atomically(a.report, {{text.data(), text.size()}});
    }
    return 0;
  }
  dos::check_host_memory(n * dos::host_bytes_per_param(dtype),
                         "the optimizer state of " + std::to_string(n) + " parameters (" + cfg.name + ", shard " + a.shard + ")");
  const std::vector<ShardTensor> tensors = shard_tensors(all, range);

  // ---- runtime and caller-owned buffers ------------------------------------------------------
  dos::RuntimeOptions ro;
  ro.policy = a.policy;
  ro.cpu_threads = a.cpu_threads;
  ro.cpu_workers = a.cpu_workers;
  ro.ncuda = a.ncuda;
  ro.verbose = !a.quiet;
  if (update_budget > 0) ro.gpu_memory_limit = update_budget + std::size_t(std::max<std::int64_t>(0, resident_budget));
  Placement placement;
  if (dp) {
    ro.cuda_device = choose_gpu(*g_comm, a);
    ro.node_ranks = g_comm->local_size();
    placement = place_rank(*g_comm, ro.cuda_device);
  }
  dos::Runtime rt(ro);
  dos::remove_temporaries_on_signal();  // after StarPU's own handlers, which it then calls
  bool on_gpu = a.device == "cuda" || (a.device == "auto" && rt.cuda_workers() > 0);
  if (on_gpu && rt.cuda_workers() == 0) fail("--device cuda: no CUDA worker (no GPU, or a build without CUDA)");
#if !defined(DOS_HAVE_CUDA)
  on_gpu = false;
#endif
  const std::size_t esz = dos::dtype_size(dtype);
  if (!on_gpu)
    dos::check_host_memory(n * (2 * esz + dos::host_bytes_per_param(dtype)),
                           "the model's parameters and gradients and the optimizer state, all on the host,");

  std::printf("dos-train: %s (%s, %zu layers, hidden %lld), %zu of %zu parameters (shard %s), %s, "
              "subgroups of %zu, %s on the %s, policy %s (StarPU: %s)\n",
              cfg.name.c_str(), cfg.arch.c_str(), std::size_t(cfg.layers), (long long)cfg.hidden, n, total,
              a.shard.c_str(), a.optimizer == "adamw" ? "AdamW" : "Adam", subgroup, a.dtype.c_str(),
              on_gpu ? "GPU" : "host", rt.policy().c_str(), rt.running_policy().c_str());

  // The data-parallel collectives: NCCL on the GPU buffers when every rank can (--comm auto), else
  // MPI through host memory.
  std::unique_ptr<dos::DeviceComm> dcomm;
  if (dp) {
    const bool can = on_gpu && dos::have_nccl() && ro.cuda_device >= 0 && !placement.gpu_shared;
    if (a.comm == "nccl" && !can)
      fail(std::string("--comm nccl: ") +
           (!dos::have_nccl() ? "this dos-train was built without NCCL"
            : placement.gpu_shared ? "this rank shares its GPU with another rank of the node (NCCL needs one GPU per rank)"
                                   : "the model's buffers are not on a GPU here (--device host, --ncuda 0, or no GPU)") +
           "; use --comm mpi");
    if (a.comm == "nccl" || (a.comm == "auto" && g_comm->all_ok(can))) dcomm = dos::make_nccl_comm(*g_comm, ro.cuda_device);
    char mine[160];
    std::snprintf(mine, sizeof mine, "%s", placement.words.c_str());
    std::vector<char> all(sizeof mine * world);
    gather_from_each(*g_comm, mine, all.data(), sizeof mine);
    std::printf("data parallel: %zu ranks (%d on this node), gradients reduced and parameters broadcast through %s\n",
                world, g_comm->local_size(), dcomm ? (dcomm->name() + " on GPU buffers").c_str()
                                                    : (g_comm->name() + " on host buffers").c_str());
    for (std::size_t r = 0; r < world; ++r) {
      const dos::ShardRange sr = dos::shard_range(total, r, world);
      std::printf("  rank %zu: shard [%zu, %zu), %s\n", r, sr.begin, sr.end, all.data() + r * sizeof mine);
    }
  }

  std::vector<char> init(n * esz);
  for (const ShardTensor& st : tensors) {
    const std::size_t base = st.global_begin - range.begin;
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < st.count; ++i)
      dos::store_from_f32(init.data(), dtype, base + i, init_value(st, i, a.seed));
  }
  void *params = nullptr, *grads = nullptr;
#if defined(DOS_HAVE_CUDA)
  if (on_gpu) {
    params = dos_train::cuda_alloc(n * esz);
    grads = dos_train::cuda_alloc(n * esz);
    dos_train::cuda_copy_to_device(params, init.data(), n * esz);
  }
#endif
  if (!on_gpu) {
    params = host_alloc(n * esz);
    grads = host_alloc(n * esz);
    std::memcpy(params, init.data(), n * esz);
  }
  std::vector<char>().swap(init);

  std::vector<dos::TensorView> views;
  for (const ShardTensor& st : tensors) {
    const std::size_t off = (st.global_begin - range.begin) * esz;
    views.push_back({static_cast<char*>(params) + off, static_cast<char*>(grads) + off, st.count});
  }
  dos::OptimizerOptions oo;
  oo.adam = hyper;
  oo.subgroup_size = subgroup;
  oo.dtype = dtype;
  oo.memory = on_gpu ? dos::MemoryKind::cuda : dos::MemoryKind::host;
  oo.recalibrate = a.recalibrate;
  if (!a.rates.empty()) oo.rates = rates;  // the model's plans use them instead of calibrating
  oo.verbose = !a.quiet;
  oo.gpu_resident_budget = resident_budget;
  oo.gpu_update_budget = update_budget;
  oo.stream_lookahead = unsigned(a.stream_lookahead);
  oo.eager_writeback = a.writeback == "eager";
  oo.native_grads = a.grad_transfer == "native";
  oo.urgent_writeback = a.urgent_writeback;
  oo.submit_order = a.submit_order == "plan" ? dos::SubmitOrder::plan : dos::SubmitOrder::cpu_first;
  // the node's ranks calibrate (when they do) at the same time: the rates then include the other
  // ranks' DMA and CPU Adam on the shared host memory
  if (dp) g_comm->all_ok(true);
  dos::Optimizer opt(rt, views, oo);
  // Forward and backward emulated with the model's GEMMs (--emulate-compute): cuBLAS on the GPU,
  // a scaled-down stand-in on the CPU.
  std::unique_ptr<dos_train::ComputeEmulator> compute;
  if (a.emulate_compute) {
    const bool gpu_compute = on_gpu;
    compute = std::make_unique<dos_train::ComputeEmulator>(
        dos_train::forward_gemms(cfg), a.tokens,
        gpu_compute ? dos_train::make_cuda_backend(dtype) : dos_train::make_cpu_backend(), gpu_compute ? 1 : a.cpu_scale);
    std::printf("compute: forward and backward emulated with %s GEMMs of %zu layers (+ head), %lld tokens per "
                "iteration%s\n",
                gpu_compute ? "cuBLAS" : "CPU stand-in", std::size_t(cfg.layers), (long long)compute->tokens(),
                gpu_compute ? "" : (" (every dimension divided by " + std::to_string(a.cpu_scale) + ")").c_str());
  }
  if (!a.timeline.empty()) opt.set_timeline(true);
  dos::CheckpointInfo job;
  job.model = cfg.name;
  job.architecture = dos_train::describe_architecture(cfg);
  job.params_total = total;
  job.begin = range.begin;
  job.end = range.end;
  job.rank = rank;
  job.world = world;
  job.subgroup_size = subgroup;
  job.dtype = a.dtype;
  job.seed = a.seed;
  job.grad_parts = parts;
  std::int64_t first_iteration = 0;
  if (!a.resume.empty()) {
    first_iteration = dos::load_checkpoint(a.resume, opt, job).iteration;
    if (dp) g_comm->all_ok(true);  // "resumed" only once every rank has (a rank that failed aborts the job)
    std::printf("resumed from %s after iteration %lld\n", a.resume.c_str(), (long long)first_iteration);
  }

  // ---- iterations ------------------------------------------------------------------------------
  if (rt.plan() && rt.plan()->needs().resident == dos::ResidentState::own && rt.cuda_workers() > 0) {
    const auto plan = opt.next_plan();  // a plan that keeps its own subgroups resident: say which
    std::size_t ncpu = 0, pcpu = 0;
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (plan[i] == dos::PlanSide::cpu) ++ncpu, pcpu += opt.subgroup_size(i);
    std::printf("%s: %zu of %zu subgroups on the CPU (%.3f of the subgroups, %.3f of the parameters); the other %zu "
                "keep their state resident on the GPU\n",
                rt.policy().c_str(), ncpu, plan.size(), double(ncpu) / double(plan.size()), double(pcpu) / double(n),
                plan.size() - ncpu);
  }
  if (!a.k.empty() || !a.gpu_fraction.empty()) {
    dos::PlanOverride o;
    o.kind = a.k.empty() ? dos::PlanOverride::fraction : dos::PlanOverride::stride;
    o.value = parse_fraction(a.k.empty() ? a.gpu_fraction : a.k, a.k.empty() ? "--gpu-fraction" : "--k");
    opt.set_plan_override(o);
  }
  if (rt.model_policy() && rt.cuda_workers() > 0) {
    const dos::Rates& r = opt.rates();
    const dos::Execution ex = opt.execution();
    const dos::Choice c = dos::choose_plan_simulated(opt.workload(), r, ex);
    const dos::StrideChoice k = dos::choose_stride_simulated(opt.workload(), r, ex);
    const std::size_t ns = opt.num_subgroups();
    std::printf("model: U_c %.2f Gparams/s alone, %.2f under DMA; U_g %.1f; D_c %.1f; B %.1f GB/s H2D, %.1f GB/s D2H\n"
                "model: best plan streams %zu of %zu subgroups (%.2f s predicted, %s-bound); best stride k = %zu "
                "(%.2f s); all on the CPU %.2f s; all streamed %.2f s; lower bound %.2f s\n",
                r.U_c / 1e9, r.U_c_dma / 1e9, r.U_g / 1e9, r.D_c / 1e9, r.B_h2d / 1e9, r.B_d2h / 1e9, c.streamed,
                ns, c.predicted.total, c.predicted.bound_by().c_str(), k.k, k.predicted.total,
                dos::simulate_phase(opt.workload(), dos::spread_plan(ns, 0), r, ex).total,
                dos::simulate_phase(opt.workload(), dos::spread_plan(ns, ns), r, ex).total,
                dos::lower_bound(opt.workload(), opt.calibrated_rates(), rt.cpu_workers()));
  }
  nlohmann::ordered_json iters = nlohmann::ordered_json::array();
  std::int64_t it = first_iteration;  // iterations numbered across resumes: the gradients depend on it
  std::pair<std::vector<dos::TimelineTask>, std::vector<dos::BusSample>> last_timeline;
  // Data parallelism's buffers, each at most one shard: a bucket of this rank's gradient
  // contribution (fp32) and of 16-bit parameters, the summed shard (fp32), the 16-bit staging.
  std::vector<dos::ShardRange> ranges;
  std::size_t largest_shard = 0;
  for (std::size_t r = 0; r < world; ++r) {
    ranges.push_back(dos::shard_range(total, r, world));
    largest_shard = std::max(largest_shard, ranges.back().end - ranges.back().begin);
  }
  const bool host_buckets = (parts > 1 || dp) && !dcomm;
  std::vector<float> bucket32(dp && !dcomm ? largest_shard : 0), shard32(host_buckets ? n : 0);
  std::vector<char> bucket16(dp && !dcomm ? largest_shard * esz : 0), staging16(host_buckets ? n * esz : 0);
  // with NCCL, buckets in GPU memory of at most kChunk elements: a contribution and the received
  // sum (fp32), the 16-bit parameters (640 MiB of GPU memory in all for bf16, whatever the model;
  // outside StarPU's memory cap and the GPU budgets)
  constexpr std::size_t kChunk = std::size_t(1) << 26;
  const std::size_t chunk = std::min(kChunk, largest_shard);
  struct DeviceBuffer {
    void* p = nullptr;
    ~DeviceBuffer() {
#if defined(DOS_HAVE_CUDA)
      if (p) dos_train::cuda_free(p);
#endif
    }
  } d_send32, d_recv32, d_bucket16;
#if defined(DOS_HAVE_CUDA)
  if (dcomm) {
    d_send32.p = dos_train::cuda_alloc(chunk * sizeof(float));
    d_recv32.p = dos_train::cuda_alloc(chunk * sizeof(float));
    d_bucket16.p = dos_train::cuda_alloc(chunk * esz);
  }
#endif
  // Runs `count` iterations; returns their update seconds.
  auto run_iterations = [&](int count, const std::string& label) {
    std::vector<dos::StepStats> out;
    for (int i = 0; i < count; ++i) {
      ++it;
      const auto t_iter = std::chrono::steady_clock::now();
      dos_train::ComputeTimes ct;
      if (compute) ct = compute->run();
      double comm_s = 0;
      if (dcomm) {
#if defined(DOS_HAVE_CUDA)
        // The same through NCCL, GPU to GPU: this rank's contribution to each shard made on its GPU,
        // reduced (fp32) to the shard's owner, rounded to the model's dtype into its gradients.
        float *send = static_cast<float*>(d_send32.p), *recv = static_cast<float*>(d_recv32.p);
        for (std::size_t r = 0; r < world; ++r)
          for (std::size_t off = 0; off < ranges[r].end - ranges[r].begin; off += chunk) {
            const std::size_t count = std::min(chunk, ranges[r].end - ranges[r].begin - off);
            dos_train::fill_grad_parts_cuda(send, count, a.seed, std::uint64_t(it), ranges[r].begin + off,
                                            my_parts_begin, my_parts_end, parts);
            const auto c1 = std::chrono::steady_clock::now();
            dcomm->reduce_sum(send, recv, count, int(r));
            comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c1).count();
            if (r == rank) dos_train::store_from_f32_cuda(static_cast<char*>(grads) + off * esz, dtype, recv, count);
          }
#endif
      } else if (parts > 1 || dp) {
        // The gradient is the sum of `parts` ranks' contributions: under MPI, this rank's, reduced
        // shard by shard (a bucket of one shard at a time) to the shard's owner; in one process
        // (--grad-parts), all of them for this shard.
        if (dp) {
          for (std::size_t r = 0; r < world; ++r) {
            const dos::ShardRange& rr = ranges[r];
            dos_train::fill_grad_parts_host(bucket32.data(), rr.end - rr.begin, a.seed, std::uint64_t(it), rr.begin,
                                            my_parts_begin, my_parts_end, parts);
            const auto c1 = std::chrono::steady_clock::now();
            g_comm->reduce_sum(bucket32.data(), shard32.data(), rr.end - rr.begin, int(r));
            comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c1).count();
          }
        } else {
          dos_train::fill_grad_parts_host(shard32.data(), n, a.seed, std::uint64_t(it), range.begin, 0, parts, parts);
        }
        std::vector<char>& g16 = staging16;
#pragma omp parallel for schedule(static)
        for (std::size_t k = 0; k < n; ++k) dos::store_from_f32(on_gpu ? g16.data() : static_cast<char*>(grads), dtype, k, shard32[k]);
#if defined(DOS_HAVE_CUDA)
        if (on_gpu) dos_train::cuda_copy_to_device(grads, g16.data(), n * esz);
#endif
      } else {
#if defined(DOS_HAVE_CUDA)
        if (on_gpu) dos_train::fill_grads_cuda(grads, dtype, n, a.seed, std::uint64_t(it), range.begin);
#endif
        if (!on_gpu) dos_train::fill_grads_host(grads, dtype, n, a.seed, std::uint64_t(it), range.begin);
      }
      const dos::StepStats s = opt.step();
      if (dcomm) {
#if defined(DOS_HAVE_CUDA)
        const auto c1 = std::chrono::steady_clock::now();  // as below, GPU to GPU
        for (std::size_t r = 0; r < world; ++r)
          for (std::size_t off = 0; off < ranges[r].end - ranges[r].begin; off += chunk) {
            const std::size_t bytes = std::min(chunk, ranges[r].end - ranges[r].begin - off) * esz;
            dcomm->broadcast(static_cast<const char*>(params) + off * esz, d_bucket16.p, bytes, int(r));
          }
        comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c1).count();
#endif
      } else if (dp) {
        // The all-gather of the updated 16-bit parameters, shard by shard from each owner: what
        // forward needs next. Forward being emulated, each shard goes through one bucket and is not
        // kept (a real model would receive it into its parameters).
#if defined(DOS_HAVE_CUDA)
        if (on_gpu) dos_train::cuda_copy_to_host(staging16.data(), params, n * esz);
#endif
        const char* mine = on_gpu ? staging16.data() : static_cast<const char*>(params);
        const auto c1 = std::chrono::steady_clock::now();
        for (std::size_t r = 0; r < world; ++r) {
          const std::size_t bytes = (ranges[r].end - ranges[r].begin) * esz;
          if (r == rank) std::memcpy(bucket16.data(), mine, bytes);
          g_comm->broadcast(bucket16.data(), bytes, int(r));
        }
        comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c1).count();
      }
      const double iter_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_iter).count();
      const std::uint64_t peak = compute ? std::max<std::uint64_t>(ct.peak_bytes, compute->used_bytes()) : 0;
      // model FLOPs as the issue (and the usual MFU figure) counts them: 6 x parameters x tokens
      // (the CPU stand-in's shapes are scaled down: its figure is the FLOPs it did per second)
      const double tflops = !compute ? 0.0
                            : on_gpu ? 6.0 * double(total) * double(compute->tokens()) / iter_s / 1e12
                                     : ct.flops / iter_s / 1e12;
      out.push_back(s);
      if (!s.timeline.empty() || !s.bus.empty()) last_timeline = {s.timeline, s.bus};
      const double gps = double(s.params) / s.seconds / 1e9;
      const double cpu_busy = rt.cpu_workers() ? s.cpu_busy_seconds / (s.seconds * rt.cpu_workers()) : 0.0;
      const double gpu_busy = rt.cuda_workers() ? s.gpu_busy_seconds / (s.seconds * rt.cuda_workers()) : 0.0;
      char model[160] = "";
      if (s.predicted_seconds > 0)
        std::snprintf(model, sizeof model, "  predicted %.4f s (%s)  lower bound %.4f s", s.predicted_seconds,
                      s.bound_by.c_str(), s.lower_bound_seconds);
      char comp[260] = "";
      if (compute)
        std::snprintf(comp, sizeof comp, "  forward %.4f s  backward %.4f s  iteration %.4f s  peak %s %.3g GB  %.3g model TFLOPs",
                      ct.forward, ct.backward, iter_s, on_gpu ? "GPU" : "host (activations)", peak / 1e9, tflops);
      if (dp) {
        const std::size_t used = std::strlen(comp);
        std::snprintf(comp + used, sizeof comp - used, "  comm %.4f s (%zu ranks)", comm_s, world);
      }
      std::printf("iter %3lld%s  update %8.4f s  %7.3f Gparams/s  subgroups cpu %zu gpu %zu (plan: %zu streamed, %zu "
                  "resident)%s  H2D %.3f GB %.1f GB/s  D2H %.3f GB %.1f GB/s  busy cpu %3.0f%% gpu %3.0f%%%s\n",
                  (long long)it, label.c_str(), s.seconds, gps, s.subgroups_cpu, s.subgroups_gpu, s.planned_streamed,
                  s.planned_resident, model, s.bytes_h2d / 1e9, s.bytes_h2d / s.seconds / 1e9, s.bytes_d2h / 1e9,
                  s.bytes_d2h / s.seconds / 1e9, 100 * cpu_busy, 100 * gpu_busy, comp);
      nlohmann::ordered_json row = {{"iteration", it}, {"label", label}, {"update_seconds", s.seconds}, {"gparams_per_s", gps},
                       {"subgroups_cpu", s.subgroups_cpu}, {"subgroups_gpu", s.subgroups_gpu},
                       {"planned_streamed", s.planned_streamed}, {"planned_resident", s.planned_resident},
                       {"plan", dos::plan_letters(s.plan)}, {"placement", dos::plan_letters(s.placement)},
                       {"predicted_seconds", s.predicted_seconds}, {"lower_bound_seconds", s.lower_bound_seconds},
                       {"bytes_h2d", s.bytes_h2d}, {"bytes_d2h", s.bytes_d2h},
                       {"cpu_busy_fraction", cpu_busy}, {"gpu_busy_fraction", gpu_busy},
                       {"starpu_gpu_bytes_end", s.gpu_bytes_end}, {"window_peak_bytes", s.window_peak_bytes}};
      if (dp) {
        row["comm_seconds"] = comm_s;
        row["comm_backend"] = dcomm ? dcomm->name() : g_comm->name();
      }
      if (compute) {
        row["forward_seconds"] = ct.forward;
        row["backward_seconds"] = ct.backward;
        row["iteration_seconds"] = iter_s;
        row["peak_gpu_bytes"] = peak;
        row["model_tflops"] = tflops;
      }
      iters.push_back(row);
      std::fflush(stdout);
    }
    return out;
  };
  // The median over the iterations after the first of a run (the first pays allocations).
  auto median_of = [](const std::vector<dos::StepStats>& v) {
    std::vector<double> t;
    for (std::size_t i = v.size() > 1 ? 1 : 0; i < v.size(); ++i) t.push_back(v[i].seconds);
    std::sort(t.begin(), t.end());
    return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
  };
  nlohmann::ordered_json sweep = nlohmann::ordered_json::array();
  if (!a.sweep.empty()) {
    struct Row {
      std::string entry;
      std::size_t streamed;
      double median, predicted, bound;
    };
    std::vector<Row> rows;
    for (const std::string& e : a.sweep) {
      dos::PlanOverride o;
      if (e != "model") {
        o.kind = dos::PlanOverride::fraction;
        o.value = parse_fraction(e, "--sweep");
      }
      opt.set_plan_override(o);
      const auto st = run_iterations(a.iterations, " [" + e + "]");
      rows.push_back({e, st.back().planned_streamed, median_of(st), st.back().predicted_seconds,
                      st.back().lower_bound_seconds});
    }
    double best = rows[0].median;
    for (const Row& r : rows) best = std::min(best, r.median);
    std::printf("sweep (%zu parameters, %zu subgroups, median of iterations 2..%d of each):\n", n, opt.num_subgroups(),
                a.iterations);
    std::printf("  %-8s %9s %12s %12s %12s %10s\n", "fraction", "streamed", "update s", "predicted s", "lower bound",
                "vs fastest");
    for (const Row& r : rows) {
      std::printf("  %-8s %9zu %12.4f %12.4f %12.4f %9.1f%%\n", r.entry.c_str(), r.streamed, r.median, r.predicted,
                  r.bound, 100.0 * (r.median / best - 1.0));
      sweep.push_back({{"entry", r.entry}, {"streamed", r.streamed}, {"update_seconds_median", r.median},
                       {"predicted_seconds", r.predicted}, {"lower_bound_seconds", r.bound}});
    }
  }
  const std::vector<dos::StepStats> main_run = a.sweep.empty() ? run_iterations(a.iterations, "") : std::vector<dos::StepStats>{};
  const double median = main_run.empty() ? 0.0 : median_of(main_run);
  double mean = 0;
  for (std::size_t i = main_run.size() > 1 ? 1 : 0; i < main_run.size(); ++i) mean += main_run[i].seconds;
  if (!main_run.empty()) mean /= double(main_run.size() > 1 ? main_run.size() - 1 : 1);
  if (!main_run.empty())
    std::printf("summary: %zu parameters, %zu subgroups, %d iterations: update median %.4f s, mean %.4f s "
                "(iterations %s), %.3f Gparams/s at the median\n",
                n, opt.num_subgroups(), a.iterations, median, mean, main_run.size() > 1 ? "2.." : "1",
                double(n) / median / 1e9);
  // medians of the compute figures over the same iterations (after the first)
  auto median_field = [&](const char* key) {
    std::vector<double> v;
    for (std::size_t i = iters.size() > 1 ? 1 : 0; i < iters.size(); ++i)
      if (iters[i].contains(key)) v.push_back(iters[i][key].get<double>());
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  if (compute && !main_run.empty())
    std::printf("summary: iteration median %.4f s (forward %.4f s, backward %.4f s, update %.4f s), %.3g model TFLOPs, "
                "peak %s memory %.3g GB\n",
                median_field("iteration_seconds"), median_field("forward_seconds"), median_field("backward_seconds"),
                median, median_field("model_tflops"), on_gpu ? "GPU" : "host (activations)", median_field("peak_gpu_bytes") / 1e9);

  // A diverged run (master parameters inf or NaN) is reported, and nothing of it is saved.
  std::size_t nonfinite = 0, first_bad = 0;
  float first_value = 0;
  opt.with_host_state([&](const std::vector<dos::Optimizer::HostState>& state) {
    std::size_t at = range.begin;
    for (const dos::Optimizer::HostState& sg : state) {
      for (std::size_t k = 0; k < sg.size; ++k)
        if (!std::isfinite(sg.master[k]) && nonfinite++ == 0) first_bad = at + k, first_value = sg.master[k];
      at += sg.size;
    }
  });
  if (nonfinite > 0)
    fail("after iteration " + std::to_string(it) + ", " + std::to_string(nonfinite) + " of the " + std::to_string(n) +
         " master parameters are inf or NaN (the first, element " + std::to_string(first_bad) + ", is " +
         std::to_string(first_value) + "): the run diverged (lower --lr or --weight-decay); nothing was saved");

  // Outputs are written to temporary files first and put in place together: a failure leaves
  // neither behind.
  std::unique_ptr<dos::PendingFile> params_file, report_file;
  std::vector<float> master;
  if (!a.save_params.empty()) {
    master.resize(n);
    opt.read_master(master.data());
    std::vector<dos::SafetensorOut> out;
    std::map<std::string, std::string> meta = {{"model", cfg.name}, {"shard", a.shard},
                                               {"format", "fp32 master parameters after the last iteration"}};
    for (const ShardTensor& st : tensors) {
      const std::vector<std::int64_t> shape = st.whole() ? st.t.shape : std::vector<std::int64_t>{std::int64_t(st.count)};
      if (!st.whole()) meta[st.t.name + ".offset"] = std::to_string(st.tensor_offset);
      out.push_back({st.t.name, "F32", shape, master.data() + (st.global_begin - range.begin), st.count * sizeof(float)});
    }
    params_file = dos::prepare_safetensors(a.save_params, out, meta);
  }
  if (!a.report.empty()) {
    nlohmann::ordered_json rep = {
        {"model", cfg.name}, {"arch", cfg.arch}, {"params_total", total}, {"params", n}, {"shard", a.shard},
        {"dtype", a.dtype}, {"optimizer", a.optimizer}, {"subgroup_size", subgroup},
        {"subgroups", opt.num_subgroups()}, {"policy", rt.policy()}, {"starpu_policy", rt.running_policy()},
        {"cpu_workers", rt.cpu_workers()}, {"cuda_workers", rt.cuda_workers()}, {"cpu_threads", rt.cpu_threads()},
        {"caller_memory", on_gpu ? "cuda" : "host"}, {"seed", a.seed}, {"iterations", iters},
        {"sweep", sweep}};
    if (!main_run.empty()) {  // a sweep's figures are in "sweep"
      rep["summary"] = {{"update_seconds_median", median}, {"update_seconds_mean", mean},
                        {"gparams_per_s_median", double(n) / median / 1e9}};
      if (compute) {
        rep["summary"]["iteration_seconds_median"] = median_field("iteration_seconds");
        rep["summary"]["forward_seconds_median"] = median_field("forward_seconds");
        rep["summary"]["backward_seconds_median"] = median_field("backward_seconds");
        rep["summary"]["model_tflops_median"] = median_field("model_tflops");
        rep["summary"]["peak_gpu_bytes_median"] = median_field("peak_gpu_bytes");
        rep["summary"]["tokens_per_iteration"] = compute->tokens();
      }
    }
    rep["gpu_resident_budget"] = resident_budget;
    rep["gpu_update_budget"] = update_budget;
    rep["stream_lookahead"] = a.stream_lookahead;
    rep["writeback"] = a.writeback;
    rep["grad_transfer"] = a.grad_transfer;
    rep["urgent_writeback"] = a.urgent_writeback;
    rep["submit_order"] = a.submit_order;
    const std::string text = rep.dump(2) + "\n";
    report_file = std::make_unique<dos::PendingFile>(a.report, dos::Chunks{{text.data(), text.size()}});
  }
  if (!a.save_state.empty()) {
    job.iteration = it;
    dos::CheckpointRanks ranks_io;
    if (dp) {
      ranks_io.all_ok = [](bool ok) { return g_comm->all_ok(ok); };
      ranks_io.from_rank0 = [](long long v) {
        g_comm->broadcast(&v, sizeof v, 0);
        return v;
      };
    }
    dos::save_checkpoint(a.save_state, opt, job, dp ? &ranks_io : nullptr);
    std::printf("saved the optimizer state after iteration %lld to %s\n", (long long)it, a.save_state.c_str());
  }
  std::unique_ptr<dos::PendingFile> timeline_file;
  if (!a.timeline.empty()) {
    nlohmann::ordered_json tasks = nlohmann::ordered_json::array(), bus = nlohmann::ordered_json::array();
    for (const dos::TimelineTask& t : last_timeline.first)
      tasks.push_back({{"lane", t.lane}, {"what", t.what}, {"subgroup", t.subgroup}, {"start", t.start}, {"end", t.end}});
    for (const dos::BusSample& b : last_timeline.second) bus.push_back({b.t, b.h2d, b.d2h});
    nlohmann::ordered_json tl = {{"policy", rt.policy()}, {"iteration", it}, {"params", n},
                                 {"subgroups", opt.num_subgroups()}, {"tasks", tasks},
                                 {"bus_columns", {"seconds", "h2d_bytes", "d2h_bytes"}}, {"bus", bus}};
    const std::string text = tl.dump() + "\n";
    timeline_file = std::make_unique<dos::PendingFile>(a.timeline, dos::Chunks{{text.data(), text.size()}});
  }
  if (params_file) params_file->commit();
  if (report_file) report_file->commit();
  if (timeline_file) timeline_file->commit();
  if (params_file)
    std::printf("saved %zu fp32 master parameters to %s%s\n", n, a.save_params.c_str(),
                dp ? " (each rank its own shard's file: .rank-RRRRR-of-WWWWW)" : "");
#if defined(DOS_HAVE_CUDA)
  if (on_gpu) {
    dos_train::cuda_free(params);
    dos_train::cuda_free(grads);
  }
#endif
  if (!on_gpu) {
    std::free(params);
    std::free(grads);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "dos-train: runs training iterations of a transformer's optimizer update phase on the Deep Optimizer "
      "States runtime. Forward and backward are emulated: deterministic gradients from --seed (normal, std 1e-3) "
      "are written into the model's gradient buffers (GPU memory when there is a CUDA worker). Prints one line per "
      "iteration and a summary."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later option wins
  std::string presets;
  for (const auto& p : dos_train::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  app.add_option("--preset", a.preset, "model preset: " + presets)->capture_default_str();
  app.add_option("--config", a.config, "Hugging Face config.json of the model (overrides --preset)");
  app.add_option("--iterations,-n", a.iterations, "training iterations to run (>= 1)")->capture_default_str();
  app.add_option("--subgroup-size", a.subgroup_size, "elements per subgroup (>= 1; 1e8 notation accepted)")->capture_default_str();
  std::string plans;
  for (const dos::PlanEntry& e : dos::plan_registry()) plans += std::string(plans.empty() ? "" : "; ") + e.usage + ": " + e.summary;
  std::string starpu_policies;
  for (const auto* p : dos::registered_starpu_policies()) starpu_policies += std::string(", ") + p->policy_name;
  app.add_option("--policy", a.policy,
                 "scheduling policy: a plan (" + plans + "), or a StarPU policy that places the tasks itself (dmda, "
                 "dmdas, eager, lws, ..." + starpu_policies + "). Default: $STARPU_SCHED if set, else cpu");
  app.add_option("--dtype", a.dtype, "dtype of the model's parameters and gradients: bf16, fp16, fp32")->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "adamw (torch.optim.AdamW) or adam (torch.optim.Adam, L2 decay)")->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate")->capture_default_str();
  app.add_option("--beta1", a.beta1, "Adam beta1, in [0, 1)")->capture_default_str();
  app.add_option("--beta2", a.beta2, "Adam beta2, in [0, 1)")->capture_default_str();
  app.add_option("--eps", a.eps, "Adam eps (>= 0)")->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "weight decay (>= 0)")->capture_default_str();
  app.add_option("--seed", a.seed_text, "seed of the initial parameters and the emulated gradients (0 to 2^64-1)")
      ->capture_default_str();
  app.add_option("--shard", a.shard, "R/W: run rank R's 1/W of the parameters (ZeRO partitioning of the flat parameters)")
      ->capture_default_str();
  app.add_option("--device", a.device, "where the model's parameters and gradients live: auto (GPU if any), host, cuda")
      ->capture_default_str();
  app.add_option("--report", a.report, "write the per-iteration figures and the summary to this JSON file");
  app.add_option("--save-params", a.save_params, "write the final fp32 master parameters to this safetensors file");
  app.add_option("--cpu-threads", a.cpu_threads,
                 "cores for CPU Adam, shared among the CPU workers' OpenMP teams (0: $OMP_NUM_THREADS, else all "
                 "cores but one per CUDA worker)")
      ->capture_default_str();
  app.add_option("--cpu-workers", a.cpu_workers,
                 "StarPU CPU workers (0: $STARPU_NCPU if set, else 1 worker running an OpenMP team; N: N workers "
                 "sharing the --cpu-threads cores, subgroups spread over them)")
      ->capture_default_str();
  app.add_option("--ncuda", a.ncuda, "CUDA workers (-1: one per GPU, 0: none)")->capture_default_str();
  app.add_flag("--quiet,-q", a.quiet, "do not print the runtime's set-up line");
  app.add_option("--k", a.k, "with --policy dos: force the paper's stride k (one subgroup in k streamed: k-1, 2k-1, ...)");
  app.add_option("--gpu-fraction", a.gpu_fraction,
                 "with --policy dos: force this fraction of the subgroups (0..1, or a/b) to be streamed through the GPU, "
                 "spread evenly");
  app.add_option("--sweep", a.sweep,
                 "with --policy dos: run --iterations iterations for each streamed fraction given (0..1 or a/b; "
                 "'model' for the model's own choice), in this one process, and print a table")
      ->delimiter(',');
  app.add_option("--save-state", a.save_state,
                 "after the last iteration, write the whole optimizer state (fp32 master, exp_avg, exp_avg_sq, step "
                 "per subgroup) to this folder (safetensors + index.json; the previous checkpoint stays intact until "
                 "the new one is complete)");
  app.add_option("--resume", a.resume,
                 "start from the checkpoint in this folder (same model, --subgroup-size, --dtype, --seed and "
                 "--grad-parts; any number of ranks: the state is re-sharded): the run continues exactly as if it "
                 "had not stopped");
  app.add_option("--gpu-resident-budget", a.gpu_resident_budget,
                 "GPU memory the optimizer state may keep between iterations (e.g. 10GB; default: none kept, pure "
                 "offload). dos keeps the last subgroups that fit resident; static:R must fit its GPU share in it");
  app.add_option("--gpu-update-budget", a.gpu_update_budget,
                 "GPU memory the update phase may use at once (e.g. 40GB; default: no limit); StarPU's GPU memory is "
                 "capped at the two budgets together, the rest is left to forward and backward");
  app.add_option("--stream-lookahead", a.stream_lookahead,
                 "streamed subgroups whose state is prefetched ahead (0: StarPU's prefetch when a task is pushed)")
      ->capture_default_str();
  app.add_option("--writeback", a.writeback,
                 "eager: each streamed subgroup's state goes home as soon as it is updated; end: all at the end of the "
                 "phase")->capture_default_str();
  app.add_option("--grad-transfer", a.grad_transfer,
                 "how the gradients of CPU-updated subgroups cross PCIe: fp32 (converted on the GPU) or native (in "
                 "the model's dtype, widened by the CPU's Adam kernel: half the bytes for bf16/fp16)")
      ->capture_default_str();
  app.add_flag("--urgent-writeback", a.urgent_writeback,
               "push the CPU-updated subgroups' parameter write-backs ahead of the queued GPU work (measured "
               "20-31% slower on the GPU machine: for experiments; see README)");
  app.add_option("--submit-order", a.submit_order,
                 "plan: the subgroups' tasks are submitted in subgroup order; cpu-first: the CPU-updated ones "
                 "before the streamed ones (when the GPU update budget holds both). Same results either way")
      ->check(CLI::IsMember({"cpu-first", "plan"}))
      ->capture_default_str();
  app.add_option("--timeline", a.timeline,
                 "write the last iteration's tasks (per worker) and PCIe byte samples to this JSON file");
  app.add_option("--grad-parts", a.grad_parts,
                 "the emulated gradient is the sum of this many data-parallel ranks' contributions (quantised so that "
                 "the sum is exact): a one-process run with --grad-parts W gives the bits of a W-rank MPI job; under "
                 "MPI (default: the number of ranks) rank r adds parts [r*P/W, (r+1)*P/W)");
  app.add_option("--comm", a.comm,
                 "the data-parallel collectives under MPI: nccl (GPU buffers, GPU to GPU), mpi (through host memory), "
                 "auto (nccl when every rank's buffers are on a GPU and the build has NCCL)")
      ->capture_default_str();
  app.add_flag("--emulate-compute", a.emulate_compute,
               "emulate forward and backward with the model's GEMMs (cuBLAS; a scaled-down CPU stand-in without a "
               "GPU), activations allocated in forward and freed in backward; reports forward, backward, iteration "
               "seconds, peak GPU memory and model TFLOPs");
  app.add_option("--tokens", a.tokens, "tokens per iteration for --emulate-compute (micro-batch x sequence)")
      ->capture_default_str();
  app.add_option("--cpu-scale", a.cpu_scale, "--emulate-compute without a GPU: divide every dimension by this")
      ->capture_default_str();
  app.add_flag("--plan-only", a.plan_only,
               "print the plan of --policy for the first iteration (one letter per subgroup), its simulated time and "
               "the lower bound with --rates, and exit: no StarPU, no GPU needed. The caller's buffers are taken to be "
               "on the GPU unless --device host; the GPU budgets, --submit-order and --stream-lookahead count");
  app.add_option("--rates", a.rates,
                 "the model's rates instead of calibrating: U_c,U_c_dma,U_g,D_c,B_h2d,B_d2h in Gparams/s (4) and GB/s "
                 "(2), as the 'model:' line prints them, or the path of a rates file (the calibration cache's JSON, "
                 "params/s and bytes/s)");
  app.add_flag("--recalibrate", a.recalibrate,
               "with --policy dos or static:R: measure the model's rates again instead of reading the cached ones");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (app.count("--config") && a.config.empty()) {
    std::fprintf(stderr, "dos-train: error: --config needs the path of a config.json file, got an empty one\n");
    return 1;
  }
  const std::pair<const char*, const std::string*> paths[] = {{"--report", &a.report},
                                                               {"--save-params", &a.save_params},
                                                               {"--timeline", &a.timeline},
                                                               {"--save-state", &a.save_state},
                                                               {"--resume", &a.resume}};
  for (const auto& [opt, value] : paths)
    if (app.count(opt) && value->empty()) {
      std::fprintf(stderr, "dos-train: error: %s needs a path, got an empty one\n", opt);
      return 1;
    }
  try {
    if (dos::launched_by_mpi() && dos::have_mpi()) {
      g_comm = dos::make_mpi_comm();
      if (g_comm->rank() != 0 && g_comm->size() > 1 && !std::freopen("/dev/null", "w", stdout))
        std::fprintf(stderr, "dos-train: warning: rank %d could not silence its standard output\n", g_comm->rank());
    }
    if (!g_comm && dos::launcher_tasks() > 1)  // several copies, each training the whole model alone
      throw std::runtime_error(
          "started as " + std::to_string(dos::launcher_tasks()) + " tasks without MPI (" +
          (dos::have_mpi() ? std::string("srun without --mpi=pmix or pmi2?")
                           : std::string("this dos-train was built without MPI: install libopenmpi-dev and rebuild "
                                         "with scripts/setup.sh build")) +
          "): each would train the whole model and overwrite the others' files");
    const int rc = run(a);
    g_comm.reset();  // MPI_Finalize
    return rc;
  } catch (const std::exception& e) {
    if (g_comm && g_comm->size() > 1) {
      std::fprintf(stderr, "dos-train: error on rank %d of %d: %s\n", g_comm->rank(), g_comm->size(), e.what());
      std::fflush(stderr);
      // The other ranks may be waiting in a collective: end the job. A failure every rank learns of
      // (a checkpoint's) is reported by the rank it happened on too: give its message a moment to
      // get out before the abort takes the job down.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      g_comm->abort(1);
    }
    std::fprintf(stderr, "dos-train: error: %s\n", e.what());
    return 1;
  }
}
