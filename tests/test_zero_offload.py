#!/usr/bin/env python3
"""Tests of ZeroOffloadAdamW (python/deep_optimizer_states/zero_offload.py).

    test_zero_offload.py

Exits 77 (meson's "skip") when torch cannot be imported. Runs on CUDA parameters where torch sees a
GPU, on CPU ones otherwise.

ZeroOffloadAdamW (the ZeRO-Offload recipe as a framework's optimizer): two param groups (weight
   decay and none), odd shapes, fp32 and bf16 parameters, a parameter without a gradient on one
   step, lr changed every step, against a double-precision AdamW (and a wrong one that decays the
   second group); parameters equal the masters rounded; resume from a ``weights_only`` state dict
   bit for bit; wrong state dicts (no state, a moment or master of another shape, state for a missing
   parameter) refused, the optimizer then going on as an untouched twin, bit for bit; integer
   parameters and add_param_group after construction refused.
"""

import io
import math
import os
import random
import sys

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_baselines import B, CUDA, REL_TOL, check, failures, rel_err  # noqa: E402
import zero_offload as Z  # noqa: E402  (beside baselines.py, on the path test_baselines set)


def adamw_reference(params, grads, groups, lrs, decay_everywhere=False):
    """AdamW (torch's documented formula) in double precision for ZeroOffloadAdamW's check. params:
    list of lists of float (one per parameter); grads: per step, a list with a list of float or
    None per parameter (None: no update, no step counted for it); groups: (indices, weight_decay)
    pairs; lrs: the lr of each step. Returns the masters (list of lists)."""
    b1, b2, eps = 0.9, 0.99, 1e-8
    p = [list(x) for x in params]
    m = [[0.0] * len(x) for x in params]
    v = [[0.0] * len(x) for x in params]
    steps = [0] * len(params)
    for k, gs in enumerate(grads):
        lr = lrs[k]
        for idx, wd in groups:
            wd = 0.1 if decay_everywhere else wd
            for i in idx:
                if gs[i] is None:
                    continue
                steps[i] += 1
                t = steps[i]
                for j, gj in enumerate(gs[i]):
                    p[i][j] -= lr * wd * p[i][j]
                    m[i][j] = b1 * m[i][j] + (1 - b1) * gj
                    v[i][j] = b2 * v[i][j] + (1 - b2) * gj * gj
                    p[i][j] -= lr * (m[i][j] / (1 - b1 ** t)) / (math.sqrt(v[i][j] / (1 - b2 ** t)) + eps)
    return p


def test_framework_optimizer():
    device = "cuda" if CUDA else "cpu"
    shapes = [(37, 5), (37,), (3,), (1,), (129, 3)]
    decay, no_decay = [0, 4], [1, 2, 3]  # matrices decay, vectors do not (the Trainer's grouping)
    for dtype in ("fp32", "bf16"):
        dt = B.DTYPES[dtype]
        rng = random.Random(7 if dtype == "fp32" else 11)
        init = [torch.tensor([rng.gauss(0.0, 0.05) for _ in range(math.prod(sh))]).reshape(sh).to(dt)
                for sh in shapes]

        def fresh():
            ps = [torch.nn.Parameter(t.clone().to(device)) for t in init]
            return ps, Z.ZeroOffloadAdamW([{"params": [ps[i] for i in decay], "weight_decay": 0.1},
                                           {"params": [ps[i] for i in no_decay], "weight_decay": 0.0}],
                                          lr=1e-2, betas=(0.9, 0.99), eps=1e-8)

        order = decay + no_decay  # the optimizer's index order
        steps = 5
        grads = [[None if (k == 2 and i == 3) else  # one parameter without a gradient on one step
                  torch.tensor([rng.gauss(0.0, 10 ** rng.uniform(-4, -1)) for _ in range(math.prod(sh))])
                  .reshape(sh).to(dt) for i, sh in enumerate(shapes)] for k in range(steps)]
        lrs = [1e-2 * (k + 1) / steps for k in range(steps)]  # a scheduler's warm-up

        def run(ps, opt, ks):
            for k in ks:
                for g in opt.param_groups:
                    g["lr"] = lrs[k]
                for p, g in zip(ps, grads[k]):
                    p.grad = None if g is None else g.to(device)
                opt.step()
                opt.zero_grad(set_to_none=True)

        ps, opt = fresh()
        run(ps, opt, range(steps))
        g64 = [[None if g is None else g.double().reshape(-1).tolist() for g in gk] for gk in grads]
        p64 = [t.double().reshape(-1).tolist() for t in init]
        ref = adamw_reference(p64, g64, [(decay, 0.1), (no_decay, 0.0)], lrs)
        wrong = adamw_reference(p64, g64, [(decay, 0.1), (no_decay, 0.0)], lrs, decay_everywhere=True)
        masters = opt.state_dict().get("master")
        what = f"ZeroOffloadAdamW, {dtype} parameters on {device}, 2 groups, {steps} steps, lr changing"
        errs, werrs, rounded_ok = [], [], True
        for pos, i in enumerate(order):
            got = masters[pos] if masters is not None else ps[i].detach().cpu()
            errs.append(rel_err(got.reshape(-1), ref[i]))
            werrs.append(rel_err(got.reshape(-1), wrong[i]))
            rounded_ok &= bool(torch.equal(got.to(dt), ps[i].detach().cpu()))
        check(max(errs) <= REL_TOL, f"{what}: masters vs double reference {max(errs):.1e} <= {REL_TOL:g}")
        check(max(werrs) > 50 * REL_TOL, f"{what}: a reference decaying the no-decay group differs by "
                                         f"{max(werrs):.1e} (> 50x the tolerance)")
        check(rounded_ok, f"{what}: parameters == fp32 masters rounded to {dtype}")
        check((masters is not None) == (dtype != "fp32"), f"{what}: masters in the state dict only for 16-bit")

        # resume: state dict after 2 steps, through torch.save / torch.load(weights_only=True)
        a_ps, a = fresh()
        run(a_ps, a, range(2))
        buf = io.BytesIO()
        torch.save(a.state_dict(), buf)
        buf.seek(0)
        # torch 1.13's weights-only unpickler reads no float (no optimizer's state dict loads there)
        weights_only = int(torch.__version__.split(".")[0]) >= 2
        sd = torch.load(buf, weights_only=True) if weights_only else torch.load(buf)
        b_ps = [torch.nn.Parameter(p.detach().clone()) for p in a_ps]
        b = Z.ZeroOffloadAdamW([{"params": [b_ps[i] for i in decay], "weight_decay": 0.1},
                                {"params": [b_ps[i] for i in no_decay], "weight_decay": 0.0}], lr=5.0)
        b.load_state_dict(sd)
        check(b.param_groups[0]["lr"] == lrs[1] and b.param_groups[0]["betas"] == (0.9, 0.99),
              f"{what}: load_state_dict restores the groups' hyper-parameters")
        run(a_ps, a, range(2, steps))
        run(b_ps, b, range(2, steps))
        same = all(torch.equal(x.detach(), y.detach()) for x, y in zip(a_ps, b_ps))
        check(same, f"{what}: resumed from a state dict after 2 steps (torch.load weights_only={weights_only}), "
                    "parameters bit for bit")
        text_keys = dict(sd, state={str(k): v for k, v in sd["state"].items()})
        e_ps = [torch.nn.Parameter(p.detach().clone()) for p in b_ps]
        e = Z.ZeroOffloadAdamW([{"params": [e_ps[i] for i in decay], "weight_decay": 0.1},
                                {"params": [e_ps[i] for i in no_decay], "weight_decay": 0.0}])
        e.load_state_dict(text_keys)
        check(all(torch.equal(e.state_dict()["state"][i]["exp_avg"], v["exp_avg"]) for i, v in sd["state"].items()),
              f"{what}: a state dict whose parameter indices are strings loads the same moments")

        # bad input: refused, and the optimizer goes on exactly as an untouched twin
        c_ps, c = fresh()
        t_ps, t = fresh()
        run(c_ps, c, range(2))
        run(t_ps, t, range(2))
        good = c.state_dict()

        def bad(**change):
            sd = {k: v for k, v in good.items()}
            sd["param_groups"] = [dict(g, lr=0.5) for g in good["param_groups"]]
            sd["state"] = {i: dict(v) for i, v in good["state"].items()}
            for k, v in change.items():
                if v is None:
                    sd.pop(k, None)
                else:
                    v(sd)
            return sd
        cases = [("a missing state", "missing", bad(state=None)),
                 ("exp_avg of another shape", "shape", bad(state=lambda sd: sd["state"][0].update(exp_avg=torch.zeros(2)))),
                 ("state for a parameter it lacks", "lacks", bad(state=lambda sd: sd["state"].update({99: sd["state"][0]})))]
        if dtype != "fp32":
            cases.append(("a master of another shape", "shape",
                          bad(master=lambda sd: sd.update(master={**good["master"], 0: torch.zeros(2)}))))
        for label, word, sd in cases:
            try:
                c.load_state_dict(sd)
                check(False, f"{what}: {label} refused")
            except ValueError as e:
                check(word in str(e) and c.param_groups[0]["lr"] == lrs[1], f"{what}: {label} refused: {e}")
        run(c_ps, c, range(2, steps))
        run(t_ps, t, range(2, steps))
        same = all(torch.equal(x.detach(), y.detach()) for x, y in zip(c_ps, t_ps))
        check(same, f"{what}: after the refusals, the parameters of an untouched twin, bit for bit")
        if dtype != "fp32":  # parameters changed outside step(): refresh_masters reads them again
            with torch.no_grad():
                c_ps[decay[0]].mul_(0.5)
            stale = torch.equal(c.state_dict()["master"][0].to(dt), c_ps[decay[0]].detach().cpu())
            c.refresh_masters()
            fresh_ok = torch.equal(c.state_dict()["master"][0], c_ps[decay[0]].detach().cpu().float())
            check(not stale and fresh_ok, f"{what}: refresh_masters reads parameters changed outside step()")
        try:
            c.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=dt))]})
            check(False, f"{what}: add_param_group after construction refused")
        except RuntimeError as e:
            check("after construction" in str(e), f"{what}: add_param_group after construction refused: {e}")
    try:
        Z.ZeroOffloadAdamW([torch.nn.Parameter(torch.zeros(3)), torch.zeros(2, dtype=torch.int64)])
        check(False, "integer parameters refused")
    except ValueError as e:
        check("floating point" in str(e), f"integer parameters refused: {e}")


if __name__ == "__main__":
    torch.manual_seed(0)
    test_framework_optimizer()
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")
