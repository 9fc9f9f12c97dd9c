#!/usr/bin/env python3
"""dos-compare: the same dos-train workload under several scheduling policies, side by side.

Runs ``dos-train`` once per run and repeat (StarPU starts once per process, so each run gets its
own process) with the same model, shard, subgroup size, seed and iteration count, reads each run's
``--report`` JSON, and prints one table: median iteration seconds (with ``--emulate-compute`` among
the dos-train arguments), median update-phase seconds (iterations 2..) and their spread, update
Gparams/s, speedup over ``cpu`` and over ``dmda`` (when those ran), and the percentage of the lower
bound (lower bound / measured, so 100% is the bound itself; the bound is the resource model's: a
run's own when its report has one, else that of the first run with the same resident budget that
has one).

Runs:
  --policies dos,cpu,dmda        one run per policy (dos-train --policy). Default dos,cpu,dmda,gpu;
                                 a policy that needs a GPU (gpu) is skipped, with a note, when
                                 dos-train reports no CUDA worker
  --overlap                      also run each run with the update overlapped with backward (LABEL+overlap;
                                 needs --emulate-compute after --); the others run with --overlap off
  --run LABEL='ARGS'             one more run named LABEL with its own dos-train arguments (e.g.
                                 --run "dos-native=--policy dos --grad-transfer native"); repeatable.
                                 NAME=VALUE words before them set environment variables for that
                                 run's dos-train only, as a shell's would (e.g. a measurement switch:
                                 --run "starpu-stream=DOS_DOWNLOAD_STREAM=starpu --policy dos");
                                 its log's first line shows them. A LABEL row without a resident
                                 budget (of --resident-budgets or its own) or overlap, LABEL not
                                 dos, gets its own speedups against the baselines and
                                 the peers (``LABEL_vs_peer_zero_offload`` ...: "speedups of the
                                 --run rows", compare.json's ``run_ratios``), checked against the
                                 spreads as dos's are
  --resident-budgets 10GB,20GB   for each budget B, a ``dos@B`` run (dos --gpu-resident-budget B)
                                 and a ``static:R@B`` run, R the smallest CPU share whose resident
                                 subgroups fit in B (DeepSpeed's ratio for the same bytes)
  --repeats R                    R rounds: each round runs every run once (in the same order), then
                                 the baselines once, then the peers once, so that a machine whose
                                 speed drifts between processes weighs on every row alike (on the
                                 GPU machine CPU Adam's calibrated rate differed by up to 1.7x
                                 between processes minutes apart). The table gives the median of the R
                                 runs' medians and their minimum..maximum (with R = 1, the spread is
                                 that of the run's iterations 2..); a peer's row, the median of its
                                 R means and their minimum..maximum (with R = 1, its fastest and
                                 slowest phase when its RESULT line gives them)
  --baselines [LIST]             the repository's PyTorch baselines
                                 (python/deep_optimizer_states/baselines.py) on the same N, S, dtype,
                                 optimizer, hyper-parameters, CPU threads and iteration count, once
                                 per round: LIST (default zero_offload,stride:2,stride:3,stride:4) and,
                                 per resident budget, twinflow:R with the static run's R (with
                                 --master compact, the R of the full state's fit: the baselines
                                 keep 12 B/param); rows
                                 ``baseline VARIANT``. Run by a Python that imports torch
                                 (--baselines-python, else the first of this one and
                                 /usr/bin/python3 that does); skipped with a note when none does
  --peers PATH                   an external PyTorch re-creation of the baselines, as a cross-check
                                 (a script taking --n, --s, --iters and --variants and printing
                                 ``RESULT VARIANT SECONDS s/phase`` lines, optionally followed by
                                 ``(best B worst W``, its phases' fastest and slowest seconds (a
                                 pair that does not hold the mean is left out, with a WARNING):
                                 compare_runs.run_peers;
                                 for example a copy kept at .peers/torch_update_phase.py,
                                 git-ignored), on the same N and S: --peer-variants (default
                                 zero_offload and dos_stride:2..4; when --policies or --run ran
                                 something) and, per resident budget, twinflow:R_gpu keeping the
                                 subgroups whose full state fits resident; rows ``peer VARIANT``
  --timeline                     the first dos run writes its last phase's timeline; plotted under
                                 the bars (CPU worker, GPU worker, H2D and D2H rates)
  --host-bench [PATH]            after the first round's runs, measure CPU Adam and full-duplex DMA
                                 alone and side by side with dos-bench host (PATH, default
                                 build/bench/dos-bench), and give each run its percentage of the
                                 lower bound at those rates too (examples/host_probe.py): a yardstick
                                 that the run's own refinement does not move; and the speedups of dos
                                 that a phase at that bound would give (the model's bound at the
                                 probe's rates: no plan in the model does better). --run rows get
                                 no share of it (their arguments may change the bound). Needs a run that
                                 reports the model's rates (dos, static:R, greedy) and a GPU; else
                                 a WARNING says why there is none

Warnings (printed, and kept in compare.md and compare.json) say where a comparison cannot mean
anything: no CUDA worker (every policy then updates everything on the CPU, dos is cpu), or a
difference between two medians smaller than their spread.

With ``--check-params`` every run's final fp32 master parameters (its first repeat's) are compared
with the ``cpu`` run's, bit for bit (whether a GPU took part or not: both sides' kernels evaluate
the same IEEE fp32 operations in the same order). Outputs (``--out DIR``): ``compare.json``, ``compare.md``,
``compare.png`` (when this Python, /usr/bin/python3 or python3 on PATH imports matplotlib), and
each run's report and log (LABEL.json/.log, LABEL.rK.json/.log for round K >= 2; likewise
baselines[.rK].json/.log and peers[.rK].log). Exit status: 0; 1 when --check-params found parameters that
differ from the cpu run's, or --plot-only drew nothing; 2 when dos-train is missing, a run fails (its log is kept
and named; the other runs' results are still written), a report lacks its summary, the baselines
fail, or an argument is malformed.
"""
import json
import math
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # loaded by path (as the tests do) rather than run: its modules are beside it
    sys.path.insert(0, HERE)
import compare_plot  # noqa: E402 (the picture's drawing)
import host_probe  # noqa: E402 (the bound at dos-bench host's rates)
from compare_args import GPU_ONLY_POLICIES, TIMELINE_RUN, parse_args  # noqa: E402 (the command line)
from compare_runs import (MATPLOTLIB_PROBE, arg_value, compare_params, file_tag, merge_baselines,  # noqa: E402
                          python_with, run_baselines, run_one, run_peers)


def measure_probe(a, runs, order, notes):
    """--host-bench: dos-bench host's rates (host_probe.probe_rates) and the lower bound at them for
    no resident budget and each of --resident-budgets, from the first run in ``order`` whose report
    has the model's rates. Returns {"rates": rates dict, "from": "run LABEL", "bounds": {budget
    text ("" for none, when a run has no resident budget): seconds}, "notes": what the model could
    not hold of the probe's figures}, or None with a WARNING appended to ``notes`` saying why.
    Runs from --run get no share of it (their own arguments may change the workload's bound)."""
    src = next((l for l in order if l in runs and "rates" in runs[l]["reports"][0]), None)
    if src is None:
        notes.append("WARNING: --host-bench: no run reported the model's rates (a dos, static:R or greedy run with a "
                     "CUDA worker): no lower bound at dos-bench host's rates")
        return None
    r = runs[src]["reports"][0]
    if r.get("cpu_workers") != 1:
        notes.append(f"WARNING: --host-bench: run {src} has {r.get('cpu_workers')} CPU workers; dos-bench host "
                     f"measures one team: no lower bound at its rates")
        return None
    # the compact master's runs (--master compact after --) move CPU Adam's state in its own form
    state = "compact" if arg_value(a.train_args, "--master") == "compact" else "full"
    bench, why = host_probe.run_bench(a.host_bench, r["cpu_threads"], a.out, state)
    if bench is None:
        notes.append(f"WARNING: --host-bench: {why}: no lower bound at its rates")
        return None
    try:
        rates, held = host_probe.probe_rates(bench, r["cpu_threads"], r["rates"], r["calibrated_rates"], state)
    except ValueError as e:
        notes.append(f"WARNING: --host-bench: {e}: no lower bound at its rates")
        return None
    notes.extend(f"WARNING: --host-bench: {n}" for n in held)
    bounds = {}
    none = [""] if any(runs[l]["budget"] is None for l in order if l in runs) else []
    for text in none + [t for t, _ in a.budgets]:
        b, why = host_probe.bound_at(a.dos_train, a.train_args, rates, a.out, file_tag(text) or "none", text or None)
        if b is None:
            notes.append(f"WARNING: --host-bench: {why}")
        else:
            bounds[text] = b
    if not bounds:
        return None
    print("dos-compare: lower bound at dos-bench host's rates: "
          + ", ".join(f"{t or 'no resident budget'} {b:.4f} s" for t, b in bounds.items()), flush=True)
    return {"rates": rates, "from": f"run {src}", "bounds": bounds, "notes": held}


def median_of(values):
    """Median of the positive values (None when there is none)."""
    v = [x for x in values if x and x > 0]
    return statistics.median(v) if v else None


def summarize(reports, key="update_seconds_median"):
    """Median, minimum and maximum of summary[key] over the reports of one configuration's
    repeats. With one report the spread is that of its iterations 2.. (per-iteration figures, key
    without its ``_median``), so a single run still shows its noise. (None, None, None) when absent."""
    vals = [r["summary"][key] for r in reports if r["summary"].get(key) is not None]
    if not vals:
        return None, None, None
    if len(vals) == 1:
        it = reports[0].get("iterations") or []
        per = [x.get(key[: -len("_median")]) for x in (it[1:] if len(it) > 1 else it)]
        per = [x for x in per if x is not None]
        if per:
            return vals[0], min(per), max(per)
    return statistics.median(vals), min(vals), max(vals)


def bound_share(label, update_seconds, bound_seconds, overlapped, bound_name="its printed lower bound",
                beaten_because="the bound comes from the calibrated rates, and this calibration underestimated one "
                               "(dos-train --recalibrate measures them again)"):
    """The "% of lower bound" of a run and a warning when it cannot be one: (percent or None, note or
    None). update_seconds: the run's median update phase (s); bound_seconds: the lower bound (s, > 0),
    by default the printed one (bound_name names it in the note, beaten_because says why a phase
    can beat it). An overlapped run's update seconds begin before forward, so there is no phase to
    bound (None, None). A phase faster than its bound gets its percent (above 100) and a WARNING
    note: one of the rates the bound comes from was underestimated."""
    if overlapped:
        return None, None
    pct = 100.0 * bound_seconds / update_seconds
    if bound_seconds <= update_seconds:
        return pct, None
    return pct, (f"WARNING: {label}: the update phase ({update_seconds:.4f} s) ran faster than {bound_name} "
                 f"({bound_seconds:.4f} s): {beaten_because}; its % of lower bound is no fraction of a bound")


def lower_bound(reports):
    """The resource model's lower bound of a configuration, seconds: the median over its repeats'
    iterations 2.. of the positive lower_bound_seconds (any policy whose report has one), or None."""
    vals = []
    for r in reports:
        it = r.get("iterations") or []
        vals += [x.get("lower_bound_seconds", 0.0) for x in (it[1:] if len(it) > 1 else it)]
    return median_of(vals)


def bounds_by_budget(runs):
    """{resident budget (None: none): the lower bound of the first run (in order) with that budget
    that has one}; ``runs``: {label: {"reports": [...], "budget": ...}}, in run order."""
    bounds = {}
    for entry in runs.values():
        lb = lower_bound(entry["reports"])
        if lb and entry["budget"] not in bounds:
            bounds[entry["budget"]] = lb
    return bounds


def compact_state_bytes(n):
    """Bytes of a compact state buffer of n parameters (codelets/kernels/compact_master.h,
    compact_state_bytes_for): the stride s (n padded to 16), a head of s/2 + ceil(s/32) fp32
    elements padded to 16, exp_avg and exp_avg_sq; about 10.125 bytes per parameter."""
    s = (n + 15) // 16 * 16
    head = (s // 2 + (s + 31) // 32 + 15) // 16 * 16
    return 4 * (head + 2 * s)


def resident_fit(n_params, subgroup, budget, compact=False):
    """Subgroups, counted from the last, whose state fits in budget bytes (models/resource_model.h,
    resident_subgroups): the fp32 state (12 B/param, each of its three slices padded to 16
    elements), or with compact (dos-train --master compact) the compact state
    (compact_state_bytes); and the subgroup count."""
    sizes = [subgroup] * (n_params // subgroup) + ([n_params % subgroup] if n_params % subgroup else [])
    used = count = 0
    for s in reversed(sizes):
        state = compact_state_bytes(s) if compact else 12 * ((s + 15) // 16 * 16)
        if used + state > budget:
            break
        used += state
        count += 1
    return count, len(sizes)


def copy_rule_notes(runs, order):
    """What the runtime's adaptive copy rule (DOS_COPY_BY=adaptive, dos-train's default) did in each
    run: a note for every run (label in ``order``, its reports in ``runs[label]["reports"]``, one
    per round, each with "iterations" whose "downloads_dodge_writebacks" says whether that phase's
    gradient downloads dodged the state write-backs) in which some phase dodged them and an
    earlier one of the same round did not: the rule turned there, and the run's phases mix the two
    ways of copying ("round K" named when the run has several rounds). Reports from a dos-train
    without the field give no note. Returns a list of strings (empty when no run turned)."""
    notes = []
    for label in order:
        reports = runs.get(label, {}).get("reports", [])
        for k, rep in enumerate(reports):
            dodge = [it.get("downloads_dodge_writebacks") for it in rep.get("iterations") or []]
            turned = next((i for i in range(1, len(dodge)) if dodge[i] and dodge[i - 1] is False), None)
            if turned is None:
                continue
            where = f" (round {k + 1})" if len(reports) > 1 else ""
            notes.append(f"run {label}{where}: the adaptive copy rule turned after phase {turned}: from phase "
                         f"{turned + 1} on, its gradient downloads issued beside a state write-back went by the "
                         f"kernel (as --copy-by auto), before by the copy engine (as --copy-by memcpy-down)")
    return notes


UNSTEADY = 2.0  # a row whose slowest phase took more than this many times its fastest is warned of


def within_spread(x, y):
    """A warning when two (median, min, max) triples differ by less than the spread (max - min) of
    either that has one (min and max not None), else None (also when neither has one)."""
    spreads = [t[2] - t[1] for t in (x, y) if t[1] is not None and t[2] is not None]
    if not spreads:
        return None
    diff, spread = abs(x[0] - y[0]), max(spreads)
    if diff < spread:
        return f"the difference of the medians ({diff:.4f} s) is smaller than the spread ({spread:.4f} s)"
    return None


def plot(a, rows, baselines, peers, timeline_path):
    """compare.png in --out: the update seconds of every run (blue, with their min..max), baseline
    (green, likewise) and peer (grey), the lower bound, and under them the timeline when there is one.
    Where this Python cannot import matplotlib, another that can (/usr/bin/python3, python3 on
    PATH) draws it from compare.json (``--plot-only``); with none, prints a note and draws nothing.
    Returns whether compare.png was drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        other = None if a.plot_only else python_with(MATPLOTLIB_PROBE, skip_this=True)
        png = os.path.join(a.out, "compare.png")
        if other and os.path.exists(os.path.join(a.out, "compare.json")):
            print(f"dos-compare: matplotlib is not importable here: drawing compare.png with {other}", flush=True)
            if subprocess.call([other, os.path.abspath(__file__), "--plot-only", f"--out={a.out}"]) == 0 \
                    and os.path.exists(png):
                return True
        print("dos-compare: matplotlib is not importable here: no PNG (the table is in compare.md)")
        return False
    tl = None
    if timeline_path and os.path.exists(timeline_path):
        with open(timeline_path) as f:
            tl = json.load(f)
    compare_plot.draw(plt, os.path.join(a.out, "compare.png"), rows, baselines, peers, tl)
    return True


def main(argv=None):
    """Runs everything the arguments ask for and writes the outputs; returns the exit status (see
    the module's docstring)."""
    a = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    if a.plot_only:
        path = os.path.join(a.out, "compare.json")
        if not os.path.exists(path):
            print(f"dos-compare: --plot-only: {path} does not exist", file=sys.stderr)
            return 2
        with open(path) as f:
            d = json.load(f)
        # the timeline of the run that wrote compare.json (a stale timeline.json beside it is not drawn)
        tl = os.path.join(a.out, "timeline.json") if d.get("timeline", True) else None
        return 0 if plot(a, d["rows"], d.get("baselines", []), d.get("peers", {}), tl) else 1
    if not os.access(a.dos_train, os.X_OK):
        print(f"dos-compare: {a.dos_train} is not an executable dos-train: build it (scripts/setup.sh build) or "
              f"give --dos-train PATH", file=sys.stderr)
        return 2
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        print(f"dos-compare: --out {a.out} exists and is not a folder: give a folder for the reports", file=sys.stderr)
        return 2
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        print(f"dos-compare: cannot make the --out folder {a.out}: {e}", file=sys.stderr)
        return 2
    runs, failed, skipped, notes = {}, [], {}, []
    executed = []  # (label, dos-train arguments) in the order round 0 ran them; later rounds repeat it
    timeline_path = os.path.join(a.out, "timeline.json") if a.timeline else None

    def cuda_workers():
        """CUDA workers dos-train reported (None before any run succeeded)."""
        r = next(iter(runs.values()), None)
        return r["reports"][0].get("cuda_workers", 0) if r else None

    def skip(label, why):
        skipped[label] = why
        print(f"dos-compare: run {label} skipped: {why}", file=sys.stderr)

    def do(label, args, budget=None):
        if arg_value(args, "--policy") in GPU_ONLY_POLICIES and cuda_workers() == 0:
            skip(label, f"dos-train reports no CUDA worker, and policy {arg_value(args, '--policy')} needs one")
            return None
        r, log, p = run_one(a, label, args, 0)
        if r is None:
            with open(log, errors="replace") as f:
                needs_gpu = re.search(r"needs a CUDA worker and there is none", f.read())
            if needs_gpu:  # a plan that declares it needs a GPU (PlanNeeds::cuda_worker), on a machine without
                skip(label, f"policy {arg_value(args, '--policy')} needs a CUDA worker and dos-train has none ({log})")
                return None
            failed.append(label)
            return None
        runs[label] = {"reports": [r], "params": p, "budget": budget}
        executed.append((label, args))
        return r

    # a run that needs a GPU goes after one that does not, so that dos-train has said whether it
    # has a CUDA worker before it starts (the table keeps the given order)
    order = [l for l, _ in a.runs]
    for label, args in sorted(a.runs, key=lambda r: arg_value(r[1], "--policy") in GPU_ONLY_POLICIES):
        do(label, args)
    # per resident budget: the TwinFlow baselines' GPU fraction and CPU share (fp32 state, 12 B/param:
    # the subgroups whose full state fits), and the static run's CPU share (the runtime's own form)
    twinflow, twinflow_share, static_share = [], [], []
    if a.budgets:
        ref = next(iter(runs.values()), None)
        first = ref["reports"][0] if ref else None
        if first is None:  # learn N and S from a first budget run
            first = do(f"dos@{a.budgets[0][0]}", ["--policy", "dos", "--gpu-resident-budget", a.budgets[0][0],
                                                  "--overlap", "off"], a.budgets[0][0])
            order.append(f"dos@{a.budgets[0][0]}")
        if first is None:
            print("dos-compare: no run succeeded: cannot size the resident budgets", file=sys.stderr)
            return 2
        n, s = first["params"], first["subgroup_size"]
        for text, b in a.budgets:
            fit, nsub = resident_fit(n, s, b, arg_value(a.train_args, "--master") == "compact")
            fit_full, _ = resident_fit(n, s, b)
            if f"dos@{text}" not in order:
                do(f"dos@{text}", ["--policy", "dos", "--gpu-resident-budget", text, "--overlap", "off"], text)
                order.append(f"dos@{text}")
            r_cpu = (nsub - fit) / nsub
            do(f"static:{r_cpu:.4g}@{text}", ["--policy", f"static:{r_cpu:.6g}", "--gpu-resident-budget", text,
                                              "--overlap", "off"], text)
            order.append(f"static:{r_cpu:.4g}@{text}")
            twinflow.append(fit_full / nsub)
            twinflow_share.append((nsub - fit_full) / nsub)
            static_share.append(r_cpu)
    order = [l for l in order if l in runs]
    r0 = runs[order[0]]["reports"][0] if order else None
    no_cuda = bool(runs) and all(e["reports"][0].get("cuda_workers", 0) == 0 for e in runs.values())
    if no_cuda:
        notes.append("WARNING: dos-train reports no CUDA worker: every policy updates every subgroup on the CPU "
                     "(dos and static:R are cpu here), so the rows differ only by noise and scheduling overhead; "
                     "their speedups say nothing about placement")
    probe = measure_probe(a, runs, order, notes) if a.host_bench is not None else None
    variants = []
    if a.baselines is not None and r0:
        variants = list(a.baseline_variants)
        for r_cpu in twinflow_share:
            v = f"twinflow:{r_cpu:.6g}"
            if v not in variants:
                variants.append(v)
    # Round 0's runs are done; each round then runs the baselines and the peers once, and the
    # rounds after it every run again first, in round 0's order.
    baseline_rounds, baseline_error, peer_rounds, peer_phase_spreads = [], None, [], []
    for k in range(a.repeats):
        for label, args in executed if k else []:
            if label not in runs:
                continue
            r, log, _ = run_one(a, label, args, k)
            if r is None:
                failed.append(label)
                del runs[label]
                notes.append(f"WARNING: run {label} failed in round {k + 1} (see {log}): its row is left out")
                continue
            runs[label]["reports"].append(r)
        if variants:
            round_notes = []
            results, err = run_baselines(a, r0, variants, round_notes, k)
            notes.extend(n for n in round_notes if n not in notes)
            baseline_rounds.append(results)
            baseline_error = baseline_error or err
        if a.peers and r0:
            peer_phase_spreads.append({})
            peer_rounds.append(run_peers(a, r0["params"], r0["subgroup_size"], twinflow, notes, k,
                                         peer_phase_spreads[-1]))
    order = [l for l in order if l in runs]
    if timeline_path:
        # the picture's timeline from a run of its own, after the others and out of the table, so that
        # recording it slows no row: the first dos run's arguments again
        first_dos = next((args for label, args in executed if label in runs and arg_value(args, "--policy") == "dos"),
                         None)
        r = None
        if first_dos is not None:
            r, log, _ = run_one(a, TIMELINE_RUN, first_dos + ["--timeline", timeline_path], 0, keep_params=False)
        if r is None:
            notes.append("WARNING: --timeline: " + ("no dos run to repeat with a timeline" if first_dos is None
                                                    else f"the timeline run failed (see {log})") + ": none drawn")
            timeline_path = None
    baselines = merge_baselines([r for r in baseline_rounds if r])
    peers, peer_runs = {}, {}  # variant: the median of its rounds' means, and those means
    for rnd in peer_rounds:
        for v, t in rnd.items():
            peer_runs.setdefault(v, []).append(t)
    # variant: its figures as a row's: the spread over the rounds when more than one, else that of its
    # phases when its RESULT line gave it (best and worst), as a dos row's over its iterations
    peer_rows = {}
    for v, ts in peer_runs.items():
        peers[v] = statistics.median(ts)
        phases = next((sp[v] for sp in peer_phase_spreads if v in sp), None)  # a round's spread needs its figure
        lo, hi = (min(ts), max(ts)) if len(ts) > 1 else phases or (None, None)
        peer_rows[v] = {"update_seconds": peers[v], "update_seconds_min": lo, "update_seconds_max": hi}
        if len(ts) < a.repeats:
            notes.append(f"WARNING: peer {v}: {len(ts)} of {a.repeats} rounds gave a figure")

    bounds = bounds_by_budget({l: runs[l] for l in order})
    rows = []
    for label in order:
        e = runs[label]
        r, reports, budget = e["reports"][0], e["reports"], e["budget"]
        med, lo, hi = summarize(reports)
        it_med = summarize(reports, "iteration_seconds_median")[0]
        row = {"label": label, "policy": r.get("policy", ""), "starpu_policy": r.get("starpu_policy", ""),
               "resident_budget": budget, "params": r["params"], "subgroups": r["subgroups"],
               "cuda_workers": r.get("cuda_workers", 0), "repeats": len(reports),
               "update_seconds": med, "update_seconds_min": lo, "update_seconds_max": hi,
               "update_seconds_runs": [x["summary"]["update_seconds_median"] for x in reports],
               "gparams_per_s": r["params"] / med / 1e9,
               "iteration_seconds": it_med, "model_tflops": summarize(reports, "model_tflops_median")[0],
               "overlapped": bool((r.get("iterations") or [{}])[-1].get("overlapped")),
               "exposed_seconds": summarize(reports, "exposed_seconds_median")[0],
               "peak_gpu_bytes": summarize(reports, "peak_gpu_bytes_median")[0]}
        lb = lower_bound(reports) or bounds.get(budget)
        if lb:
            row["lower_bound_seconds"] = lb
            pct, warn = bound_share(label, med, lb, row["overlapped"])
            if pct is not None:
                row["percent_of_lower_bound"] = pct
            if warn:
                notes.append(warn)
        pb = (probe or {}).get("bounds", {}).get(budget or "")
        if pb and label not in a.custom_labels:
            pct, warn = bound_share(label, med, pb, row["overlapped"], "the lower bound at dos-bench host's rates",
                                    "the probe or the run's U_g and D_c underestimated a rate")
            if pct is not None:
                row["probe_lower_bound_seconds"] = pb
                row["percent_of_probe_bound"] = pct
            if warn:
                notes.append(warn)
        if a.check_params and "cpu" in runs and label != "cpu" and e["params"] and runs["cpu"]["params"]:
            row["params_vs_cpu"] = compare_params(a, runs["cpu"]["params"], e["params"])
        rows.append(row)
    by_label = {row["label"]: row for row in rows}
    for row in rows:
        for ref in ("cpu", "dmda"):
            # update phases only: an overlapped run's phase begins before forward (compare its iteration)
            if ref in by_label and not row["overlapped"] and not by_label[ref]["overlapped"]:
                row[f"speedup_vs_{ref}"] = by_label[ref]["update_seconds"] / row["update_seconds"]
    brows = []
    for b in baselines:
        if "seconds_median" not in b:
            continue
        if len(b["repeat_seconds"]) < a.repeats:
            notes.append(f"WARNING: baseline {b['variant']}: {len(b['repeat_seconds'])} of {a.repeats} rounds gave a "
                         f"figure (see the baselines' logs)")
        brow = {"label": f"baseline {b['variant']}", "variant": b["variant"], "repeats": len(b["repeat_seconds"]),
                "update_seconds": b["seconds_median"], "update_seconds_min": b["seconds_min"],
                "update_seconds_max": b["seconds_max"], "gparams_per_s": b["gparams_per_s"],
                "subgroups_by_place": b["subgroups"], "adam_cpu": b["adam_cpu"], "adam_gpu": b["adam_gpu"]}
        if len(b["repeat_seconds"]) == 1:  # one repeat: the spread of its phases after the first
            ph = b["phase_seconds"][0]
            ph = ph[1:] if len(ph) > 1 else ph
            brow["update_seconds_min"], brow["update_seconds_max"] = min(ph), max(ph)
        for ref in ("cpu", "dmda"):
            if ref in by_label:
                brow[f"speedup_vs_{ref}"] = by_label[ref]["update_seconds"] / brow["update_seconds"]
        brows.append(brow)
    by_variant = {b["variant"]: b for b in brows}

    fmt = lambda v, spec: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)  # noqa: E731
    spread = lambda row: (f"{row['update_seconds_min']:.4f}..{row['update_seconds_max']:.4f}"  # noqa: E731
                          if row.get("update_seconds_min") is not None else "-")
    lines = ["| run | resident budget | iteration s | update s | exposed update s | spread (min..max) | Gparams/s | "
             "vs cpu | vs dmda | % of lower bound |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['resident_budget'] or '-'} | {fmt(row['iteration_seconds'], '.4f')} | "
                     f"{row['update_seconds']:.4f} | {fmt(row['exposed_seconds'] if row['overlapped'] else None, '.4f')} | "
                     f"{spread(row)} | {row['gparams_per_s']:.3f} | "
                     f"{fmt(row.get('speedup_vs_cpu'), '.2f')} | {fmt(row.get('speedup_vs_dmda'), '.2f')} | "
                     f"{fmt(row.get('percent_of_lower_bound'), '.0f')} |")
    for b in brows:
        lines.append(f"| {b['label']} (PyTorch, this repository) | - | - | {b['update_seconds']:.4f} | - | {spread(b)} | "
                     f"{b['gparams_per_s']:.3f} | {fmt(b.get('speedup_vs_cpu'), '.2f')} | "
                     f"{fmt(b.get('speedup_vs_dmda'), '.2f')} | - |")
    for k, v in peers.items():
        lines.append(f"| peer {k} (external, PyTorch) | - | - | {v:.4f} | - | {spread(peer_rows[k])} | "
                     f"{r0['params'] / v / 1e9:.3f} | - | - | - |")
    if rows:
        lines.append(f"\n{rows[0]['params']:,} parameters, {rows[0]['subgroups']} subgroups; update seconds: "
                     + (f"median over {a.repeats} runs of each run's median over iterations 2.., spread over the runs"
                        if a.repeats > 1 else "median over iterations 2.., spread over those iterations (one run "
                        "each; --repeats R for the spread between runs)")
                     + "; baselines: the same, over their update phases; peers: their mean per phase"
                     + (f" (median and spread over the {a.repeats} rounds; a peer with one round's figure, the "
                        f"spread of its phases)" if a.repeats > 1 and peers else
                        ", spread from its fastest to its slowest phase where it gave them" if peers else "")
                     + "; lower bound: "
                       "the resource model's, the run's own or that of the first run with the same resident budget"
                     + ("; an overlapped run's update s runs from before forward to the phase's end, its exposed "
                        "update s from the end of backward: compare the iterations" if any(r["overlapped"] for r in rows)
                        else ""))
    notes.extend(copy_rule_notes(runs, order))
    ours = ("its runs' medians" if a.repeats > 1 else "its update phases", "its median", "--iterations or --repeats")
    steady_rows = [(r["label"], r, ours) for r in rows] + [(f"baseline {b['variant']}", b, ours) for b in brows]
    steady_rows += [(f"peer {k}", peer_rows[k],
                     ("its rounds' means", "its median", "--repeats") if len(peer_runs[k]) > 1 else
                     ("its phases (its best and worst)", "its mean per phase", "--peer-iters or --repeats"))
                    for k in peers]
    for name, row, (what, figure, more) in steady_rows:
        lo, hi = row.get("update_seconds_min"), row.get("update_seconds_max")
        if lo and hi and hi > UNSTEADY * lo:  # one slow phase (a loaded machine) moves a median of few
            notes.append(f"WARNING: {name}: {what} ranged {lo:.4f}..{hi:.4f} s, more than {UNSTEADY:g}x "
                         f"apart: {figure} is not a steady figure, nor a ratio made with it (more {more}, on a "
                         "machine with nothing else running)")
    for row in rows:  # the overlap's gain, iteration against iteration
        base = by_label.get(row["label"][: -len("+overlap")]) if row["label"].endswith("+overlap") else None
        if base and base.get("iteration_seconds") and row.get("iteration_seconds"):
            notes.append(f"{row['label']}: iteration {row['iteration_seconds']:.4f} s against "
                         f"{base['iteration_seconds']:.4f} s without overlap "
                         f"({base['iteration_seconds'] / row['iteration_seconds']:.2f}x)")
    # speedups of dos over the others (other's seconds / dos's seconds), each checked against the spread
    ratios = {}
    triple = lambda row: (row["update_seconds"], row.get("update_seconds_min"), row.get("update_seconds_max"))  # noqa: E731

    def ratio(key, other, dos_row, into=ratios):
        into[key] = other["update_seconds"] / dos_row["update_seconds"]
        w = within_spread(triple(other), triple(dos_row))
        if w:
            notes.append(f"WARNING: {key}: {w}: not a measured difference (more --repeats or --iterations)")

    def against_pytorch(name, mine, into):
        # mine against the repository's zero_offload and best stride, and the peers' (ratio's keys)
        if "zero_offload" in by_variant:
            ratio(f"{name}_vs_baseline_zero_offload", by_variant["zero_offload"], mine, into)
        strides = [b for b in brows if b["variant"].startswith("stride:")]
        if strides:
            best = min(strides, key=lambda b: b["update_seconds"])
            ratio(f"{name}_vs_baseline_best_stride", best, mine, into)
            into["baseline_best_stride"] = best["variant"]
        if "zero_offload" in peer_rows:
            ratio(f"{name}_vs_peer_zero_offload", peer_rows["zero_offload"], mine, into)
        pstrides = {k: v for k, v in peers.items() if k.startswith("dos_stride")}
        if pstrides:
            best = min(pstrides, key=pstrides.get)
            ratio(f"{name}_vs_peer_best_dos_stride", peer_rows[best], mine, into)
            into["peer_best_dos_stride"] = best

    dos_row = by_label.get("dos")
    if dos_row:
        for row in rows:
            if row["label"] != "dos" and row["resident_budget"] is None and not row["overlapped"]:
                ratio(f"dos_vs_{row['label']}", row, dos_row)
        against_pytorch("dos", dos_row, ratios)
    # each --run row (a variant of dos's: another option, another switch) against the same baselines
    # and peers, as dos is, when it ran without a resident budget and without overlap
    run_ratios = {}
    run_args = dict(executed)
    for row in rows:
        if (row["label"] in a.custom_labels and row is not dos_row and row["resident_budget"] is None
                and not row["overlapped"] and arg_value(run_args.get(row["label"], []), "--gpu-resident-budget") is None):
            against_pytorch(row["label"], row, run_ratios)
    for k in ("baseline_best_stride", "peer_best_dos_stride"):
        if k in ratios:
            run_ratios.pop(k, None)  # named once, on dos's line (the same choice for every row)
    for (text, _), frac, r_cpu in zip(a.budgets, twinflow, twinflow_share):
        d = by_label.get(f"dos@{text}")
        if not d:
            continue
        st = next((row for row in rows if row["label"].startswith("static:") and row["label"].endswith("@" + text)),
                  None)
        if st:
            ratio(f"dos_vs_static@{text}", st, d)
        tw = by_variant.get(f"twinflow:{r_cpu:.6g}")
        if tw:
            ratio(f"dos_vs_baseline_twinflow@{text}", tw, d)
        if f"twinflow:{frac:.4g}" in peer_rows:
            ratio(f"dos_vs_peer_twinflow@{text}", peer_rows[f"twinflow:{frac:.4g}"], d)
    if probe:
        for budget, pb in probe["bounds"].items():
            shares = ", ".join(f"{row['label']} {row['percent_of_probe_bound']:.0f}%" for row in rows
                               if (row["resident_budget"] or "") == budget and "percent_of_probe_bound" in row)
            lines.append(f"\nlower bound at the rates dos-bench host measured here"
                         f"{f' (resident budget {budget})' if budget else ''}: {pb:.4f} s; of it: {shares or '-'}")
        lines.append(f"(the probe's rates: {host_probe.describe(probe['rates'])} {probe['from']}; "
                     f"{os.path.join(a.out, 'host-bench.log')})")
    listed = lambda d: ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())  # noqa: E731
    if ratios:
        lines.append("\nspeedups of dos (other's seconds / dos's seconds): " + listed(ratios))
    if run_ratios:
        lines.append(("" if ratios else "\n") + "speedups of the --run rows (other's seconds / the row's seconds): " +
                     listed(run_ratios))
    # what a phase at the model's bound for the probe's rates would give against the same others
    at_bound = {}
    pb = (probe or {}).get("bounds", {})
    if dos_row and pb.get(""):
        for k, v in ratios.items():
            if isinstance(v, float) and "@" not in k:
                at_bound[k] = v * dos_row["update_seconds"] / pb[""]
    if at_bound:
        lines.append("the same speedups for a phase at the lower bound of dos-bench host's rates: " +
                     listed(at_bound))
    for label, why in skipped.items():
        notes.insert(0, f"run {label} skipped: {why}")
    if baseline_error:
        notes.append(f"WARNING: {baseline_error}")
    if notes:
        lines.append("")
        lines += notes
    for row in rows:
        if "params_vs_cpu" in row:
            lines.append(f"final parameters, {row['label']} vs cpu: {row['params_vs_cpu'] or 'st-compare not found'}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "compare.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump({"rows": rows, "baselines": brows, "baseline_results": baselines, "peers": peers,
                   "peer_runs": peer_runs,
                   "peer_spreads": {v: [r["update_seconds_min"], r["update_seconds_max"]] for v, r in peer_rows.items()},
                   "ratios": ratios, "run_ratios": run_ratios,
                   "probe": probe, "ratios_at_probe_bound": at_bound,
                   "failed": failed, "skipped": skipped, "notes": notes, "repeats": a.repeats,
                   "timeline": bool(timeline_path),
                   "dos_train_args": a.train_args}, f, indent=2)
    if rows:
        plot(a, rows, brows, peers, timeline_path)
    if failed:
        print(f"dos-compare: failed runs: {', '.join(failed)} (logs in {a.out})", file=sys.stderr)
        return 2
    if baseline_error:
        print(f"dos-compare: {baseline_error}", file=sys.stderr)
        return 2
    differ = [r["label"] for r in rows if (r.get("params_vs_cpu") or "").startswith("DIFFER")]
    if differ:
        print(f"dos-compare: final parameters differ from the cpu run's bits: {', '.join(differ)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
