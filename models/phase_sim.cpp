// The event-driven simulation of one update phase (phase_sim.h).
#include "phase_sim.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace dos {

std::size_t subgroup_footprint(const Workload& w, std::size_t n, PlanSide side) {
  if (side == PlanSide::cpu)
    return w.caller_on_gpu ? n * ((w.cpu_grads_staged_on_gpu ? w.grad_bytes : 0) + (w.cpu_params_staged_on_gpu ? w.param_bytes : 0))
                           : 0;
  const bool staging = !w.caller_on_gpu;  // on the GPU with the caller there: the direct path, nothing staged
  const std::size_t state = subgroup_state_bytes(w, n);
  return (side == PlanSide::gpu_streamed ? state : 0) + n * (staging ? w.grad_bytes + w.param_bytes : 0);
}

namespace {

/// submits_cpu_first's rule, given the plan's figures: whether any subgroup is streamed, the
/// footprints (subgroup_footprint, bytes) of the subgroups not streamed summed, and the largest
/// footprint of all.
bool cpu_first_rule(const Execution& e, bool any_streamed, std::size_t others, std::size_t largest) {
  return e.order == SubmitOrder::cpu_first && any_streamed &&
         (e.update_budget == 0 || others + (e.lookahead + 1) * largest <= e.update_budget);
}

/// submission_order written into `order` (its memory kept).
void fill_submission_order(const std::vector<PlanSide>& plan, bool cpu_first, std::vector<std::size_t>& order) {
  order.clear();
  order.reserve(plan.size());
  for (int pass = 0; pass < (cpu_first ? 2 : 1); ++pass)
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (!cpu_first || (pass == 0) != (plan[i] == PlanSide::gpu_streamed)) order.push_back(i);
}

}  // namespace

bool submits_cpu_first(const Workload& w, const std::vector<PlanSide>& plan, const Execution& e) {
  if (e.order != SubmitOrder::cpu_first) return false;
  std::size_t largest = 0, others = 0;
  bool any_streamed = false;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const std::size_t fp = subgroup_footprint(w, w.sizes[i], plan[i]);
    largest = std::max(largest, fp);
    if (plan[i] == PlanSide::gpu_streamed)
      any_streamed = true;
    else
      others += fp;
  }
  return cpu_first_rule(e, any_streamed, others, largest);
}

std::vector<std::size_t> submission_order(const std::vector<PlanSide>& plan, bool cpu_first) {
  std::vector<std::size_t> order;
  fill_submission_order(plan, cpu_first, order);
  return order;
}

double cpu_team_share(const Execution& e, std::size_t n) {
  if (e.cpu_team_threads <= 1 || e.cpu_work_item == 0 || n == 0) return 1.0;
  const double longest = double(e.cpu_team_threads) * double(std::min(n, e.cpu_work_item));  // one thread's item
  return double(n) >= longest ? 1.0 : double(n) / longest;
}

const char* Simulation::busiest() const { return busiest_resource(cpu, h2d, d2h, gpu); }

namespace {

// The pieces of work of one subgroup, in the order they run (phase_sim.h).
enum class Stage { gather, grad_down, adam_cpu, param_up, scatter, state_up, adam_gpu, state_down, done };

struct Sg {
  std::size_t n = 0;
  PlanSide side = PlanSide::cpu;
  std::size_t footprint = 0;
  bool admitted = false;     // its footprint is in the window
  bool input_ready = false;  // the data its next GPU or CPU task waits for has arrived
  bool state_up_asked = false;
  bool state_off_gpu = false;  // resident, its state not yet on the GPU (Execution::state_off_gpu)
  bool params_on_host = false;  // compact master: P in the host staging already (Execution::params_on_host)
};

/// A piece of work waiting in a resource's queue: the subgroup and what it is.
struct Piece {
  std::size_t sg;
  Stage stage;
};

/// One resource: a first-in first-out queue of pieces of work and the one in progress. The queue
/// is a vector read from `head` on: a phase puts at most two pieces of each subgroup on a lane, so
/// nothing is taken off its front, and its memory stays from one simulation to the next.
struct Lane {
  std::vector<Piece> queue;
  std::size_t head = 0;  // the first piece still waiting
  long current = -1;     // subgroup index, -1: idle
  Stage stage = Stage::done;
  double left = 0;       // bytes, parameters or seconds, per the lane
  double share = 1;      // a CPU lane: the share of the worker's rate its subgroup runs at (cpu_team_share)
  double busy = 0;       // seconds busy so far
  bool waiting() const { return head < queue.size(); }
  const Piece& front() const { return queue[head]; }
  void pop() { ++head; }
  void push(Piece p) { queue.push_back(p); }
  /// Idle, nothing queued, nothing counted (the queue's capacity kept).
  void reset() {
    queue.clear();
    head = 0;
    current = -1;
    stage = Stage::done;
    left = busy = 0;
    share = 1;
  }
};

/// The rates of the pieces of work in progress while a number of CPU workers run Adam and a set of
/// PCIe streams carries data, host memory shared as host_shares says: CPU Adam's params/s per
/// worker, and bytes/s of StarPU's streams (up, down) and of the runtime's own copies (up_own,
/// down_own).
struct LaneRates {
  bool known = false;  // computed for this set of busy lanes
  double u_cpu = 0, up = 0, down = 0, up_own = 0, down_own = 0;
};

/// simulate_phase for many plans of one phase (a plan search): what depends only on the workload,
/// the rates and the execution (each subgroup's footprint on every side, host memory's bandwidth,
/// the lanes' rates for every set of busy lanes, taken when first needed) is worked out once, and
/// the lanes' queues and the per-subgroup arrays keep their memory from one plan to the next. Each
/// run() gives what simulate_phase gives for the plan, bit for bit: the same arithmetic in the same
/// order. Holds references to w, r and e: they must outlive it unchanged.
class PhaseSimulator {
 public:
  /// Throws std::invalid_argument as simulate_phase does when a rate is not positive or
  /// e.state_off_gpu or e.params_on_host has neither 0 nor w.sizes.size() flags.
  PhaseSimulator(const Workload& w, const Rates& r, const Execution& e);
  /// simulate_phase(w, plan, r, e). Throws std::invalid_argument when the plan's length differs
  /// from w.sizes, std::logic_error when no piece of work can progress.
  Simulation run(const std::vector<PlanSide>& plan);

 private:
  const Workload& w_;
  const Rates& r_;
  const Execution& e_;
  std::size_t count_;
  double gb_, pb_, cpu_bytes_, host_bw_;
  bool own_upload_, own_download_;
  std::vector<std::size_t> footprint_;  // subgroup i on side s: footprint_[3 i + s] (subgroup_footprint)
  std::vector<double> team_share_;      // subgroup i's cpu_team_share
  std::vector<LaneRates> rates_;        // lane_rates' table: busy CPU workers x 16 + the busy streams' bits
  // scratch of one run, sized once
  std::vector<Sg> sgs_;
  std::vector<std::size_t> order_, stream_order_, stream_pos_;
  std::vector<double> cpu_start_;
  struct CpuPiece {
    double start, end, params;
  };
  std::vector<CpuPiece> cpu_pieces_;
  Lane h2d_, d2h_, gpu_, up_own_, down_own_;
  std::vector<Lane> cpus_;

  const LaneRates& lane_rates(std::size_t active_cpus, bool up, bool up_own, bool down, bool down_own);
};

PhaseSimulator::PhaseSimulator(const Workload& w, const Rates& r, const Execution& e) : w_(w), r_(r), e_(e) {
  if (!rates_complete(r))
    throw std::invalid_argument("phase simulation: every rate (U_c, U_c_dma, U_g, D_c, B_h2d, B_d2h, link_share) must be > 0");
  count_ = w.sizes.size();
  if (!e.params_on_host.empty() && e.params_on_host.size() != count_)
    throw std::invalid_argument("phase simulation: Execution::params_on_host has " +
                                std::to_string(e.params_on_host.size()) + " flags for " + std::to_string(count_) +
                                " subgroups (give one per subgroup, or none)");
  if (!e.state_off_gpu.empty() && e.state_off_gpu.size() != count_)
    throw std::invalid_argument("phase simulation: Execution::state_off_gpu has " +
                                std::to_string(e.state_off_gpu.size()) + " flags for " + std::to_string(count_) +
                                " subgroups (give one per subgroup, or none)");
  gb_ = double(w.grad_bytes);
  pb_ = double(w.param_bytes);
  // Host memory, shared by CPU Adam and both DMA directions: each asks for its full rate's traffic
  // (CPU Adam: cpu_adam_host_bytes per parameter; each link its B), and when together they ask for
  // more than the host delivers (host_bandwidth, M), they share it as host_shares says (the links
  // link_share times CPU Adam's fraction of their ask).
  cpu_bytes_ = cpu_adam_host_bytes(w);
  Rates all_cpus = r;  // host memory as calibrated with every CPU worker's Adam asking at once
  all_cpus.U_c *= double(std::max<std::size_t>(1, e.cpu_workers));
  all_cpus.U_c_dma *= double(std::max<std::size_t>(1, e.cpu_workers));
  host_bw_ = host_bandwidth(w, all_cpus);
  // The runtime's own parameter uploads (Execution::own_param_upload): a second host-to-device
  // lane beside StarPU's stream, at B_h2d alone and B_h2d / 2 beside it, which keeps its B_h2d.
  own_upload_ = e.own_param_upload && w.caller_on_gpu;
  // The runtime's own gradient downloads (Execution::own_grad_download): a second device-to-host
  // lane in the same way.
  own_download_ = e.own_grad_download && w.caller_on_gpu;
  footprint_.resize(3 * count_);
  for (std::size_t i = 0; i < count_; ++i)
    for (PlanSide s : {PlanSide::cpu, PlanSide::gpu_streamed, PlanSide::gpu_resident})
      footprint_[3 * i + std::size_t(s)] = subgroup_footprint(w, w.sizes[i], s);
  team_share_.resize(count_);
  for (std::size_t i = 0; i < count_; ++i) team_share_[i] = cpu_team_share(e, w.sizes[i]);
  const std::size_t k = std::max<std::size_t>(1, e.cpu_workers);
  rates_.resize((k + 1) * 16);
  sgs_.resize(count_);
  order_.reserve(count_);
  stream_order_.reserve(count_);
  stream_pos_.resize(count_);
  cpu_start_.resize(count_);
  cpu_pieces_.reserve(count_);
  // The lanes' queues grow in the first run and keep their memory after it (reserved here, the
  // memory of a single simulate_phase call went back to the system and came again in every call).
  cpus_.resize(k);  // subgroup i's Adam on CPU worker i % k
}

const LaneRates& PhaseSimulator::lane_rates(std::size_t active_cpus, bool up, bool up_own, bool down, bool down_own) {
  LaneRates& x = rates_[active_cpus * 16 + (up ? 1 : 0) + (up_own ? 2 : 0) + (down ? 4 : 0) + (down_own ? 8 : 0)];
  if (x.known) return x;
  const Rates& r = r_;
  // StarPU's streams move at B; the runtime's own copies (made by the GPU's cores, not its copy
  // engines) at B beside an idle StarPU stream and B / 2 beside a busy one, without slowing it
  // (bench/copy-contention on the GPU machine: a kernel copy beside a full copy-engine queue ran
  // at 26 GB/s up and 45 down, and the queue's own rate stayed at 55)
  const double own_up = (up ? 0.5 : 1.0) * r.B_h2d, own_down = (down ? 0.5 : 1.0) * r.B_d2h;
  const double links_ask = (up ? r.B_h2d : 0.0) + (up_own ? own_up : 0.0) + (down ? r.B_d2h : 0.0) +
                           (down_own ? own_down : 0.0);
  const HostShares share = host_shares(double(active_cpus) * r.U_c * cpu_bytes_, links_ask, host_bw_, r.link_share);
  x.u_cpu = r.U_c * share.cpu;
  x.up = r.B_h2d * share.links;
  x.down = r.B_d2h * share.links;
  x.up_own = own_up * share.links;
  x.down_own = own_down * share.links;
  x.known = true;
  return x;
}

Simulation PhaseSimulator::run(const std::vector<PlanSide>& plan) {
  if (plan.size() != count_)
    throw std::invalid_argument("phase simulation: the plan has " + std::to_string(plan.size()) + " sides for " +
                                std::to_string(count_) + " subgroups");
  const Workload& w = w_;
  const Rates& r = r_;
  const Execution& e = e_;
  const std::size_t count = count_;
  const double gb = gb_, pb = pb_;
  std::vector<Sg>& sgs = sgs_;
  // the window's largest footprint, and what submits_cpu_first weighs (the same sums, from the
  // footprints worked out once)
  std::size_t largest_fp = 0, others = 0;
  bool any_streamed = false;
  for (std::size_t i = 0; i < count; ++i) {
    Sg& s = sgs[i];
    s.n = w.sizes[i];
    s.side = plan[i];
    s.footprint = footprint_[3 * i + std::size_t(plan[i])];
    s.admitted = s.input_ready = s.state_up_asked = false;
    s.state_off_gpu = plan[i] == PlanSide::gpu_resident && !e.state_off_gpu.empty() && e.state_off_gpu[i];
    s.params_on_host = !e.params_on_host.empty() && e.params_on_host[i];
    largest_fp = std::max(largest_fp, s.footprint);
    if (plan[i] == PlanSide::gpu_streamed)
      any_streamed = true;
    else
      others += s.footprint;
  }
  Simulation out;
  out.cpu_first = cpu_first_rule(e, any_streamed, others, largest_fp);  // submits_cpu_first
  const std::vector<std::size_t>& order = order_;
  fill_submission_order(plan, out.cpu_first, order_);
  std::vector<std::size_t>& stream_order = stream_order_;
  stream_order.clear();
  for (std::size_t i = 0; i < count; ++i)
    if (plan[i] == PlanSide::gpu_streamed) stream_order.push_back(i);
  std::vector<std::size_t>& stream_pos = stream_pos_;
  for (std::size_t q = 0; q < stream_order.size(); ++q) stream_pos[stream_order[q]] = q;

  // Lanes: PCIe each way (bytes), the GPU (seconds), the CPU (parameters); the runtime's own
  // parameter uploads and gradient downloads beside StarPU's streams (PhaseSimulator's constructor).
  Lane &h2d = h2d_, &d2h = d2h_, &gpu = gpu_, &up_own = up_own_, &down_own = down_own_;
  for (Lane* l : {&h2d, &d2h, &gpu, &up_own, &down_own}) l->reset();
  const bool own_upload = own_upload_, own_download = own_download_;
  // By the copy engine, the runtime's own copies join StarPU's stream of their direction.
  Lane& down_lane = own_download && e.grad_download_by_copy_engine ? d2h : down_own;
  Lane& up_lane = own_upload && e.param_upload_by_copy_engine ? h2d : up_own;
  std::vector<Lane>& cpus = cpus_;  // subgroup i's Adam on CPU worker i % k
  for (Lane& l : cpus) l.reset();
  auto cpu_of = [&](std::size_t i) -> Lane& { return cpus[i % cpus.size()]; };
  std::size_t window_used = 0;
  const std::size_t limit = e.update_budget;
  auto fits = [&](std::size_t b) { return limit == 0 || window_used == 0 || window_used + b <= limit; };
  std::size_t next = 0, finished = 0;
  double now = 0, cpu_idle = 0;  // cpu_idle: seconds so far in which no CPU worker ran an Adam
  std::vector<double>& cpu_start = cpu_start_;  // when each subgroup's CPU Adam began
  std::vector<CpuPiece>& cpu_pieces = cpu_pieces_;
  cpu_pieces.clear();

  auto ask_state_up = [&](std::size_t i) {
    sgs[i].state_up_asked = true;
    h2d.push({i, Stage::state_up});
  };
  bool window_freed = false;  // a subgroup finished since submit_ready last ran
  auto finish = [&](std::size_t i) {
    window_used -= std::min(window_used, sgs[i].footprint);
    ++finished;
    window_freed = true;
  };
  // Submits what the window lets in, in order (the runtime's submission loop). What it lets in
  // depends only on the window's use: once it stops at a subgroup that does not fit (or at the
  // end), it lets nothing more in until a subgroup finishes.
  auto submit_ready = [&] {
    while (next < order.size()) {
      const std::size_t i = order[next];
      Sg& s = sgs[i];
      if (s.side == PlanSide::gpu_streamed && e.lookahead > 0) {
        for (std::size_t q = stream_pos[i]; q < stream_order.size() && q <= stream_pos[i] + e.lookahead; ++q) {
          Sg& t = sgs[stream_order[q]];
          if (t.admitted) continue;
          if (limit != 0 && window_used + t.footprint + largest_fp > limit) continue;  // a smaller one may fit
          t.admitted = true;
          window_used += t.footprint;
          ask_state_up(stream_order[q]);
        }
      }
      if (!s.admitted) {
        if (!fits(s.footprint)) return;
        s.admitted = true;
        window_used += s.footprint;
      }
      ++next;
      if (s.side == PlanSide::cpu) {
        if (own_download) {  // the gradients go down at once; the CPU Adam is queued and waits for them
          s.input_ready = false;
          down_lane.push({i, Stage::grad_down});
          cpu_of(i).push({i, Stage::adam_cpu});
        } else if (w.caller_on_gpu) {
          gpu.push({i, Stage::gather});
        } else {
          s.input_ready = true;
          cpu_of(i).push({i, Stage::adam_cpu});
        }
      } else {
        // streamed, resident with the caller on the host or resident with its state off the GPU:
        // the inputs go up first. Not prefetched: with a lookahead the runtime leaves a streamed
        // task's own prefetch off, so its inputs are fetched when the CUDA worker takes it
        // (start_gpu); without one, and for a resident task, StarPU prefetches them when the task
        // is pushed, at submission.
        const bool up = s.side == PlanSide::gpu_streamed || !w.caller_on_gpu || s.state_off_gpu;
        if (up && !s.state_up_asked && (e.lookahead == 0 || s.side != PlanSide::gpu_streamed)) ask_state_up(i);
        if (!up) s.input_ready = true;  // resident, its state on the GPU, the caller's buffers there
        gpu.push({i, Stage::adam_gpu});
      }
    }
  };

  // Starting the piece of work at the head of a lane, when it can start.
  auto start_link = [&](Lane& lane) {
    if (lane.current >= 0 || !lane.waiting()) return;
    const Piece p = lane.front();
    lane.pop();
    const Sg& s = sgs[p.sg];
    const double n = double(s.n);
    // a streamed state goes both ways; a resident one off the GPU only up, once
    const double spp = state_bytes_per_param(w);
    const double state_up = s.side == PlanSide::gpu_streamed || s.state_off_gpu ? spp : 0.0;
    const double state_down = s.side == PlanSide::gpu_streamed ? spp : 0.0;
    const double extra = w.caller_on_gpu ? 0.0 : 1.0;  // the caller's gradient up, parameters down
    // the compact master's P beside the gradient, unless the host staging holds it already
    const double p_with = w.compact_master && !(p.stage == Stage::grad_down && s.params_on_host) ? pb : 0.0;
    lane.current = long(p.sg);
    lane.stage = p.stage;
    switch (p.stage) {
      case Stage::grad_down: lane.left = (gb + p_with) * n; break;
      case Stage::param_up: lane.left = pb * n; break;
      case Stage::state_up: lane.left = (state_up + extra * (gb + p_with)) * n; break;
      default: lane.left = (state_down + extra * pb) * n; break;  // state_down
    }
  };
  // true when, instead of starting its head, it asked for the streamed state the head waits for
  // (the link may start it at once); false otherwise
  auto start_gpu = [&] {
    if (gpu.current >= 0 || !gpu.waiting()) return false;
    const Piece p = gpu.front();
    const Sg& s = sgs[p.sg];
    if (p.stage == Stage::adam_gpu && s.side == PlanSide::gpu_streamed && !s.state_up_asked) {
      ask_state_up(p.sg);  // not prefetched: fetched when the worker takes it
      return true;
    }
    if (p.stage != Stage::gather && !s.input_ready) return false;             // the head of the queue waits
    gpu.pop();
    gpu.current = long(p.sg);
    gpu.stage = p.stage;
    if (p.stage == Stage::gather)
      gpu.left = double(s.n) / r.D_c;
    else if (p.stage == Stage::scatter)
      gpu.left = 0;  // a device-to-device copy: next to nothing
    else
      gpu.left = double(s.n) / r.U_g;
    return false;
  };
  std::size_t active_cpus = 0;  // CPU workers running an Adam
  auto start_cpu = [&](Lane& cpu) {
    if (cpu.current >= 0 || !cpu.waiting()) return;
    const Piece p = cpu.front();
    if (!sgs[p.sg].input_ready) return;
    cpu.pop();
    cpu.current = long(p.sg);
    cpu.stage = p.stage;
    cpu.left = double(sgs[p.sg].n);
    cpu.share = team_share_[p.sg];
    cpu_start[p.sg] = now;
    ++active_cpus;
  };

  // a resident state's upload seconds not yet counted in Simulation::stream_beside_cpu/stream_alone
  double resident_up_beside_cpu = 0, resident_up_alone = 0;
  // What follows a piece of work when it ends.
  auto complete = [&](Lane& lane) {
    const std::size_t i = std::size_t(lane.current);
    Sg& s = sgs[i];
    const Stage st = lane.stage;
    lane.current = -1;
    switch (st) {
      case Stage::gather:  // the staged gradient goes down; the CPU Adam is queued and waits for it
        s.input_ready = false;
        d2h.push({i, Stage::grad_down});
        cpu_of(i).push({i, Stage::adam_cpu});
        break;
      case Stage::grad_down: s.input_ready = true; break;
      case Stage::adam_cpu:
        --active_cpus;
        cpu_pieces.push_back({cpu_start[i], now, double(s.n) / team_share_[i]});  // at the team's rate
        if (own_upload) {  // the new parameters go up on the runtime's own stream; then it is done
          up_lane.push({i, Stage::param_up});
        } else if (w.caller_on_gpu) {  // the new parameters go up; the write-back is queued and waits for them
          s.input_ready = false;
          h2d.push({i, Stage::param_up});
          gpu.push({i, Stage::scatter});
        } else {
          finish(i);
        }
        break;
      case Stage::param_up:
        if (own_upload) finish(i);  // the runtime's own upload: the subgroup is done
        else s.input_ready = true;
        break;
      case Stage::scatter: finish(i); break;
      case Stage::state_up: s.input_ready = true; break;
      case Stage::adam_gpu:
        if (s.side == PlanSide::gpu_streamed || !w.caller_on_gpu)
          d2h.push({i, Stage::state_down});
        else
          finish(i);
        break;
      case Stage::state_down:
        if (s.side == PlanSide::gpu_streamed) {
          out.stream_end = now;
          out.cpu_idle_before_stream_end = cpu_idle;
          out.stream_beside_cpu += resident_up_beside_cpu;  // the resident uploads within [0, stream_end]
          out.stream_alone += resident_up_alone;
          resident_up_beside_cpu = resident_up_alone = 0;
        }
        finish(i);
        break;
      case Stage::done: break;
    }
  };

  // whether a StarPU stream is moving a streamed subgroup's state (Simulation::stream_beside_cpu)
  auto carries_streamed = [&](const Lane& l) {
    return l.current >= 0 && (l.stage == Stage::state_up || l.stage == Stage::state_down) &&
           sgs[std::size_t(l.current)].side == PlanSide::gpu_streamed;
  };
  // whether it is moving a resident subgroup's state up (Execution::state_off_gpu): counted with the
  // streamed state once a streamed state comes home after it (stream_end moves past it): until
  // then its seconds wait in resident_up_beside_cpu and resident_up_alone (declared above)
  auto carries_resident = [&](const Lane& l) {
    return l.current >= 0 && l.stage == Stage::state_up && sgs[std::size_t(l.current)].state_off_gpu;
  };

  submit_ready();
  const double eps = 1e-15;
  std::size_t guard = 0;
  while (finished < count) {
    // Every idle lane takes the piece at its queue's head when it can. A start frees no other
    // lane's head: only a streamed state asked for when the GPU takes its Adam (start_gpu) gives
    // the link something new, and then the lanes are tried again.
    bool asked = true;
    while (asked) {
      start_link(h2d);
      start_link(up_own);
      start_link(d2h);
      start_link(down_own);
      asked = start_gpu();
      for (Lane& cpu : cpus) start_cpu(cpu);
    }
    const bool dma = h2d.current >= 0 || up_own.current >= 0 || d2h.current >= 0 || down_own.current >= 0;
    // the rates of what runs now, as host memory shares itself between them (lane_rates)
    const LaneRates& lr =
        lane_rates(active_cpus, h2d.current >= 0, up_own.current >= 0, d2h.current >= 0, down_own.current >= 0);
    const double u_cpu = lr.u_cpu;
    const double b_up = lr.up, b_down = lr.down;
    const double b_up_own = lr.up_own, b_down_own = lr.down_own;
    double dt = std::numeric_limits<double>::infinity();
    if (h2d.current >= 0) dt = std::min(dt, h2d.left / b_up);
    if (up_own.current >= 0) dt = std::min(dt, up_own.left / b_up_own);
    if (d2h.current >= 0) dt = std::min(dt, d2h.left / b_down);
    if (down_own.current >= 0) dt = std::min(dt, down_own.left / b_down_own);
    if (gpu.current >= 0) dt = std::min(dt, gpu.left);
    if (active_cpus > 0)
      for (const Lane& cpu : cpus)
        if (cpu.current >= 0) dt = std::min(dt, cpu.left / (u_cpu * cpu.share));
    if (!(dt < std::numeric_limits<double>::infinity()) || ++guard > 100 * count + 10 * cpus.size() + 1000)
      throw std::logic_error("phase simulation: no piece of work can progress (a bug in the simulation)");
    now += dt;
    if (active_cpus == 0) cpu_idle += dt;
    if (h2d.current >= 0) {
      h2d.left -= dt * b_up;
      h2d.busy += dt;
    }
    if (up_own.current >= 0) {
      up_own.left -= dt * b_up_own;
      if (h2d.current < 0) h2d.busy += dt;  // the link's busy time: either stream
    }
    if (d2h.current >= 0) {
      d2h.left -= dt * b_down;
      d2h.busy += dt;
    }
    if (down_own.current >= 0) {
      down_own.left -= dt * b_down_own;
      if (d2h.current < 0) d2h.busy += dt;  // the link's busy time: either stream
    }
    if (gpu.current >= 0) {
      gpu.left -= dt;
      gpu.busy += dt;
    }
    if (active_cpus > 0)
      for (Lane& cpu : cpus)
        if (cpu.current >= 0) {
          cpu.left -= dt * (u_cpu * cpu.share);
          cpu.busy += dt;
          if (dma) out.cpu_beside_dma += dt;
        }
    // optimizer state on StarPU's streams, beside CPU Adam or not
    if (carries_streamed(h2d) || carries_streamed(d2h))
      (active_cpus > 0 ? out.stream_beside_cpu : out.stream_alone) += dt;
    else if (carries_resident(h2d))
      (active_cpus > 0 ? resident_up_beside_cpu : resident_up_alone) += dt;
    // relative tolerances: amounts are bytes (up to 1e11), parameters, or seconds
    if (h2d.current >= 0 && h2d.left <= eps * (1 + r.B_h2d)) complete(h2d);
    if (up_own.current >= 0 && up_own.left <= eps * (1 + r.B_h2d)) complete(up_own);
    if (d2h.current >= 0 && d2h.left <= eps * (1 + r.B_d2h)) complete(d2h);
    if (down_own.current >= 0 && down_own.left <= eps * (1 + r.B_d2h)) complete(down_own);
    if (gpu.current >= 0 && gpu.left <= eps) complete(gpu);
    if (active_cpus > 0)
      for (Lane& cpu : cpus)
        if (cpu.current >= 0 && cpu.left <= eps * (1 + u_cpu)) complete(cpu);
    if (window_freed) {
      window_freed = false;
      submit_ready();
    }
  }
  out.total = now;
  if (out.stream_end > 0)
    for (const CpuPiece& c : cpu_pieces)
      if (c.start >= out.stream_end) {
        out.cpu_after_stream += c.end - c.start;
        out.cpu_after_stream_params += c.params;
      }
  for (const Lane& cpu : cpus) out.cpu += cpu.busy;
  out.h2d = h2d.busy;
  out.d2h = d2h.busy;
  out.gpu = gpu.busy;
  return out;
}

/// predict()'s parameter counts with the simulation's times.
Prediction simulated_prediction(const Workload& w, const std::vector<PlanSide>& plan, const Simulation& s,
                                const Rates& r) {
  Prediction p = predict(w, plan, r);
  p.total = s.total;
  p.cpu = s.cpu;
  p.h2d = s.h2d;
  p.d2h = s.d2h;
  p.gpu = s.gpu;
  return p;
}

}  // namespace

Simulation simulate_phase(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r, const Execution& e) {
  if (plan.size() != w.sizes.size())
    throw std::invalid_argument("phase simulation: the plan has " + std::to_string(plan.size()) + " sides for " +
                                std::to_string(w.sizes.size()) + " subgroups");
  return PhaseSimulator(w, r, e).run(plan);
}

StrideChoice choose_stride_simulated(const Workload& w, const Rates& r, const Execution& e) {
  PhaseSimulator sim(w, r, e);
  return choose_stride_by(w, [&](const std::vector<PlanSide>& plan) {
    return simulated_prediction(w, plan, sim.run(plan), r);
  });
}

Choice choose_plan_simulated(const Workload& w, const Rates& r, const Execution& e) {
  PhaseSimulator sim(w, r, e);
  return choose_plan_by(w, [&](const std::vector<PlanSide>& plan) {
    return simulated_prediction(w, plan, sim.run(plan), r);
  });
}

}  // namespace dos
