// dos::c_api::named (runtime/c_api_convert.h): the C ABI's failure messages, each against the text
// it must give, written out here. The call's name once (the C++ method's own lead dropped, also
// for read_masters / write_masters, whose C++ methods are named otherwise), the optimizer's call
// hints in C names only for a dos::UsageError's text (call_hints), and a caller's quoted value
// kept as it was.
#include <string>

#include "cmocka_cpp.h"
#include "c_api_convert.h"

using dos::c_api::named;

namespace {

void expect(const std::string& got, const std::string& want) {
  if (got != want) fail_msg("got  '%s'\nwant '%s'", got.c_str(), want.c_str());
}

void test_lead(void** state) {
  (void)state;
  expect(named("dos_optimizer_create", "subgroup_size must be >= 1"),
         "dos_optimizer_create: subgroup_size must be >= 1");
  expect(named("dos_optimizer_set_gradients", "set_gradients: tensor 1 is NULL"),
         "dos_optimizer_set_gradients: tensor 1 is NULL");
  expect(named("dos_optimizer_gradients_final", "gradients_final after finish_step_async: x"),
         "dos_optimizer_gradients_final after finish_step_async: x");
  expect(named("dos_optimizer_write_masters", "write_master_range: values is null"),
         "dos_optimizer_write_masters: values is null");
  expect(named("dos_optimizer_read_masters", "read_master_range: the range [0, 9) is not inside"),
         "dos_optimizer_read_masters: the range [0, 9) is not inside");
  expect(named("dos_optimizer_step", "step() was called while another thread's step() runs"),
         "dos_optimizer_step was called while another thread's step() runs");
  expect(named("dos_runtime_create", "create: x"), "dos_runtime_create: x");
  // a lead that is only the start of a longer word is kept
  expect(named("dos_optimizer_step", "steps must be counted"), "dos_optimizer_step: steps must be counted");
  expect(named("dos_optimizer_write_masters", "write_master_ranges: x"),
         "dos_optimizer_write_masters: write_master_ranges: x");
}

void test_call_hints(void** state) {
  (void)state;
  expect(named("dos_optimizer_gradients_final",
               "gradients_final after finish_step_async: wait for it (wait_step), then open the next with begin_step",
               true),
         "dos_optimizer_gradients_final after dos_optimizer_finish_step_async: wait for it "
         "(dos_optimizer_wait_step), then open the next with dos_optimizer_begin_step");
  expect(named("dos_optimizer_step", "step() was called while another thread's step() or begin_step() runs", true),
         "dos_optimizer_step was called while another thread's dos_optimizer_step or dos_optimizer_begin_step runs");
  expect(named("dos_optimizer_load_state",
               "load_state while an update phase still runs (finish_step_async without wait_step): call wait_step "
               "first",
               true),
         "dos_optimizer_load_state while an update phase still runs (dos_optimizer_finish_step_async without "
         "dos_optimizer_wait_step): call dos_optimizer_wait_step first");
  // names already in C form, and longer words, are left alone
  expect(named("dos_optimizer_wait_step", "call dos_optimizer_begin_step; wait_step_work ran", true),
         "dos_optimizer_wait_step: call dos_optimizer_begin_step; wait_step_work ran");
  // a runtime call's text is not an optimizer's: kept
  expect(named("dos_runtime_create", "begin_step", true), "dos_runtime_create: begin_step");
}

void test_values_kept(void** state) {
  (void)state;
  // without call_hints (any Error but a UsageError) a quoted value of the caller's stays as given
  expect(named("dos_optimizer_create", "DOS_CALIBRATE_LINK_SHARE is 'x/begin_step.json': it must be estimate"),
         "dos_optimizer_create: DOS_CALIBRATE_LINK_SHARE is 'x/begin_step.json': it must be estimate");
  expect(named("dos_optimizer_step", "DOS_COPY_BY is 'step()'"), "dos_optimizer_step: DOS_COPY_BY is 'step()'");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lead),
      cmocka_unit_test(test_call_hints),
      cmocka_unit_test(test_values_kept),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
