// Late binding of a plan's tail (models/tail_binding.h): the side and the moment, on figures worked
// out here by hand.
#include <cmath>
#include <limits>
#include <stdexcept>

#include "cmocka_cpp.h"
#include "tail_binding.h"

namespace {

using dos::PlanSide;
using dos::SideOutlook;

// A subgroup of 1e8 parameters. CPU: 0.05 s of work ahead, 3e-10 s/param (0.03 s for it), drain
// 2 / 5e10 = 4e-11 s/param (0.004 s): ends at 0.084. Stream: 0.02 s ahead, 4e-10 s/param (0.04 s),
// drain 12 / 5e10 = 2.4e-10 s/param (0.024 s): ends at 0.084 too: a tie, which goes to the CPU.
// With 0.001 s less ahead of the stream it ends first; with 0.001 s more, the CPU does.
void test_bind_side(void**) {
  const std::size_t n = 100000000;
  const SideOutlook cpu{0.05, 3e-10, 4e-11};
  SideOutlook stream{0.02, 4e-10, 2.4e-10};
  assert_true(dos::bind_tail(n, cpu, stream) == PlanSide::cpu);
  stream.left = 0.019;
  assert_true(dos::bind_tail(n, cpu, stream) == PlanSide::gpu_streamed);
  stream.left = 0.021;
  assert_true(dos::bind_tail(n, cpu, stream) == PlanSide::cpu);
  // the drain counts: without the stream's 0.024 s of write-back, the stream ends at 0.06 < 0.084
  stream = {0.02, 4e-10, 0};
  assert_true(dos::bind_tail(n, cpu, stream) == PlanSide::gpu_streamed);
  // the size counts: a subgroup of 1 parameter goes where less work is ahead (the stream, 0.02)
  stream = {0.02, 4e-10, 2.4e-10};
  assert_true(dos::bind_tail(1, cpu, stream) == PlanSide::gpu_streamed);
}

// Due when a side's work ahead is down to its lead (1 unless said) of its own updates of the
// subgroup's size: the CPU at 0.03 s (1e8 x 3e-10), the stream at 0.04 s (1e8 x 4e-10).
void test_due(void**) {
  const std::size_t n = 100000000;
  SideOutlook cpu{0.05, 3e-10, 0}, stream{0.06, 4e-10, 0};
  assert_false(dos::tail_due(n, cpu, stream));
  cpu.left = 0.03;
  assert_true(dos::tail_due(n, cpu, stream));
  cpu.left = 0.031;
  assert_false(dos::tail_due(n, cpu, stream));
  stream.left = 0.04;
  assert_true(dos::tail_due(n, cpu, stream));
  // nothing ahead on a side: due at once
  assert_true(dos::tail_due(n, SideOutlook{0, 3e-10, 0}, SideOutlook{1, 4e-10, 0}));
  // a lead of 2 updates: the stream is due at 0.08 s ahead
  stream = {0.081, 4e-10, 0, 2};
  assert_false(dos::tail_due(n, SideOutlook{0.05, 3e-10, 0}, stream));
  stream.left = 0.08;
  assert_true(dos::tail_due(n, SideOutlook{0.05, 3e-10, 0}, stream));
}

void test_bad_input(void**) {
  const SideOutlook ok{0.01, 1e-10, 0};
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const SideOutlook bad : {SideOutlook{-1, 1e-10, 0}, SideOutlook{0.01, nan, 0}, SideOutlook{0.01, 1e-10, inf},
                                SideOutlook{0.01, 1e-10, 0, -1}}) {
    bool threw = false;
    try {
      dos::bind_tail(10, bad, ok);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    assert_true(threw);
    threw = false;
    try {
      dos::tail_due(10, ok, bad);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    assert_true(threw);
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_bind_side), cmocka_unit_test(test_due),
                                     cmocka_unit_test(test_bad_input)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
