// save_checkpoint's check that the job it is told about is the optimizer's own (runtime/io/
// checkpoint.h): a range of another count, another subgroup size or dtype is refused before
// anything is written, where it once saved a checkpoint that could never be resumed; the
// optimizer's own description saves and resumes.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cmocka_cpp.h"
#include "dos.h"

namespace {

bool refused(const std::string& dir, const dos::Optimizer& opt, const dos::CheckpointInfo& info, const char* part) {
  try {
    dos::save_checkpoint(dir, opt, info);
  } catch (const dos::Error& e) {
    std::printf("  refused: %s\n", e.what());
    return std::string(e.what()).find(part) != std::string::npos;
  }
  return false;
}

void test_info_must_describe_the_optimizer(void**) {
  dos::RuntimeOptions ro;
  ro.policy = "cpu";
  ro.verbose = false;
  dos::Runtime rt(ro);
  std::vector<std::uint16_t> p(10, 0x3f80), g(10, 0x3f00);  // bf16 1.0 and 0.5
  dos::OptimizerOptions oo;
  oo.dtype = dos::DType::bf16;
  oo.subgroup_size = 4;
  oo.verbose = false;
  dos::Optimizer opt(rt, {{p.data(), g.data(), 10}}, oo);
  opt.step();
  char tmpl[] = "/tmp/dos-ck-info-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  const std::string dir = std::string(tmpl) + "/ck";
  dos::CheckpointInfo good;
  good.model = "test";
  good.params_total = 10;
  good.begin = 0;
  good.end = 10;
  good.subgroup_size = 4;
  good.dtype = "bf16";
  good.iteration = 1;
  dos::CheckpointInfo bad = good;
  bad.params_total = bad.end = 20;
  assert_true(refused(dir, opt, bad, "holds 20 parameters, the optimizer 10"));
  bad = good;
  bad.subgroup_size = 7;
  assert_true(refused(dir, opt, bad, "subgroups of 7 elements, the optimizer's are of 4"));
  bad = good;
  bad.dtype = "fp16";
  assert_true(refused(dir, opt, bad, "dtype 'fp16', the optimizer's is bf16"));
  bad.dtype = "garbage";
  assert_true(refused(dir, opt, bad, "dtype 'garbage'"));
  struct stat st;
  assert_int_not_equal(::stat(dir.c_str(), &st), 0);  // nothing was written
  dos::save_checkpoint(dir, opt, good);
  dos::Optimizer again(rt, {{p.data(), g.data(), 10}}, oo);
  assert_int_equal(dos::load_checkpoint(dir, again, good).iteration, 1);
  assert_int_equal(again.step_count(0), 1);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_info_must_describe_the_optimizer)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
