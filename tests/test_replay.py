#!/usr/bin/env python3
"""dos-replay (examples/dos-replay.cpp) on a dos-train report of the 20B quarter on an H100
(tests/report_20b_h100.json: `dos-train --policy dos --preset llama-20b --shard 1/4 --subgroup-size
1.24e8 --gpu-update-budget 30GB --overlap off --emulate-compute --tokens 4096 -n 6 --report`, six
phases that streamed 12-13 of 35 subgroups):

1. Each phase replayed from the run's own rates gives, by the formula (the runtime's default
   measure), the link_share the run's refinement left (its rates_after) within 1e-4 (the set-up
   taken off the stream end as the runtime does; without that, 7e-4): the replay is the runtime's
   step on the report's measures. The simulated measure gives within 0.01 of it at each phase
   (0.0075 at most on this report: on this machine the two measures agree).
   Phases the run did not refine (skipped, overlapped, held as an outlier) are said so and leave
   link_share as it was.
2. The same report without stream_end_seconds and rates_after (a report from before they were
   recorded): each stream end is taken as the phase's end and said so, the phases are chained,
   and no run's link_share is printed.
   Each phase's CPU Adam busy seconds are the report's, printed beside the simulation's.
   A report that holds each phase's cpu_adam_idle_before_stream_end_seconds prints it per phase
   beside the simulation's counterpart (none without it; one that is not a number is refused).
   A report's "first_link_share" (the run's DOS_FIRST_LINK_SHARE) is followed: "whole" replays as a
   report without it; "lower", on the report with its calibration's link_share set to 0.5 (below
   the first phase's measure), keeps 0.5 after the first phase by both measures and says so on the
   first line, where "whole" takes the measure.
3. Bad input: no argument (usage, status 2), a missing file, a file that is not JSON, JSON that is
   not a report, a negative subgroup count, counts that describe no partition, a report without a
   CUDA worker, an unknown dtype, copy rule or caller memory (each named), too many CPU workers, a
   stream end beyond the phase, a placement with a side other than c, s or r, a placement of the wrong length,
   a rate that is not positive: status 2 and a message naming what is wrong.

   --first-link-shares L1,L2,...: one line per share, in order, closing the first phase's block,
   the phase as it ran simulated at that share; at the calibration's own share it gives the
   phase's simulation (set-up added) and the run's prediction within 0.05% (the report's first plan
   ran as planned); a lower share never gives a shorter phase, and 0.5 one far longer; on the
   compact report with its first phase marked overlapped the lines go to phase 2, whose own
   simulation the calibration's share gives again. A share above U_c / U_c_dma or below 1/16, 0, a
   word, nan, inf, a leading blank, an empty list and a second word are refused with status 2 and
   nothing on stdout, each message naming --first-link-shares; a report whose every phase was
   skipped, or without predictions, is refused for the option and replays without it.
4. A compact master's report (tests/report_20b_compact_h100.json: the same command with `--master
   compact` on an H100 at 13f6ab5): the formula gives the run's link_share within 1e-4 at every
   phase, which needs each phase's P in the host staging exactly for the subgroups the phase
   before updated on the CPU (the runtime's rule; taking every subgroup's P as on the host left
   0.01-0.05 between the two).

    test_replay.py DOS_REPLAY REPORT.json COMPACT_REPORT.json
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


AT_SHARE = re.compile(r"at link_share ([0-9.]+): simulated ([0-9.]+) s \(stream end ([0-9.]+)\); "
                      r"the run's prediction ([0-9.]+) s ([-+][0-9.]+)% against it")


def phase_block(out, k):
    """The lines of phase k's replay in dos-replay's output (from "phase k:" to the next phase)."""
    m = re.search(rf"^phase {k}: .*?(?=^phase {k + 1}: |\Z)", out, re.S | re.M)
    return m.group(0) if m else ""


def check_own_share(out, k, predicted, what):
    """At the calibration's own share (the third line of phase k's block), the phase's own
    simulation with its set-up, and, where `predicted` is given (the run planned the phase at the
    calibrated rates and it ran as planned), the run's prediction."""
    block = phase_block(out, k)
    at = AT_SHARE.findall(block)
    own = re.search(r"\(set-up ([0-9.]+) s off\); simulated at the rates before ([0-9.]+) s", block)
    ok = len(at) >= 3 and own is not None
    total = float(own.group(1)) + float(own.group(2)) if own else float("nan")
    if ok:
        ok = abs(float(at[2][1]) - total) <= 2e-4 and (predicted is None or abs(float(at[2][1]) / predicted - 1) <= 5e-4)
    against = f"{total:.4f}" + ("" if predicted is None else f" and {predicted:.4f}")
    also = "" if predicted is None else " and the run's prediction"
    check(ok, f"{what}: at the calibration's share, phase {k}'s simulation with its set-up{also} "
              f"({at[2][1] if len(at) >= 3 else '-'} s against {against})")


def first_link_shares(tool, report, rep, compact, crep, d):
    """--first-link-shares on the 20B report (its first phase ran as planned), on the compact
    report with its first phase marked overlapped (the option then acts on phase 2), and its
    refusals."""
    cal = rep["calibrated_rates"]["link_share"]
    shares = [0.5, 0.7, round(cal, 6), 1.0]
    rc, out, err = run(tool, report, "--first-link-shares", ",".join(str(x) for x in shares))
    at = AT_SHARE.findall(out)
    check(rc == 0 and len(at) == len(shares) and [x[0] for x in at] == [f"{x:.4f}" for x in shares],
          f"--first-link-shares: one line per share, in order ({[x[0] for x in at]}, status {rc}: {err.strip()[:120]})")
    if len(at) != len(shares):
        return
    # the lines follow the first phase's own, its link_share line last before them
    block = phase_block(out, 1)
    check(len(AT_SHARE.findall(block)) == len(shares) and block.index("link_share ") < block.index("at link_share"),
          "the shares' lines close the first phase's block")
    predicted = rep["iterations"][0]["predicted_seconds"]
    check_own_share(out, 1, predicted, "the 20B report")
    times = [float(x[1]) for x in at]
    # a lower share, a longer phase: at 0.5 this report's first phase is the links' (0.9569 s)
    check(all(a >= b - 1e-4 for a, b in zip(times, times[1:])) and times[0] > times[2] + 0.1,
          f"a lower share never a shorter phase, 0.5 far longer than the calibration's share ({times})")
    errors = [float(x[4]) for x in at]
    check(all(abs(predicted / t - 1 - e / 100) <= 1e-3 for t, e in zip(times, errors)) and errors[0] < -10,
          f"each error is the run's prediction against that simulation ({errors})")
    # the compact report with its first phase overlapped (not refined): the option acts on phase 2,
    # which began at the calibrated rates, with its own execution (its state, the P of phase 1's
    # CPU subgroups on the host)
    later = json.loads(json.dumps(crep))
    later["iterations"][0]["overlapped"] = True
    path = os.path.join(d, "overlapped-first.json")
    json.dump(later, open(path, "w"))
    ccal = crep["calibrated_rates"]["link_share"]
    rc, out, err = run(tool, path, "--first-link-shares", f"0.5,0.7,{ccal:.6f}")
    check(rc == 0 and len(AT_SHARE.findall(out)) == 3 and len(AT_SHARE.findall(phase_block(out, 2))) == 3,
          f"a first phase overlapped: the shares' lines in phase 2's block ({rc}: {err.strip()[:120]})")
    # (the run planned phase 2 at the rates phase 1 refined: its prediction is not this simulation's)
    check_own_share(out, 2, None, "the compact report, phase 1 overlapped")
    cap = rep["calibrated_rates"]["U_c"] / rep["calibrated_rates"]["U_c_dma"]
    for value, want in ((f"{cap * 1.01:.4f}", "outside the model's bounds"), ("0.05", "outside the model's bounds"),
                        ("0", "not a finite number above 0"), ("x", "not a finite number above 0"),
                        ("nan", "not a finite number above 0"), ("inf", "not a finite number above 0"),
                        (" 0.8", "not a finite number above 0"), ("", "--first-link-shares")):
        rc, out, err = run(tool, report, "--first-link-shares", value)
        check(rc == 2 and out == "" and "--first-link-shares" in err and want in err,
              f"--first-link-shares '{value}': status 2, nothing on stdout, '{want}' ({rc}: {err.strip()[:160]})")
    rc, out, err = run(tool, report, "--first-link-shares", "0.8", "0.9")
    check(rc == 2 and out == "", f"--first-link-shares takes one comma-separated list, not a second word ({rc})")

    def refused(name, change, want):
        x = json.loads(json.dumps(rep))
        change(x)
        p = os.path.join(d, name)
        json.dump(x, open(p, "w"))
        rc, out, err = run(tool, p, "--first-link-shares", "0.8")
        check(rc == 2 and out == "" and want in err, f"{name}: the option refused, nothing printed ({rc}: {err.strip()[:120]})")
        rc, out, err = run(tool, p)
        check(rc == 0, f"{name}: replayed without the option ({rc}: {err.strip()[:120]})")
        return out

    out = refused("skipped.json", lambda x: [it.update(skipped=True) for it in x["iterations"]], "refined after no phase")
    check(out.count("skipped, not refined") == len(rep["iterations"]), "every phase skipped: each said so")
    refused("unpredicted.json", lambda x: [it.update(predicted_seconds=0) for it in x["iterations"]],
            "holds no prediction")


def main():
    tool, report, compact = sys.argv[1], sys.argv[2], sys.argv[3]
    crep = json.load(open(compact))
    rc, out, err = run(tool, compact)
    csteps = re.findall(r"link_share ([0-9.]+) -> formula ([0-9.]+), simulated ([0-9.]+); the run's ([0-9.]+)", out)
    cworst = max((abs(float(f) - float(run_)) for _, f, _, run_ in csteps), default=1)
    check(rc == 0 and crep["master"] == "compact" and len(csteps) == len(crep["iterations"]) and cworst <= 1e-4,
          f"a compact master's report: the formula gives the run's link_share at every phase (worst {cworst:.4f} apart)")
    rep = json.load(open(report))
    n = len(rep["iterations"])
    rc, out, err = run(tool, report)
    check(rc == 0, f"the report replays (status {rc}: {err.strip()})")
    out_plain = out
    busy = re.findall(r"CPU Adam busy ([0-9.]+) s \(simulated ([0-9.]+) s, ([0-9.]+) of it beside DMA\)", out)
    check(len(busy) == n and all(f"{it['cpu_adam_seconds']:.4f}" == b[0] and float(b[2]) <= float(b[1]) + 1e-4
                                 for it, b in zip(rep["iterations"], busy)),
          f"each phase's CPU Adam busy seconds, the report's, beside the simulation's ({busy[:2]})")
    steps = re.findall(r"link_share ([0-9.]+) -> formula ([0-9.]+), simulated ([0-9.]+); the run's ([0-9.]+)", out)
    check(len(steps) == n, f"one link_share line per phase with the run's value ({len(steps)} of {n})")
    worst = max((abs(float(f) - float(run_)) for _, f, _, run_ in steps), default=1)
    check(worst <= 1e-4, f"the formula gives the run's link_share at every phase (worst {worst:.4f} apart)")
    near = max((abs(float(x) - float(run_)) for _, _, x, run_ in steps), default=1)
    check(near <= 0.01, f"the simulated measure within 0.01 of the run's link_share at every phase ({near:.4f})")
    first_before = float(steps[0][0]) if steps else 0
    check(abs(first_before - rep["calibrated_rates"]["link_share"]) < 5e-4, "the first phase starts at the calibration's link_share")

    with tempfile.TemporaryDirectory() as d:
        held = json.loads(json.dumps(rep))
        held["iterations"][1].update(skipped=True, placement="")
        held["iterations"][2]["overlapped"] = True
        held["iterations"][3]["refinement_held"] = True
        hp = os.path.join(d, "held.json")
        json.dump(held, open(hp, "w"))
        rc, out, err = run(tool, hp)
        kept = re.findall(r"phase (\d+): ([a-z' ]+), not refined by the run; link_share stays ([0-9.]+)", out)
        check(rc == 0 and [k for k, _, _ in kept] == ["2", "3", "4"] and
              [w for _, w, _ in kept] == ["skipped", "overlapped with the caller's work", "held as an outlier"],
              f"skipped, overlapped and held phases said so ({rc}: {kept})")
        check(len(kept) == 3 and kept[0][2] == f"{held['iterations'][0]['rates_after']['link_share']:.4f}",
              "a phase not refined leaves link_share as the phase before left it")

        idle = json.loads(json.dumps(rep))
        for j, it in enumerate(idle["iterations"]):
            it["cpu_adam_idle_before_stream_end_seconds"] = 0.0125 * (j + 1)
        ip = os.path.join(d, "idle.json")
        json.dump(idle, open(ip, "w"))
        rc, out, err = run(tool, ip)
        said = re.findall(r"CPU Adam idle before the stream end ([0-9.]+) s \(simulated ([0-9.]+) s\)", out)
        check(rc == 0 and [a for a, _ in said] == [f"{0.0125 * (j + 1):.4f}" for j in range(n)] and
              all(float(b) >= 0 for _, b in said),
              f"a report with the CPU's idle before each stream end: each phase prints it beside the simulation's ({rc}: {said})")
        check("CPU Adam idle" not in out_plain, "a report without it prints none")
        idle["iterations"][0]["cpu_adam_idle_before_stream_end_seconds"] = "soon"
        json.dump(idle, open(ip, "w"))
        rc, out, err = run(tool, ip)
        check(rc == 2 and "cpu_adam_idle_before_stream_end_seconds\" is not a number" in err,
              f"a CPU idle that is not a number: status 2, named ({rc}: {err.strip()[:160]})")

        def replay_as(name, change):
            x = json.loads(json.dumps(rep))
            change(x)
            p = os.path.join(d, name)
            json.dump(x, open(p, "w"))
            return run(tool, p)

        rc, out, err = replay_as("whole.json", lambda x: x.update(first_link_share="whole"))
        check(rc == 0 and out == out_plain, f"first_link_share whole replays as a report without it ({rc})")
        def low_calibration(x, rule):
            x["calibrated_rates"]["link_share"] = 0.5
            x["first_link_share"] = rule
            for it in x["iterations"]:
                it.pop("rates_after")
        first_step = r"link_share ([0-9.]+) -> formula ([0-9.]+), simulated ([0-9.]+)"
        rc, out, err = replay_as("whole-low.json", lambda x: low_calibration(x, "whole"))
        took = re.findall(first_step, out)[:1]
        check(rc == 0 and took and took[0][0] == "0.5000" and float(took[0][1]) > 0.6 and float(took[0][2]) > 0.6,
              f"a calibration at 0.5 below the first phase's measure: whole takes it ({rc}: {took})")
        rc, out, err = replay_as("lower-low.json", lambda x: low_calibration(x, "lower"))
        kept = re.findall(first_step, out)[:1]
        check(rc == 0 and kept == [("0.5000", "0.5000", "0.5000")] and "first_link_share lower" in out.splitlines()[0],
              f"lower keeps the calibration's 0.5 after the first phase, said on the first line ({rc}: {kept})")

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
        first_link_shares(tool, report, rep, compact, crep, d)
        rc, out, err = run(tool, os.path.join(d, "none.json"))
        check(rc == 2 and "cannot read it" in err, f"a missing file: status 2 and 'cannot read it' ({rc}: {err.strip()})")
        bad("text.json", "not json", "it is not JSON")
        bad("list.json", "[1, 2]", "has no \"subgroups\"")
        side = json.loads(json.dumps(rep))
        side["iterations"][0]["placement"] = "x" + side["iterations"][0]["placement"][1:]
        bad("side.json", json.dumps(side), "iteration 1 of the report's \"placement\" holds byte 120")
        short = json.loads(json.dumps(rep))
        short["iterations"][1]["placement"] = short["iterations"][1]["placement"][:-1]
        bad("short.json", json.dumps(short), "iteration 2 of the report's \"placement\" has 34 sides for 35 subgroups")
        neg = json.loads(json.dumps(rep))
        neg["subgroups"] = -35
        bad("negative.json", json.dumps(neg), "\"subgroups\" is not a whole number >= 0")
        def altered(name, want, change):
            x = json.loads(json.dumps(rep))
            change(x)
            bad(name, json.dumps(x), want)

        altered("partition.json", "do not describe a partition", lambda x: x.update(params=10**15))
        altered("wrap.json", "do not describe a partition", lambda x: x.update(subgroups=2049, subgroup_size=2**53, params=2**53))
        altered("cpu-run.json", "without a CUDA worker", lambda x: x.update(cuda_workers=0))
        altered("dtype.json", "\"dtype\" is \"bf17\", not one of fp32, bf16, fp16", lambda x: x.update(dtype="bf17"))
        altered("copy.json", "\"copy_by\" is 3, not one of", lambda x: x.update(copy_by=3))
        altered("memory.json", "\"caller_memory\" is \"gpu\", not one of cuda, host", lambda x: x.update(caller_memory="gpu"))
        altered("workers.json", "cpu_workers (1 to 1024)", lambda x: x.update(cpu_workers=10**7))
        altered("end.json", "iteration 2 of the report's stream end lies outside", lambda x: x["iterations"][1].update(stream_end_seconds=6.9))
        altered("first.json", "\"first_link_share\" is \"half\", not one of whole, lower",
                lambda x: x.update(first_link_share="half"))
        rate = json.loads(json.dumps(rep))
        rate["calibrated_rates"]["B_h2d"] = 0
        bad("rate.json", json.dumps(rate), "calibrated_rates holds a rate that is not a positive number")
    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
