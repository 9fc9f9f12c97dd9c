// PlanPrefetch (plan_prefetch.h).
#include "plan_prefetch.h"

#include <cstring>
#include <stdexcept>
#include <system_error>

namespace dos {

namespace {

bool same_rates(const Rates* a, const Rates* b) noexcept {
  if (!a || !b) return a == b;
  const double x[] = {a->U_c, a->U_c_dma, a->U_g, a->D_c, a->B_h2d, a->B_d2h, a->link_share};
  const double y[] = {b->U_c, b->U_c_dma, b->U_g, b->D_c, b->B_h2d, b->B_d2h, b->link_share};
  return std::memcmp(x, y, sizeof x) == 0;  // bit for bit: a rate refined by one ulp is another input
}

}  // namespace

bool same_plan_input(const Workload& wa, const Rates* ra, const Execution& ea, const Workload& wb, const Rates* rb,
                     const Execution& eb) noexcept {
  return wa.sizes == wb.sizes && wa.caller_on_gpu == wb.caller_on_gpu && wa.param_bytes == wb.param_bytes &&
         wa.resident == wb.resident && wa.may_stream == wb.may_stream && wa.grad_bytes == wb.grad_bytes &&
         wa.cpu_grads_staged_on_gpu == wb.cpu_grads_staged_on_gpu &&
         wa.cpu_params_staged_on_gpu == wb.cpu_params_staged_on_gpu && wa.compact_master == wb.compact_master &&
         same_rates(ra, rb) && ea.order == eb.order &&
         ea.lookahead == eb.lookahead && ea.update_budget == eb.update_budget && ea.cpu_workers == eb.cpu_workers &&
         ea.cpu_team_threads == eb.cpu_team_threads && ea.cpu_work_item == eb.cpu_work_item &&
         ea.own_param_upload == eb.own_param_upload && ea.own_grad_download == eb.own_grad_download &&
         ea.grad_download_by_copy_engine == eb.grad_download_by_copy_engine &&
         ea.param_upload_by_copy_engine == eb.param_upload_by_copy_engine && ea.state_off_gpu == eb.state_off_gpu &&
         ea.params_on_host == eb.params_on_host;
}

PlanPrefetch::~PlanPrefetch() { clear(); }

void PlanPrefetch::clear() noexcept {
  if (result_.valid()) result_.wait();  // as std::async's own future would, on its last copy
  result_ = {};
  plan_.reset();
  rates_.reset();
}

void PlanPrefetch::start(std::shared_ptr<const Plan> plan, const Workload& w, const Rates* rates,
                         const Execution& e) {
  if (!plan) throw std::invalid_argument("PlanPrefetch::start: no plan given");
  if (holds(plan.get(), w, rates, e)) return;
  clear();
  // the copies first (they may throw); the thread gets its own, the optimizer changes after this call
  Workload wc = w;
  Execution ec = e;
  std::optional<Rates> r;
  if (rates) r = *rates;
  std::shared_future<std::vector<PlanSide>> result;
  try {
    result = std::async(std::launch::async, [plan, w = wc, r, e = ec] {
               return plan->decide(PlanInput{w, r ? &*r : nullptr, e});
             }).share();
  } catch (const std::system_error&) {
    return;  // no thread: the phase decides when it begins
  }
  hold(std::move(plan), std::move(wc), r, std::move(ec), std::move(result));
}

void PlanPrefetch::remember(std::shared_ptr<const Plan> plan, const Workload& w, const Rates* rates,
                            const Execution& e, std::vector<PlanSide> sides) {
  clear();
  Workload wc = w;  // the copies first (they may throw): nothing is held until all are made
  Execution ec = e;
  std::promise<std::vector<PlanSide>> done;
  done.set_value(std::move(sides));
  hold(std::move(plan), std::move(wc), rates ? std::optional<Rates>(*rates) : std::nullopt, std::move(ec),
       done.get_future().share());
}

void PlanPrefetch::hold(std::shared_ptr<const Plan> plan, Workload w, std::optional<Rates> rates, Execution e,
                        std::shared_future<std::vector<PlanSide>> result) noexcept {
  result_ = std::move(result);
  plan_ = std::move(plan);
  workload_ = std::move(w);
  rates_ = rates;
  execution_ = std::move(e);
}

bool PlanPrefetch::holds(const Plan* plan, const Workload& w, const Rates* rates, const Execution& e) const noexcept {
  return result_.valid() && plan && plan == plan_.get() &&
         same_plan_input(workload_, rates_ ? &*rates_ : nullptr, execution_, w, rates, e);
}

std::optional<std::vector<PlanSide>> PlanPrefetch::take(const Plan* plan, const Workload& w, const Rates* rates,
                                                       const Execution& e) {
  if (!holds(plan, w, rates, e)) return std::nullopt;
  try {
    return result_.get();  // waits for a decision still running
  } catch (...) {
    // a decision that failed is not kept: the caller decides now, and meets decide()'s own error
    // if it fails again (a failure kept would fail every later phase of an unchanged input)
    clear();
    return std::nullopt;
  }
}

}  // namespace dos
