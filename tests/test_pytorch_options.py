#!/usr/bin/env python3
"""Tests of the PyTorch binding's options: GPU budgets, timelines, caller cores, flat_gradients,
tail_subgroups, and torch.optim.AdamW's own (code written against AdamW), with test_pytorch.py's
models, helpers and command line.

    test_pytorch_options.py [--device cpu|cuda] [--policy POLICY]

Exits 77 (meson's "skip") when torch cannot be imported, or with --device cuda when torch sees no
GPU or the runtime has no CUDA worker.

1. GPU budgets (gpu_update_budget, gpu_resident_budget): values that are not integers in range
   refused with the option named; a bf16 model trained 4 steps with a tight update budget and a
   resident budget of two subgroups gives the same bits as without them; on CUDA with policy dos,
   update budgets of 1 and 8000 bytes (below one streamed subgroup; a CPU subgroup's gradient and
   parameters cross by the runtime's own copies and stage nothing on the GPU) leave every update on
   the CPU. Without a CUDA worker the
   budgets have no effect, so there only the refusals and the same bits are checked.
   An optimizer with budgets that starts the runtime (in a process of its own) sets StarPU's
   device memory limit, in whole MiB: per bucket the update budget or one subgroup, the larger, at
   most the bucket streamed, plus the resident budget, summed over the buckets; policy cpu asks for none; the environment
   is restored once StarPU started (a value of the caller's replaced with a warning, then back), a
   runtime started after shutdown() without budgets has no limit, and the variable is read as
   StarPU reads it; get_runtime refuses a gpu_memory_limit out of range. On CUDA, policy gpu
   streaming 12 subgroups of 1e7 fp32 elements: the device memory beyond torch's stays within the
   256 MiB update budget (plus 256 MiB), and without a budget it does not (StarPU keeps what it
   freed), so that the first check could fail.
2. timeline=True: each bucket's phase reports when it began on time.perf_counter()'s clock
   (between the readings around step()) and every task within it, one Adam per subgroup; the
   same bits as without a timeline; a non-bool timeline refused; with the next forward overlapped,
   the smaller bucket's phase begins first, and ends first where both phases' Adams ran on one
   lane (one worker, submission order); train_gpt.py --timeline writes the
   timed steps' forward, backward and step() and each phase inside its step() call; malformed
   --timeline-steps refused.
3. caller_cores: the automatic CPU threads with caller_cores=1 are one fewer than with 0, and an
   overlap=True optimizer starting the runtime gets the same (each in a process of its own); a
   negative or non-integer caller_cores refused.
4. flat_gradients=False (the gradients left where autograd puts them, their addresses handed to
   the runtime at each step): the same bits as flat_gradients=True through a framework's flow
   (model.zero_grad(set_to_none=True) and in place, 3 micro-batches, clip_grad_norm_, a scheduler),
   with the optimizer's own clipping and a NaN step, and with one gradient tensor given to two
   parameters; a step copies no gradient (each p.grad keeps its storage); non-bool values,
   overlap=True and overlap_forward refused.
5. tail_subgroups (late binding of the plan's tail): values that are not integers in [0, 1000000]
   refused with the option named; a bf16 model trained 4 steps with 3 gives the same losses,
   parameters and state bit for bit as with 0; every phase's stats say at most 3 subgroups bound
   and at most those moved, none bound without a CUDA worker, and with one all 3 bound in every
   phase whose plan has more than 3 subgroups on each side (how many phases that was is printed).
   On CUDA, the same again under policy dos in a process of its own whose rates cache is rewritten
   with rates that balance the CPU and the streams (subgroups of 100: about half of the 66-subgroup
   bucket on each side), which must bind all 3 in at least one phase: the model's own plans for this small model
   were never mixed enough on the GPU machine, which left the same-bits check comparing phases in
   which nothing was bound.
6. Code written against torch.optim.AdamW: its option keywords at their defaults (amsgrad,
   maximize, capturable, differentiable False, fused None or False, foreach any) give the same bits
   as without them, a true value is refused naming the option; param_groups edited by hand after
   construction (a parameter appended, replaced or removed, a group appended) refused at step()
   and state_dict() with nothing updated, and a restored list steps again; a group that sets decoupled and leaves
   weight_decay out gets its mode's default (0 for Adam, 1e-2 for AdamW), one that sets it keeps it;
   a channels_last parameter refused with the call that makes it contiguous, which then works.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deep_optimizer_states as dos  # noqa: E402
from test_pytorch import (batch, check, expect_error, main, make_model, make_opt,  # noqa: E402
                          same_snapshot, snapshot, tiny_args, train_gpt, train_steps)
from test_pytorch_habits import frame_run  # noqa: E402


def test_gpu_budgets(device, policy):
    m = make_model(device, torch.float32)
    for name, bad in (("gpu_update_budget", 0), ("gpu_update_budget", -5), ("gpu_update_budget", True),
                      ("gpu_update_budget", 1.5), ("gpu_update_budget", 2 ** 64), ("gpu_resident_budget", -1),
                      ("gpu_resident_budget", "1GB"), ("gpu_resident_budget", 2 ** 63)):
        expect_error(ValueError, name, lambda: make_opt(m, policy, **{name: bad}), f"{name}={bad!r}")
    runs = []
    for kw in ({}, dict(gpu_update_budget=64 * 1024, gpu_resident_budget=2 * 12 * 700)):
        mk = make_model(device, torch.bfloat16)
        o = make_opt(mk, policy, **kw)
        losses = train_steps(mk, o, range(1, 5), device)
        runs.append((losses, snapshot(mk, o)))
        o.close()
    check(runs[0][0] == runs[1][0] and same_snapshot(runs[0][1], runs[1][1]),
          "a 64 KiB update budget and a resident budget of two subgroups: losses, parameters and state bit for bit "
          "as without budgets")
    if device == "cuda":
        # the runtime's own checks (scheduler/plan.cpp): under a plan the runtime copies a CPU
        # subgroup's gradient and parameters itself (no staging on the GPU), so a budget of 1 byte or
        # of 8000 bytes, below one streamed subgroup of 700 (12 bytes of state per element alone),
        # leaves every update on the CPU. (The refusal of a budget below the staging that StarPU's
        # own policies need is checked in test_plans.) One group: with two, the group of biases and
        # norms has smaller subgroups, which fit.
        if policy == "dos":
            for budget in (1, 8000):
                mk = make_model(device, torch.bfloat16)
                o = dos.DeepOptimizerStates(mk.parameters(), lr=1e-2, subgroup_size=700, policy=policy,
                                            gpu_update_budget=budget)
                check(sum(p.numel() for p in mk.parameters()) >= 700, "the model holds a full subgroup of 700")
                train_steps(mk, o, range(1, 3), device)
                on_gpu = sum(st["subgroups_gpu"] for st in o.last_step["stats"])
                on_cpu = sum(st["subgroups_cpu"] for st in o.last_step["stats"])
                check(on_gpu == 0 and on_cpu > 0, f"an update budget of {budget} bytes, below one streamed subgroup: "
                                                  f"every update on the CPU ({on_gpu} on the GPU, {on_cpu} on the CPU)")
                o.close()


_LIMIT_CHILD = """
import json, os, sys, warnings
import torch
import deep_optimizer_states as d
mode = sys.argv[1]
os.environ.pop("STARPU_LIMIT_CUDA_MEM", None)
if mode == "sum":
    out = {}
    def start(name, groups, **kw):
        o = d.DeepOptimizerStates(groups, ncuda=0, **kw)
        out[name] = {"limit": d.get_runtime().gpu_memory_limit, "env": os.environ.get("STARPU_LIMIT_CUDA_MEM")}
        o.close()
        d.shutdown()
    a = [torch.nn.Parameter(torch.zeros(1_000_000)), torch.nn.Parameter(torch.zeros(2_000_000))]
    b = [torch.nn.Parameter(torch.zeros(1_000_000, dtype=torch.bfloat16))]
    kw = dict(policy="dos", subgroup_size=1_000_000)  # fp32: 2e7 bytes per streamed subgroup, 6e7 the bucket
    start("u10", a, gpu_update_budget=10_000_000, **kw)  # below one subgroup, which the window admits all the same
    start("u40", a, gpu_update_budget=40_000_000, **kw)
    start("u1e9", a, gpu_update_budget=10 ** 9, **kw)  # beyond the whole bucket streamed
    start("r20", a, gpu_update_budget=40_000_000, gpu_resident_budget=20_000_000, **kw)
    start("two", [{"params": a}, {"params": b}], gpu_update_budget=40_000_000, **kw)  # + 1.6e7 bf16 streamed
    start("cpu", a, policy="cpu", gpu_update_budget=40_000_000)
    os.environ["STARPU_LIMIT_CUDA_MEM"] = "7"  # the caller's own: replaced for StarPU's start, with a warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start("preset", a, gpu_update_budget=40_000_000, **kw)
    out["preset"]["warned"] = [str(w.message) for w in caught if "is replaced" in str(w.message)]
    out["preset"]["env"] = os.environ.pop("STARPU_LIMIT_CUDA_MEM", None)
    d.get_runtime("dos", ncuda=0)
    out["after"] = {"limit": d.get_runtime().gpu_memory_limit, "env": os.environ.get("STARPU_LIMIT_CUDA_MEM")}
    print(json.dumps(out))
else:
    torch.zeros(1, device="cuda")
    free0, total = torch.cuda.mem_get_info()
    before = total - free0 - torch.cuda.memory_reserved()
    ps = [torch.nn.Parameter(torch.randn(10_000_000, device="cuda")) for _ in range(12)]
    kw = dict(gpu_update_budget=256 << 20) if mode == "budget" else {}
    o = d.DeepOptimizerStates(ps, lr=1e-3, subgroup_size=10_000_000, policy="gpu", **kw)
    streamed = 0
    for step in range(3):
        for p in ps:
            p.grad = torch.randn_like(p)
        o.step()
        streamed += sum(st["subgroups_gpu"] for st in o.last_step["stats"])
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    print(json.dumps({"other": total - free1 - torch.cuda.memory_reserved() - before, "streamed": streamed,
                      "limit": d.get_runtime().gpu_memory_limit}))
"""


def _limit_child(mode, device):
    """Runs _LIMIT_CHILD in a process of its own (the runtime starts once per process); its JSON, or
    None with its output's end printed."""
    env = dict(os.environ)
    if device != "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ""
    try:
        r = subprocess.run([sys.executable, "-c", _LIMIT_CHILD, mode], capture_output=True, text=True, timeout=300,
                           env=env)
    except subprocess.TimeoutExpired:
        print(f"the {mode} child timed out")
        return None
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"the {mode} child failed (exit status {r.returncode}):\n{(r.stdout + r.stderr)[-1500:]}")
        return None


def test_gpu_memory_limit(device, policy):
    """The optimizer's GPU budgets bound StarPU's device memory (get_runtime's gpu_memory_limit)."""
    for bad in (0, -1, 1.5, True, "1GB", 1 << 51):
        expect_error(ValueError, "gpu_memory_limit", lambda: dos.get_runtime(gpu_memory_limit=bad),
                     f"get_runtime(gpu_memory_limit={bad!r})")
    saved = os.environ.get("STARPU_LIMIT_CUDA_MEM")
    read = {}
    for text in ("512", "+5", " 5", "5 ", "512MB", "0", "-3", "\u00b2", ""):
        os.environ["STARPU_LIMIT_CUDA_MEM"] = text
        read[text] = dos.runtime._starpu_limit() >> 20
    os.environ.pop("STARPU_LIMIT_CUDA_MEM") if saved is None else os.environ.__setitem__("STARPU_LIMIT_CUDA_MEM", saved)
    check(read == {"512": 512, "+5": 5, " 5": 5, "5 ": 0, "512MB": 0, "0": 0, "-3": 0, "\u00b2": 0, "": 0},
          f"STARPU_LIMIT_CUDA_MEM read as StarPU's strtol takes it whole, MiB (0: none or refused): {read}")
    r = _limit_child("sum", device)
    if r is None:
        check(False, "the limits' child ran")
    else:
        mib = 1 << 20
        lim = {k: v["limit"] for k, v in r.items()}

        def near(x, want):  # StarPU counts whole MiB, rounded up
            return abs(x - want) <= mib

        check(all(v % mib == 0 for v in lim.values()) and lim["u10"] >= 20_000_000 and lim["u40"] >= 40_000_000,
              f"StarPU's limit in whole MiB, covering the update budget and one subgroup ({lim})")
        check(near(lim["u40"] - lim["u10"], 20_000_000),
              "an update budget below one subgroup (2e7 bytes streamed): the limit holds that subgroup, 2e7 below "
              "the limit of a 4e7 budget")
        check(near(lim["u1e9"] - lim["u40"], 20_000_000),
              "an update budget beyond the whole bucket: the limit holds the bucket streamed (6e7 bytes), not the budget")
        check(near(lim["r20"] - lim["u40"], 20_000_000), "a resident budget of 2e7 bytes adds 2e7 to the limit")
        check(near(lim["two"] - lim["u40"], 16_000_000),
              "a second bucket (1e6 bf16 elements, 1.6e7 bytes streamed) adds what it can hold")
        check(r["preset"]["limit"] == lim["u40"] and r["preset"]["env"] == "7" and len(r["preset"]["warned"]) == 1,
              f"a STARPU_LIMIT_CUDA_MEM of the caller's: replaced with a warning while StarPU starts, then restored "
              f"({r['preset']})")
        del r["preset"]
        check(r["cpu"]["limit"] == 0, f"policy cpu, which uses no GPU: no limit asked ({r['cpu']})")
        check(all(r[k]["env"] is None for k in r),
              f"STARPU_LIMIT_CUDA_MEM restored (unset) once each runtime started: {[r[k]['env'] for k in r]}")
        check(r["after"]["limit"] == 0, f"a runtime started after shutdown() without budgets has no limit ({r['after']})")
    if device == "cuda":
        cap, free = _limit_child("budget", device), _limit_child("none", device)
        mib = 1 << 20
        check(cap is not None and cap["streamed"] == 36 and 256 * mib <= cap["limit"] <= (256 + 64 + 1) * mib
              and cap["other"] <= (256 + 256) * mib,
              f"a 256 MiB update budget, 36 subgroups of 1e7 streamed: the device memory beyond torch's stays within "
              f"it plus 256 MiB ({cap and cap['other'] // mib} MiB, limit {cap and cap['limit'] // mib} MiB)")
        check(free is not None and free["other"] > (256 + 256) * mib,
              f"without a budget StarPU keeps what it freed ({free and free['other'] // mib} MiB beyond torch's), so "
              "the check above can fail")


def test_caller_cores(device, policy):
    """caller_cores: the automatic CPU threads leave that many cores to the caller (each runtime in a
    process of its own: one runtime per process); bad values refused."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "STARPU_NCPU")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child needs no GPU (and may not share an exclusive one)
    start = {"0": "d.get_runtime('cpu', ncuda=0, caller_cores=0)",
             "1": "d.get_runtime('cpu', ncuda=0, caller_cores=1)",
             # an overlapped optimizer that starts the runtime asks for one core by default
             "overlap": "(d.DeepOptimizerStates([torch.nn.Parameter(torch.zeros(4))], policy='cpu', ncuda=0, "
                        "overlap=True), d.get_runtime())[1]"}
    threads = {}
    for key, expr in start.items():
        code = f"import torch, deep_optimizer_states as d; print({expr}.cpu_threads)"
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
            out = r.stdout.split()
            threads[key] = int(out[-1]) if r.returncode == 0 and out and out[-1].isdigit() else None
        except subprocess.TimeoutExpired:
            threads[key] = None
    ok = None not in threads.values() and threads["1"] == max(1, threads["0"] - 1) and threads["overlap"] == threads["1"]
    check(ok, f"caller_cores=1 leaves one core to the caller, as an overlapped optimizer starting the runtime asks: "
          f"CPU Adam threads {threads}")
    expect_error(ValueError, "caller_cores", lambda: make_opt(make_model(device, torch.float32), policy, caller_cores=-1),
                 "caller_cores=-1")
    expect_error(ValueError, "caller_cores", lambda: make_opt(make_model(device, torch.float32), policy, caller_cores=1.0),
                 "caller_cores=1.0")


def test_timeline(device, policy):
    expect_error(ValueError, "timeline", lambda: make_opt(make_model(device, torch.float32), policy, timeline=1),
                 "timeline=1")
    o = make_opt(make_model(device, torch.float32), policy)

    def set_text():
        o.timeline = "off"
    expect_error(ValueError, "timeline", set_text, "opt.timeline = 'off'")
    o.close()
    runs = []
    for kw in ({"timeline": True}, {}):
        m = make_model(device, torch.bfloat16)
        o = make_opt(m, policy, **kw)
        train_steps(m, o, [1], device)
        x, y = batch(2, device)
        torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1)).backward()
        t0 = time.perf_counter()
        o.step()
        t1 = time.perf_counter()
        runs.append((o.last_step, snapshot(m, o), t0, t1, o.num_subgroups))
        if kw:  # the attribute switches the recording between steps
            o.timeline = False
            train_steps(m, o, [3], device)
            off = bool(o.last_step["stats"]) and all("timeline" not in st for st in o.last_step["stats"])
            o.timeline = True
            train_steps(m, o, [4], device)
            check(off and o.last_step["stats"] and all(st["timeline"] for st in o.last_step["stats"]),
                  "timeline switched off and on again between steps through the attribute")
        o.close()
    last, _, t0, t1, n_sub = runs[0]
    tol = 2e-3  # the clocks are related by one reading each way: 2 ms is plenty
    stats = last["stats"]
    starts_ok = all(t0 - tol <= st["started_at"] <= t1 + tol for st in stats)
    tasks_ok = all(0 <= t["start"] <= t["end"] <= t1 - st["started_at"] + tol for st in stats for t in st["timeline"])
    adams = sorted((k, t["subgroup"]) for k, st in enumerate(stats) for t in st["timeline"] if t["what"] == "adam")
    expected = sorted((k, i) for k, st in enumerate(stats) for i in range(st["subgroups_cpu"] + st["subgroups_gpu"]))
    lanes = sorted({t["lane"] for st in stats for t in st["timeline"]})
    check(starts_ok and tasks_ok, f"timeline: each phase began between the readings around step() and its tasks "
          f"lie within it ({sum(len(st['timeline']) for st in stats)} tasks, lanes {lanes})")
    check(adams == expected and len(adams) == n_sub, f"timeline: one Adam per subgroup ({len(adams)} of {n_sub})")
    check("timeline" not in runs[1][0]["stats"][0], "no timeline unless asked for")
    check(same_snapshot(runs[0][1], runs[1][1]), "timeline=True: the same bits as without")

    # the next forward overlapped: the phases left running are submitted smallest bucket first (the
    # group of biases and norms before the weights' subgroups), whose tasks then end first
    m = make_model(device, torch.float32)
    o = make_opt(m, policy, timeline=True)
    o.overlap_forward(m)
    train_steps(m, o, [1, 2], device)
    o.wait()
    st = o.last_step["stats"]
    small, large = sorted(range(len(o._buckets)), key=lambda k: o._buckets[k].num_params)
    ends = [st[k]["started_at"] + max(t["end"] for t in st[k]["timeline"]) for k in (small, large)]
    # the end order is the contract only where both phases' Adams ran on one lane (one worker takes
    # tasks in submission order); on two lanes (a CUDA worker beside the CPU's) they run at once
    adam_lanes = [{t["lane"] for t in st[k]["timeline"] if t["what"] == "adam"} for k in (small, large)]
    one_lane = len(adam_lanes[0] | adam_lanes[1]) == 1
    sizes = f"({o._buckets[small].num_params} elements, the larger's {o._buckets[large].num_params})"
    check(len(st) == 2 and st[small]["started_at"] <= st[large]["started_at"],
          f"the next forward overlapped: the smaller bucket's phase began first {sizes}")
    if one_lane:
        check(ends[0] <= ends[1], f"the next forward overlapped: the smaller bucket's phase ended first {sizes}, "
              f"their Adams on one lane ({sorted(adam_lanes[0])}); ends {ends[0] - ends[1]:+.6f} s apart")
    else:
        print(f"ok   the next forward overlapped: end order not compared, the phases' Adams ran on lanes "
              f"{sorted(adam_lanes[0])} and {sorted(adam_lanes[1])} at once (ends {ends[0] - ends[1]:+.6f} s apart)")
    o.close()

    # train_gpt.py --timeline: steps 2-4 of the tiny GPT, each phase inside its step() call
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tl.json")
        r = train_gpt.main(tiny_args("dos", device, policy, steps=5) + ["--timeline", path, "--timeline-steps", "2:4"])
        r["optimizer"].close()
        with open(path) as f:
            tl = json.load(f)
        steps = tl["steps"]
        ordered = [x["step"] for x in steps] == [2, 3, 4] and all(
            x["forward"][0] <= x["forward"][1] == x["backward"][0] <= x["backward"][1] == x["step_call"][0]
            <= x["step_call"][1] for x in steps)
        check(ordered, "train_gpt.py --timeline: forward, backward and step() of steps 2, 3 and 4, in order")
        calls = {x["step"]: x["step_call"] for x in steps}
        inside = [calls[ph["step"]][0] - tol <= ph["started"] and all(
            ph["started"] - 1e-9 <= t["start"] <= t["end"] <= calls[ph["step"]][1] + tol for t in ph["tasks"])
            for ph in tl["phases"]]
        adams = [sorted(t["subgroup"] for t in ph["tasks"] if t["what"] == "adam") for ph in tl["phases"]]
        check(len(inside) == 3 and all(inside) and all(a == list(range(len(a))) and a for a in adams),
              f"and each step's phase inside its step() call, one Adam per subgroup ({[len(a) for a in adams]})")
    # the budgets' options: the same bits on a machine without a CUDA worker (no effect there), bad values refused
    r = train_gpt.main(tiny_args("dos", device, policy, steps=3) + ["--gpu-resident-budget", "0.001",
                                                                   "--gpu-update-budget", "0.5"])
    ref = train_gpt.main(tiny_args("dos", device, policy, steps=3))
    for x in (r, ref):
        x["optimizer"].close()
    check(r["optimizer"].gpu_resident_budget == 10 ** 6 and r["optimizer"].gpu_update_budget == 5 * 10 ** 8,
          "train_gpt.py --gpu-resident-budget 0.001 --gpu-update-budget 0.5 reach the optimizer in bytes")
    if device != "cuda":
        check(r["losses"] == ref["losses"], "and, without a CUDA worker, change nothing")
    for bad in (["--gpu-resident-budget", "-1"], ["--gpu-update-budget", "1e-12"], ["--gpu-update-budget", "nan"],
                ["--gpu-resident-budget", "inf"], ["--gpu-update-budget", "1e12"]):
        expect_refused(tiny_args("dos", device, policy) + bad, " ".join(bad))
    for bad in ("3", "0:2", "4:2", "a:b"):
        expect_refused(tiny_args("dos", device, policy) + ["--timeline", "x.json", "--timeline-steps", bad],
                       f"--timeline-steps {bad}")


def expect_refused(argv, what):
    """Checks that train_gpt.py refuses the command line ``argv`` (list of str) as argparse does:
    SystemExit with status 2 (a usage error); ``what`` names the case in the check's line."""
    try:
        train_gpt.parse_args(argv)
        check(False, f"{what} refused")
    except SystemExit as e:
        check(e.code == 2, f"{what} refused (exit 2)")


def tail_runs(device, policy, before_each=None, **opt_kw):
    """Trains a bf16 model 4 steps with tail_subgroups 0, then 3, under ``policy`` (a str), checking each
    phase's binding counts as it goes; ``before_each`` (a function of no argument, or None) is called
    before each of the two optimizers is made; ``opt_kw`` goes to make_opt. Returns ``(runs, mixed)``: runs a list of two (losses,
    snapshot, tail_bound per phase) tuples, mixed the phases with tail 3 whose plan had more than 3
    subgroups on each side (all 3 then bound)."""
    runs = []
    mixed = 0  # phases whose plan leaves CPU and streamed subgroups beside a full tail
    for tail in (0, 3):
        if before_each:
            before_each()
        mk = make_model(device, torch.bfloat16)
        o = make_opt(mk, policy, tail_subgroups=tail, **opt_kw)
        check(o.tail_subgroups == tail, f"the optimizer keeps tail_subgroups={tail}")
        bound = []
        losses = []
        cuda = False
        streamed_before = {}  # per bucket: whether an earlier step streamed (allocated GPU buffers)
        for s in range(1, 5):
            losses += train_steps(mk, o, [s], device)
            cuda = dos.current_runtime().cuda_workers > 0
            for b, st in enumerate(o.last_step["stats"]):
                check(0 <= st["tail_moved"] <= st["tail_bound"] <= tail,
                      f"tail_subgroups={tail}: {st['tail_bound']} bound, {st['tail_moved']} moved")
                bound.append(st["tail_bound"])
                planned_cpu = st["subgroups_cpu"] + st["subgroups_gpu"] - st["planned_streamed"] - st["planned_resident"]
                if not streamed_before.get(b):
                    # a bucket's first step that streams allocates its GPU buffers: nothing bound
                    check(st["tail_bound"] == 0, f"bucket {b}'s first step that streams: nothing bound "
                                                 f"(got {st['tail_bound']})")
                elif cuda and tail and st["planned_streamed"] > tail and planned_cpu > tail:
                    # the plan has more than `tail` subgroups on each side: the last `tail` are bound
                    mixed += 1
                    check(st["tail_bound"] == tail, f"a plan of {planned_cpu} CPU and {st['planned_streamed']} streamed "
                                                    f"subgroups: the last {tail} bound (got {st['tail_bound']})")
                streamed_before[b] = streamed_before.get(b) or st["planned_streamed"] > 0
        if not cuda:
            check(sum(bound) == 0, f"no CUDA worker: nothing bound (got {bound})")
        elif tail:
            print(f"     policy {policy}, tail_subgroups={tail}: {mixed} phase(s) with a plan mixed enough to bind "
                  f"all {tail}")
        runs.append((losses, snapshot(mk, o), bound))
        o.close()
    check(runs[0][0] == runs[1][0] and same_snapshot(runs[0][1], runs[1][1]),
          f"policy {policy}: tail_subgroups=3 (bound per phase: {runs[1][2]}): losses, parameters and state bit for bit "
          "as with 0")
    return runs, mixed


# A process of its own (its own rates cache, DOS_CACHE_DIR): the tail binding under policy dos with
# rates that make its plan mixed. The cache is first filled by a calibration (one step of the test's
# model), then, before each optimizer, every rates file in it is rewritten with rates at which a
# subgroup of 100 parameters takes about as long on the CPU (0.1 ms at 1e6 params/s: one thread of the
# worker's team of T, at U_c = T x 1e6, since a subgroup of one work item runs on one thread,
# Execution::cpu_team_threads) as its state's crossing (1200 bytes each way at 1.4e7 bytes/s, 0.086
# ms), so that the plan puts about half of
# the 66-subgroup bucket on each side (the phases' refinement then moves the rates by at most 2x per
# phase, and a plan 4x further to one side still has more than 3 on each); the binder then has a
# full tail to bind, and the same-bits check compares phases in which it bound (and may have moved)
# 3 subgroups.
_TAIL_CHILD = """
import glob, json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
sys.argv = sys.argv[:1]
cache = tempfile.mkdtemp(prefix="dos-tail-rates-")
os.environ["DOS_CACHE_DIR"] = cache
import test_pytorch_options as t
from test_pytorch import failures
team = t.dos.get_runtime("dos").cpu_threads
m = t.make_model("cuda", t.torch.bfloat16)
o = t.make_opt(m, "dos", subgroup_size=100)
t.train_steps(m, o, [1], "cuda")
o.close()
files = sorted(glob.glob(os.path.join(cache, "rates-*.json")))
t.check(len(files) > 0, f"the calibration wrote its rates files to the child's cache ({files})")
rates = {"U_c": 1e6 * team, "U_c_dma": 1e6 * team, "U_g": 1e12, "D_c": 1e12, "B_h2d": 1.4e7, "B_d2h": 1.4e7, "link_share": 1.0}
def balanced():
    for f in files:
        with open(f, "w") as out:
            json.dump(dict(rates, calibrated=rates), out)
runs, mixed = t.tail_runs("cuda", "dos", before_each=balanced, subgroup_size=100)
t.check(mixed > 0, f"policy dos at rates that balance the sides: at least one phase with a plan mixed enough to "
                   f"bind all 3 (got {mixed})")
t.dos.shutdown()
for f in files:
    os.remove(f)
os.rmdir(cache)
print(f"{len(failures)} failure(s)")
for f in failures:
    print("  failed: " + f)
sys.exit(1 if failures else 0)
"""


def test_tail_subgroups(device, policy):
    m = make_model(device, torch.float32)
    for bad in (-1, 1000001, True, 2.0, "6"):
        expect_error(ValueError, "tail_subgroups", lambda: make_opt(m, policy, tail_subgroups=bad),
                     f"tail_subgroups={bad!r}")
    tail_runs(device, policy)
    if device == "cuda":
        # the model's own plans for this small model may keep a side under 4 subgroups (on the GPU
        # machine they did), which binds nothing: rates that balance the sides make a plan that binds
        try:
            r = subprocess.run([sys.executable, "-c", _TAIL_CHILD, os.path.dirname(os.path.abspath(__file__))],
                               capture_output=True, text=True, timeout=240)
            out, ok = r.stdout + r.stderr, r.returncode == 0
        except subprocess.TimeoutExpired:
            out, ok = "timed out after 240 s", False
        print("\n".join("     " + line for line in out.splitlines() if line.startswith(("ok", "FAIL", "     policy", "  failed"))))
        check(ok, f"at balancing rates in a process of its own, the tail binding binds all 3 and keeps the bits "
                  f"({'passed' if ok else out[-1500:]})")
    # train_gpt.py --tail-subgroups: reaches the optimizer; bad values and other optimizers refused
    args = train_gpt.parse_args(tiny_args("dos", device, policy) + ["--tail-subgroups", "4"])
    check(args.tail_subgroups == 4, f"train_gpt.py --tail-subgroups 4 parsed (got {args.tail_subgroups})")
    r = train_gpt.main(tiny_args("dos", device, policy, steps=2) + ["--tail-subgroups", "4"])
    r["optimizer"].close()
    check(r["optimizer"].tail_subgroups == 4, "train_gpt.py --tail-subgroups 4 reaches the optimizer")
    recs = [(x.get("tail_bound"), x.get("tail_moved")) for x in r["records"]]
    check(len(recs) == 2 and recs[0] == (0, 0) and all(b is not None and 0 <= m <= b for b, m in recs)
          and (dos.current_runtime().cuda_workers > 0 or all(b == 0 for b, _ in recs)),
          f"and each step's record has the binding's counts, none in step 1 nor without a CUDA worker ({recs})")
    for bad in (["--tail-subgroups", "-1"], ["--tail-subgroups", "1000001"], ["--tail-subgroups", "x"]):
        for opt_name in ("dos", "adamw"):
            expect_refused(tiny_args(opt_name, device, policy) + bad, f"--optimizer {opt_name} {' '.join(bad)}")
    expect_refused(tiny_args("adamw", device, policy) + ["--tail-subgroups", "2"], "--optimizer adamw --tail-subgroups 2")
    for overlap in ("backward", "forward", "both"):  # the runtime binds nothing in those steps
        expect_refused(tiny_args("dos", device, policy) + ["--tail-subgroups", "2", "--overlap", overlap],
                       f"--tail-subgroups 2 --overlap {overlap}")


def test_flat_gradients(device, policy):
    """flat_gradients=False: the same bits as True; no copy at step; bad values refused."""
    expect_error(ValueError, "flat_gradients", lambda: make_opt(make_model(device, torch.float32), policy,
                                                               flat_gradients=1), "flat_gradients=1")
    expect_error(ValueError, "needs flat_gradients=True",
                 lambda: make_opt(make_model(device, torch.float32), policy, flat_gradients=False, overlap=True),
                 "overlap=True with flat_gradients=False")
    for set_to_none in (True, False):
        runs = [frame_run("dos-adamw", device, policy, set_to_none=set_to_none, steps=6,
                          opt_kw=dict(flat_gradients=flat)) for flat in (True, False)]
        (la, _, na, ma, oa, _), (lb, _, nb, mb, ob, _) = runs
        check(la == lb and na == nb and same_snapshot(snapshot(ma, oa), snapshot(mb, ob)),
              f"flat_gradients=False, model.zero_grad(set_to_none={set_to_none}), 3 micro-batches, clip_grad_norm_, "
              "a scheduler: the same bits as True")
        oa.close(), ob.close()

    # the optimizer's own clipping (active), a NaN step, model.zero_grad(set_to_none=True)
    snaps = []
    for flat in (True, False):
        m = make_model(device, torch.bfloat16)
        o = make_opt(m, policy, flat_gradients=flat)
        losses = train_steps(m, o, range(1, 3), device)
        x, y = batch(3, device)
        loss = torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1))
        loss.backward()
        ptrs = [p.grad.data_ptr() for p in m.parameters()]
        o.step()
        losses.append(float(loss))
        kept = ptrs == [p.grad.data_ptr() for p in m.parameters()]
        o.zero_grad()
        x, y = batch(4, device)
        torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1)).backward()
        next(m.parameters()).grad.view(-1)[0] = float("nan")
        o.step()
        skipped = o.last_step["skipped"]
        for s in range(5, 8):
            m.zero_grad(set_to_none=True)
            x, y = batch(s, device)
            loss = torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1))
            loss.backward()
            o.step()
            losses.append(float(loss))
        snaps.append((losses, skipped, snapshot(m, o)))
        if not flat:
            check(kept, "flat_gradients=False: a step copies no gradient (each p.grad keeps its storage)")
            expect_error(ValueError, "needs flat_gradients=True", lambda: o.overlap_forward(m),
                         "overlap_forward with flat_gradients=False")
        o.close()
    (la, sa, pa), (lb, sb, pb) = snaps
    check(la == lb and sa and sb and same_snapshot(pa, pb),
          "flat_gradients=False with max_grad_norm, a NaN step and model.zero_grad(set_to_none=True): the same bits "
          "as True")

    # one gradient tensor shared by two parameters, clipping active: each element scaled once
    snaps = []
    for flat in (True, False):
        torch.manual_seed(7)
        a = torch.nn.Parameter(torch.randn(300, device=device))
        b = torch.nn.Parameter(torch.randn(300, device=device))
        o = dos.DeepOptimizerStates([a, b], lr=1e-2, subgroup_size=128, policy=policy, max_grad_norm=0.1,
                                    flat_gradients=flat)
        for _ in range(2):
            g = torch.randn(300, device=device)
            a.grad, b.grad = g, g
            o.step()
        snaps.append((a.detach().clone(), b.detach().clone(), o.last_step["clip_coef"]))
        o.close()
    (a1, b1, c1), (a2, b2, c2) = snaps
    check(c1 < 1.0 and torch.equal(a1, a2) and torch.equal(b1, b2),
          f"one gradient tensor given to two parameters, clipping active (coefficient {c1:.3f}): flat_gradients=False "
          "gives the bits of True")


def test_adamw_code(device, policy):
    def one_step(**kw):
        m = make_model(device, torch.float32)
        o = make_opt(m, policy, **kw)
        train_steps(m, o, [1, 2], device)
        snap = snapshot(m, o)
        o.close()
        return snap

    ref = one_step()
    same = one_step(amsgrad=False, maximize=False, capturable=False, differentiable=False, fused=None, foreach=True)
    check(same_snapshot(ref, same), "torch.optim.AdamW's option keywords at their defaults (foreach=True too): "
                                    "the same bits as without them")
    check(same_snapshot(ref, one_step(fused=False, foreach=False)), "fused=False, foreach=False: the same bits")
    m = make_model(device, torch.float32)
    for name in ("amsgrad", "maximize", "capturable", "differentiable", "fused"):
        expect_error(ValueError, f"{name}=True is not supported", lambda: make_opt(m, policy, **{name: True}),
                     f"{name}=True refused")

    # a channels_last parameter: refused, the message saying how to make it contiguous, which then works
    conv = torch.nn.Conv2d(3, 4, 3).to(device=device, memory_format=torch.channels_last)
    expect_error(ValueError, "contiguous_format", lambda: dos.DeepOptimizerStates(conv.parameters(), policy=policy),
                 "a channels_last weight")
    conv = conv.to(memory_format=torch.contiguous_format)
    try:
        dos.DeepOptimizerStates(conv.parameters(), policy=policy).close()
        accepted = ""
    except ValueError as e:
        accepted = str(e)
    check(not accepted, f"and accepted once made contiguous as the message says {accepted}")

    # param_groups edited by hand after construction
    m = make_model(device, torch.float32)
    o = make_opt(m, policy)
    train_steps(m, o, [1], device)
    extra = torch.nn.Parameter(torch.ones(5, device=device))
    group = o.param_groups[1]["params"]
    kept = list(group)
    edits = (("a parameter appended to a group", lambda: group.append(extra)),
             ("a parameter replaced", lambda: group.__setitem__(0, extra)),
             ("a parameter removed", lambda: group.pop()),
             ("a group appended", lambda: o.param_groups.append(dict(o.param_groups[1], params=[extra]))))
    for what, edit in edits:
        x, y = batch(2, device)
        torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1)).backward()
        extra.grad = torch.ones_like(extra)
        before = snapshot(m, o)
        edit()
        expect_error(ValueError, "param_groups was edited", o.step, f"{what}: step() refused")
        expect_error(ValueError, "param_groups was edited", o.state_dict, f"{what}: state_dict() refused")
        group[:] = kept
        del o.param_groups[2:]
        check(same_snapshot(before, snapshot(m, o)) and torch.equal(extra.detach(), torch.ones(5, device=device)),
              f"{what}: nothing updated")
        o.zero_grad()
    train_steps(m, o, [2], device)
    check(o.steps_taken == 2, "the groups restored: step() runs again")
    o.close()

    # each group's default weight decay follows its own mode
    m = make_model(device, torch.float32)
    ps = list(m.parameters())
    o = dos.DeepOptimizerStates([{"params": ps[:2], "decoupled": False}, {"params": ps[2:4]},
                                 {"params": ps[4:], "decoupled": False, "weight_decay": 0.5}], policy=policy)
    check([g["weight_decay"] for g in o.param_groups] == [0.0, 1e-2, 0.5],
          f"weight_decay left out: 0 for an Adam group, 1e-2 for AdamW; given: kept "
          f"({[g['weight_decay'] for g in o.param_groups]})")
    o.close()
    o = dos.DeepOptimizerStates([{"params": ps[:2], "decoupled": True}, {"params": ps[2:]}], decoupled=False,
                                policy=policy)
    check([g["weight_decay"] for g in o.param_groups] == [1e-2, 0.0],
          f"decoupled=False by default, one group AdamW: 1e-2 for it, 0 for the other "
          f"({[g['weight_decay'] for g in o.param_groups]})")
    o.close()


if __name__ == "__main__":
    sys.exit(main([test_gpu_budgets, test_gpu_memory_limit, test_timeline, test_caller_cores, test_flat_gradients,
                   test_tail_subgroups, test_adamw_code]))
