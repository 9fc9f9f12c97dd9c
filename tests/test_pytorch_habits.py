#!/usr/bin/env python3
"""Tests of the PyTorch binding (python/deep_optimizer_states) against what training frameworks do.

    test_pytorch_habits.py [--device cpu|cuda] [--policy POLICY]

Exits as tests/test_pytorch.py (77: skipped without torch, or with --device cuda without a GPU or
a CUDA worker), whose helpers and tolerances it uses.

What training frameworks do (the Hugging Face Trainer, PyTorch Lightning), against
torch.optim.AdamW and torch.optim.Adam with the same groups, 12 steps of a small model with
LayerNorm, an RMSNorm-like layer, biases and a tied head: param_groups_no_decay (which
parameters it decays), two groups with different weight decay and lr, model.zero_grad(
set_to_none=True), gradient accumulation over 3 micro-batches, torch.nn.utils.clip_grad_norm_
before step(), LambdaLR and CosineAnnealingLR changing lr between steps (scheduler state dicts
round-trip too). Losses within LOSS_RTOL relative at every step and parameters within
PARAM_RTOL; decaying the norms and biases too would differ by far more. Zeroing in place and
setting to None give bit-identical runs. Where torch has torch.compile (>= 2.0), the same through a
compiled model (backend aot_eager): against torch.optim.AdamW, and overlap=True bit for bit.
"""

import math
import os
import sys

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# test_pytorch: python/ and examples/ on the path, its batches, tolerances, check() and main()
from test_pytorch import (LOSS_RTOL, LOSS_RTOL_CUDA, PARAM_RTOL, batch, check, dos, expect_error,  # noqa: E402
                          main)


class ScaleRMSNorm(torch.nn.Module):
    """RMS normalisation with a learned scale (as Llama's LlamaRMSNorm): found by its class name."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Scale(torch.nn.Module):
    """A learned per-channel scale whose class name says nothing: found by its name (``post_norm``)."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.weight


class FrameNet(torch.nn.Module):
    """Embedding, MLP with LayerNorm, an RMSNorm, a scale called post_norm, head tied to the embedding."""

    def __init__(self, d=32, vocab=50):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.l1 = torch.nn.Linear(d, 2 * d)
        self.ln = torch.nn.LayerNorm(2 * d)
        self.l2 = torch.nn.Linear(2 * d, d)
        self.final = ScaleRMSNorm(d)
        self.post_norm = Scale(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied: one parameter, two modules

    def forward(self, x):
        h = self.emb(x)
        h = h + self.l2(torch.relu(self.ln(self.l1(h))))
        return self.head(self.post_norm(self.final(h)))


FRAME_NO_DECAY = {"l1.bias", "ln.weight", "ln.bias", "l2.bias", "final.weight", "post_norm.weight"}


def frame_run(kind, device, policy, set_to_none=True, sched="lambda", decay_all=False, steps=12, accum=3,
              compile_backend=None, opt_kw=None):
    """Trains FrameNet as a framework does: model.zero_grad(set_to_none), ``accum`` micro-batches
    with the loss divided by ``accum``, clip_grad_norm_(0.5), step(), scheduler.step(). Groups from
    param_groups_no_decay (weight decay 0.1; lr 2e-2 and 1e-2). kind: dos-adamw, dos-adam, adamw,
    adam. compile_backend: train through ``torch.compile(model, backend=compile_backend)`` (the
    optimizer over the model's own parameters, as frameworks do). opt_kw: more DeepOptimizerStates
    arguments. Returns (losses, per step the tuple of the groups' lr, grad norms before clipping,
    model, optimizer, scheduler)."""
    torch.manual_seed(5)
    m = FrameNet().to(device)
    fm = torch.compile(m, backend=compile_backend) if compile_backend else m
    groups = dos.param_groups_no_decay(m, 0.1)
    groups[0]["lr"], groups[1]["lr"] = 2e-2, 1e-2
    if decay_all:  # the mistake the grouping avoids: norms and biases decayed too
        groups[1]["weight_decay"] = 0.1
    common = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    if kind.startswith("dos"):
        opt = dos.DeepOptimizerStates(groups, decoupled=kind == "dos-adamw", subgroup_size=500, policy=policy, **common,
                                      **(opt_kw or {}))
    else:
        opt = (torch.optim.AdamW if kind == "adamw" else torch.optim.Adam)(groups, **common)
    if sched == "lambda":  # linear warm-up over 4 steps, then cosine decay
        sch = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 4) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    else:
        sch = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=1e-4)
    losses, lrs, norms = [], [], []
    for step in range(steps):
        m.zero_grad(set_to_none=set_to_none)
        total = 0.0
        for k in range(accum):
            x, y = batch(step * accum + k, device)
            loss = torch.nn.functional.cross_entropy(fm(x).reshape(-1, 50), y.reshape(-1)) / accum
            loss.backward()
            total += float(loss)
        norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)))
        lrs.append(tuple(g["lr"] for g in opt.param_groups))
        opt.step()
        sch.step()
        losses.append(total)
    return losses, lrs, norms, m, opt, sch


def param_rel_diff(ma, mb):
    return max(float((a.detach().double() - b.detach().double()).abs().max()) / max(float(b.detach().abs().max()), 1e-30)
               for a, b in zip(ma.parameters(), mb.parameters()))


def test_compiled_model(device, policy):
    """A ``torch.compile``d model (torch >= 2.0; backend ``aot_eager``: TorchDynamo's graphs and
    AOTAutograd's backward, no code generation, so that no compiler is needed) trained as frameworks
    do: the losses of torch.optim.AdamW on the same compiled model within the usual tolerance, and
    with ``overlap=True`` (gradient hooks under AOTAutograd) the same bits as without."""
    if not hasattr(torch, "compile"):
        print(f"torch {torch.__version__} has no torch.compile: the compiled-model check does not run here")
        return
    la, _, na, ma, oa, _ = frame_run("dos-adamw", device, policy, compile_backend="aot_eager")
    lb, _, _, mb, ob, _ = frame_run("adamw", device, policy, compile_backend="aot_eager")
    lc, _, _, mc, oc, _ = frame_run("dos-adamw", device, policy, compile_backend="aot_eager", opt_kw={"overlap": True})
    rel = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    tol = LOSS_RTOL_CUDA if device == "cuda" else LOSS_RTOL
    check(rel <= tol, f"torch.compile (aot_eager): losses within {tol:g} of torch.optim.AdamW on the compiled model "
          f"(largest {rel:.3e})")
    check(la == lc and all(torch.equal(a, c) for a, c in zip(ma.parameters(), mc.parameters())),
          "torch.compile (aot_eager) with overlap=True: the losses and parameters of overlap=False, bit for bit")
    check(oc.last_step is not None and oc.last_step.get("overlapped"),
          f"and the overlap ran (last step overlapped: {oc.last_step and oc.last_step.get('overlapped')})")
    oa.close()
    oc.close()


def test_framework_paths(device, policy):
    m = FrameNet()
    names = dos.no_decay_parameter_names(m)
    check(names == FRAME_NO_DECAY, f"no_decay_parameter_names: LayerNorm, an RMSNorm by class name, post_norm by name, "
          f"biases ({sorted(names)})")
    groups = dos.param_groups_no_decay(m, 0.1)
    named = {id(p): n for n, p in m.named_parameters()}
    check(len(groups) == 2 and groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
          and {named[id(p)] for p in groups[1]["params"]} == FRAME_NO_DECAY
          and {named[id(p)] for p in groups[0]["params"]} == {"emb.weight", "l1.weight", "l2.weight"},
          "param_groups_no_decay: embedding (tied head once) and Linear weights decayed, the rest not")
    m.l1.weight.requires_grad_(False)
    check(all(p is not m.l1.weight for g in dos.param_groups_no_decay(m, 0.1, lr=3e-4) for p in g["params"])
          and all(g["lr"] == 3e-4 for g in dos.param_groups_no_decay(m, 0.1, lr=3e-4)),
          "param_groups_no_decay leaves frozen parameters out and sets lr when asked")
    expect_error(ValueError, "weight_decay", lambda: dos.param_groups_no_decay(m, -0.1), "negative weight decay")
    expect_error(ValueError, "weight_decay", lambda: dos.param_groups_no_decay(m, float("nan")), "NaN weight decay")
    expect_error(ValueError, "lr", lambda: dos.param_groups_no_decay(m, 0.1, lr=float("inf")), "infinite lr")
    expect_error(TypeError, "torch.nn.Module", lambda: dos.param_groups_no_decay([m.l2.weight], 0.1),
                 "a list of tensors instead of a model")
    for p in m.parameters():
        p.requires_grad_(False)
    expect_error(ValueError, "no parameter that requires gradients", lambda: dos.param_groups_no_decay(m, 0.1),
                 "a model without trainable parameters")

    for dos_kind, ref_kind, sched in (("dos-adamw", "adamw", "lambda"), ("dos-adam", "adam", "cosine")):
        la, lra, na, ma, oa, sa = frame_run(dos_kind, device, policy, sched=sched)
        lb, lrb, nb, mb, ob, sb = frame_run(ref_kind, device, policy, sched=sched)
        rel = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
        prel = param_rel_diff(ma, mb)
        tol = LOSS_RTOL_CUDA if device == "cuda" else LOSS_RTOL
        print(f"{dos_kind} vs torch.optim.{ref_kind} ({sched}): losses {la[0]:.5f} -> {la[-1]:.5f}, largest relative "
              f"loss difference {rel:.3e}, parameters {prel:.3e}; grad norms {min(na):.3f}..{max(na):.3f}")
        check(lra == lrb and len(set(lra)) > 5, f"{sched} scheduler: the same lr sequence on both ({len(set(lra))} "
              "distinct)")
        check(all(len(g) == 2 for g in lra) and sum(g[0] != g[1] for g in lra) >= 10,
              f"and the two groups keep their own lr ({lra[2][0]:g} and {lra[2][1]:g} at step 3)")
        check(sum(n > 0.5 for n in na) >= 3, f"clipping active in {sum(n > 0.5 for n in na)} of 12 steps")
        check(rel <= tol, f"{dos_kind}: 2 groups, set_to_none, 3 micro-batches, clipping, {sched}: losses within {tol:g} "
              f"of torch.optim.{ref_kind}'s (largest {rel:.3e})")
        check(prel <= (LOSS_RTOL_CUDA if device == "cuda" else PARAM_RTOL),
              f"and parameters within {PARAM_RTOL:g} of them ({prel:.3e})")
        check(la[-1] < la[0], f"the loss decreases ({la[0]:.4f} -> {la[-1]:.4f})")
        sd = sa.state_dict()
        check(sd == sb.state_dict() or {k: v for k, v in sd.items() if k != "lr_lambdas"}
              == {k: v for k, v in sb.state_dict().items() if k != "lr_lambdas"},
              "the scheduler's state dict is the same as over torch's optimizer")
        oa.close()

    # the same run with the optimizer's zero_grad (in place into its buffers) and with
    # model.zero_grad(set_to_none=True): bit for bit
    la, _, _, ma, oa, _ = frame_run("dos-adamw", device, policy, set_to_none=True)
    lc, _, _, mc, oc, _ = frame_run("dos-adamw", device, policy, set_to_none=False)
    check(la == lc and all(torch.equal(a, c) for a, c in zip(ma.parameters(), mc.parameters())),
          "model.zero_grad(set_to_none=True) and zeroing in place: bit-identical losses and parameters")
    # after model.zero_grad(set_to_none=True) autograd allocates new gradients; where torch has a hook
    # for it, each is moved into the optimizer's flat buffer as soon as it is accumulated, so that the
    # model's gradients are not held twice until step()
    if dos.overlap._grad_hook_kind() is not None:
        ma.zero_grad(set_to_none=True)
        x, y = batch(0, device)
        torch.nn.functional.cross_entropy(ma(x).reshape(-1, 50), y.reshape(-1)).backward()
        spans = [(b.flat_grad.data_ptr(), b.flat_grad.data_ptr() + b.flat_grad.numel() * b.flat_grad.element_size())
                 for b in oa._buckets]
        grads = [p.grad for p in ma.parameters() if p.grad is not None]
        check(grads and all(any(lo <= g.data_ptr() < hi for lo, hi in spans) for g in grads),
              f"after model.zero_grad(set_to_none=True) and backward, before step(): every gradient ({len(grads)}) "
              "lies in the optimizer's flat buffers")
    # decaying every parameter is told apart from the grouped reference
    _, _, _, mb, ob, _ = frame_run("adamw", device, policy)
    _, _, _, md, od, _ = frame_run("dos-adamw", device, policy, decay_all=True)
    wrong = param_rel_diff(md, mb)
    check(wrong > 100 * PARAM_RTOL, f"decaying norms and biases too differs from the grouped reference "
          f"({wrong:.3e} > {100 * PARAM_RTOL:g}): the comparison sees the groups")
    for o in (oa, oc, od):
        o.close()


if __name__ == "__main__":
    sys.exit(main([test_framework_paths, test_compiled_model]))
