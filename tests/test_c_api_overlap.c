/* Part of the c-api test (test_c_api.c runs these): the overlapped update (dos_optimizer_begin_step /
 * _gradients_final / _finish_step) against the plain dos_optimizer_step, bit for bit, through every
 * verdict, with and without a speculation budget; and its bad calls refused with DOS_E_INVALID,
 * leaving the phase as it was. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dos_c.h"
#include "test_c_api.h"

/* ---- the overlapped update ---- */

/* Two optimizers over equal fp32 host tensors (N elements in two tensors, subgroups of 256): one
 * stepped plainly, one overlapped; everything the C ABI can read must be the same bits. */
struct pair {
  float pa[N], ga[N], pb[N], gb[N];
  dos_optimizer *plain, *over;
};

static void pair_create(struct pair* q, int64_t speculation_budget) {
  for (int i = 0; i < N; ++i) q->pa[i] = q->pb[i] = (float)cos(0.11 * i);
  dos_optimizer_options o = fp32_options();
  o.speculation_budget = speculation_budget;
  q->plain = two_tensor_optimizer(q->pa, q->ga, sizeof(float), &o);
  q->over = two_tensor_optimizer(q->pb, q->gb, sizeof(float), &o);
}

static void expect_same_bits(struct pair* q) {
  static float a[N], b[N];
  for (int which = 0; which < 3; ++which) {
    assert_int_equal(dos_optimizer_read_state(q->plain, which, a), DOS_OK);
    assert_int_equal(dos_optimizer_read_state(q->over, which, b), DOS_OK);
    if (memcmp(a, b, sizeof a) != 0) fail_msg("state %d differs between the plain and the overlapped update", which);
  }
  if (memcmp(q->pa, q->pb, sizeof q->pa) != 0) fail_msg("the caller's parameters differ");
  assert_same_step_counts(q->plain, q->over);
}

enum kind { KEEP, CHANGED, SKIP, PARTIAL };

/* Steps both through keep, changed, skip, a half-declared keep and changed again; returns the
 * speculative updates of the overlapped one over all steps. */
static size_t run_verdicts(int64_t speculation_budget) {
  static struct pair q;
  pair_create(&q, speculation_budget);
  const enum kind steps[] = {KEEP, CHANGED, SKIP, PARTIAL, KEEP, CHANGED};
  size_t speculated = 0;
  for (int t = 0; t < (int)(sizeof steps / sizeof steps[0]); ++t) {
    const enum kind k = steps[t];
    for (int i = 0; i < N; ++i) q.ga[i] = q.gb[i] = (float)(sin(0.37 * i + 1.3 * t) * (i % 7 == 0 ? 3.0 : 0.01));
    if (k == SKIP) q.gb[N / 3] = NAN;
    dos_step_stats s;
    if (k != SKIP) {
      if (k == CHANGED)
        for (int i = 0; i < N; ++i) q.ga[i] *= 0.25f;
      assert_int_equal(dos_optimizer_step(q.plain, &s), DOS_OK);
      assert_int_equal(s.overlapped, 0);
      assert_int_equal(s.speculated, 0);
    }
    assert_int_equal(dos_optimizer_begin_step(q.over), DOS_OK);
    assert_int_equal(dos_optimizer_step_open(q.over), 1);
    /* as backward makes them: the last tensor first, in pieces across the subgroups' bounds */
    const size_t lo_end = k == PARTIAL ? N / 2 : 0;
    size_t hi = N;
    while (hi > lo_end) {
      const size_t lo = hi > lo_end + 300 ? hi - 300 : lo_end;
      assert_int_equal(dos_optimizer_gradients_final(q.over, lo, hi), DOS_OK);
      hi = lo;
    }
    int verdict = DOS_VERDICT_KEEP;
    if (k == CHANGED) {
      for (int i = 0; i < N; ++i) q.gb[i] *= 0.25f; /* after the declaration, as clipping does */
      verdict = DOS_VERDICT_CHANGED;
    }
    if (k == SKIP) verdict = DOS_VERDICT_SKIP;
    memset(&s, 0xab, sizeof s);
    if (t % 2 == 1) {
      /* as when the next forward overlaps the phase: each range's parameters as soon as they are
       * written, then the rest */
      assert_int_equal(dos_optimizer_finish_step_async(q.over, verdict), DOS_OK);
      assert_int_equal(dos_optimizer_step_open(q.over), 1);
      assert_int_equal(dos_optimizer_begin_step(q.over), DOS_E_INVALID);
      assert_int_equal(dos_optimizer_finish_step(q.over, verdict, &s), DOS_E_INVALID);
      assert_int_equal(dos_optimizer_wait_parameters(q.over, 0, (size_t)N + 1), DOS_E_INVALID);
      for (size_t lo = 0; lo < (size_t)N; lo += 250) {
        const size_t hi = lo + 250 < (size_t)N ? lo + 250 : (size_t)N;
        assert_int_equal(dos_optimizer_wait_parameters(q.over, lo, hi), DOS_OK);
        if (k != SKIP)
          for (size_t i = lo; i < hi; ++i) assert_true(memcmp(&q.pa[i], &q.pb[i], sizeof q.pa[i]) == 0);
      }
      assert_int_equal(dos_optimizer_wait_step(q.over, &s), DOS_OK);
      assert_int_equal(dos_optimizer_wait_step(q.over, &s), DOS_E_INVALID);
    } else {
      assert_int_equal(dos_optimizer_finish_step(q.over, verdict, &s), DOS_OK);
    }
    assert_int_equal(dos_optimizer_step_open(q.over), 0);
    assert_int_equal(s.overlapped, 1);
    assert_int_equal(s.skipped, k == SKIP);
    assert_int_equal(s.params, N);
    assert_true(s.exposed_seconds >= 0 && s.exposed_seconds <= s.seconds);
    assert_true(s.hidden_params <= N);
    if (k == CHANGED) assert_int_equal(s.redone, s.speculated);
    else assert_int_equal(s.redone, 0);
    if (speculation_budget == 0) assert_int_equal(s.speculated, 0);
    if (k == SKIP) assert_int_equal(s.subgroups_cpu + s.subgroups_gpu, 0);
    speculated += s.speculated;
    expect_same_bits(&q);
  }
  dos_optimizer_destroy(q.plain);
  dos_optimizer_destroy(q.over);
  return speculated;
}

void test_overlap_same_bits(void** state) {
  (void)state;
  const size_t spec = run_verdicts(-1);
  printf("overlapped vs plain: %zu speculative subgroup updates, same bits\n", spec);
  assert_true(spec > 0); /* the cpu plan puts every subgroup on the CPU */
  assert_int_equal(run_verdicts(0), 0); /* no budget: nothing speculated, the same bits still */
}


void test_overlap_bad_calls(void** state) {
  (void)state;
  static float p[N], g[N], buf[N];
  memset(p, 0, sizeof p);
  memset(g, 0, sizeof g);
  dos_optimizer* opt = one_tensor_optimizer(p, g);
  dos_step_stats s;
  int64_t steps[8];
  /* NULL handles */
  assert_int_equal(dos_optimizer_begin_step(NULL), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_gradients_final(NULL, 0, 1), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_finish_step(NULL, DOS_VERDICT_KEEP, &s), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_step_open(NULL), 0);
  /* outside a phase */
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, 1), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "no update phase is open"));
  assert_int_equal(dos_optimizer_finish_step(opt, DOS_VERDICT_KEEP, &s), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "no update phase is open"));
  /* inside one */
  assert_int_equal(dos_optimizer_begin_step(opt), DOS_OK);
  assert_int_equal(dos_optimizer_begin_step(opt), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "an update phase is open"));
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, N + 1), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "is not inside"));
  assert_int_equal(dos_optimizer_gradients_final(opt, 5, 4), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, 10), DOS_OK);
  assert_int_equal(dos_optimizer_gradients_final(opt, 7, 7), DOS_OK); /* empty: nothing */
  assert_int_equal(dos_optimizer_gradients_final(opt, 9, 11), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "declared final before"));
  assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_gradients_final: elements of [9, 11)", 50), 0);
  assert_int_equal(dos_optimizer_step_open(opt), 1); /* still open, still usable */
  assert_int_equal(dos_optimizer_step(opt, &s), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "dos_optimizer_step: an update phase is open"));
  assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 0.999, 1e-8, 0, 1), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_read_state(opt, 0, buf), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_step_counts(opt, steps), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_load_state(opt, buf, buf, buf, steps, dos_optimizer_num_subgroups(opt)), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_finish_step(opt, 3, &s), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "verdict must be"));
  assert_int_equal(dos_optimizer_finish_step(opt, -1, &s), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_step_open(opt), 1);
  assert_int_equal(dos_optimizer_gradients_final(opt, 10, N), DOS_OK);
  assert_int_equal(dos_optimizer_finish_step(opt, DOS_VERDICT_KEEP, NULL), DOS_OK); /* stats may be NULL */
  assert_int_equal(dos_optimizer_step_open(opt), 0);
  const size_t ns = dos_optimizer_num_subgroups(opt);
  assert_int_equal(dos_optimizer_step_counts(opt, steps), DOS_OK);
  for (size_t i = 0; i < ns; ++i) assert_int_equal(steps[i], 1); /* the phase ran whole */
  assert_int_equal(dos_optimizer_step(opt, &s), DOS_OK);
  assert_int_equal(dos_optimizer_step_counts(opt, steps), DOS_OK);
  for (size_t i = 0; i < ns; ++i) assert_int_equal(steps[i], 2);
  assert_int_equal(dos_optimizer_wait_step(opt, &s), DOS_E_INVALID); /* nothing finished asynchronously */
  assert_int_equal(dos_optimizer_wait_parameters(opt, 0, N), DOS_OK); /* no phase: the parameters are current */
  assert_int_equal(dos_optimizer_wait_parameters(opt, 3, 2), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_finish_step_async(opt, DOS_VERDICT_KEEP), DOS_E_INVALID); /* none open */
  assert_int_equal(dos_optimizer_begin_step(opt), DOS_OK);
  assert_int_equal(dos_optimizer_wait_parameters(opt, 0, N), DOS_E_INVALID); /* open, not finished */
  assert_int_equal(dos_optimizer_finish_step_async(opt, 7), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_finish_step_async(opt, DOS_VERDICT_KEEP), DOS_OK);
  /* the phase runs on, every gradient final: a declaration now says what to do instead */
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, 10), DOS_E_INVALID);
  /* the C++ text's own lead (gradients_final) joins the C name instead of repeating it, and its
   * hints name the C calls */
  assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_gradients_final after dos_optimizer_finish_step_async: ",
                           69), 0);
  assert_non_null(strstr(dos_last_error(), "(dos_optimizer_wait_step), then open the next with dos_optimizer_begin_step"));
  assert_int_equal(dos_optimizer_wait_step(opt, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_step_counts(opt, steps), DOS_OK);
  for (size_t i = 0; i < ns; ++i) assert_int_equal(steps[i], 3);
  /* a plain step left running: not an overlapped phase */
  assert_int_equal(dos_optimizer_step_async(NULL), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_step_async(opt), DOS_OK);
  assert_int_equal(dos_optimizer_step_async(opt), DOS_E_INVALID); /* one runs */
  assert_non_null(strstr(dos_last_error(), "without dos_optimizer_wait_step"));
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, 10), DOS_E_INVALID); /* no overlapped phase */
  assert_non_null(strstr(dos_last_error(), "started by dos_optimizer_step_async runs"));
  assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_gradients_final while", 35), 0);
  assert_int_equal(dos_optimizer_wait_parameters(opt, 0, N), DOS_OK);
  assert_int_equal(dos_optimizer_wait_step(opt, &s), DOS_OK);
  assert_int_equal(s.overlapped, 0);
  assert_true(s.exposed_seconds >= 0 && s.exposed_seconds <= s.seconds);
  assert_int_equal(dos_optimizer_step_counts(opt, steps), DOS_OK);
  for (size_t i = 0; i < ns; ++i) assert_int_equal(steps[i], 4);
  /* destroyed while a phase finished asynchronously runs: it runs to its end, nothing leaks */
  assert_int_equal(dos_optimizer_begin_step(opt), DOS_OK);
  assert_int_equal(dos_optimizer_finish_step_async(opt, DOS_VERDICT_KEEP), DOS_OK);
  dos_optimizer_destroy(opt);
  opt = NULL;
  opt = one_tensor_optimizer(p, g);
  /* destroyed with a phase open (and a speculative update in flight): dropped, nothing leaks */
  assert_int_equal(dos_optimizer_begin_step(opt), DOS_OK);
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, N), DOS_OK);
  dos_optimizer_destroy(opt);
}
