// The calibration's PCIe rates from several readings (models/link_calibration.h): which reading is
// low against StarPU's bus figures, the best of several, how many readings read_link takes and
// what it keeps, and the warning's figures. Readings are made up here: the GPU calibration that
// feeds them is calibrate_rates'.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cmocka_cpp.h"
#include "link_calibration.h"

namespace {

constexpr double G = 1e9;  // bytes/s per GB/s

// StarPU's bus figures on the GPU machine's H100s, one direction at a time: 53.6 host to device,
// 54.1 device to host (unequal, so that a rate judged against the other direction's shows)
const dos::LinkReading kBus{53.6 * G, 54.1 * G, 0, 0};

void test_low_against_reference(void**) {
  // a healthy H100 reading: one way 55 / 53, both at once 48 / 51
  assert_false(dos::link_reading_low({55 * G, 53 * G, 48 * G, 51 * G}, kBus));
  // the low calibration on record: both at once 24.8 / 30.4, one way not recorded (here normal)
  assert_true(dos::link_reading_low({55.2 * G, 55.2 * G, 24.8 * G, 30.4 * G}, kBus));
  // and as the cache keeps it: the rates both at once only
  assert_true(dos::link_reading_low({0, 0, 24.8 * G, 30.4 * G}, kBus));
  assert_false(dos::link_reading_low({0, 0, 48 * G, 51 * G}, kBus));
  // one rate low is enough: either direction, alone or both at once
  assert_true(dos::link_reading_low({55 * G, 40 * G, 48 * G, 48 * G}, kBus));
  assert_true(dos::link_reading_low({40 * G, 55 * G, 48 * G, 48 * G}, kBus));
  assert_true(dos::link_reading_low({55 * G, 55 * G, 40 * G, 48 * G}, kBus));
  assert_true(dos::link_reading_low({55 * G, 55 * G, 48 * G, 40 * G}, kBus));
  // the threshold itself, each direction against its own figure: kLowLinkFraction of it is not
  // low, just below it is
  const double eh = dos::kLowLinkFraction * 53.6 * G, ed = dos::kLowLinkFraction * 54.1 * G;
  assert_false(dos::link_reading_low({eh, ed, eh, ed}, kBus));
  assert_true(dos::link_reading_low({eh * (1 - 1e-12), ed, eh, ed}, kBus));
  assert_true(dos::link_reading_low({eh, ed * (1 - 1e-12), eh, ed}, kBus));
  assert_true(dos::link_reading_low({eh, ed, eh * (1 - 1e-12), ed}, kBus));
  assert_true(dos::link_reading_low({eh, ed, eh, ed * (1 - 1e-12)}, kBus));
  // between the two thresholds (40.2 and 40.575 GB/s): low only in the device-to-host direction
  assert_false(dos::link_reading_low({40.4 * G, 55 * G, 48 * G, 48 * G}, kBus));
  assert_true(dos::link_reading_low({55 * G, 40.4 * G, 48 * G, 48 * G}, kBus));
  assert_false(dos::link_reading_low({55 * G, 55 * G, 40.4 * G, 48 * G}, kBus));
  assert_true(dos::link_reading_low({55 * G, 55 * G, 48 * G, 40.4 * G}, kBus));
  // no reference (StarPU without a bus figure, or not a number): never low
  assert_false(dos::link_reading_low({1 * G, 1 * G, 1 * G, 1 * G}, dos::LinkReading{}));
  assert_false(dos::link_reading_low({1 * G, 1 * G, 1 * G, 1 * G}, dos::LinkReading{NAN, INFINITY, 0, 0}));
  assert_false(dos::link_reading_low({1 * G, 1 * G, 1 * G, 1 * G}, dos::LinkReading{-5 * G, 0, 0, 0}));
  // nothing measured (0), or a rate that is no measure: not low
  assert_false(dos::link_reading_low({0, 0, 0, 0}, kBus));
  assert_false(dos::link_reading_low({-1, NAN, 0, -INFINITY}, kBus));
}

void test_best_of_readings(void**) {
  // every pair low: one way each direction's best; both at once the pair of the largest sum (78
  // here), not the best of each (47 / 50), which no reading reached
  const dos::LinkReading b = dos::best_link_reading(
      {{30 * G, 55 * G, 28 * G, 50 * G}, {52 * G, 31 * G, 47 * G, 29 * G}, {10 * G, 10 * G, 9 * G, 9 * G}}, kBus);
  ASSERT_NEAR(b.h2d, 52 * G, 0);
  ASSERT_NEAR(b.d2h, 55 * G, 0);
  ASSERT_NEAR(b.duplex_h2d, 28 * G, 0);
  ASSERT_NEAR(b.duplex_d2h, 50 * G, 0);
  // a healthy pair is kept over a low one of a larger sum (40 + 50 against 42 + 42), in either order
  for (int order = 0; order < 2; ++order) {
    std::vector<dos::LinkReading> r{{55 * G, 55 * G, 40 * G, 50 * G}, {55 * G, 55 * G, 42 * G, 42 * G}};
    if (order) std::swap(r[0], r[1]);
    const dos::LinkReading h = dos::best_link_reading(r, kBus);
    ASSERT_NEAR(h.duplex_h2d, 42 * G, 0);
    ASSERT_NEAR(h.duplex_d2h, 42 * G, 0);
  }
  // among healthy pairs, the largest sum, wherever it stands
  const dos::LinkReading c = dos::best_link_reading(
      {{55 * G, 55 * G, 42 * G, 42 * G}, {55 * G, 55 * G, 30 * G, 60 * G}, {55 * G, 55 * G, 48 * G, 50 * G},
       {55 * G, 55 * G, 45 * G, 45 * G}},
      kBus);
  ASSERT_NEAR(c.duplex_h2d, 48 * G, 0);
  ASSERT_NEAR(c.duplex_d2h, 50 * G, 0);
  const dos::LinkReading none = dos::best_link_reading({}, kBus);
  assert_true(none.h2d == 0 && none.d2h == 0 && none.duplex_h2d == 0 && none.duplex_d2h == 0);
}

// read_link against a list of readings, each taken in turn; counts the measures and the pauses
struct Script {
  std::vector<dos::LinkReading> readings;
  std::vector<bool> ok;  // whether each measure succeeds (true where shorter)
  dos::LinkReading reference = kBus;
  int measured = 0, paused = 0;
  dos::LinkReading run(int* taken, bool* low) {
    return dos::read_link(
        [this](dos::LinkReading* out) {
          const std::size_t i = std::size_t(measured++);
          assert_true(i < readings.size());  // no more measures than the script has readings
          if (i < ok.size() && !ok[i]) return false;
          *out = readings[i];
          return true;
        },
        [this] { ++paused; }, reference, taken, low);
  }
};

// Runs s through read_link and checks what it did: the measures made, the pauses between them, the
// readings it counted and whether it called the best low. Returns the best reading.
dos::LinkReading run_expecting(Script& s, int measured, int paused, int taken, bool low) {
  int got_taken = -1;
  bool got_low = !low;
  const dos::LinkReading b = s.run(&got_taken, &got_low);
  assert_int_equal(s.measured, measured);
  assert_int_equal(s.paused, paused);
  assert_int_equal(got_taken, taken);
  assert_int_equal(got_low, low);
  return b;
}

// n copies of reading r
std::vector<dos::LinkReading> times(int n, const dos::LinkReading& r) { return std::vector<dos::LinkReading>(n, r); }

void test_read_link_once_when_healthy(void**) {
  Script s{{{55 * G, 53 * G, 48 * G, 51 * G}}, {}};
  const dos::LinkReading b = run_expecting(s, 1, 0, 1, false);
  ASSERT_NEAR(b.duplex_h2d, 48 * G, 0);
  ASSERT_NEAR(b.duplex_d2h, 51 * G, 0);
  // read_link takes null out-pointers
  Script t{{{55 * G, 53 * G, 48 * G, 51 * G}}, {}};
  ASSERT_NEAR(t.run(nullptr, nullptr).duplex_d2h, 51 * G, 0);
}

void test_read_link_keeps_healthy_pair(void**) {
  // a low pair of the larger sum, then a healthy one: two measures, not low, the healthy pair kept
  Script s{{{55 * G, 55 * G, 40 * G, 50 * G}, {55 * G, 55 * G, 42 * G, 42 * G}, {60 * G, 60 * G, 60 * G, 60 * G}}, {}};
  const dos::LinkReading b = run_expecting(s, 2, 1, 2, false);
  ASSERT_NEAR(b.duplex_h2d, 42 * G, 0);
  ASSERT_NEAR(b.duplex_d2h, 42 * G, 0);
  // each reading low one way in another direction: their best is healthy, though the last is not
  Script t{{{30 * G, 55 * G, 48 * G, 48 * G}, {55 * G, 30 * G, 48 * G, 48 * G}, {60 * G, 60 * G, 60 * G, 60 * G}}, {}};
  const dos::LinkReading c = run_expecting(t, 2, 1, 2, false);
  ASSERT_NEAR(c.h2d, 55 * G, 0);
  ASSERT_NEAR(c.d2h, 55 * G, 0);
}

void test_read_link_again_until_healthy(void**) {
  // low (the record's rates both at once), low, then healthy: three readings, two pauses; the
  // rates both at once those of the third (the largest sum)
  Script s{{{55 * G, 55 * G, 24.8 * G, 30.4 * G}, {30 * G, 52 * G, 26 * G, 49 * G}, {55 * G, 50 * G, 48.2 * G, 47 * G},
            {60 * G, 60 * G, 60 * G, 60 * G}}, {}};
  const dos::LinkReading b = run_expecting(s, 3, 2, 3, false);
  ASSERT_NEAR(b.duplex_h2d, 48.2 * G, 0);
  ASSERT_NEAR(b.duplex_d2h, 47 * G, 0);
  ASSERT_NEAR(b.h2d, 55 * G, 0);
  ASSERT_NEAR(b.d2h, 55 * G, 0);
}

void test_read_link_stays_low(void**) {
  // low every time: kMostLinkReadings readings, then low, the best of them kept
  std::vector<dos::LinkReading> r;
  for (int i = 0; i < dos::kMostLinkReadings; ++i) r.push_back({(25.0 + i) * G, 30 * G, (20.0 + i) * G, 28 * G});
  Script s{r, {}};
  const int n = dos::kMostLinkReadings;
  const dos::LinkReading b = run_expecting(s, n, n - 1, n, true);
  ASSERT_NEAR(b.duplex_h2d, (20.0 + n - 1) * G, 0);
  ASSERT_NEAR(b.duplex_d2h, 28 * G, 0);
  const std::string w = dos::low_link_warning(b, kBus, n, "/cache/rates-x.json");
  std::printf("  %s\n", w.c_str());
  assert_non_null(std::strstr(w.c_str(), "warning"));
  assert_non_null(std::strstr(w.c_str(), ("the best of " + std::to_string(n) + " readings").c_str()));
  assert_non_null(std::strstr(w.c_str(), "host to device: alone 29.0 GB/s, both ways at once 24.0 GB/s against StarPU's 53.6 GB/s"));
  assert_non_null(std::strstr(w.c_str(), "device to host: alone 30.0 GB/s, both ways at once 28.0 GB/s against StarPU's 54.1 GB/s"));
  assert_non_null(std::strstr(w.c_str(), "below 75% of StarPU's bus calibration"));
  assert_non_null(std::strstr(w.c_str(), "cached in /cache/rates-x.json"));
  assert_non_null(std::strstr(w.c_str(), "--recalibrate"));
  assert_non_null(std::strstr(w.c_str(), "STARPU_BUS_CALIBRATE=1"));
}

void test_warning_names_what_is_low(void**) {
  // only device to host low, both at once only: host to device not named
  const std::string w = dos::low_link_warning({55 * G, 55 * G, 48 * G, 30 * G}, kBus, 1, "/c/r.json");
  std::printf("  %s\n", w.c_str());
  assert_non_null(std::strstr(w.c_str(), "the best of 1 reading)"));
  assert_non_null(std::strstr(w.c_str(), "device to host: both ways at once 30.0 GB/s against StarPU's 54.1 GB/s"));
  assert_null(std::strstr(w.c_str(), "host to device:"));
  assert_null(std::strstr(w.c_str(), "alone"));
  // from the cache (no reading in this process): the file named as the rates' source
  const std::string c = dos::low_link_warning({0, 0, 24.8 * G, 30.4 * G}, kBus, 0, "/c/r.json");
  std::printf("  %s\n", c.c_str());
  assert_non_null(std::strstr(c.c_str(), "the cached calibration in /c/r.json holds PCIe rates that are low"));
  assert_non_null(std::strstr(c.c_str(), "host to device: both ways at once 24.8 GB/s against StarPU's 53.6 GB/s"));
  assert_non_null(std::strstr(c.c_str(), "device to host: both ways at once 30.4 GB/s against StarPU's 54.1 GB/s"));
  assert_null(std::strstr(c.c_str(), "reading"));
  // a long cache path is not cut: the advice after it is whole
  const std::string path = "/" + std::string(600, 'p') + "/rates.json";
  const std::string l = dos::low_link_warning({0, 0, 24.8 * G, 30.4 * G}, kBus, 3, path);
  assert_non_null(std::strstr(l.c_str(), path.c_str()));
  assert_non_null(std::strstr(l.c_str(), "reads low every time"));
}

void test_read_link_references(void**) {
  // no usable reference: one reading, never low
  Script s{times(5, {1 * G, 1 * G, 1 * G, 1 * G}), {}, dos::LinkReading{NAN, 0, 0, 0}};
  run_expecting(s, 1, 0, 1, false);
  // a reference far above the link (a stale StarPU figure): every reading low, then warned
  Script t{times(5, {55 * G, 55 * G, 48 * G, 51 * G}), {}, dos::LinkReading{200 * G, 200 * G, 0, 0}};
  const dos::LinkReading b = run_expecting(t, dos::kMostLinkReadings, dos::kMostLinkReadings - 1, 5, true);
  ASSERT_NEAR(b.duplex_h2d, 48 * G, 0);  // kept all the same
}

void test_read_link_failed_measure(void**) {
  // the first measure fails: nothing read, not low (the caller keeps StarPU's figures), no retry
  Script s{{{1 * G, 1 * G, 1 * G, 1 * G}}, {false}};
  const dos::LinkReading b = run_expecting(s, 1, 0, 0, false);
  assert_true(b.duplex_h2d == 0 && b.duplex_d2h == 0);
  // a low reading, then a failed measure, then a healthy one: two readings kept
  Script t{{{27 * G, 32 * G, 24 * G, 30 * G}, {}, {55 * G, 55 * G, 50 * G, 50 * G}}, {true, false, true}};
  const dos::LinkReading c = run_expecting(t, 3, 2, 2, false);
  ASSERT_NEAR(c.duplex_h2d, 50 * G, 0);
  // a low reading, then only failures: the measures' limit counts them; the one reading kept, low
  Script u{times(5, {27 * G, 32 * G, 24 * G, 30 * G}), {true, false, false, false, false}};
  const dos::LinkReading d = run_expecting(u, dos::kMostLinkReadings, dos::kMostLinkReadings - 1, 1, true);
  ASSERT_NEAR(d.duplex_d2h, 30 * G, 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_low_against_reference),       cmocka_unit_test(test_best_of_readings),
      cmocka_unit_test(test_read_link_once_when_healthy), cmocka_unit_test(test_read_link_again_until_healthy),
      cmocka_unit_test(test_read_link_stays_low),         cmocka_unit_test(test_warning_names_what_is_low),
      cmocka_unit_test(test_read_link_references),        cmocka_unit_test(test_read_link_failed_measure),
      cmocka_unit_test(test_read_link_keeps_healthy_pair),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
