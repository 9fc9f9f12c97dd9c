// The plan registry (scheduler/plan.h), the plans built into it, the greedy plan against a
// hand-computed expectation, the GPU budgets' checks, --policy parsing (scheduler/policy.h), and a
// registered plan run by the runtime. Plans are pure: only the last test starts StarPU.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cmocka_cpp.h"
#include "dos.h"
#include "phase_sim.h"
#include "plan.h"
#include "policy.h"

namespace {

using dos::PlanSide;

dos::Workload workload(const std::vector<std::size_t>& sizes) {
  dos::Workload w;
  w.sizes = sizes;
  return w;
}

std::vector<PlanSide> decide(const std::string& name, const dos::Workload& w, const dos::Rates* r) {
  const std::unique_ptr<dos::Plan> p = dos::make_plan_by_name(name);
  assert_non_null(p.get());
  return p->decide(dos::PlanInput{w, r, dos::Execution{}});
}

template <class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void test_registry(void**) {
  // the plans of scheduler/meson.build, in its order
  const std::vector<std::string> want = {"cpu", "gpu", "dos", "static", "greedy"};
  const auto& reg = dos::plan_registry();
  assert_true(reg.size() >= want.size());
  for (std::size_t i = 0; i < want.size(); ++i) assert_string_equal(reg[i].name, want[i].c_str());
  // the list may go on with plans of a build's own (scheduler/meson.build): these come first
  assert_int_equal(dos::plan_usages().rfind("cpu, gpu, dos, static:R, greedy", 0), 0);
  assert_string_equal(dos::policy_name_clash().c_str(), "");
  // what each declares
  assert_false(dos::make_plan_by_name("cpu")->needs().rates);
  assert_true(dos::make_plan_by_name("gpu")->needs().cuda_worker);
  const dos::PlanNeeds d = dos::make_plan_by_name("dos")->needs();
  assert_true(d.rates && d.refine && d.resident == dos::ResidentState::budget);
  const dos::PlanNeeds s = dos::make_plan_by_name("static:0.5")->needs();
  assert_true(s.rates && !s.refine && s.resident == dos::ResidentState::own);
  assert_true(dos::make_plan_by_name("greedy")->needs().rates);
  assert_string_equal(dos::make_plan_by_name("static:0.25")->name().c_str(), "static:0.25");
  // not a plan: null (it may be a StarPU policy); a plan's bad argument: an error saying how to write it
  assert_null(dos::make_plan_by_name("dmda").get());
  assert_null(dos::make_plan_by_name("").get());
  assert_true(contains(message_of([] { dos::make_plan_by_name("static"); }), "static:R"));
  assert_true(contains(message_of([] { dos::make_plan_by_name("static:1.5"); }), "[0, 1]"));
  assert_true(contains(message_of([] { dos::make_plan_by_name("static:x"); }), "[0, 1]"));
  // what strtod reads but a person does not write: blanks, hexadecimal, nan
  for (const char* r : {"static: 0.5", "static:0.5 ", "static:0x1p-1", "static:nan", "static:+", "static:.",
                        "static:1e-400"})
    assert_true(contains(message_of([r] { dos::make_plan_by_name(r); }), "[0, 1]"));
  assert_string_equal(dos::make_plan_by_name("static:.5")->name().c_str(), "static:.5");
  assert_string_equal(dos::make_plan_by_name("static:5e-1")->name().c_str(), "static:5e-1");
  assert_true(contains(message_of([] { dos::make_plan_by_name("greedy:3"); }), "takes no argument"));
}

std::unique_ptr<dos::Plan> make_all_cpu(const std::string&) {
  struct AllCpu final : dos::Plan {
    dos::PlanNeeds needs() const override { return {}; }
    std::vector<PlanSide> decide(const dos::PlanInput& in) const override {
      return std::vector<PlanSide>(in.workload.sizes.size(), PlanSide::cpu);
    }
  };
  return std::make_unique<AllCpu>();
}

void test_register_plan(void**) {
  dos::register_plan({"test-all-cpu", "test-all-cpu", "a plan registered by the test", make_all_cpu});
  assert_string_equal(dos::plan_registry().back().name, "test-all-cpu");
  assert_true(contains(dos::plan_usages(), ", test-all-cpu"));
  assert_true(dos::parse_policy("test-all-cpu").plan != nullptr);
  assert_true(contains(message_of([] { dos::register_plan({"test-all-cpu", nullptr, nullptr, make_all_cpu}); }),
                       "already registered"));
  assert_true(contains(message_of([] { dos::register_plan({"cpu", nullptr, nullptr, make_all_cpu}); }),
                       "already registered"));
  assert_true(contains(message_of([] { dos::register_plan({"a:b", nullptr, nullptr, make_all_cpu}); }), "':'"));
  assert_true(contains(message_of([] { dos::register_plan({"", nullptr, nullptr, make_all_cpu}); }), "name"));
  assert_true(contains(message_of([] { dos::register_plan({"no-factory", nullptr, nullptr, nullptr}); }), "factory"));
}

// The built-in plans decide as the runtime's plans did before they were plug-ins.
void test_builtin_plans(void**) {
  dos::Workload w = workload({10, 10, 10, 10, 10, 10});
  w.resident = 2;
  assert_string_equal(dos::plan_letters(decide("cpu", w, nullptr)).c_str(), "cccccc");
  assert_string_equal(dos::plan_letters(decide("gpu", w, nullptr)).c_str(), "ssssrr");
  assert_true(decide("static:0.5", workload({10, 10, 10, 10, 10, 10}), nullptr) == dos::static_plan(6, 0.5));
  const dos::Rates r{4e9, 3e9, 1e11, 4e11, 50e9, 50e9};
  dos::Workload big = workload(std::vector<std::size_t>(16, std::size_t(1) << 26));
  big.resident = 3;
  const dos::Execution e{};
  assert_true(decide("dos", big, &r) == dos::choose_plan_simulated(big, r, e).plan);
  assert_true(contains(message_of([&] { decide("dos", big, nullptr); }), "rates"));
  assert_string_equal(dos::plan_letters({PlanSide::cpu, PlanSide::gpu_streamed, PlanSide::gpu_resident}).c_str(), "csr");
  assert_string_equal(dos::plan_letters({}).c_str(), "");
}

// greedy by hand. Rates (params/s, bytes/s): U_c_dma = 1, U_g = 100, B_h2d = 24, B_d2h = 6, so a
// subgroup of p parameters costs p s on the CPU and max(12p/24, p/100, 12p/6) = 2p s streamed.
// Sizes 3 1 1 2 1 4, the clocks (CPU, streaming) starting at (0, 0):
//   3: CPU 3 vs streamed 6  -> CPU        (3, 0)
//   1: CPU 4 vs streamed 2  -> streamed   (3, 2)
//   1: CPU 4 vs streamed 4  -> CPU (tie)  (4, 2)
//   2: CPU 6 vs streamed 6  -> CPU (tie)  (6, 2)
//   1: CPU 7 vs streamed 4  -> streamed   (6, 4)
//   4: CPU 10 vs streamed 12 -> CPU       (10, 4)
void test_greedy(void**) {
  const dos::Rates r{2, 1, 100, 100, 24, 6};
  dos::Workload w = workload({3, 1, 1, 2, 1, 4});
  assert_string_equal(dos::plan_letters(decide("greedy", w, &r)).c_str(), "csccsc");
  // the last two resident (the budget's): the first four decided as above
  w.resident = 2;
  assert_string_equal(dos::plan_letters(decide("greedy", w, &r)).c_str(), "csccrr");
  // nothing may be streamed: all on the CPU but the resident ones
  w.may_stream = false;
  assert_string_equal(dos::plan_letters(decide("greedy", w, &r)).c_str(), "ccccrr");
  // a faster GPU side (B_d2h = 24: 0.5p s streamed) takes every subgroup but where the CPU is ahead
  //   3: 3 vs 1.5 -> s (0, 1.5); 1: 1 vs 2 -> c (1, 1.5); 1: 2 vs 2 -> c (2, 1.5); 2: 4 vs 2.5 -> s (2, 2.5)
  const dos::Rates fast{2, 1, 100, 100, 24, 24};
  assert_string_equal(dos::plan_letters(decide("greedy", workload({3, 1, 1, 2}), &fast)).c_str(), "sccs");
  assert_true(contains(message_of([&] { decide("greedy", w, nullptr); }), "rates"));
}

void test_budgets(void**) {
  // resident subgroups from the budget for the plans that take it; static chooses its own. A
  // subgroup of 100 keeps 12 x 112 = 1344 B of state (each slice padded to 16 elements)
  dos::Workload w = workload({100, 100, 100, 100});
  const auto gpu = dos::make_plan_by_name("gpu");
  dos::apply_gpu_budgets(w, gpu.get(), dos::GpuBudgets{2 * 12 * 100, 0});
  assert_int_equal(w.resident, 1);  // the padding of the second does not fit
  dos::apply_gpu_budgets(w, gpu.get(), dos::GpuBudgets{2 * 12 * 112, 0});
  assert_int_equal(w.resident, 2);
  assert_true(w.may_stream);
  const auto st = dos::make_plan_by_name("static:0.5");
  dos::apply_gpu_budgets(w, st.get(), dos::GpuBudgets{2 * 12 * 112, 0});
  assert_int_equal(w.resident, 0);
  // static:0.25 keeps 3 subgroups (4032 B) resident: over a 2688 B budget, which holds 2 (static:0.5)
  const std::string m = message_of([&] {
    dos::apply_gpu_budgets(w, dos::make_plan_by_name("static:0.25").get(), dos::GpuBudgets{2 * 12 * 112, 0});
  });
  assert_true(contains(m, "static:0.25") && contains(m, "use static:0.5") && contains(m, "2 subgroups fit"));
  // static:0.5's two resident subgroups with their padding (2688 B) over 2400 B: refused, 1 fits
  const std::string m2 = message_of([&] {
    dos::apply_gpu_budgets(w, dos::make_plan_by_name("static:0.5").get(), dos::GpuBudgets{2 * 12 * 100, 0});
  });
  assert_true(contains(m2, "static:0.5") && contains(m2, "use static:0.75") && contains(m2, "1 subgroups fit"));
  // the compact master's state (compact_state_bytes_for, worked by hand): a subgroup of 100 has a
  // stride of 112, a head of 56 + 4 fp32 elements padded to 64, so 4 x (64 + 2 x 112) = 1152 B; a
  // 3456 B budget holds 3 compact states where it holds 2 full ones (2688 B; 3 take 4032 B)
  dos::Workload wc = workload({100, 100, 100, 100});
  wc.compact_master = true;
  assert_int_equal(dos::subgroup_state_bytes(wc, 100), 1152);
  dos::apply_gpu_budgets(wc, gpu.get(), dos::GpuBudgets{3456, 0});
  assert_int_equal(wc.resident, 3);
  dos::apply_gpu_budgets(wc, gpu.get(), dos::GpuBudgets{3455, 0});
  assert_int_equal(wc.resident, 2);
  dos::apply_gpu_budgets(w, gpu.get(), dos::GpuBudgets{3456, 0});
  assert_int_equal(w.resident, 2);
  dos::apply_gpu_budgets(wc, dos::make_plan_by_name("static:0.25").get(), dos::GpuBudgets{3456, 0});  // fits
  const std::string m3 = message_of([&] {
    dos::apply_gpu_budgets(w, dos::make_plan_by_name("static:0.25").get(), dos::GpuBudgets{3456, 0});
  });
  assert_true(contains(m3, "static:0.25") && contains(m3, "2 subgroups fit"));
  const std::string m4 = message_of([&] {
    dos::apply_gpu_budgets(wc, dos::make_plan_by_name("static:0.25").get(), dos::GpuBudgets{3455, 0});
  });
  assert_true(contains(m4, "static:0.25") && contains(m4, "use static:0.5") && contains(m4, "2 subgroups fit"));
  // an update budget below one streamed subgroup (12 B/param of state, caller on the GPU):
  // nothing streams; gpu refuses it; below one CPU subgroup's staging, an error for every plan
  dos::apply_gpu_budgets(w, nullptr, dos::GpuBudgets{-1, 1000});
  assert_false(w.may_stream);
  assert_int_equal(w.resident, 0);
  assert_true(contains(message_of([&] { dos::apply_gpu_budgets(w, gpu.get(), dos::GpuBudgets{-1, 1000}); }),
                       "policy gpu streams every subgroup"));
  // a CPU subgroup's gradient and parameter staging: (4 + 2) x 100 = 600 B, above a 10 B budget
  assert_true(contains(message_of([&] { dos::apply_gpu_budgets(w, nullptr, dos::GpuBudgets{-1, 10}); }),
                       "staging"));
}

void test_parse_policy(void**) {
  const dos::PolicyChoice p = dos::parse_policy("greedy");
  assert_non_null(p.plan.get());
  assert_false(p.builtin());
  const dos::PolicyChoice b = dos::parse_policy("dmda");
  assert_true(b.builtin());
  assert_null(b.starpu_policy);
  const dos::PolicyChoice rr = dos::parse_policy("round-robin");  // scheduler/policies/round_robin.cpp
  assert_true(rr.builtin());
  assert_non_null(rr.starpu_policy);
  assert_string_equal(rr.starpu_policy->policy_name, "round-robin");
  const std::string m = message_of([] { dos::parse_policy("nosuch"); });
  std::printf("  %s\n", m.c_str());
  assert_true(contains(m, "unknown policy 'nosuch'") && contains(m, "cpu, gpu, dos, static:R, greedy") &&
              contains(m, "round-robin") && contains(m, "dmda"));
  assert_true(contains(message_of([] { dos::register_starpu_policy(dos::parse_policy("round-robin").starpu_policy); }),
                       "already taken"));
}

// A plan's sides are checked against its contract (plan_contract_error): the count, nothing
// streamed when the update budget holds no streamed subgroup, resident only where the budget is.
std::unique_ptr<dos::Plan> make_letters(const std::string& letters) {
  struct Letters final : dos::Plan {
    std::string l;
    dos::PlanNeeds needs() const override { return dos::PlanNeeds{}; }  // resident: budget
    std::vector<PlanSide> decide(const dos::PlanInput&) const override {
      std::vector<PlanSide> p;
      for (char c : l) p.push_back(c == 's' ? PlanSide::gpu_streamed : c == 'r' ? PlanSide::gpu_resident : PlanSide::cpu);
      return p;
    }
  };
  auto p = std::make_unique<Letters>();
  p->l = letters;
  p->set_name("letters:" + letters);
  return p;
}

void test_plan_contract(void**) {
  dos::Workload w = workload({10, 10, 10, 10});
  auto check = [&](const std::string& letters) {
    const std::unique_ptr<dos::Plan> p = make_letters(letters);
    return dos::plan_contract_error(*p, w, p->decide(dos::PlanInput{w, nullptr, dos::Execution{}}));
  };
  assert_string_equal(check("cscs").c_str(), "");
  assert_true(contains(check("csc"), "gave 3 sides for 4 subgroups"));
  assert_true(contains(check("ccrc"), "keeps subgroup 2 resident") && contains(check("ccrc"), "holds none"));
  w.resident = 1;
  assert_string_equal(check("cscr").c_str(), "");
  assert_string_equal(check("cscc").c_str(), "");  // the budget left unused
  assert_true(contains(check("ccrr"), "only the last 1"));
  w.may_stream = false;
  assert_true(contains(check("cscr"), "streams subgroup 1") && contains(check("cscr"), "may_stream"));
  assert_string_equal(check("cccr").c_str(), "");
  // a plan choosing its own resident subgroups (static:R) may put them anywhere
  const std::unique_ptr<dos::Plan> own = dos::make_plan_by_name("static:0.5");
  w.resident = 0;
  w.may_stream = true;
  assert_string_equal(dos::plan_contract_error(*own, w, own->decide(dos::PlanInput{w, nullptr, dos::Execution{}})).c_str(), "");
}

// A plan registered by a program runs under the runtime like a built-in one: selected by name, run
// by the placement policy, its plan in every StepStats. (Without a CUDA worker the runtime plans
// every update on the CPU without asking the plan; with one, the test's plan is asked.)
void test_runtime_with_registered_plan(void**) {
  dos::register_plan({"test-runtime-plan", "test-runtime-plan", "every update on the CPU, registered by the test",
                      make_all_cpu});
  dos::RuntimeOptions ro;
  ro.policy = "test-runtime-plan";
  ro.verbose = false;
  dos::Runtime rt(ro);
  assert_non_null(rt.plan());
  assert_string_equal(rt.plan()->name().c_str(), "test-runtime-plan");
  assert_string_equal(rt.running_policy().c_str(), "dos-placement");
  assert_false(rt.model_policy());
  std::vector<float> p(1000, 1.0f), g(1000, 0.5f);
  dos::OptimizerOptions oo;
  oo.dtype = dos::DType::fp32;
  oo.subgroup_size = 300;
  oo.verbose = false;
  dos::Optimizer opt(rt, std::vector<dos::TensorView>{{p.data(), g.data(), 1000}}, oo);
  assert_string_equal(dos::plan_letters(opt.next_plan()).c_str(), "cccc");
  const dos::StepStats st = opt.step();
  assert_string_equal(dos::plan_letters(st.plan).c_str(), "cccc");
  assert_string_equal(dos::plan_letters(st.placement).c_str(), "cccc");
  bool threw = false;  // forced plans need a plan with the model's rates
  try {
    opt.set_plan_override(dos::PlanOverride{dos::PlanOverride::fraction, 0.5});
  } catch (const dos::Error& e) {
    threw = std::string(e.what()).find("test-runtime-plan") != std::string::npos;
  }
  assert_true(threw);
}

// Names that clash are refused where --policy is parsed: a plan named as one of StarPU's own
// policies would silently hide it (or be hidden). Last: the registry keeps the clash.
void test_name_clash(void**) {
  dos::register_plan({"eager", "eager", "a plan with the name of StarPU's eager", make_all_cpu});
  const std::string m = message_of([] { dos::parse_policy("cpu"); });
  std::printf("  %s\n", m.c_str());
  assert_true(contains(m, "the plan 'eager' has the name of one of StarPU's policies"));
  assert_true(contains(dos::policy_name_clash(), "eager"));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry),    cmocka_unit_test(test_register_plan), cmocka_unit_test(test_builtin_plans),
      cmocka_unit_test(test_greedy),      cmocka_unit_test(test_budgets),       cmocka_unit_test(test_parse_policy),
      cmocka_unit_test(test_plan_contract), cmocka_unit_test(test_runtime_with_registered_plan),
      cmocka_unit_test(test_name_clash),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
