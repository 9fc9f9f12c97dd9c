"""dos-compare's second yardstick: the lower bound at rates an independent probe measured.

The percentage of the lower bound that dos-compare prints for a run comes from the resource model's
own rates: those the run calibrated, refined from its phases (models/resource_model.h,
lower_bound). A run whose refinement lowered a rate lowers its own yardstick with it. This module
measures the host-side rates again with ``dos-bench host`` (bench/host_bench.h), a program of its
own that times CPU Adam and full-duplex DMA alone and side by side on this machine, takes the GPU's
two rates (U_g, D_c) from the run, and asks ``dos-train --plan-only`` for the lower bound of the
same workload at those rates.

From one ``dos-bench host`` row (one OpenMP team of T threads, T the run's CPU threads, DMA over
1 GiB buffers, the full form of the state: fp32 masters, as the runtime keeps them; rows of
``--state compact`` are not taken):
  U_c      = CPU Adam alone, params/s
  U_c_dma  = CPU Adam beside the DMA, params/s (at most U_c)
  B_h2d = B_d2h = the DMA alone, bytes/s each way (both directions at once)
  link_share = (DMA beside Adam / DMA alone) / (U_c_dma / U_c), kept in [1/16, U_c / U_c_dma]
               (the lowest the refinement keeps, models/refinement.h, and the highest the model
               tells apart, resource_model.h, highest_link_share)
so that the model's host memory, M = U_c_dma / U_c x (U_c x bytes + link_share x 2 B), is what
the probe measured CPU Adam and the DMA to move together (host_bandwidth). U_g and D_c: the higher
of the run's calibrated and refined ones, as the run's own bound takes them.

Where the model cannot hold the probe's figure, the notes say so: link_share kept in its range, or
the probe's total below what CPU Adam or the DMA moved alone (the model never takes host memory
below either, host_bandwidth): the bound is then lower than the probe's rates allow. The probe's
state and DMA buffers are 4 KiB pages, registered with CUDA (bench/host_bench.h); the runs' host
memory is what their allocator gives.
"""
import json
import math
import os
import subprocess

# the lowest link_share the model's refinement keeps (models/refinement.h)
LOWEST_LINK_SHARE = 1.0 / 16
# seconds a probe or a --plan-only run may take before it counts as failed
BENCH_TIMEOUT_S = 900
PLAN_TIMEOUT_S = 300


def probe_rates(bench, threads, run_rates, run_calibrated, state="full"):
    """The model's rates at the probe's figures (module docstring), and notes on what the model could
    not hold: (rates, notes). rates: a dict with U_c, U_c_dma, U_g, D_c (params/s), B_h2d, B_d2h
    (bytes/s) and link_share, as a rates file holds them; notes: a list of strings.

    bench: ``dos-bench host --json``'s object (its "runs", and "bytes_per_param", CPU Adam's host
    bytes per parameter, 28 when absent; a row's own "bytes_per_param" comes first); threads: the
    team size whose row is taken (the run's CPU threads); run_rates, run_calibrated: the run's
    report's "rates" and "calibrated_rates" (same keys). Raises ValueError when the probe's object
    is not of that shape, has no row for that team over 1 GiB buffers (dma_ring_bytes 0) in the
    state form ``state`` ("full": a row's "state" "full", or none; "compact": "compact", the
    compact master's CPU Adam, for runs with dos-train --master compact), or a figure in it or a
    U_g or D_c is not a positive finite number."""
    def positive(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0

    runs = bench.get("runs") if isinstance(bench, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ValueError("dos-bench host's JSON has no list of rows ('runs')")
    rows = [r for r in runs if r.get("threads") == threads and not r.get("dma_ring_bytes")
            and r.get("dma_directions", "both") == "both" and r.get("state", "full") == state]
    if not rows:
        raise ValueError(f"dos-bench host has no row for a team of {threads} threads over 1 GiB DMA buffers, both "
                         f"directions at once, {state} state")
    r = rows[0]
    keys = ("adam_alone_params_per_s", "adam_beside_dma_params_per_s", "dma_alone_bytes_per_s_each_way",
            "dma_beside_adam_bytes_per_s_each_way")
    bad = [k for k in keys if not positive(r.get(k))]
    if bad:
        raise ValueError(f"dos-bench host's row for {threads} threads has no positive {', '.join(bad)}")
    gpu = {}
    for k in ("U_g", "D_c"):
        vals = [x.get(k) if isinstance(x, dict) else None for x in (run_rates, run_calibrated)]
        if not all(positive(v) for v in vals):
            raise ValueError(f"the run's report has no positive {k} in its rates")
        gpu[k] = max(vals)
    u_alone, u_beside, b_alone, b_beside = (float(r[k]) for k in keys)
    u_dma = min(u_beside, u_alone)
    measured = (b_beside / b_alone) / (u_dma / u_alone)
    share = min(max(measured, LOWEST_LINK_SHARE), u_alone / u_dma)
    notes = []
    if share != measured:
        notes.append(f"the probe's link_share {measured:.3g} is outside what the model tells apart, "
                     f"[{LOWEST_LINK_SHARE:.3g}, {u_alone / u_dma:.3g}]: {share:.3g} taken")
    bpp = r.get("bytes_per_param", bench.get("bytes_per_param", 28))
    bpp = float(bpp) if positive(bpp) else 28.0
    together = u_dma * bpp + 2 * b_beside
    floor = max(u_alone * bpp, 2 * b_alone)
    if together < floor:
        notes.append(f"the probe's CPU Adam and DMA moved {together / 1e9:.1f} GB/s together, less than "
                     f"{floor / 1e9:.1f} GB/s for one of them alone; the model never takes host memory below "
                     f"that, so this bound is lower than the probe's rates allow")
    return ({"U_c": u_alone, "U_c_dma": u_dma, "U_g": gpu["U_g"], "D_c": gpu["D_c"],
             "B_h2d": b_alone, "B_d2h": b_alone, "link_share": share}, notes)


def run_bench(bench_path, threads, out_dir, state="full"):
    """Runs ``BENCH host --threads T --pages 4k --reps 3 --state STATE --json`` (at most
    BENCH_TIMEOUT_S seconds; STATE full or compact, CPU Adam's state form); returns (its JSON
    object, None) or (None, why it gave none). Its output is kept in OUT_DIR/host-bench.log."""
    log = os.path.join(out_dir, "host-bench.log")
    cmd = [bench_path, "host", "--threads", str(threads), "--pages", "4k", "--reps", "3", "--state", state, "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
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
    (with --gpu-resident-budget BUDGET when given; at most PLAN_TIMEOUT_S seconds). Writes
    OUT_DIR/probe-rates.json (the rates file) and OUT_DIR/probe-bound-TAG.json/.log (the plan's
    report and output). Returns (seconds, None) or (None, why there is none)."""
    rates_file = os.path.join(out_dir, "probe-rates.json")
    with open(rates_file, "w") as f:
        json.dump(rates, f, indent=2)
    report, log = (os.path.join(out_dir, f"probe-bound-{tag}.{x}") for x in ("json", "log"))
    cmd = ([dos_train, "--plan-only", "--policy", "dos", "--rates", rates_file, "--report", report]
           + (["--gpu-resident-budget", budget] if budget else []) + list(train_args))
    if os.path.exists(report):
        os.remove(report)  # an earlier invocation's report is not this one's
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=PLAN_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"dos-train --plan-only at the probe's rates did not run ({e}; see {log})"
    if rc != 0:
        return None, f"dos-train --plan-only at the probe's rates failed (exit status {rc}; see {log})"
    try:
        with open(report) as f:
            bound = json.load(f).get("lower_bound_seconds")
    except (OSError, ValueError, AttributeError) as e:
        return None, f"dos-train --plan-only at the probe's rates wrote no readable report ({e}; see {log})"
    if not (isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 0):
        return None, f"dos-train --plan-only at the probe's rates reported no lower bound (see {report})"
    return float(bound), None


def describe(rates):
    """The probe's rates in the units of dos-train's 'model:' line; ends with "those of", for the
    run whose U_g and D_c they hold to follow."""
    return (f"U_c {rates['U_c'] / 1e9:.2f} Gparams/s alone, {rates['U_c_dma'] / 1e9:.2f} beside the DMA; "
            f"B {rates['B_h2d'] / 1e9:.1f} GB/s each way alone; link_share {rates['link_share']:.3f}; "
            f"U_g {rates['U_g'] / 1e9:.1f} and D_c {rates['D_c'] / 1e9:.1f} Gparams/s, those of")
