"""The update overlapped with the next forward pass (:meth:`DeepOptimizerStates.overlap_forward`):
``step()`` submits each bucket's update phase and returns; before a block of the model (a
transformer layer, by default) runs its forward, a pre-hook waits for the parameters under that
block (the runtime's ``dos_optimizer_wait_parameters``), and the phases are closed
(``dos_optimizer_wait_step``) before anything else reads or writes the gradients or the state.
A mixin, as the overlap of backward is: the optimizer's constructor sets up its attributes
(``_forward_handles``, ``_forward_overlap``).
"""

import ctypes
import weakref

import torch

from . import _capi


def _default_blocks(module, ours):
    """The elements of the ``torch.nn.ModuleList`` under ``module`` that holds the most of the
    optimizer's parameters (ids in ``ours``): a transformer's layers. Empty when there is none."""
    best, best_n = None, 0
    for m in module.modules():
        if isinstance(m, torch.nn.ModuleList):
            n = sum(1 for p in m.parameters() if id(p) in ours)
            if n > best_n:
                best, best_n = m, n
    return list(best) if best is not None else []


def _register_first(module, hook):
    """Registers a forward pre-hook that runs before those registered earlier (weight_norm's and
    other parametrisations compute the weights in theirs). Returns its handle."""
    try:
        return module.register_forward_pre_hook(hook, prepend=True)  # torch >= 2.0
    except TypeError:
        h = module.register_forward_pre_hook(hook)
        module._forward_pre_hooks.move_to_end(h.id, last=False)
        return h


class _ForwardOverlap:
    """The next forward's overlap: hooks, the running phases and their part of ``last_step``."""

    def overlap_forward(self, module, blocks=None):
        """Lets the next forward pass of ``module`` overlap the update: from now on ``step()``
        returns once every bucket's update phase is submitted, and forward waits for each block's
        parameters just before that block runs. The result is the same bits as without it.

        Arguments:
          module (torch.nn.Module): the model, holding every parameter of this optimizer.
          blocks (list of torch.nn.Module or None): submodules of ``module`` whose forward reads
            the parameters under them only while it runs, in any way (fused kernels, attention
            reading its projection's weight, parametrisations); before each one's forward, the
            parameters under it are waited for. None (default): the layers of the largest
            ``torch.nn.ModuleList`` in the model (a transformer's blocks). Every other module on
            the way (the embeddings, the final norm, the output head: the siblings of the blocks'
            ancestors) is a block of its own, and parameters held directly by an ancestor are
            waited for before that ancestor's forward. A model without a ``ModuleList`` and no
            ``blocks`` waits for everything before its forward starts (correct, nothing overlapped).
            A submodule called on its own, outside the model's forward, waits for every parameter
            under it first.

        Until the phases are closed, read the parameters only inside the model's forward (or after
        :meth:`wait`): ``model.state_dict()`` waits by itself on torch >= 2.0 (a state-dict
        pre-hook); other readers (an EMA of the weights, a logger, a forward of another module
        sharing the parameters) must call :meth:`wait` first. The phases are closed, and
        :attr:`last_step` completed, by :meth:`wait`, by the next backward's first gradient hook
        (``overlap=True``), by ``step()``, and by every call that reads or replaces the state.
        **One difference:** ``step()`` ends with the gradients zeroed, as ``zero_grad()`` would (a
        loop that zeroes them every step, as nearly all do, sees no difference; one that lets them
        accumulate across ``step()`` calls must not use this). They read as None until the next
        backward writes new ones (so that nothing, such as a model's ``zero_grad`` zeroing in place,
        writes the flat gradient buffers the runtime may still read; the gradient hooks of
        ``overlap=True`` or ``step()`` copy the new ones in), and a parameter that gets none before
        the next ``step()`` has a zero gradient there (``zero_grad(set_to_none=True)`` in between
        leaves it None, as without overlap).

        Raises ``TypeError`` when ``module`` (or a block) is not a ``torch.nn.Module``,
        ``ValueError`` when a parameter of this optimizer is not in ``module``, a block is not
        under ``module``, or it was called before, ``RuntimeError`` after :meth:`close`. Returns
        the number of modules hooked (int).
        """
        self._check_open()
        if self._forward_overlap:
            raise ValueError("overlap_forward was called before for this optimizer: once is enough (its hooks stay "
                             "until close())")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"overlap_forward takes the torch.nn.Module whose forward reads the parameters, got "
                            f"{type(module).__name__}")
        where = {}  # id(parameter) -> (bucket, first flat element, end)
        for b in self._buckets:
            for j, p in enumerate(b.params):
                if b.numels[j]:
                    where[id(p)] = (b, b.offsets[j], b.offsets[j] + b.numels[j])
        in_module = {id(p) for p in module.parameters()}
        missing = [i for b in self._buckets for i, p in zip(b.indices, b.params) if id(p) not in in_module]
        if missing:
            raise ValueError(f"overlap_forward: {len(missing)} parameter(s) of this optimizer (the first: index "
                             f"{missing[0]}) are not in the module given: nothing would wait for them; give the model "
                             "that holds them all")
        if blocks is None:
            blocks = _default_blocks(module, where)
        blocks = list(blocks)
        inside = set(id(m) for m in module.modules())
        for k in blocks:
            if not isinstance(k, torch.nn.Module):
                raise TypeError(f"overlap_forward: blocks holds a {type(k).__name__}, not a torch.nn.Module")
            if id(k) not in inside:
                raise ValueError(f"overlap_forward: a block ({type(k).__name__}) is not a submodule of the module given")
        if not blocks:
            blocks = [module]
        # the ancestors of the blocks; their other children become blocks of their own
        block_ids = {id(k) for k in blocks}
        ancestors = set()

        def mark(m):
            if id(m) in block_ids:
                return True
            found = False
            for c in m.children():
                found = mark(c) or found
            if found:
                ancestors.add(id(m))
            return found

        mark(module)
        hooked_modules = list(blocks)
        for m in module.modules():
            if id(m) in ancestors:
                hooked_modules += [c for c in m.children() if id(c) not in ancestors and id(c) not in block_ids]
        ref = weakref.ref(self)  # the hooks must not keep the optimizer (and its pinned state) alive

        def hook_for(ranges):
            def before_forward(mod, args):
                opt = ref()
                if opt is not None:
                    opt._wait_ranges(ranges)
            return before_forward

        hooked = 0
        for m in hooked_modules:
            ranges = [where[id(p)] for p in m.parameters() if id(p) in where]
            if ranges:
                self._forward_handles.append(_register_first(m, hook_for(ranges)))
                hooked += 1
        for m in module.modules():  # parameters an ancestor holds itself
            if id(m) in ancestors:
                ranges = [where[id(p)] for p in m.parameters(recurse=False) if id(p) in where]
                if ranges:
                    self._forward_handles.append(_register_first(m, hook_for(ranges)))
                    hooked += 1
        # A submodule called on its own, outside the model's forward (model.encoder(x)), waits for
        # everything under it: inside the model's forward the blocks above have waited already.
        depth = [0]  # model forwards running (the root's pre-hook counts up, its post-hook down)
        blocked = {id(m) for m in hooked_modules} | ancestors | {id(module)}

        def hook_alone(ranges):
            def before_forward(mod, args):
                opt = ref()
                if opt is not None and depth[0] == 0:
                    opt._wait_ranges(ranges)
            return before_forward

        for m in module.modules():
            if id(m) in blocked:
                continue
            ranges = [where[id(p)] for p in m.parameters() if id(p) in where]
            if ranges:
                self._forward_handles.append(_register_first(m, hook_alone(ranges)))

        def enter(mod, args):
            depth[0] += 1

        def leave(mod, args, out):
            depth[0] = max(0, depth[0] - 1)

        self._forward_handles.append(_register_first(module, enter))
        try:  # torch >= 2.1: also when forward raises
            self._forward_handles.append(module.register_forward_hook(leave, always_call=True))
        except TypeError:
            self._forward_handles.append(module.register_forward_hook(leave))
        self._forward_depth = depth
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
        """Submits the rest of the open phase of ``b`` with ``verdict``, or a whole phase when none
        is open, and leaves it running; every ``p.grad`` of ``b`` becomes None (see
        :meth:`overlap_forward`)."""
        L = _capi.lib()
        if b.open:
            ret = L.dos_optimizer_finish_step_async(b.handle, verdict)
            b.open = False
        else:
            ret = L.dos_optimizer_step_async(b.handle)
        b.running = ret == 0
        self._runtime_call(ret, f"update phase of {b.describe()}")
        for p in b.params:  # nothing may write the flat gradients the phase still reads
            p.grad = None
        b.grads_cleared = True
        depth = getattr(self, "_forward_depth", None)
        if depth is not None:  # no model forward runs now (one that raised on torch < 2.1 is over)
            depth[0] = 0

    def _restore_cleared_grads(self):
        """At step(), after the phases closed: a parameter whose gradient the last step cleared
        and that got none since has a zero gradient (its view of the flat buffer, zeroed), as after
        ``zero_grad()`` in a run without overlap_forward."""
        for b in self._buckets:
            if not b.grads_cleared:
                continue
            for p, v in zip(b.params, b.views):
                if p.grad is None:
                    v.zero_()
                    p.grad = v
            b.grads_cleared = False

    def _remove_forward_hooks(self):
        """Removes the hooks overlap_forward registered (idempotent)."""
        for h in self._forward_handles:
            h.remove()
        self._forward_handles = []
        self._forward_overlap = False
