#!/usr/bin/env python3
"""Where an update phase's time went, in text, from a timeline that ``dos-train --timeline FILE``
(or ``dos_compare.py --timeline``) wrote.

The timeline holds the phase's tasks (lane ``cpu``, ``gpu``, ``h2d``, ``d2h`` or ``writeback``;
kind ``adam``, ``adam_spec``, ``gather``, ``scatter`` or ``state``; subgroup; start and end in
seconds since the phase began)
and its PCIe byte samples (seconds, cumulative host-to-device and device-to-host bytes, which
StarPU 1.3.10 counts when it issues a transfer, the runtime's own copies when they end). This
prints:

- the phase's span (the last task's end, seconds) and, per lane, its tasks, busy seconds and busy
  fraction of the span (tasks of one lane do not overlap: each lane is one worker or one stream),
  and its tasks' shortest, median and longest durations (ms: a CPU Adam's, over its subgroup's
  size, is CPU Adam's rate in that phase);
- the streamed subgroups' state write-backs (lane ``writeback``: from the end of the Adam that wrote
  the state to the state being home, waits included, so they may overlap and count in no busy
  figure): how many, when the first and the last ended, their shortest, median and longest spans,
  and the state bytes they brought home per second between the first write-back's start (its Adam's
  end) and the last write-back's end (``--state-bytes``, bytes per subgroup's write-back, when given);
- the CPU lane's idle gaps of at least ``--gap-ms`` (default 5 ms), when each began and how long;
- the streamed subgroups' chain: when the first streamed GPU Adam (lane ``gpu``, kind ``adam``)
  began, the shortest, median and longest intervals between the starts of consecutive ones, and
  when the CPU's last task ended against the chain's last write-back (or last streamed Adam), and
  how many of the streamed Adams began before that end (a chain that waits while the CPU works
  shows few of them there, and the rest one after the other once it has stopped);
- the tail: from the end of the last streamed GPU Adam (lane ``gpu``, kind ``adam``) to the end of
  the phase, its length and the tasks that ran in it, by lane and kind;
- PCIe: the bytes each way over the phase and their average rate (GB/s, 1e9 bytes), and the same
  per window of ``--window-ms`` (default 50 ms: the samples jump by a whole transfer at once, at
  its issue for StarPU's (a window can show more than the link carries, and a later one nothing
  while those transfers run), so short
  windows mislead).

A timeline of ``train_gpt.py --timeline FILE`` (its ``phases``: each bucket's update phase of
each recorded step, tasks on the training's clock from ``started``) gives the same for each phase,
its tasks counted from its own start, headed ``step S, bucket B`` (no PCIe samples there); with
``--json``, a list of ``{"step", "bucket", "summary"}``.

``--json`` prints the same as one JSON object instead. Usage::

    python3 examples/timeline_summary.py run.json [--gap-ms 5] [--window-ms 50] [--state-bytes B] [--json]

Errors: a file that cannot be read, is not JSON, has no ``tasks`` list (nor ``phases``), or holds a task or bus
sample that is not as above (a time that is not a finite number, a task ending before it starts)
exits with status 2 and a message saying which (nothing is written).
"""
import argparse
import bisect
import importlib.util
import json
import math
import os
import statistics
import sys


def _decimal_arg():
    """examples/dos_number_text.py's decimal_arg (strict numbers for the command line), loaded by
    path so that importing this module leaves the caller's sys.path as it was."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "dos_number_text.py")
    spec = importlib.util.spec_from_file_location("dos_number_text", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.decimal_arg


decimal_arg = _decimal_arg()
MAX_WINDOWS = 100000  # pcie_windows' most windows per phase


def pcie_windows(bus, span, window):
    """The PCIe rates of a phase per window: [[start s, H2D GB/s, D2H GB/s]...] for consecutive
    windows of ``window`` seconds (> 0) from 0 to ``span`` seconds (the last one cut at span).

    bus: [[t s, cumulative H2D bytes, cumulative D2H bytes]...] sorted by t, counted from the
    phase's start (dos-train's --timeline ``bus``). A window's rate is the bytes the samples add
    within it over its length; bytes are counted a whole transfer at once (StarPU's when issued, the
    runtime's own copies when ended), so short windows jump.
    Returns [] when bus is empty or span <= 0. Raises ValueError when window is not positive, or
    when span / window exceeds MAX_WINDOWS (a window too short for the phase to list).
    """
    if not window > 0:
        raise ValueError(f"the window must be > 0 seconds, got {window}")
    if not bus or not span > 0:
        return []
    if span / window > MAX_WINDOWS:
        raise ValueError(f"a {window * 1e3:g} ms window cuts this {span:.3f} s phase into more than {MAX_WINDOWS} "
                         f"windows: give a longer window (--window-ms)")
    times = [s[0] for s in bus]

    def at(x):  # cumulative bytes counted by time x (the last sample at or before it)
        k = bisect.bisect_right(times, x)
        return (bus[k - 1][1], bus[k - 1][2]) if k else (0, 0)

    out = []
    k = 0
    while k * window < span:
        end = min((k + 1) * window, span)
        a, b = at(k * window), at(end)
        out.append([k * window, (b[0] - a[0]) / (end - k * window) / 1e9, (b[1] - a[1]) / (end - k * window) / 1e9])
        k += 1
    return out


def writebacks(tasks, state_bytes=None):
    """The state write-backs of a phase (tasks of lane ``writeback``) as a dict, or None when there is
    none: {"count", "first_end", "last_end" (s since the phase began), "span_seconds": {"min",
    "median", "max"} (from its Adam's end to home), "gbps": state bytes home per second (GB/s, 1e9
    bytes) from the first write-back's start to the last one's end, or None without state_bytes
    (bytes per write-back, > 0)}. Raises ValueError when state_bytes is given and not positive."""
    if state_bytes is not None and not state_bytes > 0:
        raise ValueError(f"state_bytes must be > 0, got {state_bytes}")
    wb = [t for t in tasks if t["lane"] == "writeback"]
    if not wb:
        return None
    spans = [t["end"] - t["start"] for t in wb]
    first_start = min(t["start"] for t in wb)
    last_end = max(t["end"] for t in wb)
    gbps = None
    if state_bytes is not None and last_end > first_start:
        gbps = len(wb) * state_bytes / (last_end - first_start) / 1e9
    return {"count": len(wb), "first_end": min(t["end"] for t in wb), "last_end": last_end,
            "span_seconds": {"min": min(spans), "median": statistics.median(spans), "max": max(spans)}, "gbps": gbps}


def chain(tasks):
    """The streamed subgroups' chain of a phase as a dict, or None without a streamed GPU Adam (the
    Adams on lane ``gpu`` of the subgroups that have a write-back; every GPU Adam in a timeline
    without write-backs): {"first_adam" (s since the phase began), "interval_seconds": {"min",
    "median", "max"} between the starts of consecutive streamed Adams, or None with one, "cpu_end":
    the CPU lane's last end (s) or None without one, "beside_cpu": how many of the streamed Adams
    began before that end (None without CPU tasks), "count": how many streamed Adams, "chain_end":
    the last end of those Adams and the write-backs (s)}."""
    wb = [t for t in tasks if t["lane"] == "writeback"]
    streamed = {t.get("subgroup") for t in wb}
    # with write-backs, only the Adams of the subgroups written back (a resident one's Adam is not
    # part of the chain); without (older timelines), every GPU Adam
    adams = [t for t in tasks if t["lane"] == "gpu" and t["what"] == "adam" and (not wb or t.get("subgroup") in streamed)]
    if not adams:
        return None
    starts = sorted(t["start"] for t in adams)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    ends = [t["end"] for t in wb + adams]
    cpu = [t["end"] for t in tasks if t["lane"] == "cpu"]
    cpu_end = max(cpu) if cpu else None
    return {"first_adam": starts[0],
            "interval_seconds": {"min": min(gaps), "median": statistics.median(gaps), "max": max(gaps)} if gaps else None,
            "cpu_end": cpu_end, "beside_cpu": None if cpu_end is None else sum(1 for x in starts if x < cpu_end),
            "count": len(starts), "chain_end": max(ends)}


def _is_time(x):
    """A finite number (not a bool): a time in seconds or a byte count as the timeline holds them."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_tasks(tasks):
    """Raises ValueError naming the first task that is not a dict with string ``lane`` and
    ``what`` and finite ``start`` <= ``end`` (seconds)."""
    for i, t in enumerate(tasks):
        if not isinstance(t, dict):
            raise ValueError(f"task {i} is not an object: {t!r:.80}")
        for k in ("lane", "what", "start", "end"):
            if k not in t:
                raise ValueError(f"task {i} has no '{k}': {t}")
        if not isinstance(t["lane"], str) or not isinstance(t["what"], str):
            raise ValueError(f"task {i}: 'lane' and 'what' must be strings: {t}")
        if not _is_time(t["start"]) or not _is_time(t["end"]) or t["end"] < t["start"]:
            raise ValueError(f"task {i}: 'start' and 'end' must be finite seconds with start <= end: {t}")


def _check_bus(bus):
    """Raises ValueError naming the first PCIe sample that is not [seconds, h2d bytes, d2h bytes]
    of finite numbers (``bus`` may be None or empty: no samples)."""
    if bus is None:
        return
    if not isinstance(bus, list):
        raise ValueError(f"'bus' must be a list of [seconds, h2d bytes, d2h bytes] samples, got {bus!r:.80}")
    for i, row in enumerate(bus):
        if not isinstance(row, list) or len(row) != 3 or not all(_is_time(x) for x in row):
            raise ValueError(f"bus sample {i} must be [seconds, h2d bytes, d2h bytes] of finite numbers, got {row!r:.80}")


def summarize(doc, gap_ms=5.0, window_ms=50.0, state_bytes=None):
    """The summary of one timeline document (the dict dos-train writes) as a dict.

    doc: {"tasks": [{"lane", "what", "subgroup", "start", "end"}...], "bus": [[t, h2d, d2h]...]}
    (seconds and cumulative bytes). gap_ms, window_ms: milliseconds (> 0). Returns {"span" (s),
    "lanes": {lane: {"tasks", "busy" (s), "fraction", "task_seconds": {"min", "median", "max"}}},
    "cpu_gaps": [[start s, length s]...],
    "tail": {"from" (s) or None, "length" (s), "tasks": {"lane/what": count}}, "bus": {"samples" (count), "h2d_bytes",
    "d2h_bytes", "h2d_gbps", "d2h_gbps", "windows": [[start s, h2d GB/s, d2h GB/s]...]},
    "writebacks": writebacks(tasks, state_bytes), "chain": chain(tasks)} (lane ``writeback`` is left out
    of "lanes").
    Raises ValueError when doc has no task list, a task is not an object, lacks a field or has a
    start or end that is not a finite number (or ends before it starts), a bus sample is not three
    finite numbers, or gap_ms / window_ms / state_bytes is not positive.
    """
    if gap_ms <= 0 or window_ms <= 0:
        raise ValueError(f"gap_ms and window_ms must be > 0, got {gap_ms} and {window_ms}")
    tasks = doc.get("tasks") if isinstance(doc, dict) else None
    if not isinstance(tasks, list):
        raise ValueError("the timeline has no 'tasks' list: is it a file of dos-train --timeline?")
    _check_tasks(tasks)
    _check_bus(doc.get("bus"))
    span = max((t["end"] for t in tasks), default=0.0)
    wbs = writebacks(tasks, state_bytes)
    lanes, durations = {}, {}
    for t in tasks:
        if t["lane"] == "writeback":
            continue
        l = lanes.setdefault(t["lane"], {"tasks": 0, "busy": 0.0})
        l["tasks"] += 1
        l["busy"] += t["end"] - t["start"]
        durations.setdefault(t["lane"], []).append(t["end"] - t["start"])
    for name, l in lanes.items():
        l["fraction"] = l["busy"] / span if span > 0 else 0.0
        d = durations[name]
        l["task_seconds"] = {"min": min(d), "median": statistics.median(d), "max": max(d)}
    gaps = []
    prev = 0.0
    for t in sorted((t for t in tasks if t["lane"] == "cpu"), key=lambda t: t["start"]):
        if t["start"] - prev >= gap_ms / 1e3:
            gaps.append([prev, t["start"] - prev])
        prev = max(prev, t["end"])
    streamed_ends = [t["end"] for t in tasks if t["lane"] == "gpu" and t["what"] == "adam"]
    tail = {"from": None, "length": 0.0, "tasks": {}}
    if streamed_ends:
        start = max(streamed_ends)
        tail["from"] = start
        tail["length"] = span - start
        for t in tasks:
            if t["start"] >= start:
                key = f"{t['lane']}/{t['what']}"
                tail["tasks"][key] = tail["tasks"].get(key, 0) + 1
    bus = sorted(doc.get("bus") or [])
    out_bus = {"samples": len(bus), "h2d_bytes": 0, "d2h_bytes": 0, "h2d_gbps": 0.0, "d2h_gbps": 0.0, "windows": []}
    if bus:
        out_bus["h2d_bytes"] = bus[-1][1]  # counted from the phase's start
        out_bus["d2h_bytes"] = bus[-1][2]
        if span > 0:
            out_bus["h2d_gbps"] = bus[-1][1] / span / 1e9
            out_bus["d2h_gbps"] = bus[-1][2] / span / 1e9
        out_bus["windows"] = pcie_windows(bus, span, window_ms / 1e3)
    return {"span": span, "lanes": lanes, "cpu_gaps": gaps, "tail": tail, "bus": out_bus, "writebacks": wbs,
            "chain": chain(tasks)}


def render(s):
    """The summary (summarize's dict) as text lines."""
    lines = [f"phase: {s['span']:.4f} s"]
    for name in sorted(s["lanes"]):
        l = s["lanes"][name]
        d = l["task_seconds"]
        lines.append(f"  lane {name}: {l['tasks']} tasks, busy {l['busy']:.4f} s ({100 * l['fraction']:.0f}%), per task "
                     f"{1e3 * d['min']:.1f}/{1e3 * d['median']:.1f}/{1e3 * d['max']:.1f} ms (shortest/median/longest)")
    if s["cpu_gaps"]:
        g = ", ".join(f"{1e3 * a:.0f}+{1e3 * b:.0f}" for a, b in s["cpu_gaps"])
        lines.append(f"  CPU idle gaps (start+length, ms): {g}; {1e3 * sum(b for _, b in s['cpu_gaps']):.0f} ms in all")
    else:
        lines.append("  CPU idle gaps: none")
    w = s.get("writebacks")
    if w:
        d = w["span_seconds"]
        rate = f"; {w['gbps']:.1f} GB/s of state home" if w["gbps"] is not None else ""
        lines.append(f"  state write-backs: {w['count']}, ended from {1e3 * w['first_end']:.0f} to {1e3 * w['last_end']:.0f} ms, "
                     f"each {1e3 * d['min']:.1f}/{1e3 * d['median']:.1f}/{1e3 * d['max']:.1f} ms from its Adam's end "
                     f"(shortest/median/longest){rate}")
    c = s.get("chain")
    if c:
        line = f"  streamed chain: first Adam at {1e3 * c['first_adam']:.0f} ms"
        if c["interval_seconds"]:
            d = c["interval_seconds"]
            line += f", then one every {1e3 * d['min']:.1f}/{1e3 * d['median']:.1f}/{1e3 * d['max']:.1f} ms (shortest/median/longest)"
        if c["cpu_end"] is not None:
            line += f"; the CPU's last task ended at {1e3 * c['cpu_end']:.0f} ms"
        line += f", the chain at {1e3 * c['chain_end']:.0f} ms"
        if c.get("beside_cpu") is not None:
            line += (f"; {c['beside_cpu']} of the {c['count']} streamed Adam{'s' if c['count'] != 1 else ''} began "
                     "before the CPU's end")
        lines.append(line)
    t = s["tail"]
    if t["from"] is None:
        lines.append("  tail: no streamed GPU Adam")
    else:
        what = ", ".join(f"{k} {v}" for k, v in sorted(t["tasks"].items())) or "nothing"
        lines.append(f"  tail after the last streamed Adam ({1e3 * t['from']:.0f} ms): {1e3 * t['length']:.0f} ms; {what}")
    b = s["bus"]
    if not b.get("samples"):
        lines.append("  PCIe: no byte samples in this timeline")
        return lines
    lines.append(f"  PCIe: H2D {b['h2d_bytes'] / 1e9:.3f} GB ({b['h2d_gbps']:.1f} GB/s), "
                 f"D2H {b['d2h_bytes'] / 1e9:.3f} GB ({b['d2h_gbps']:.1f} GB/s)")
    if b["windows"]:
        lines.append("  per window (start ms: H2D/D2H GB/s): " +
                     " ".join(f"{1e3 * a:.0f}:{h:.0f}/{d:.0f}" for a, h, d in b["windows"]))
    return lines


def phases_of(doc):
    """The update phases of a ``train_gpt.py --timeline`` document ``doc`` (a dict with
    ``phases``: [{"step", "bucket", "started" (s), "tasks"}...]) as [(step, bucket, phase
    document)...], each phase document holding its tasks with start and end counted from the
    phase's ``started`` (the form :func:`summarize` reads). Returns None when ``doc`` is not such a
    document (no ``phases`` list, or a ``tasks`` list of its own). Raises ValueError when a phase is
    not an object, lacks a field, or has a ``started`` that is not a finite number, or a task whose
    start or end is not a number or that starts before its phase."""
    if not isinstance(doc, dict) or "tasks" in doc or not isinstance(doc.get("phases"), list):
        return None
    out = []
    for k, ph in enumerate(doc["phases"]):
        if not isinstance(ph, dict) or not all(f in ph for f in ("step", "bucket", "started", "tasks")):
            raise ValueError(f"phase {k} is not an object with step, bucket, started and tasks")
        t0 = ph["started"]
        if isinstance(t0, bool) or not isinstance(t0, (int, float)) or not math.isfinite(t0):
            raise ValueError(f"phase {k}: started is {t0!r}, not a finite number of seconds")
        if not isinstance(ph["tasks"], list):
            raise ValueError(f"phase {k}: tasks is not a list")
        tasks = []
        for t in ph["tasks"]:
            if not isinstance(t, dict) or not all(isinstance(t.get(f), (int, float)) and not isinstance(t.get(f), bool)
                                                  for f in ("start", "end")):
                raise ValueError(f"phase {k}: a task without a numeric start and end: {t!r}")
            if t["start"] < t0:
                raise ValueError(f"phase {k}: a task starts at {t['start']!r}, before the phase's start {t0!r}: {t!r}")
            tasks.append(dict(t, start=t["start"] - t0, end=t["end"] - t0))
        out.append((ph["step"], ph["bucket"], {"tasks": tasks}))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Where an update phase's time went, from dos-train --timeline's file")
    ap.add_argument("timeline", help="the JSON file dos-train --timeline (or train_gpt.py --timeline) wrote")
    ap.add_argument("--gap-ms", type=decimal_arg, default=5.0, help="the shortest CPU idle gap listed, ms (default 5)")
    ap.add_argument("--window-ms", type=decimal_arg, default=50.0, help="the PCIe rate windows, ms (default 50)")
    ap.add_argument("--state-bytes", type=decimal_arg, default=None,
                    help="bytes of state each write-back brings home (12 per parameter of a subgroup), for their rate")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = ap.parse_args(argv)
    for flag, value in (("--gap-ms", a.gap_ms), ("--window-ms", a.window_ms), ("--state-bytes", a.state_bytes)):
        if value is not None and not value > 0:
            ap.error(f"{flag} must be > 0, got {value:g}")
    try:
        with open(a.timeline) as f:
            doc = json.load(f)
        phases = phases_of(doc)
        if phases is None:
            s = summarize(doc, a.gap_ms, a.window_ms, a.state_bytes)
            text = json.dumps(s) if a.json else "\n".join(render(s))
        else:
            if not phases:
                raise ValueError("the timeline holds no update phase (train_gpt.py --timeline-steps covered none?)")
            parts = []
            for k, (step, bucket, ph) in enumerate(phases):
                try:
                    parts.append((step, bucket, summarize(ph, a.gap_ms, a.window_ms, a.state_bytes)))
                except ValueError as e:
                    raise ValueError(f"phase {k} (step {step}, bucket {bucket}; times counted from its start): {e}") from None
            text = json.dumps([dict(step=st, bucket=b, summary=s) for st, b, s in parts]) if a.json else \
                "\n".join(line for st, b, s in parts for line in [f"step {st}, bucket {b}:"] + render(s))
    except (OSError, json.JSONDecodeError, ValueError) as e:
        print(f"timeline_summary: {a.timeline}: {e}", file=sys.stderr)
        return 2
    try:
        print(text, flush=True)
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit then writes nowhere
        if isinstance(e, BrokenPipeError):  # a reader that stopped early (| head): not an error of this script
            return 0
        print(f"timeline_summary: could not write the summary to standard output: {e}", file=sys.stderr)  # /dev/full
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
