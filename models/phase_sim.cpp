// The event-driven simulation of one update phase (phase_sim.h).
#include "phase_sim.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>

#include "adam.h"

namespace dos {

std::size_t subgroup_footprint(const Workload& w, std::size_t n, PlanSide side) {
  if (side == PlanSide::cpu)
    return w.caller_on_gpu ? n * ((w.cpu_grads_staged_on_gpu ? w.grad_bytes : 0) + (w.cpu_params_staged_on_gpu ? w.param_bytes : 0))
                           : 0;
  const bool staging = !w.caller_on_gpu;  // on the GPU with the caller there: the direct path, nothing staged
  return (side == PlanSide::gpu_streamed ? state_bytes_for(n) : 0) + n * (staging ? w.grad_bytes + w.param_bytes : 0);
}

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
  return any_streamed && (e.update_budget == 0 || others + (e.lookahead + 1) * largest <= e.update_budget);
}

std::vector<std::size_t> submission_order(const std::vector<PlanSide>& plan, bool cpu_first) {
  std::vector<std::size_t> order;
  order.reserve(plan.size());
  for (int pass = 0; pass < (cpu_first ? 2 : 1); ++pass)
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (!cpu_first || (pass == 0) != (plan[i] == PlanSide::gpu_streamed)) order.push_back(i);
  return order;
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
};

/// A piece of work waiting in a resource's queue: the subgroup and what it is.
struct Piece {
  std::size_t sg;
  Stage stage;
};

/// One resource: a first-in first-out queue of pieces of work and the one in progress.
struct Lane {
  std::deque<Piece> queue;
  long current = -1;     // subgroup index, -1: idle
  Stage stage = Stage::done;
  double left = 0;       // bytes, parameters or seconds, per the lane
  double busy = 0;       // seconds busy so far
};

}  // namespace

Simulation simulate_phase(const Workload& w, const std::vector<PlanSide>& plan, const Rates& r, const Execution& e) {
  if (plan.size() != w.sizes.size())
    throw std::invalid_argument("phase simulation: the plan has " + std::to_string(plan.size()) + " sides for " +
                                std::to_string(w.sizes.size()) + " subgroups");
  if (!rates_complete(r))
    throw std::invalid_argument("phase simulation: every rate (U_c, U_c_dma, U_g, D_c, B_h2d, B_d2h, link_share) must be > 0");
  if (!e.state_off_gpu.empty() && e.state_off_gpu.size() != plan.size())
    throw std::invalid_argument("phase simulation: Execution::state_off_gpu has " +
                                std::to_string(e.state_off_gpu.size()) + " flags for " + std::to_string(plan.size()) +
                                " subgroups (give one per subgroup, or none)");
  const std::size_t count = plan.size();
  const double gb = double(w.grad_bytes), pb = double(w.param_bytes);
  std::vector<Sg> sgs(count);
  std::size_t largest_fp = 0;
  for (std::size_t i = 0; i < count; ++i) {
    sgs[i].n = w.sizes[i];
    sgs[i].side = plan[i];
    sgs[i].footprint = subgroup_footprint(w, w.sizes[i], plan[i]);
    sgs[i].state_off_gpu = plan[i] == PlanSide::gpu_resident && !e.state_off_gpu.empty() && e.state_off_gpu[i];
    largest_fp = std::max(largest_fp, sgs[i].footprint);
  }
  Simulation out;
  out.cpu_first = submits_cpu_first(w, plan, e);
  const std::vector<std::size_t> order = submission_order(plan, out.cpu_first);
  std::vector<std::size_t> stream_order;
  for (std::size_t i = 0; i < count; ++i)
    if (plan[i] == PlanSide::gpu_streamed) stream_order.push_back(i);
  std::vector<std::size_t> stream_pos(count, 0);
  for (std::size_t q = 0; q < stream_order.size(); ++q) stream_pos[stream_order[q]] = q;

  // Host memory, shared by CPU Adam and both DMA directions: each asks for its full rate's traffic
  // (CPU Adam: cpu_adam_host_bytes per parameter; each link its B), and when together they ask for
  // more than the host delivers (host_bandwidth, M), they share it as host_shares says (the links
  // link_share times CPU Adam's fraction of their ask).
  const double cpu_bytes = cpu_adam_host_bytes(w);
  Rates all_cpus = r;  // host memory as calibrated with every CPU worker's Adam asking at once
  all_cpus.U_c *= double(std::max<std::size_t>(1, e.cpu_workers));
  all_cpus.U_c_dma *= double(std::max<std::size_t>(1, e.cpu_workers));
  const double host_bw = host_bandwidth(w, all_cpus);

  // Lanes: PCIe each way (bytes), the GPU (seconds), the CPU (parameters).
  Lane h2d, d2h, gpu;
  // The runtime's own parameter uploads (Execution::own_param_upload): a second host-to-device
  // lane beside StarPU's stream, at B_h2d alone and B_h2d / 2 beside it, which keeps its B_h2d.
  Lane up_own;
  const bool own_upload = e.own_param_upload && w.caller_on_gpu;
  // The runtime's own gradient downloads (Execution::own_grad_download): a second device-to-host
  // lane in the same way.
  Lane down_own;
  const bool own_download = e.own_grad_download && w.caller_on_gpu;
  // By the copy engine, the runtime's own copies join StarPU's stream of their direction.
  Lane& down_lane = own_download && e.grad_download_by_copy_engine ? d2h : down_own;
  Lane& up_lane = own_upload && e.param_upload_by_copy_engine ? h2d : up_own;
  std::vector<Lane> cpus(std::max<std::size_t>(1, e.cpu_workers));  // subgroup i's Adam on CPU worker i % k
  auto cpu_of = [&](std::size_t i) -> Lane& { return cpus[i % cpus.size()]; };
  std::size_t window_used = 0;
  const std::size_t limit = e.update_budget;
  auto fits = [&](std::size_t b) { return limit == 0 || window_used == 0 || window_used + b <= limit; };
  std::size_t next = 0, finished = 0;
  double now = 0;
  std::vector<double> cpu_start(count, 0.0);  // when each subgroup's CPU Adam began
  struct CpuPiece {
    double start, end, params;
  };
  std::vector<CpuPiece> cpu_pieces;
  cpu_pieces.reserve(count);

  auto ask_state_up = [&](std::size_t i) {
    sgs[i].state_up_asked = true;
    h2d.queue.push_back({i, Stage::state_up});
  };
  auto finish = [&](std::size_t i) {
    window_used -= std::min(window_used, sgs[i].footprint);
    ++finished;
  };
  // Submits what the window lets in, in order (the runtime's submission loop).
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
          down_lane.queue.push_back({i, Stage::grad_down});
          cpu_of(i).queue.push_back({i, Stage::adam_cpu});
        } else if (w.caller_on_gpu) {
          gpu.queue.push_back({i, Stage::gather});
        } else {
          s.input_ready = true;
          cpu_of(i).queue.push_back({i, Stage::adam_cpu});
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
        gpu.queue.push_back({i, Stage::adam_gpu});
      }
    }
  };

  // Starting the piece of work at the head of a lane, when it can start.
  auto start_link = [&](Lane& lane) {
    if (lane.current >= 0 || lane.queue.empty()) return false;
    const Piece p = lane.queue.front();
    lane.queue.pop_front();
    const Sg& s = sgs[p.sg];
    const double n = double(s.n);
    // a streamed state goes both ways; a resident one off the GPU only up, once
    const double state_up = s.side == PlanSide::gpu_streamed || s.state_off_gpu ? 12.0 : 0.0;
    const double state_down = s.side == PlanSide::gpu_streamed ? 12.0 : 0.0;
    const double extra = w.caller_on_gpu ? 0.0 : 1.0;  // the caller's gradient up, parameters down
    lane.current = long(p.sg);
    lane.stage = p.stage;
    switch (p.stage) {
      case Stage::grad_down: lane.left = gb * n; break;
      case Stage::param_up: lane.left = pb * n; break;
      case Stage::state_up: lane.left = (state_up + extra * gb) * n; break;
      default: lane.left = (state_down + extra * pb) * n; break;  // state_down
    }
    return true;
  };
  auto start_gpu = [&] {
    if (gpu.current >= 0 || gpu.queue.empty()) return false;
    const Piece p = gpu.queue.front();
    const Sg& s = sgs[p.sg];
    if (p.stage == Stage::adam_gpu && s.side == PlanSide::gpu_streamed && !s.state_up_asked) {
      ask_state_up(p.sg);  // not prefetched: fetched when the worker takes it
      return true;         // the link may start it: the lanes are tried again
    }
    if (p.stage != Stage::gather && !s.input_ready) return false;             // the head of the queue waits
    gpu.queue.pop_front();
    gpu.current = long(p.sg);
    gpu.stage = p.stage;
    if (p.stage == Stage::gather)
      gpu.left = double(s.n) / r.D_c;
    else if (p.stage == Stage::scatter)
      gpu.left = 0;  // a device-to-device copy: next to nothing
    else
      gpu.left = double(s.n) / r.U_g;
    return true;
  };
  auto start_cpu = [&](Lane& cpu) {
    if (cpu.current >= 0 || cpu.queue.empty()) return false;
    const Piece p = cpu.queue.front();
    if (!sgs[p.sg].input_ready) return false;
    cpu.queue.pop_front();
    cpu.current = long(p.sg);
    cpu.stage = p.stage;
    cpu.left = double(sgs[p.sg].n);
    cpu_start[p.sg] = now;
    return true;
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
        d2h.queue.push_back({i, Stage::grad_down});
        cpu_of(i).queue.push_back({i, Stage::adam_cpu});
        break;
      case Stage::grad_down: s.input_ready = true; break;
      case Stage::adam_cpu:
        cpu_pieces.push_back({cpu_start[i], now, double(s.n)});
        if (own_upload) {  // the new parameters go up on the runtime's own stream; then it is done
          up_lane.queue.push_back({i, Stage::param_up});
        } else if (w.caller_on_gpu) {  // the new parameters go up; the write-back is queued and waits for them
          s.input_ready = false;
          h2d.queue.push_back({i, Stage::param_up});
          gpu.queue.push_back({i, Stage::scatter});
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
          d2h.queue.push_back({i, Stage::state_down});
        else
          finish(i);
        break;
      case Stage::state_down:
        if (s.side == PlanSide::gpu_streamed) {
          out.stream_end = now;
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
    bool started = true;
    while (started) {
      started = false;
      started |= start_link(h2d);
      started |= start_link(up_own);
      started |= start_link(d2h);
      started |= start_link(down_own);
      started |= start_gpu();
      for (Lane& cpu : cpus) started |= start_cpu(cpu);
    }
    const bool dma = h2d.current >= 0 || up_own.current >= 0 || d2h.current >= 0 || down_own.current >= 0;
    double active_cpus = 0;
    for (const Lane& cpu : cpus) active_cpus += cpu.current >= 0 ? 1 : 0;
    // StarPU's streams move at B; the runtime's own copies (made by the GPU's cores, not its copy
    // engines) at B beside an idle StarPU stream and B / 2 beside a busy one, without slowing it
    // (bench/copy-contention on the GPU machine: a kernel copy beside a full copy-engine queue ran
    // at 26 GB/s up and 45 down, and the queue's own rate stayed at 55)
    const double own_up = (h2d.current >= 0 ? 0.5 : 1.0) * r.B_h2d, own_down = (d2h.current >= 0 ? 0.5 : 1.0) * r.B_d2h;
    const double links_ask = (h2d.current >= 0 ? r.B_h2d : 0.0) + (up_own.current >= 0 ? own_up : 0.0) +
                             (d2h.current >= 0 ? r.B_d2h : 0.0) + (down_own.current >= 0 ? own_down : 0.0);
    const HostShares share = host_shares(active_cpus * r.U_c * cpu_bytes, links_ask, host_bw, r.link_share);
    const double u_cpu = r.U_c * share.cpu;
    const double b_up = r.B_h2d * share.links, b_down = r.B_d2h * share.links;
    const double b_up_own = own_up * share.links, b_down_own = own_down * share.links;
    double dt = std::numeric_limits<double>::infinity();
    if (h2d.current >= 0) dt = std::min(dt, h2d.left / b_up);
    if (up_own.current >= 0) dt = std::min(dt, up_own.left / b_up_own);
    if (d2h.current >= 0) dt = std::min(dt, d2h.left / b_down);
    if (down_own.current >= 0) dt = std::min(dt, down_own.left / b_down_own);
    if (gpu.current >= 0) dt = std::min(dt, gpu.left);
    for (const Lane& cpu : cpus)
      if (cpu.current >= 0) dt = std::min(dt, cpu.left / u_cpu);
    if (!(dt < std::numeric_limits<double>::infinity()) || ++guard > 100 * count + 10 * cpus.size() + 1000)
      throw std::logic_error("phase simulation: no piece of work can progress (a bug in the simulation)");
    now += dt;
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
    for (Lane& cpu : cpus)
      if (cpu.current >= 0) {
        cpu.left -= dt * u_cpu;
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
    for (Lane& cpu : cpus)
      if (cpu.current >= 0 && cpu.left <= eps * (1 + u_cpu)) complete(cpu);
    submit_ready();
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

namespace {
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

StrideChoice choose_stride_simulated(const Workload& w, const Rates& r, const Execution& e) {
  return choose_stride_by(w, [&](const std::vector<PlanSide>& plan) {
    return simulated_prediction(w, plan, simulate_phase(w, plan, r, e), r);
  });
}

Choice choose_plan_simulated(const Workload& w, const Rates& r, const Execution& e) {
  return choose_plan_by(w, [&](const std::vector<PlanSide>& plan) {
    return simulated_prediction(w, plan, simulate_phase(w, plan, r, e), r);
  });
}

}  // namespace dos
