#!/usr/bin/env python3
"""dos-replay (examples/dos-replay.cpp) on a dos-train report of the 20B quarter on an H100
(tests/report_20b_h100.json: `dos-train --policy dos --preset llama-20b --shard 1/4 --subgroup-size
1.24e8 --gpu-update-budget 30GB --overlap off --emulate-compute --tokens 4096 -n 6 --report`, six
phases that streamed 12-13 of 35 subgroups):

1. Each phase replayed from the run's own rates gives, by the formula (the runtime's default
   measure), the link_share the run's refinement left (its rates_after) within 0.002: the replay
   is the runtime's step on the report's measures. The simulated measure gives a value in
   [1/16, 2] for each phase.
2. The same report without stream_end_seconds and rates_after (a report from before they were
   recorded): each stream end is taken as the phase's end and said so, the phases are chained,
   and no run's link_share is printed.
3. Bad input: no argument (usage, status 2), a missing file, a file that is not JSON, JSON that is
   not a report, a negative subgroup count, a placement with a side other than c, s or r, a placement of the wrong length,
   a rate that is not positive: status 2 and a message naming what is wrong.

    test_replay.py DOS_REPLAY REPORT.json
"""
import json
import os
import re
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def main():
    tool, report = sys.argv[1], sys.argv[2]
    rep = json.load(open(report))
    n = len(rep["iterations"])
    rc, out, err = run(tool, report)
    check(rc == 0, f"the report replays (status {rc}: {err.strip()})")
    steps = re.findall(r"link_share ([0-9.]+) -> formula ([0-9.]+), simulated ([0-9.]+); the run's ([0-9.]+)", out)
    check(len(steps) == n, f"one link_share line per phase with the run's value ({len(steps)} of {n})")
    worst = max((abs(float(f) - float(run_)) for _, f, _, run_ in steps), default=1)
    check(worst <= 0.002, f"the formula gives the run's link_share at every phase (worst {worst:.4f} apart)")
    check(all(0.0625 <= float(s) <= 2 for _, _, s, _ in steps), "the simulated measure within [1/16, 2] at every phase")
    first_before = float(steps[0][0]) if steps else 0
    check(abs(first_before - rep["calibrated_rates"]["link_share"]) < 5e-4, "the first phase starts at the calibration's link_share")

    with tempfile.TemporaryDirectory() as d:
        old = dict(rep, iterations=[{k: v for k, v in it.items() if k not in ("stream_end_seconds", "rates_after")}
                                    for it in rep["iterations"]])
        path = os.path.join(d, "old.json")
        json.dump(old, open(path, "w"))
        rc, out, err = run(tool, path)
        check(rc == 0 and out.count("(the phase's end)") == n and "the run's" not in out,
              f"a report without stream ends or rates_after: each end the phase's, chained, no run's value (status {rc})")

        def bad(name, text, want):
            p = os.path.join(d, name)
            open(p, "w").write(text)
            rc, out, err = run(tool, p)
            check(rc == 2 and want in err, f"{name}: status 2 and '{want}' ({rc}: {err.strip()[:160]})")

        rc, out, err = run(tool)
        check(rc == 2 and "usage: dos-replay" in err, f"no argument: usage, status 2 ({rc})")
        rc, out, err = run(tool, os.path.join(d, "none.json"))
        check(rc == 2 and "cannot read it" in err, f"a missing file: status 2 and 'cannot read it' ({rc}: {err.strip()})")
        bad("text.json", "not json", "it is not JSON")
        bad("list.json", "[1, 2]", "has no \"subgroups\"")
        side = json.loads(json.dumps(rep))
        side["iterations"][0]["placement"] = "x" + side["iterations"][0]["placement"][1:]
        bad("side.json", json.dumps(side), "a placement holds 'x'")
        short = json.loads(json.dumps(rep))
        short["iterations"][1]["placement"] = short["iterations"][1]["placement"][:-1]
        bad("short.json", json.dumps(short), "a placement has 34 sides for 35 subgroups")
        neg = json.loads(json.dumps(rep))
        neg["subgroups"] = -35
        bad("negative.json", json.dumps(neg), "\"subgroups\" is not a whole number >= 0")
        rate = json.loads(json.dumps(rep))
        rate["calibrated_rates"]["B_h2d"] = 0
        bad("rate.json", json.dumps(rate), "calibrated_rates holds a rate that is not a positive number")
    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
