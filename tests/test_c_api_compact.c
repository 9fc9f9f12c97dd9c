/* Part of the c-api test (test_c_api.c runs it): the compact master (options.compact_master), a bf16
 * optimizer on host memory against a full one, bit for bit, through steps, masters written, a state
 * loaded and the overlapped calls. */
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

/* ---- the compact master (options.compact_master) ---- */

/* fp32 -> bf16, round to nearest even (finite values; what the runtime writes into bf16
 * parameters), and back: this file's own reference, not the runtime's. */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

enum { CSUB = 100 }; /* subgroups of 100 elements: not a multiple of 8 (the packed rounding bits' bytes
                        straddle subgroups) nor of 32; the last one holds 1 element */

/* Two bf16 optimizers (tensors of N0 and N1 elements in host memory) over equal parameters:
 * `full` with compact_master 0, `compact` with 1. */
struct compact_pair {
  uint16_t pf[N], gf[N], pc[N], gc[N];
  dos_optimizer *full, *compact;
};

static void compact_pair_create(struct compact_pair* q) {
  for (int i = 0; i < N; ++i) q->pf[i] = q->pc[i] = to_bf16((float)(0.7 * sin(0.37 * i) + (i % 7 == 0 ? 3e-3 : 0)));
  dos_optimizer_options o = fp32_options();
  o.dtype = DOS_DTYPE_BF16;
  o.subgroup_size = CSUB;
  q->full = two_tensor_optimizer(q->pf, q->gf, sizeof(uint16_t), &o);
  o.compact_master = 1;
  q->compact = two_tensor_optimizer(q->pc, q->gc, sizeof(uint16_t), &o);
}

/* The bf16 gradients of step t, the same for both optimizers. */
static void compact_pair_grads(struct compact_pair* q, int t) {
  for (int i = 0; i < N; ++i) q->gf[i] = q->gc[i] = to_bf16(grad_at(i, t));
}

/* Everything the C ABI reads is the same bits in both: the caller's parameters, master, exp_avg,
 * exp_avg_sq (dos_optimizer_read_state, and the masters of a range spanning subgroups through
 * dos_optimizer_read_masters), the step counts; and each parameter is its master rounded to bf16. */
static void expect_compact_same_bits(struct compact_pair* q, const char* when) {
  static float a[N], b[N];
  if (memcmp(q->pf, q->pc, sizeof q->pf) != 0) fail_msg("%s: the caller's parameters differ", when);
  for (int which = 0; which < 3; ++which) {
    assert_int_equal(dos_optimizer_read_state(q->full, which, a), DOS_OK);
    assert_int_equal(dos_optimizer_read_state(q->compact, which, b), DOS_OK);
    if (memcmp(a, b, sizeof a) != 0) fail_msg("%s: state %d differs between the full and the compact master", when, which);
    if (which == 0)
      for (int i = 0; i < N; ++i)
        if (q->pc[i] != to_bf16(b[i]))
          fail_msg("%s: element %d's parameter 0x%04x is not its master %.9g rounded (0x%04x)", when, i, q->pc[i], b[i],
                   to_bf16(b[i]));
  }
  assert_int_equal(dos_optimizer_read_masters(q->full, 150, 820, a), DOS_OK);
  assert_int_equal(dos_optimizer_read_masters(q->compact, 150, 820, b), DOS_OK);
  if (memcmp(a, b, (820 - 150) * sizeof(float)) != 0) fail_msg("%s: dos_optimizer_read_masters differs", when);
  assert_same_step_counts(q->full, q->compact);
}

/* A bf16 compact optimizer on host memory against a full one, bit for bit: after each of STEPS
 * plain steps; after a range of masters written (the compact form writes the caller's parameters
 * at once, with the values' rounding; the full form leaves them until the next step) and a step;
 * after a whole state loaded into both and a step; through the overlapped calls (begin_step,
 * gradients_final, finish_step: nothing speculated, the same bits). The masters move away from
 * their bf16 rounding (checked), so that the low halves and rounding bits carry something. */
void test_compact_master(void** state) {
  (void)state;
  static struct compact_pair q;
  static float m[N], v[N], s[N], part[N];
  compact_pair_create(&q);
  assert_int_equal(dos_optimizer_num_subgroups(q.compact), (N + CSUB - 1) / CSUB);
  expect_compact_same_bits(&q, "at creation");
  int t = 1;
  for (; t <= STEPS; ++t) {
    compact_pair_grads(&q, t);
    assert_int_equal(dos_optimizer_step(q.full, NULL), DOS_OK);
    dos_step_stats st;
    assert_int_equal(dos_optimizer_step(q.compact, &st), DOS_OK);
    assert_int_equal(st.params, N);
    assert_int_equal(st.step, t);
    char when[32];
    snprintf(when, sizeof when, "after step %d", t);
    expect_compact_same_bits(&q, when);
  }
  assert_int_equal(dos_optimizer_read_state(q.compact, 0, m), DOS_OK);
  int off_grid = 0; /* masters a bf16 parameter cannot hold: what lo and r keep */
  for (int i = 0; i < N; ++i) off_grid += from_bf16(to_bf16(m[i])) != m[i];
  assert_true(off_grid > N / 2);

  /* a range of masters written, spanning subgroups and both tensors */
  const size_t lo = 450, hi = 760;
  for (size_t i = 0; i < hi - lo; ++i) part[i] = (float)(0.3 - 0.00123 * (double)i);
  static uint16_t pf_before[N];
  memcpy(pf_before, q.pf, sizeof q.pf);
  assert_int_equal(dos_optimizer_write_masters(q.full, lo, hi, part), DOS_OK);
  assert_int_equal(dos_optimizer_write_masters(q.compact, lo, hi, part), DOS_OK);
  assert_memory_equal(q.pf, pf_before, sizeof q.pf); /* the full form: the parameters stay */
  for (size_t i = 0; i < N; ++i) {
    const uint16_t want = (i >= lo && i < hi) ? to_bf16(part[i - lo]) : pf_before[i];
    if (q.pc[i] != want) fail_msg("compact, masters written: element %zu's parameter 0x%04x, expected 0x%04x", i, q.pc[i], want);
  }
  assert_int_equal(dos_optimizer_read_masters(q.compact, lo, hi, m), DOS_OK);
  assert_memory_equal(m, part, (hi - lo) * sizeof(float));
  compact_pair_grads(&q, t);
  assert_int_equal(dos_optimizer_step(q.full, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_step(q.compact, NULL), DOS_OK);
  expect_compact_same_bits(&q, "after masters written and a step");
  ++t;

  /* a whole state loaded into both (the full one's, masters off the bf16 grid), then a step */
  assert_int_equal(dos_optimizer_read_state(q.full, 0, m), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(q.full, 1, v), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(q.full, 2, s), DOS_OK);
  for (int i = 0; i < N; ++i) m[i] = m[i] * 1.0009765625f + 1e-7f; /* masters between bf16 values */
  const size_t ns = dos_optimizer_num_subgroups(q.full);
  int64_t steps[16];
  assert_int_equal(dos_optimizer_step_counts(q.full, steps), DOS_OK);
  assert_int_equal(dos_optimizer_load_state(q.full, m, v, s, steps, ns), DOS_OK);
  assert_int_equal(dos_optimizer_load_state(q.compact, m, v, s, steps, ns), DOS_OK);
  for (int i = 0; i < N; ++i)
    if (q.pc[i] != to_bf16(m[i])) fail_msg("compact, state loaded: element %d's parameter is not the master rounded", i);
  expect_compact_same_bits(&q, "after a state loaded");
  compact_pair_grads(&q, t);
  assert_int_equal(dos_optimizer_step(q.full, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_step(q.compact, NULL), DOS_OK);
  expect_compact_same_bits(&q, "after a state loaded and a step");
  ++t;

  /* the overlapped calls: the CPU's subgroups updated speculatively (out of place), kept by the verdict */
  compact_pair_grads(&q, t);
  assert_int_equal(dos_optimizer_step(q.full, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_begin_step(q.compact), DOS_OK);
  assert_int_equal(dos_optimizer_gradients_final(q.compact, 0, N), DOS_OK);
  dos_step_stats st;
  assert_int_equal(dos_optimizer_finish_step(q.compact, DOS_VERDICT_KEEP, &st), DOS_OK);
  assert_true(st.speculated > 0);
  assert_int_equal(st.redone, 0);
  assert_int_equal(st.overlapped, 1);
  expect_compact_same_bits(&q, "after an overlapped step");
  dos_optimizer_destroy(q.full);
  dos_optimizer_destroy(q.compact);
}

