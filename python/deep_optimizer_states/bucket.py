"""One bucket of :class:`~deep_optimizer_states.optimizer.DeepOptimizerStates`: the parameters of
one param group with one dtype and one device, the runtime optimizer that updates them, their flat
gradient buffer and views, and the per-step bookkeeping of the overlapped update and of the
parameters' version counters; how an optimizer's param groups are checked and cut into buckets
(:func:`buckets_of`); and the GPU memory the buckets' update phases may hold.
"""

import ctypes
import weakref

import torch

from . import _capi
from .gradients import _describe

#: The parameter dtypes the runtime updates, by the runtime's name for each.
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

# Which bucket's masters last matched each parameter (noted whenever they are made to match: at
# construction, after a sync, a state load, a declaration), and so whose runtime writes it next, by
# pointer, which torch's version counter does not see: id(parameter) -> (a weak reference to it,
# that bucket's token). A parameter given to two optimizers is written by each in turn; each then
# starts its update from what the other wrote, as two torch.optim optimizers over one parameter do,
# instead of from its own stale master. An entry outlives its bucket's optimizer (closing it must
# not hide its last write from the other); the weak reference tells a reused id apart.
_last_writer = {}


def buckets_of(param_groups, frozen=None):
    """The buckets (``_Bucket``, their runtime optimizers not yet made) of an optimizer's
    ``param_groups`` (a list of group dicts): one per (group, dtype, device), in the order of first
    appearance, each with its parameters, their state_dict indices, shapes, element counts and
    addresses. A parameter that does not require gradients (frozen) goes in no bucket: it keeps its
    index and place in ``param_groups``, as ``torch.optim`` keeps it, and gets no state; when
    ``frozen`` is a list, ``(index, parameter)`` of each is appended to it; none of the checks below
    but the first applies to it (it is never read or written). Raises ``ValueError``
    naming the parameter (its state_dict index, shape, dtype and device) for one given twice, of a
    dtype not in :data:`DTYPES`, sparse, on a device other than the host or CUDA device 0, or not
    contiguous; for two whose memory overlaps; when every parameter has 0 elements; and when every
    parameter is frozen."""
    buckets = {}
    frozen_here = []
    seen = {}
    index = 0
    spans = []  # (device, start, end, index) to find overlapping storage
    for gi, group in enumerate(param_groups):
        for p in group["params"]:
            what = _describe(index, p)
            if id(p) in seen:
                raise ValueError(f"{what} appears more than once (also as parameter {seen[id(p)]}): each parameter "
                                 "may be given once")
            seen[id(p)] = index
            if not p.requires_grad:  # frozen: no state and never written, so any dtype, layout or device
                frozen_here.append((index, p))
                index += 1
                continue
            if p.dtype not in DTYPES:
                raise ValueError(f"{what}: dtype {p.dtype} is not supported (torch.float32, torch.float16 or "
                                 "torch.bfloat16)")
            if p.layout != torch.strided:
                raise ValueError(f"{what} is sparse ({p.layout}): only dense parameters are supported")
            if p.device.type not in ("cpu", "cuda") or (p.device.type == "cuda" and p.device.index != 0):
                raise ValueError(f"{what}: only host memory and CUDA device 0 are supported (set "
                                 "CUDA_VISIBLE_DEVICES so that the GPU to use is device 0)")
            if not p.is_contiguous():
                raise ValueError(f"{what} is not contiguous: the runtime reads parameters as flat arrays; "
                                 "make the model's parameters contiguous before creating the optimizer "
                                 "(model.to(memory_format=torch.contiguous_format) for channels_last)")
            if p.numel() > 0:
                spans.append((p.device, p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), index))
            key = (gi, p.dtype, p.device)
            b = buckets.get(key)
            if b is None:
                b = buckets[key] = _Bucket(gi, p.dtype, p.device)
            b.params.append(p)
            b.indices.append(index)
            b.shapes.append(tuple(p.shape))
            b.numels.append(p.numel())
            b.ptrs.append(p.data_ptr())
            index += 1
    spans.sort(key=lambda s: (str(s[0]), s[1]))
    for a, b in zip(spans, spans[1:]):
        if a[0] == b[0] and b[1] < a[2]:
            raise ValueError(f"parameters {a[3]} and {b[3]} share memory: each element may be updated once")
    if index and not buckets:
        raise ValueError("every parameter given is frozen (requires_grad=False): nothing to optimize; give the "
                         "optimizer the parameters to train")
    if index and all(n == 0 for bk in buckets.values() for n in bk.numels):
        raise ValueError("every parameter given has 0 elements: nothing to optimize")
    if frozen is not None:
        frozen.extend(frozen_here)
    return list(buckets.values())


def gpu_memory_for_buckets(buckets, subgroup_size, update_budget, resident_budget, speculative):
    """Bytes of GPU memory the runtime's StarPU may need for ``buckets``' (``_Bucket``) update
    phases at once and their resident state: the runtime's ``dos_gpu_memory_for_budgets`` per
    bucket (the larger of ``update_budget`` and one subgroup of ``subgroup_size`` elements streamed,
    at most the bucket streamed, more when ``speculative``, an overlapped update that speculates
    streamed subgroups; plus ``resident_budget``, None: not given), summed, plus
    ``dos_starpu_device_margin()`` (64 MiB). Each bucket's parameters and gradients have its
    parameters' element size. ``update_budget``: bytes, >= 1. Raises ``ValueError`` when the
    runtime refuses the figures (bad input, ``DOS_E_INVALID``), :class:`DosError` when it fails
    otherwise, ``OSError`` when ``libdos_c.so`` cannot be loaded."""
    L = _capi.lib()
    total = L.dos_starpu_device_margin()
    for b in buckets:
        out = ctypes.c_size_t()
        size = b.params[0].element_size()  # the bucket's dtype: parameters and gradients alike
        _capi.check(L.dos_gpu_memory_for_budgets(
            b.num_params, subgroup_size, size, size, update_budget, -1 if resident_budget is None else resident_budget,
            int(speculative), ctypes.byref(out)), f"sizing the GPU memory of {b.describe()}")
        total += out.value
    return total


class _Bucket:
    """The parameters of one param group with one dtype and one device: one runtime optimizer."""

    def __init__(self, group_index, dtype, device):
        self.group_index = group_index
        self.dtype = dtype
        self.device = device
        self.params = []    # the torch Parameters, in group order
        self.indices = []   # their indices in state_dict numbering
        self.shapes = []
        self.numels = []
        self.ptrs = []      # data_ptr() of each parameter at creation
        self.param_versions = []  # each parameter's _version when the runtime's masters last matched it
        self.token = object()  # this bucket, in _last_writer
        self.flat_grad = None  # None with flat_gradients=False
        self.views = []     # views of flat_grad shaped like each parameter
        self.grad_ptrs = None  # flat_gradients=False: the gradient pointers the runtime reads now
        self.handle = None  # ctypes.c_void_p of the C optimizer
        # the runtime keeps this bucket's masters in compact form (DeepOptimizerStates(compact_master=True),
        # bf16 buckets only): each rebuilt from its parameter, which then holds the master's high half
        self.compact = False
        self.hyper = None   # the hyper-parameters the runtime holds now
        self.subgroup_sizes = []
        self.offsets = []   # flat index of each parameter's first element
        # the overlapped update (DeepOptimizerStates(overlap=True)), reset by every step()
        self.open = False       # a runtime phase is open (dos_optimizer_begin_step)
        self.declared = set()   # positions of the parameters whose gradient was declared final
        self.pending = []       # (position, CUDA event) declared once the event has completed
        self.fired = []         # per position: gradient accumulations seen in this step
        self.changed = None     # why the speculative updates must be redone (str), or None
        self.seen_version = None  # flat_grad._version after the last accumulation the hooks saw
        # the next forward overlapped (DeepOptimizerStates.overlap_forward)
        self.running = False    # step() left the runtime's phase running (dos_optimizer_finish_step_async)
        self.timeline_on = False  # the runtime optimizer records its phases' tasks (dos_optimizer_set_timeline)
        self.grads_cleared = False  # that step set every p.grad to None (restored as zeros at the next step)

    @property
    def num_params(self):
        return sum(self.numels)

    def holds(self, j, g):
        """Whether gradient ``g`` of parameter ``j`` is the flat buffer's view itself (same memory,
        same strides), where the runtime reads it."""
        v = self.views[j]
        return g.data_ptr() == v.data_ptr() and g.stride() == v.stride()

    def move_into_view(self, j, p):
        """Copies the gradient of ``p`` (parameter ``j``) into the flat buffer's view and points
        ``p.grad`` at the view, unless it is there already."""
        if not self.holds(j, p.grad):
            self.views[j].copy_(p.grad)
            p.grad = self.views[j]

    def note_param_versions(self, claim=True):
        """Notes each parameter's version counter (``Tensor._version``, which every in-place write
        bumps; the runtime's own writes by pointer do not), and this bucket as the parameters' last
        writer: the runtime's masters match the parameters now, and its next phase writes them.
        ``claim=False`` (a bucket being built, which writes nothing): the last writer is noted only
        for a parameter that has none alive, so that building a second optimizer over parameters
        another one updates does not count as a write of them for that one (its compact master would
        refuse to go on)."""
        self.param_versions = [p._version for p in self.params]
        for p in self.params:
            rec = _last_writer.get(id(p))
            if claim or rec is None or rec[0]() is not p:
                _last_writer[id(p)] = (weakref.ref(p), self.token)

    def param_written(self, j):
        """Whether parameter ``j`` (position in this bucket) was written since
        :meth:`note_param_versions` in a way torch counts (``model.load_state_dict``, ``p.copy_``
        under ``torch.no_grad()``, ...), or by another optimizer's runtime (the same parameter
        given to two optimizers)."""
        p = self.params[j]
        if p._version != self.param_versions[j]:
            return True
        rec = _last_writer.get(id(p))
        return rec is not None and rec[1] is not self.token and rec[0]() is p

    def params_written(self):
        """Whether any parameter was written since :meth:`note_param_versions` (:meth:`param_written`)."""
        return any(self.param_written(j) for j in range(len(self.params)))

    def describe(self):
        return f"group {self.group_index}, {self.dtype} on {self.device.type}"

    def reset_overlap(self):
        """Forgets the overlapped update's bookkeeping of the step (the runtime's phase is closed)."""
        self.open = False
        self.declared = set()
        self.pending = []
        self.fired = [0] * len(self.params)
        self.changed = None
        self.seen_version = None
