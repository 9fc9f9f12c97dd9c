"""The torch.optim.AdamW optimizers that ``train_gpt.py`` measures the runtime against, with the
interface it drives (``zero_grad``, ``step(grad_scale)``, ``param_groups``, ``skipped_steps``,
``last_step``): :class:`MasterAdamW`, AdamW over fp32 master copies of a 16-bit model on the GPU or,
offloaded, in pinned host memory (ZeRO-Offload's recipe); :class:`PlainAdamW`, AdamW directly on
fp32 parameters. Shapes: every parameter any shape, its gradient the same shape and dtype; errors
are torch's."""
import math

import torch
import torch.nn as nn


class MasterAdamW:
    """torch.optim.AdamW over fp32 master copies of a 16-bit model, on ``device`` (the model's, or
    the CPU with pinned buffers: ZeRO-Offload's recipe). One flat master tensor; gradients are
    converted to fp32 on the model's device and copied (D2H when offloaded); the new 16-bit
    parameters are made where the master lives and copied back (H2D when offloaded)."""

    def __init__(self, params, device, lr, betas, eps, weight_decay, max_grad_norm):
        self.params = list(params)
        self.model_device = self.params[0].device
        self.dtype = self.params[0].dtype
        self.device = torch.device(device)
        pin = self.device.type == "cpu" and self.model_device.type == "cuda"
        n = sum(p.numel() for p in self.params)
        self.master = torch.empty(n, dtype=torch.float32, device=self.device, pin_memory=pin)
        torch.cat([p.detach().reshape(-1).float().to(self.device) for p in self.params], out=self.master)
        self.mp = nn.Parameter(self.master)
        self.mp.grad = torch.zeros(n, dtype=torch.float32, device=self.device, pin_memory=pin)
        self.p16 = torch.empty(n, dtype=self.dtype, device=self.device, pin_memory=pin) if pin else None
        kw = {}
        if self.device.type == "cuda" or tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4):
            kw["fused"] = True
        try:
            self.opt = torch.optim.AdamW([self.mp], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kw)
        except (RuntimeError, TypeError, ValueError):
            self.opt = torch.optim.AdamW([self.mp], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.param_groups = self.opt.param_groups
        self.max_grad_norm = max_grad_norm
        self.skipped_steps = 0
        self.last_step = None

    def zero_grad(self, set_to_none=True):
        """Drops the model's gradients (set to None)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, grad_scale=None):
        """One update: gradients (divided by grad_scale) to fp32 where the master lives, global norm,
        clipping, a skipped step on inf/NaN, AdamW, the new 16-bit parameters back into the model."""
        g = torch.cat([p.grad.reshape(-1) for p in self.params]).float()
        if grad_scale:
            g.mul_(1.0 / grad_scale)
        self.mp.grad.copy_(g, non_blocking=True)
        if self.model_device.type == "cuda":
            torch.cuda.synchronize()
        norm = torch.linalg.vector_norm(self.mp.grad, 2)
        normf = float(norm)
        skipped = not math.isfinite(normf)
        clip = 1.0
        if not skipped:
            if self.max_grad_norm and normf > 0:
                clip = min(1.0, self.max_grad_norm / (normf + 1e-6))
                if clip < 1.0:
                    self.mp.grad.mul_(clip)
            self.opt.step()
            if self.p16 is not None:
                self.p16.copy_(self.master)
                src = self.p16.to(self.model_device, non_blocking=True)
            else:
                src = self.master
            off = 0
            for p in self.params:
                n = p.numel()
                p.copy_(src[off:off + n].view_as(p))
                off += n
            if self.model_device.type == "cuda":
                torch.cuda.synchronize()
        else:
            self.skipped_steps += 1
        self.last_step = dict(skipped=skipped, grad_norm=normf, clip_coef=clip)


class PlainAdamW:
    """torch.optim.AdamW directly on fp32 parameters, with torch.nn.utils.clip_grad_norm_."""

    def __init__(self, params, lr, betas, eps, weight_decay, max_grad_norm):
        self.params = list(params)
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.param_groups = self.opt.param_groups
        self.max_grad_norm = max_grad_norm
        self.skipped_steps = 0
        self.last_step = None

    def zero_grad(self, set_to_none=True):
        """As torch.optim.Optimizer.zero_grad."""
        self.opt.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, grad_scale=None):
        """Unscale, clip (torch.nn.utils.clip_grad_norm_), skip on inf/NaN, AdamW."""
        if grad_scale:
            for p in self.params:
                p.grad.mul_(1.0 / grad_scale)
        if self.max_grad_norm:
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in self.params])))
        skipped = not math.isfinite(norm)
        if skipped:
            self.skipped_steps += 1
        else:
            self.opt.step()
        self.last_step = dict(skipped=skipped, grad_norm=norm, clip_coef=1.0)
