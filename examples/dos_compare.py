#!/usr/bin/env python3
"""dos-compare: the same dos-train workload under several scheduling policies, side by side.

Runs ``dos-train`` once per run (StarPU starts once per process, so each run gets its own process)
with the same model, shard, subgroup size, seed and iteration count, reads each run's ``--report``
JSON, and prints one table: median iteration seconds (with ``--emulate-compute`` among the
dos-train arguments), median update-phase seconds (iterations 2..), update Gparams/s, speedup over
``cpu`` and over ``dmda`` (when those ran), and the percentage of the lower bound (lower bound /
measured, so 100% is the bound itself; the bound is the resource model's: a ``dos`` run's own, and
for the other runs that of the first ``dos`` run with the same resident budget).

Runs:
  --policies dos,cpu,dmda        one run per policy (dos-train --policy)
  --run LABEL='ARGS'             one more run named LABEL with its own dos-train arguments (e.g.
                                 --run "dos-native=--policy dos --grad-transfer native"); repeatable
  --resident-budgets 10GB,20GB   for each budget B, a ``dos@B`` run (dos --gpu-resident-budget B)
                                 and a ``static:R@B`` run, R the smallest CPU share whose resident
                                 subgroups fit in B (DeepSpeed's ratio for the same bytes)
  --peers PATH                   ../shared/peers/torch_update_phase.py on the same N and S, in the
                                 same script: zero_offload and dos_stride:2..4 (when --policies
                                 or --run ran something) and, per resident budget, twinflow:R_gpu
                                 keeping the same subgroups resident
  --timeline                     the first dos run writes its last phase's timeline; plotted under
                                 the bars (CPU worker, GPU worker, H2D and D2H rates)

With ``--check-params`` every run's final fp32 master parameters are compared with the ``cpu``
run's: bit-identical is expected among CPU-only runs, and within 1e-6 relative (README) when a GPU
took part. Outputs (``--out DIR``): ``compare.json``, ``compare.md``, ``compare.png`` (when
matplotlib imports), and each run's report and log. Exit status: 0; 1 when --check-params found
parameters beyond the tolerance; 2 when dos-train is missing, a run fails (its log is kept and
named; the other runs' results are still written), a report lacks its summary, or an argument is
malformed.
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys


def parse_size(text):
    """'10GB', '31.5GB', '4e10', '10GiB' -> bytes (as dos-train reads --gpu-*-budget)."""
    m = re.fullmatch(r"([0-9.eE+-]+)(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?", text.strip())
    units = {None: 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2 ** 10, "MiB": 2 ** 20,
             "GiB": 2 ** 30, "TiB": 2 ** 40}
    if not m:
        raise ValueError(f"'{text}' is not a size such as 10GB, 31.5GB or 4e10")
    return float(m.group(1)) * units[m.group(2)]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dos-train", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                                         "examples", "dos-train"),
                    help="path of the dos-train binary (default: build/examples/dos-train)")
    ap.add_argument("--policies", default="dos,cpu,dmda,gpu",
                    help="comma-separated policies (dos-train --policy values), default dos,cpu,dmda,gpu")
    ap.add_argument("--run", action="append", default=[], metavar="LABEL=ARGS",
                    help="an extra run: its label and its own dos-train arguments (repeatable)")
    ap.add_argument("--resident-budgets", default="",
                    help="comma-separated GPU resident budgets: a dos and a static:R run for each")
    ap.add_argument("--peers", default=None, help="path of torch_update_phase.py: run the PyTorch peers too")
    ap.add_argument("--peer-iters", type=int, default=3, help="timed phases per peer variant (default 3)")
    ap.add_argument("--timeline", action="store_true", help="plot the first dos run's last update phase")
    ap.add_argument("--out", default="dos-compare-out", help="folder for the reports, logs, table and plot")
    ap.add_argument("--plot-only", action="store_true",
                    help="run nothing: draw compare.png from the compare.json (and timeline.json) in --out")
    ap.add_argument("--check-params", action="store_true",
                    help="save every run's final master parameters and compare them with the cpu run's")
    ap.add_argument("--st-compare", default=None,
                    help="path of st-compare (default: build/tests/st-compare next to dos-train's build)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="after --: arguments given to every dos-train run (--preset, --shard, --iterations, ...)")
    a = ap.parse_args(argv)
    if a.train_args and a.train_args[0] == "--":
        a.train_args = a.train_args[1:]
    a.runs = [(p.strip(), ["--policy", p.strip()]) for p in a.policies.split(",") if p.strip()]
    for r in a.run:
        label, eq, args = r.partition("=")
        if not eq or not label.strip() or "--policy" not in args:
            ap.error(f"--run '{r}': give LABEL='dos-train arguments including --policy'")
        a.runs.append((label.strip(), shlex.split(args)))
    try:
        a.budgets = [(b.strip(), parse_size(b)) for b in a.resident_budgets.split(",") if b.strip()]
    except ValueError as e:
        ap.error(f"--resident-budgets: {e}")
    if not a.runs and not a.budgets and not a.plot_only:
        ap.error("nothing to run: give --policies, --run or --resident-budgets")
    labels = [l for l, _ in a.runs]
    if len(set(labels)) != len(labels):
        ap.error(f"two runs have the same label: {labels}")
    for bad in ("--policy", "--report", "--save-params", "--sweep", "--timeline", "--gpu-resident-budget"):
        if any(t == bad or t.startswith(bad + "=") for t in a.train_args):
            ap.error(f"{bad} is set by dos-compare itself: leave it out of the dos-train arguments")
    return a


def arg_value(args, name, default=None):
    for i, t in enumerate(args):
        if t == name and i + 1 < len(args):
            return args[i + 1]
        if t.startswith(name + "="):
            return t.split("=", 1)[1]
    return default


def run_one(a, label, args):
    """Runs dos-train once; returns (report dict or None, log path, params path or None)."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "-", label)
    report = os.path.join(a.out, f"{tag}.json")
    log = os.path.join(a.out, f"{tag}.log")
    params = os.path.join(a.out, f"{tag}.safetensors") if a.check_params else None
    cmd = [a.dos_train, "--report", report] + (["--save-params", params] if params else []) + args + a.train_args
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        print(f"dos-compare: run {label} failed (exit status {rc}): see {log}", file=sys.stderr)
        return None, log, None
    with open(report) as f:
        r = json.load(f)
    if "summary" not in r or "update_seconds_median" not in r["summary"]:
        print(f"dos-compare: the report of run {label} has no summary: see {report}", file=sys.stderr)
        return None, log, None
    print(f"dos-compare: {label}: update {r['summary']['update_seconds_median']:.4f} s", flush=True)
    return r, log, params


def compare_params(a, ref, other):
    """st-compare's verdict line for two parameter files, or None when st-compare is missing."""
    exe = a.st_compare or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.dos_train))), "tests",
                                       "st-compare")
    if not os.path.exists(exe):
        return None
    p = subprocess.run([exe, ref, other, "1e-6"], capture_output=True, text=True)
    line = (p.stdout.strip().splitlines() or [""])[-1]
    return ("ok: " if p.returncode == 0 else "DIFFER: ") + line


def median_of(values):
    v = sorted(x for x in values if x and x > 0)
    return v[len(v) // 2] if v else None


def resident_fit(n_params, subgroup, budget):
    """Subgroups, counted from the last, whose fp32 state (12 B/param) fits in budget bytes
    (models/resource_model.h, resident_subgroups), and the subgroup count."""
    sizes = [subgroup] * (n_params // subgroup) + ([n_params % subgroup] if n_params % subgroup else [])
    used = count = 0
    for s in reversed(sizes):
        if used + 12 * s > budget:
            break
        used += 12 * s
        count += 1
    return count, len(sizes)


def run_peers(a, n, s, twinflow):
    """Runs the PyTorch peers; returns {variant: mean seconds per phase} (missing on failure)."""
    base = ["zero_offload", "dos_stride:2", "dos_stride:3", "dos_stride:4"] if a.runs else []
    variants = base + [f"twinflow:{r:.4g}" for r in twinflow]
    cmd = [sys.executable, a.peers, "--n", str(n), "--s", str(s), "--iters", str(a.peer_iters),
           "--variants", ",".join(variants)]
    log = os.path.join(a.out, "peers.log")
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    out = {}
    for line in open(log):
        m = re.match(r"RESULT\s+(\S+)\s+([0-9.]+) s/phase", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    if rc != 0:
        print(f"dos-compare: the peers exited with status {rc}: see {log}", file=sys.stderr)
    return out


def plot(a, rows, peers, timeline_path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("dos-compare: matplotlib is not importable here: no PNG (the table is in compare.md)")
        return
    tl = None
    if timeline_path and os.path.exists(timeline_path):
        with open(timeline_path) as f:
            tl = json.load(f)
    bars = [(r["label"], r["update_seconds"], "C0") for r in rows] + [(f"peer {k}", v, "C7") for k, v in peers.items()]
    fig, axes = plt.subplots(2 if tl else 1, 1, figsize=(max(8, 0.75 * len(bars) + 3), 8 if tl else 4.5),
                             squeeze=False)
    ax = axes[0][0]
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], rotation=35, ha="right", fontsize=8)
    ax.set(ylabel="update phase, s (median)", title=f"{rows[0]['params']:,} parameters, {rows[0]['subgroups']} subgroups"
           if rows else "")
    lb = next((r.get("lower_bound_seconds") for r in rows if r["label"] == "dos"), None)
    if lb:
        ax.axhline(lb, color="C3", ls="--", label=f"dos lower bound {lb:.3f} s")
        ax.legend(fontsize=8)
    if tl:
        ax = axes[1][0]
        lanes = {"cpu": 3, "gpu": 2}
        colors = {"adam": "C0", "gather": "C2", "scatter": "C1"}
        for t in tl["tasks"]:
            ax.barh(lanes[t["lane"]], t["end"] - t["start"], left=t["start"], height=0.7,
                    color=colors.get(t["what"], "C4"), edgecolor="none")
        # PCIe rates from the cumulative bus samples (bytes are counted when a transfer completes,
        # so rates are averaged over 20 ms windows)
        bus = tl["bus"]
        if len(bus) > 1:
            w = 0.02
            end = bus[-1][0]
            ts, up, down = [], [], []
            j = 0
            prev = bus[0]
            k = 0
            while k * w < end:
                t1 = (k + 1) * w
                while j + 1 < len(bus) and bus[j + 1][0] <= t1:
                    j += 1
                ts.append(k * w + w / 2)
                up.append((bus[j][1] - prev[1]) / w / 1e9)
                down.append((bus[j][2] - prev[2]) / w / 1e9)
                prev = bus[j]
                k += 1
            peak = max(max(up), max(down), 1.0)
            ax.fill_between(ts, 1 - 0.4, [1 - 0.4 + 0.8 * u / peak for u in up], step="mid", color="C4", alpha=0.7)
            ax.fill_between(ts, 0 - 0.4, [0 - 0.4 + 0.8 * d / peak for d in down], step="mid", color="C5", alpha=0.7)
            ax.text(end, 1, f" H2D (peak {peak:.0f} GB/s)", va="center", fontsize=8)
            ax.text(end, 0, " D2H", va="center", fontsize=8)
        ax.set_yticks([0, 1, 2, 3])
        ax.set_yticklabels(["D2H", "H2D", "GPU worker", "CPU worker"])
        ax.set(xlabel="seconds since the update phase began",
               title=f"policy {tl['policy']}, iteration {tl['iteration']}: Adam (blue), gradient staging (green), "
                     f"parameter write-back (orange)")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "compare.png"), dpi=110)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.plot_only:
        path = os.path.join(a.out, "compare.json")
        if not os.path.exists(path):
            print(f"dos-compare: --plot-only: {path} does not exist", file=sys.stderr)
            return 2
        with open(path) as f:
            d = json.load(f)
        plot(a, d["rows"], d.get("peers", {}), os.path.join(a.out, "timeline.json"))
        return 0
    if not os.access(a.dos_train, os.X_OK):
        print(f"dos-compare: {a.dos_train} is not an executable dos-train: build it (scripts/setup.sh build) or "
              f"give --dos-train PATH", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    runs, failed, order = {}, [], []
    timeline_path = os.path.join(a.out, "timeline.json") if a.timeline else None
    timeline_done = False

    def do(label, args, budget=None):
        nonlocal timeline_done
        extra = []
        if timeline_path and not timeline_done and arg_value(args, "--policy") == "dos":
            extra = ["--timeline", timeline_path]
            timeline_done = True
        r, log, params = run_one(a, label, args + extra)
        if r is None:
            failed.append(label)
        else:
            runs[label] = (r, params, budget)
            order.append(label)
        return r

    for label, args in a.runs:
        do(label, args)
    twinflow = []
    if a.budgets:
        ref = next(iter(runs.values()), None)
        if ref is None:  # learn N and S from a first budget run
            ref = (do(f"dos@{a.budgets[0][0]}", ["--policy", "dos", "--gpu-resident-budget", a.budgets[0][0]],
                      a.budgets[0][0]), None, None)
        if ref[0] is None:
            print("dos-compare: no run succeeded: cannot size the resident budgets", file=sys.stderr)
            return 2
        n, s = ref[0]["params"], ref[0]["subgroup_size"]
        for text, b in a.budgets:
            fit, nsub = resident_fit(n, s, b)
            if f"dos@{text}" not in runs:
                do(f"dos@{text}", ["--policy", "dos", "--gpu-resident-budget", text], text)
            r_cpu = (nsub - fit) / nsub
            do(f"static:{r_cpu:.4g}@{text}", ["--policy", f"static:{r_cpu:.6g}", "--gpu-resident-budget", text], text)
            twinflow.append(fit / nsub)
    peers = {}
    if a.peers and runs:
        r0 = next(iter(runs.values()))[0]
        peers = run_peers(a, r0["params"], r0["subgroup_size"], twinflow)

    # lower bounds: a dos run's own (the median over its iterations); for the other runs, that of
    # the first dos run with the same resident budget that has one
    def own_bound(r):
        if r.get("policy") != "dos":
            return None
        return median_of([it.get("lower_bound_seconds", 0.0) for it in r["iterations"][1:] or r["iterations"]])
    bounds = {}
    for label, (r, _, budget) in runs.items():
        lb = own_bound(r)
        if lb and budget not in bounds:
            bounds[budget] = lb
    rows = []
    for label in order:
        r, params, budget = runs[label]
        s = r["summary"]
        row = {"label": label, "policy": r.get("policy", ""), "starpu_policy": r.get("starpu_policy", ""),
               "resident_budget": budget, "params": r["params"], "subgroups": r["subgroups"],
               "update_seconds": s["update_seconds_median"], "gparams_per_s": s["gparams_per_s_median"],
               "iteration_seconds": s.get("iteration_seconds_median"), "model_tflops": s.get("model_tflops_median"),
               "peak_gpu_bytes": s.get("peak_gpu_bytes_median")}
        for ref in ("cpu", "dmda"):
            if ref in runs:
                row[f"speedup_vs_{ref}"] = runs[ref][0]["summary"]["update_seconds_median"] / s["update_seconds_median"]
        lb = own_bound(r) or bounds.get(budget)
        if lb:
            row["lower_bound_seconds"] = lb
            row["percent_of_lower_bound"] = 100.0 * lb / s["update_seconds_median"]
        if a.check_params and "cpu" in runs and label != "cpu" and params and runs["cpu"][1]:
            row["params_vs_cpu"] = compare_params(a, runs["cpu"][1], params)
        rows.append(row)

    fmt = lambda v, spec: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)
    lines = ["| run | resident budget | iteration s | update s | Gparams/s | vs cpu | vs dmda | % of lower bound |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['resident_budget'] or '-'} | {fmt(row['iteration_seconds'], '.4f')} | "
                     f"{row['update_seconds']:.4f} | {row['gparams_per_s']:.3f} | "
                     f"{fmt(row.get('speedup_vs_cpu'), '.2f')} | {fmt(row.get('speedup_vs_dmda'), '.2f')} | "
                     f"{fmt(row.get('percent_of_lower_bound'), '.0f')} |")
    dos_s = runs["dos"][0]["summary"]["update_seconds_median"] if "dos" in runs else None
    for k, v in peers.items():
        lines.append(f"| peer {k} (PyTorch) | - | - | {v:.4f} | {rows[0]['params'] / v / 1e9:.3f} | - | - | - |")
    if rows:
        lines.append(f"\n{rows[0]['params']:,} parameters, {rows[0]['subgroups']} subgroups; seconds are medians over "
                     f"iterations 2.. (peers: their mean per phase); lower bound: the resource model's, from the dos "
                     f"run with the same resident budget")
    # the issue's ratios
    ratios = {}
    if dos_s:
        zo = peers.get("zero_offload")
        strides = {k: v for k, v in peers.items() if k.startswith("dos_stride")}
        if zo:
            ratios["dos_vs_zero_offload"] = zo / dos_s
        if strides:
            best = min(strides, key=strides.get)
            ratios["dos_vs_best_dos_stride"] = strides[best] / dos_s
            ratios["best_dos_stride"] = best
        for row in rows:
            if row["label"] != "dos" and row["resident_budget"] is None:
                ratios[f"dos_vs_{row['label']}"] = row["update_seconds"] / dos_s
    for (text, _), frac in zip(a.budgets, twinflow):
        d = runs.get(f"dos@{text}")
        st = next((runs[l] for l in runs if l.startswith("static:") and l.endswith("@" + text)), None)
        tw = peers.get(f"twinflow:{frac:.4g}")
        if d and st:
            ratios[f"dos_vs_static@{text}"] = st[0]["summary"]["update_seconds_median"] / d[0]["summary"]["update_seconds_median"]
        if d and tw:
            ratios[f"dos_vs_twinflow@{text}"] = tw / d[0]["summary"]["update_seconds_median"]
    if ratios:
        lines.append("\nspeedups of dos (other's seconds / dos's seconds): " +
                     ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in ratios.items()))
    for row in rows:
        if "params_vs_cpu" in row:
            lines.append(f"final parameters, {row['label']} vs cpu: {row['params_vs_cpu'] or 'st-compare not found'}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "compare.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump({"rows": rows, "peers": peers, "ratios": ratios, "failed": failed,
                   "dos_train_args": a.train_args}, f, indent=2)
    if rows:
        plot(a, rows, peers, timeline_path)
    if failed:
        print(f"dos-compare: failed runs: {', '.join(failed)} (logs in {a.out})", file=sys.stderr)
        return 2
    differ = [r["label"] for r in rows if (r.get("params_vs_cpu") or "").startswith("DIFFER")]
    if differ:
        print(f"dos-compare: final parameters differ from the cpu run's beyond 1e-6 relative: {', '.join(differ)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
