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
 *    of the last failure of the calling thread is returned by dos_last_error(); it begins with the
 *    name of the C call that failed, once, then ": " ("dos_optimizer_create: ...") or the rest of
 *    a sentence ("dos_optimizer_gradients_final after dos_optimizer_finish_step_async: ..."); the
 *    C++ method's own name is not repeated after it ("dos_optimizer_set_gradients: tensor 1 ...",
 *    "dos_optimizer_write_masters: values is null"), and an optimizer call's hints name the C calls
 *    to make ("wait for it (dos_optimizer_wait_step)").
 *  - Objects are opaque handles created by *_create and freed by *_destroy (NULL is accepted by
 *    *_destroy and ignored).
 *  - Element counts are size_t; times are seconds; byte counts are bytes.
 *  - dtype codes: DOS_DTYPE_FP32 (0), _FP16 (1), _BF16 (2) (dos::DType). memory codes:
 *    DOS_MEMORY_HOST (0), DOS_MEMORY_CUDA (1: the runtime's GPU, CUDA device 0 unless the runtime
 *    was given another).
 *  - An optimizer's options travel in struct dos_optimizer_options (filled with the defaults by
 *    dos_optimizer_options_init, then changed field by field), which carries its own size and
 *    version so that a struct of another layout is refused, not misread.
 *  - Pointers to the caller's parameters and gradients must stay valid, and their contents must
 *    not be touched by anyone else, while dos_optimizer_step or dos_optimizer_load_state runs (for
 *    an overlapped phase, see dos_optimizer_begin_step); gradients on the GPU must be complete (the
 *    caller synchronises its streams) before a step.
 */
#ifndef DOS_C_H
#define DOS_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 14: dos_step_stats.longest_download_seconds, longest_download_bytes and downloads_dodge_writebacks.
 * 13: options.compact_master (options version 5).
 * 12: dos_step_stats.plan_seconds and plan_decided_ahead.
 * 11: dos_step_stats.refinement_held.
 * 10: options.tail_subgroups (options version 4), dos_step_stats.tail_bound and tail_moved.
 * 9: timeline lane DOS_LANE_WRITEBACK and kind DOS_TASK_STATE (a streamed subgroup's state write-back).
 * 8: dos_gpu_memory_for_budgets, dos_starpu_device_margin.
 * 7: dos_optimizer_set_gradients, dos_optimizer_read_masters, dos_optimizer_write_masters.
 * 6: dos_runtime_create_for_caller.
 * 5: timelines (dos_optimizer_set_timeline, dos_optimizer_last_timeline, dos_clock_seconds).
 * 4: the update overlapped with the next forward (dos_optimizer_finish_step_async, _step_async,
 * _wait_parameters, _wait_step).
 * 3: the overlapped update (dos_optimizer_begin_step, _gradients_final, _finish_step), its fields
 * in dos_step_stats, options.speculation_budget (options version 2).
 * 2: dos_optimizer_create takes a struct dos_optimizer_options (1: positional arguments). */
#define DOS_C_ABI_VERSION 14

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
  double predicted_seconds;    /* the model's prediction (dos, static:R): the phase's set-up before its
                                * first submission, measured, plus the simulated phase; else 0 */
  double lower_bound_seconds;  /* the model's lower bound (dos, static:R), else 0 */
  /* The overlapped update (dos_optimizer_begin_step ... dos_optimizer_finish_step); zero after a
   * plain dos_optimizer_step, except exposed_seconds (about `seconds` then). */
  double exposed_seconds;      /* wall time of finish_step (of the plain step): what the caller waited
                                * for after its gradients were all final; `seconds` then counts from
                                * begin_step */
  uint64_t speculated;         /* subgroups updated speculatively (from gradients declared final) */
  uint64_t hidden_params;      /* of their elements, those whose speculative update had ended when
                                * finish_step was called (the update hidden behind the caller's work) */
  uint64_t redone;             /* speculative updates redone (DOS_VERDICT_CHANGED) */
  int32_t overlapped;          /* 1: the phase was opened by dos_optimizer_begin_step */
  int32_t skipped;             /* 1: DOS_VERDICT_SKIP, nothing was updated (subgroups_cpu/gpu are 0) */
  /* Late binding (options.tail_subgroups): subgroups whose side was decided while the phase ran,
   * and of them those that went to the other side than the plan's. */
  uint64_t tail_bound;
  uint64_t tail_moved;
  /* 1: the rates' refinement held this phase as an outlier (its measured / predicted ratio more
   * than 1.3x off the last phase's, under the same plan, after two steady phases) and refined
   * nothing from it; 0 otherwise. */
  int32_t refinement_held;
  /* Seconds the phase's start spent on its plan (counted in `seconds`): deciding it, or waiting for
   * the decision made when the phase before ended; 0 for StarPU's policies, forced plans and runs
   * without a CUDA worker. plan_decided_ahead: 1 when the phase took a decision made before it
   * began (for an equal input) instead of deciding then. */
  double plan_seconds;
  int32_t plan_decided_ahead;
  /* The runtime's own gradient downloads (the caller's gradients on the GPU copied into the host
   * staging of the subgroups the plan updates on the CPU; DOS_COPY_BY) that went by the copy engine
   * (cudaMemcpyAsync): the phase's one that took longest from its issue to its end, seconds, and its
   * bytes; 0 and 0 when none went by the copy engine (no GPU, gradients in host memory or staged by
   * StarPU tasks, no subgroup that a plan puts on the CPU (StarPU's policies make no plan), or every
   * download by the kernel). A compact master's parameter downloads are not counted. */
  double longest_download_seconds;
  uint64_t longest_download_bytes;
  /* 1: the phase's gradient downloads issued while a streamed state was on its way home (its Adam
   * ended on the GPU, its write-back not yet done) went by the kernel instead of the copy engine:
   * always under DOS_COPY_BY=auto, under adaptive (the default) once the rule turned after a
   * download of the process starved (dos::runtime_copy_by), as the runtime stood when the phase
   * began; said of every phase, one that downloaded nothing too (1 under DOS_COPY_BY=auto without
   * a GPU); 0 otherwise. */
  int32_t downloads_dodge_writebacks;
} dos_step_stats;

/* DOS_C_ABI_VERSION of the library (a binding checks it against its own). */
int dos_c_abi_version(void);
/* sizeof(dos_step_stats) in the library (a binding checks its own layout against it). */
size_t dos_step_stats_size(void);
/* The message of the calling thread's last failure ("" if none). Valid until the next call that
 * fails on this thread. */
const char* dos_last_error(void);

/* Starts the process's runtime (StarPU; one at a time per process).
 * policy: a registered plan ("cpu", "gpu", "dos", "static:R", "greedy", or one registered by the
 * caller: scheduler/plan.h) or a StarPU built-in ("dmda", ...); NULL or "" means $STARPU_SCHED if
 * set, else "cpu". cpu_threads, cpu_workers: 0 for the defaults; ncuda: -1 for one CUDA worker per
 * visible device, 0 for none; verbose: nonzero prints the choices on stderr. See
 * dos::RuntimeOptions. On success *out holds the handle. DOS_E_INVALID for a NULL out, an unknown
 * policy, a runtime that already exists in this process, cpu_threads < 0 or above 4 times the
 * machine's cores, cpu_workers < 0, ncuda < -1 or above the GPUs StarPU sees, $STARPU_NCPU,
 * $STARPU_NCPUS or $STARPU_NCUDA not a whole number >= 0, or a policy that needs a CUDA worker
 * without one (nothing of the process changed); DOS_E_RUNTIME when StarPU cannot start. */
int dos_runtime_create(const char* policy, int cpu_threads, int cpu_workers, int ncuda, int verbose,
                       dos_runtime** out);
/* dos_runtime_create leaving caller_cores (>= 0) cores to the caller's own threads when cpu_threads
 * is automatic (0): the thread that runs forward and backward while an overlapped update's CPU Adam
 * runs (dos::RuntimeOptions::caller_cores). DOS_E_INVALID for caller_cores < 0. */
int dos_runtime_create_for_caller(const char* policy, int cpu_threads, int caller_cores, int cpu_workers, int ncuda,
                                  int verbose, dos_runtime** out);
/* Bytes of GPU memory StarPU may need for one optimizer's update phases and resident state under its
 * GPU budgets (dos::gpu_memory_for_budgets, which gives the formula): elements, subgroup_size (>= 1),
 * param_bytes and grad_bytes (2 or 4: one parameter element and one gradient element as the runtime
 * stages them: the dtype's size, 4 for gradients sent in fp32), the options' gpu_update_budget and
 * gpu_resident_budget, speculative (nonzero: an overlapped update that speculates streamed
 * subgroups). *out is 0 when update_budget is 0. Sum it over the optimizers, add
 * dos_starpu_device_margin() once, and give the total to StarPU as $STARPU_LIMIT_CUDA_MEM (MiB,
 * rounded up) before the runtime starts: StarPU keeps every device buffer it freed until it reaches
 * that limit. DOS_E_INVALID for subgroup_size 0, other byte counts, a resident_budget below -1 or a
 * NULL out. */
int dos_gpu_memory_for_budgets(size_t elements, size_t subgroup_size, size_t param_bytes, size_t grad_bytes,
                               uint64_t update_budget, int64_t resident_budget, int speculative, size_t* out);
/* Bytes StarPU allocates on a GPU for itself beside the optimizers' data (dos::kStarpuDeviceMargin). */
size_t dos_starpu_device_margin(void);
/* Stops the runtime (deferred until the last optimizer is destroyed, see dos::Runtime). */
void dos_runtime_destroy(dos_runtime* rt);
/* The policy as StarPU reports it running, copied NUL-terminated into buf (truncated to len).
 * DOS_E_INVALID for a NULL rt or buf, or len 0. */
int dos_runtime_running_policy(const dos_runtime* rt, char* buf, size_t len);
/* Worker counts and OpenMP threads per CPU worker. Any output pointer may be NULL. DOS_E_INVALID
 * for a NULL rt. */
int dos_runtime_workers(const dos_runtime* rt, unsigned* cpu_workers, unsigned* cuda_workers, int* cpu_threads);

/* Codes of struct dos_optimizer_options' enumerated fields. */
#define DOS_DTYPE_FP32 0
#define DOS_DTYPE_FP16 1
#define DOS_DTYPE_BF16 2
#define DOS_MEMORY_HOST 0
#define DOS_MEMORY_CUDA 1
#define DOS_SUBMIT_ORDER_PLAN 0
#define DOS_SUBMIT_ORDER_CPU_FIRST 1

/* The layout version of struct dos_optimizer_options that this header describes. A field added
 * later comes with a new version, and with a new size unless it fills padding (version 4's
 * tail_subgroups did: 192 bytes on x86-64 as in version 3; version 5's compact_master does not:
 * 200 bytes); dos_optimizer_create refuses a struct whose `version` or `size` this library does
 * not know, so a binding checks both. */
#define DOS_OPTIMIZER_OPTIONS_VERSION 5 /* 5: compact_master; 4: tail_subgroups; 3: speculate_streamed; 2: speculation_budget; 1: none */

/* The resource model's rates of this machine (dos::Rates), for the policies that plan with a model
 * (dos, static:R, greedy). All zero (the default): measured at the optimizer's creation and cached
 * (see `recalibrate`); otherwise all six must be finite and > 0. dos::Rates::link_share (the links'
 * share of host memory beside CPU Adam) is not part of this struct: rates given here start with
 * link_share 1, the placeholder of no measure (calibrated or cached rates carry their own): the dos
 * policy takes its first measure whole, not half way, and refines it from then on. */
typedef struct dos_rates {
  double U_c;     /* CPU Adam on one StarPU CPU worker, no DMA running, parameters/s */
  double U_c_dma; /* the same while host -> device and device -> host both stream, parameters/s */
  double U_g;     /* GPU Adam, parameters/s */
  double D_c;     /* GPU gradient conversion to fp32, parameters/s */
  double B_h2d;   /* PCIe host -> device while both directions run, bytes/s */
  double B_d2h;   /* PCIe device -> host while both directions run, bytes/s */
} dos_rates;

/* Options of an optimizer (dos::OptimizerOptions), passed to dos_optimizer_create by pointer, in
 * the manner of StarPU's struct starpu_conf: fill the defaults with dos_optimizer_options_init,
 * change the fields wanted, then create. Every boolean field takes 0 or 1 only. Each field's
 * default is given as [default ...]; a value outside the range given makes dos_optimizer_create
 * return DOS_E_INVALID, with a message naming the field and its range. */
typedef struct dos_optimizer_options {
  /* Set by dos_optimizer_options_init; leave them as they are. size: sizeof(struct
   * dos_optimizer_options) in bytes as the library knows it; version: DOS_OPTIMIZER_OPTIONS_VERSION.
   * A struct that was not initialised, or that was built against another version of this header,
   * is refused. */
  size_t size;
  int version;

  /* Adam/AdamW hyper-parameters, as torch.optim.Adam (decoupled = 0: L2 weight decay added to the
   * gradient) and torch.optim.AdamW (decoupled = 1). The kernels compute in fp32: lr, eps,
   * weight_decay and lr x weight_decay must also be at most 3.4e38. */
  double lr;           /* learning rate, finite, >= 0 [1e-3] */
  double beta1;        /* in [0, 1) [0.9] */
  double beta2;        /* in [0, 1) [0.999] */
  double eps;          /* finite, >= 0: 0, or a value fp32 does not round to 0 (at least 1e-45) [1e-8] */
  double weight_decay; /* finite, >= 0 [0] */
  int decoupled;       /* 0 or 1 [1: AdamW] */

  /* Elements per subgroup, the unit of scheduling: the caller's tensors are concatenated and cut
   * into subgroups of this many elements, the last one holding the remainder; >= 1 [100000000]. */
  size_t subgroup_size;
  /* Element type of the caller's parameters and gradients: DOS_DTYPE_FP32, _FP16 or _BF16
   * [DOS_DTYPE_BF16]. */
  int dtype;
  /* Where the caller's parameters and gradients live: DOS_MEMORY_HOST or DOS_MEMORY_CUDA (CUDA
   * device 0; needs a CUDA worker) [DOS_MEMORY_HOST]. */
  int memory;

  /* GPU budgets (they take effect only with a CUDA worker). gpu_resident_budget: bytes of optimizer
   * state (12 per parameter, each subgroup's slices padded to 16 elements; about 10.125 with
   * compact_master) the GPU may keep between
   * iterations; -1: not given (dos and gpu then keep nothing resident); >= -1 [-1].
   * gpu_update_budget: bytes the update phase may hold on the GPU at once; 0: no limit; needs
   * eager_writeback = 1 when > 0 [0]. */
  int64_t gpu_resident_budget;
  uint64_t gpu_update_budget;
  /* Streamed subgroups whose state is prefetched to the GPU ahead of the one being submitted; 0:
   * none (StarPU prefetches a task's inputs when it is pushed); in [0, 1000] [3]. */
  int stream_lookahead;
  /* 1: write each streamed subgroup's state back to host memory as soon as its update ends; 0: all
   * at the end of the phase [1]. */
  int eager_writeback;
  /* 1: gradients of subgroups updated away from the caller's buffers cross PCIe in the parameters'
   * dtype and the kernel widens them; 0: converted to fp32 first. Same results either way [1]. */
  int native_grads;
  /* 1: a CPU-updated subgroup's parameter write-back task goes ahead of the queued tasks of the
   * worker that runs it. Same results either way [0]. */
  int urgent_writeback;
  /* Order in which the phase submits its subgroups: DOS_SUBMIT_ORDER_PLAN (the plan's order) or
   * DOS_SUBMIT_ORDER_CPU_FIRST (the CPU subgroups first). Same results either way
   * [DOS_SUBMIT_ORDER_PLAN]. */
  int submit_order;

  /* The model's rates (dos_rates) [all zero: calibrated]. recalibrate: 1 measures them again
   * instead of reading the cached ones (only when rates are all zero) [0]. */
  dos_rates rates;
  int recalibrate;

  /* 1: print the dos policy's calibration and the budgets' effect on stderr [1]. */
  int verbose;

  /* Host bytes for the shadow state of speculative updates (dos_optimizer_gradients_final): 12 per
   * parameter of a subgroup updated speculatively, allocated and pinned at its first speculative
   * update and kept until the optimizer is destroyed. -1: half of the host memory available
   * (MemAvailable, or the cgroup's limit where it leaves less) when the first speculative update comes; 0: no speculative update (the whole
   * update then runs in dos_optimizer_finish_step); a subgroup beyond the budget waits for
   * finish_step; >= -1 [-1]. */
  int64_t speculation_budget;

  /* 1: the subgroups the plan streams are updated speculatively too, on the GPU, while the
   * caller's backward runs (their state crosses PCIe then); 0: only the CPU's subgroups; 0 or 1 [1]. */
  int speculate_streamed;

  /* Late binding of the plan's tail (dos::OptimizerOptions::tail_subgroups): the last
   * tail_subgroups subgroups that a plan made with the model's rates (policies dos, static:R,
   * greedy) updates on the CPU or streams are given their side while the phase runs, each to the
   * side projected to end first. Only in phases run by dos_optimizer_step with a CUDA worker (not in
   * an overlapped or asynchronous one), only when the plan has CPU and streamed subgroups
   * before the tail (the binder learns each side's pace from them), and not before a phase of the
   * optimizer whose plan streams has ended (not skipped; it allocates the GPU buffers); otherwise,
   * and under other
   * policies, nothing is bound (accepted, no effect). Same results either way;
   * dos_step_stats.tail_bound and tail_moved say what it did. 0: the plan as made; in [0, 1000000]
   * (subgroups) [0]. */
  int tail_subgroups;

  /* The compact master (dos::OptimizerOptions::compact_master, codelets/kernels/compact_master.h):
   * 1 keeps each fp32 master parameter as its low 16 bits and one rounding bit beside the caller's
   * bf16 parameter P (M = ((P - r) << 16) | lo), so that a streamed subgroup's state crosses PCIe as
   * 10.125 bytes per parameter each way instead of 12 and CPU Adam moves 26.25 bytes of host memory
   * per parameter instead of 28; a CPU-updated subgroup brings its P down (2 bytes per parameter)
   * beside its gradient, unless its last update ran on the CPU too and left P in the host staging.
   * The same bits as 0 in the caller's parameters and in every state read back:
   * dos_optimizer_read_state, _read_masters and the masters of a checkpoint are rebuilt from the
   * caller's parameters, which must therefore hold what the last step (or load) wrote there: the
   * caller writes its parameters only through the optimizer (dos_optimizer_write_masters, _load_state).
   * dos_optimizer_write_masters also writes the caller's parameters (the values' bf16 rounding),
   * where 0 leaves them until the next step (_load_state writes them with either). Only with dtype DOS_DTYPE_BF16:
   * dos_optimizer_create refuses it with another dtype (DOS_E_INVALID, naming the field). The
   * speculative updates of an overlapped step run as the full master's (dos::OptimizerOptions::
   * compact_master; the same bits). Its GPU paths run in the GPU machine's tests
   * (train-compact-master, pytorch-compact-cuda-dos). 0 or 1 [0]. */
  int compact_master;
} dos_optimizer_options;

/* sizeof(struct dos_optimizer_options) in the library (a binding checks its own layout against it). */
size_t dos_optimizer_options_size(void);
/* Fills *options with the defaults (those of dos::OptimizerOptions, listed above) and sets `size`
 * and `version`. Writes dos_optimizer_options_size() bytes: the struct must be the one of this
 * header (check dos_c_abi_version() == DOS_C_ABI_VERSION). Returns DOS_E_INVALID when options is
 * NULL. */
int dos_optimizer_options_init(dos_optimizer_options* options);

/* Creates an Adam/AdamW optimizer over ntensors caller tensors: params[i] and grads[i] point at
 * numels[i] elements of type options->dtype in memory options->memory. The fp32 master parameters
 * are copied from the parameters. options: initialised by dos_optimizer_options_init, then changed
 * (read during the call only; NULL is refused). Returns DOS_E_INVALID (nothing created) for a NULL
 * argument, an options struct of an unknown size or version, a field outside its range (the message
 * names the field and the range), no element in all, or what dos::Optimizer refuses (a CUDA memory
 * kind without a CUDA worker, GPU budgets that cannot work); DOS_E_RUNTIME for more state than host
 * memory holds now (the message gives both sizes) or when StarPU fails. On success *out holds the
 * handle. */
int dos_optimizer_create(dos_runtime* rt, size_t ntensors, void* const* params, void* const* grads,
                         const size_t* numels, const dos_optimizer_options* options, dos_optimizer** out);
/* Destroys an optimizer (NULL is ignored). A phase opened by dos_optimizer_begin_step and not
 * finished is dropped first, as DOS_VERDICT_SKIP would (nothing of it kept); a phase left running
 * by dos_optimizer_finish_step_async or dos_optimizer_step_async is waited for and runs to its end.
 * Cannot report an error: a failure while closing the phase or tearing down is ignored. */
void dos_optimizer_destroy(dos_optimizer* opt);

/* Replaces the hyper-parameters used from the next step on (a learning-rate schedule). Validated as
 * at creation (the ranges of dos_optimizer_options' lr ... weight_decay, and lr, eps, weight_decay
 * and lr x weight_decay at most fp32's 3.4e38, an eps > 0 that does not round to 0 in fp32:
 * dos::validate_adam_hyper); on error nothing changes.
 * Returns DOS_E_INVALID for a NULL opt, a value out of its range (the message names it), or an
 * update phase open or still running (dos_optimizer_begin_step without finish_step, or
 * finish_step_async / step_async without wait_step). */
int dos_optimizer_set_hyper(dos_optimizer* opt, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int decoupled);
/* One update phase (synchronous): every subgroup's step count += 1, new parameters written into the
 * caller's buffers. stats may be NULL. DOS_E_INVALID while a phase is open (begin_step); after a
 * failure (DOS_E_RUNTIME) the optimizer refuses further steps. Like begin_step and step_async, it
 * first frees the calling thread's idle OpenMP threads of the library's libgomp (dos::Optimizer::step). */
int dos_optimizer_step(dos_optimizer* opt, dos_step_stats* stats);

/* The update overlapped with the caller's backward (dos::Optimizer::begin_step, gradients_final,
 * finish_step): the same bits as dos_optimizer_step after the same gradients, whatever was
 * speculated.
 *
 *   dos_optimizer_begin_step(opt);                    opens an update phase (its plan is made now)
 *   ... backward writes gradients ...
 *   dos_optimizer_gradients_final(opt, begin, end);   flat elements [begin, end) will not change
 *   ... more of backward, more declarations ...
 *   dos_optimizer_finish_step(opt, verdict, &stats);  every gradient is final: commit
 *
 * Elements are numbered in the flat order of the tensors given at creation (tensor 0's first, ...,
 * num_params() in all). A subgroup whose elements are all declared final and that the plan puts on
 * the CPU (every subgroup under a StarPU policy) is updated at once on CPU workers, speculatively:
 * the new state goes to a shadow copy (options.speculation_budget); the state and the caller's
 * parameters stay as they were until finish_step. The verdict says what the caller did after its
 * declarations: DOS_VERDICT_KEEP, the declared gradients are unchanged (the speculative updates
 * are kept); DOS_VERDICT_CHANGED, gradients were changed in place after being declared final
 * (clipping, loss-scale unscaling: every speculative update is redone from the state before the
 * step, with the gradients as they are now); DOS_VERDICT_SKIP, no update this step (a non-finite
 * gradient: the speculative results are dropped, step counts and parameters stay as before). Then
 * the rest of the phase runs as dos_optimizer_step does.
 *
 * While a phase is open, StarPU's workers run (they are paused between calls otherwise, and after
 * dos_optimizer_finish_step_async once the phase's tasks have ended), the
 * caller must not change gradients declared final except as its verdict says, must not write the
 * parameters (the runtime writes them during finish_step only), and may not call
 * dos_optimizer_step, _set_hyper, _read_state, _step_counts or _load_state (DOS_E_INVALID).
 * Gradients in CUDA memory must be complete (the caller synchronises the stream that wrote them)
 * before they are declared final. Destroying an optimizer with an open phase drops it as
 * DOS_VERDICT_SKIP would. */
#define DOS_VERDICT_KEEP 0
#define DOS_VERDICT_CHANGED 1
#define DOS_VERDICT_SKIP 2
/* Opens an update phase. DOS_E_INVALID when opt is NULL or a phase is already open; DOS_E_RUNTIME
 * when a previous step failed or the plan cannot be made (nothing is then open). */
int dos_optimizer_begin_step(dos_optimizer* opt);
/* Declares the gradients of flat elements [begin, end) final for the open phase (begin == end:
 * nothing). DOS_E_INVALID, changing nothing, when no phase is open, begin > end, end >
 * num_params(), or an element of the range was declared before in this phase (each element once
 * per phase); DOS_E_RUNTIME when a speculative update could not be submitted (the phase is then
 * closed and the optimizer refuses further steps). */
int dos_optimizer_gradients_final(dos_optimizer* opt, size_t begin, size_t end);
/* Closes the open phase with `verdict` (DOS_VERDICT_*) and runs the rest of the update; stats (may
 * be NULL) receives what the phase did. DOS_E_INVALID when no phase is open or verdict is not one
 * of the three (the phase stays open); DOS_E_RUNTIME when the update fails (the optimizer then
 * refuses further steps). */
int dos_optimizer_finish_step(dos_optimizer* opt, int verdict, dos_step_stats* stats);
/* The update overlapped with the caller's next forward too (dos::Optimizer::finish_step_async,
 * wait_parameters, wait_step): dos_optimizer_finish_step_async is dos_optimizer_finish_step
 * returning once every task is submitted; dos_optimizer_wait_parameters(opt, begin, end) blocks
 * until the caller's parameters of flat elements [begin, end) hold the step's result (at once when
 * no phase runs), so that a layer's forward waits only for its own; dos_optimizer_wait_step waits
 * for the rest of the phase and fills stats (may be NULL; exposed_seconds: the time spent in the
 * three). Same bits as dos_optimizer_finish_step. Until wait_step the phase counts as open
 * (dos_optimizer_step_open is 1, begin_step and step are refused) and the caller reads only the
 * ranges wait_parameters returned for. StarPU's workers are paused again as soon as the phase's
 * tasks have ended (a thread of the library waits for them), not at wait_step: the caller's own
 * computation in between does not compete with polling workers. DOS_E_INVALID: finish_step_async as finish_step;
 * wait_parameters with begin > end, end > num_params(), or while a phase is open and not
 * finished; wait_step without finish_step_async. DOS_E_RUNTIME when the update fails. */
int dos_optimizer_finish_step_async(dos_optimizer* opt, int verdict);
/* dos_optimizer_step without waiting: the whole phase submitted (not overlapped with backward:
 * stats.overlapped stays 0), then dos_optimizer_wait_parameters / dos_optimizer_wait_step as after
 * dos_optimizer_finish_step_async. DOS_E_INVALID when opt is NULL or a phase is open. */
int dos_optimizer_step_async(dos_optimizer* opt);
int dos_optimizer_wait_parameters(dos_optimizer* opt, size_t begin, size_t end);
int dos_optimizer_wait_step(dos_optimizer* opt, dos_step_stats* stats);
/* 1 while a phase is open (begin_step without finish_step or wait_step), 0 otherwise or when opt is
 * NULL. */
int dos_optimizer_step_open(const dos_optimizer* opt);

/* Elements the optimizer updates (the sum of numels given at creation); 0 when opt is NULL. */
size_t dos_optimizer_num_params(const dos_optimizer* opt);
/* Subgroups the elements were cut into (ceil(num_params / options.subgroup_size)); 0 when opt is
 * NULL. */
size_t dos_optimizer_num_subgroups(const dos_optimizer* opt);
/* Sizes (elements) and step counts of every subgroup, in subgroup order: out holds
 * dos_optimizer_num_subgroups() entries. dos_optimizer_subgroup_sizes: DOS_E_INVALID for a NULL
 * opt or out; allowed while a phase is open. dos_optimizer_step_counts: DOS_E_INVALID for a NULL
 * opt or out, or an update phase open or still running (as dos_optimizer_set_hyper). */
int dos_optimizer_subgroup_sizes(const dos_optimizer* opt, size_t* out);
int dos_optimizer_step_counts(const dos_optimizer* opt, int64_t* out);

/* Copies one part of the state (which: 0 fp32 master parameters, 1 exp_avg, 2 exp_avg_sq) into out,
 * num_params() floats (4 * num_params() bytes) of host memory, in the flat order of the tensors
 * given at creation. DOS_E_INVALID for a NULL opt or out, `which` outside 0-2, or an update phase
 * open or still running (as dos_optimizer_set_hyper); DOS_E_RUNTIME when reading the state fails. */
int dos_optimizer_read_state(const dos_optimizer* opt, int which, float* out);
/* Replaces the whole state: master, exp_avg, exp_avg_sq (num_params() floats each, host memory) and
 * the nsteps == num_subgroups() step counts; then writes the master parameters, rounded to the
 * dtype, into the caller's parameters. DOS_E_INVALID, nothing changed, for a NULL opt, master,
 * exp_avg or exp_avg_sq (or steps with nsteps > 0), an update phase open or still running (as
 * dos_optimizer_set_hyper), nsteps other than num_subgroups(), a step count negative or above 2^53,
 * or a value that is not finite (or a negative exp_avg_sq); also
 * DOS_E_INVALID when StarPU refuses a task writing the parameters (a dos::Error), DOS_E_RUNTIME for
 * other failures (out of host memory, ...). */
int dos_optimizer_load_state(dos_optimizer* opt, const float* master, const float* exp_avg,
                             const float* exp_avg_sq, const int64_t* steps, size_t nsteps);
/* Points the optimizer at other gradient buffers from the next update phase on: grads[i] is tensor
 * i's gradient now (ntensors: the count given at creation, in its order; the same dtype, element
 * count and memory kind as then), for a caller whose framework allocates gradients anew every step.
 * DOS_E_INVALID, nothing changed, for a NULL opt or grads,
 * another count (refused before grads is read), a NULL pointer for a tensor with elements, two
 * tensors' gradients that share memory, or an update phase open or still running. */
int dos_optimizer_set_gradients(dos_optimizer* opt, size_t ntensors, void* const* grads);
/* Copies the fp32 master parameters of flat elements [begin, end) into out (end - begin floats,
 * host memory). DOS_E_INVALID for a NULL argument (out may be NULL when begin == end), a range
 * outside the parameters, or an update phase open or still running. */
int dos_optimizer_read_masters(const dos_optimizer* opt, size_t begin, size_t end, float* out);
/* Replaces the fp32 master parameters of flat elements [begin, end) by values (end - begin floats,
 * host memory); the moments, step counts and the caller's parameters stay (a caller whose
 * parameters were written outside the optimizer makes their masters follow). DOS_E_INVALID,
 * nothing changed, as for dos_optimizer_read_masters, and when a value is not finite (NaN or inf,
 * which dos_optimizer_load_state refuses too). */
int dos_optimizer_write_masters(dos_optimizer* opt, size_t begin, size_t end, const float* values);

/* Timelines: what each task of an update phase did, and when. */
#define DOS_LANE_CPU 0 /* the task ran on a CPU worker */
#define DOS_LANE_GPU 1 /* on a CUDA worker (from its launch to the end of its asynchronous work) */
#define DOS_LANE_H2D 2 /* the runtime's own host-to-device copy, outside StarPU's workers (a
                          CPU-updated subgroup's parameter write-back to GPU tensors) */
#define DOS_LANE_D2H 3 /* the runtime's own device-to-host copy, outside StarPU's workers (a
                          CPU-updated subgroup's gradients from GPU tensors into host staging) */
#define DOS_LANE_WRITEBACK 4 /* a streamed subgroup's eager state write-back on StarPU's device-to-host
                                stream, from the end of the Adam that wrote the state to the state
                                being in host memory (its wait behind other transfers included: these
                                spans may overlap) */
#define DOS_TASK_ADAM 0      /* an Adam update */
#define DOS_TASK_ADAM_SPEC 1 /* a speculative Adam update (dos_optimizer_gradients_final) */
#define DOS_TASK_GATHER 2    /* a gradient conversion or copy into the runtime's buffers */
#define DOS_TASK_SCATTER 3   /* a parameter write-back into the caller's buffers */
#define DOS_TASK_STATE 4     /* a state write-back to host memory (lane DOS_LANE_WRITEBACK) */
typedef struct dos_timeline_task {
  int32_t lane;      /* DOS_LANE_* */
  int32_t kind;      /* DOS_TASK_* */
  uint64_t subgroup; /* the subgroup's index */
  double start;      /* seconds since the phase began (started_at below) */
  double end;
} dos_timeline_task;
/* on = 1: from the next phase on, every phase of opt records its tasks (a sampling thread runs while
 * a phase does); 0: no more. DOS_E_INVALID when opt is NULL, on is not 0 or 1, or a phase is open or
 * running. */
int dos_optimizer_set_timeline(dos_optimizer* opt, int on);
/* The tasks of opt's last ended phase (the one whose stats the last dos_optimizer_step,
 * _finish_step or _wait_step returned): copies min(capacity, count) of them into tasks (NULL when
 * capacity is 0), in the order they ended, and sets *count to how many there are (0 without a
 * timeline) and *started_at (NULL allowed) to when the phase began, seconds on dos_clock_seconds()'s
 * clock. DOS_E_INVALID when opt or count is NULL, or tasks is NULL with capacity > 0. */
int dos_optimizer_last_timeline(const dos_optimizer* opt, dos_timeline_task* tasks, size_t capacity, size_t* count,
                                double* started_at);
/* The runtime's clock, seconds (StarPU's starpu_timing_now(): monotonic, counted from StarPU's start
 * while a runtime runs); another clock of the process relates to it by reading both at once. */
double dos_clock_seconds(void);

#ifdef __cplusplus
}
#endif

#endif /* DOS_C_H */
