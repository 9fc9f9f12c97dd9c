/* Deep Optimizer States: the C ABI of the runtime (libdos_c.so).
 *
 * A thin, stable layer over the C++ API of dos.h for bindings that load the library at run time
 * (Python's ctypes: python/deep_optimizer_states). Only C types cross it: no C++ exception, no
 * std:: type, no torch type, so a binding does not depend on the C++ ABI of the caller's
 * framework (the same library serves Debian's torch 1.13 and a pip CUDA torch 2.x).
 *
 * Conventions:
 *  - Every function that can fail returns an int: 0 on success, DOS_E_INVALID (-1) for bad input,
 *    DOS_E_RUNTIME (-2) for anything else (StarPU, memory, a previous failed step). The message
 *    of the last failure of the calling thread is returned by dos_last_error().
 *  - Objects are opaque handles created by *_create and freed by *_destroy (NULL is accepted by
 *    *_destroy and ignored).
 *  - Element counts are size_t; times are seconds; byte counts are bytes.
 *  - dtype codes: 0 fp32, 1 fp16, 2 bf16 (dos::DType). memory codes: 0 host, 1 CUDA device 0.
 *  - Pointers to the caller's parameters and gradients must stay valid, and their contents must
 *    not be touched by anyone else, while dos_optimizer_step or dos_optimizer_load_state runs;
 *    gradients on the GPU must be complete (the caller synchronises its streams) before a step.
 */
#ifndef DOS_C_H
#define DOS_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DOS_C_ABI_VERSION 1

#define DOS_OK 0
#define DOS_E_INVALID (-1)
#define DOS_E_RUNTIME (-2)

typedef struct dos_runtime dos_runtime;
typedef struct dos_optimizer dos_optimizer;

/* What one update phase did (dos::StepStats without its strings and vectors). */
typedef struct dos_step_stats {
  double seconds;              /* wall time of the update phase */
  uint64_t params;             /* elements updated */
  uint64_t subgroups_cpu;      /* Adam tasks that ran on a CPU worker */
  uint64_t subgroups_gpu;      /* Adam tasks that ran on a CUDA worker */
  uint64_t bytes_h2d;          /* bytes moved host -> device during the phase */
  uint64_t bytes_d2h;          /* bytes moved device -> host during the phase */
  int64_t step;                /* the largest subgroup step count after the phase */
  double cpu_busy_seconds;     /* time CPU workers spent executing tasks, summed over workers */
  double gpu_busy_seconds;     /* same for CUDA workers */
  uint64_t planned_streamed;   /* subgroups the plan streamed through the GPU */
  uint64_t planned_resident;   /* subgroups the plan kept resident on the GPU */
  double predicted_seconds;    /* the model's prediction (dos, static:R), else 0 */
  double lower_bound_seconds;  /* the model's lower bound (dos, static:R), else 0 */
} dos_step_stats;

/* DOS_C_ABI_VERSION of the library (a binding checks it against its own). */
int dos_c_abi_version(void);
/* sizeof(dos_step_stats) in the library (a binding checks its own layout against it). */
size_t dos_step_stats_size(void);
/* The message of the calling thread's last failure ("" if none). Valid until the next call that
 * fails on this thread. */
const char* dos_last_error(void);

/* Starts the process's runtime (StarPU; one at a time per process).
 * policy: "cpu", "gpu", "dos", "static:R" or a StarPU built-in ("dmda", ...); NULL or "" means
 * $STARPU_SCHED if set, else "cpu". cpu_threads, cpu_workers: 0 for the defaults; ncuda: -1 for one
 * CUDA worker per visible device, 0 for none; verbose: nonzero prints the choices on stderr.
 * See dos::RuntimeOptions. On success *out holds the handle. */
int dos_runtime_create(const char* policy, int cpu_threads, int cpu_workers, int ncuda, int verbose,
                       dos_runtime** out);
/* Stops the runtime (deferred until the last optimizer is destroyed, see dos::Runtime). */
void dos_runtime_destroy(dos_runtime* rt);
/* The policy as StarPU reports it running, copied NUL-terminated into buf (truncated to len). */
int dos_runtime_running_policy(const dos_runtime* rt, char* buf, size_t len);
/* Worker counts and OpenMP threads per CPU worker. Any output pointer may be NULL. */
int dos_runtime_workers(const dos_runtime* rt, unsigned* cpu_workers, unsigned* cuda_workers, int* cpu_threads);

/* Creates an Adam/AdamW optimizer over ntensors caller tensors: params[i] and grads[i] point at
 * numels[i] elements of type dtype in memory `memory`. The fp32 master parameters are copied from
 * the parameters. Hyper-parameters as torch.optim.Adam (decoupled = 0) / torch.optim.AdamW
 * (decoupled != 0). subgroup_size: elements per subgroup (>= 1). verbose: nonzero prints the dos
 * policy's calibration on stderr. */
int dos_optimizer_create(dos_runtime* rt, size_t ntensors, void* const* params, void* const* grads,
                         const size_t* numels, int dtype, int memory, size_t subgroup_size, double lr,
                         double beta1, double beta2, double eps, double weight_decay, int decoupled, int verbose,
                         dos_optimizer** out);
void dos_optimizer_destroy(dos_optimizer* opt);

/* Replaces the hyper-parameters used from the next step on (a learning-rate schedule). Validated as
 * at creation; on error nothing changes. */
int dos_optimizer_set_hyper(dos_optimizer* opt, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int decoupled);
/* One update phase (synchronous): every subgroup's step count += 1, new parameters written into the
 * caller's buffers. stats may be NULL. After a failure the optimizer refuses further steps. */
int dos_optimizer_step(dos_optimizer* opt, dos_step_stats* stats);

size_t dos_optimizer_num_params(const dos_optimizer* opt);
size_t dos_optimizer_num_subgroups(const dos_optimizer* opt);
/* Sizes (elements) and step counts of every subgroup, num_subgroups() entries each. */
int dos_optimizer_subgroup_sizes(const dos_optimizer* opt, size_t* out);
int dos_optimizer_step_counts(const dos_optimizer* opt, int64_t* out);

/* Copies one part of the state (which: 0 fp32 master parameters, 1 exp_avg, 2 exp_avg_sq) into out,
 * num_params() floats of host memory, in the flat order of the tensors given at creation. */
int dos_optimizer_read_state(const dos_optimizer* opt, int which, float* out);
/* Replaces the whole state: master, exp_avg, exp_avg_sq (num_params() floats each, host memory) and
 * the nsteps == num_subgroups() step counts; then writes the master parameters, rounded to the
 * dtype, into the caller's parameters. On a size error nothing changes. */
int dos_optimizer_load_state(dos_optimizer* opt, const float* master, const float* exp_avg,
                             const float* exp_avg_sq, const int64_t* steps, size_t nsteps);

#ifdef __cplusplus
}
#endif

#endif /* DOS_C_H */
