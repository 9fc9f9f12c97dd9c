/* Part of the c-api test (test_c_api.c runs these): the C ABI's calls that need no runtime. The
 * options struct's defaults (dos_optimizer_options_init) against dos::OptimizerOptions'; the ABI's
 * version and dos_step_stats' size and last fields;
 * dos_gpu_memory_for_budgets and dos_starpu_device_margin against hand arithmetic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dos_c.h"

void test_defaults(void** state);
void test_gpu_memory_for_budgets(void** state);

void test_defaults(void** state) {
  (void)state;
  assert_int_equal(dos_c_abi_version(), DOS_C_ABI_VERSION);
  dos_optimizer_options o;
  memset(&o, 0xab, sizeof o);
  assert_int_equal(dos_optimizer_options_init(&o), DOS_OK);
  assert_int_equal(o.size, sizeof o);
  assert_int_equal(o.size, dos_optimizer_options_size());
  assert_int_equal(o.version, DOS_OPTIMIZER_OPTIONS_VERSION);
  /* the defaults of dos::OptimizerOptions (runtime/dos.h) */
  assert_true(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 && o.weight_decay == 0.0);
  assert_int_equal(o.decoupled, 1);
  assert_int_equal(o.subgroup_size, 100000000);
  assert_int_equal(o.dtype, DOS_DTYPE_BF16);
  assert_int_equal(o.memory, DOS_MEMORY_HOST);
  assert_true(o.gpu_resident_budget == -1);
  assert_true(o.gpu_update_budget == 0);
  assert_int_equal(o.stream_lookahead, 3);
  assert_int_equal(o.eager_writeback, 1);
  assert_int_equal(o.native_grads, 1);
  assert_int_equal(o.urgent_writeback, 0);
  assert_int_equal(o.submit_order, DOS_SUBMIT_ORDER_PLAN);
  assert_true(o.rates.U_c == 0 && o.rates.U_c_dma == 0 && o.rates.U_g == 0 && o.rates.D_c == 0 &&
              o.rates.B_h2d == 0 && o.rates.B_d2h == 0);
  assert_int_equal(o.recalibrate, 0);
  assert_int_equal(o.verbose, 1);
  assert_true(o.speculation_budget == -1);
  assert_int_equal(o.speculate_streamed, 1);
  assert_int_equal(o.tail_subgroups, 0);
  assert_int_equal(o.compact_master, 0);
  assert_int_equal(dos_step_stats_size(), sizeof(dos_step_stats));
  /* C ABI 14 appended the gradient download figures after plan_decided_ahead, in this order */
  assert_int_equal(dos_c_abi_version(), 14);
  assert_true(offsetof(dos_step_stats, longest_download_seconds) > offsetof(dos_step_stats, plan_decided_ahead));
  assert_true(offsetof(dos_step_stats, longest_download_bytes) > offsetof(dos_step_stats, longest_download_seconds));
  assert_true(offsetof(dos_step_stats, downloads_dodge_writebacks) > offsetof(dos_step_stats, longest_download_bytes));

  assert_int_equal(dos_optimizer_options_init(NULL), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "options is NULL"));
}

/* The GPU memory that the budgets may need (dos_gpu_memory_for_budgets), against the arithmetic of
 * its contract: f = 12 + gradient bytes + parameter bytes per streamed element (f + 16 + parameter
 * bytes when speculative, and twice the budget), the phase at least one subgroup and the budget, at
 * most the whole optimizer, plus the resident budget up to 12 bytes per element; each state buffer's
 * padding (its three slices rounded up to 16 elements) on top. */
void test_gpu_memory_for_budgets(void** state) {
  (void)state;
  size_t out = 7;
  const size_t MiB = (size_t)1 << 20;
  assert_int_equal(dos_starpu_device_margin(), 64 * MiB);
  /* no update budget: no limit asked for */
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 100, 4, 4, 0, 5000, 0, &out), DOS_OK);
  assert_int_equal(out, 0);
  /* fp32, 3e6 elements in subgroups of 1e6: 20 bytes each, 2e7 a subgroup, 6e7 in all */
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 40000000, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 40000000);
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 10000000, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 20000000); /* the window admits one subgroup whatever its size */
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 1000000000, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 60000000); /* never more than everything streamed */
  /* speculative: 20 + 16 + 4 = 40 bytes per element, twice the budget */
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 10000000, -1, 1, &out), DOS_OK);
  assert_int_equal(out, 40000000);
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 50000000, -1, 1, &out), DOS_OK);
  assert_int_equal(out, 100000000);
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 40000000, 20000000, 0, &out), DOS_OK);
  assert_int_equal(out, 60000000); /* + the resident budget */
  assert_int_equal(dos_gpu_memory_for_budgets(3000000, 1000000, 4, 4, 40000000, INT64_MAX, 0, &out), DOS_OK);
  assert_int_equal(out, 40000000 + 36000000); /* resident at most 12 bytes per element */
  /* 1e6 bf16 parameters in one subgroup: 16 bytes each, 18 with gradients sent in fp32 */
  assert_int_equal(dos_gpu_memory_for_budgets(1000000, 100000000, 2, 2, 40000000, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 16000000);
  assert_int_equal(dos_gpu_memory_for_budgets(1000000, 100000000, 2, 4, 40000000, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 18000000);
  /* each state buffer's padding (slices of 16 elements): 1000 elements in subgroups of 300, three
   * of 300 (4 elements short of 304) and a tail of 100 (12 short of 112), 12 bytes per missing
   * element: 48 a subgroup of 300, 3 * 48 + 144 = 288 in all; twice with the shadow state */
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 300, 4, 4, 1, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 20 * 300 + 48); /* one subgroup */
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 300, 4, 4, 1000000, -1, 0, &out), DOS_OK);
  assert_int_equal(out, 20 * 1000 + 288); /* all of them */
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 300, 4, 4, 1000000, -1, 1, &out), DOS_OK);
  assert_int_equal(out, 40 * 1000 + 2 * 288);
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 300, 4, 4, 1, -1, 1, &out), DOS_OK);
  assert_int_equal(out, 40 * 300 + 2 * 48); /* one subgroup and its shadow state, both padded */
  /* subgroups of a multiple of 16 elements have no padding */
  assert_int_equal(dos_gpu_memory_for_budgets(32, 16, 4, 4, 1, INT64_MAX, 0, &out), DOS_OK);
  assert_int_equal(out, 20 * 16 + 12 * 32);
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 300, 4, 4, 1, INT64_MAX, 0, &out), DOS_OK);
  assert_int_equal(out, 20 * 300 + 48 + 12 * 1000 + 288); /* the resident state with its padding */
  /* saturates instead of wrapping */
  assert_int_equal(dos_gpu_memory_for_budgets(SIZE_MAX / 2, SIZE_MAX, 4, 4, UINT64_MAX, INT64_MAX, 1, &out), DOS_OK);
  assert_true(out == SIZE_MAX);
  /* refusals */
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 0, 4, 4, 1000, -1, 0, &out), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "subgroup_size"));
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 100, 8, 4, 1000, -1, 0, &out), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "param_bytes"));
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 100, 4, 3, 1000, -1, 0, &out), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "grad_bytes"));
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 100, 4, 4, 1000, -1, 0, NULL), DOS_E_INVALID);
  assert_int_equal(dos_gpu_memory_for_budgets(1000, 100, 4, 4, 1000, -5, 0, &out), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "resident_budget must be -1"));
}
