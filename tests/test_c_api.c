/* The C ABI (runtime/dos_c.h, libdos_c.so), from a C program: dos_optimizer_options_init fills the
 * defaults of dos::OptimizerOptions; an optimizer made from the options struct steps as Adam/AdamW
 * should (4 steps checked against a double-precision reference, in which beta1, beta2 and eps
 * visibly matter), each step's gradient download figures without a CUDA worker (no download by the
 * copy engine; downloads_dodge_writebacks 1 only under DOS_COPY_BY=auto: c-api-copy-by-auto);
 * every field out of its range, a struct of
 * an unknown size or version and a NULL struct are refused with DOS_E_INVALID and a message naming
 * the field, and nothing is created; every option set to another valid value is accepted.
 * Timelines (dos_optimizer_set_timeline, _last_timeline, dos_clock_seconds); a negative
 * caller_cores refused. Run from here, defined in the other files of the test: the calls that need
 * no runtime (the options' defaults, the GPU memory that the budgets may need: test_c_api_plain.c);
 * the overlapped update against the plain step, bit for bit, and its bad calls
 * (test_c_api_overlap.c); the compact master against the full one, bit for bit
 * (test_c_api_compact.c). test_c_api.h says what they share. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dos_c.h"
#include "test_c_api.h"

dos_runtime* g_rt = NULL;

static int setup(void** state) {
  (void)state;
  /* the CPU plan, one CPU worker of one thread, no CUDA worker, quiet */
  return dos_runtime_create("cpu", 1, 1, 0, 0, &g_rt) == DOS_OK ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  dos_runtime_destroy(g_rt);
  return 0;
}


/* The gradient of element i at step t (1-based): signs and sizes vary from step to step, so that
 * beta1 and beta2 matter from the second step on; one element in 10 is tiny (1e-5 scale), so that
 * eps matters. */
float grad_at(int i, int t) {
  const double g = 0.01 * (((i * 37 + 11 * t) % 19) - 9) * (1 + 0.3 * t);
  return (float)(i % 10 == 3 ? g * 1e-3 : g);
}

/* STEPS steps of torch.optim.Adam / AdamW (their documented formulas, bias corrections included)
 * in double precision from p0, with beta1, beta2 and eps as given: the final parameters in ref.
 * well (may be NULL): whether the element is well conditioned, 0 where Adam's coupled gradient
 * g + weight_decay * p nearly cancels at some step (below 1/20 of its terms' sizes): there fp32's
 * rounding of the sum, which any fp32 Adam has, is amplified without bound by m / sqrt(v). */
static void reference(const dos_optimizer_options* o, double beta1, double beta2, double eps, const float* p0,
                      double* ref, unsigned char* well) {
  for (int i = 0; i < N; ++i) {
    double pi = p0[i], m = 0, v = 0;
    if (well) well[i] = 1;
    for (int t = 1; t <= STEPS; ++t) {
      const double gi = grad_at(i, t) + (o->decoupled ? 0.0 : o->weight_decay * pi);
      if (well && !o->decoupled && fabs(gi) < 0.05 * (fabs(grad_at(i, t)) + fabs(o->weight_decay * pi))) well[i] = 0;
      if (o->decoupled) pi *= 1 - o->lr * o->weight_decay;
      m = beta1 * m + (1 - beta1) * gi;
      v = beta2 * v + (1 - beta2) * gi * gi;
      const double bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t);
      pi -= o->lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps);
    }
    ref[i] = pi;
  }
}

/* A bound on fp32's distance from the double reference after STEPS steps: a few ulp per step of
 * the largest value the parameter passed through (its start, its end, an update of about lr). */
static double bound(double p0, double ref, double lr) { return STEPS * 4 * (fabs(p0) + fabs(ref) + lr) * 0x1p-24; }

/* The gradient download figures of a phase without a CUDA worker (C ABI 14): no download by the copy
 * engine, so 0 seconds and 0 bytes; downloads_dodge_writebacks is how the runtime stood when the
 * phase began, 1 under DOS_COPY_BY=auto (the c-api-copy-by-auto test), else 0 (the default,
 * adaptive, turns only after a starved download, which needs a GPU). */
static void expect_no_gpu_downloads(const dos_step_stats* s) {
  const char* by = getenv("DOS_COPY_BY");
  assert_true(s->longest_download_seconds == 0.0);
  assert_true(s->longest_download_bytes == 0);
  assert_int_equal(s->downloads_dodge_writebacks, by && strcmp(by, "auto") == 0 ? 1 : 0);
}

/* STEPS steps of Adam/AdamW over two fp32 tensors in host memory (700 and 301 elements: subgroups
 * of o->subgroup_size with a tail) with options `o`, each well-conditioned parameter (at least 9
 * in 10; all of them for AdamW) checked against the double-precision reference above. The test checks its own reach too: the reference with the
 * default beta1, beta2 and eps must differ from the one with o's by far more than the bound
 * wherever o changes them, so that a runtime ignoring them fails. */
static void step_and_check(const dos_optimizer_options* o) {
  static float p[N], g[N], p0[N];
  static double ref[N], other[N];
  static unsigned char well[N];
  for (int i = 0; i < N; ++i) p0[i] = p[i] = (float)(0.5 - 0.001 * i);
  reference(o, o->beta1, o->beta2, o->eps, p0, ref, well);
  int checked = 0;
  for (int i = 0; i < N; ++i) checked += well[i];
  assert_true(checked >= N * 9 / 10);  /* the ill-conditioned elements left out are few */
  dos_optimizer_options d;
  dos_optimizer_options_init(&d);
  if (o->beta1 != d.beta1 || o->beta2 != d.beta2 || o->eps != d.eps) {
    reference(o, d.beta1, d.beta2, d.eps, p0, other, NULL);
    int far = 0;
    for (int i = 0; i < N; ++i) far += fabs(other[i] - ref[i]) > 100 * bound(p0[i], ref[i], o->lr);
    assert_true(far > N / 2);
  }
  dos_optimizer* opt = two_tensor_optimizer(p, g, sizeof(float), o);
  assert_non_null(opt);
  assert_int_equal(dos_optimizer_num_params(opt), N);
  assert_int_equal(dos_optimizer_num_subgroups(opt), (N + o->subgroup_size - 1) / o->subgroup_size);
  for (int t = 1; t <= STEPS; ++t) {
    for (int i = 0; i < N; ++i) g[i] = grad_at(i, t);
    dos_step_stats s;
    memset(&s, 0xab, sizeof s); /* every field must be written by the step */
    assert_int_equal(dos_optimizer_step(opt, &s), DOS_OK);
    assert_int_equal(s.params, N);
    assert_int_equal(s.step, t);
    assert_int_equal(s.subgroups_cpu, dos_optimizer_num_subgroups(opt));
    expect_no_gpu_downloads(&s);
  }
  for (int i = 0; i < N; ++i)
    if (well[i] && !(fabs(p[i] - ref[i]) <= bound(p0[i], ref[i], o->lr)))
      fail_msg("element %d after %d steps: %.9g, the double reference %.9g (bound %.3g)", i, STEPS, p[i], ref[i],
               bound(p0[i], ref[i], o->lr));
  dos_optimizer_destroy(opt);
}

dos_optimizer_options fp32_options(void) {
  dos_optimizer_options o;
  dos_optimizer_options_init(&o);
  o.dtype = DOS_DTYPE_FP32;
  o.subgroup_size = 256;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.verbose = 0;
  return o;
}

static void test_step(void** state) {
  (void)state;
  dos_optimizer_options o = fp32_options();
  step_and_check(&o);  /* AdamW */
  o.decoupled = 0;
  step_and_check(&o);  /* Adam */
}

/* Every field at another valid value: accepted, and (without a CUDA worker and under the cpu plan,
 * where the GPU options and the rates have no effect) the same update. */
static void test_every_option(void** state) {
  (void)state;
  dos_optimizer_options o = fp32_options();
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.gpu_resident_budget = 1 << 20;
  o.gpu_update_budget = 64u << 20;
  o.stream_lookahead = 0;
  o.native_grads = 0;
  o.urgent_writeback = 1;
  o.submit_order = DOS_SUBMIT_ORDER_CPU_FIRST;
  o.rates.U_c = 1e9;
  o.rates.U_c_dma = 8e8;
  o.rates.U_g = 2e10;
  o.rates.D_c = 4e10;
  o.rates.B_h2d = 2.5e10;
  o.rates.B_d2h = 2.5e10;
  o.recalibrate = 1;
  step_and_check(&o);
  o.stream_lookahead = 1000;
  o.eager_writeback = 0;
  o.gpu_update_budget = 0;
  step_and_check(&o);
}

/* Creates with `o` and expects DOS_E_INVALID, no handle, and `needle` in the message. */
static void expect_refused(const dos_optimizer_options* o, const char* needle) {
  float p[4] = {1, 2, 3, 4}, g[4] = {0};
  void* params[1] = {p};
  void* grads[1] = {g};
  const size_t numels[1] = {4};
  dos_optimizer* opt = (dos_optimizer*)&opt; /* not NULL: create must clear it */
  const int rc = dos_optimizer_create(g_rt, 1, params, grads, numels, o, &opt);
  if (rc != DOS_E_INVALID || opt != NULL || strstr(dos_last_error(), needle) == NULL)
    fail_msg("expected DOS_E_INVALID naming '%s', got %d: %s", needle, rc, dos_last_error());
  assert_true(p[0] == 1 && p[3] == 4);
}

#define REFUSED(field_assignment, needle)    \
  do {                                       \
    dos_optimizer_options o = fp32_options(); \
    o.field_assignment;                      \
    expect_refused(&o, needle);              \
  } while (0)

static void test_bad_options(void** state) {
  (void)state;
  expect_refused(NULL, "options is NULL");
  dos_optimizer_options junk;
  memset(&junk, 0xab, sizeof junk); /* never initialised */
  expect_refused(&junk, "dos_optimizer_options_init");
  REFUSED(size = sizeof(dos_optimizer_options) + 8, "options has size");
  REFUSED(size = sizeof(dos_optimizer_options) - 8, "options has size");
  REFUSED(version = DOS_OPTIMIZER_OPTIONS_VERSION + 1, "version");
  REFUSED(lr = -1e-3, "options.lr must be a finite number in [0, 3.4e38]");
  REFUSED(lr = NAN, "options.lr");
  REFUSED(lr = 1e39, "options.lr");
  REFUSED(beta1 = 1.0, "options.beta1 must be in [0, 1)");
  REFUSED(beta2 = -0.1, "options.beta2 must be in [0, 1)");
  REFUSED(eps = INFINITY, "options.eps");
  REFUSED(weight_decay = -0.5, "options.weight_decay");
  REFUSED(lr = 1e20; o.weight_decay = 1e20, "options.lr x options.weight_decay");
  REFUSED(decoupled = 2, "options.decoupled must be 0 or 1");
  REFUSED(subgroup_size = 0, "options.subgroup_size must be >= 1");
  REFUSED(dtype = 3, "options.dtype");
  REFUSED(dtype = -1, "options.dtype");
  REFUSED(memory = 2, "options.memory");
  REFUSED(gpu_resident_budget = -2, "options.gpu_resident_budget must be >= -1");
  REFUSED(stream_lookahead = -1, "options.stream_lookahead must be in [0, 1000]");
  REFUSED(stream_lookahead = 1001, "options.stream_lookahead");
  REFUSED(eager_writeback = -1, "options.eager_writeback must be 0 or 1");
  REFUSED(native_grads = 2, "options.native_grads must be 0 or 1");
  REFUSED(urgent_writeback = 3, "options.urgent_writeback must be 0 or 1");
  REFUSED(submit_order = 2, "options.submit_order");
  REFUSED(rates.U_c = 1e9, "options.rates.U_c_dma must be a finite number > 0");
  REFUSED(rates.B_d2h = -1, "options.rates.U_c must be");
  REFUSED(recalibrate = 5, "options.recalibrate must be 0 or 1");
  REFUSED(verbose = -1, "options.verbose must be 0 or 1");
  REFUSED(speculation_budget = -2, "options.speculation_budget must be >= -1");
  REFUSED(speculate_streamed = 2, "options.speculate_streamed must be 0 or 1");
  REFUSED(tail_subgroups = -1, "options.tail_subgroups must be in [0, 1000000]");
  REFUSED(tail_subgroups = 1000001, "options.tail_subgroups must be in [0, 1000000]");
  REFUSED(compact_master = 2, "options.compact_master must be 0 or 1");
  REFUSED(compact_master = -1, "options.compact_master must be 0 or 1");
  /* valid fields that do not go together: the compact master needs bf16 parameters (fp32_options'
   * are fp32), refused with what to do */
  REFUSED(compact_master = 1, "options.compact_master = 1 needs options.dtype = DOS_DTYPE_BF16");
  REFUSED(compact_master = 1; o.dtype = DOS_DTYPE_FP16, "set compact_master = 0 for fp32 or fp16 parameters");
  /* valid fields that the runtime refuses: CUDA memory without a CUDA worker */
  REFUSED(memory = DOS_MEMORY_CUDA, "CUDA");
  /* more host memory than any machine has (12 bytes of state per parameter for 1.5e13 parameters):
   * a resource the runtime cannot have, DOS_E_RUNTIME, not bad input; nothing is allocated or read */
  {
    float p[4] = {1, 2, 3, 4}, g[4] = {0};
    void* params[1] = {p};
    void* grads[1] = {g};
    const size_t numels[1] = {(size_t)15000000000000ull};
    dos_optimizer_options big = fp32_options();
    big.subgroup_size = (size_t)1 << 31;
    dos_optimizer* opt = (dos_optimizer*)&opt;
    const int rc = dos_optimizer_create(g_rt, 1, params, grads, numels, &big, &opt);
    if (rc != DOS_E_RUNTIME || opt != NULL || strstr(dos_last_error(), "host memory") == NULL)
      fail_msg("expected DOS_E_RUNTIME naming host memory, got %d: %s", rc, dos_last_error());
  }
  /* two tensors over one piece of parameter memory: refused (each would be stepped twice) */
  {
    float p[8] = {0}, g[8] = {0};
    void* params[2] = {p, p + 2};
    void* grads[2] = {g, g + 4};
    const size_t numels[2] = {4, 4};
    dos_optimizer_options o = fp32_options();
    dos_optimizer* opt = (dos_optimizer*)&opt;
    assert_int_equal(dos_optimizer_create(g_rt, 2, params, grads, numels, &o, &opt), DOS_E_INVALID);
    assert_null(opt);
    assert_non_null(strstr(dos_last_error(), "share memory"));
    /* a refusal made by the C++ optimizer is led by the C call's name, as the ABI's own are */
    assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_create: ", 22), 0);
  }
  /* set_hyper validates as creation does: decoupled only 0 or 1, eps not rounding to 0 */
  {
    float p[4] = {1, 2, 3, 4}, g[4] = {0};
    void* params[1] = {p};
    void* grads[1] = {g};
    const size_t numels[1] = {4};
    dos_optimizer_options ok = fp32_options();
    dos_optimizer* opt = NULL;
    assert_int_equal(dos_optimizer_create(g_rt, 1, params, grads, numels, &ok, &opt), DOS_OK);
    assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 0.999, 1e-8, 0, 5), DOS_E_INVALID);
    assert_non_null(strstr(dos_last_error(), "decoupled must be 0 or 1"));
    assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_set_hyper: ", 25), 0);
    assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 0.999, 1e-8, 0, -1), DOS_E_INVALID);
    /* an eps > 0 that fp32 rounds to 0: a zero gradient's update would be 0 / 0 */
    assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 0.999, 1e-50, 0, 1), DOS_E_INVALID);
    assert_non_null(strstr(dos_last_error(), "rounds to 0 in fp32"));

    /* a value just beside its bound is named as given, not rounded onto the bound */
    assert_int_equal(dos_optimizer_set_hyper(opt, -1e-9, 0.9, 0.999, 1e-8, 0, 1), DOS_E_INVALID);
    assert_non_null(strstr(dos_last_error(), "learning rate must be a finite number >= 0, got -1e-09"));
    assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 1.0000000001, 1e-8, 0, 1), DOS_E_INVALID);
    assert_non_null(strstr(dos_last_error(), "beta2 must be in [0, 1), got 1.0000000001"));
    assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 0.999, 1e-45, 0, 1), DOS_OK);
    assert_int_equal(dos_optimizer_set_hyper(opt, 1e-3, 0.9, 0.999, 1e-8, 0, 0), DOS_OK);
    dos_optimizer_destroy(opt);
  }
  /* element counts whose sum wraps around: refused, not an optimizer of a few elements */
  {
    float p[4] = {1, 2, 3, 4}, g[4] = {0};
    void* params[2] = {p, p};
    void* grads[2] = {g, g};
    const size_t numels[2] = {(size_t)-1, 2};
    dos_optimizer_options ok = fp32_options();
    dos_optimizer* opt = (dos_optimizer*)&opt;
    assert_int_equal(dos_optimizer_create(g_rt, 2, params, grads, numels, &ok, &opt), DOS_E_INVALID);
    assert_null(opt);
    assert_non_null(strstr(dos_last_error(), "more than 2^53 elements"));
  }
  /* after all of that the runtime still works */
  dos_optimizer_options o = fp32_options();
  step_and_check(&o);
}

/* An fp32 optimizer over one tensor of N elements (parameters p, gradients g) on g_rt. */
dos_optimizer* one_tensor_optimizer(float* p, float* g) {
  dos_optimizer_options o = fp32_options();
  void* params[1] = {p};
  void* grads[1] = {g};
  const size_t numels[1] = {N};
  dos_optimizer* opt = NULL;
  assert_int_equal(dos_optimizer_create(g_rt, 1, params, grads, numels, &o, &opt), DOS_OK);
  return opt;
}

dos_optimizer* two_tensor_optimizer(void* p, void* g, size_t elem_bytes, const dos_optimizer_options* o) {
  void* params[2] = {p, (char*)p + N0 * elem_bytes};
  void* grads[2] = {g, (char*)g + N0 * elem_bytes};
  const size_t numels[2] = {N0, N1};
  dos_optimizer* opt = NULL;
  assert_int_equal(dos_optimizer_create(g_rt, 2, params, grads, numels, o, &opt), DOS_OK);
  return opt;
}

void assert_same_step_counts(dos_optimizer* a, dos_optimizer* b) {
  int64_t sa[16], sb[16];
  const size_t ns = dos_optimizer_num_subgroups(a);
  assert_true(ns <= 16);
  assert_int_equal(dos_optimizer_num_subgroups(b), ns);
  assert_int_equal(dos_optimizer_step_counts(a, sa), DOS_OK);
  assert_int_equal(dos_optimizer_step_counts(b, sb), DOS_OK);
  assert_memory_equal(sa, sb, ns * sizeof(int64_t));
}

/* one_tensor_optimizer over p and g filled with small values of both signs (N each). */
static dos_optimizer* filled_optimizer(float* p, float* g) {
  for (size_t i = 0; i < N; ++i) {
    p[i] = 0.01f * (float)(i % 97);
    g[i] = 0.001f * (float)(i % 13) - 0.005f;
  }
  return one_tensor_optimizer(p, g);
}

/* dos_optimizer_set_gradients: an optimizer handed new gradient buffers every step (its old ones
 * then filled with garbage; tensor 1's placed before tensor 0's, so that a mapping by flat offset
 * from tensor 0's base would read the wrong elements) gives the same bits as one reading fixed
 * buffers with the same values; bad calls refused, changing nothing, also while a phase runs. Two
 * tensors, subgroups of 256 spanning them. */
static void test_set_gradients(void** state) {
  (void)state;
  static float pa[N], pb[N], ga[N], gb[2][N];
  for (int i = 0; i < N; ++i) pa[i] = pb[i] = (float)(0.5 - 0.001 * i);
  dos_optimizer_options o = fp32_options();
  dos_optimizer* a = two_tensor_optimizer(pa, ga, sizeof(float), &o);
  dos_optimizer* b = two_tensor_optimizer(pb, gb[0], sizeof(float), &o);
  for (int step = 0; step < 4; ++step) {
    float* cur = gb[step % 2]; /* tensor 1's gradient at cur, tensor 0's at cur + N1 */
    float* old = gb[(step + 1) % 2];
    for (int i = 0; i < N; ++i) {
      ga[i] = (float)(0.01 * (((i + 5 * step) * 37) % 19 - 9));
      if (i < N0) cur[N1 + i] = ga[i];
      else cur[i - N0] = ga[i];
    }
    void* now[2] = {cur + N1, cur};
    assert_int_equal(dos_optimizer_set_gradients(b, 2, now), DOS_OK);
    for (int i = 0; i < N; ++i) old[i] = 1e3f; /* read from the old buffer, the update would differ */
    assert_int_equal(dos_optimizer_step(a, NULL), DOS_OK);
    assert_int_equal(dos_optimizer_step(b, NULL), DOS_OK);
    assert_memory_equal(pa, pb, sizeof pa);
  }
  /* bad calls: refused, the buffers unchanged (the next step still reads gb[1], as set last) */
  void* one[1] = {gb[0]};
  assert_int_equal(dos_optimizer_set_gradients(b, 1, one), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "ntensors is 1; this optimizer was created over 2 tensors"));
  /* a count far beyond the array: refused before the array is read */
  assert_int_equal(dos_optimizer_set_gradients(b, (size_t)1 << 40, one), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "created over 2 tensors"));
  assert_int_equal(dos_optimizer_set_gradients(b, SIZE_MAX, one), DOS_E_INVALID);
  void* with_null[2] = {gb[0], NULL};
  assert_int_equal(dos_optimizer_set_gradients(b, 2, with_null), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "tensor 1"));
  assert_int_equal(dos_optimizer_set_gradients(b, 2, NULL), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "NULL argument"));
  /* two tensors' gradients in one place: refused as at creation */
  void* shared[2] = {gb[0], gb[0]};
  assert_int_equal(dos_optimizer_set_gradients(b, 2, shared), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "gradients share memory"));
  /* led by the C call's name once: the C++ method's own lead (set_gradients) is not repeated */
  assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_set_gradients: ", 29), 0);
  assert_null(strstr(dos_last_error(), "set_gradients: set_gradients"));
  assert_null(strstr(dos_last_error() + 29, "set_gradients: "));
  assert_int_equal(dos_optimizer_set_gradients(NULL, 2, with_null), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_begin_step(b), DOS_OK);
  void* other[2] = {gb[0], gb[0] + N0};
  assert_int_equal(dos_optimizer_set_gradients(b, 2, other), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "phase is open"));
  assert_int_equal(dos_optimizer_finish_step(b, DOS_VERDICT_SKIP, NULL), DOS_OK);
  for (int i = 0; i < N; ++i) {  /* gb[1] was set last: tensor 1 at its start, tensor 0 after */
    ga[i] = (float)(0.002 * (i % 11) - 0.01);
    if (i < N0) gb[1][N1 + i] = ga[i];
    else gb[1][i - N0] = ga[i];
    gb[0][i] = 1e3f;
  }
  assert_int_equal(dos_optimizer_step(a, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_step_async(b), DOS_OK); /* a phase left running: refused too */
  assert_int_equal(dos_optimizer_set_gradients(b, 2, other), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "still runs"));
  assert_int_equal(dos_optimizer_wait_step(b, NULL), DOS_OK);
  assert_memory_equal(pa, pb, sizeof pa);
  dos_optimizer_destroy(a);
  dos_optimizer_destroy(b);
}

/* dos_optimizer_read_masters / _write_masters: a range spanning four subgroups reads what
 * dos_optimizer_read_state gives; written, the masters change there only, the moments and the
 * parameters stay, and the next step starts from them (the bits of an optimizer loaded with the
 * same state); bad ranges and calls refused, nothing changed. */
static void test_master_ranges(void** state) {
  (void)state;
  static float pa[N], ga[N], pb[N], gb[N], m0[N], v0[N], s0[N], m1[N], v1[N], s1[N], part[N], pa_before[N];
  dos_optimizer* a = filled_optimizer(pa, ga);
  dos_optimizer* b = filled_optimizer(pb, gb);
  assert_int_equal(dos_optimizer_step(a, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 0, m0), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 1, v0), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 2, s0), DOS_OK);
  const size_t lo = 200, hi = 800; /* subgroups of 256: spans four of them */
  assert_int_equal(dos_optimizer_read_masters(a, lo, hi, part), DOS_OK);
  assert_memory_equal(part, m0 + lo, (hi - lo) * sizeof(float));
  for (size_t i = 0; i < hi - lo; ++i) part[i] = 0.25f + 0.001f * (float)i;
  memcpy(pa_before, pa, sizeof pa);
  assert_int_equal(dos_optimizer_write_masters(a, lo, hi, part), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 0, m1), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 1, v1), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 2, s1), DOS_OK);
  assert_memory_equal(m1, m0, lo * sizeof(float));
  assert_memory_equal(m1 + lo, part, (hi - lo) * sizeof(float));
  assert_memory_equal(m1 + hi, m0 + hi, (N - hi) * sizeof(float));
  assert_memory_equal(v1, v0, sizeof v0);
  assert_memory_equal(s1, s0, sizeof s0);
  assert_memory_equal(pa, pa_before, sizeof pa);
  /* the reference: b loaded with the same state, then one step each */
  const size_t ns = dos_optimizer_num_subgroups(a);
  int64_t steps[16];
  assert_true(ns <= 16);
  assert_int_equal(dos_optimizer_step_counts(a, steps), DOS_OK);
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, ns), DOS_OK);
  assert_int_equal(dos_optimizer_step(a, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_step(b, NULL), DOS_OK);
  assert_memory_equal(pa, pb, sizeof pa);
  /* a damaged state is refused and changes nothing: a NaN master, a negative exp_avg_sq, a step
   * count above 2^53 */
  assert_int_equal(dos_optimizer_read_state(b, 0, m0), DOS_OK);
  m1[7] = NAN;
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, ns), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "master = nan at element 7"));
  m1[7] = 0.5f;
  s1[3] = -1.0f;
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, ns), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "second moment >= 0"));
  s1[3] = 0.0f;
  steps[0] = (int64_t)1 << 62;
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, ns), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "above 2^53"));
  steps[0] = 1;
  /* a count other than the subgroups', one far beyond the array among them: refused before the
   * array is read */
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, ns - 1), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "give one step count per subgroup"));
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, (size_t)1 << 40), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_load_state(b, m1, v1, s1, steps, SIZE_MAX), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "give one step count per subgroup"));
  assert_int_equal(dos_optimizer_read_state(b, 0, part), DOS_OK);
  assert_memory_equal(part, m0, N * sizeof(float));
  /* bad calls */
  /* the messages name the C call once, not the C++ method it runs (read_master_range) */
  assert_int_equal(dos_optimizer_read_masters(a, 0, N + 1, part), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "is not inside"));
  assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_read_masters: the range [", 39), 0);
  assert_int_equal(dos_optimizer_write_masters(a, 9, 8, part), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "is not inside"));
  assert_int_equal(strncmp(dos_last_error(), "dos_optimizer_write_masters: the range [", 40), 0);
  assert_int_equal(dos_optimizer_write_masters(a, 0, 4, NULL), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "NULL argument"));
  {  /* a value that is not finite, as load_state refuses it: nothing written */
    float bad[4] = {1.0f, 2.0f, NAN, 4.0f};
    assert_int_equal(dos_optimizer_write_masters(a, 0, 4, bad), DOS_E_INVALID);
    assert_non_null(strstr(dos_last_error(), "must be finite"));
    assert_null(strstr(dos_last_error(), "write_master_range"));
    bad[2] = INFINITY;
    assert_int_equal(dos_optimizer_write_masters(a, 0, 4, bad), DOS_E_INVALID);
  }
  assert_int_equal(dos_optimizer_read_masters(a, 5, 5, NULL), DOS_OK); /* an empty range */
  assert_int_equal(dos_optimizer_begin_step(a), DOS_OK);
  assert_int_equal(dos_optimizer_write_masters(a, 0, 4, part), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "phase is open"));
  assert_int_equal(dos_optimizer_finish_step(a, DOS_VERDICT_SKIP, NULL), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(a, 0, m0), DOS_OK);
  assert_int_equal(dos_optimizer_read_state(b, 0, m1), DOS_OK);
  assert_memory_equal(m0, m1, sizeof m0); /* the refused writes changed nothing */
  dos_optimizer_destroy(a);
  dos_optimizer_destroy(b);
}

/* Seconds of CPU time the whole process (StarPU's threads included) uses over `wall` seconds of
 * sleep. */
static double process_cpu_over(double wall) {
  struct timespec a, b, d;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  d.tv_sec = (time_t)wall;
  d.tv_nsec = (long)((wall - (double)d.tv_sec) * 1e9);
  while (nanosleep(&d, &d) != 0) {
  }
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

/* StarPU 1.3's workers poll in a tight loop while they run. Between calls the C ABI pauses them,
 * and a phase left running (the caller's next forward overlapping it) lets them go as soon as its
 * tasks have ended, before dos_optimizer_wait_step: the caller computes meanwhile. */
static void test_async_phase_pauses_workers(void** state) {
  (void)state;
  static float p[N], g[N];
  dos_optimizer* opt = filled_optimizer(p, g);
  dos_step_stats s;
  const double idle = process_cpu_over(0.3); /* paused between calls */
  for (int mode = 0; mode < 2; ++mode) {
    if (mode == 0) {
      assert_int_equal(dos_optimizer_step_async(opt), DOS_OK);
    } else {
      assert_int_equal(dos_optimizer_begin_step(opt), DOS_OK);
      assert_int_equal(dos_optimizer_gradients_final(opt, 0, N), DOS_OK);
      assert_int_equal(dos_optimizer_finish_step_async(opt, DOS_VERDICT_KEEP), DOS_OK);
    }
    assert_int_equal(dos_optimizer_wait_parameters(opt, 0, N), DOS_OK);
    /* the phase's last write-backs end soon after; polling workers would use a core all along */
    double running = process_cpu_over(0.3);
    for (int tries = 1; tries < 10 && running >= 0.15; ++tries) running = process_cpu_over(0.3);
    printf("%s: CPU seconds over 0.3 s of the caller's sleep: %.3f before the phase, %.3f after its tasks ended "
           "(polling workers: about 0.3 each)\n", mode == 0 ? "dos_optimizer_step_async" : "finish_step_async",
           idle, running);
    assert_true(running < 0.15);
    assert_int_equal(dos_optimizer_wait_step(opt, &s), DOS_OK);
  }
  /* the workers run again for the next phase */
  assert_int_equal(dos_optimizer_step(opt, &s), DOS_OK);
  int64_t steps[8];
  assert_int_equal(dos_optimizer_step_counts(opt, steps), DOS_OK);
  for (size_t i = 0; i < dos_optimizer_num_subgroups(opt); ++i) assert_int_equal(steps[i], 3);
  dos_optimizer_destroy(opt);
}

/* Timelines: off by default (no task kept); on, every subgroup's Adam on the CPU lane within the
 * phase's seconds and the phase's start between two readings of dos_clock_seconds(); an overlapped
 * phase kept whole shows speculative Adams only; a capacity below the count copies that many and
 * still says how many there are; bad calls refused. */
static void test_timeline(void** state) {
  (void)state;
  static float p[N], g[N];
  dos_optimizer* opt = filled_optimizer(p, g);
  const size_t ns = dos_optimizer_num_subgroups(opt);
  dos_step_stats s;
  size_t count = 99;
  assert_int_equal(dos_optimizer_step(opt, &s), DOS_OK);
  assert_int_equal(dos_optimizer_last_timeline(opt, NULL, 0, &count, NULL), DOS_OK);
  assert_int_equal(count, 0);

  assert_int_equal(dos_optimizer_set_timeline(opt, 1), DOS_OK);
  const double before = dos_clock_seconds();
  assert_int_equal(dos_optimizer_step(opt, &s), DOS_OK);
  const double after = dos_clock_seconds();
  dos_timeline_task tasks[64];
  double started = -1;
  assert_int_equal(dos_optimizer_last_timeline(opt, tasks, 64, &count, &started), DOS_OK);
  assert_true(count >= ns && count <= 64);
  assert_true(started >= before && started <= after);
  int adam_of[64] = {0};
  for (size_t i = 0; i < count; ++i) {
    assert_int_equal(tasks[i].lane, DOS_LANE_CPU);
    assert_true(tasks[i].subgroup < ns);
    assert_true(tasks[i].start >= 0 && tasks[i].start <= tasks[i].end && tasks[i].end <= s.seconds + 1e-3);
    if (tasks[i].kind == DOS_TASK_ADAM) adam_of[tasks[i].subgroup]++;
    else assert_true(tasks[i].kind == DOS_TASK_GATHER || tasks[i].kind == DOS_TASK_SCATTER);
  }
  for (size_t k = 0; k < ns; ++k) assert_int_equal(adam_of[k], 1);
  size_t again = 0;
  dos_timeline_task one;
  assert_int_equal(dos_optimizer_last_timeline(opt, &one, 1, &again, NULL), DOS_OK);
  assert_int_equal(again, count);
  assert_memory_equal(&one, &tasks[0], sizeof one);

  /* an overlapped phase, every gradient declared at once and kept: the Adams are the speculative ones */
  assert_int_equal(dos_optimizer_begin_step(opt), DOS_OK);
  assert_int_equal(dos_optimizer_set_timeline(opt, 0), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_gradients_final(opt, 0, N), DOS_OK);
  assert_int_equal(dos_optimizer_finish_step(opt, DOS_VERDICT_KEEP, &s), DOS_OK);
  assert_int_equal(dos_optimizer_last_timeline(opt, tasks, 64, &count, NULL), DOS_OK);
  size_t spec = 0, plain = 0;
  for (size_t i = 0; i < count && i < 64; ++i) {
    spec += tasks[i].kind == DOS_TASK_ADAM_SPEC;
    plain += tasks[i].kind == DOS_TASK_ADAM;
  }
  printf("timeline: %zu subgroups; the overlapped phase kept whole: %zu speculative Adams, %zu others "
         "(speculated %llu)\n", ns, spec, plain, (unsigned long long)s.speculated);
  assert_int_equal(spec, s.speculated);
  assert_int_equal(spec + plain, ns);

  assert_int_equal(dos_optimizer_set_timeline(NULL, 1), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_set_timeline(opt, 2), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_last_timeline(opt, NULL, 3, &count, NULL), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_last_timeline(opt, tasks, 3, NULL, NULL), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_last_timeline(NULL, tasks, 3, &count, NULL), DOS_E_INVALID);
  assert_int_equal(dos_optimizer_set_timeline(opt, 0), DOS_OK);
  assert_int_equal(dos_optimizer_step(opt, &s), DOS_OK);
  assert_int_equal(dos_optimizer_last_timeline(opt, NULL, 0, &count, NULL), DOS_OK);
  assert_int_equal(count, 0);
  dos_optimizer_destroy(opt);
}

/* A runtime given no policy runs $STARPU_SCHED, and the caller's STARPU_SCHED is still set after it
 * (the runtime hides it from starpu_init only): a second runtime given no policy runs it again.
 * Last: it replaces the group's runtime by one of the same arguments. */
static void test_starpu_sched_kept(void** state) {
  (void)state;
  dos_runtime_destroy(g_rt);
  g_rt = NULL;
  assert_int_equal(setenv("STARPU_SCHED", "dmda", 1), 0);
  char name[64];
  for (int round = 0; round < 2; ++round) {
    dos_runtime* rt = NULL;
    assert_int_equal(dos_runtime_create(NULL, 1, 1, 0, 0, &rt), DOS_OK);
    assert_int_equal(dos_runtime_running_policy(rt, name, sizeof name), DOS_OK);
    if (strcmp(name, "dmda") != 0) fail_msg("round %d: a runtime given no policy runs '%s', not $STARPU_SCHED", round, name);
    dos_runtime_destroy(rt);
    const char* env = getenv("STARPU_SCHED");
    if (!env || strcmp(env, "dmda") != 0) fail_msg("round %d: STARPU_SCHED is '%s' after the runtime, not dmda", round, env ? env : "(unset)");
  }
  assert_int_equal(unsetenv("STARPU_SCHED"), 0);
  /* a policy that does not exist: refused by the runtime, the message led by the C call's name */
  dos_runtime* bad = (dos_runtime*)&bad;
  assert_int_equal(dos_runtime_create("no-such-policy", 1, 1, 0, 0, &bad), DOS_E_INVALID);
  assert_null(bad);
  if (strncmp(dos_last_error(), "dos_runtime_create: ", 20) != 0 || !strstr(dos_last_error(), "no-such-policy"))
    fail_msg("the unknown policy's refusal: %s", dos_last_error());
  assert_int_equal(dos_runtime_create(NULL, 1, 1, 0, 0, NULL), DOS_E_INVALID);
  assert_int_equal(strncmp(dos_last_error(), "dos_runtime_create: out is NULL", 31), 0);
  assert_int_equal(dos_runtime_create("cpu", 1, 1, 0, 0, &g_rt), DOS_OK);
}

/* dos_runtime_create_for_caller refuses a negative caller_cores (before anything starts) and a NULL
 * out; its other arguments are dos_runtime_create's (that one runtime serves the process). */
static void test_runtime_for_caller(void** state) {
  (void)state;
  dos_runtime* other = NULL;
  assert_int_equal(dos_runtime_create_for_caller("cpu", 0, -1, 1, 0, 0, &other), DOS_E_INVALID);
  assert_null(other);
  assert_non_null(strstr(dos_last_error(), "caller_cores"));
  assert_int_equal(dos_runtime_create_for_caller("cpu", 0, 1, 1, 0, 0, NULL), DOS_E_INVALID);
  assert_non_null(strstr(dos_last_error(), "out is NULL"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_gpu_memory_for_budgets),
      cmocka_unit_test(test_step),
      cmocka_unit_test(test_every_option),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_overlap_same_bits),
      cmocka_unit_test(test_overlap_bad_calls),
      cmocka_unit_test(test_set_gradients),
      cmocka_unit_test(test_master_ranges),
      cmocka_unit_test(test_compact_master),
      cmocka_unit_test(test_async_phase_pauses_workers),
      cmocka_unit_test(test_timeline),
      cmocka_unit_test(test_runtime_for_caller),
      cmocka_unit_test(test_starpu_sched_kept),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
