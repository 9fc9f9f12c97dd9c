#!/usr/bin/env python3
"""Baselines for the optimizer update phase, in plain PyTorch: what a user would run instead of
Deep Optimizer States, timed on the same workload as ``dos-train``.

One update phase takes N parameters, cut into subgroups of S elements (the last one holds the
remainder), from 16-bit gradients to 16-bit parameters, with the fp32 optimizer state (master
parameters, ``exp_avg``, ``exp_avg_sq``) in page-locked host memory. The model's parameters and
gradients live on the GPU (``device="cuda"``) or, on a machine without one, on the host
(``device="cpu"``). Variants:

``zero_offload``
    ZeRO-Offload's recipe: per subgroup the gradient is converted to fp32 on the GPU and copied to
    a pinned host slot (device to host), the CPU runs ``torch.optim.AdamW`` (fused when this torch
    has the fused CPU kernel, else ``foreach``) on the host state, the new master is rounded to the
    16-bit type on the CPU into a pinned slot and copied back to the GPU (host to device). Copies
    run on their own CUDA streams, a few subgroups ahead of (gradients) and behind (parameters) the
    CPU. With ``device="cpu"`` the gradients are already on the host: convert, Adam, round.
``twinflow:R``
    DeepSpeed ZeRO-Offload++ ("TwinFlow"), ``R`` its ``ratio``: the CPU share of the subgroups.
    The first ``round(R x subgroups)`` subgroups are updated as ``zero_offload``; the others keep
    their fp32 state on the GPU for good and are updated there (``torch.optim.AdamW`` on CUDA),
    issued first so that the GPU works while the CPU does. Same subgroups as dos-train's
    ``static:R`` policy.
``stride:K``
    The paper's static interleaving: subgroup i with (i + 1) % K == 0 is streamed through the GPU
    (its fp32 state copied host to device on one stream, AdamW on CUDA on another, the state copied
    back device to host on a third; a few subgroups of GPU slots, so prefetch, update and write-back
    of consecutive streamed subgroups overlap), the others as ``zero_offload``, concurrently. Same
    subgroups as dos-train's ``--sweep stride:K``.

For training frameworks, ``zero_offload.ZeroOffloadAdamW`` (beside this module) is ZeRO-Offload's
recipe as a ``torch.optim.Optimizer``.

The Adam arithmetic is PyTorch's own (``torch.optim.AdamW``, or ``torch.optim.Adam`` for
``optimizer="adam"``: L2 weight decay added to the gradient), with each subgroup's optimizer
counting its own steps, as the runtime does. Hyper-parameter defaults are dos-train's.

Command line (the module imports nothing but torch and the standard library, so it runs as a file
too: ``python3 python/deep_optimizer_states/baselines.py ...``)::

    python3 -m deep_optimizer_states.baselines --n 3.83e9 --s 1.24e8 --dtype bf16 \\
        --variants zero_offload,twinflow:0.5,stride:2 --iterations 5 --repeats 3 --json out.json

Each variant runs ``repeats`` times ``iterations`` update phases; a repeat's time is the median of
its phases after the first (the first pays allocations, as in dos-train), and the variant's time
is the median of its repeats, with their minimum and maximum. Without CUDA the GPU variants are
skipped with a message saying so. Exit status: 0; 1 when a variant failed or its 16-bit
parameters differ from its rounded fp32 master parameters; 2 for bad arguments.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch

try:  # a module of the package, or a script run from its folder
    from .number_text import baseline_variant, decimal_arg, parse_count, parse_decimal, whole_arg  # noqa: F401
except ImportError:
    from number_text import baseline_variant, decimal_arg, parse_count, parse_decimal, whole_arg  # noqa: F401

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_VARIANTS = "zero_offload,stride:2,stride:3,stride:4"


class Hyper:
    """Adam hyper-parameters (dos-train's defaults). ``optimizer``: ``"adamw"`` (decoupled weight
    decay, ``torch.optim.AdamW``) or ``"adam"`` (L2, ``torch.optim.Adam``). Raises ``ValueError``
    for values torch.optim would refuse (lr < 0, betas outside [0, 1), eps or weight decay < 0)."""

    def __init__(self, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, optimizer="adamw"):
        if optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer must be 'adam' or 'adamw', got {optimizer!r}")
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        for name, b in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= b < 1:
                raise ValueError(f"{name} must be in [0, 1), got {b}")
        if not eps >= 0 or not weight_decay >= 0:
            raise ValueError(f"eps and weight_decay must be >= 0, got {eps} and {weight_decay}")
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.weight_decay, self.optimizer = weight_decay, optimizer

    def as_dict(self):
        """The hyper-parameters as a plain dict (for reports)."""
        return dict(optimizer=self.optimizer, lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                    weight_decay=self.weight_decay)


def subgroup_bounds(n, subgroup_size):
    """[(begin, end), ...] of the subgroups of ``n`` elements cut every ``subgroup_size`` (the last
    holds the remainder). Raises ``ValueError`` when either is < 1."""
    if n < 1 or subgroup_size < 1:
        raise ValueError(f"N and the subgroup size must be >= 1, got {n} and {subgroup_size}")
    return [(b, min(n, b + subgroup_size)) for b in range(0, n, subgroup_size)]


def placement(variant, subgroups):
    """Where each of ``subgroups`` subgroups is updated under ``variant``: a list of ``"cpu"``,
    ``"resident"`` (state kept on the GPU) and ``"streamed"`` (state copied through the GPU).
    Raises ``ValueError`` for an unknown or malformed variant (``number_text.baseline_variant``)."""
    kind, x = baseline_variant(variant)
    if kind == "zero_offload":
        return ["cpu"] * subgroups
    if kind == "twinflow":
        n_cpu = min(subgroups, int(math.floor(x * subgroups + 0.5)))  # rounds halves up, as llround
        return ["cpu"] * n_cpu + ["resident"] * (subgroups - n_cpu)
    return ["streamed" if (i + 1) % x == 0 else "cpu" for i in range(subgroups)]


def needs_gpu(variant):
    """True when ``variant`` updates some subgroup on the GPU (whatever the sizes). Raises
    ``ValueError`` for an unknown variant."""
    return any(p != "cpu" for p in placement(variant, 1000))


# --------------------------------------------------------------------------------------- AdamW
_IMPL = {}


def _optimizer_class(hyper):
    return torch.optim.AdamW if hyper.optimizer == "adamw" else torch.optim.Adam


def adam_impl(device):
    """The fastest of torch.optim's implementations that works on ``device`` (``"cpu"`` or
    ``"cuda"``) with this torch: ``"fused"`` (CUDA since torch 2.0, CPU since 2.4), else
    ``"foreach"``. Found by one tiny trial step, once per device type."""
    if device not in _IMPL:
        _IMPL[device] = "foreach"
        try:
            p = torch.nn.Parameter(torch.zeros(8, device=device))
            p.grad = torch.ones(8, device=device)
            torch.optim.AdamW([p], lr=1e-3, fused=True).step()
            _IMPL[device] = "fused"
        except (RuntimeError, TypeError, ValueError):
            pass
    return _IMPL[device]


def bound_optimizer(master, grad, exp_avg, exp_avg_sq, hyper, impl):
    """A ``torch.optim.AdamW`` (or ``Adam``) over one flat fp32 tensor whose state lives in given
    buffers: ``master`` (1-D fp32, updated in place: a view of a larger buffer is fine), ``grad``
    (its gradient, same shape, read at each ``step()``), ``exp_avg`` and ``exp_avg_sq`` (same shape,
    used as the optimizer's state, so the update lands in them). All four on one device. ``impl``:
    ``"fused"`` or ``"foreach"`` (:func:`adam_impl`). The step count starts at 0."""
    p = torch.nn.Parameter(master, requires_grad=True)
    p.grad = grad
    opt = _optimizer_class(hyper)([p], lr=hyper.lr, betas=(hyper.beta1, hyper.beta2), eps=hyper.eps,
                                  weight_decay=hyper.weight_decay, **{impl: True})
    # the step count where torch.optim keeps it: on the device for the fused kernels, else on the CPU
    step = torch.zeros((), dtype=torch.float32, device=master.device if impl == "fused" else "cpu")
    opt.state[p] = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    return opt


# --------------------------------------------------------------------------------- host memory
class PinnedPool:
    """Page-locked host tensors of exactly the requested size. torch's pinned allocator rounds
    every block up to a power of two (up to 2x the memory for large buffers), so a plain allocation
    is page-locked with ``cudaHostRegister``; if that fails, ``pin_memory=True`` is used. Without
    CUDA the tensors are ordinary (pageable) memory. :meth:`release` unlocks them."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.registered = []
        self.how = "pageable (no CUDA)" if not cuda else "cudaHostRegister"

    def empty(self, n, dtype):
        """A 1-D host tensor of ``n`` elements of ``dtype``, page-locked when CUDA is in use."""
        t = torch.empty(n, dtype=dtype)
        if not self.cuda:
            return t
        try:
            rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
            rc = int(getattr(rc, "value", rc))
            if rc != 0:
                raise RuntimeError(f"cudaHostRegister error {rc}")
            self.registered.append(t)
            return t
        except (RuntimeError, AttributeError, TypeError) as e:
            self.how = f"pin_memory=True (cudaHostRegister failed: {e})"
            return torch.empty(n, dtype=dtype, pin_memory=True)

    def release(self):
        """Unlocks what :meth:`empty` registered (call once the tensors are no longer in use)."""
        for t in self.registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        self.registered = []


def host_memory_available():
    """Bytes of host memory available now (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------------------- workspace
class Workspace:
    """The buffers every variant shares, for ``n`` parameters in subgroups of ``subgroup_size``:

    - on ``device`` (``"cuda"``, or ``"cpu"`` without a GPU): ``params`` and ``grads``, ``n``
      elements of ``dtype`` (``"bf16"``, ``"fp16"`` or ``"fp32"``), the model's;
    - on the host, page-locked with CUDA: ``master``, ``exp_avg``, ``exp_avg_sq`` (fp32, ``n``),
      ``slots`` fp32 gradient slots and ``slots`` ``dtype`` parameter slots of one subgroup each
      (the staging of ``zero_offload``'s copies).

    Raises ``ValueError`` for bad sizes, dtype or device (``"cuda"`` without CUDA) and
    ``MemoryError`` when the host buffers would not fit in the memory available."""

    def __init__(self, n, subgroup_size, dtype="bf16", device="cpu", slots=3):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' asked for, but this torch sees no CUDA device")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.n, self.dtype_name, self.dtype, self.device = n, dtype, DTYPES[dtype], device
        self.bounds = subgroup_bounds(n, subgroup_size)
        self.subgroup_size = min(subgroup_size, n)
        esize = torch.tensor([], dtype=self.dtype).element_size()
        host_bytes = 12 * n + slots * (4 + esize) * self.subgroup_size + (0 if device == "cuda" else 2 * esize * n)
        avail = host_memory_available()
        if avail is not None and host_bytes > 0.9 * avail:
            raise MemoryError(f"{n} parameters need {host_bytes / 1e9:.2f} GB of host memory for the optimizer "
                              f"state and staging; {avail / 1e9:.2f} GB are available")
        self.pool = PinnedPool(device == "cuda")
        self.master = self.pool.empty(n, torch.float32)
        self.exp_avg = self.pool.empty(n, torch.float32)
        self.exp_avg_sq = self.pool.empty(n, torch.float32)
        self.grad_slots = [self.pool.empty(self.subgroup_size, torch.float32) for _ in range(slots)]
        self.param_slots = [self.pool.empty(self.subgroup_size, self.dtype) for _ in range(slots)]
        self.params = torch.empty(n, dtype=self.dtype, device=device)
        self.grads = torch.empty(n, dtype=self.dtype, device=device)
        self.host_bytes = host_bytes

    def reset(self, master=None, seed=0):
        """A fresh optimizer: ``master`` (a 1-D tensor of ``n`` values, any float dtype, any device)
        or, when None, values drawn from N(0, 0.02) with ``seed``; ``params`` = the master rounded
        to the model's dtype; ``exp_avg`` = ``exp_avg_sq`` = 0. Raises ``ValueError`` when
        ``master`` has the wrong number of elements."""
        if master is not None:
            if master.numel() != self.n:
                raise ValueError(f"master has {master.numel()} elements, the workspace {self.n}")
            self.master.copy_(master.reshape(-1))
        else:
            self._fill(self.master, 0.02, seed)
        self.params.copy_(self.master)
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        self.sync()

    def set_grads(self, grads=None, seed=1):
        """The model's gradients for the next phase: ``grads`` (``n`` values, rounded to the model's
        dtype) or, when None, N(0, 1e-3) draws with ``seed``. Raises ``ValueError`` when ``grads``
        has the wrong number of elements."""
        if grads is not None:
            if grads.numel() != self.n:
                raise ValueError(f"grads has {grads.numel()} elements, the workspace {self.n}")
            self.grads.copy_(grads.reshape(-1))
        else:
            self._fill(self.grads, 1e-3, seed)
        self.sync()

    def _fill(self, out, std, seed):
        # subgroup by subgroup, drawn where the model lives (fast on a GPU), so that no second
        # N-element buffer is needed
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        tmp = torch.empty(self.subgroup_size, dtype=torch.float32, device=self.device)
        for a, b in self.bounds:
            t = tmp[: b - a]
            t.normal_(0.0, std, generator=gen)
            out[a:b].copy_(t)

    def sync(self):
        """Waits for every queued GPU operation (nothing to do without CUDA)."""
        if self.device == "cuda":
            torch.cuda.synchronize()

    def state(self):
        """The state as CPU tensors: dict of ``master``, ``exp_avg``, ``exp_avg_sq`` (fp32, ``n``)
        and ``params`` (``n`` of the model's dtype). Copies."""
        self.sync()
        return dict(master=self.master.clone(), exp_avg=self.exp_avg.clone(), exp_avg_sq=self.exp_avg_sq.clone(),
                    params=self.params.cpu().clone())

    def close(self):
        """Frees the buffers (unlocking the host ones)."""
        self.sync()
        self.params = self.grads = None
        self.master = self.exp_avg = self.exp_avg_sq = None
        self.grad_slots = self.param_slots = []
        self.pool.release()


# -------------------------------------------------------------------------------- update phase
class UpdatePhase:
    """One variant's update phase over a :class:`Workspace`. Construction places the subgroups
    (:func:`placement`), builds one optimizer per subgroup bound to its buffers, and for
    ``twinflow:R`` copies the resident subgroups' state to the GPU (their master, ``exp_avg`` and
    ``exp_avg_sq`` then live there; :meth:`state` gathers them). ``stream_slots``: GPU slots for
    streamed subgroups (prefetch depth). Raises ``ValueError`` for an unknown variant or a GPU
    variant on a CPU workspace."""

    def __init__(self, ws, variant, hyper, stream_slots=2):
        self.ws, self.variant, self.hyper = ws, variant, hyper
        self.where = placement(variant, len(ws.bounds))
        cuda = ws.device == "cuda"
        if not cuda and any(w != "cpu" for w in self.where):
            raise ValueError(f"variant {variant!r} updates subgroups on the GPU: it needs CUDA")
        size = lambda i: ws.bounds[i][1] - ws.bounds[i][0]  # noqa: E731
        self.cpu_ids = [i for i, w in enumerate(self.where) if w == "cpu"]
        self.res_ids = [i for i, w in enumerate(self.where) if w == "resident"]
        self.str_ids = [i for i, w in enumerate(self.where) if w == "streamed"]
        self.impl_cpu = adam_impl("cpu")
        self.impl_gpu = adam_impl("cuda") if cuda and (self.res_ids or self.str_ids) else None
        S, dev = ws.subgroup_size, ws.device
        # CPU subgroups: gradient slot k % slots, fixed, so each optimizer is bound once
        nslot = len(ws.grad_slots)
        self.cpu_opt = {}
        for k, i in enumerate(self.cpu_ids):
            a, b = ws.bounds[i]
            self.cpu_opt[i] = bound_optimizer(ws.master[a:b], ws.grad_slots[k % nslot][: b - a], ws.exp_avg[a:b],
                                              ws.exp_avg_sq[a:b], hyper, self.impl_cpu)
        # GPU-side buffers: fp32 gradients for the CPU subgroups' transfers (one per slot), for the
        # resident ones (one, they run in order on one stream), and per streamed slot its state
        self.dev_grad = [torch.empty(S, device=dev) for _ in range(nslot)] if cuda and self.cpu_ids else []
        self.res_grad = torch.empty(S, device=dev) if self.res_ids else None
        self.res_state, self.res_opt = {}, {}
        for i in self.res_ids:
            a, b = ws.bounds[i]
            st = [ws.master[a:b].to(dev), ws.exp_avg[a:b].to(dev), ws.exp_avg_sq[a:b].to(dev)]
            self.res_state[i] = st
            self.res_opt[i] = bound_optimizer(st[0], self.res_grad[: b - a], st[1], st[2], hyper, self.impl_gpu)
        self.nstream = max(1, stream_slots)
        self.str_slots = [[torch.empty(S, device=dev) for _ in range(4)] for _ in range(self.nstream)] \
            if self.str_ids else []
        self.str_opt = {}
        for q, i in enumerate(self.str_ids):
            n = size(i)
            p, m, v, g = (t[:n] for t in self.str_slots[q % self.nstream])
            self.str_opt[i] = bound_optimizer(p, g, m, v, hyper, self.impl_gpu)
        if cuda:
            self.s_d2h, self.s_h2d, self.s_in, self.s_gpu, self.s_out = (torch.cuda.Stream() for _ in range(5))
        ws.sync()
        esize = ws.params.element_size()
        n_cpu = sum(size(i) for i in self.cpu_ids)
        n_str = sum(size(i) for i in self.str_ids)
        # bytes over PCIe per phase: fp32 gradient down and 16-bit parameters up per CPU subgroup,
        # the fp32 state up and down per streamed one
        self.bytes_d2h = (4 * n_cpu + 12 * n_str) if cuda else 0
        self.bytes_h2d = (esize * n_cpu + 12 * n_str) if cuda else 0
        self.params_cpu, self.params_streamed = n_cpu, n_str
        self.params_resident = sum(size(i) for i in self.res_ids)

    def run(self):
        """One update phase, from the gradients in the workspace to the new parameters in it;
        returns its wall-clock seconds (every GPU operation finished)."""
        self.ws.sync()
        t0 = time.perf_counter()
        if self.ws.device == "cuda":
            self._run_cuda()
        else:
            self._run_cpu()
        self.ws.sync()
        return time.perf_counter() - t0

    def _run_cpu(self):
        ws = self.ws
        slot = ws.grad_slots
        for k, i in enumerate(self.cpu_ids):
            a, b = ws.bounds[i]
            slot[k % len(slot)][: b - a].copy_(ws.grads[a:b])
            self.cpu_opt[i].step()
            ws.params[a:b].copy_(ws.master[a:b])

    def _run_cuda(self):
        ws, cs = self.ws, torch.cuda
        ready = cs.Event()
        ready.record()  # the gradients, written on the current stream, are complete
        for s in (self.s_d2h, self.s_h2d, self.s_in, self.s_gpu, self.s_out):
            s.wait_event(ready)
        # resident subgroups first: queued at once, the GPU runs them while the CPU works
        with cs.stream(self.s_gpu):
            for i in self.res_ids:
                a, b = ws.bounds[i]
                self.res_grad[: b - a].copy_(ws.grads[a:b])
                self.res_opt[i].step()
                ws.params[a:b].copy_(self.res_state[i][0])
        # streamed subgroups: state in (s_in) -> Adam (s_gpu) -> state out (s_out); a slot is
        # refilled once the write-back of its previous subgroup is done
        done_out = [None] * len(self.str_ids)
        arrived = [None] * len(self.str_ids)

        def prefetch(q):
            i = self.str_ids[q]
            a, b = ws.bounds[i]
            p, m, v, _ = (t[: b - a] for t in self.str_slots[q % self.nstream])
            with cs.stream(self.s_in):
                if q >= self.nstream:
                    self.s_in.wait_event(done_out[q - self.nstream])
                p.copy_(ws.master[a:b], non_blocking=True)
                m.copy_(ws.exp_avg[a:b], non_blocking=True)
                v.copy_(ws.exp_avg_sq[a:b], non_blocking=True)
                arrived[q] = cs.Event()
                arrived[q].record()

        def update_streamed(q):
            i = self.str_ids[q]
            a, b = ws.bounds[i]
            p, m, v, g = (t[: b - a] for t in self.str_slots[q % self.nstream])
            with cs.stream(self.s_gpu):
                self.s_gpu.wait_event(arrived[q])
                g.copy_(ws.grads[a:b])
                self.str_opt[i].step()
                ws.params[a:b].copy_(p)
                updated = cs.Event()
                updated.record()
            with cs.stream(self.s_out):
                self.s_out.wait_event(updated)
                ws.master[a:b].copy_(p, non_blocking=True)
                ws.exp_avg[a:b].copy_(m, non_blocking=True)
                ws.exp_avg_sq[a:b].copy_(v, non_blocking=True)
                done_out[q] = cs.Event()
                done_out[q].record()
            if q + self.nstream < len(self.str_ids):
                prefetch(q + self.nstream)

        # CPU subgroups: gradient down (s_d2h) a few subgroups ahead, Adam on the CPU, parameters
        # rounded into a pinned slot and up (s_h2d)
        nslot = len(ws.grad_slots)
        grad_here = [None] * len(self.cpu_ids)
        sent = [None] * len(self.cpu_ids)

        def fetch_grad(k):
            a, b = ws.bounds[self.cpu_ids[k]]
            with cs.stream(self.s_d2h):
                d = self.dev_grad[k % nslot][: b - a]
                d.copy_(ws.grads[a:b])
                ws.grad_slots[k % nslot][: b - a].copy_(d, non_blocking=True)
                grad_here[k] = cs.Event()
                grad_here[k].record()

        for q in range(min(self.nstream, len(self.str_ids))):
            prefetch(q)
        for k in range(min(nslot, len(self.cpu_ids))):
            fetch_grad(k)
        k = q = 0
        for w in self.where:
            if w == "streamed":
                update_streamed(q)
                q += 1
            elif w == "cpu":
                i = self.cpu_ids[k]
                a, b = ws.bounds[i]
                grad_here[k].synchronize()
                self.cpu_opt[i].step()
                if k + nslot < len(self.cpu_ids):
                    fetch_grad(k + nslot)  # this gradient slot is free again
                if k >= nslot:
                    sent[k - nslot].synchronize()  # the parameter slot's previous upload is done
                up = ws.param_slots[k % nslot][: b - a]
                up.copy_(ws.master[a:b])
                with cs.stream(self.s_h2d):
                    ws.params[a:b].copy_(up, non_blocking=True)
                    sent[k] = cs.Event()
                    sent[k].record()
                k += 1

    def state(self):
        """The whole state as CPU tensors (see :meth:`Workspace.state`), the resident subgroups'
        taken from the GPU."""
        st = self.ws.state()
        for i, (p, m, v) in self.res_state.items():
            a, b = self.ws.bounds[i]
            st["master"][a:b] = p.cpu()
            st["exp_avg"][a:b] = m.cpu()
            st["exp_avg_sq"][a:b] = v.cpu()
        return st

    def params_match_master(self):
        """Elements whose 16-bit parameter differs from its fp32 master rounded to the model's
        dtype (0 expected), counted subgroup by subgroup on the model's device."""
        ws, bad = self.ws, 0
        for i, (a, b) in enumerate(ws.bounds):
            master = self.res_state[i][0] if i in self.res_state else ws.master[a:b].to(ws.device)
            bad += int((master.to(ws.dtype) != ws.params[a:b]).sum())
        return bad

    def close(self):
        """Frees this variant's GPU buffers (the workspace stays)."""
        self.ws.sync()
        self.cpu_opt = self.res_opt = self.str_opt = self.res_state = {}
        self.str_slots = self.dev_grad = []
        self.res_grad = None
        if self.ws.device == "cuda":
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ benchmark
def gpu_memory_needed(ws, variant):
    """Bytes of GPU memory ``variant`` adds to the workspace's (resident state, streaming slots,
    gradient staging), for the check before it runs."""
    where = placement(variant, len(ws.bounds))
    sizes = [b - a for a, b in ws.bounds]
    need = 12 * sum(s for s, w in zip(sizes, where) if w == "resident")
    need += 4 * ws.subgroup_size * (len(ws.grad_slots) + 1 + (8 if "streamed" in where else 0))
    return need + (256 << 20)  # torch's own workspace


def benchmark(n, subgroup_size, variants, dtype="bf16", iterations=5, repeats=1, hyper=None, device="auto",
              threads=None, slots=3, stream_slots=2, log=print):
    """Times each variant's update phase on one workload.

    ``n`` parameters in subgroups of ``subgroup_size`` (ints >= 1), ``dtype`` ``"bf16"``/``"fp16"``/
    ``"fp32"`` (the model's parameters and gradients), ``variants``: list of names (see the module),
    ``iterations`` phases per repeat (the first not counted when there are more than one, as in
    dos-train), ``repeats`` >= 1, ``hyper`` a :class:`Hyper` (default: dos-train's), ``device``
    ``"auto"`` (CUDA when torch sees a GPU), ``"cuda"`` or ``"cpu"``, ``threads`` torch's CPU
    threads (None: as set), ``log`` a print-like function for progress.

    Returns a list with one dict per variant: ``variant``; either ``skipped`` (why) or ``failed``
    (the error), or ``seconds_median``, ``seconds_min``, ``seconds_max`` (over the repeats, each
    repeat's median phase seconds), ``repeat_seconds``, ``phase_seconds`` (every phase, seconds),
    ``gparams_per_s`` (at the median), ``subgroups`` (counts per placement), ``params`` (per
    placement), ``bytes_h2d``/``bytes_d2h`` (per phase), ``adam_cpu``/``adam_gpu`` (torch.optim
    implementation), ``params_mismatch`` (16-bit parameters != rounded master after the run, 0
    expected), ``peak_gpu_bytes``. Raises ``ValueError`` for bad arguments (before running
    anything) and ``MemoryError`` when the host state does not fit."""
    hyper = hyper or Hyper()
    if iterations < 1 or repeats < 1:
        raise ValueError(f"iterations and repeats must be >= 1, got {iterations} and {repeats}")
    for v in variants:
        placement(v, 1)  # refuses unknown variants before anything runs
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if threads:
        torch.set_num_threads(threads)
    ws = Workspace(n, subgroup_size, dtype, device, slots)
    log(f"baselines: {n} parameters, {len(ws.bounds)} subgroups of {ws.subgroup_size}, {dtype}, {device}, "
        f"{hyper.optimizer}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads, host state "
        f"{ws.pool.how}")
    ws.set_grads(seed=1)
    results = []
    try:
        for v in variants:
            if device != "cuda" and needs_gpu(v):
                why = ("the model's buffers are on the host (device cpu): GPU variants need them on a CUDA device"
                       if torch.cuda.is_available() else
                       "no CUDA device: GPU variants need one (only zero_offload runs here, on the CPU)")
                log(f"baselines: {v}: skipped: {why}")
                results.append(dict(variant=v, skipped=why))
                continue
            if device == "cuda":
                free = torch.cuda.mem_get_info()[0]
                need = gpu_memory_needed(ws, v)
                if need > free:
                    why = f"needs about {need / 1e9:.1f} GB more GPU memory, {free / 1e9:.1f} GB free"
                    log(f"baselines: {v}: skipped: {why}")
                    results.append(dict(variant=v, skipped=why))
                    continue
                torch.cuda.reset_peak_memory_stats()
            try:
                results.append(_time_variant(ws, v, hyper, iterations, repeats, stream_slots, log))
            except (RuntimeError, MemoryError) as e:
                log(f"baselines: {v}: FAILED: {e}")
                results.append(dict(variant=v, failed=str(e)))
    finally:
        ws.close()
    return results


def _time_variant(ws, variant, hyper, iterations, repeats, stream_slots, log):
    ws.reset(seed=0)
    ph = UpdatePhase(ws, variant, hyper, stream_slots)
    try:
        phases, per_repeat = [], []
        for _ in range(repeats):
            t = [ph.run() for _ in range(iterations)]
            phases.append(t)
            per_repeat.append(statistics.median(t[1:] if len(t) > 1 else t))
        med = statistics.median(per_repeat)
        r = dict(variant=variant, seconds_median=med, seconds_min=min(per_repeat), seconds_max=max(per_repeat),
                 repeat_seconds=per_repeat, phase_seconds=phases, gparams_per_s=ws.n / med / 1e9,
                 subgroups={w: ph.where.count(w) for w in ("cpu", "resident", "streamed")},
                 params=dict(cpu=ph.params_cpu, resident=ph.params_resident, streamed=ph.params_streamed),
                 bytes_h2d=ph.bytes_h2d, bytes_d2h=ph.bytes_d2h, adam_cpu=ph.impl_cpu, adam_gpu=ph.impl_gpu,
                 peak_gpu_bytes=torch.cuda.max_memory_allocated() if ws.device == "cuda" else 0)
        r["params_mismatch"] = ph.params_match_master()
    finally:
        ph.close()
    log(f"baselines: {variant}: {med:.4f} s per phase (median of {repeats} repeat(s), {min(per_repeat):.4f}.."
        f"{max(per_repeat):.4f}), {r['gparams_per_s']:.3f} Gparams/s, subgroups cpu {r['subgroups']['cpu']} "
        f"resident {r['subgroups']['resident']} streamed {r['subgroups']['streamed']}, Adam cpu {ph.impl_cpu}"
        f"{', gpu ' + ph.impl_gpu if ph.impl_gpu else ''}, 16-bit params != rounded master: {r['params_mismatch']}")
    return r


# ---------------------------------------------------------------------------------- command line
def main(argv=None):
    """Command line (see the module's docstring and ``--help``); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Variants: zero_offload, twinflow:R (R the CPU share), stride:K.")
    ap.add_argument("--n", default="1.24e9", help="parameters (elements), e.g. 3.83e9 (default 1.24e9)")
    ap.add_argument("--s", "--subgroup-size", dest="s", default="1.24e8",
                    help="subgroup size in elements (default 1.24e8)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated (default {DEFAULT_VARIANTS})")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the model's parameters and gradients")
    ap.add_argument("--optimizer", choices=["adamw", "adam"], default="adamw")
    ap.add_argument("--iterations", "-n", type=whole_arg, default=5,
                    help="update phases per repeat; the first is not counted when more than one (default 5)")
    ap.add_argument("--repeats", type=whole_arg, default=1, help="repeats per variant (default 1)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="where the model's parameters and gradients live (default: CUDA when available)")
    ap.add_argument("--threads", type=whole_arg, default=0, help="torch CPU threads (default: torch's)")
    ap.add_argument("--slots", type=whole_arg, default=3, help="staging slots per direction for CPU subgroups (default 3)")
    ap.add_argument("--stream-slots", type=whole_arg, default=2, help="GPU slots for streamed subgroups (default 2)")
    ap.add_argument("--lr", type=decimal_arg, default=1e-4)
    ap.add_argument("--beta1", type=decimal_arg, default=0.9)
    ap.add_argument("--beta2", type=decimal_arg, default=0.999)
    ap.add_argument("--eps", type=decimal_arg, default=1e-8)
    ap.add_argument("--weight-decay", type=decimal_arg, default=0.01)
    ap.add_argument("--json", default=None, help="write the results to this file")
    a = ap.parse_args(argv)
    try:
        n, s = parse_count(a.n, "--n"), parse_count(a.s, "--s")
        hyper = Hyper(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.optimizer)
        variants = [v.strip() for v in a.variants.split(",") if v.strip()]
        if not variants:
            raise ValueError("--variants is empty")
        if a.threads < 0 or a.slots < 1 or a.stream_slots < 1:
            raise ValueError("--threads must be >= 0, --slots and --stream-slots >= 1")
        if a.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: this torch sees no CUDA device")
        for v in variants:
            placement(v, 1)
    except ValueError as e:
        print(f"baselines: {e}", file=sys.stderr)
        return 2
    if a.device != "cuda" and not torch.cuda.is_available():
        print("baselines: no CUDA device: the model's buffers are on the host, GPU variants are skipped", flush=True)
    try:
        results = benchmark(n, s, variants, a.dtype, a.iterations, a.repeats, hyper, a.device, a.threads or None,
                            a.slots, a.stream_slots, log=lambda *x: print(*x, flush=True))
    except (ValueError, MemoryError) as e:
        print(f"baselines: {e}", file=sys.stderr)
        return 2
    print(f"\n{'variant':<16}{'s/phase':>10}{'min':>9}{'max':>9}{'Gparams/s':>11}")
    for r in results:
        if "seconds_median" in r:
            print(f"{r['variant']:<16}{r['seconds_median']:10.4f}{r['seconds_min']:9.4f}{r['seconds_max']:9.4f}"
                  f"{r['gparams_per_s']:11.3f}")
        else:
            print(f"{r['variant']:<16}  {'skipped: ' + r['skipped'] if 'skipped' in r else 'FAILED: ' + r['failed']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(n=n, subgroup_size=s, dtype=a.dtype, iterations=a.iterations, repeats=a.repeats,
                           device=a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"),
                           threads=torch.get_num_threads(), torch=torch.__version__, hyper=hyper.as_dict(),
                           results=results), f, indent=2)
    bad = [r["variant"] for r in results if "failed" in r or r.get("params_mismatch")]
    if bad:
        print(f"baselines: failed or inconsistent: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
