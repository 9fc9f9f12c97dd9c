"""ZeRO-Offload's recipe as a ``torch.optim.Optimizer`` for training frameworks: the run to compare
``DeepOptimizerStates`` with under the Hugging Face Trainer or Lightning (``examples/hf_trainer.py
--optimizer adamw-cpu-offload``, ``scripts/gpu-trainer-speed.sh``). Imports torch and
``baselines.adam_impl`` only, so that it loads as a file beside ``baselines.py`` too
(``tests/test_zero_offload.py``).
"""

import torch

try:
    from .baselines import adam_impl
except ImportError:  # loaded as a file, beside baselines.py, not as part of the package
    from baselines import adam_impl


class ZeroOffloadAdamW(torch.optim.Optimizer):
    """ZeRO-Offload's recipe, re-created sequentially in PyTorch, as a ``torch.optim.Optimizer``
    that training frameworks accept (the Hugging Face Trainer's ``optimizers=(opt, scheduler)``, a
    Lightning module's ``configure_optimizers``): the run to compare ``DeepOptimizerStates`` with
    under a framework. Unlike DeepSpeed's implementation, its copies do not overlap backward (they
    run in :meth:`step`, one tensor after another, then a device-wide wait) and the CPU update is
    torch's AdamW, not DeepSpeed's CPU Adam: a plain PyTorch baseline, not DeepSpeed's speed.

    ``params``: parameters or param groups, as ``torch.optim.AdamW`` takes them; floating point
    (fp32, bf16 or fp16), all on one device. Group options ``lr``, ``betas``, ``eps`` and
    ``weight_decay`` (AdamW's decoupled decay) as ``torch.optim.AdamW``'s; a scheduler may change
    them between steps. The fp32 master copy of every parameter and AdamW's ``exp_avg`` and
    ``exp_avg_sq`` live in host memory (the masters, the gradient buffers and the staging buffers
    page-locked when the parameters are on a CUDA device; the moments, which no copy reads, in
    ordinary memory). Each :meth:`step` copies every gradient into an fp32 host buffer (16-bit
    gradients are converted to fp32 on their device first), waits for the copies, runs
    ``torch.optim.AdamW`` on the host (``fused`` where this torch has the CPU kernel, else
    ``foreach``) with each group's current hyper-parameters, and copies the new parameters back
    (rounded to the parameter's dtype on the host). A parameter whose ``grad`` is None is left as it
    is, as ``torch.optim.AdamW`` does.

    The masters are read from the parameters when the optimizer is made and by
    :meth:`load_state_dict`; a change to the parameters made otherwise (``model.load_state_dict``
    after the optimizer was built) is overwritten by the next :meth:`step` unless
    :meth:`refresh_masters` is called first.

    Host memory: 12 bytes per parameter (master, ``exp_avg``, ``exp_avg_sq``) plus an fp32
    gradient buffer (4 bytes) and, for 16-bit parameters, a 16-bit staging buffer (2 bytes).

    ``state_dict()`` is ``torch.optim``'s format (``state`` per parameter index: ``step``,
    ``exp_avg``, ``exp_avg_sq`` as host tensors; ``param_groups``) plus, for 16-bit parameters,
    ``master`` (index -> fp32 host tensor): on torch >= 2.0, ``torch.load(..., weights_only=True)``
    reads it back, and :meth:`load_state_dict` resumes bit for bit.

    Raises ``ValueError`` when the parameters are not floating point or lie on several devices, and
    whatever ``torch.optim.AdamW`` raises for its options (a negative ``lr``, betas outside
    [0, 1)); ``add_param_group`` after construction raises ``RuntimeError``."""

    _HYPER = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self._built = False
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        ps = [p for g in self.param_groups for p in g["params"]]
        devices = {p.device for p in ps}
        if len(devices) > 1:
            raise ValueError(f"the parameters lie on several devices ({', '.join(sorted(map(str, devices)))}): "
                             "give ZeroOffloadAdamW the parameters of one device")
        bad = [tuple(p.shape) for p in ps if not p.is_floating_point()]
        if bad:
            raise ValueError(f"parameters of shapes {bad[:3]} are not floating point: AdamW needs float parameters")
        self._device = ps[0].device if ps else torch.device("cpu")
        self._cuda = self._device.type == "cuda"
        pin = self._cuda

        def host(like, dtype):
            return torch.empty(like.shape, dtype=dtype, pin_memory=pin)

        self._masters, self._grads, self._staging = [], [], []
        host_groups = []
        for g in self.param_groups:
            ms = []
            for p in g["params"]:
                m = host(p, torch.float32)
                m.copy_(p.detach())
                self._masters.append(m)
                self._grads.append(host(p, torch.float32))
                self._staging.append(host(p, p.dtype) if p.dtype != torch.float32 else None)
                ms.append(m)
            host_groups.append(dict(params=ms, **{k: g[k] for k in self._HYPER}))
        impl = adam_impl("cpu")
        self._host = torch.optim.AdamW(host_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       **{impl: True})
        self._built = True

    def add_param_group(self, param_group):
        """torch.optim's, during construction only; afterwards raises ``RuntimeError`` (the host
        buffers are made once: build a new optimizer over every group instead)."""
        if getattr(self, "_built", False):
            raise RuntimeError("ZeroOffloadAdamW cannot take a param group after construction: build a new "
                               "optimizer over every group")
        super().add_param_group(param_group)

    def _pairs(self):
        """(parameter, master index) for every parameter, group by group."""
        i = 0
        for g in self.param_groups:
            for p in g["params"]:
                yield p, i
                i += 1

    def _sync(self):
        """Waits for every copy queued on the parameters' device (nothing to do on the CPU)."""
        if self._cuda:
            torch.cuda.synchronize(self._device)

    @torch.no_grad()
    def refresh_masters(self):
        """Reads every fp32 master again from its parameter (after the parameters were changed
        outside :meth:`step`); the Adam moments stay as they are."""
        self._sync()
        for p, i in self._pairs():
            self._masters[i].copy_(p.detach())

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW update of every parameter that has a gradient (see the class); returns what
        ``closure`` (called with gradients enabled first, when given) returns, else None."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g, hg in zip(self.param_groups, self._host.param_groups):
            for k in self._HYPER:
                hg[k] = g[k]
        for p, i in self._pairs():
            m = self._masters[i]
            if p.grad is None:
                m.grad = None
                continue
            gr = p.grad if p.grad.dtype == torch.float32 else p.grad.float()
            self._grads[i].copy_(gr, non_blocking=self._cuda)
            m.grad = self._grads[i]
        self._sync()
        self._host.step()
        # the host buffers are not written again before the next step's synchronisation (or
        # state_dict's, load_state_dict's, refresh_masters'), which follows these copies on the stream
        for p, i in self._pairs():
            if p.grad is None:
                continue
            src = self._masters[i]
            if self._staging[i] is not None:
                self._staging[i].copy_(src)
                src = self._staging[i]
            p.copy_(src, non_blocking=self._cuda)
        return loss

    def state_dict(self):
        """``torch.optim``'s state dict of the host AdamW under this optimizer's param groups, plus
        ``master`` (index -> fp32 host tensor) when the parameters are 16-bit. Tensors are the live
        host buffers: copy them (``torch.save`` does) before the next step."""
        self._sync()
        sd = super().state_dict()
        sd["state"] = self._host.state_dict()["state"]
        if any(s is not None for s in self._staging):
            sd["master"] = {i: m for i, m in enumerate(self._masters)}
        return sd

    def load_state_dict(self, state_dict):
        """Restores what :meth:`state_dict` returned (groups, AdamW state and, when present, the fp32
        masters; without ``master`` the masters are read from the parameters). Raises
        ``ValueError``, changing nothing, when ``state`` is missing or names a parameter this
        optimizer lacks, a moment or master has another shape than its parameter, or the groups do
        not match this optimizer's (torch's own check)."""
        sd = dict(state_dict)
        masters = sd.pop("master", None)
        if "state" not in sd or "param_groups" not in sd:
            raise ValueError("not a ZeroOffloadAdamW state dict: 'state' or 'param_groups' is missing")
        shapes = [tuple(m.shape) for m in self._masters]
        try:  # keys as torch writes them (ints), or as text formats give them back (strings)
            sd["state"] = {int(k): v for k, v in sd["state"].items()}
        except (TypeError, ValueError, AttributeError):
            raise ValueError("the state dict's 'state' is not a mapping of parameter indices") from None
        for i, st in sd["state"].items():
            if not 0 <= i < len(shapes):
                raise ValueError(f"the state dict has state for parameter {i}, which this optimizer lacks (it has "
                                 f"{len(shapes)})")
            for name in ("exp_avg", "exp_avg_sq"):
                if name in st and not isinstance(st[name], torch.Tensor):
                    raise ValueError(f"{name} of parameter {i} is a {type(st[name]).__name__}, not a tensor")
                if name in st and tuple(st[name].shape) != shapes[i]:
                    raise ValueError(f"{name} of parameter {i} has shape {tuple(st[name].shape)}, the parameter "
                                     f"{shapes[i]}: a state dict of another model")
        self._sync()  # the copies of the last step read the masters and staging buffers
        sources = []
        for p, i in self._pairs():
            src = masters.get(i, masters.get(str(i))) if masters is not None else None
            src = p.detach() if src is None else src
            if tuple(src.shape) != shapes[i]:
                raise ValueError(f"master {i} has shape {tuple(src.shape)}, the parameter "
                                 f"{shapes[i]}: a state dict of another model")
            sources.append(src)
        super().load_state_dict(dict(sd, state={}))
        host_sd = self._host.state_dict()
        self._host.load_state_dict(dict(state=sd["state"], param_groups=[
            dict(hg, **{k: g[k] for k in self._HYPER}) for hg, g in zip(host_sd["param_groups"], self.param_groups)]))
        with torch.no_grad():
            for i, src in enumerate(sources):
                self._masters[i].copy_(src)
