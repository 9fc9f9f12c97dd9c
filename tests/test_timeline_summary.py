#!/usr/bin/env python3
"""examples/timeline_summary.py on a timeline made by hand, every expected figure worked out here
from the tasks and samples below; then its command line (text, JSON, bad files)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]
spec = importlib.util.spec_from_file_location("timeline_summary", script)
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)

# CPU Adams of subgroups 0, 1, 3; a streamed Adam (2) and a gradient staging (3) on the GPU; the
# runtime's own parameter uploads of 0, 1, 3 on lane h2d. Span 0.150 s.
doc = {"tasks": [
    {"lane": "cpu", "what": "adam", "subgroup": 0, "start": 0.010, "end": 0.050},
    {"lane": "cpu", "what": "adam", "subgroup": 1, "start": 0.052, "end": 0.090},
    {"lane": "cpu", "what": "adam", "subgroup": 3, "start": 0.100, "end": 0.140},
    {"lane": "gpu", "what": "adam", "subgroup": 2, "start": 0.030, "end": 0.031},
    {"lane": "gpu", "what": "gather", "subgroup": 3, "start": 0.001, "end": 0.002},
    {"lane": "h2d", "what": "scatter", "subgroup": 0, "start": 0.050, "end": 0.055},
    {"lane": "h2d", "what": "scatter", "subgroup": 1, "start": 0.090, "end": 0.095},
    {"lane": "h2d", "what": "scatter", "subgroup": 3, "start": 0.140, "end": 0.150}],
    "bus": [[0.06, 3e9, 2e9], [0.02, 1e9, 0], [0.15, 6e9, 2e9]]}  # out of order on purpose
s = ts.summarize(doc)
fails = []


def near(a, b, what, tol=1e-9):
    if abs(a - b) > tol:
        fails.append(f"{what}: {a} != {b}")


near(s["span"], 0.150, "span")
near(s["lanes"]["cpu"]["busy"], 0.040 + 0.038 + 0.040, "cpu busy")
near(s["lanes"]["cpu"]["fraction"], 0.118 / 0.150, "cpu fraction")
near(s["lanes"]["gpu"]["busy"], 0.002, "gpu busy")
near(s["lanes"]["h2d"]["busy"], 0.020, "h2d busy")
if [s["lanes"][k]["tasks"] for k in ("cpu", "gpu", "h2d")] != [3, 2, 3]:
    fails.append(f"task counts {s['lanes']}")
# per task: the CPU's Adams last 40, 38 and 40 ms, the uploads 5, 5 and 10 ms
for lane, want in (("cpu", (0.038, 0.040, 0.040)), ("h2d", (0.005, 0.005, 0.010)), ("gpu", (0.001, 0.001, 0.001))):
    got = s["lanes"][lane]["task_seconds"]
    for k, w in zip(("min", "median", "max"), want):
        near(got[k], w, f"{lane} task {k}")
if "lane cpu: 3 tasks, busy 0.1180 s (79%), per task 38.0/40.0/40.0 ms" not in "\n".join(ts.render(s)):
    fails.append(f"the cpu lane's line: {ts.render(s)}")
# gaps of at least 5 ms: [0, 10 ms) before the first Adam and [90, 100 ms); the 2 ms one is not listed
if len(s["cpu_gaps"]) != 2:
    fails.append(f"cpu gaps {s['cpu_gaps']}")
else:
    near(s["cpu_gaps"][0][0], 0.0, "gap 1 start"), near(s["cpu_gaps"][0][1], 0.010, "gap 1 length")
    near(s["cpu_gaps"][1][0], 0.090, "gap 2 start"), near(s["cpu_gaps"][1][1], 0.010, "gap 2 length")
near(len(ts.summarize(doc, gap_ms=1.5)["cpu_gaps"]), 3, "gaps of 1.5 ms or more")
# the tail: from the streamed Adam's end (31 ms) to 150 ms; the CPU Adams of 1 and 3 and the three uploads began in it
near(s["tail"]["from"], 0.031, "tail start")
near(s["tail"]["length"], 0.119, "tail length")
if s["tail"]["tasks"] != {"cpu/adam": 2, "h2d/scatter": 3}:
    fails.append(f"tail tasks {s['tail']['tasks']}")
# PCIe: 6e9 up and 2e9 down in 0.150 s: 40 and 13.33 GB/s; windows of 50 ms: 1e9, 2e9, 3e9 up
# (20, 40, 60 GB/s), 0, 2e9, 0 down (0, 40, 0)
b = s["bus"]
near(b["h2d_bytes"], 6e9, "h2d bytes"), near(b["d2h_bytes"], 2e9, "d2h bytes")
near(b["h2d_gbps"], 40.0, "h2d GB/s"), near(b["d2h_gbps"], 2e9 / 0.15 / 1e9, "d2h GB/s")
if len(b["windows"]) != 3:
    fails.append(f"windows {b['windows']}")
else:
    for (a, h, d), (wa, wh, wd) in zip(b["windows"], [(0.0, 20, 0), (0.05, 40, 40), (0.10, 60, 0)]):
        near(a, wa, "window start"), near(h, wh, f"window {wa} h2d", 1e-6), near(d, wd, f"window {wa} d2h", 1e-6)
# no streamed Adam: no tail; bad input refused
plain = {"tasks": [t for t in doc["tasks"] if not (t["lane"] == "gpu" and t["what"] == "adam")], "bus": []}
p = ts.summarize(plain)
if p["tail"]["from"] is not None or p["bus"]["windows"]:
    fails.append(f"without a streamed Adam or samples: {p['tail']}, {p['bus']}")
cpu_task = {"lane": "cpu", "what": "adam", "subgroup": 0, "start": 0.0, "end": 0.001}
for bad, kw in (({"bus": []}, {}), ({"tasks": [{"lane": "cpu"}]}, {}), (doc, {"gap_ms": 0}),
                ({"tasks": [dict(cpu_task, start="abc")]}, {}), ({"tasks": [5]}, {}),
                ({"tasks": [dict(cpu_task, start=1.0, end=0.5)]}, {}),
                ({"tasks": [dict(cpu_task, start=float("nan"))]}, {}),
                ({"tasks": [dict(cpu_task, lane=3)]}, {}),
                ({"tasks": [cpu_task], "bus": [[1]]}, {}), ({"tasks": [cpu_task], "bus": 7}, {}),
                ({"tasks": [cpu_task], "bus": [[0.0, "x", 0]]}, {})):
    try:
        ts.summarize(bad, **kw)
        fails.append(f"accepted {bad if bad is not doc else 'gap_ms=0'}")
    except ValueError:
        pass

# state write-backs: none above; two here, from their Adams' ends (31 and 60 ms) home at 91 and
# 130 ms: spans 60 and 70 ms, overlapping, in no lane's busy figure; 2 x 1.2e9 bytes between 31 and
# 130 ms: 2.4e9 / 0.099 s
if s["writebacks"] is not None:
    fails.append(f"write-backs without any: {s['writebacks']}")
wdoc = {"tasks": doc["tasks"] + [
    {"lane": "writeback", "what": "state", "subgroup": 2, "start": 0.031, "end": 0.091},
    {"lane": "writeback", "what": "state", "subgroup": 4, "start": 0.060, "end": 0.130}], "bus": doc["bus"]}
w = ts.summarize(wdoc, state_bytes=1.2e9)
if "writeback" in w["lanes"] or w["writebacks"] is None or w["writebacks"]["count"] != 2:
    fails.append(f"write-backs: lanes {sorted(w['lanes'])}, {w['writebacks']}")
else:
    wb = w["writebacks"]
    near(wb["first_end"], 0.091, "first write-back end"), near(wb["last_end"], 0.130, "last write-back end")
    near(wb["span_seconds"]["min"], 0.060, "shortest write-back"), near(wb["span_seconds"]["max"], 0.070, "longest")
    near(wb["span_seconds"]["median"], 0.065, "median write-back")
    near(wb["gbps"], 2.4e9 / 0.099 / 1e9, "write-back GB/s", 1e-9)
    near(w["lanes"]["cpu"]["busy"], s["lanes"]["cpu"]["busy"], "cpu busy with write-backs")
    if "state write-backs: 2, ended from 91 to 130 ms, each 60.0/65.0/70.0 ms" not in "\n".join(ts.render(w)):
        fails.append(f"write-back line: {ts.render(w)}")
# the chain: in doc one streamed Adam (2, 30-31 ms): no interval, the CPU ends at 140 ms, the chain
# (no write-back) at 31 ms; in wdoc a second streamed Adam (4) at 59-60 ms: one interval of 29 ms,
# the chain ends with the last write-back (130 ms)
c = s["chain"]
near(c["first_adam"], 0.030, "first streamed Adam"), near(c["cpu_end"], 0.140, "cpu end"), near(c["chain_end"], 0.031, "chain end")
if c["interval_seconds"] is not None:
    fails.append(f"an interval with one streamed Adam: {c}")
w2 = ts.summarize({"tasks": wdoc["tasks"] + [{"lane": "gpu", "what": "adam", "subgroup": 4, "start": 0.059, "end": 0.060}]})
c2 = w2["chain"]
near(c2["interval_seconds"]["median"], 0.029, "chain interval"), near(c2["chain_end"], 0.130, "chain end with write-backs")
if "streamed chain: first Adam at 30 ms, then one every 29.0/29.0/29.0 ms (shortest/median/longest); the CPU's last task " \
        "ended at 140 ms, the chain at 130 ms; 2 of the 2 streamed Adams began before the CPU's end" \
        not in "\n".join(ts.render(w2)):
    fails.append(f"chain line: {ts.render(w2)}")
# out of time order on purpose: streamed Adams (subgroups 2, 4, 6, 8 with write-backs) start at 30,
# 59, 110 and 100 ms: intervals 29, 41 and 10 ms; a resident subgroup's Adam (9, no write-back) at
# 5 ms is not in the chain; write-backs end at 130 and 125 ms, the Adams of 6 and 8 at 111 and 101;
# the CPU's last task ends at 140 ms though listed before one ending at 20 ms
odd = {"tasks": [
    {"lane": "gpu", "what": "adam", "subgroup": 6, "start": 0.110, "end": 0.111},
    {"lane": "gpu", "what": "adam", "subgroup": 9, "start": 0.005, "end": 0.006},
    {"lane": "gpu", "what": "adam", "subgroup": 8, "start": 0.100, "end": 0.101}] + wdoc["tasks"] + [
    {"lane": "gpu", "what": "adam", "subgroup": 4, "start": 0.059, "end": 0.060},
    {"lane": "writeback", "what": "state", "subgroup": 6, "start": 0.111, "end": 0.125},
    {"lane": "writeback", "what": "state", "subgroup": 8, "start": 0.101, "end": 0.115},
    {"lane": "cpu", "what": "adam", "subgroup": 10, "start": 0.0, "end": 0.020}]}
co = ts.summarize(odd)["chain"]
near(co["first_adam"], 0.030, "odd: first streamed Adam")
for k, w in (("min", 0.010), ("median", 0.029), ("max", 0.041)):
    near(co["interval_seconds"][k], w, f"odd: interval {k}")
near(co["cpu_end"], 0.140, "odd: cpu end"), near(co["chain_end"], 0.130, "odd: chain end")
if "1 of the 1 streamed Adam began before the CPU's end" not in "\n".join(ts.render(s)):
    fails.append(f"one streamed Adam's chain line: {ts.render(s)}")
if (co["beside_cpu"], co["count"]) != (4, 4):
    fails.append(f"odd: 4 of 4 streamed Adams began before the CPU's end, got {co}")
# a chain that waits while the CPU works: the CPU busy until 50 ms, streamed Adams at 30, 60 and 90 ms
late = {"tasks": [{"lane": "cpu", "what": "adam", "subgroup": 0, "start": 0.0, "end": 0.050}] + [
    t for k, at in ((1, 0.030), (2, 0.060), (3, 0.090)) for t in (
        {"lane": "gpu", "what": "adam", "subgroup": k, "start": at, "end": at + 0.001},
        {"lane": "writeback", "what": "state", "subgroup": k, "start": at + 0.001, "end": at + 0.020})]}
cl = ts.summarize(late)["chain"]
if (cl["beside_cpu"], cl["count"]) != (1, 3) or "1 of the 3 streamed Adams began before the CPU's end" not in \
        "\n".join(ts.render(ts.summarize(late))):
    fails.append(f"late: 1 of 3 streamed Adams before the CPU's end, got {cl}")
if p["chain"] is not None:
    fails.append(f"a chain without a streamed Adam: {p['chain']}")
if ts.summarize(wdoc)["writebacks"]["gbps"] is not None:
    fails.append("a write-back rate without --state-bytes")
try:
    ts.summarize(wdoc, state_bytes=0)
    fails.append("accepted state_bytes=0")
except ValueError:
    pass

# the command line
with tempfile.TemporaryDirectory() as d:
    good = os.path.join(d, "t.json")
    with open(good, "w") as f:
        json.dump(doc, f)
    r = subprocess.run([sys.executable, script, good], capture_output=True, text=True)
    if r.returncode != 0 or "tail after the last streamed Adam (31 ms): 119 ms; cpu/adam 2, h2d/scatter 3" not in r.stdout:
        fails.append(f"text output: {r.returncode} {r.stdout} {r.stderr}")
    r = subprocess.run([sys.executable, script, good, "--json"], capture_output=True, text=True)
    if r.returncode != 0 or abs(json.loads(r.stdout)["span"] - 0.15) > 1e-12:
        fails.append(f"json output: {r.returncode} {r.stdout[:200]} {r.stderr}")
    notjson = os.path.join(d, "n.json")
    with open(notjson, "w") as f:
        f.write("not json")
    for path in (notjson, os.path.join(d, "missing.json")):
        r = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
        if r.returncode != 2 or "timeline_summary:" not in r.stderr or r.stdout:
            fails.append(f"{path}: exit {r.returncode}, stderr {r.stderr!r}")
    # train_gpt.py --timeline's form: the same tasks on the training's clock, 2.5 s later, as the
    # phase of step 3, bucket 1, and a second phase; each summarised from its own start
    tg = {"origin_perf_counter": 0.0, "steps": [], "phases": [
        {"step": 3, "bucket": 1, "started": 2.5, "seconds": 0.15,
         "tasks": [dict(t, start=t["start"] + 2.5, end=t["end"] + 2.5) for t in doc["tasks"]]},
        {"step": 4, "bucket": 0, "started": 3.0, "seconds": 0.01,
         "tasks": [{"lane": "cpu", "what": "adam", "subgroup": 0, "start": 3.0, "end": 3.01}]}]}
    tgpath = os.path.join(d, "tg.json")
    with open(tgpath, "w") as f:
        json.dump(tg, f)
    r = subprocess.run([sys.executable, script, tgpath, "--json"], capture_output=True, text=True)
    try:
        parts = json.loads(r.stdout)
        one = parts[0]["summary"]
        if [(p["step"], p["bucket"]) for p in parts] != [(3, 1), (4, 0)] or abs(one["span"] - s["span"]) > 1e-9 \
                or abs(one["lanes"]["cpu"]["busy"] - s["lanes"]["cpu"]["busy"]) > 1e-9 \
                or len(one["cpu_gaps"]) != len(s["cpu_gaps"]) or one["bus"]["samples"] != 0 \
                or abs(parts[1]["summary"]["span"] - 0.01) > 1e-9:
            fails.append(f"train_gpt's form: {parts}")
        near(one["tail"]["length"], s["tail"]["length"], "train_gpt's form: the tail")
        for (a, b), (c, e) in zip(one["cpu_gaps"], s["cpu_gaps"]):
            near(a, c, "train_gpt's form: a CPU gap's start"), near(b, e, "train_gpt's form: a CPU gap's length")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        fails.append(f"train_gpt's form: {e}: {r.returncode} {r.stdout[:300]} {r.stderr}")
    r = subprocess.run([sys.executable, script, tgpath], capture_output=True, text=True)
    if r.returncode != 0 or "step 3, bucket 1:" not in r.stdout or "PCIe: no byte samples" not in r.stdout:
        fails.append(f"train_gpt's form as text: {r.returncode} {r.stdout[:300]} {r.stderr}")
    for bad, needle in (({"phases": []}, "no update phase"), ({"phases": [{"step": 1}]}, "phase 0 is not an object"),
                        ({"phases": [{"step": 1, "bucket": 0, "started": "x", "tasks": []}]}, "not a finite number"),
                        ({"phases": [{"step": 1, "bucket": 0, "started": 1.0, "tasks": [
                            {"lane": "cpu", "what": "adam", "subgroup": 0, "start": 0.5, "end": 1.1}]}]},
                         "before the phase's start"),
                        ({"phases": [{"step": 7, "bucket": 2, "started": 1.0, "tasks": [
                            {"what": "adam", "subgroup": 0, "start": 1.0, "end": 1.1}]}]},
                         "phase 0 (step 7, bucket 2; times counted from its start): task 0 has no 'lane'")):
        with open(tgpath, "w") as f:
            json.dump(bad, f)
        r = subprocess.run([sys.executable, script, tgpath], capture_output=True, text=True)
        if r.returncode != 2 or needle not in r.stderr or r.stdout:
            fails.append(f"{bad}: exit {r.returncode}, stderr {r.stderr!r} (wanted '{needle}')")
    # bad numbers: argparse's usage error (status 2) naming the option, nothing printed on stdout;
    # a window that would cut the 0.15 s phase into more than MAX_WINDOWS windows is refused
    for args, needle in ((["--gap-ms", "0"], "--gap-ms must be > 0"), (["--window-ms", "-1"], "--window-ms must be > 0"),
                         (["--state-bytes", "0"], "--state-bytes must be > 0"),
                         (["--gap-ms", "inf"], "argument --gap-ms: expected a plain decimal number"),
                         (["--window-ms", "1e-400"], "argument --window-ms: '1e-400' is beyond what a float holds"),
                         (["--window-ms", "1e-6"], "more than 100000 windows")):
        r = subprocess.run([sys.executable, script, good] + args, capture_output=True, text=True, timeout=60)
        if r.returncode != 2 or needle not in r.stderr or r.stdout:
            fails.append(f"{args}: exit {r.returncode}, stderr {r.stderr!r} (wanted '{needle}')")
    # run through a symbolic link from another folder, as a site's bin/ would hold it
    link = os.path.join(d, "timeline-summary")
    os.symlink(os.path.realpath(script), link)
    r = subprocess.run([sys.executable, link, good], capture_output=True, text=True, cwd=d)
    if r.returncode != 0 or "tail after the last streamed Adam" not in r.stdout:
        fails.append(f"through a symbolic link: {r.returncode} {r.stderr[-300:]}")
    # a reader that stops at once (| head -0): no error; standard output that takes nothing
    # (/dev/full): a message and status 2, no traceback
    with subprocess.Popen([sys.executable, script, good], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
        p.stdout.close()
        err = p.stderr.read().decode()
        if p.wait(timeout=60) != 0 or err:
            fails.append(f"a reader that stopped early: exit {p.returncode}, stderr {err[-300:]!r}")
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, script, good], stdout=full, stderr=subprocess.PIPE, text=True)
        if r.returncode != 2 or "could not write the summary" not in r.stderr or "Traceback" in r.stderr:
            fails.append(f"standard output /dev/full: exit {r.returncode}, stderr {r.stderr[-300:]!r}")
    before = list(sys.path)
    spec2 = importlib.util.spec_from_file_location("timeline_summary_again", script)
    spec2.loader.exec_module(importlib.util.module_from_spec(spec2))
    if sys.path != before:
        fails.append("importing timeline_summary changed sys.path")

if fails:
    print("FAIL:\n  " + "\n  ".join(fails))
    sys.exit(1)
print("ok: timeline_summary on a hand-made timeline and on bad files")
