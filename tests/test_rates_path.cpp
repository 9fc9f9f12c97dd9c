// The rates cache's file name (rates_cache_path): one file per configuration, and calibrations with
// and without the link_share measure (DOS_CALIBRATE_LINK_SHARE=1) in files of their own. Run once
// with the switch and once without (meson.build); each run checks the name its environment asks for.
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

void test_cache_names(void**) {
  const char* sw = std::getenv("DOS_CALIBRATE_LINK_SHARE");
  const bool on = sw && std::strcmp(sw, "1") == 0;
  const std::string a = dos::rates_cache_path(*g_rt, 1000, dos::DType::bf16, dos::MemoryKind::host);
  const std::string b = dos::rates_cache_path(*g_rt, 1001, dos::DType::bf16, dos::MemoryKind::host);
  const std::string c = dos::rates_cache_path(*g_rt, 1000, dos::DType::fp16, dos::MemoryKind::host);
  const std::string d = dos::rates_cache_path(*g_rt, 1000, dos::DType::bf16, dos::MemoryKind::cuda);
  std::printf("  %s\n", a.c_str());
  // every configuration its own file, in the cache folder given
  assert_true(a != b && a != c && a != d && b != c && b != d && c != d);
  assert_true(a.rfind(std::string(std::getenv("DOS_CACHE_DIR")) + "/rates-", 0) == 0);
  assert_true(a.find("-S1000") != std::string::npos);
  // the switch's own name, and only with the switch
  assert_true(ends_with(a, on ? "-link_share.json" : "-S1000.json"));
  assert_true(ends_with(d, on ? "-link_share.json" : "-S1000.json"));
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
