"""The gradients of :class:`~deep_optimizer_states.optimizer.DeepOptimizerStates`: where they are
(the optimizer's flat buffers, or with ``flat_gradients=False`` where autograd put them), their
checks before a step, the global norm, clipping and scaling, and ``zero_grad()``. A mixin: the
optimizer's constructor sets up what these methods read (``_buckets``, ``flat_gradients``,
``max_grad_norm``, ``skip_nonfinite``, ...).
"""

import ctypes
import math

import torch

from . import _capi


def _describe(index, p):
    """A parameter for messages: its index in state_dict numbering, shape, dtype and device."""
    return f"parameter {index} (shape {tuple(p.shape)}, {p.dtype}, {p.device})"


class _Gradients:
    """The gradient-side methods of DeepOptimizerStates."""

    def _check_params(self):
        """Raises (changing nothing) when a parameter or its gradient no longer fits the runtime's view.
        Returns False when no parameter has a gradient (nothing to do, as for torch.optim), else True."""
        for i, p in self._frozen:
            if p.grad is not None:  # torch.optim would update it: this optimizer holds no state for it
                raise RuntimeError(f"{_describe(i, p)} was frozen (requires_grad=False) when the optimizer was "
                                   "created, so it has no optimizer state, and has a gradient: create the "
                                   "optimizer after unfreezing it, or drop the gradient (opt.zero_grad() sets a "
                                   "frozen parameter's to None). Nothing was updated")
        if all(p.grad is None for b in self._buckets for p in b.params):
            return False
        for b in self._buckets:
            for i, p, shape, ptr in zip(b.indices, b.params, b.shapes, b.ptrs):
                g = p.grad
                if g is not None and p.dtype == g.dtype == b.dtype and p.device == g.device == b.device \
                        and p.requires_grad and p.data_ptr() == ptr and g.layout == torch.strided \
                        and tuple(p.shape) == shape and g.shape == p.shape:
                    continue  # the common case, checked at once; the checks below say what is wrong
                what = _describe(i, p)
                if p.dtype != b.dtype:
                    raise RuntimeError(f"{what} changed dtype from {b.dtype} to {p.dtype} since the optimizer was created "
                                       "(model.to()/.half() afterwards?): create the optimizer after converting the "
                                       "model. Nothing was updated")
                if p.device != b.device or p.data_ptr() != ptr or tuple(p.shape) != shape:
                    raise RuntimeError(f"{what} moved to other memory or changed shape since the optimizer was created "
                                       f"(was {shape} on {b.device}): the runtime updates parameters in place by pointer; "
                                       "create the optimizer after moving the model. Nothing was updated")
                if not p.requires_grad:
                    raise RuntimeError(f"{what} no longer requires gradients: the runtime updates every parameter it was "
                                       "given; create a new optimizer without it. Nothing was updated")
                g = p.grad
                if g is None:
                    raise RuntimeError(f"{what} has no gradient (.grad is None): every parameter given to "
                                       "DeepOptimizerStates must receive a gradient before step() (leave unused "
                                       "parameters out of the optimizer). Nothing was updated")
                if g.layout != torch.strided or getattr(g, "is_sparse", False):
                    raise RuntimeError(f"{what} has a sparse gradient ({g.layout}): DeepOptimizerStates needs dense "
                                       "gradients (nn.Embedding(sparse=False)). Nothing was updated")
                if g.dtype != p.dtype or g.device != p.device or g.shape != p.shape:
                    raise RuntimeError(f"{what}: its gradient is {g.dtype} {tuple(g.shape)} on {g.device}, not like the "
                                       "parameter. Nothing was updated")
        return True

    def _global_norm(self, dtype):
        """L2 norm of every gradient, as a Python float: per parameter in ``dtype`` (as
        torch.nn.utils.clip_grad_norm_ does; one long fp32 reduction over a whole bucket was 2e-6
        off on torch 1.13's CPU), then over parameters in fp64. One synchronisation per bucket."""
        sq = 0.0
        for b in self._buckets:
            norms = [torch.linalg.vector_norm(v, 2, dtype=dtype) for v in self._grads(b) if v.numel() > 0]
            if norms:
                sq += float(torch.stack(norms).double().pow(2).sum())
        return math.sqrt(sq)

    def _grads(self, b):
        """The gradients of bucket ``b`` the runtime reads: the views of its flat buffer, or
        (``flat_gradients=False``) the parameters' ``.grad``."""
        return b.views if self.flat_gradients else [p.grad for p in b.params]

    def _hand_over_gradients(self, b):
        """``flat_gradients=False``: tells the runtime where the gradients of ``b`` are now (when
        they moved since it was last told). Raises :class:`DosError` as the C call does."""
        ptrs = [p.grad.data_ptr() if n else p.data_ptr() for p, n in zip(b.params, b.numels)]
        if ptrs != b.grad_ptrs:
            arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
            self._runtime_call(_capi.lib().dos_optimizer_set_gradients(b.handle, len(ptrs), arr),
                               f"handing the gradients of {b.describe()} to the runtime")
            b.grad_ptrs = ptrs

    def _gather_gradients(self):
        """Before a step: each gradient into its bucket's flat buffer (a no-op where backward
        accumulated into it already), or with ``flat_gradients=False`` made contiguous where
        autograd put it, and cloned where it shares memory with another gradient or a parameter
        (a tied gradient, overlapping views: the scaling and the runtime must see each element
        once, as with the flat buffers)."""
        if not self.flat_gradients:
            spans = []  # (device, start, end, kind, bucket, position) of every parameter and gradient
            for k, b in enumerate(self._buckets):
                for j, p in enumerate(b.params):
                    if not b.numels[j]:
                        continue
                    if not p.grad.is_contiguous():
                        p.grad = p.grad.contiguous()
                    size = b.numels[j] * p.element_size()
                    spans.append((str(p.device), p.data_ptr(), p.data_ptr() + size, 0, k, j))
                    spans.append((str(p.device), p.grad.data_ptr(), p.grad.data_ptr() + size, 1, k, j))
            spans.sort()
            shared = set()
            active = []  # the spans of the current device that reach past the current start
            for dev, start, stop, kind, k, j in spans:
                active = [a for a in active if a[0] == dev and a[2] > start]
                if active:  # overlaps each of them: every gradient involved is cloned
                    shared.update((a[4], a[5]) for a in active + [(dev, start, stop, kind, k, j)] if a[3] == 1)
                active.append((dev, start, stop, kind, k, j))
            for k, j in shared:
                p = self._buckets[k].params[j]
                p.grad = p.grad.clone()
            return
        for b in self._buckets:
            for j, p in enumerate(b.params):
                b.move_into_view(j, p)

    def _norm_and_clip(self, grad_scale):
        """The global gradient norm (float, unscaled by ``grad_scale``; None when neither clipping
        nor the non-finite check asks for it), the clipping coefficient (``max_grad_norm / (norm +
        1e-6)`` when below 1, as ``torch.nn.utils.clip_grad_norm_``; else 1.0) and whether the step
        is skipped (an inf or NaN gradient with ``skip_nonfinite``)."""
        grad_norm, clip, skipped = None, 1.0, False
        if self.max_grad_norm is not None or self.skip_nonfinite:
            total = self._global_norm(torch.float32)
            if not math.isfinite(total):
                nonfinite = any(not bool(torch.isfinite(g).all()) for b in self._buckets for g in self._grads(b))
                if nonfinite:
                    skipped = self.skip_nonfinite
                else:  # finite gradients whose squares overflow fp32
                    total = self._global_norm(torch.float64)
            grad_norm = total / grad_scale if grad_scale is not None else total
            if self.max_grad_norm is not None and math.isfinite(grad_norm):
                c = self.max_grad_norm / (grad_norm + 1e-6)
                if c < 1.0:
                    clip = c
        return grad_norm, clip, skipped

    def _scale_gradients(self, clip, grad_scale):
        """Multiplies every gradient by ``clip / grad_scale`` in place (nothing when that is 1); a
        bucket whose gradients were declared final (overlap) is marked to redo its speculation."""
        mult = clip / grad_scale if grad_scale is not None else clip
        if mult == 1.0:
            return
        for b in self._buckets:
            for g in ([b.flat_grad] if self.flat_gradients else self._grads(b)):
                g.mul_(mult)
            if b.open and b.changed is None:
                b.changed = ("this optimizer scaled the gradients after they were declared final "
                             + ("(clipping to max_grad_norm)" if clip != 1.0 else "(grad_scale)"))

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients. By default (``set_to_none=False``, unlike torch 2.x's default) the
        flat gradient buffers are zeroed in place and every ``p.grad`` that is not None points at its
        view, so that the next backward accumulates into them and :meth:`step` copies nothing (a
        ``p.grad`` that is None stays None, as with ``torch.optim``). With
        ``set_to_none=True`` every ``p.grad`` becomes None (backward then allocates new gradients,
        which a hook moves into the buffers as they come, or :meth:`step` where torch has no hook;
        with ``flat_gradients=False`` they stay where autograd puts them). With
        ``flat_gradients=False`` and ``set_to_none=False`` the gradients are zeroed where they are. A
        parameter frozen at construction gets None either way (it has no state to be updated with). With ``overlap=True``, updates speculated
        since the last step are dropped (nothing is updated)."""
        self._drop_open_phases()  # a backward's gradients are discarded: nothing speculated is kept
        for _, p in self._frozen:  # no state to update them with: None, whatever set_to_none
            p.grad = None
        # a phase left running (overlap_forward) may still read the flat buffers: not zeroed in place
        # (the gradients stay None, and a parameter that gets none before step() has a zero one then)
        to_none = set_to_none or any(b.running for b in self._buckets)
        for b in self._buckets:
            if set_to_none:
                b.grads_cleared = False  # None asked for: they stay None
            if to_none:
                for p in b.params:
                    p.grad = None
            elif not self.flat_gradients:
                for p in b.params:
                    if p.grad is not None:
                        p.grad.zero_()
            else:
                b.flat_grad.zero_()
                for p, v in zip(b.params, b.views):
                    # (a sparse gradient step() refused has no data pointer: replaced as well)
                    if p.grad is not None and (p.grad.layout != torch.strided or p.grad.data_ptr() != v.data_ptr()):
                        p.grad = v

