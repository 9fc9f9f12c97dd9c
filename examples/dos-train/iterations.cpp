// dos-train's training iterations (iterations.h).
#include "iterations.h"

#include <cmath>

#include "grad_norm.h"
#include "options.h"

namespace dos_train {

TrainingLoop::TrainingLoop(Setup s)
    : s_(std::move(s)),
      it_(s_.first_iteration),
      overlap_forward_(s_.overlap && s_.compute && s_.io->by_range()) {
  const std::size_t ngroups = s_.release.size();
  for (std::size_t g = ngroups - 1; g-- > 0;) backward_order_.push_back(g);
  backward_order_.push_back(ngroups - 1);
}

std::vector<dos::StepStats> TrainingLoop::run(int count, const std::string& label) {
  label_ = label;
  steps_.clear();
  for (int i = 0; i < count; ++i) {
    ++it_;
    const auto t_iter = clock::now();
    double comm_s = 0;
    const ComputeTimes ct = gradients(t_iter, &comm_s);
    // Global-norm clipping and the non-finite check need every gradient: after backward.
    dos::StepVerdict verdict = dos::StepVerdict::keep;
    const GradientCheck gc = check_gradients(&verdict);
    if (overlap_forward_) {
      s_.opt->finish_step_async(verdict);  // the next iteration's forward overlaps the rest
      running_ = {true, it_, ct, gc, t_iter};
      continue;
    }
    const dos::StepStats s = update(verdict);
    if (!s.skipped) comm_s += s_.io->broadcast_parameters();
    const double iter_s = std::chrono::duration<double>(clock::now() - t_iter).count();
    steps_.push_back(s);
    s_.log->add(it_, label_, s, ct, iter_s, comm_s, gc);
    s_.log->note_rates_after(s_.opt->rates());
  }
  if (running_.open) close_running(clock::now());
  return std::move(steps_);
}

ComputeTimes TrainingLoop::gradients(clock::time_point t_iter, double* comm_seconds) {
  dos::Optimizer& opt = *s_.opt;
  ComputeTimes ct;
  if (s_.overlap && !overlap_forward_) opt.begin_step();
  if (s_.overlap && s_.io->by_range()) {
    auto release = [this](std::size_t g) { release_group(g); };
    if (s_.compute) {
      // forward: the embeddings' parameters, then each layer's before its GEMMs; then the last
      // phase closed and this one opened, before backward
      auto before_forward = [this](std::size_t g) {
        if (g == 0) wait_group(s_.release.size() - 1);
        wait_group(g);
      };
      auto between = [&] {
        if (running_.open) close_running(t_iter);
        opt.begin_step();
      };
      ct = overlap_forward_ ? s_.compute->run(release, before_forward, between) : s_.compute->run(release);
      release_group(s_.release.size() - 1);  // the embeddings, when backward has ended
    } else {
      for (std::size_t g : backward_order_) release_group(g);
    }
  } else {
    if (s_.compute) ct = s_.compute->run();
    *comm_seconds += s_.io->produce_gradients(std::uint64_t(it_));
    if (s_.overlap) opt.gradients_final(0, s_.n);
  }
  return ct;
}

GradientCheck TrainingLoop::check_gradients(dos::StepVerdict* verdict) {
  GradientCheck gc;
  if (s_.max_grad_norm > 0) {
    gc.checked = true;
    gc.norm = std::sqrt(s_.io->gradient_sumsq());
    if (!std::isfinite(gc.norm)) {
      *verdict = dos::StepVerdict::skip;
    } else {
      gc.coef = clip_coefficient(gc.norm, s_.max_grad_norm);
      if (gc.coef < 1) {
        s_.io->scale_gradients(gc.coef);
        *verdict = dos::StepVerdict::changed;
      }
    }
  }
  return gc;
}

dos::StepStats TrainingLoop::update(dos::StepVerdict verdict) {
  dos::StepStats s;
  if (s_.overlap) {
    s = s_.opt->finish_step(verdict);
  } else if (verdict == dos::StepVerdict::skip) {
    s.skipped = true;  // no update: the parameters and the state stay as they are
    s.params = s_.n;
  } else {
    s = s_.opt->step();
  }
  return s;
}

void TrainingLoop::wait_group(std::size_t g) {
  for (const auto& r : s_.release[g]) s_.opt->wait_parameters(r.first, r.second);
}

void TrainingLoop::release_group(std::size_t g) {
  for (const auto& r : s_.release[g]) {
    s_.io->produce_gradient_range(std::uint64_t(it_), r.first, r.second);
    s_.opt->gradients_final(r.first, r.second);
  }
}

void TrainingLoop::close_running(clock::time_point t_next) {
  const dos::StepStats s = s_.opt->wait_step();
  running_.open = false;
  const double iter_s = std::chrono::duration<double>(t_next - running_.t_iter).count();
  steps_.push_back(s);
  s_.log->add(running_.it, label_, s, running_.ct, iter_s, 0.0, running_.gc);
  s_.log->note_rates_after(s_.opt->rates());
}

nlohmann::ordered_json run_sweep(TrainingLoop& loop, dos::Optimizer& opt, const std::vector<std::string>& entries,
                                 int iterations, std::size_t n) {
  std::vector<SweepRow> rows;
  for (const std::string& e : entries) {
    dos::PlanOverride o;
    if (e != "model") {
      o.kind = dos::PlanOverride::fraction;
      o.value = parse_fraction(e, "--sweep");
    }
    opt.set_plan_override(o);
    const auto st = loop.run(iterations, " [" + e + "]");
    rows.push_back({e, st.back().planned_streamed, median_update_seconds(st), median_predicted_seconds(st),
                    st.back().lower_bound_seconds, median_prediction_error(st)});
  }
  return print_sweep(rows, n, opt.num_subgroups(), iterations);
}

}  // namespace dos_train
