#!/usr/bin/env python3
"""Tests of the PyTorch binding's compact master (``DeepOptimizerStates(compact_master=True)``: each
bf16 bucket's fp32 masters kept in the runtime as their low 16 bits and a rounding bit beside the
bf16 parameters, ``codelets/kernels/compact_master.h``).

    python3 tests/test_pytorch_compact.py [--device cpu|cuda] [--policy cpu|gpu|dos|...]

Exits 0 when every check passes, 1 otherwise, 77 (skipped) without torch, or for cuda without a
GPU or a runtime without a CUDA worker (the cuda variant checks the compact master's GPU paths:
it passed on an H100 at 28cab85).

1. The same bits as ``compact_master=False``: a model of bf16 parameters and one fp32 parameter
   (its bucket keeps the full master) trained 6 steps with clipping, plainly, with
   ``flat_gradients=False``, with the next forward overlapped and with the update overlapped with backward
   (``overlap=True``: the CPU's subgroups updated speculatively): losses, parameters, masters,
   moments and step counts bit for bit after each run, and every bf16 parameter its master rounded.
   That the runtime holds the compact form is checked apart from the binding's own bookkeeping:
   masters written through the C ABI (``dos_optimizer_write_masters``) change a compact bucket's
   parameters at once and leave a full one's until the next step (both then step to the same bits).
2. Still AdamW: the masters after each of 5 steps against ``torch.optim.AdamW`` over fp32 copies of
   the initial parameters fed the same (bf16) gradients, within the binding's tolerance
   (``PARAM_RTOL``), while the update moves them by far more.
3. ``state_dict`` across the forms: the two forms' state dicts after 3 steps are equal; a compact
   optimizer's state dict loaded into a full one and a full one's into a compact one (the model's
   state loaded first) continue 3 steps with the bits of the run that went on.
4. Refusals, each changing nothing: ``compact_master`` not a bool; a parameter written in
   place after a step (``step()``, ``state_dict()`` and ``refresh_masters()`` raise
   ``RuntimeError`` saying to use ``compact_master=False``; parameters, step counts and state as
   before; a state dict loaded then clears it and the run goes on with the full form's bits); the
   optimizer's checkpoint loaded before the model's (the model's load is such a write). An fp32
   parameter of the same optimizer (a full bucket) written in place after a step is followed.
5. Before the first update the masters are the parameters, and writes are followed with the full
   form's bits: a parameter written in place before the first step, through ``p.data`` with
   ``refresh_masters()``, after a skipped step (a NaN gradient), and after a fresh (empty) state
   dict loaded into an optimizer that had stepped.
6. ``examples/train_gpt.py --compact-master --dtype bf16``: its optimizer's buckets compact, 6 steps
   with the same losses and parameters as without the flag.
"""

import copy
import ctypes
import os
import sys
import warnings

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# test_pytorch: python/ and examples/ on the path, its model, steps, snapshots and check()
from test_pytorch import (PARAM_RTOL, Net, batch, check, expect_error, main, make_model, make_opt,  # noqa: E402
                          same_snapshot, snapshot, tiny_args, train_gpt, train_steps)
from deep_optimizer_states import _capi  # noqa: E402


class MixedNet(torch.nn.Module):
    """test_pytorch's Net in bf16, its logits scaled by an fp32 parameter (a bucket of its own, which
    keeps the full master under compact_master=True). Returns fp32 logits (16, 12, 50)."""

    def __init__(self, device, seed=3):
        super().__init__()
        torch.manual_seed(seed)
        self.net = Net().to(device=device, dtype=torch.bfloat16)
        self.scale = torch.nn.Parameter(torch.linspace(0.9, 1.1, 50, device=device))

    def forward(self, x):
        return self.net(x).float() * self.scale


def compact_buckets(opt):
    """(dtype, compact) of each bucket of ``opt``."""
    return [(b.dtype, b.compact) for b in opt._buckets]


def masters_are_rounded(model, opt):
    """Whether every bf16 parameter of ``model`` is its master (from ``opt.state_dict()``) rounded to
    bf16, bit for bit (what the compact form rebuilds its masters from)."""
    st = opt.state_dict()["state"]
    params = [p for g in opt.param_groups for p in g["params"]]  # state_dict numbering
    return all(torch.equal(p.detach().cpu(), st[i]["master"].to(torch.bfloat16))
               for i, p in enumerate(params) if p.dtype == torch.bfloat16)


def same_steps(mf, of, mc, oc, steps, device):
    """Trains the full-form pair (mf, of) and the compact-form pair (mc, oc) over ``steps`` on the same
    batches; True when their losses are equal and their parameters, masters, moments and step counts
    (test_pytorch's snapshot) are the same bits."""
    lf = train_steps(mf, of, steps, device)
    lc = train_steps(mc, oc, steps, device)
    return lf == lc and same_snapshot(snapshot(mf, of), snapshot(mc, oc))


def halve(model):
    """Writes every parameter in place, exactly (a power of 2), counted by torch's version counters."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)


def test_same_bits(device, policy):
    """compact_master=True against False: the same bits, plainly and under the binding's other paths."""
    for kw, what in (({}, "plain steps"), (dict(flat_gradients=False), "flat_gradients=False"),
                     (None, "the next forward overlapped"), (dict(overlap=True), "the update overlapped with backward")):
        mf, mc = MixedNet(device), MixedNet(device)
        of = make_opt(mf, policy, **(kw or {}))
        oc = make_opt(mc, policy, compact_master=True, **(kw or {}))
        if kw is None:
            with warnings.catch_warnings():  # that the runtime leaves no core to forward: not what is tested
                warnings.simplefilter("ignore")
                of.overlap_forward(mf)
                oc.overlap_forward(mc)
        check(sorted(compact_buckets(oc), key=str) == [(torch.bfloat16, True), (torch.bfloat16, True),
                                                      (torch.float32, False)]
              and not any(c for _, c in compact_buckets(of)),
              f"{what}: compact_master=True makes the bf16 buckets compact and leaves the fp32 one full")
        lf = train_steps(mf, of, range(1, 7), device)
        lc = train_steps(mc, oc, range(1, 7), device)
        of.wait()
        oc.wait()
        check(lf == lc and same_snapshot(snapshot(mf, of), snapshot(mc, oc)),
              f"{what}, 6 steps with clipping: losses, parameters, masters, moments and step counts bit for bit")
        check(masters_are_rounded(mc, oc), f"{what}: every bf16 parameter is its master rounded")
        of.close()
        oc.close()

    # the runtime holds the compact form: masters written through the C ABI write its parameters at once
    mf, mc = MixedNet(device), MixedNet(device)
    of, oc = make_opt(mf, policy), make_opt(mc, policy, compact_master=True)
    train_steps(mf, of, range(1, 3), device)
    train_steps(mc, oc, range(1, 3), device)
    L = _capi.lib()
    before_f = [p.detach().clone() for p in mf.parameters()]
    before_c = torch.cat([p.detach().reshape(-1).cpu() for p in oc._buckets[0].params])
    for o in (of, oc):
        b = o._buckets[0]
        m = o._read_state(b, 0)
        m.mul_(1.25)  # masters whose rounding is not the parameters'
        _capi.check(L.dos_optimizer_write_masters(b.handle, 0, b.num_params, ctypes.c_void_p(m.data_ptr())),
                    "dos_optimizer_write_masters")
        if b.device.type == "cuda":
            torch.cuda.synchronize()
    wf = [torch.equal(a, p.detach()) for a, p in zip(before_f, mf.parameters())]
    b = oc._buckets[0]
    m = oc._read_state(b, 0)
    now_c = torch.cat([p.detach().reshape(-1).cpu() for p in b.params])
    check(all(wf) and torch.equal(now_c, m.to(torch.bfloat16)) and bool((now_c != before_c).float().mean() > 0.9),
          "masters written through the C ABI: the compact bucket's parameters take their rounding at once, the full "
          "one's stay (the runtime holds each form as asked)")
    # the full model given the compact one's parameters (written in place: its rule keeps each master,
    # which these parameters are the rounding of), so that both forwards see the same model
    with torch.no_grad():
        for pf, pc in zip(of._buckets[0].params, oc._buckets[0].params):
            pf.copy_(pc)
    check(same_steps(mf, of, mc, oc, range(3, 5), device),
          "and 2 more steps from those masters (the full model given the same parameters): the same bits in both "
          "forms")
    of.close()
    oc.close()

    # compact_master=True over fp32 parameters only: accepted, every bucket full, the same bits
    mf, mc = make_model(device, torch.float32), make_model(device, torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        of, oc = make_opt(mf, policy), make_opt(mc, policy, compact_master=True)
        same = same_steps(mf, of, mc, oc, range(1, 4), device)
    check(not any(c for _, c in compact_buckets(oc)) and same,
          "compact_master=True with fp32 parameters only: no compact bucket, the same bits as False")
    said = [str(w.message) for w in caught if "no bf16 parameter" in str(w.message)]
    check(len(said) == 1, f"and one warning that compact_master has nothing to act on ({said})")
    of.close()
    oc.close()


def test_adamw_reference(device, policy):
    """The compact form's masters against torch.optim.AdamW over fp32 copies, fed the same gradients."""
    m = make_model(device, torch.bfloat16)
    o = make_opt(m, policy, compact_master=True, max_grad_norm=None)
    named = list(m.named_parameters())
    ref = {n: p.detach().float().clone().requires_grad_(True) for n, p in named}
    groups = [{"params": [ref[n] for n, p in named if n.endswith("weight") and p.dim() == 2], "weight_decay": 0.05},
              {"params": [ref[n] for n, p in named if not (n.endswith("weight") and p.dim() == 2)],
               "weight_decay": 0.0}]
    ot = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    start = {n: t.detach().clone() for n, t in ref.items()}
    index = {id(p): i for i, p in enumerate(p for g in o.param_groups for p in g["params"])}
    worst, moved = 0.0, float("inf")
    for step in range(1, 6):
        x, y = batch(step, device)
        loss = torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1))
        loss.backward()
        for n, p in named:
            ref[n].grad = p.grad.detach().float().clone()  # bf16 -> fp32: exact
        o.step()
        ot.step()
        o.zero_grad()
        st = o.state_dict()["state"]
        for n, p in named:
            got = st[index[id(p)]]["master"].double()
            want = ref[n].detach().cpu().double()
            scale = max(float(want.abs().max()), 1e-30)
            worst = max(worst, float((got - want).abs().max()) / scale)
            moved = min(moved, float((want - start[n].cpu().double()).abs().max()) / scale)
    check(worst <= PARAM_RTOL, f"5 AdamW steps in compact form: every master within {PARAM_RTOL:g} of "
          f"torch.optim.AdamW on fp32 copies with the same gradients (largest {worst:.2e}, relative to the tensor's "
          "largest value)")
    check(moved > 100 * PARAM_RTOL, f"while the update moved every tensor by far more ({moved:.2e} at least)")
    check(masters_are_rounded(m, o), "and every bf16 parameter is its master rounded")
    o.close()


def test_state_dict_across_forms(device, policy):
    """A compact optimizer's state dict into a full one and the other way round."""
    mf, mc = make_model(device, torch.bfloat16), make_model(device, torch.bfloat16)
    of, oc = make_opt(mf, policy), make_opt(mc, policy, compact_master=True)
    train_steps(mf, of, range(1, 4), device)
    train_steps(mc, oc, range(1, 4), device)
    sd_f, sd_c = of.state_dict(), oc.state_dict()
    same = sd_f["state"].keys() == sd_c["state"].keys() and all(
        torch.equal(sd_f["state"][i][k], sd_c["state"][i][k]) for i in sd_f["state"] for k in sd_f["state"][i])
    check(same and sd_f["dos"] == sd_c["dos"] and sd_f["param_groups"] == sd_c["param_groups"],
          "after 3 steps the two forms' state dicts are equal (masters rebuilt from the parameters)")
    sd_model = copy.deepcopy(mf.state_dict())
    lref = train_steps(mf, of, range(4, 7), device)
    for sd, compact, what in ((sd_c, False, "a compact optimizer's state dict loaded into a full one"),
                              (sd_f, True, "a full optimizer's state dict loaded into a compact one")):
        m2 = make_model(device, torch.bfloat16, seed=29)
        o2 = make_opt(m2, policy, compact_master=compact)
        m2.load_state_dict(sd_model)  # the model's checkpoint first (see the refusals)
        o2.load_state_dict(copy.deepcopy(sd))
        l2 = train_steps(m2, o2, range(4, 7), device)
        check(l2 == lref and same_snapshot(snapshot(mf, of), snapshot(m2, o2)),
              f"{what}: 3 more steps give the bits of the run that went on")
        o2.close()
    of.close()
    oc.close()


def test_refusals(device, policy):
    """compact_master not a bool; a parameter written in place after a step."""
    m = make_model(device, torch.bfloat16)
    expect_error(ValueError, "compact_master must be True or False", lambda: make_opt(m, policy, compact_master=1),
                 "compact_master=1")

    # the same with the update overlapped with backward: backward runs on (nothing is declared), and
    # step() refuses, changing nothing
    mo = make_model(device, torch.bfloat16)
    oo = make_opt(mo, policy, compact_master=True, overlap=True)
    with warnings.catch_warnings():  # that the runtime leaves no core to backward: not what is tested
        warnings.simplefilter("ignore")
        train_steps(mo, oo, range(1, 3), device)
        steps_before = oo.subgroup_steps()
        halve(mo)
        halved = [p.detach().clone() for p in mo.parameters()]
        x, y = batch(3, device)
        loss = torch.nn.functional.cross_entropy(mo(x).float().reshape(-1, 50), y.reshape(-1))
        try:
            loss.backward()
            backward_ok = True
        except RuntimeError as e:
            backward_ok = False
            print(f"backward raised: {e}")
        check(backward_ok, "overlap=True, a parameter halved in place after a step: backward runs on")
        expect_error(RuntimeError, "build the optimizer with compact_master=False", oo.step,
                     "the same, step() with the update overlapped")
        check(oo.subgroup_steps() == steps_before and all(torch.equal(a, p.detach()) for a, p in zip(halved, mo.parameters())),
              "the same: step counts and parameters as before")
    oo.close()

    # written in place after a step: refused by step(), state_dict() and refresh_masters(), nothing changed
    mf, mc = make_model(device, torch.bfloat16), make_model(device, torch.bfloat16)
    of, oc = make_opt(mf, policy), make_opt(mc, policy, compact_master=True)
    train_steps(mf, of, range(1, 3), device)
    train_steps(mc, oc, range(1, 3), device)
    sd_before = oc.state_dict()
    steps_before = oc.subgroup_steps()
    halve(mc)
    halved = [p.detach().clone() for p in mc.parameters()]
    expect_error(RuntimeError, "build the optimizer with compact_master=False",
                 lambda: train_steps(mc, oc, range(3, 4), device), "a parameter halved in place after a step, step()")
    expect_error(RuntimeError, "was written in place", oc.state_dict, "the same, state_dict()")
    expect_error(RuntimeError, "refresh_masters() cannot take the masters", oc.refresh_masters,
                 "the same, refresh_masters()")
    oc.zero_grad()
    check(all(torch.equal(a, p.detach()) for a, p in zip(halved, mc.parameters())) and oc.subgroup_steps() == steps_before
          and oc.steps_taken == 2, "after the refusals: parameters as written, step counts and steps taken unchanged")
    # (the masters read back now are rebuilt from the halved parameters: the form keeps no other copy)
    moments = [(oc._read_state(b, 1), oc._read_state(b, 2)) for b in oc._buckets]
    ref_moments = [(torch.cat([sd_before["state"][i]["exp_avg"].reshape(-1) for i in b.indices]),
                    torch.cat([sd_before["state"][i]["exp_avg_sq"].reshape(-1) for i in b.indices])) for b in oc._buckets]
    check(all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(moments, ref_moments)),
          "and the moments unchanged")
    # a state loaded clears the refusal: the run goes on with the bits of the full form's
    oc.load_state_dict(sd_before)
    check(same_steps(mf, of, mc, oc, range(3, 5), device),
          "the state dict saved before the write loaded: 2 more steps with the full form's bits")

    # an fp32 parameter written in place after a step: its bucket keeps the full master and follows it
    mf2, mc2 = MixedNet(device), MixedNet(device)
    of2, oc2 = make_opt(mf2, policy), make_opt(mc2, policy, compact_master=True)
    train_steps(mf2, of2, range(1, 3), device)
    train_steps(mc2, oc2, range(1, 3), device)
    with torch.no_grad():
        mf2.scale.mul_(0.5)
        mc2.scale.mul_(0.5)
    check(same_steps(mf2, of2, mc2, oc2, range(3, 5), device),
          "an fp32 parameter (a full bucket) of a compact_master=True optimizer written in place after a step: "
          "followed, the same bits as compact_master=False")
    of2.close()
    oc2.close()

    # the optimizer's checkpoint loaded before the model's: the model's load is a write after a load
    sd_model, sd_opt = copy.deepcopy(mf.state_dict()), of.state_dict()
    m2 = make_model(device, torch.bfloat16, seed=31)
    o2 = make_opt(m2, policy, compact_master=True)
    o2.load_state_dict(sd_opt)
    m2.load_state_dict(sd_model)
    expect_error(RuntimeError, "load the model's state_dict before the optimizer's",
                 lambda: train_steps(m2, o2, range(5, 6), device),
                 "the optimizer's checkpoint loaded before the model's, then step()")
    o2.zero_grad()
    o2.load_state_dict(sd_opt)  # in the order that works: the same bits as the run that went on
    lref = train_steps(mf, of, range(5, 7), device)
    l2 = train_steps(m2, o2, range(5, 7), device)
    check(l2 == lref and same_snapshot(snapshot(mf, of), snapshot(m2, o2)),
          "loaded again after the model's: the bits of the run that went on")
    for x in (of, oc, o2):
        x.close()


def test_pristine_writes(device, policy):
    """Before the first update (or after a fresh state) writes are followed with the full form's bits."""
    def both(fn, what, steps=range(1, 5), setup=None):
        mf, mc = make_model(device, torch.bfloat16), make_model(device, torch.bfloat16)
        of, oc = make_opt(mf, policy), make_opt(mc, policy, compact_master=True)
        for m, o in ((mf, of), (mc, oc)):
            if setup:
                setup(m, o)
            fn(m, o)
        check(same_steps(mf, of, mc, oc, steps, device),
              f"{what}: {len(steps)} steps with the full form's bits")
        of.close()
        oc.close()

    def shift(m, o):  # not a power of 2: every written value is rounded to bf16 anew
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.003)
        check(o.state_dict()["state"] == {}, "a state dict after the write, before any step: empty (the masters are "
              "the parameters)")

    both(shift, "parameters written in place before the first step")

    def through_data(m, o):
        for p in m.parameters():
            p.data.mul_(0.75)
        o.refresh_masters()

    both(through_data, "written through p.data before the first step, then refresh_masters()")

    def skipped_step(m, o):  # a NaN gradient: the step is skipped and changes nothing
        x, y = batch(0, device)
        torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1)).backward()
        next(m.parameters()).grad.view(-1)[0] = float("nan")
        o.step()
        o.zero_grad()
        check(o.last_step["skipped"] and o.steps_taken == 0, "a step with a NaN gradient is skipped")
        halve(m)

    both(skipped_step, "written in place after a skipped step")

    def fresh_after_steps(m, o):  # a fresh (empty) state dict loaded into an optimizer that has stepped
        fresh = o.state_dict()
        train_steps(m, o, range(11, 13), device)
        o.load_state_dict(fresh)
        halve(m)

    both(fresh_after_steps, "written in place after a fresh state dict was loaded into an optimizer that had stepped")

    # an inf written before the first step: refused as the full form refuses it (the compact form's
    # masters, rebuilt from the parameters, would show the inf on both sides of the rule's comparison)
    for compact in (False, True):
        m = make_model(device, torch.bfloat16)
        o = make_opt(m, policy, compact_master=compact)
        with torch.no_grad():
            next(m.parameters()).view(-1)[2] = float("inf")
        for p in m.parameters():  # finite gradients (a forward through the inf would skip the step)
            p.grad = torch.full_like(p, 1e-3)
        expect_error(ValueError, "must be finite", o.step,
                     f"compact_master={compact}: an inf written in place before the first step")
        o.close()

    # a second optimizer built (and closed) over the parameters after a step writes nothing: the
    # compact one goes on with the full form's bits, not refusing
    def second_optimizer(m, o):
        train_steps(m, o, range(21, 22), device)
        make_opt(m, policy).close()

    both(second_optimizer, "a second optimizer built over the parameters after a step")


def test_train_gpt(device, policy):
    """examples/train_gpt.py --compact-master: the optimizer's bf16 buckets compact, the same losses and
    parameters as without."""
    runs = []
    for extra in ([], ["--compact-master"]):
        argv = tiny_args("dos", device, policy, steps=6)
        argv[argv.index("--dtype") + 1] = "bf16"
        runs.append(train_gpt.main(argv + extra))
    (a, b) = runs
    check(all(c for _, c in compact_buckets(b["optimizer"])) and not any(c for _, c in compact_buckets(a["optimizer"]))
          and b["summary"]["compact_master"],
          "train_gpt.py --compact-master --dtype bf16: every bucket compact (none without the flag)")
    check(a["losses"] == b["losses"] and all(torch.equal(x, y) for x, y in zip(a["model"].parameters(),
                                                                               b["model"].parameters())),
          "and 6 steps with the same losses and parameters, bit for bit, as without it")
    for r in runs:
        r["optimizer"].close()


if __name__ == "__main__":
    sys.exit(main([test_same_bits, test_adamw_reference, test_state_dict_across_forms, test_refusals,
                   test_pristine_writes, test_train_gpt]))
