// The measurement switches' reader (codelets/kernels/env_choice.h): unset and empty give the
// default silently, each accepted value its position, a value that is none of them the default
// with one warning on standard error naming the variable, the value and the accepted values; and
// its whole-number switches (env_whole).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "cmocka_cpp.h"
#include "env_choice.h"

namespace {

using dos::detail::env_choice;
using dos::detail::env_index;

constexpr const char* kName = "DOS_TEST_ENV_CHOICE";

/// What f() writes to standard error (file descriptor 2), through a temporary file.
template <class F>
std::string stderr_of(F f) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  assert_non_null(tmp);
  const int saved = dup(2);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(tmp), 2) >= 0);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  std::rewind(tmp);
  for (int c; (c = std::fgetc(tmp)) != EOF;) out += char(c);
  std::fclose(tmp);
  return out;
}

/// env_choice of kName over {fast, slow, exact} with default 1, and what it printed.
int choice(std::string* printed) {
  int got = -100;
  *printed = stderr_of([&] { got = env_choice(kName, {"fast", "slow", "exact"}, 1, "slow is used"); });
  return got;
}

void test_unset_and_empty_give_the_default(void**) {
  std::string printed;
  unsetenv(kName);
  assert_int_equal(choice(&printed), 1);
  assert_string_equal(printed.c_str(), "");
  assert_int_equal(env_index(kName, {"fast"}), dos::detail::kEnvUnset);
  setenv(kName, "", 1);
  assert_int_equal(choice(&printed), 1);
  assert_string_equal(printed.c_str(), "");
  assert_int_equal(env_index(kName, {"fast"}), dos::detail::kEnvUnset);
  // a default that is no position in the list (the caller's own "none of them")
  assert_int_equal(env_choice(kName, {"fast", "slow"}, -1, "unused"), -1);
  unsetenv(kName);
}

void test_each_value_its_position(void**) {
  std::string printed;
  const char* values[] = {"fast", "slow", "exact"};
  for (int i = 0; i < 3; ++i) {
    setenv(kName, values[i], 1);
    assert_int_equal(choice(&printed), i);
    assert_string_equal(printed.c_str(), "");
  }
  unsetenv(kName);
}

void test_bad_value_warns_once_and_gives_the_default(void**) {
  std::string printed;
  // case matters, and so do spaces: these are none of the values
  for (const char* bad : {"Fast", "fast ", "sl", "2"}) {
    setenv(kName, bad, 1);
    assert_int_equal(choice(&printed), 1);
    const std::string want =
        std::string("[dos] warning: DOS_TEST_ENV_CHOICE=") + bad + " is not one of fast, slow, exact; slow is used\n";
    assert_string_equal(printed.c_str(), want.c_str());
    assert_int_equal(env_index(kName, {"fast", "slow", "exact"}), dos::detail::kEnvOther);
  }
  // one accepted value: named alone
  setenv(kName, "x", 1);
  int got = 0;
  printed = stderr_of([&] { got = env_choice(kName, {"only"}, -1, "ignored"); });
  assert_int_equal(got, -1);
  assert_string_equal(printed.c_str(), "[dos] warning: DOS_TEST_ENV_CHOICE=x is not only; ignored\n");
  unsetenv(kName);
}

// env_whole: unset and empty give the fallback silently; a whole number within the range itself
// (both ends included); below, above, a fraction, a trailing letter or a word the fallback, with
// one warning naming the variable, its value, the range and what is used instead.
void test_whole_number(void**) {
  using dos::detail::env_whole;
  unsetenv(kName);
  std::string printed = stderr_of([] { assert_int_equal(env_whole(kName, 1, 64, 5, "5"), 5); });
  assert_string_equal(printed.c_str(), "");
  setenv(kName, "", 1);
  assert_int_equal(env_whole(kName, 1, 64, 5, "5"), 5);
  for (const auto& [text, want] : {std::pair<const char*, long>{"1", 1}, {"2", 2}, {"64", 64}}) {
    setenv(kName, text, 1);
    printed = stderr_of([&, w = want] { assert_int_equal(env_whole(kName, 1, 64, 5, "5"), w); });
    assert_string_equal(printed.c_str(), "");
  }
  for (const char* bad : {"0", "65", "-3", "2.5", "12x", "two"}) {
    setenv(kName, bad, 1);
    printed = stderr_of([] { assert_int_equal(env_whole(kName, 1, 64, 5, "five"), 5); });
    const std::string want = std::string("[dos] warning: DOS_TEST_ENV_CHOICE='") + bad +
                             "' is not a whole number from 1 to 64: ignored (five)\n";
    assert_string_equal(printed.c_str(), want.c_str());
  }
  unsetenv(kName);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unset_and_empty_give_the_default),
      cmocka_unit_test(test_each_value_its_position),
      cmocka_unit_test(test_bad_value_warns_once_and_gives_the_default),
      cmocka_unit_test(test_whole_number),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
