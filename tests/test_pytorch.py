#!/usr/bin/env python3
"""Tests of the PyTorch binding (python/deep_optimizer_states) through the C ABI.

    test_pytorch.py [--device cpu|cuda] [--policy POLICY]

Exits 77 (meson's "skip") when torch cannot be imported, or with --device cuda when torch sees no
GPU or the runtime has no CUDA worker.

1. Losses against torch.optim.AdamW: examples/train_gpt.py's builtin GPT (2 layers, hidden 64,
   context 64, batch 8, fp32, byte-level tokens of the Python standard library's sources) trained 50
   steps with --optimizer dos and with --optimizer adamw (torch.optim.AdamW on the same device,
   torch.nn.utils.clip_grad_norm_), same seed, warm-up 10 steps (so that learning-rate changes
   through param_groups are exercised) and clipping at 1.0 (active in the first steps). The
   per-step losses must agree within LOSS_RTOL relative over the first 20 steps and LOSS_RTOL_LATE after (see their comment).
2. Bad input, each with a clear error and nothing changed (parameters and optimizer state
   compared bit for bit before and after): parameters that do not require gradients, sparse
   gradients, a parameter whose dtype changes between steps, one parameter's gradient missing, an
   int32 tensor (named by its dtype), lr or weight decay beyond float32, subgroup_size=2**70,
   pickling or copying the optimizer, load_state_dict from a different model, from
   torch.optim.AdamW, with a step count that is negative, 2**63-1, 2**64 or a bool, NaN in master, a
   negative exp_avg_sq; step() with no gradient at all changes nothing (as torch.optim);
   gradients holding inf/NaN skip the step (counted); a power-of-2 grad_scale gives the same bits
   as no scaling; unsupported options refused.
3. One parameter given to two optimizers, stepped in turn (and one of them closed), against two
   torch.optim.AdamW.
4. Framework wrappers dropped while the optimizer trains on (both of Lightning's forms).
5. The per-bucket stats dicts of last_step["stats"]: every field of dos_step_stats, C ABI 14's
   gradient download figures last (longest_download_seconds float, longest_download_bytes and
   downloads_dodge_writebacks int); with the model on the CPU no download, so 0.0 and 0, and
   downloads_dodge_writebacks 1 only under DOS_COPY_BY=auto; on the GPU (policy dos, default copy
   rule, not turned) a download by the copy engine exactly in the phases that update a subgroup on
   the CPU, no larger than one subgroup's fp32 gradients, under the plan dos chooses and under one
   with every update on the CPU (gpu_update_budget=1), so that some phase has such a download.
What training frameworks do (parameter groups, accumulation, clipping, schedulers, torch.compile):
tests/test_pytorch_habits.py. The state dict's round trip and torch.load(weights_only=True):
tests/test_pytorch_state.py; code
written against torch.optim.AdamW (its option keywords, param_groups edited by hand):
tests/test_pytorch_options.py;
examples/train_gpt.py's argument checks: tests/test_train_gpt_args.py.
"""

import argparse
import copy
import ctypes
import gc
import math
import os
import pickle
import sys
import time

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import deep_optimizer_states as dos  # noqa: E402
import train_gpt  # noqa: E402

# Tolerance of the loss comparison, relative: |loss_dos - loss_adamw| <= tolerance * loss_adamw per
# step, the tolerances below. Both optimizers apply AdamW's formula in fp32 to the same fp32
# parameters and clip with the same formula; they differ only in rounding: the runtime computes
# exp_avg with lerp (PyTorch >= 2.0's single-tensor order) where torch 1.13 multiplies and adds, and
# the clipping norm is summed in another order. Such 1-ulp differences are amplified by training's
# chaotic dynamics: torch.optim.AdamW against itself with lr * (1 + 1e-6) differs by up to 1.1e-4
# within 50 steps (1.1e-5 with lr * (1 + 1e-7)).
# Measured on the CI machine (torch 1.13, CPU, at the commit that set this): largest relative
# difference 4.0e-6 (steps 1-20: 1.0e-7). The bound, 1e-4, is 25x that and what a 1e-6 relative
# perturbation reaches; the errors a binding could make stand well above it within 20 steps (same
# machine, same run, relative loss difference by step 20): no clipping 3.9e-2, warm-up off by one
# step 4.6e-2, lr 1% off 1.1e-2, eps 1e-6 instead of 1e-8 2.0e-3, beta2 0.951 instead of 0.95
# 5.5e-4 (only weight decay 1% off, 5.7e-5 by step 30, is below it).
# On the GPU machine's torch 2.11 (CPU device, same test) the largest difference over 50 steps was
# 2.2e-4 (2026-11-30): the chaotic growth of rounding differences crosses 1e-4 late in the run. So
# the bound is LOSS_RTOL over the first LOSS_TIGHT_STEPS steps, where every error above shows, and
# LOSS_RTOL_LATE afterwards, where only the chaos floor (1.1e-4 for a 1e-6 perturbation) matters.
# On CUDA (torch 2.x, foreach/fused AdamW, cuBLAS and attention kernels whose backward may use
# atomics) rounding differs more: LOSS_RTOL_CUDA = 1e-3 at every step (passed on the H200).
LOSS_RTOL = 1e-4
LOSS_TIGHT_STEPS = 20
LOSS_RTOL_LATE = 1e-3
LOSS_RTOL_CUDA = 1e-3

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def expect_error(exc_type, needle, fn, what):
    try:
        fn()
    except exc_type as e:
        msg = str(e)
        check(needle.lower() in msg.lower(), f"{what}: {exc_type.__name__} saying '{needle}' ({msg[:160]})")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: expected {exc_type.__name__}, got {type(e).__name__}: {e}")
        return
    check(False, f"{what}: no error raised")


def snapshot(model, opt):
    """Bit-exact copies of the parameters and the whole optimizer state."""
    params = [p.detach().clone() for p in model.parameters()]
    sd = opt.state_dict()
    st = {i: {k: v.clone() for k, v in d.items()} for i, d in sd["state"].items()}
    return params, st, copy.deepcopy(sd["dos"])


def same_snapshot(a, b):
    pa, sa, da = a
    pb, sb, db = b
    if len(pa) != len(pb) or any(x.dtype != y.dtype or not torch.equal(x, y) for x, y in zip(pa, pb)):
        return False
    if sa.keys() != sb.keys():
        return False
    for i in sa:
        for k in sa[i]:
            if not torch.equal(sa[i][k], sb[i][k]):
                return False
    return da == db


def tiny_args(optimizer, device, policy, steps=50):
    return ["--model", "builtin", "--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--seq-len", "64",
            "--batch-size", "8", "--steps", str(steps), "--lr", "3e-3", "--warmup", "10", "--max-grad-norm", "1.0",
            "--weight-decay", "0.1", "--corpus-mb", "2", "--seed", "7", "--optimizer", optimizer,
            "--policy", policy, "--device", device, "--dtype", "fp32", "--subgroup-size", "20000",
            "--print-every", "10"]


def test_losses_match_adamw(device, policy):
    t0 = time.time()
    r_dos = train_gpt.main(tiny_args("dos", device, policy))
    r_ref = train_gpt.main(tiny_args("adamw", device, policy))
    a, b = r_dos["losses"], r_ref["losses"]
    rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
    worst = max(range(len(rel)), key=lambda i: rel[i])
    print(f"losses: dos {a[0]:.6f} -> {a[-1]:.6f}, adamw {b[0]:.6f} -> {b[-1]:.6f}; largest relative difference "
          f"{rel[worst]:.3e} at step {worst + 1} (dos {a[worst]:.7f}, adamw {b[worst]:.7f}); first 10 steps "
          f"{max(rel[:10]):.3e}; {time.time() - t0:.1f} s")
    check(len(a) == 50 and all(math.isfinite(x) for x in a), "50 finite losses with dos")
    if device == "cuda":
        check(max(rel) <= LOSS_RTOL_CUDA, f"dos losses within {LOSS_RTOL_CUDA:g} relative of torch.optim.AdamW's "
              f"over 50 steps (largest {max(rel):.3e})")
    else:
        early, late = rel[:LOSS_TIGHT_STEPS], rel[LOSS_TIGHT_STEPS:]
        check(max(early) <= LOSS_RTOL, f"dos losses within {LOSS_RTOL:g} relative of torch.optim.AdamW's over "
              f"steps 1-{LOSS_TIGHT_STEPS} (largest {max(early):.3e})")
        check(max(late) <= LOSS_RTOL_LATE, f"and within {LOSS_RTOL_LATE:g} over steps {LOSS_TIGHT_STEPS + 1}-50 "
              f"(largest {max(late):.3e})")
    check(a[-1] < a[0] - 0.5, f"the loss decreases ({a[0]:.3f} -> {a[-1]:.3f})")
    opt = r_dos["optimizer"]
    check(opt.steps_taken == 50 and opt.skipped_steps == 0, "50 update phases, none skipped")
    check(opt.num_subgroups > 3, f"several subgroups ({opt.num_subgroups}) spanning tensors")
    opt.close()


class Net(torch.nn.Module):
    """A small model with layers of several shapes, one bias-free."""

    def __init__(self, d=24, vocab=50, sparse=False):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d, sparse=sparse)
        self.l1 = torch.nn.Linear(d, 3 * d)
        self.ln = torch.nn.LayerNorm(3 * d)
        self.l2 = torch.nn.Linear(3 * d, vocab, bias=False)

    def forward(self, x):
        return self.l2(self.ln(torch.relu(self.l1(self.emb(x)))))


def batch(step, device, vocab=50):
    g = torch.Generator()
    g.manual_seed(1000 + step)
    x = torch.randint(0, vocab, (16, 12), generator=g)
    return x.to(device), ((x * 7 + 3) % vocab).to(device)


def train_steps(model, opt, steps, device, **kw):
    losses = []
    for s in steps:
        x, y = batch(s, device)
        loss = torch.nn.functional.cross_entropy(model(x).float().reshape(-1, 50), y.reshape(-1))
        loss.backward()
        opt.step(**kw)
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def make_opt(model, policy, **kw):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() == 2)]
    args = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, subgroup_size=700, policy=policy, max_grad_norm=0.5)
    args.update(kw)
    return dos.DeepOptimizerStates([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                                   **args)


def make_model(device, dtype, seed=3, **kw):
    torch.manual_seed(seed)
    return Net(**kw).to(device=device, dtype=dtype)


def test_bad_input(device, policy):
    m = make_model(device, torch.float32)
    expect_error(ValueError, "amsgrad",
                 lambda: dos.DeepOptimizerStates([{"params": [m.l2.weight], "amsgrad": True}], policy=policy),
                 "amsgrad=True")
    expect_error(ValueError, "appears more than once",
                 lambda: dos.DeepOptimizerStates([m.l2.weight, m.l2.weight], policy=policy), "a duplicated parameter")
    expect_error(ValueError, "runtime already runs",
                 lambda: dos.DeepOptimizerStates([m.l2.weight], policy="dmda" if policy != "dmda" else "cpu"),
                 "a second policy in one process")
    expect_error(ValueError, "learning rate", lambda: dos.DeepOptimizerStates([m.l2.weight], lr=-1, policy=policy),
                 "a negative learning rate")
    expect_error(ValueError, "overflows float32", lambda: dos.DeepOptimizerStates([m.l2.weight], lr=1e300, policy=policy),
                 "lr=1e300")
    expect_error(ValueError, "overflows float32",
                 lambda: dos.DeepOptimizerStates([m.l2.weight], weight_decay=1e300, policy=policy), "weight_decay=1e300")
    expect_error(ValueError, "rounds to 0 in float32",  # a zero gradient's update would be 0 / 0
                 lambda: dos.DeepOptimizerStates([m.l2.weight], eps=1e-50, policy=policy), "eps=1e-50")
    expect_error(ValueError, "first step's step size",  # 1e38 / (1 - 0.9) = 1e39: the first step's inf
                 lambda: dos.DeepOptimizerStates([m.l2.weight], lr=1e38, policy=policy), "lr=1e38")
    expect_error(ValueError, "[1, 2**53]",
                 lambda: dos.DeepOptimizerStates([m.l2.weight], subgroup_size=2 ** 70, policy=policy),
                 "subgroup_size=2**70")
    # switches and counts of the wrong type: refused by name, not read by their truth or truncated
    # (a string "False" would otherwise run AdamW)
    for kw, needle in ((dict(decoupled="False"), "decoupled must be True or False"),
                       (dict(overlap="no"), "overlap must be True or False"),
                       (dict(skip_nonfinite=0), "skip_nonfinite must be True or False"),
                       (dict(verbose="yes"), "verbose must be True or False"),
                       (dict(max_grad_norm="x"), "max_grad_norm must be"),
                       (dict(cpu_threads=-1), "cpu_threads must be an integer"),
                       (dict(cpu_threads=100000), "cpu_threads must be an integer"),
                       (dict(cpu_workers=1.5), "cpu_workers must be an integer"),
                       (dict(policy=""), "policy must be None (the default) or a policy's name"),
                       (dict(ncuda=-5), "ncuda must be an integer"),
                       (dict(policy=5), "policy must be None (the default) or a policy's name")):
        expect_error(ValueError, needle, lambda: dos.DeepOptimizerStates([m.l2.weight], **{"policy": policy, **kw}),
                     f"{kw}")
    expect_error(ValueError, "param group 0: decoupled must be True",
                 lambda: dos.DeepOptimizerStates([{"params": [m.l2.weight], "decoupled": "False"}], policy=policy),
                 "a param group's decoupled='False'")
    doubles = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64, device=device))  # trained: its dtype matters
    expect_error(ValueError, "dtype torch.float64 is not supported",
                 lambda: dos.DeepOptimizerStates([doubles], policy=policy), "a float64 parameter")
    ints = torch.zeros(4, dtype=torch.int32, device=device)  # requires no gradient: frozen, and alone
    expect_error(ValueError, "every parameter given is frozen",
                 lambda: dos.DeepOptimizerStates([ints], policy=policy), "an int32 tensor alone")

    # sparse gradients
    m = make_model(device, torch.float32, sparse=True)
    o = make_opt(m, policy)
    before = snapshot(m, o)
    o.zero_grad(set_to_none=True)  # as torch 2.x's default and nn.Module.zero_grad() do
    x, y = batch(1, device)
    torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
    check(m.emb.weight.grad.is_sparse, "nn.Embedding(sparse=True) gives a sparse gradient")
    expect_error(RuntimeError, "sparse gradient", o.step, "a sparse gradient")
    check(same_snapshot(before, snapshot(m, o)), "after the sparse-gradient error: parameters and state unchanged")
    o.close()

    # a parameter whose dtype changes between steps
    m = make_model(device, torch.float32)
    o = make_opt(m, policy)
    train_steps(m, o, [1], device)
    state_before = snapshot(m, o)[1:]
    m.to(torch.float64)
    x, y = batch(2, device)
    torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
    expect_error(RuntimeError, "changed dtype", o.step, "a parameter converted from fp32 to fp64 after one step")
    after = snapshot(m, o)
    check(same_snapshot((after[0],) + state_before, after), "after the dtype error: optimizer state unchanged")
    check(o.subgroup_steps() == [[1] * len(s) for s in o.subgroup_steps()], "and no step count advanced")
    o.close()

    # no gradient at all: as torch.optim, step() changes nothing (a fresh optimizer, and after
    # zero_grad(set_to_none=True)); some parameters without a gradient: refused
    m = make_model(device, torch.float32)
    o = make_opt(m, policy)
    before = snapshot(m, o)
    o.step()
    check(o.last_step["skipped"] and o.last_step.get("no_gradients") and same_snapshot(before, snapshot(m, o)),
          "step() before any backward: parameters, state and step counts unchanged (as torch.optim.AdamW)")
    o.zero_grad(set_to_none=True)
    o.step()
    check(same_snapshot(before, snapshot(m, o)), "step() after zero_grad(set_to_none=True): nothing changed")
    x, y = batch(4, device)
    torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
    m.l1.bias.grad = None
    expect_error(RuntimeError, "has no gradient", o.step, "step() with one parameter's gradient missing")
    check(same_snapshot(before, snapshot(m, o)), "after the missing-gradient error: nothing changed")
    o.zero_grad(set_to_none=True)

    # the optimizer cannot be pickled or copied (its state lives in the runtime)
    expect_error(TypeError, "cannot be pickled or copied", lambda: pickle.dumps(o), "pickle.dumps(optimizer)")
    expect_error(TypeError, "cannot be pickled or copied", lambda: copy.deepcopy(o), "copy.deepcopy(optimizer)")
    expect_error(TypeError, "cannot be pickled or copied", lambda: copy.copy(o), "copy.copy(optimizer)")

    # load_state_dict from a different model, or not one of ours
    other = Net(d=16).to(device)
    o_other = make_opt(other, policy)
    sd_other = o_other.state_dict()
    expect_error(ValueError, "different model", lambda: o.load_state_dict(sd_other), "load_state_dict of another model")
    check(same_snapshot(before, snapshot(m, o)), "after the wrong state dict: parameters and state unchanged")
    ref = torch.optim.AdamW(other.parameters())
    expect_error(ValueError, "not a DeepOptimizerStates state dict", lambda: o.load_state_dict(ref.state_dict()),
                 "load_state_dict of torch.optim.AdamW")
    # (an optimizer that has updated nothing has an empty "state": the damaged tensors come from a
    # twin that has stepped, over a model of the same shapes)
    mt = make_model(device, torch.float32)
    twin = make_opt(mt, policy)
    train_steps(mt, twin, [1], device)
    full_sd = twin.state_dict
    sd = full_sd()
    sd["dos"]["buckets"][0]["subgroup_steps"][0] = -1
    expect_error(ValueError, "integers >= 0", lambda: o.load_state_dict(sd), "a negative step count")
    sd = full_sd()
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].double()
    expect_error(ValueError, "expected torch.float32", lambda: o.load_state_dict(sd), "an fp64 state tensor")
    for bad_step in (2 ** 63 - 1, 2 ** 64, True):
        sd = full_sd()
        sd["dos"]["buckets"][0]["subgroup_steps"][0] = bad_step
        expect_error(ValueError, "at most 2**53", lambda: o.load_state_dict(sd), f"a step count of {bad_step}")
    sd = full_sd()
    sd["state"][0]["master"].view(-1)[3] = float("nan")
    expect_error(ValueError, "'master' of parameter 0 holds nan at element 3", lambda: o.load_state_dict(sd),
                 "NaN in master")
    sd = full_sd()
    sd["state"][1]["exp_avg_sq"].view(-1)[0] = -1.0
    expect_error(ValueError, "exp_avg_sq must be finite and >= 0", lambda: o.load_state_dict(sd),
                 "-1 in exp_avg_sq")
    sd = full_sd()
    sd["dos"]["steps_taken"] = -1
    expect_error(ValueError, "steps_taken must be an integer", lambda: o.load_state_dict(sd), "steps_taken -1")
    check(same_snapshot(before, snapshot(m, o)), "after the refused state dicts: parameters and state unchanged")
    o_other.close()
    twin.close()

    # inf/NaN gradients: the step is skipped and counted
    x, y = batch(3, device)
    torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
    m.l1.weight.grad[0, 0] = float("nan")
    o.step()
    check(o.last_step["skipped"] and o.skipped_steps == 1, "a NaN gradient skips the step and counts it")
    check(same_snapshot(before[:2] + (dict(before[2], skipped_steps=1),), snapshot(m, o)),
          "after the skipped step: parameters and state unchanged, step counts unchanged")
    o.zero_grad()
    torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
    m.ln.bias.grad[1] = float("inf")
    o.step()
    check(o.skipped_steps == 2 and o.steps_taken == 0, "an inf gradient too")
    o.close()

    # a power-of-2 loss scale gives the same bits as none
    runs = []
    for scale in (None, 1024.0):
        m = make_model(device, torch.bfloat16)
        o = make_opt(m, policy)
        for s in (1, 2):
            x, y = batch(s, device)
            loss = torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1))
            (loss * scale if scale else loss).backward()
            o.step(grad_scale=scale)
            o.zero_grad()
        runs.append(snapshot(m, o))
        o.close()
    check(same_snapshot(runs[0], runs[1]), "grad_scale=1024 with a loss scaled by 1024: bit-identical to no scaling")


# ------------------------------------------------------------------------------------------------
# 3. what training frameworks do

# Parameters after the framework-path runs against torch's optimizers: max |dos - torch| over a
# tensor, relative to max |torch| of that tensor. Rounding alone gave 3.7e-7 (AdamW) and 3.3e-7
# (Adam) on the CI machine (torch 1.13, CPU; test_framework_paths prints it); decaying the norms and
# biases too, the mistake the grouping avoids, moves them by far more (printed as well).
PARAM_RTOL = 1e-5


def test_two_optimizers_one_parameter(device, policy):
    """One parameter given to two optimizers, stepped in turn: each starts from what the other
    wrote, as two torch AdamW over one parameter do (fp32: the same values within Adam's rounding;
    before, the second stepped from its own stale master and the first's update was lost)."""
    torch.manual_seed(5)
    ref = torch.nn.Linear(8, 4).to(device)
    ours = copy.deepcopy(ref)
    x = torch.randn(16, 8, device=device)
    r1, r2 = (torch.optim.AdamW(ref.parameters(), lr=1e-2) for _ in range(2))
    o1, o2 = (dos.DeepOptimizerStates(ours.parameters(), lr=1e-2, policy=policy) for _ in range(2))
    worst = 0.0
    for _ in range(3):
        for model, opts in ((ref, (r1, r2)), (ours, (o1, o2))):
            for o in opts:
                o.zero_grad()
            model(x).square().sum().backward()
            for o in opts:
                o.step()
        worst = max(worst, max((a - b).abs().max().item() for a, b in zip(ref.parameters(), ours.parameters())))
    check(worst < 1e-5, f"two optimizers over one parameter, stepped in turn: {worst:.2e} from two torch AdamW "
                        "(one lost update would be 1e-2)")
    # the first closed after its step: the second still starts from what it wrote
    for model, o in ((ref, r1), (ours, o1)):
        o.zero_grad()
        model(x).square().sum().backward()
        o.step()
    o1.close()
    for model, o in ((ref, r2), (ours, o2)):
        o.zero_grad()
        model(x).square().sum().backward()
        o.step()
    worst = max((a - b).abs().max().item() for a, b in zip(ref.parameters(), ours.parameters()))
    check(worst < 1e-5, f"the other optimizer closed after its step: {worst:.2e} from torch AdamW")
    o2.close()


def test_dropped_wrapper(device, policy):
    """Framework wrappers that subclass the optimizer's class and share its attributes, garbage-
    collected while the optimizer trains on: PyTorch Lightning 2's LightningOptimizer (its own
    attributes, every other one forwarded by __getattr__) and Lightning 1's (a copy of the
    optimizer's __dict__). The optimizer must keep its runtime state: a wrapper's __del__ is the
    optimizer's, and runs close() on the wrapper."""
    m1, m2 = make_model(device, torch.float32), make_model(device, torch.float32)
    o1, o2 = make_opt(m1, policy), make_opt(m2, policy)
    train_steps(m1, o1, range(1, 3), device)
    train_steps(m2, o2, range(1, 3), device)

    class Forwarding:  # Lightning 2
        def __init__(self, optimizer):
            self._optimizer = optimizer
            self.__class__ = type("Lightning" + optimizer.__class__.__name__, (Forwarding, optimizer.__class__), {})

        def __getattr__(self, item):
            return getattr(self._optimizer, item)

    class Copying:  # Lightning 1
        def __init__(self, optimizer):
            self.__dict__ = {k: v for k, v in optimizer.__dict__.items() if k not in ("step", "__del__")}
            self.__class__ = type("Lightning" + optimizer.__class__.__name__, (Copying, optimizer.__class__), {})
            self._optimizer = optimizer

    for wrap in (Forwarding, Copying):
        w = wrap(o2)
        check(isinstance(w, dos.DeepOptimizerStates), f"{wrap.__name__}: the wrapper passes for the optimizer")
        w.timeline = True  # a switch set through the wrapper reaches the optimizer
        check(o2.timeline is True, f"{wrap.__name__}: timeline set through the wrapper reaches the optimizer")
        o2.timeline = False
        del w
        gc.collect()
    la = train_steps(m1, o1, range(3, 6), device)
    lb = train_steps(m2, o2, range(3, 6), device)
    check(la == lb and same_snapshot(snapshot(m1, o1), snapshot(m2, o2)),
          "after a wrapper sharing its attributes was dropped, the optimizer steps on as an untouched one "
          "(losses, parameters, state bit for bit)")
    o1.close()
    o2.close()


def test_step_stats(device, policy):
    """last_step["stats"]: one dict per bucket with every field of the C ABI's dos_step_stats, the gradient
    download figures of C ABI 14 last, in their C types, and their values where they are known (see the module's
    docstring, 6)."""
    from deep_optimizer_states import _capi
    check(_capi.ABI_VERSION == 14 and _capi.lib().dos_c_abi_version() == 14,
          f"C ABI 14 (binding {_capi.ABI_VERSION}, library {_capi.lib().dos_c_abi_version()})")
    fields = dos.StepStats._fields_
    check(fields[-3:] == [("longest_download_seconds", ctypes.c_double), ("longest_download_bytes", ctypes.c_uint64),
                          ("downloads_dodge_writebacks", ctypes.c_int32)]
          and ctypes.sizeof(dos.StepStats) == _capi.lib().dos_step_stats_size(),
          "StepStats ends with C ABI 14's three fields, in dos_step_stats' order, types and size")
    copy_by = os.environ.get("DOS_COPY_BY", "")
    subgroup_size = 700
    rule = policy == "dos" and copy_by == "" and not os.environ.get("DOS_GRAD_DOWNLOAD")
    # the plan dos chooses for this small model may put nothing on the CPU on a fast GPU; an update
    # budget of 1 byte (below one streamed subgroup) plans every update on the CPU, so that the rule's
    # downloads are seen on every such machine
    cpu_phases = 0
    for kw in ({}, {"gpu_update_budget": 1}) if device == "cuda" and policy == "dos" else ({},):
        m = make_model(device, torch.float32)
        o = make_opt(m, policy, subgroup_size=subgroup_size, **kw)
        for step in (1, 2, 3):
            train_steps(m, o, [step], device)
            stats = o.last_step["stats"]
            check(len(stats) >= 1 and all({n for n, _ in fields} <= set(st) for st in stats),
                  f"{kw}, step {step}: every bucket's stats have every field of StepStats")
            for b, st in enumerate(stats):
                secs, nbytes, dodge = (st["longest_download_seconds"], st["longest_download_bytes"],
                                       st["downloads_dodge_writebacks"])
                what = f"{kw}, step {step}, bucket {b}: longest download {secs!r} s, {nbytes!r} bytes, dodge {dodge!r}"
                check(type(secs) is float and type(nbytes) is int and type(dodge) is int and dodge in (0, 1),
                      f"{what}: a float, an int and 0 or 1")
                if device == "cpu":  # gradients in host memory: nothing downloaded
                    check(secs == 0.0 and nbytes == 0 and dodge == (1 if copy_by == "auto" else 0),
                          f"{what}: none on the CPU, downloads_dodge_writebacks as DOS_COPY_BY={copy_by!r} says")
                    continue
                check((secs > 0) == (nbytes > 0) and nbytes <= 4 * subgroup_size
                      and (nbytes == 0 or st["subgroups_cpu"] > 0),
                      f"{what}: seconds and bytes both or neither, at most one subgroup's fp32 gradients, only "
                      f"with a subgroup updated on the CPU ({st['subgroups_cpu']})")
                if rule and not dodge:
                    cpu_phases += st["subgroups_cpu"] > 0
                    check((nbytes > 0) == (st["subgroups_cpu"] > 0),
                          f"{what}: the default copy rule, not turned: a download by the copy engine exactly when "
                          f"the plan updates a subgroup on the CPU ({st['subgroups_cpu']})")
        o.close()
    if device == "cuda":
        print(f"stats: {cpu_phases} phase(s) checked with CPU subgroups and gradients downloaded by the copy engine")
        if rule:
            check(cpu_phases > 0, "the default copy rule: some phase updated a subgroup on the CPU (every one with "
                                  "gpu_update_budget=1), so that the download figures were checked against one")


def main(tests=None):
    """Runs ``tests`` (functions of device and policy; default: this file's) on the device and policy of
    the command line; returns the exit status (77: skipped)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--policy", default="cpu")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch sees no CUDA device: skipped")
        return 77
    t0 = time.time()
    try:
        rt = dos.get_runtime(args.policy)
    except OSError as e:
        print(f"FAIL cannot load the runtime's library: {e}")
        return 1
    print(f"torch {torch.__version__}, {rt!r}, library {dos.library_path()}", flush=True)
    if args.device == "cuda" and rt.cuda_workers == 0:
        print("the runtime has no CUDA worker (a build without CUDA?): skipped")
        return 77
    for test in tests or (test_losses_match_adamw, test_bad_input, test_two_optimizers_one_parameter,
                          test_dropped_wrapper, test_step_stats):
        test(args.device, args.policy)
    dos.shutdown()
    print(f"{len(failures)} failure(s); {time.time() - t0:.1f} s")
    for f in failures:
        print("  failed: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
