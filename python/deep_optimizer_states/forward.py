"""The update overlapped with the next forward pass (:meth:`DeepOptimizerStates.overlap_forward`):
``step()`` submits each bucket's update phase and returns; before a block of the model (a
transformer layer, say) runs its forward, a pre-hook waits for the parameters under that block
(the runtime's ``dos_optimizer_wait_parameters``), and the phases are closed
(``dos_optimizer_wait_step``) before anything else reads or writes the gradients or the state.
A mixin, as the overlap of backward is: the optimizer's constructor sets up its attributes
(``_forward_handles``, ``_forward_overlap``, ``_forward_depth``).
"""

import ctypes
import warnings
import weakref

import torch

from . import _capi
from . import runtime as _rt


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
        returns once every bucket's update phase is submitted, and forward waits for parameters
        only where they are read. The result is the same bits as without it.

        Arguments:
          module (torch.nn.Module): the model, holding every parameter of this optimizer.
          blocks (list of torch.nn.Module or None): submodules of ``module``, each of which reads
            the parameters under it only while its own forward runs (its submodules may read them
            in any way: fused kernels, attention reading its projection's weight,
            parametrisations such as ``weight_norm``). Before each block's forward, every parameter
            under it is waited for; every parameter under no block is waited for when the model's
            forward starts. For a causal language model: the embeddings, each layer, the final norm
            and the output head (``forward_blocks(model)`` finds them in the usual layouts). None
            (default): no block, so the model's forward waits for everything first (correct for any
            model, nothing overlapped).

        The contract is the caller's: a parameter under a block read elsewhere before that block
        runs (a root forward adding ``self.wpe.weight`` itself, a block reading another block's
        weights) reads values the update is still writing. A submodule called on its own, outside
        the model's forward, waits for every parameter under it first. Outside a forward, read or write
        the parameters only after :meth:`wait` (``model.state_dict()`` waits by itself on torch >=
        2.0, ``model.load_state_dict()`` on every torch: pre-hooks). The phases are closed, and :attr:`last_step` completed, by
        :meth:`wait`, by the next backward's first gradient hook (``overlap=True``), by ``step()``,
        and by every call that reads or replaces the state.

        **One difference:** ``step()`` ends with the gradients zeroed, as ``zero_grad()`` would (a
        loop that zeroes them every step, as nearly all do, sees no difference; one that lets them
        accumulate across ``step()`` calls must not use this, nor one with sparse gradients). They
        read as None until the next backward writes new ones (so that nothing, such as a model's
        ``zero_grad`` zeroing in place, writes the flat gradient buffers the runtime may still
        read; the gradient hooks copy the new ones in as backward accumulates them, or ``step()``
        where torch has none), and a
        parameter that gets none before the next ``step()`` has a zero gradient there, even when a
        model's ``zero_grad(set_to_none=True)`` ran in between (this optimizer's
        ``zero_grad(set_to_none=True)`` leaves it None, as without overlap).

        Raises ``TypeError`` when ``module`` (or a block) is not a ``torch.nn.Module``,
        ``ValueError`` when a parameter of this optimizer is not in ``module``, a block is not
        under ``module``, or it was called before, or the optimizer has ``flat_gradients=False``
        (the phase left running would read gradient memory the caller may free or write while
        forward runs), ``RuntimeError`` after :meth:`close`. Returns the number of modules whose
        forward waits (int).
        """
        self._check_open()
        if not self.flat_gradients:
            raise ValueError("overlap_forward needs flat_gradients=True: the update phase left running reads the "
                             "gradients while the next forward runs, and only the optimizer's own buffers are safe "
                             "from being freed or written then")
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
        blocks = list(blocks) if blocks is not None else []
        inside = set(id(m) for m in module.modules())
        for k in blocks:
            if not isinstance(k, torch.nn.Module):
                raise TypeError(f"overlap_forward: blocks holds a {type(k).__name__}, not a torch.nn.Module")
            if id(k) not in inside or k is module:
                raise ValueError(f"overlap_forward: a block ({type(k).__name__}) is not a submodule of the module given")
        ref = weakref.ref(self)  # the hooks must not keep the optimizer (and its pinned state) alive
        depth = [0]  # model forwards running (the root's first pre-hook counts up, its post-hook down)

        def waiting(ranges, only_alone=False):
            def before_forward(mod, args):
                opt = ref()
                if opt is not None and (not only_alone or depth[0] == 0):
                    opt._wait_ranges(ranges)
            return before_forward

        hooked = 0
        under_blocks = set()
        for k in blocks:
            ranges = [where[id(p)] for p in k.parameters() if id(p) in where]
            under_blocks |= {id(p) for p in k.parameters()}
            if ranges:
                self._forward_handles.append(_register_first(k, waiting(ranges)))
                hooked += 1
        rest = [where[id(p)] for p in module.parameters() if id(p) in where and id(p) not in under_blocks]
        if rest:
            self._forward_handles.append(_register_first(module, waiting(rest)))
            hooked += 1
        # a submodule called on its own, outside the model's forward, waits for everything under it
        block_ids = {id(k) for k in blocks}
        for m in module.modules():
            if m is module or id(m) in block_ids:
                continue
            ranges = [where[id(p)] for p in m.parameters() if id(p) in where]
            if ranges:
                self._forward_handles.append(_register_first(m, waiting(ranges, only_alone=True)))

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

        def wait_first(*_args, **_kwargs):
            opt = ref()
            if opt is not None:
                opt.wait()

        # model.state_dict() reads the parameters the phase still writes (torch >= 2.0 has the hook);
        # a model.load_state_dict while a phase runs would be overwritten by the phase's write-backs
        # (and then seen as unchanged by the masters' check): both wait first
        if hasattr(module, "register_state_dict_pre_hook"):
            self._forward_handles.append(module.register_state_dict_pre_hook(wait_first))
        if hasattr(module, "_register_load_state_dict_pre_hook"):
            self._forward_handles.append(module._register_load_state_dict_pre_hook(wait_first))
        if _rt.leaves_no_caller_core(self.runtime):
            warnings.warn("overlap_forward: the runtime's CPU Adam threads take every core but the GPUs' (automatic "
                          "cpu_threads, caller_cores=0), so forward's kernel launches share cores with them while the "
                          "phase runs; give DeepOptimizerStates(..., caller_cores=1) or get_runtime(caller_cores=1) "
                          "before the runtime starts", stacklevel=2)
        self._forward_overlap = True
        return hooked

    def wait(self):
        """Waits for the update phases ``step()`` left running (:meth:`overlap_forward`) and
        completes :attr:`last_step` with their figures; at once when none runs. Raises
        :class:`DosError` when a phase failed (the optimizer then refuses further steps)."""
        with self._overlap_lock:  # hooks of CPU and CUDA buckets may call it from two threads at once
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
                    stats.append(self._phase_stats(b, st))
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
            self._apply_timeline(b)
            ret = L.dos_optimizer_step_async(b.handle)
        b.running = ret == 0
        self._runtime_call(ret, f"update phase of {b.describe()}")
        for p in b.params:  # nothing may write the flat gradients the phase still reads
            p.grad = None
        b.grads_cleared = True
        if self._forward_depth is not None:  # no model forward runs now (one that raised on torch < 2.1 is over)
            self._forward_depth[0] = 0

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


def forward_blocks(model):
    """The blocks of :meth:`DeepOptimizerStates.overlap_forward` for the usual causal language model
    layouts, in forward order: the token (and position) embeddings, each transformer layer, the
    final norm, the output head. Knows Hugging Face's Llama-like models (``model.embed_tokens``,
    ``model.layers``, ``model.norm``, ``lm_head``) and GPT-2 (``transformer.wte``, ``wpe``, ``h``,
    ``ln_f``, ``lm_head``), whose forwards read these modules' parameters only by calling them.
    Raises ``ValueError`` naming what is missing for any other layout (give the blocks yourself)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"forward_blocks takes a torch.nn.Module, got {type(model).__name__}")
    layouts = (("model", ("embed_tokens",), "layers", ("norm",)), ("transformer", ("wte", "wpe"), "h", ("ln_f",)))
    for inner_name, embeds, layers_name, norms in layouts:
        inner = getattr(model, inner_name, None)
        if not isinstance(inner, torch.nn.Module):
            continue
        parts = [getattr(inner, n, None) for n in embeds]
        layers = getattr(inner, layers_name, None)
        tail = [getattr(inner, n, None) for n in norms] + [getattr(model, "lm_head", None)]
        if isinstance(layers, torch.nn.ModuleList) and all(isinstance(x, torch.nn.Module) for x in parts):
            return parts + list(layers) + [x for x in tail if isinstance(x, torch.nn.Module)]
    raise ValueError(f"forward_blocks: {type(model).__name__} has neither model.embed_tokens/model.layers (Llama-like) "
                     "nor transformer.wte/transformer.h (GPT-2): give overlap_forward its blocks yourself")
