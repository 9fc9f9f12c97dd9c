"""dos-compare's second yardstick: the lower bound at rates an independent probe measured.

The percentage of the lower bound that dos-compare prints for a run comes from the resource model's
own rates: those the run calibrated, refined from its phases (models/resource_model.h,
lower_bound). A run whose refinement lowered a rate lowers its own yardstick with it. This module
measures the host-side rates again with ``dos-bench host`` (bench/host_bench.h), a program of its
own that times CPU Adam and full-duplex DMA alone and side by side on this machine, takes the GPU's
two rates (U_g, D_c) from the run, and asks ``dos-train --plan-only`` for the lower bound of the
same workload at those rates.

From one ``dos-bench host`` row (one OpenMP team of T threads, T the run's CPU threads, DMA over
1 GiB buffers):
  U_c      = CPU Adam alone, params/s
  U_c_dma  = CPU Adam beside the DMA, params/s (at most U_c)
  B_h2d = B_d2h = the DMA alone, bytes/s each way (both directions at once)
  link_share = (DMA beside Adam / DMA alone) / (U_c_dma / U_c), kept in [1/16, U_c / U_c_dma]
               (the bounds the model tells apart, resource_model.h, highest_link_share)
so that the model's host memory, M = U_c_dma / U_c x (U_c x bytes + link_share x 2 B), is what
the probe measured CPU Adam and the DMA to move together (host_bandwidth). U_g and D_c: the higher
of the run's calibrated and refined ones, as the run's own bound takes them.
"""
import json
import os
import subprocess

# the lowest link_share the model's refinement keeps (models/refinement.h)
LOWEST_LINK_SHARE = 1.0 / 16


def probe_rates(bench, threads, run_rates, run_calibrated):
    """The model's rates at the probe's figures (module docstring): a dict with U_c, U_c_dma, U_g,
    D_c (params/s), B_h2d, B_d2h (bytes/s) and link_share, as a rates file holds them.

    bench: ``dos-bench host --json``'s object (its "runs"); threads: the team size whose row is
    taken (the run's CPU threads); run_rates, run_calibrated: the run's report's "rates" and
    "calibrated_rates" (same keys). Raises ValueError when the probe has no row for that team over
    1 GiB buffers (dma_ring_bytes 0), or a figure in it is not a positive number."""
    rows = [r for r in bench.get("runs", []) if r.get("threads") == threads and not r.get("dma_ring_bytes")]
    if not rows:
        raise ValueError(f"dos-bench host has no row for a team of {threads} threads over 1 GiB DMA buffers")
    r = rows[0]
    keys = ("adam_alone_params_per_s", "adam_beside_dma_params_per_s", "dma_alone_bytes_per_s_each_way",
            "dma_beside_adam_bytes_per_s_each_way")
    bad = [k for k in keys if not (isinstance(r.get(k), (int, float)) and r[k] > 0)]
    if bad:
        raise ValueError(f"dos-bench host's row for {threads} threads has no positive {', '.join(bad)}")
    u_alone, u_beside, b_alone, b_beside = (float(r[k]) for k in keys)
    u_dma = min(u_beside, u_alone)
    share = (b_beside / b_alone) / (u_dma / u_alone)
    share = min(max(share, LOWEST_LINK_SHARE), u_alone / u_dma)
    return {"U_c": u_alone, "U_c_dma": u_dma,
            "U_g": max(run_rates["U_g"], run_calibrated["U_g"]), "D_c": max(run_rates["D_c"], run_calibrated["D_c"]),
            "B_h2d": b_alone, "B_d2h": b_alone, "link_share": share}


def run_bench(bench_path, threads, out_dir):
    """Runs ``BENCH host --threads T --pages 4k --reps 3 --json``; returns (its JSON object, None) or
    (None, why it gave none). Its output is kept in OUT_DIR/host-bench.log."""
    log = os.path.join(out_dir, "host-bench.log")
    cmd = [bench_path, "host", "--threads", str(threads), "--pages", "4k", "--reps", "3", "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        return None, f"cannot run {bench_path}: {e}"
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return None, f"dos-bench host failed ({why}; see {log})"
    try:
        return json.loads(p.stdout[p.stdout.index("{"):]), None
    except ValueError as e:
        return None, f"dos-bench host printed no JSON ({e}; see {log})"


def bound_at(dos_train, train_args, rates, out_dir, tag, budget=None):
    """The lower bound of the workload that ``train_args`` (dos-train's arguments) describe, at
    ``rates`` (probe_rates' dict), seconds: ``dos-train --plan-only --policy dos --rates FILE``
    (with --gpu-resident-budget BUDGET when given). Writes OUT_DIR/probe-rates.json (the rates file)
    and OUT_DIR/probe-bound-TAG.json/.log (the plan's report and output). Returns (seconds, None)
    or (None, why there is none)."""
    rates_file = os.path.join(out_dir, "probe-rates.json")
    with open(rates_file, "w") as f:
        json.dump(rates, f, indent=2)
    report, log = (os.path.join(out_dir, f"probe-bound-{tag}.{x}") for x in ("json", "log"))
    cmd = ([dos_train, "--plan-only", "--policy", "dos", "--rates", rates_file, "--report", report]
           + (["--gpu-resident-budget", budget] if budget else []) + list(train_args))
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        return None, f"dos-train --plan-only at the probe's rates failed (exit status {rc}; see {log})"
    with open(report) as f:
        bound = json.load(f).get("lower_bound_seconds")
    if not (isinstance(bound, (int, float)) and bound > 0):
        return None, f"dos-train --plan-only at the probe's rates reported no lower bound (see {report})"
    return float(bound), None


def describe(rates):
    """The probe's rates in the units of dos-train's 'model:' line; ends with "those of", for the
    run whose U_g and D_c they hold to follow."""
    return (f"U_c {rates['U_c'] / 1e9:.2f} Gparams/s alone, {rates['U_c_dma'] / 1e9:.2f} beside the DMA; "
            f"B {rates['B_h2d'] / 1e9:.1f} GB/s each way alone; link_share {rates['link_share']:.3f}; "
            f"U_g {rates['U_g'] / 1e9:.1f} and D_c {rates['D_c'] / 1e9:.1f} Gparams/s, those of")
