// The rates cache's file name (rates_cache_path): one file per configuration, and the calibration's
// link_share rules (DOS_CALIBRATE_LINK_SHARE: estimate by default, placeholder, measure or its older
// spelling 1, dma) in files of their own. Run once per value (meson.build); each run checks the name its
// environment asks for, and a value that names no rule is refused with an error naming the variable.
// The calibration's scratch subgroups (DOS_CALIBRATION_SUBGROUPS) other than the default 8 give
// files of their own too ("-scratchN" after the rule's part of the name, before "-compact"): run
// with 8, 32 and a refused value as well (meson.build).
#include <cstdlib>
#include <cstring>
#include <string>

#include "cmocka_cpp.h"
#include "dos.h"

namespace {

dos::Runtime* g_rt = nullptr;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// rates_cache_path refused on every call (nothing cached) with an error naming the variable `var`
/// and its value `value`
void expect_refused(const char* var, const std::string& value) {
  for (int call = 0; call < 2; ++call) {
    try {
      (void)dos::rates_cache_path(*g_rt, 1000, dos::DType::bf16, dos::MemoryKind::host);
      fail_msg("%s=%s was accepted", var, value.c_str());
    } catch (const dos::Error& e) {
      std::printf("  refused: %s\n", e.what());
      assert_non_null(std::strstr(e.what(), var));
      assert_non_null(std::strstr(e.what(), value.c_str()));
    }
  }
}

void test_cache_names(void**) {
  const char* sub = std::getenv("DOS_CALIBRATION_SUBGROUPS");
  const std::string scratch = sub ? sub : "";
  if (scratch != "" && scratch != "8" && scratch != "32") {
    // a value that is not a multiple of 4 from 8 to 32
    expect_refused("DOS_CALIBRATION_SUBGROUPS", scratch);
    return;
  }
  const char* sw = std::getenv("DOS_CALIBRATE_LINK_SHARE");
  const std::string rule = sw ? sw : "";
  if (rule != "" && rule != "estimate" && rule != "placeholder" && rule != "measure" && rule != "1" && rule != "dma") {
    // a value that names no rule
    expect_refused("DOS_CALIBRATE_LINK_SHARE", rule);
    return;
  }
  const std::string rule_part = rule == "measure" || rule == "1" ? "-link_share"
                                : rule == "placeholder"         ? "-S1000"
                                : rule == "dma"                 ? "-link_share_dma"
                                                                : "-link_share_estimate";
  // 32 scratch subgroups: their own name; 8, as unset: the name every earlier file has
  const std::string stem = rule_part + (scratch == "32" ? "-scratch32" : ""), suffix = stem + ".json";
  const std::string a = dos::rates_cache_path(*g_rt, 1000, dos::DType::bf16, dos::MemoryKind::host);
  const std::string b = dos::rates_cache_path(*g_rt, 1001, dos::DType::bf16, dos::MemoryKind::host);
  const std::string c = dos::rates_cache_path(*g_rt, 1000, dos::DType::fp16, dos::MemoryKind::host);
  const std::string d = dos::rates_cache_path(*g_rt, 1000, dos::DType::bf16, dos::MemoryKind::cuda);
  std::printf("  %s\n", a.c_str());
  // every configuration its own file, in the cache folder given
  assert_true(a != b && a != c && a != d && b != c && b != d && c != d);
  assert_true(a.rfind(std::string(std::getenv("DOS_CACHE_DIR")) + "/rates-", 0) == 0);
  assert_true(a.find("-S1000") != std::string::npos);
  // each rule's own name; the placeholder's without a suffix, as every file written before the
  // estimate was
  assert_true(ends_with(a, suffix));
  assert_true(ends_with(d, suffix));
  assert_true((a.find("-scratch") != std::string::npos) == (scratch == "32"));
  // the compact master's file: "-compact" last, after the scratch's part
  const std::string e = dos::rates_cache_path(*g_rt, 1000, dos::DType::bf16, dos::MemoryKind::host, true);
  assert_true(ends_with(e, stem + "-compact.json"));
}

}  // namespace

int main() {
  setenv("DOS_CACHE_DIR", "/nonexistent-dos-cache", 1);  // only named: nothing is read or written
  dos::RuntimeOptions ro;
  ro.policy = "cpu";
  ro.ncuda = 0;
  ro.verbose = false;
  dos::Runtime rt(ro);
  g_rt = &rt;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cache_names)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
