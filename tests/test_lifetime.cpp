// Lifetimes: one Runtime per process; an Optimizer that outlives its Runtime keeps working and
// StarPU stops with it; an Optimizer that refuses its input leaves the runtime usable; two threads
// stepping one Optimizer are refused, not raced.
#include <atomic>
#include <cmath>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "cmocka_cpp.h"
#include "dos.h"
#include "reference.h"

namespace {

dos::RuntimeOptions cpu_options() {
  dos::RuntimeOptions o;
  o.policy = "cpu";
  o.verbose = false;
  return o;
}

void test_lifetimes(void**) {
  auto rt = std::make_unique<dos::Runtime>(cpu_options());
  bool threw = false;
  try {
    dos::Runtime second(cpu_options());
  } catch (const dos::Error&) {
    threw = true;
  }
  assert_true(threw);  // a second Runtime while one lives is refused

  std::vector<float> p(1000, 1.0f), g(1000, 0.5f);
  dos::OptimizerOptions oo;
  oo.dtype = dos::DType::fp32;
  oo.subgroup_size = 300;
  auto opt = std::make_unique<dos::Optimizer>(*rt, std::vector<dos::TensorView>{{p.data(), g.data(), 1000}}, oo);
  // an Optimizer refusing its input (a null pointer in the second tensor) throws; the runtime
  // and the first Optimizer stay usable
  threw = false;
  try {
    dos::Optimizer bad(*rt, {{p.data(), g.data(), 500}, {nullptr, g.data(), 500}}, oo);
  } catch (const dos::Error&) {
    threw = true;
  }
  assert_true(threw);

  rt.reset();  // the Runtime goes first: StarPU must stay up for the Optimizer
  const dos::StepStats s = opt->step();
  assert_int_equal(s.subgroups_cpu, 4);
  // the update happened, in every subgroup: each element is AdamW's first step from 1 with
  // gradient 0.5, as the double-precision reference works it, within 2 ulps
  double rp = 1, rm = 0, rv = 0;
  const ref::Hyper h{oo.adam.lr, oo.adam.beta1, oo.adam.beta2, oo.adam.eps, oo.adam.weight_decay, oo.adam.decoupled};
  ref::adam_step(rp, rm, rv, 0.5, h, 1);
  assert_true(rp < 1 - 0.5 * oo.adam.lr);  // the reference moved: the check below can fail
  for (float x : p) assert_true(std::fabs(double(x) - rp) <= 2 * ref::ulp(float(rp)));
  // the Optimizer asks nothing of the destroyed Runtime (it keeps what it needs by value): a forced
  // plan is refused for the cpu policy it was made under, as before
  threw = false;
  try {
    opt->set_plan_override({dos::PlanOverride::fraction, 0.5});
  } catch (const dos::Error&) {
    threw = true;
  }
  assert_true(threw);
  // no new Runtime while StarPU still runs for it, and the message says why
  threw = false;
  try {
    dos::Runtime early(cpu_options());
  } catch (const dos::Error& e) {
    threw = std::string(e.what()).find("Optimizer(s) that outlived it") != std::string::npos;
  }
  assert_true(threw);
  opt.reset();  // StarPU stops here

  // and a new Runtime can start afterwards
  dos::Runtime again(cpu_options());
  assert_true(again.cpu_workers() >= 1);
}

// Two threads stepping one Optimizer at once: every call either runs or is refused with the
// message that says so (it once said "finish_step_async without wait_step", which nobody called),
// and the step counts count the steps that ran.
void test_two_threads(void**) {
  dos::Runtime rt(cpu_options());
  std::vector<float> p(4096, 1.0f), g(4096, 0.5f);
  dos::OptimizerOptions oo;
  oo.dtype = dos::DType::fp32;
  oo.subgroup_size = 1024;
  oo.verbose = false;
  dos::Optimizer opt(rt, std::vector<dos::TensorView>{{p.data(), g.data(), p.size()}}, oo);
  std::atomic<int> ran{0}, refused{0}, other{0};
  auto work = [&] {
    for (int k = 0; k < 300; ++k) {
      try {
        opt.step();
        ++ran;
      } catch (const dos::Error& e) {
        if (std::string(e.what()).find("another thread") != std::string::npos) ++refused;
        else {
          std::printf("  unexpected: %s\n", e.what());
          ++other;
        }
      }
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  std::printf("  %d steps ran, %d refused as concurrent\n", ran.load(), refused.load());
  assert_int_equal(other.load(), 0);
  assert_int_equal(ran.load() + refused.load(), 600);
  for (std::size_t i = 0; i < opt.num_subgroups(); ++i) assert_int_equal(opt.step_count(i), ran.load());
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_lifetimes), cmocka_unit_test(test_two_threads)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
