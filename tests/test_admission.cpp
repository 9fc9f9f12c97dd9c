// The GPU update budget's admission window (runtime/admission.h): what fits, the headroom that
// prefetches leave for the subgroup being submitted, waiting for room, and the peak.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "admission.h"
#include "cmocka_cpp.h"

namespace {

void test_no_limit(void**) {
  dos::AdmissionWindow w;
  w.reset(0);
  for (int i = 0; i < 10; ++i) assert_true(w.try_take(std::size_t(1) << 40, std::size_t(1) << 40));
  w.take(123);
  assert_int_equal(w.used, 10 * (std::size_t(1) << 40) + 123);
}

void test_headroom_and_peak(void**) {
  dos::AdmissionWindow w;
  w.reset(100);
  assert_true(w.try_take(60, 0));
  assert_false(w.try_take(50, 0));   // 110 > 100
  assert_false(w.try_take(30, 20));  // 60 + 30 + 20 room for the next one > 100
  assert_true(w.try_take(30, 10));   // 100, exactly
  assert_int_equal(w.used, 90);
  assert_int_equal(w.peak, 90);      // the headroom is not counted as taken
  w.give(60);
  w.give(30);
  assert_int_equal(w.used, 0);
  assert_int_equal(w.peak, 90);
  // a subgroup larger than the whole budget still gets in, alone
  w.take(150);
  assert_int_equal(w.peak, 150);
  w.give(150);
  w.reset(100);
  assert_int_equal(w.peak, 0);
}

// take() waits until another thread gives room back, and only until then
void test_take_waits(void**) {
  dos::AdmissionWindow w;
  w.reset(100);
  w.take(90);
  std::atomic<bool> in{false};
  std::thread t([&] {
    w.take(50);
    in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  assert_false(in.load());  // 90 + 50 > 100: still waiting
  w.give(90);
  t.join();
  assert_true(in.load());
  assert_int_equal(w.used, 50);
}

// The runtime's pattern: prefetches take with the largest footprint as headroom, submissions take
// (waiting), completions on other threads give back. Whatever the order, every subgroup gets in,
// the window never holds more than the limit, and ends empty.
void test_submission_pattern(void**) {
  const std::size_t limit = 100, largest = 40;
  const std::vector<std::size_t> fp = {40, 10, 40, 10, 40, 10, 40, 25, 40, 5};
  dos::AdmissionWindow w;
  w.reset(limit);
  std::vector<char> admitted(fp.size(), 0);
  std::vector<std::thread> done;
  for (std::size_t i = 0; i < fp.size(); ++i) {
    for (std::size_t q = i + 1; q < fp.size() && q <= i + 3; ++q)  // lookahead 3
      if (!admitted[q] && w.try_take(fp[q], largest)) admitted[q] = 1;
    if (!admitted[i]) w.take(fp[i]);
    admitted[i] = 1;
    done.emplace_back([&w, &fp, i] {  // the subgroup's work ends a little later, elsewhere
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + 3 * (i % 4)));
      w.give(fp[i]);
    });
  }
  for (auto& t : done) t.join();
  assert_int_equal(w.used, 0);
  assert_true(w.peak <= limit);
  assert_true(w.peak >= largest);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_limit),
      cmocka_unit_test(test_headroom_and_peak),
      cmocka_unit_test(test_take_waits),
      cmocka_unit_test(test_submission_pattern),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
