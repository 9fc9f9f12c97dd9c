"""The update overlapped with the next forward pass (:meth:`DeepOptimizerStates.overlap_forward`):
``step()`` submits each bucket's update phase and returns; a forward pre-hook on every module that
holds parameters of the optimizer waits for those parameters only (the runtime's
``dos_optimizer_wait_parameters``), and the phases are closed (``dos_optimizer_wait_step``) before
anything else reads or writes the gradients or the state. A mixin, as the overlap of backward is:
the optimizer's constructor sets up its attributes (``_forward_handles``, ``_running``).
"""

import ctypes
import weakref

import torch

from . import _capi


class _ForwardOverlap:
    """The next forward's overlap: hooks, the running phases and their part of ``last_step``."""

    def overlap_forward(self, module):
        """Lets the next forward pass of ``module`` overlap the update: from now on ``step()``
        returns once every bucket's update phase is submitted, and the forward of each submodule
        that holds parameters of this optimizer first waits for those parameters' new values (a
        forward pre-hook). The result is the same bits as without it.

        Until the phases are closed, read the parameters only inside the module's forward (or after
        :meth:`wait`): ``model.state_dict()`` waits by itself on torch >= 2.0 (a state-dict pre-hook),
        other readers (an EMA of the weights, a logger) must call :meth:`wait` first. The phases
        are closed, and :attr:`last_step` completed, by :meth:`wait`, by the next backward's first
        gradient hook (``overlap=True``), by ``step()``, and by every call that reads or replaces the
        state. ``step()`` leaves every ``p.grad`` None (as ``zero_grad(set_to_none=True)`` does), so
        that nothing writes the flat gradient buffers the runtime may still read: the next backward
        allocates new gradients, which the gradient hooks (``overlap=True``) or ``step()`` copy in;
        ``zero_grad(set_to_none=False)`` also sets them to None while a phase runs.

        Raises ``TypeError`` when ``module`` is not a ``torch.nn.Module``, ``ValueError`` when none
        of its parameters is updated by this optimizer, ``RuntimeError`` after :meth:`close`.
        Returns the number of submodules hooked (int).
        """
        self._check_open()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"overlap_forward takes the torch.nn.Module whose forward reads the parameters, got "
                            f"{type(module).__name__}")
        where = {}  # id(parameter) -> (bucket, first flat element, end)
        for b in self._buckets:
            for j, p in enumerate(b.params):
                if b.numels[j]:
                    where[id(p)] = (b, b.offsets[j], b.offsets[j] + b.numels[j])
        ref = weakref.ref(self)  # the hooks must not keep the optimizer (and its pinned state) alive
        hooked = 0
        for m in module.modules():
            ranges = [where[id(p)] for p in m.parameters(recurse=False) if id(p) in where]
            if not ranges:
                continue

            def before_forward(mod, args, ranges=ranges):
                opt = ref()
                if opt is not None:
                    opt._wait_ranges(ranges)

            self._forward_handles.append(m.register_forward_pre_hook(before_forward))
            hooked += 1
        if hooked == 0:
            raise ValueError("overlap_forward: none of the module's parameters is updated by this optimizer (give the "
                             "model whose parameters it was built with)")
        if hasattr(module, "register_state_dict_pre_hook"):  # torch >= 2.0

            def before_state_dict(*_args, **_kwargs):
                opt = ref()
                if opt is not None:
                    opt.wait()

            self._forward_handles.append(module.register_state_dict_pre_hook(before_state_dict))
        self._forward_overlap = True
        return hooked

    def wait(self):
        """Waits for the update phases ``step()`` left running (:meth:`overlap_forward`) and
        completes :attr:`last_step` with their figures; at once when none runs. Raises
        :class:`DosError` when a phase failed (the optimizer then refuses further steps)."""
        running = [b for b in self._buckets if b.running]
        if not running:
            return
        L = _capi.lib()
        stats = []
        failure = None
        for b in running:
            st = _capi.StepStats()
            ret = L.dos_optimizer_wait_step(b.handle, ctypes.byref(st))
            b.running = False
            if ret != 0 and failure is None:
                failure = (ret, b)
            elif ret == 0:
                stats.append(st.as_dict())
        if failure is not None:
            self._runtime_call(failure[0], f"update phase of {failure[1].describe()}")
        last = self.last_step
        if last is not None and last.get("running"):
            last["stats"] = last["stats"] + stats
            last["running"] = False
            last["update_seconds"] = sum(s["seconds"] for s in last["stats"])
            last.update(self._overlap_summary(last["stats"], last["verdicts"], last["redo_reasons"]))

    def _wait_ranges(self, ranges):
        """Forward pre-hook: waits until the parameters of ``ranges`` ((bucket, begin, end) flat
        ranges) hold the running phases' results."""
        if self._closed or self._broken:
            return
        L = _capi.lib()
        for b, begin, end in ranges:
            if b.running:
                self._runtime_call(L.dos_optimizer_wait_parameters(b.handle, begin, end),
                                   f"waiting for the parameters of {b.describe()}")

    def _finish_async(self, b, verdict):
        """Submits the rest of the phase of ``b`` (opening one first when none is open) with
        ``verdict`` and leaves it running."""
        L = _capi.lib()
        if not b.open:
            self._runtime_call(L.dos_optimizer_begin_step(b.handle), f"opening the update phase of {b.describe()}")
            b.open = True
        ret = L.dos_optimizer_finish_step_async(b.handle, verdict)
        b.open = False
        b.running = ret == 0
        self._runtime_call(ret, f"update phase of {b.describe()}")

    def _remove_forward_hooks(self):
        """Removes the hooks overlap_forward registered (idempotent)."""
        for h in self._forward_handles:
            h.remove()
        self._forward_handles = []
        self._forward_overlap = False
