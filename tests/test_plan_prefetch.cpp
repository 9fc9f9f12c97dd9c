// A plan's decision made ahead (scheduler/plan_prefetch.h): it is handed out only for an equal
// input (every field of the workload, the rates bit for bit, the execution) and the same plan
// object, and then equals what decide() gives for that input, here the `dos` plan's search
// (choose_plan_simulated) run directly; a decision that threw is dropped (the caller decides); the
// destructor waits for a decision still running. No StarPU.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cmocka_cpp.h"
#include "phase_sim.h"
#include "plan.h"
#include "plan_prefetch.h"

namespace {

using dos::PlanSide;

/// A plan that counts its decisions and notes the thread of the last one: the first
/// round(U_c / 1e9) subgroups on the CPU, the others streamed (a function of its input). It throws
/// std::invalid_argument for a workload of 13 subgroups, std::bad_alloc for its next `fail_next`
/// decisions (a passing failure), and sleeps `delay_ms` before deciding.
class CountingPlan final : public dos::Plan {
 public:
  mutable std::atomic<int> decisions{0};
  mutable std::atomic<bool> finished{false};
  mutable std::thread::id last_thread;
  mutable std::atomic<int> fail_next{0};
  int delay_ms = 0;
  dos::PlanNeeds needs() const override {
    dos::PlanNeeds n;
    n.rates = true;
    n.decided_ahead = true;
    return n;
  }
  std::vector<PlanSide> decide(const dos::PlanInput& in) const override {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ++decisions;
    last_thread = std::this_thread::get_id();
    if (in.workload.sizes.size() == 13) throw std::invalid_argument("thirteen subgroups");
    if (fail_next.load() > 0) {
      --fail_next;
      throw std::bad_alloc();
    }
    const std::size_t n = in.workload.sizes.size();
    const std::size_t cpu = std::min(n, std::size_t(std::llround(in.rates ? in.rates->U_c / 1e9 : 0)));
    std::vector<PlanSide> p(n, PlanSide::gpu_streamed);
    std::fill(p.begin(), p.begin() + long(cpu), PlanSide::cpu);
    finished = true;
    return p;
  }
};

dos::Workload workload(std::size_t n, std::size_t size) {
  dos::Workload w;
  w.sizes.assign(n, size);
  w.sizes.back() = size / 3 + 1;  // an odd tail
  return w;
}

const dos::Rates kRates{4e9, 3e9, 1.3e11, 4.9e11, 4.9e10, 5.1e10, 0.8};

void test_decided_ahead_equals_decide(void** /*state*/) {
  auto plan = std::make_shared<CountingPlan>();
  const dos::Workload w = workload(8, 1000);
  const dos::Execution e;
  dos::PlanPrefetch pf;
  pf.start(plan, w, &kRates, e);
  const std::optional<std::vector<PlanSide>> got = pf.take(plan.get(), w, &kRates, e);
  assert_true(got.has_value());
  assert_int_equal(plan->decisions.load(), 1);
  assert_true(plan->last_thread != std::this_thread::get_id());  // decided on a thread of its own
  assert_true(*got == plan->decide(dos::PlanInput{w, &kRates, e}));
  assert_int_equal(std::count(got->begin(), got->end(), PlanSide::cpu), 4);
  // held: taken again without deciding again; starting for an equal input decides nothing
  const int before = plan->decisions.load();
  assert_true(pf.take(plan.get(), w, &kRates, e) == got);
  pf.start(plan, w, &kRates, e);
  assert_true(pf.take(plan.get(), w, &kRates, e) == got);
  assert_int_equal(plan->decisions.load(), before);
}

// Every field a plan may read, changed one at a time: the held decision is not handed out.
void test_any_other_input_decides_again(void** /*state*/) {
  auto plan = std::make_shared<CountingPlan>();
  const dos::Workload w0 = workload(8, 1000);
  dos::Execution e0;
  e0.state_off_gpu.assign(8, false);
  using Change = std::function<void(dos::Workload&, dos::Rates&, dos::Execution&)>;
  const std::vector<std::pair<const char*, Change>> changes = {
      {"sizes", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.sizes[3] += 1; }},
      {"subgroups", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.sizes.push_back(5); }},
      {"caller_on_gpu", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.caller_on_gpu = !w.caller_on_gpu; }},
      {"param_bytes", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.param_bytes = 4; }},
      {"resident", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.resident = 1; }},
      {"may_stream", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.may_stream = false; }},
      {"grad_bytes", [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.grad_bytes = 2; }},
      {"cpu_grads_staged_on_gpu",
       [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.cpu_grads_staged_on_gpu = false; }},
      {"cpu_params_staged_on_gpu",
       [](dos::Workload& w, dos::Rates&, dos::Execution&) { w.cpu_params_staged_on_gpu = false; }},
      {"U_c", [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.U_c = std::nextafter(r.U_c, 0.0); }},
      {"U_c_dma", [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.U_c_dma = std::nextafter(r.U_c_dma, 0.0); }},
      {"U_g", [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.U_g = std::nextafter(r.U_g, 0.0); }},
      {"D_c", [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.D_c = std::nextafter(r.D_c, 0.0); }},
      {"B_h2d", [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.B_h2d = std::nextafter(r.B_h2d, 0.0); }},
      {"B_d2h", [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.B_d2h = std::nextafter(r.B_d2h, 0.0); }},
      {"link_share",
       [](dos::Workload&, dos::Rates& r, dos::Execution&) { r.link_share = std::nextafter(r.link_share, 0.0); }},
      {"order", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.order = dos::SubmitOrder::cpu_first; }},
      {"lookahead", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.lookahead += 1; }},
      {"update_budget", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.update_budget = 1 << 20; }},
      {"cpu_workers", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.cpu_workers = 3; }},
      {"cpu_team_threads", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.cpu_team_threads += 1; }},
      {"cpu_work_item", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.cpu_work_item += 16; }},
      {"own_param_upload", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.own_param_upload = true; }},
      {"own_grad_download", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.own_grad_download = true; }},
      {"grad_download_by_copy_engine",
       [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.grad_download_by_copy_engine = true; }},
      {"param_upload_by_copy_engine",
       [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.param_upload_by_copy_engine = true; }},
      {"state_off_gpu", [](dos::Workload&, dos::Rates&, dos::Execution& e) { e.state_off_gpu[7] = true; }},
  };
  for (const auto& [name, change] : changes) {
    dos::Workload w = w0;
    dos::Rates r = kRates;
    dos::Execution e = e0;
    change(w, r, e);
    dos::PlanPrefetch pf;
    pf.start(plan, w0, &kRates, e0);
    if (pf.take(plan.get(), w, &r, e).has_value()) fail_msg("a decision was handed out after %s changed", name);
    assert_false(pf.holds(plan.get(), w, &r, e));
    assert_true(pf.holds(plan.get(), w0, &kRates, e0));  // and it is still held for its own input
  }
  // no rates against rates, and another plan object of the same kind
  dos::PlanPrefetch pf;
  pf.start(plan, w0, &kRates, e0);
  assert_false(pf.take(plan.get(), w0, nullptr, e0).has_value());
  const CountingPlan other;
  assert_false(pf.take(&other, w0, &kRates, e0).has_value());
  assert_false(pf.take(nullptr, w0, &kRates, e0).has_value());
  pf.start(plan, w0, nullptr, e0);
  assert_true(pf.take(plan.get(), w0, nullptr, e0).has_value());
  assert_false(pf.take(plan.get(), w0, &kRates, e0).has_value());
}

void test_remember_and_errors(void** /*state*/) {
  auto plan = std::make_shared<CountingPlan>();
  const dos::Workload w = workload(5, 300);
  const dos::Execution e;
  dos::PlanPrefetch pf;
  assert_false(pf.take(plan.get(), w, &kRates, e).has_value());  // nothing held
  const std::vector<PlanSide> sides(5, PlanSide::cpu);
  pf.remember(plan, w, &kRates, e, sides);
  assert_true(pf.take(plan.get(), w, &kRates, e) == sides);
  assert_int_equal(plan->decisions.load(), 0);
  // a decision that threw is dropped, not handed out nor kept: the caller decides then (and meets
  // decide()'s own error if it fails again)
  const dos::Workload thirteen = workload(13, 300);
  pf.start(plan, thirteen, &kRates, e);
  assert_false(pf.take(plan.get(), thirteen, &kRates, e).has_value());
  assert_false(pf.holds(plan.get(), thirteen, &kRates, e));
  // a passing failure (out of memory on the decision's thread) does not stay: the same input,
  // started again, is decided and handed out
  const dos::Workload seven = workload(7, 300);
  plan->fail_next = 1;
  pf.start(plan, seven, &kRates, e);
  assert_false(pf.take(plan.get(), seven, &kRates, e).has_value());
  assert_int_equal(plan->fail_next.load(), 0);
  pf.start(plan, seven, &kRates, e);
  const auto again = pf.take(plan.get(), seven, &kRates, e);
  assert_true(again.has_value());
  assert_true(*again == plan->decide(dos::PlanInput{seven, &kRates, e}));
  assert_true(throws_invalid_argument([&] { pf.start(nullptr, w, &kRates, e); }));
  pf.clear();
  assert_false(pf.holds(plan.get(), seven, &kRates, e));
}

// The destructor (and start, clear) wait for a decision still running: its thread reads the plan.
void test_waits_for_running_decision(void** /*state*/) {
  auto plan = std::make_shared<CountingPlan>();
  plan->delay_ms = 50;
  {
    dos::PlanPrefetch pf;
    pf.start(plan, workload(4, 10), &kRates, dos::Execution{});
    assert_false(plan->finished.load());  // still asleep
  }
  assert_true(plan->finished.load());
}

// The `dos` plan decided ahead gives the plan of its search run directly, over workloads of many
// small subgroups (where the search is long beside the phase), resident ones and a tight budget.
void test_dos_plan_ahead(void** /*state*/) {
  const std::shared_ptr<const dos::Plan> dos_plan = dos::make_plan_by_name("dos");
  assert_true(dos_plan->needs().decided_ahead);
  struct Case {
    std::size_t n, size, resident, budget;
  };
  for (const Case c : {Case{55, 10007, 0, 0}, Case{35, 124000000, 0, 30000000000}, Case{300, 100003, 40, 0},
                       Case{16, 5000000, 0, 400000000}}) {
    dos::Workload w = workload(c.n, c.size);
    w.resident = c.resident;
    dos::Execution e;
    e.update_budget = c.budget;
    e.cpu_workers = 4;
    dos::PlanPrefetch pf;
    pf.start(dos_plan, w, &kRates, e);
    const auto got = pf.take(dos_plan.get(), w, &kRates, e);
    assert_true(got.has_value());
    const std::vector<PlanSide> direct = dos::choose_plan_simulated(w, kRates, e).plan;
    assert_true(*got == direct);
    assert_int_equal(got->size(), c.n);
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decided_ahead_equals_decide), cmocka_unit_test(test_any_other_input_decides_again),
      cmocka_unit_test(test_remember_and_errors),         cmocka_unit_test(test_waits_for_running_decision),
      cmocka_unit_test(test_dos_plan_ahead),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
