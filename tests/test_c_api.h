/* What the c-api test's files share (test_c_api.c holds the definitions and main): the runtime
 * every test runs on, the tensors' sizes, the gradients, the options most tests start from, and the
 * tests the other files define. */
#pragma once

#include <stddef.h>

#include "dos_c.h"

/* Elements of the two tensors most tests use (N0 + N1 = N; 1001 fills 4 subgroups of 256 with a
 * tail of 233) and the steps each test runs. */
enum { N0 = 700, N1 = 301, N = N0 + N1 };
enum { STEPS = 4 };

/* The process's runtime: the CPU plan, one CPU worker of one thread, no CUDA worker (made by the
 * group's setup in test_c_api.c). */
extern dos_runtime* g_rt;

/* The gradient of element i at step t (1-based): signs and sizes vary from step to step, so that
 * beta1 and beta2 matter from the second step on; one element in 10 is tiny (1e-5 scale), so that
 * eps matters. */
float grad_at(int i, int t);

/* The options of an fp32 AdamW optimizer in subgroups of 256 (lr 1e-2, weight decay 0.1, quiet). */
dos_optimizer_options fp32_options(void);

/* An fp32 optimizer over one tensor of N elements (parameters p, gradients g) on g_rt; fails the
 * test when it cannot be made. */
dos_optimizer* one_tensor_optimizer(float* p, float* g);

/* An optimizer with options o over two tensors on g_rt: the first N0 elements of p and g (each
 * element elem_bytes long, as o's dtype says) and the N1 after them; fails the test when it cannot
 * be made. */
dos_optimizer* two_tensor_optimizer(void* p, void* g, size_t elem_bytes, const dos_optimizer_options* o);

/* Fails the test unless optimizers a and b (the same tensors and subgroups, at most 16) hold the
 * same step count in every subgroup. */
void assert_same_step_counts(dos_optimizer* a, dos_optimizer* b);

/* test_c_api_plain.c: the calls that need no runtime */
void test_defaults(void** state);
void test_gpu_memory_for_budgets(void** state);
/* test_c_api_overlap.c */
void test_overlap_same_bits(void** state);
void test_overlap_bad_calls(void** state);
/* test_c_api_compact.c */
void test_compact_master(void** state);
