"""``DeepOptimizerStates``: a ``torch.optim.Optimizer`` whose update phase runs on the runtime.

The model's parameters and gradients stay ordinary torch tensors (fp32, fp16 or bf16; in host
memory or on CUDA device 0); the runtime reads and writes them by pointer. The optimizer state
(fp32 master parameters, ``exp_avg``, ``exp_avg_sq``, a step count per subgroup) lives in the
runtime's pinned host memory, cut into subgroups of ``subgroup_size`` elements that the scheduling
policy updates on the CPU or streams through the GPU (Deep Optimizer States, arXiv 2410.21316).

The update is Adam (``decoupled=False``, L2 penalty added to the gradient, as ``torch.optim.Adam``)
or AdamW (``decoupled=True``, decoupled weight decay, as ``torch.optim.AdamW``), with the formulas
of PyTorch's documented algorithm (the "Algorithm" boxes of the ``torch.optim.Adam`` and
``torch.optim.AdamW`` documentation), with the fp32 operations in the order of torch 2.x's
single-tensor implementation (``codelets/kernels/adam.h``)::

    g_t = grad                                  (Adam with weight_decay != 0: g_t += weight_decay * p_{t-1})
    p   = p_{t-1} * (1 - lr * weight_decay)     (AdamW only)
    m_t = lerp(m_{t-1}, g_t, 1 - beta1)         (= beta1 * m_{t-1} + (1 - beta1) * g_t, from the nearer
                                                 end as ATen's lerp computes it)
    v_t = beta2 * v_{t-1} + ((1 - beta2) * g_t) * g_t
    p_t = p - lr / (1 - beta1^t) * m_t / (sqrt(v_t) / sqrt(1 - beta2^t) + eps)

applied to the fp32 master parameters; the caller's parameters receive p_t rounded to their dtype
(round to nearest even). ``t`` is each subgroup's own step count. Each fp32 operation is rounded
on its own; torch's kernels fuse some into multiply-adds (``lerp_``, ``addcmul_``, ``add(alpha=)``
on the CPU; CUDA builds contract them), so ``torch.optim.AdamW`` gives the same bits on the first
step and differs in the last place from the second. ``amsgrad``, ``maximize``,
``capturable``, ``differentiable`` and ``fused`` are taken at their defaults only.
"""

import ctypes
import math
import numbers
import threading
import time
import warnings

import torch

from . import _capi
from . import runtime as _rt
from .build import _Build
from .forward import _ForwardOverlap
from .gradients import _Gradients
from .overlap import _VERDICT_NAMES, _Overlap
from .param_groups import check_adamw_options, check_groups_unchanged, default_weight_decay_by_mode, group_hyper
from .state import _MAX_COUNT, STATE_FORMAT, _State  # noqa: F401 (STATE_FORMAT: re-exported)
from .timeline import _Timeline

class DeepOptimizerStates(_Build, _Overlap, _ForwardOverlap, _Gradients, _State, _Timeline, torch.optim.Optimizer):
    """Adam/AdamW with the optimizer state offloaded to pinned host memory and each subgroup's update
    placed on the CPU or streamed through the GPU by the runtime's scheduling policy.

    Arguments:
      params (iterable): tensors or param-group dicts, as for any ``torch.optim.Optimizer``. Every
        parameter must require gradients, be a dense contiguous leaf tensor of dtype
        ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``, in host memory or on CUDA device
        0, and appear once. Each (group, dtype, device) combination becomes one runtime optimizer
        ("bucket"), stepped one after the other.
      lr (float): learning rate (>= 0). Changing ``param_groups[i]["lr"]`` (an LR scheduler) takes
        effect at the next :meth:`step`; so do betas, eps, weight_decay and decoupled.
      betas (tuple of 2 floats): ``(beta1, beta2)``, each in [0, 1).
      eps (float): added to the denominator (>= 0; a value > 0 must not round to 0 in float32: at least 1e-45).
      weight_decay (float or None): >= 0; None means 1e-2 for AdamW (``torch.optim.AdamW``'s
        default) and 0 for Adam, each group by its own ``decoupled`` (a group that sets
        ``decoupled`` and leaves ``weight_decay`` out gets its mode's default).
      decoupled (bool): True for AdamW (decoupled weight decay), False for Adam (L2 penalty).
      subgroup_size (int): elements per subgroup (>= 1), the runtime's unit of scheduling; the
        parameters of a bucket are concatenated in order and cut into subgroups of this size.
      policy (str or None): the runtime's scheduling policy, process-wide: ``"dos"`` (the default
        when no runtime runs yet: the resource model places each subgroup), ``"cpu"``, ``"gpu"``,
        ``"static:R"`` or a StarPU built-in (``"dmda"``...). See :func:`get_runtime`.
      max_grad_norm (float or None): when set, every :meth:`step` clips the gradients so that their
        global L2 norm over all parameters (every bucket, every device) is at most this, as
        ``torch.nn.utils.clip_grad_norm_`` does (coefficient ``max_norm / (norm + 1e-6)``, applied
        when below 1).
      skip_nonfinite (bool): when True (default), a :meth:`step` whose gradients hold an inf or NaN
        updates nothing (no step count advances), is counted in :attr:`skipped_steps` and reported
        in :attr:`last_step`, as mixed-precision training with loss scaling needs.
      cpu_threads, cpu_workers, ncuda, verbose, caller_cores: runtime options, see :func:`get_runtime`;
        they take effect when this optimizer starts the runtime. ``caller_cores=None`` (default)
        leaves one core to this process's threads when ``overlap=True`` (its CPU Adam runs while
        backward launches kernels) and none otherwise, and asks nothing of a runtime already
        running (a warning says when that one leaves no core for an overlapped update); an integer
        is a demand, as the other options are. ``$OMP_NUM_THREADS`` wins over both.
        (``verbose`` also prints the ``dos`` policy's calibration).
      overlap (bool): when True, the update overlaps the backward pass: a hook on each parameter
        declares its gradient final to the runtime as soon as autograd has accumulated it, and the
        runtime updates every subgroup whose gradients are all final and that its plan puts on the
        CPU at once, speculatively, into shadow state; :meth:`step` then keeps those updates, redoes
        them (gradients changed after their declaration) or drops them (skipped step). The result
        is bit-identical to ``overlap=False`` whatever happens in between (see "Overlap" below).
        Default False: it costs up to 12 bytes of pinned host memory per parameter (the shadow
        state, ``speculation_budget``), keeps StarPU's workers awake (polling) from the first
        declaration to :meth:`step`, and pays off only when backward runs on the GPU while CPU
        cores are idle. Needs torch >= 2.1 (``Tensor.register_post_accumulate_grad_hook``) or a
        torch whose ``AccumulateGrad`` nodes take post hooks (1.x); otherwise a warning is given
        once and the optimizer runs without overlap.
      speculation_budget (int or None): host bytes for the shadow state of speculative updates, per
        bucket; None: the runtime's default (half of the available host memory at the first
        speculative update); 0: nothing is speculated. Only with ``overlap=True``.
      speculate_streamed (bool): with ``overlap=True``, the subgroups the plan streams through the GPU
        are updated speculatively too, on the GPU, while backward runs (True, the default); False:
        only the CPU's subgroups. The same bits either way. The GPU side pays off with the StarPU
        that ``scripts/setup.sh`` builds (device buffers from CUDA's stream-ordered allocator); with
        a site's own StarPU, each device buffer StarPU frees waits for the whole GPU: measure both.
        With ``overlap=True`` the thread that runs backward keeps a core of its own (``caller_cores``).
      flat_gradients (bool): True (the default): the optimizer keeps one gradient buffer per
        bucket from construction on and points each ``p.grad`` at its view of it (see "Memory"),
        which the overlapped update needs. False: the gradients stay where autograd puts them
        (allocated at each backward after ``zero_grad(set_to_none=True)``, freed by the next) and
        each :meth:`step` hands their addresses to the runtime, so that no gradient memory lives
        between steps, as with ``torch.optim``: under the Hugging Face Trainer, 4 bytes per fp32
        parameter less GPU memory during forward. Not with ``overlap=True`` (``ValueError``) nor
        :meth:`overlap_forward`. Gradients that share memory with each other or with a parameter
        are cloned at the step (each element must be scaled and read once). The same bits either
        way.
      urgent_writeback (bool): the parameters of the subgroups updated on the CPU go back to the
        model (a task of the CUDA worker when the model is on the GPU) ahead of the tasks already
        queued there, instead of behind every streamed subgroup's update. For
        :meth:`overlap_forward`, whose first layers otherwise wait for nearly the whole phase when
        the plan puts their subgroups on the CPU; measured slower for a phase run alone (README),
        hence False by default. The same bits either way.
      gpu_update_budget (int or None): bytes of GPU memory each bucket's update phase may hold at once
        (streamed subgroups' state, gradients and parameters in flight), >= 1; subgroups beyond it
        wait, and a budget below one streamed subgroup's footprint (about 16 bytes per element for
        bf16 parameters) leaves every subgroup that is not resident on the CPU; one below a CPU
        subgroup's gradient and parameter staging on the GPU raises ``ValueError`` (with a CUDA
        worker and CUDA parameters: the runtime's check, at construction). None (default): no
        limit but StarPU's own (90% of the device). Buckets step one after the other, except phases
        left running into the next forward (:meth:`overlap_forward`), which hold one budget each.
        An optimizer with a ``gpu_update_budget`` and policy ``dos``, ``gpu`` or ``greedy`` that
        starts the runtime also bounds StarPU's cache of device buffers (:func:`get_runtime`'s
        ``gpu_memory_limit``) by the sum over its buckets of what each may hold (the larger of the
        update budget and one subgroup, at most the whole bucket streamed, more when ``overlap``
        speculates, plus its resident budget), plus 64 MiB
        (:func:`~deep_optimizer_states.bucket.gpu_memory_for_buckets` gives the formula): without it StarPU keeps every device buffer it freed, far beyond the budget.
      gpu_resident_budget (int or None): bytes of optimizer state (12 per parameter, each
        subgroup's three slices padded to 16 elements; about 10.125 with ``compact_master``) each
        bucket may keep on the GPU between steps, >= 0; None (default): not given (policies ``dos``
        and ``gpu`` then keep nothing resident). Both budgets take effect only when the runtime has a CUDA
        worker, are the same bits either way, and are the runtime's ``OptimizerOptions`` fields of
        the same names.
      tail_subgroups (int): late binding of the plan's tail, in [0, 1000000] (subgroups): the last
        ``tail_subgroups`` subgroups that a plan made with the model's rates (policies ``dos``,
        ``static:R``, ``greedy``) updates on the CPU or streams get their side while the phase runs,
        each going to the side projected to end first from the pace each has kept in that phase.
        Only in plain steps with a CUDA worker (not with ``overlap=True``, nor in a phase left
        running into the next forward), only when the plan has CPU and streamed subgroups before
        the tail, and not before a bucket's first (not skipped) step whose plan streams has ended
        (it allocates the GPU buffers);
        otherwise, and under other policies, nothing is bound (no error). The same bits
        either way; each bucket's entry of ``last_step["stats"]`` has ``tail_bound`` and
        ``tail_moved``. 0 (default): the plan as made. dos-train measured 6 at 1.8-7.2% faster than
        the plan as made on a 20B shard in one set of runs and no faster in another (README); from
        PyTorch (``train_gpt.py --tail-subgroups 6``, a 1.01e9-parameter GPT) it changed nothing
        measurable.
      compact_master (bool): keep each bf16 bucket's fp32 master parameters in the runtime as their
        low 16 bits and one rounding bit each, beside the bf16 parameter itself (the compact master,
        ``codelets/kernels/compact_master.h``: master = ((P - r) << 16) | lo, P the parameter's
        bits), so that a streamed subgroup's state crosses PCIe as 10.125 bytes per parameter each way
        instead of 12, and CPU Adam moves 26.25 bytes of host memory per parameter instead of 28 (a
        subgroup updated on the CPU brings its parameters down from the GPU beside its gradients: 2
        bytes per parameter more down). Applies to the bf16 buckets only; buckets of fp32 or fp16
        parameters keep the full master (their rounding is not the master's high half), with no
        error (a warning when no bucket is bf16). The same bits as False in the parameters and the state: the masters are rebuilt from
        the parameters whenever they are read (:meth:`state_dict`), and a state dict saved by either
        form loads into the other. With ``overlap=True`` its subgroups are updated speculatively
        during backward as in the full form (those the plan streams on the GPU, with
        ``speculate_streamed``).
        Refused: once a bucket has been updated or
        has loaded a state, a bf16 parameter written in place (``RuntimeError`` at the next
        :meth:`step`, :meth:`state_dict` or :meth:`refresh_masters`, nothing changed; see
        "Parameters written in place" below). The pinned host memory (12 bytes per parameter) and
        the GPU budgets' figures are those of the full master (an upper bound). Its GPU paths
        (parameters on CUDA) run in the GPU machine's tests (``pytorch-compact-cuda-dos``: the same
        bits as the full master) and trained the README's 1.01e9-parameter GPT. Default False.
      amsgrad, maximize, capturable, differentiable, fused, foreach: ``torch.optim.AdamW``'s
        options, so that code written for it runs unchanged: taken at their defaults only (a true
        value raises ``ValueError``; ``foreach`` at any value), as in a param group's dict
        (:func:`param_groups.check_adamw_options`).
      timeline (bool): record every task of each update phase (lane, kind, subgroup, start, end)
        into :attr:`last_step` (see :meth:`step`); costs a thread sampling the bus every millisecond
        while a phase runs. Default False. The attribute :attr:`timeline` may be changed between
        steps: each bucket applies it from its next phase on (a phase still running, or open during
        backward, keeps what it began with).

    Overlap: which backward is the last before :meth:`step` is not known while it runs (gradient
    accumulation runs several, and the hooks fire in each). The optimizer counts the backward
    passes that accumulate into each gradient between two steps and, from the next step on,
    declares a gradient final during the backward it expects to be the last (the first at the start;
    then as many as the previous step had). A gradient is declared final at most once per step, and
    only into the optimizer's flat gradient buffer: the hook copies a gradient that autograd put
    elsewhere (after ``zero_grad(set_to_none=True)``) into the buffer and points ``p.grad`` at it.
    At :meth:`step` the speculative updates of a bucket are redone (``last_step["verdicts"]``
    ``"changed"``, the reason in ``last_step["redo_reasons"]``) when another backward accumulated
    into a declared gradient (more micro-batches than expected), when anything wrote into the
    bucket's gradients after the last accumulation the hooks saw or between two of them (the
    buffer's ``_version``, which every in-place operation bumps, and each accumulation by exactly
    one: ``torch.nn.utils.clip_grad_norm_``, ``GradScaler.unscale_``, your own code or hooks; a
    hook of yours that runs before this optimizer's on the same parameter and writes its gradient
    makes every step redo; not a write through ``p.grad.data``, which torch does not count: write
    ``p.grad`` itself), when a declared ``p.grad`` is no longer the buffer's view, when this optimizer
    clips (``max_grad_norm``, only on steps where the norm is above it) or unscales (``grad_scale``),
    or when ``param_groups``' hyper-parameters changed after the declarations (then the phase is
    dropped and the step runs whole). A skipped step (inf or NaN) drops them. :meth:`zero_grad`,
    :meth:`state_dict`, :meth:`load_state_dict` and :meth:`subgroup_steps` between a backward and
    :meth:`step` drop them too (nothing is updated; the step then runs whole). For the overlap to
    pay off, let this optimizer clip (``max_grad_norm``) instead of ``clip_grad_norm_``, which
    writes the gradients in place even when it does not clip.

    The next forward: after :meth:`overlap_forward` (model), :meth:`step` leaves the update phases
    running and each layer's forward waits for its own parameters (see there; :meth:`wait` closes
    the phases), with or without ``overlap``; the same bits.

    A parameter that does not require gradients at construction (frozen) stays in ``param_groups``
    with no state and is never updated, as ``torch.optim`` keeps it; :meth:`step` refuses it once it
    has a gradient (``RuntimeError``).

    Raises ``ValueError`` for bad input (every parameter frozen, a sparse,
    non-contiguous, duplicated or overlapping parameter, an unsupported dtype or device, a
    hyper-parameter out of range, an unsupported option such as ``amsgrad=True``, ``overlap=True``
    with ``compact_master=True``, ``param_groups``
    edited by hand after construction (at :meth:`step`), a policy other
    than the running runtime's), :class:`DosError` when the runtime fails (for example not enough
    host memory for the state), ``OSError`` when ``libdos_c.so`` cannot be loaded.

    Memory: the runtime holds 12 bytes of fp32 state per parameter plus 4 + 2 (or 4) bytes of
    staging, in host memory; the optimizer also keeps (unless ``flat_gradients=False``) one flat
    gradient buffer per bucket (the
    parameters' dtype and device) and points each ``p.grad`` at a view of it (a gradient present at
    construction at once, a new one as backward accumulates it), so that backward
    accumulates into it and no copy is needed at :meth:`step`. After ``zero_grad(set_to_none=True)``
    (torch 2's ``Module.zero_grad`` and the Hugging Face Trainer) a hook on each parameter
    (where torch has one) copies the gradient autograd allocated into the buffer as soon as it is
    accumulated and points ``p.grad`` at the view, so that the model's gradients are never held
    twice; at most one parameter's gradient is, for a moment.

    Parameters written in place after construction or between steps (``model.load_state_dict``,
    ``p.copy_`` under ``torch.no_grad()``, ``torch.nn.init``; seen by each parameter's version
    counter, which such writes bump): the next update starts from them, as with ``torch.optim``; the
    runtime's fp32 master of an element whose parameter no longer holds it rounded is replaced by the
    parameter's value (the moments stay). Writes torch does not count (through ``p.data``, or a
    collective writing into the parameter's memory) are not seen: call :meth:`refresh_masters`
    after them. A parameter given to two of these optimizers is written by each in turn, and each
    starts from what the other wrote, as two ``torch.optim`` optimizers over one parameter do
    (with ``overlap=True`` both then redo their bucket's speculative updates every step: nothing
    is gained by the overlap there). A write after backward, once the overlapped update has
    speculated, drops what was speculated (the step runs whole). With :meth:`overlap_forward`, call
    :meth:`wait` before writing parameters outside a forward (``model.load_state_dict`` waits by
    itself). With ``compact_master=True`` a bf16 bucket keeps no copy of what the runtime last wrote
    into its parameters (the parameter holds its master's high half), so the rule above cannot be
    applied once the bucket has been updated or has loaded a state: a parameter of it written in
    place (or given to another optimizer too) then makes :meth:`step`, :meth:`state_dict` and
    :meth:`refresh_masters` raise ``RuntimeError``, changing nothing, rather than give other bits
    than ``compact_master=False``. Before its first update or load its masters are its parameters
    (the low halves and rounding bits are zero), and writes are followed exactly as above (the same
    bits). To resume from checkpoints, load the model's before the optimizer's (a whole state
    loaded, :meth:`load_state_dict`, also clears the refusal); to write parameters in place between
    steps, use ``compact_master=False``. A write through ``p.data`` (or any other the version
    counter does not see: a collective writing into the parameter's memory) is not followed
    consistently in compact form: a subgroup whose last update ran on the GPU takes it as the
    parameter its master is rebuilt from, one whose last update ran on the CPU keeps the value in the
    runtime's host staging and overwrites it at its next step; with ``compact_master=False`` every
    subgroup keeps its master. Do not make one (``refresh_masters`` does not help there).

    Notes: ``self.state`` stays empty (the state lives in the runtime; read it with
    :meth:`state_dict`, empty too until the first update, as ``torch.optim``'s); groups cannot be
    added after construction.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None, decoupled=True,
                 subgroup_size=100_000_000, policy=None, max_grad_norm=None, skip_nonfinite=True,
                 cpu_threads=0, cpu_workers=0, ncuda=-1, verbose=False, overlap=False, speculation_budget=None,
                 speculate_streamed=True, urgent_writeback=False, gpu_update_budget=None, gpu_resident_budget=None,
                 timeline=False, caller_cores=None, flat_gradients=True, tail_subgroups=0, compact_master=False,
                 amsgrad=False,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        check_adamw_options("", dict(amsgrad=amsgrad, maximize=maximize, capturable=capturable,
                                     differentiable=differentiable, fused=fused))
        for name, value in (("decoupled", decoupled), ("skip_nonfinite", skip_nonfinite), ("overlap", overlap),
                            ("verbose", verbose), ("speculate_streamed", speculate_streamed),
                            ("urgent_writeback", urgent_writeback), ("flat_gradients", flat_gradients),
                            ("compact_master", compact_master)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        wd_by_mode = weight_decay is None  # each group's default then follows its own decoupled
        if weight_decay is None:
            weight_decay = 1e-2 if decoupled else 0.0
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decoupled=decoupled)
        self._buckets = []
        self._built = False
        self._closed = False
        # the object that owns the runtime's optimizers: a wrapper that subclasses this class and
        # shares its attributes (PyTorch Lightning's LightningOptimizer forwards them, or copied
        # them before Lightning 2) must not free them when it is dropped
        self._owner_id = id(self)
        self._broken = None
        self._state_loaded = False  # load_state_dict took a state with tensors (see _State._pristine)
        self._hook_handles = []
        self._forward_handles = []  # overlap_forward's hooks
        self._forward_overlap = False
        self._forward_depth = None  # overlap_forward: [model forwards running]
        self._grad_accumulators = []  # the AccumulateGrad nodes hooked (torch < 2.1), kept alive
        self._frozen = []  # (state_dict index, parameter) of the parameters frozen at construction
        # reentrant: wait() and _apply_timeline take it too, and run inside _drop_open_phases; hooks of
        # CPU and CUDA buckets run on different threads (the caller's and autograd's device thread)
        self._overlap_lock = threading.RLock()
        self._declarer = None  # overlap.py's _Declarer, started at the first CUDA gradient declared final
        self._backwards_expected = 1  # backward passes per step, as the last step had them
        self._backwards_seen = 0      # most accumulations into one gradient since the last step
        self._redo_key, self._redo_warned = None, False  # _note_redo_streak
        self._redo_lost = []  # buckets that lost their speculation, per step of the streak (its length)
        params = params if isinstance(params, torch.Tensor) else list(params)  # a tensor: torch.optim refuses it
        # which group dicts set weight_decay (torch.optim fills defaults into the same dicts)
        wd_given = [] if isinstance(params, torch.Tensor) else \
            [("weight_decay" in g) if isinstance(g, dict) else None for g in params]
        super().__init__(params, defaults)
        if wd_by_mode:
            default_weight_decay_by_mode(self.param_groups, wd_given)
        if not _capi.int_in(subgroup_size, 1, _MAX_COUNT):
            raise ValueError(f"subgroup_size must be an integer in [1, 2**53] (elements), got {subgroup_size!r}")
        if max_grad_norm is not None and not (isinstance(max_grad_norm, numbers.Real) and not isinstance(
                max_grad_norm, bool) and max_grad_norm > 0 and math.isfinite(max_grad_norm)):
            raise ValueError(f"max_grad_norm must be a finite number > 0 or None, got {max_grad_norm!r}")
        # byte counts as the runtime's fields hold them (int64, or uint64 for the update budget)
        for name, value, low, high in (("speculation_budget", speculation_budget, 0, 2 ** 63 - 1),
                                       ("gpu_update_budget", gpu_update_budget, 1, 2 ** 64 - 1),
                                       ("gpu_resident_budget", gpu_resident_budget, 0, 2 ** 63 - 1)):
            if value is not None and not _capi.int_in(value, low, high):
                raise ValueError(f"{name} must be None or an integer in [{low}, {high}] (bytes), got {value!r}")
        if not _capi.int_in(tail_subgroups, 0, 1000000):
            raise ValueError(f"tail_subgroups must be an integer in [0, 1000000] (subgroups; 0: the plan as made), "
                             f"got {tail_subgroups!r}")
        if overlap and not flat_gradients:
            raise ValueError("overlap=True needs flat_gradients=True: the overlapped update declares gradients final "
                             "in the optimizer's own buffers while backward runs")
        #: Whether the optimizer keeps its own gradient buffers (bool, ``flat_gradients`` as given).
        self.flat_gradients = flat_gradients
        self.speculation_budget = speculation_budget
        self.speculate_streamed = speculate_streamed
        self.urgent_writeback = urgent_writeback
        self.gpu_update_budget = gpu_update_budget
        self.gpu_resident_budget = gpu_resident_budget
        #: Late binding of the plan's tail (int, ``tail_subgroups`` as given): read when each bucket's
        #: runtime optimizer is created.
        self.tail_subgroups = tail_subgroups
        #: Whether the bf16 buckets keep the compact master (bool, ``compact_master`` as given; each
        #: bucket's ``compact`` says whether it does).
        self.compact_master = compact_master
        # switches a framework's wrapper may set: one dict, which Lightning's wrappers share (one copies
        # __dict__, the other forwards attribute reads), so that setting them through a wrapper reaches us
        self._settings = {}
        self.timeline = timeline  # the property below checks it
        self.subgroup_size = subgroup_size
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.skip_nonfinite = bool(skip_nonfinite)
        #: Steps skipped because a gradient held an inf or NaN (int).
        self.skipped_steps = 0
        #: Update phases run (int; skipped steps not counted).
        self.steps_taken = 0
        #: What the last :meth:`step` did (dict, see :meth:`step`); None before the first.
        self.last_step = None
        hypers = [self._group_hyper(i, g) for i, g in enumerate(self.param_groups)]
        _rt._check_caller_cores(caller_cores)
        self._overlap_asked = bool(overlap)
        self._build(hypers, policy, cpu_threads, cpu_workers, ncuda, verbose, caller_cores, 1 if overlap else 0)
        #: Whether the update overlaps backward (bool): ``overlap`` as given, False where this torch
        #: has no hook for it.
        self.overlap = bool(overlap) and self._install_hooks()
        if not self.overlap and self.flat_gradients:
            self._install_hooks(adopt_only=True)  # gradients moved into the flat buffers as they come
        if self.overlap and _rt.leaves_no_caller_core(self.runtime):
            warnings.warn("overlap=True: the runtime was started leaving no core to this process's threads "
                          "(automatic cpu_threads, caller_cores=0), so backward's kernel launches share cores with "
                          "CPU Adam; start it with get_runtime(caller_cores=1) or let this optimizer start it",
                          stacklevel=2)

    # ------------------------------------------------------------------------------------------
    # construction

    def add_param_group(self, param_group):
        """Adds a param group during construction (``torch.optim.Optimizer``'s contract). After
        construction it raises ``RuntimeError``: the runtime's state is laid out once; create a new
        optimizer over all the groups instead."""
        if getattr(self, "_built", False):
            raise RuntimeError("DeepOptimizerStates cannot add a param group after construction: the runtime's "
                               "state is laid out once; create a new optimizer over all the groups")
        super().add_param_group(param_group)

    _group_hyper = staticmethod(group_hyper)

    def _check_groups(self):
        """Raises ``ValueError`` (changing nothing) when ``param_groups`` no longer holds the groups
        and parameters the optimizer was built with (:func:`param_groups.check_groups_unchanged`)."""
        check_groups_unchanged(self.param_groups, self._built_groups)

    # ------------------------------------------------------------------------------------------
    # stepping

    def _check_open(self):
        if self._closed:
            raise RuntimeError("this DeepOptimizerStates was closed (close() or deep_optimizer_states.shutdown())")
        if self._broken:
            raise RuntimeError(f"a previous step failed ({self._broken}): the optimizer state may be inconsistent; "
                               "create a new optimizer (and load a checkpoint)")

    @torch.no_grad()
    def step(self, closure=None, grad_scale=None):
        """Runs one update phase over every parameter.

        Arguments:
          closure (callable or None): re-evaluates the model and returns the loss (run with
            gradients enabled before the update), as for any ``torch.optim.Optimizer``.
          grad_scale (float or None): the loss scale the gradients carry (loss multiplied by it
            before backward); the update uses ``grad / grad_scale`` (exact for powers of 2).

        Every parameter must have a dense gradient of its own dtype (a sparse gradient, from
        ``nn.Embedding(sparse=True)`` after ``zero_grad(set_to_none=True)``, is refused; where
        ``p.grad`` still holds the optimizer's dense buffer, autograd adds a sparse gradient into
        it and the update sees a dense one). Before anything is updated, the
        gradients are copied into the optimizer's flat buffers where they are not already there
        (``p.grad`` then points at the buffer; with ``flat_gradients=False`` they stay where they
        are, made contiguous, cloned where they share memory with another gradient or a parameter,
        and their addresses go to the runtime), their global L2 norm is computed over all
        parameters (per parameter in fp32, then over parameters in fp64; in fp64 throughout when fp32 overflows) when ``max_grad_norm`` or
        ``skip_nonfinite`` asks for it, and they are scaled in place by ``1 / grad_scale`` and the
        clipping coefficient. With ``skip_nonfinite``, gradients holding an inf or NaN skip the
        update (nothing changes, ``skipped_steps`` += 1). CUDA work of the caller's current stream is synchronised
        first.

        Returns the closure's loss (or None). Sets :attr:`last_step` to a dict: ``skipped`` (bool),
        ``grad_norm`` (float, the unscaled norm before clipping; None when not computed),
        ``clip_coef`` (float, 1.0 when not clipped), ``update_seconds`` (float, s: the runtime's
        update phases, summed over buckets), ``step_seconds`` (float, s: the whole call),
        ``stats`` (list of per-bucket :class:`StepStats` dicts; with ``timeline=True`` each also has
        ``started_at``, s on ``time.perf_counter()``'s clock, and ``timeline``, the phase's tasks); and the overlapped update's
        (``overlap=True``; zero, False or None otherwise): ``overlapped`` (bool: a bucket's phase was
        opened during backward), ``speculated`` (int: subgroups updated speculatively during
        backward), ``hidden_params`` (int: elements whose speculative update had ended when step()
        came), ``redone`` (int: speculative updates redone), ``exposed_seconds`` (float, s: the
        update phases' time inside step(), summed over buckets; ``update_seconds`` then counts from
        each phase's opening), ``verdicts`` (per bucket: ``"keep"``, ``"changed"``, ``"skip"``, or
        None for a plain update phase), ``redo_reasons`` (list of str: why speculative updates were
        redone or dropped).

        When no parameter has a gradient yet (before the first backward, or after
        ``zero_grad(set_to_none=True)``), the step changes nothing, as ``torch.optim`` does, and
        :attr:`last_step` says ``skipped`` and ``no_gradients``.

        Raises ``RuntimeError`` (nothing updated) when some parameters have a gradient and another has none, a sparse
        gradient, changed dtype, device, storage or shape since construction, or no longer requires
        gradients, or a parameter frozen at construction has a gradient, or (``compact_master=True``)
        a bf16 parameter was written in place after its bucket's first update or load; ``ValueError`` for an
        invalid hyper-parameter in ``param_groups`` or
        ``grad_scale``; :class:`DosError` when the runtime fails (the optimizer then refuses further
        steps).
        """
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        try:
            self._step(grad_scale)
        except BaseException:
            self._drop_open_phases()  # nothing was updated: what was speculated goes too
            raise
        finally:
            if self._backwards_seen > 0:  # learnt for the next step (see the class's "Overlap")
                self._backwards_expected = self._backwards_seen
            self._backwards_seen = 0
            for b in self._buckets:
                if not b.open:
                    b.reset_overlap()
        return loss

    def _step(self, grad_scale):
        """The body of :meth:`step` after the closure (see there); raises as it does."""
        t0 = time.perf_counter()
        self.wait()  # the phases the last step left running (overlap_forward)
        self._restore_cleared_grads()
        if grad_scale is not None:
            grad_scale = float(grad_scale)
            if not (grad_scale > 0 and math.isfinite(grad_scale)):
                raise ValueError(f"grad_scale must be a finite number > 0, got {grad_scale}")
        self._check_groups()
        hypers = [self._group_hyper(i, g) for i, g in enumerate(self.param_groups)]
        if not self._check_params():  # no gradient at all yet: torch.optim changes nothing either
            self._drop_open_phases()
            self.last_step = dict(skipped=True, no_gradients=True, grad_norm=None, clip_coef=1.0, update_seconds=0.0,
                                  step_seconds=time.perf_counter() - t0, stats=[], **self._overlap_summary([], []))
            return
        self._refuse_compact_writes("step()")  # before the gradients are scaled: nothing changed

        # the overlapped update: did anything change a declared gradient since its declaration?
        with self._overlap_lock:  # the declarer thread tells no pending gradient after this
            for b in self._buckets:
                if not b.open:
                    continue
                b.pending = []  # declared but not yet told to the runtime: finish_step updates them as usual
                if b.changed is None and b.flat_grad._version != b.seen_version:
                    b.changed = ("the gradients were written in place after they were declared final "
                                 "(clip_grad_norm_, GradScaler.unscale_, ...)")
                for j in b.declared:
                    if b.changed is None and not b.holds(j, b.params[j].grad):
                        b.changed = f"the gradient of parameter {b.indices[j]} was replaced after it was declared final"

        self._gather_gradients()
        grad_norm, clip, skipped = self._norm_and_clip(grad_scale)

        stats = []
        verdicts = [None] * len(self._buckets)
        if skipped:
            self.skipped_steps += 1
            for k, b in enumerate(self._buckets):
                if b.open:  # the speculative updates are dropped
                    stats.append(self._finish(b, _capi.VERDICT_SKIP))
                    verdicts[k] = "skip"
        else:
            self._scale_gradients(clip, grad_scale)
            # the gradients complete before the runtime's streams read them: the current stream of
            # each device, where backward left them and where the scaling above ran (a device-wide
            # synchronisation would also wait for the runtime's own speculative work)
            for dev in {b.device for b in self._buckets if b.device.type == "cuda"}:
                torch.cuda.current_stream(dev).synchronize()
            L = _capi.lib()
            for b in self._buckets:
                h = hypers[b.group_index]
                if h != b.hyper:
                    if b.open:  # speculated with the old hyper-parameters: dropped, the step runs whole
                        self._finish(b, _capi.VERDICT_SKIP)
                        b.changed = "param_groups' hyper-parameters changed after the gradients were declared final"
                    _capi.check(L.dos_optimizer_set_hyper(b.handle, *h[:5], int(h[5])),
                                f"setting the hyper-parameters of {b.describe()}")
                    b.hyper = h
                if b.params_written():  # the update starts from the parameters as they are now
                    if b.open:  # speculated from the old masters: dropped, the step runs whole
                        self._finish(b, _capi.VERDICT_SKIP)
                        b.changed = b.changed or "a parameter was written in place after the gradients were declared final"
                    self._sync_masters(b)
            if not self.flat_gradients:
                for b in self._buckets:
                    self._hand_over_gradients(b)
            # phases left running into the next forward are submitted smallest bucket first: the
            # runtime's workers take tasks in submission order, and forward's first layers need
            # parameters of every bucket (a group of norms and biases, a few elements per layer,
            # would otherwise wait behind every subgroup of the weights); the same bits in any order
            order = sorted(range(len(self._buckets)), key=lambda k: self._buckets[k].num_params) \
                if self._forward_overlap else range(len(self._buckets))
            for k in order:
                b = self._buckets[k]
                if self._forward_overlap:  # the phase runs on into the next forward (overlap_forward)
                    v = _capi.VERDICT_CHANGED if b.open and b.changed is not None else _capi.VERDICT_KEEP
                    if b.open:
                        verdicts[k] = _VERDICT_NAMES[v]
                    self._finish_async(b, v)
                    continue
                if b.open:
                    v = _capi.VERDICT_CHANGED if b.changed is not None else _capi.VERDICT_KEEP
                    stats.append(self._finish(b, v))
                    verdicts[k] = _VERDICT_NAMES[v]
                    continue
                st = _capi.StepStats()
                self._apply_timeline(b)
                ret = L.dos_optimizer_step(b.handle, ctypes.byref(st))
                if ret != 0:
                    self._broken = L.dos_last_error().decode("utf-8", "replace")
                    _capi.check(ret, f"update phase of {b.describe()}")
                stats.append(self._phase_stats(b, st))
            self.steps_taken += 1
        reasons = [b.changed for b in self._buckets if b.changed is not None]
        self._note_redo_streak([] if skipped else reasons)  # a skipped step drops its speculation, redoes nothing
        self.last_step = dict(
            skipped=skipped,
            grad_norm=grad_norm,
            clip_coef=clip,
            update_seconds=sum(s["seconds"] for s in stats),
            step_seconds=time.perf_counter() - t0,
            stats=stats,
            running=any(b.running for b in self._buckets),
            **self._overlap_summary(stats, verdicts, reasons),
        )

    # ------------------------------------------------------------------------------------------
    # lifetime

    def __reduce_ex__(self, protocol):
        """Refuses pickling (and ``copy.copy``, ``copy.deepcopy``, which use it): the state lives in
        the runtime's pinned memory, which a copy would not have. Raises ``TypeError`` saying to
        save :meth:`state_dict` with ``torch.save`` and load it into a new optimizer."""
        raise TypeError("a DeepOptimizerStates optimizer cannot be pickled or copied: its state lives in the "
                        "runtime's pinned host memory; save opt.state_dict() with torch.save and load it into a new "
                        "optimizer with load_state_dict()")

    def __copy__(self):
        """Refuses copying (see :meth:`__reduce_ex__`)."""
        return self.__reduce_ex__(2)

    def __deepcopy__(self, memo):
        """Refuses copying (see :meth:`__reduce_ex__`)."""
        return self.__reduce_ex__(2)

    def close(self):
        """Frees the runtime's state of this optimizer (pinned host memory). Idempotent; the
        optimizer cannot be used afterwards; its gradient hooks (``overlap=True``) are removed and
        an update phase opened during backward is dropped. Runs when the object is garbage-collected
        and at interpreter exit. On an object that only shares this optimizer's attributes (a
        framework's wrapper of a subclass, such as PyTorch Lightning's ``LightningOptimizer``, which
        forwards them) it does nothing: the optimizer that made the state frees it."""
        if getattr(self, "_closed", True) or getattr(self, "_owner_id", None) != id(self):
            return
        self._remove_hooks()
        self._remove_forward_hooks()
        if getattr(self, "_declarer", None) is not None:
            self._declarer.stop()
        try:
            self.wait()  # a phase left running ends before its optimizer goes
        except Exception:
            pass
        self._closed = True
        lib = _capi.lib() if _capi._lib is not None else None
        for b in getattr(self, "_buckets", []):
            if b.handle is not None and lib is not None:
                lib.dos_optimizer_destroy(b.handle)
            b.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def num_subgroups(self):
        """Subgroups over all buckets (int)."""
        return sum(len(b.subgroup_sizes) for b in self._buckets)

    @property
    def num_params(self):
        """Elements the optimizer updates (int)."""
        return sum(b.num_params for b in self._buckets)
