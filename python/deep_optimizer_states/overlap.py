"""The overlapped update of :class:`~deep_optimizer_states.optimizer.DeepOptimizerStates`
(``overlap=True``): a hook on each parameter declares its gradient final to the runtime during the
backward pass expected to be the last before ``step()``, and notes what changes a declared gradient
afterwards, so that ``step()`` keeps, redoes or drops the runtime's speculative updates (the
optimizer's class docstring, "Overlap", gives the rules). A mixin: the optimizer's own state
(``_buckets``, ``_overlap_lock``, ``_hook_handles``, ...) is set up by its constructor.
"""

import collections
import contextlib
import ctypes
import os
import threading
import warnings
import weakref

import torch

from . import _capi

_VERDICT_NAMES = {_capi.VERDICT_KEEP: "keep", _capi.VERDICT_CHANGED: "changed", _capi.VERDICT_SKIP: "skip"}
_warned_no_hooks = False

def _grad_hook_kind():
    """How this torch tells that a parameter's gradient has been accumulated: ``"post_accumulate"``
    (``Tensor.register_post_accumulate_grad_hook``, torch >= 2.1), ``"grad_accumulator"`` (a post
    hook on the parameter's ``AccumulateGrad`` autograd node, which older versions run right after
    writing ``p.grad``), or None."""
    if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        return "post_accumulate"
    try:
        probe = torch.zeros(1, requires_grad=True)
        with torch.enable_grad():
            node = probe.expand_as(probe).grad_fn.next_functions[0][0]
        if type(node).__name__ == "AccumulateGrad" and hasattr(node, "register_hook"):
            return "grad_accumulator"
    except Exception:
        pass
    return None


def _declarer_wanted():
    """Whether pending CUDA gradients get a :class:`_Declarer` thread: ``DOS_DECLARE_BY`` in the
    environment, ``thread`` (the default: unset or empty) or ``hooks`` (only the later gradient
    hooks tell them, as before the thread; a measurement switch, the same bits either way); another
    value is named in a ``RuntimeWarning`` once and the default kept."""
    global _declare_by
    if _declare_by is None:
        v = os.environ.get("DOS_DECLARE_BY", "")
        if v not in ("", "thread", "hooks"):
            warnings.warn(f"DOS_DECLARE_BY={v!r} is not one of 'thread', 'hooks': 'thread' is used", RuntimeWarning,
                          stacklevel=2)
        _declare_by = "hooks" if v == "hooks" else "thread"
    return _declare_by == "thread"


_declare_by = None  # _declarer_wanted's reading of DOS_DECLARE_BY


class _Declarer:
    """A daemon thread that tells the runtime of the CUDA gradients declared final (``_Bucket.pending``)
    as soon as the work that wrote each has completed, in the order they were declared: it waits on
    each one's event (``torch.cuda.Event(blocking=True)``: asleep, the GIL released) and then calls
    the optimizer's :meth:`_Overlap._declare_done`. Without it a pending gradient is told only at the
    next gradient hook that finds its event complete (``_declare_completed``), and autograd launches
    the whole backward pass well before the GPU has run it: on a GPT of 1.01e9 parameters on an H100
    the hooks stopped 40 ms into a 125 ms backward, and the subgroups of the rest were not updated
    during backward. Holds a weak reference to the optimizer (which stops it at ``close()``); its
    condition is on the optimizer's ``_overlap_lock``. Waits with the bucket's device current (a
    thread's first CUDA call would otherwise make a context on device 0). A wait that raises (a CUDA
    error) drops that gradient from the pending ones and marks its bucket's speculative updates to
    be redone (the same bits), and the thread goes on."""

    def __init__(self, opt):
        self._ref = weakref.ref(opt)
        self._cv = threading.Condition(opt._overlap_lock)
        self._stop = False
        self._order = collections.deque()  # (bucket, position, event) in declaration order, over all buckets
        self._thread = threading.Thread(target=self._run, name="dos-gradients-final", daemon=True)
        self._thread.start()

    def notify(self, b, j, ev):
        """Gradient ``j`` of bucket ``b`` was added to ``b.pending`` with event ``ev`` (called with
        ``_overlap_lock`` held)."""
        self._order.append((b, j, ev))
        self._cv.notify()

    def stop(self):
        """Ends the thread once its current wait returns (idempotent)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def _next(self):
        """The oldest (bucket, position, event) still pending, over all buckets, or None; False
        when the thread must end (stopped, the optimizer closed, broken or gone). Those no longer
        pending (told by a hook, dropped by step()) are forgotten. Called with the lock held."""
        opt = self._ref()
        if self._stop or opt is None or opt._closed or opt._broken:
            return False
        while self._order:
            b, j, ev = self._order[0]
            if any(e is ev for _, e in b.pending):
                return b, j, ev
            self._order.popleft()
        return None

    def _run(self):
        while True:
            with self._cv:
                nxt = self._next()
                while nxt is None:
                    self._cv.wait()
                    nxt = self._next()
                if nxt is False:
                    return
            b, j, ev = nxt
            failed = None
            cuda = b.device is not None and b.device.type == "cuda"
            try:
                with torch.cuda.device(b.device) if cuda else contextlib.nullcontext():
                    ev.synchronize()
            except Exception as e:  # noqa: BLE001 (a thread of its own: nowhere to raise to)
                failed = e
            with self._cv:
                opt = self._ref()
                if self._stop or opt is None:
                    return
                opt._declare_done(b, j, ev, failed)
                del opt


class _Overlap:
    """The overlap's methods of DeepOptimizerStates (hooks, declarations, the runtime's open
    phases) and its part of ``last_step``."""

    def _install_hooks(self, adopt_only=False):
        """Registers the gradient-accumulated hook on every parameter (see the class's "Overlap").
        Returns False, with a warning given once per process, where this torch has no such hook.
        With ``adopt_only`` (no overlap) the hook only moves a gradient autograd allocated anew into
        the flat buffer (:meth:`_adopt_gradient`), and a torch without hooks gets no warning."""
        global _warned_no_hooks
        kind = _grad_hook_kind()
        if kind is None and adopt_only:
            return False  # step() copies the gradients into the flat buffers, as the hooks would
        if kind is None:
            if not _warned_no_hooks:
                _warned_no_hooks = True
                warnings.warn(f"DeepOptimizerStates(overlap=True): torch {torch.__version__} has no hook that runs when "
                              "a gradient has been accumulated (Tensor.register_post_accumulate_grad_hook, torch >= "
                              "2.1): the update runs after backward, without overlap", RuntimeWarning, stacklevel=3)
            return False
        ref = weakref.ref(self)  # the hooks must not keep the optimizer (and its pinned state) alive
        for b in self._buckets:
            for j, p in enumerate(b.params):
                if b.numels[j] == 0:
                    continue

                def on_accumulated(*_, b=b, j=j, p=p):
                    opt = ref()
                    if opt is not None:
                        (opt._adopt_gradient if adopt_only else opt._grad_accumulated)(b, j, p)

                if kind == "post_accumulate":
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(on_accumulated))
                else:
                    with torch.enable_grad():
                        node = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._grad_accumulators.append(node)
                    self._hook_handles.append(node.register_hook(on_accumulated))
        return True

    def _remove_hooks(self):
        """Removes the hooks _install_hooks registered (idempotent)."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        self._grad_accumulators = []

    @staticmethod
    def _readable_in_place(b, j, g):
        """Whether gradient ``g`` of parameter ``j`` of bucket ``b`` is one the runtime can read from
        the flat buffer (dense, the bucket's dtype, device and the parameter's shape, no graph)."""
        return g is not None and not g.requires_grad and g.layout == torch.strided and g.dtype == b.dtype \
            and g.device == b.device and g.shape == b.views[j].shape

    def _adopt_gradient(self, b, j, p):
        """Without overlap: autograd has accumulated the gradient of ``p`` (position ``j`` of bucket
        ``b``); one it allocated anew (after ``zero_grad(set_to_none=True)``, the Hugging Face
        Trainer's and torch 2's default) is copied into the flat buffer at once and ``p.grad`` pointed
        at the buffer's view, so that a model's gradients do not exist twice on the device until
        :meth:`step` (the same copy step() makes; the same bits). A phase the last step left running
        (overlap_forward) is waited for first. Leaves a gradient it cannot read in place, and one
        that is a view of another buffer (``DistributedDataParallel(gradient_as_bucket_view=True)``
        points ``p.grad`` at its bucket and checks it is still there), to step()."""
        if self._closed or self._broken:
            return
        if b.running:
            self.wait()  # a phase the last step left running (overlap_forward) ends before the buffer is written
        g = p.grad
        if not self._readable_in_place(b, j, g):
            return
        if g._base is not None and not b.holds(j, g):
            return  # a view of another's buffer (DDP's gradient_as_bucket_view): theirs; step() copies it
        b.move_into_view(j, p)

    def _grad_accumulated(self, b, j, p):
        """Autograd has accumulated the gradient of ``p`` (position ``j`` of bucket ``b``): move it
        into the flat buffer where it is not there, and declare it final when this is the backward
        pass expected to be the last before step(), or note that a declared gradient changed."""
        if self._closed or self._broken:
            return
        self.wait()  # a phase the last step left running (overlap_forward) ends before gradients are written
        with self._overlap_lock:
            b.fired[j] += 1
            n = b.fired[j]
            self._backwards_seen = max(self._backwards_seen, n)
            g = p.grad
            if not self._readable_in_place(b, j, g):
                # not for the runtime as it is (a create_graph backward, a sparse or odd gradient):
                # step() copies or refuses it
                if j in b.declared and b.changed is None:
                    b.changed = "a gradient declared final was replaced by one the optimizer cannot read in place"
                return
            # Each accumulation moves the buffer's version counter by one: autograd's in-place sum into
            # the view, or (a new tensor autograd made) the copy into the view below. Any other move
            # since the last hook is a write of the caller's into the buffer (a hook of its own, a
            # write between two backward passes), maybe into a gradient already declared final,
            # which the next hooks would otherwise take for their own: the speculation is redone.
            accumulated_in_place = b.holds(j, g)
            if b.seen_version is not None and b.declared and b.changed is None and \
                    b.flat_grad._version != b.seen_version + (1 if accumulated_in_place else 0):
                b.changed = ("the bucket's gradients were written in place between two accumulations, after some "
                             "were declared final")
            b.move_into_view(j, p)  # (after zero_grad(set_to_none=True): autograd made a new tensor)
            if j in b.declared:
                if b.changed is None:
                    b.changed = ("another backward pass accumulated into a gradient already declared final "
                                 "(more micro-batches than the step before)")
            elif n == self._backwards_expected and b.changed is None:
                self._declare(b, j)
            b.seen_version = b.flat_grad._version
            if b.device.type == "cuda":
                for bb in self._buckets:
                    self._declare_completed(bb)

    def _declare(self, b, j):
        """Declares parameter ``j`` of bucket ``b`` final (opening the runtime's phase first); on
        CUDA once the work that wrote the gradient has completed (an event, checked without
        waiting at each later hook and waited for by the optimizer's :class:`_Declarer`, started
        here at the first)."""
        L = _capi.lib()
        if not b.open:
            try:
                h = self._group_hyper(b.group_index, self.param_groups[b.group_index])
            except ValueError:
                return  # step() reports it
            if h != b.hyper:
                _capi.check(L.dos_optimizer_set_hyper(b.handle, *h[:5], int(h[5])),
                            f"setting the hyper-parameters of {b.describe()}")
                b.hyper = h
            self._apply_timeline(b)
            if self._compact_writes_lost(b):
                # a compact bucket cannot follow such a write: nothing is declared, and step() refuses
                # the step as documented (_refuse_compact_writes), changing nothing, rather than
                # backward failing
                return
            self._sync_masters(b)  # a parameter written in place since the last step: its master follows
            self._runtime_call(L.dos_optimizer_begin_step(b.handle), f"opening the update phase of {b.describe()}")
            b.open = True
        b.declared.add(j)
        if b.device.type == "cuda":
            ev = torch.cuda.Event(blocking=True)  # the declarer sleeps on it rather than spin
            ev.record()
            b.pending.append((j, ev))
            if self._declarer is None and not self._closed and _declarer_wanted():
                self._declarer = _Declarer(self)
            if self._declarer is not None:
                self._declarer.notify(b, j, ev)
        else:
            self._gradients_final(b, j)

    def _declare_done(self, b, j, ev, failed=None):
        """The declarer's wait for ``ev`` (pending parameter ``j`` of bucket ``b``) has returned (or
        raised ``failed``): the gradient is told to the runtime, unless a hook told it already or
        step() has dropped the step's pending gradients. A failed wait, or a failure to tell it,
        marks the step's speculative updates of ``b`` to be redone (the same bits), and a runtime
        failure the optimizer broken (:meth:`_runtime_call`), which step() reports. Called with
        ``_overlap_lock`` held."""
        for k, (_, e) in enumerate(b.pending):
            if e is ev:
                del b.pending[k]
                break
        else:
            return
        if failed is not None:
            if b.changed is None:
                b.changed = f"waiting for a gradient's CUDA event failed ({failed})"
            return
        if not b.open or self._closed or self._broken:
            return
        try:
            self._gradients_final(b, j)
        except Exception as e:  # noqa: BLE001 (a thread of its own: nowhere to raise to)
            if b.changed is None:
                b.changed = f"telling the runtime that a gradient was final failed ({e})"

    def _declare_completed(self, b):
        """Declares final the pending CUDA gradients of ``b`` whose writing has completed."""
        if not b.pending:
            return
        left = []
        for j, ev in b.pending:
            if ev.query():
                self._gradients_final(b, j)
            else:
                left.append((j, ev))
        b.pending = left

    def _gradients_final(self, b, j):
        """Tells the runtime that the gradient of parameter ``j`` of ``b`` is final (its flat range).
        Raises as :meth:`_runtime_call`."""
        L = _capi.lib()
        off = b.offsets[j]
        self._runtime_call(L.dos_optimizer_gradients_final(b.handle, off, off + b.numels[j]),
                           f"declaring the gradient of parameter {b.indices[j]} final")

    def _runtime_call(self, ret, what):
        """Raises for a failed C call as _capi.check does; a runtime failure (not bad input) marks
        the optimizer broken first."""
        if ret != 0:
            if ret != _capi._E_INVALID:
                self._broken = _capi.lib().dos_last_error().decode("utf-8", "replace")
            _capi.check(ret, what)

    def _finish(self, b, verdict):
        """Closes the open phase of ``b`` with ``verdict`` (``_capi.VERDICT_*``); returns its stats dict."""
        st = _capi.StepStats()
        ret = _capi.lib().dos_optimizer_finish_step(b.handle, verdict, ctypes.byref(st))
        b.open = False
        self._runtime_call(ret, f"update phase of {b.describe()}")
        return self._phase_stats(b, st)

    def _drop_open_phases(self):
        """Drops every open phase (as a skipped step: nothing updated) and forgets the step's
        declarations; what was speculated is lost, the next step() runs whole. Returns the number of
        phases dropped."""
        dropped = 0
        with self._overlap_lock:
            for b in self._buckets:
                if b.open and b.handle is not None and not self._broken:
                    try:
                        self._finish(b, _capi.VERDICT_SKIP)
                    except Exception:
                        pass
                    dropped += 1
                b.reset_overlap()
            self._backwards_seen = 0
        return dropped

    #: Overlapped steps in a row redone for one same reason after which a warning says so, once.
    REDO_STREAK_WARNING = 5

    def _note_redo_streak(self, reasons):
        """Warns once per optimizer (``UserWarning``) when the last :attr:`REDO_STREAK_WARNING`
        steps each lost their speculative updates for the same reasons (``reasons``: this step's
        ``redo_reasons``, one per bucket that lost them): those made in those buckets were redone,
        and once the reason is seen no more are made there for the step, so the overlap gains nothing
        in them; the warning says in how many of the buckets (the fewest and the most over those
        steps) when not in all of them on every step, and the reason what to change (a clip on every
        step, a write of the caller's into the gradients, ...). Steps without a reason start the
        count again."""
        if not self.overlap or self._redo_warned:
            return
        key = tuple(sorted(set(reasons)))
        if key and key == self._redo_key:
            self._redo_lost.append(len(reasons))
        else:  # a new streak (one step long), or none
            self._redo_key, self._redo_lost = (key, [len(reasons)]) if key else (None, [])
        streak = len(self._redo_lost)
        if streak >= self.REDO_STREAK_WARNING:
            self._redo_warned = True
            nb, lo, hi = len(self._buckets), min(self._redo_lost), max(self._redo_lost)
            where = "" if lo >= nb else f" in {lo if lo == hi else f'{lo} to {hi}'} of their {nb} buckets"
            there = "" if not where else " there"
            warnings.warn(f"DeepOptimizerStates(overlap=True): the last {streak} steps each lost their "
                          f"speculative updates{where} ({'; '.join(key)}): those made{there} were redone and no more "
                          f"were made{there}, so the overlap gains nothing{' in them' if where else ''} while that "
                          "lasts; last_step['redo_reasons'] says why for each step, last_step['speculated'] and "
                          "['redone'] how many", stacklevel=3)

    @staticmethod
    def _overlap_summary(stats, verdicts, reasons=()):
        """The overlapped update's part of :attr:`last_step`."""
        return dict(
            overlapped=any(s["overlapped"] for s in stats),
            speculated=sum(s["speculated"] for s in stats),
            hidden_params=sum(s["hidden_params"] for s in stats),
            redone=sum(s["redone"] for s in stats),
            exposed_seconds=sum(s["exposed_seconds"] for s in stats),
            verdicts=list(verdicts),
            redo_reasons=list(reasons),
        )
