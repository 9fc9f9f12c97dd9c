#!/usr/bin/env python3
"""Tests of the PyTorch baselines (python/deep_optimizer_states/baselines.py).

    test_baselines.py

Exits 77 (meson's "skip") when torch cannot be imported. Without CUDA only the CPU path runs (and
the GPU variants must be refused or skipped with a message naming CUDA); with CUDA every variant is
checked too.

1. Placement: twinflow:R puts the first round(R x subgroups) subgroups (halves up) on the CPU and
   keeps the rest resident, stride:K streams subgroup i when (i + 1) % K == 0 (dos-train's
   static:R and stride:K); malformed variants are refused with a message.
2. Arithmetic: several update phases of odd sizes (subgroups with a shorter tail, a single
   subgroup, subgroups of 7), bf16/fp16/fp32 models, AdamW and Adam, against a scalar reference of
   torch's documented formulas computed element by element in double precision from the same
   fp32 starting master and the same rounded gradients. fp32 master, exp_avg and exp_avg_sq must
   agree within REL_TOL of each tensor's largest magnitude, and the 16-bit parameters must equal
   the fp32 master rounded to the model's dtype, exactly. To show that the tolerance discriminates,
   the same results are also compared with references that are wrong in one way each (a global
   step count instead of one per subgroup, Adam's L2 decay for AdamW's decoupled one, one step
   fewer): each must exceed it.
3. Command line: a tiny benchmark writes its JSON (median, min and max over the repeats, every
   phase's seconds, 16-bit parameters consistent) and bad arguments exit 2 with a message.
"""

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "python", "deep_optimizer_states", "baselines.py")
sys.path.insert(0, os.path.dirname(MODULE))
import baselines as B  # noqa: E402  (the file alone: the package's C library is not needed)

# fp32 arithmetic against double: torch.optim's fp32 update of values of magnitude |p| <= ~0.1 is
# off by a few ulps of the largest magnitude (at most 1.4e-7 of it measured on torch 1.13, CPU); the
# wrong references of part 2 differ by 3e-2 or more
REL_TOL = 2e-6
CUDA = torch.cuda.is_available()
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


# ------------------------------------------------------------------------------ 1. placement
def test_placement():
    w = B.placement("twinflow:0.5", 13)
    check(w == ["cpu"] * 7 + ["resident"] * 6, f"twinflow:0.5 of 13 subgroups: 7 on the CPU first, 6 resident: {w}")
    check(B.placement("twinflow:0", 4) == ["resident"] * 4 and B.placement("twinflow:1", 4) == ["cpu"] * 4,
          "twinflow:0 keeps everything resident, twinflow:1 nothing")
    w = B.placement("stride:3", 8)
    check([i for i, x in enumerate(w) if x == "streamed"] == [2, 5] and w.count("cpu") == 6,
          f"stride:3 of 8 streams subgroups 2 and 5: {w}")
    check(B.placement("stride:1", 3) == ["streamed"] * 3, "stride:1 streams every subgroup")
    check(B.needs_gpu("stride:2") and B.needs_gpu("twinflow:0.2") and not B.needs_gpu("zero_offload"),
          "needs_gpu tells the GPU variants")
    for bad, word in (("stride:0", "stride:K"), ("stride:x", "stride:K"), ("twinflow:1.5", "[0, 1]"),
                      ("twinflow:", "[0, 1]"), ("zero", "unknown variant"), ("zero_offload:2", "unknown variant"),
                      ("twinflow: 0.5", "[0, 1]"), ("twinflow:0.2_5", "[0, 1]"), ("twinflow:nan", "[0, 1]"),
                      ("twinflow:1e-400", "[0, 1]"), ("stride:\u00b2", "stride:K")):
        try:
            B.placement(bad, 4)
            check(False, f"variant {bad!r} refused")
        except ValueError as e:
            check(word in str(e), f"variant {bad!r} refused: {e}")
    # numbers as a person writes them: what float() would also take is refused
    check([B.parse_decimal(t) for t in ("0.5", "-1e-9", ".25", "3.", "+2")] == [0.5, -1e-9, 0.25, 3.0, 2.0],
          "parse_decimal reads plain decimals")
    for bad in (" 0.5", "0.5 ", "0.2_5", "0x10", "inf", "nan", "1e400", "1e-400", "", ".", 0.5, None):
        check(B.parse_decimal(bad) is None, f"parse_decimal refuses {bad!r}")
    check(B.parse_decimal("0e-400") == 0.0 and B.parse_decimal("-0") == 0.0, "parse_decimal reads a written 0 as 0")
    check(B.parse_count("1.24e8", "--n") == 124000000 and B.parse_count(7, "--n") == 7
          and B.parse_count(1e6, "--n") == 1000000 and B.parse_count(10**400, "--n") == 10**400,
          "parse_count reads 1.24e8, 7, 1e6 and 10**400")
    for bad in (" 1000", "1_000", "0x10", "2.5", "0", True, 2.5, float("inf"), "1e-400"):
        try:
            B.parse_count(bad, "--n")
            check(False, f"parse_count refuses {bad!r}")
        except ValueError as e:
            check("--n" in str(e), f"parse_count refuses {bad!r}: {e}")


# ------------------------------------------------------------------------------ 2. arithmetic
def reference(master, grads, sizes, hyper, steps_per_subgroup=None, decoupled=None, global_step=False):
    """AdamW / Adam (torch's documented formulas) element by element in double precision. master:
    list of float; grads: one list per phase; sizes: subgroup sizes (each subgroup counts its own
    steps, unless global_step: one count incremented by every subgroup's update, a bug to detect);
    decoupled: None for the hyper's optimizer, else forced."""
    lr, b1, b2, eps, wd = hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay
    decoupled = hyper.optimizer == "adamw" if decoupled is None else decoupled
    p, m, v = list(master), [0.0] * len(master), [0.0] * len(master)
    counter = 0
    for phase, g in enumerate(grads[:steps_per_subgroup]):
        begin = 0
        for size in sizes:
            counter += 1
            step = counter if global_step else phase + 1
            for j in range(begin, begin + size):
                gj = g[j]
                if decoupled:
                    p[j] -= lr * wd * p[j]
                else:
                    gj = gj + wd * p[j]
                m[j] = b1 * m[j] + (1 - b1) * gj
                v[j] = b2 * v[j] + (1 - b2) * gj * gj
                mhat = m[j] / (1 - b1 ** step)
                vhat = v[j] / (1 - b2 ** step)
                p[j] -= lr * mhat / (math.sqrt(vhat) + eps)
            begin += size
    return p, m, v


def rel_err(x, ref):
    """max |x - ref| / max |ref| (x a tensor, ref a list of double)."""
    r = torch.tensor(ref, dtype=torch.float64)
    return float((x.double() - r).abs().max() / r.abs().max().clamp_min(1e-300))


def test_arithmetic():
    device = "cuda" if CUDA else "cpu"
    variants = ["zero_offload"] + (["twinflow:0.5", "twinflow:0", "stride:1", "stride:2", "stride:3"] if CUDA else [])
    cases = [  # n, subgroup size, dtype, optimizer, phases
        (1237, 100, "bf16", "adamw", 4),  # 13 subgroups, the last of 37
        (1001, 1001, "fp16", "adam", 3),  # one subgroup
        (777, 64, "fp32", "adamw", 3),  # 13 subgroups, the last of 9
        (50, 7, "bf16", "adam", 5),  # 8 subgroups, the last of 1
    ]
    discriminated = []
    for n, s, dtype, opt, phases in cases:
        hyper = B.Hyper(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, optimizer=opt)
        rng = random.Random(n * 31 + s)
        master = torch.tensor([rng.gauss(0.0, 0.05) for _ in range(n)], dtype=torch.float32)
        # gradients as the model holds them (rounded to its dtype), one set per phase, of mixed signs
        # and magnitudes so that exp_avg cancels and exp_avg_sq spans several orders
        grads = [torch.tensor([rng.gauss(0.0, 10 ** rng.uniform(-4, -1)) for _ in range(n)]).to(B.DTYPES[dtype])
                 for _ in range(phases)]
        g64 = [g.double().tolist() for g in grads]
        sizes = [b - a for a, b in B.subgroup_bounds(n, s)]
        ref = reference(master.double().tolist(), g64, sizes, hyper)
        wrong = {"global step count": reference(master.double().tolist(), g64, sizes, hyper, global_step=True),
                 "the other weight decay": reference(master.double().tolist(), g64, sizes, hyper,
                                                     decoupled=opt != "adamw"),
                 "one step fewer": reference(master.double().tolist(), g64, sizes, hyper,
                                             steps_per_subgroup=phases - 1)}
        if len(sizes) == 1:
            del wrong["global step count"]  # one subgroup: the two counts agree
        ws = B.Workspace(n, s, dtype, device, slots=2)
        try:
            for v in variants:
                ws.reset(master)
                ph = B.UpdatePhase(ws, v, hyper, stream_slots=2)
                for g in grads:
                    ws.set_grads(g)
                    ph.run()
                st = ph.state()
                ph.close()
                what = f"{v}, n={n} s={s} {dtype} {opt}, {phases} phases"
                errs = [rel_err(st[k], ref[j]) for j, k in enumerate(("master", "exp_avg", "exp_avg_sq"))]
                check(max(errs) <= REL_TOL, f"{what}: master/exp_avg/exp_avg_sq vs double reference "
                                            f"{errs[0]:.1e}/{errs[1]:.1e}/{errs[2]:.1e} <= {REL_TOL:g}")
                mism = int((st["master"].to(B.DTYPES[dtype]) != st["params"]).sum())
                check(mism == 0, f"{what}: 16-bit parameters == fp32 master rounded, {mism} differ")
                moved = float((st["master"] - master).abs().max())
                check(moved > 1e-3, f"{what}: the parameters moved ({moved:.2e})")
                for name, (wp, wm, wv) in wrong.items():
                    e = max(rel_err(st["master"], wp), rel_err(st["exp_avg"], wm), rel_err(st["exp_avg_sq"], wv))
                    discriminated.append(e)
                    check(e > 50 * REL_TOL, f"{what}: a reference with {name} differs by {e:.1e} (> 50x the tolerance)")
            if not CUDA:
                try:
                    B.UpdatePhase(ws, "stride:1", hyper)
                    check(False, "stride:1 refused on a CPU workspace")
                except ValueError as e:
                    check("CUDA" in str(e), f"stride:1 refused on a CPU workspace: {e}")
        finally:
            ws.close()
    check(bool(discriminated), "the wrong references were compared")


# ------------------------------------------------------------------------------ 3. command line
def test_command_line():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.json")
        cmd = [sys.executable, MODULE, "--n", "1001", "--s", "300", "--iterations", "3", "--repeats", "2",
               "--variants", "zero_offload,stride:2,twinflow:0.5", "--dtype", "fp16", "--json", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        check(p.returncode == 0, f"command line exits 0 (got {p.returncode}; {p.stderr.strip()[-300:]})")
        d = json.load(open(out))
        r = {x["variant"]: x for x in d["results"]}
        zo = r["zero_offload"]
        check(len(zo["repeat_seconds"]) == 2 and all(len(t) == 3 for t in zo["phase_seconds"]),
              "2 repeats of 3 phases recorded")
        med = sorted(zo["repeat_seconds"])
        check(zo["seconds_min"] == med[0] and zo["seconds_max"] == med[-1] and
              med[0] <= zo["seconds_median"] <= med[-1] and zo["seconds_median"] > 0,
              "median within min..max of the repeats, all positive")
        check(all(rep == statistics.median(t[1:]) for rep, t in zip(zo["repeat_seconds"], zo["phase_seconds"])),
              "each repeat's time is the median of its phases after the first")
        check(zo["params_mismatch"] == 0 and zo["subgroups"] == {"cpu": 4, "resident": 0, "streamed": 0},
              f"zero_offload: 4 CPU subgroups, parameters consistent: {zo['subgroups']}")
        check(d["n"] == 1001 and d["subgroup_size"] == 300 and d["dtype"] == "fp16", "workload recorded")
        if CUDA:
            check(r["stride:2"].get("subgroups") == {"cpu": 2, "resident": 0, "streamed": 2} and
                  r["twinflow:0.5"].get("subgroups") == {"cpu": 2, "resident": 2, "streamed": 0},
                  "GPU variants ran with their placements")
        else:
            check("CUDA" in r["stride:2"].get("skipped", "") and "CUDA" in r["twinflow:0.5"].get("skipped", ""),
                  "without CUDA the GPU variants are skipped, saying why")
            check("no CUDA device" in p.stdout, "without CUDA the command line says so")
    for args, word in ((["--n", "0"], "--n"), (["--variants", "stride:0"], "stride:K"),
                       (["--variants", "twinflow:2"], "[0, 1]"), (["--s", "1.5"], "whole number"),
                       (["--variants", ","], "empty")):
        p = subprocess.run([sys.executable, MODULE, "--n", "100", "--s", "10"] + args, capture_output=True, text=True)
        check(p.returncode == 2 and word in p.stderr, f"bad input {args}: exit 2 and a message ({p.stderr.strip()})")


if __name__ == "__main__":
    torch.manual_seed(0)
    test_placement()
    test_arithmetic()
    test_command_line()
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")
