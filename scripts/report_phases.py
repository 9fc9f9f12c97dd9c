#!/usr/bin/env python3
"""Prints each dos-train --report JSON's phases: update seconds, the model's prediction error
(predicted / measured - 1, in %), the CPU Adam rate (Gparams/s per CPU worker: the parameters
placed on the CPU over the CPU Adam tasks' busy seconds summed over the workers, as the model's
U_c counts it) and, where the report has them (a run with a CUDA worker), the subgroups streamed
and the link_share the phase's refinement left (its "rates_after"), one line per report, and the
median update seconds of iterations 2 on. A report of a run with a CUDA worker also gives the
rates its first phase was planned at, its "calibrated_rates" (U_c and U_c_dma in Gparams/s per CPU
worker, link_share), to set beside the phases' CPU Adam rates and link_shares.

    scripts/report_phases.py REPORT.json [REPORT.json ...]

Files that are not dos-train reports (no "iterations") are skipped; an unreadable one, or one
whose fields are not of a report's types, is named with what was wrong, and the next file is read.
Used by scripts/gpu-calibration.sh and scripts/gpu-targets.sh. Exit status 0.
"""
import json
import os
import statistics
import sys


def subgroup_sizes(r):
    """The subgroups' parameter counts: subgroup_size each, the last one the remainder."""
    n, s, k = r.get("params", 0), r.get("subgroup_size", 0), r.get("subgroups", 0)
    if not (n and s and k):
        return []
    return [s] * (k - 1) + [n - s * (k - 1)]


def phase_cell(it, sizes):
    s, p = it.get("update_seconds", 0), it.get("predicted_seconds", 0)
    label = it["label"].strip() + " " if it.get("label") else ""
    cell = f"{label}{s:.4f}"
    if p > 0 and s > 0:
        cell += f" ({100 * (p / s - 1):+.1f}%"
    else:
        cell += " (-"
    adam, placement = it.get("cpu_adam_seconds", 0), it.get("placement", "")
    if adam > 0 and len(placement) == len(sizes):
        on_cpu = sum(n for n, side in zip(sizes, placement) if side == "c")
        cell += f", CPU Adam {1e-9 * on_cpu / adam:.2f} Gp/s"
    after = it.get("rates_after")
    if after is not None:
        cell += f", {placement.count('s')} streamed, link_share then {float(after['link_share']):.3f}"
    return cell + ")"


def calibrated_text(r):
    """The report's calibrated rates as "calibrated U_c A, U_c_dma B Gp/s, link_share C; ", or ""
    for a run without a CUDA worker or a report without them."""
    c = r.get("calibrated_rates")
    if not r.get("cuda_workers") or not isinstance(c, dict) or not c.get("U_c"):
        return ""
    return (f"calibrated U_c {1e-9 * float(c['U_c']):.2f}, U_c_dma {1e-9 * float(c['U_c_dma']):.2f} Gp/s, "
            f"link_share {float(c['link_share']):.3f}; ")


def main(paths):
    for path in sorted(paths):
        name = os.path.basename(path)[:-5] if path.endswith(".json") else os.path.basename(path)
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{name}: unreadable ({e})")
            continue
        its = r.get("iterations") if isinstance(r, dict) else None
        if not its:
            continue
        try:
            sizes = subgroup_sizes(r)
            secs = [it.get("update_seconds", 0) for it in its]
            med = statistics.median(secs[1:]) if len(secs) > 1 else secs[0]
            line = (f"{name}: median {med:.4f} s (iterations 2..); {calibrated_text(r)}each: " +
                    ", ".join(phase_cell(it, sizes) for it in its))
        except (TypeError, AttributeError, ValueError, KeyError) as e:
            print(f"{name}: not a dos-train report's fields ({type(e).__name__}: {e})")
            continue
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
