#!/usr/bin/env bash
# dos-compare end to end on the CPU: three policies on the tiny model in one run; every policy must
# produce a row, and its final parameters must be bit-identical to the cpu run's (0 elements differ).
# Then the default policies with repeats, a resident budget and the PyTorch baselines (below), and
# dos-compare's helpers on made-up reports.
# Usage: e2e_compare.sh DOS_COMPARE.py DOS_TRAIN ST_COMPARE
set -u
compare=$1 dos_train=$2 st_compare=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 "$compare" --dos-train "$dos_train" --st-compare "$st_compare" --policies cpu,dmda,static:0.5 \
  --out "$out" --check-params -- --preset tiny --iterations 3 --subgroup-size 100000 --device host || {
  echo "FAIL: dos-compare exited with status $?"; exit 1; }
python3 - "$out/compare.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["policy"]: r for r in d["rows"]}
assert set(rows) == {"cpu", "dmda", "static:0.5"}, f"rows for {sorted(rows)}"
for p in ("dmda", "static:0.5"):
    v = rows[p].get("params_vs_cpu") or ""
    assert v.startswith("ok: ") and " 0 differ" in v, f"{p}: final parameters vs cpu: {v!r}"
    assert rows[p]["speedup_vs_cpu"] > 0 and rows[p]["update_seconds"] > 0
assert d["failed"] == []
print("ok: 3 policies, final parameters bit-identical to the cpu run's")
PY
# the picture: written wherever python3 or /usr/bin/python3 imports matplotlib (dos_compare.py draws it
# with the other one when its own cannot; scripts/setup.sh installs Debian's for /usr/bin/python3)
probe="import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot"
if python3 -c "$probe" 2>/dev/null || /usr/bin/python3 -c "$probe" 2>/dev/null; then
  [ -s "$out/compare.png" ] || { echo "FAIL: matplotlib imports, but dos-compare wrote no compare.png"; exit 1; }
  echo "ok: compare.png written"
else
  echo "note: no python3 here imports matplotlib: no compare.png expected"
fi

# The defaults, repeats and the repository's baselines: no --policies (dos, cpu, dmda, and gpu only
# where dos-train has a CUDA worker), each run twice, one resident budget (a dos and a static:R run,
# and the baseline twinflow:R with the same R), the baselines on the same workload. The model's
# buffers are on the host, so the baselines' GPU variants must be skipped, saying why.
# A stand-in for the external peers script: a different mean per call (0.5 s, then 1.1 s), so that
# the rounds' median and spread can be checked, and the rounds more than 2x apart warned of.
cat > "$out/fake_peers.py" <<'PY'
import os, sys
count = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_peers.calls")
k = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(k + 1))
print(f"RESULT zero_offload {0.5 + 0.6 * k:.4f} s/phase")
PY
rm -f "$out/fake_peers.calls"
python3 "$compare" --dos-train "$dos_train" --repeats 2 --baselines --resident-budgets 2.5MB --out "$out/auto" \
  --peers "$out/fake_peers.py" --peer-variants zero_offload \
  -- --preset tiny --iterations 3 --subgroup-size 100000 --device host > "$out/auto.txt" 2>&1 || {
  cat "$out/auto.txt"; echo "FAIL: dos-compare with the defaults exited with status $?"; exit 1; }
python3 - "$out/auto/compare.json" "$out/auto.txt" <<'PY' || { cat "$out/auto.txt"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
rows = {r["label"]: r for r in d["rows"]}
cuda = rows["dos"]["cuda_workers"] > 0
want = {"dos", "cpu", "dmda"} | ({"gpu"} if cuda else set())
static = [l for l in rows if l.startswith("static:") and l.endswith("@2.5MB")]
assert set(rows) == want | {"dos@2.5MB"} | set(static) and len(static) == 1, f"rows {sorted(rows)}"
if not cuda:
    assert "gpu" in d["skipped"] and "no CUDA worker" in d["skipped"]["gpu"], d["skipped"]
    assert any("no CUDA worker" in n and n.startswith("WARNING") for n in d["notes"]), d["notes"]
    assert "run gpu skipped" in text and "WARNING: dos-train reports no CUDA worker" in text
for r in d["rows"]:
    assert r["repeats"] == 2 and len(r["update_seconds_runs"]) == 2, r
    assert r["update_seconds_min"] <= r["update_seconds"] <= r["update_seconds_max"], r
    assert r["update_seconds_min"] == min(r["update_seconds_runs"]), r
assert d["failed"] == [] and d["repeats"] == 2
# the peers once per round: their median and spread over the two rounds
assert d["peer_runs"] == {"zero_offload": [0.5, 1.1]}, d["peer_runs"]
assert abs(d["peers"]["zero_offload"] - 0.8) < 1e-12, d["peers"]
assert "| peer zero_offload (external, PyTorch) | - | - | 0.8000 | - | 0.5000..1.1000 |" in text, text
assert "WARNING: peer zero_offload: its rounds' means ranged 0.5000..1.1000 s, more than 2x apart" in text, text
# rounds, not runs back to back: round 1's runs start after round 0's baselines and peers ended
import os
out = os.path.dirname(sys.argv[1])
t = lambda name: os.path.getmtime(os.path.join(out, name))  # noqa: E731
assert t("dos.json") <= t("peers.log") <= t("dos.r2.json") <= t("peers.r2.log"), "the rounds are not interleaved"
assert t("dos-2.5MB.json") <= t("dos.r2.json"), "round 0's budget runs come before round 1"
r_static = static[0][len("static:"):-len("@2.5MB")]
base = {b["variant"]: b for b in d["baseline_results"]}
if any("no Python here imports torch" in n for n in d["notes"]):
    print("note: torch not importable here: the baselines were skipped, as said")
else:
    tw = [v for v in base if v.startswith("twinflow:")]
    assert set(base) - set(tw) == {"zero_offload", "stride:2", "stride:3", "stride:4"}, sorted(base)
    assert len(tw) == 1 and abs(float(tw[0][len("twinflow:"):]) - float(r_static)) < 1e-3, (tw, r_static)
    assert "CUDA" in base[tw[0]].get("skipped", ""), base[tw[0]]
    zo = [b for b in d["baselines"] if b["label"] == "baseline zero_offload"]
    assert len(zo) == 1 and zo[0]["update_seconds"] > 0 and zo[0]["repeats"] == 2, d["baselines"]
    assert zo[0]["update_seconds_min"] <= zo[0]["update_seconds"] <= zo[0]["update_seconds_max"]
    assert len(base["zero_offload"]["repeat_seconds"]) == 2, base["zero_offload"]
    assert t("baselines.json") <= t("dos.r2.json") <= t("baselines.r2.json"), "the baselines are not run per round"
    assert base["zero_offload"]["subgroups"]["cpu"] == rows["dos"]["subgroups"], base["zero_offload"]
    for v in ("stride:2", "stride:3", "stride:4"):
        assert "CUDA" in base[v].get("skipped", ""), base[v]
        assert f"baseline {v} skipped" in text
    assert "| baseline zero_offload (PyTorch, this repository) |" in text
    assert "dos_vs_baseline_zero_offload" in d["ratios"]
print(f"ok: defaults ({'with' if cuda else 'without'} CUDA), 2 repeats, baselines")
PY

# The helpers: the lower bound comes from any run that has one (here a static:R run, not dos), for
# the runs with the same resident budget only; a single run's spread is that of its iterations 2..;
# a difference within the spread is flagged.
python3 - "$compare" <<'PY' || exit 1
import importlib.util, statistics, sys
spec = importlib.util.spec_from_file_location("dos_compare", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
def rep(policy, bounds, secs):
    return {"policy": policy, "summary": {"update_seconds_median": statistics.median(secs[1:])},
            "iterations": [{"lower_bound_seconds": b, "update_seconds": s} for b, s in zip(bounds, secs)]}
runs = {"dos@1GB": {"reports": [rep("dos", [0, 0, 0], [9, 1, 2])], "budget": "1GB"},
        "static:0.5@1GB": {"reports": [rep("static:0.5", [5, 0.5, 0.7], [9, 1, 2])], "budget": "1GB"},
        "cpu": {"reports": [rep("cpu", [0, 0, 0], [9, 1, 2])], "budget": None}}
b = m.bounds_by_budget(runs)
assert b == {"1GB": 0.6}, b
assert m.summarize(runs["cpu"]["reports"]) == (1.5, 1, 2), m.summarize(runs["cpu"]["reports"])
assert m.summarize([rep("cpu", [0] * 3, [9, 1, 2]), rep("cpu", [0] * 3, [9, 3, 4]),
                    rep("cpu", [0] * 3, [9, 5, 6])]) == (3.5, 1.5, 5.5)
assert m.within_spread((1.0, 0.9, 1.1), (1.05, 1.0, 1.1)) is not None
assert m.within_spread((1.0, 0.99, 1.01), (2.0, 1.98, 2.02)) is None
assert m.bound_share("dos", 1.0, 0.9, False) == (90.0, None)
assert m.bound_share("dos+overlap", 1.0, 0.9, True) == (None, None)
pct, warn = m.bound_share("dos", 0.9, 0.99, False)
assert abs(pct - 110.0) < 1e-9 and warn.startswith("WARNING: dos:") and "faster than its printed lower bound" in warn
# the adaptive copy rule: a note for the round whose phases turned (False then True), none for a run
# that dodged from its first phase (--copy-by auto), never did, or whose dos-train gives no field
it = lambda *d: {"iterations": [{"downloads_dodge_writebacks": x} for x in d]}  # noqa: E731
turns = {"dos": {"reports": [it(False, False, True, True)]},
         "auto": {"reports": [it(True, True, True)]},
         "down": {"reports": [it(False, False, False)]},
         "old": {"reports": [{"iterations": [{}, {}, {}]}]},
         "twice": {"reports": [it(False, False), it(False, True)]}}
n = m.copy_rule_notes(turns, ["dos", "auto", "down", "old", "twice", "missing"])
assert len(n) == 2, n
assert n[0].startswith("run dos: the adaptive copy rule turned after phase 2: from phase 3 on"), n[0]
assert n[1].startswith("run twice (round 2): the adaptive copy rule turned after phase 1: from phase 2 on"), n[1]
print("ok: lower bound from any run with one, spreads, a bound the phase beat, the copy rule's turns")
PY

# Resident budgets with forward and backward emulated: their dos and static:R runs, like the
# others, run with the update after backward (dos-train's --overlap off), so that their update
# seconds are comparable with the peers' phases; only --overlap adds overlapped runs.
python3 "$compare" --dos-train "$dos_train" --policies "" --resident-budgets 2.5MB --out "$out/budget-emul" \
  -- --preset tiny --iterations 2 --subgroup-size 100000 --emulate-compute --tokens 16 > "$out/budget-emul.txt" 2>&1 || {
  cat "$out/budget-emul.txt"; echo "FAIL: dos-compare with a resident budget and --emulate-compute exited with $?"; exit 1; }
python3 - "$out/budget-emul/compare.json" <<'PY' || { cat "$out/budget-emul.txt"; exit 1; }
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 2 and all(r["label"].endswith("@2.5MB") for r in rows), [r["label"] for r in rows]
assert not any(r["overlapped"] for r in rows), [(r["label"], r["overlapped"]) for r in rows]
print("ok: resident-budget runs with the update after backward")
PY
# the static:R share from the resident fit: the compact state's bytes (worked by hand as
# tests/test_model.cpp does: 10240 B for 1000 parameters, 5184 B for 500) against the full 12 B/param
python3 - "$(dirname "$compare")" <<'PY' || exit 1
import sys
sys.path.insert(0, sys.argv[1])
from dos_compare import compact_state_bytes, resident_fit
assert compact_state_bytes(1000) == 10240 and compact_state_bytes(500) == 5184, \
    (compact_state_bytes(1000), compact_state_bytes(500))
assert resident_fit(3500, 1000, 15424, compact=True) == (2, 4), resident_fit(3500, 1000, 15424, compact=True)
assert resident_fit(3500, 1000, 15424) == (1, 4), resident_fit(3500, 1000, 15424)
assert resident_fit(3500, 1000, 15423, compact=True) == (1, 4)
print("ok: the resident fit counts the compact state's bytes")
PY

# --host-bench: the bound at dos-bench host's rates. First the rates from a probe's row, worked out by
# hand: link_share = (DMA beside / alone) / (Adam beside / alone) = 0.8 / 0.625 = 1.28, kept in
# [1/16, U_c / U_c_dma = 1.6]; U_g and D_c the higher of the run's refined and calibrated ones.
python3 - "$compare" <<'PY' || exit 1
import importlib.util, os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import host_probe as h
def bench(beside_dma, threads=15, ring=0):
    return {"runs": [{"threads": 15, "dma_ring_bytes": 0, "dma_directions": "d2h", "adam_alone_params_per_s": 1.0,
                      "adam_beside_dma_params_per_s": 1.0, "dma_alone_bytes_per_s_each_way": 1.0,
                      "dma_beside_adam_bytes_per_s_each_way": 1.0},
                     {"threads": 3, "dma_ring_bytes": 0, "adam_alone_params_per_s": 1.0,
                      "adam_beside_dma_params_per_s": 1.0, "dma_alone_bytes_per_s_each_way": 1.0,
                      "dma_beside_adam_bytes_per_s_each_way": 1.0},
                     {"threads": threads, "dma_ring_bytes": ring, "adam_alone_params_per_s": 4e9,
                      "adam_beside_dma_params_per_s": 2.5e9, "dma_alone_bytes_per_s_each_way": 50e9,
                      "dma_beside_adam_bytes_per_s_each_way": beside_dma}]}
run = {"U_g": 130e9, "D_c": 400e9}
cal = {"U_g": 120e9, "D_c": 450e9}
r, notes = h.probe_rates(bench(40e9), 15, run, cal)
want = {"U_c": 4e9, "U_c_dma": 2.5e9, "U_g": 130e9, "D_c": 450e9, "B_h2d": 50e9, "B_d2h": 50e9, "link_share": 1.28}
assert set(r) == set(want) and all(abs(r[k] - want[k]) <= 1e-12 * want[k] for k in want), r
assert notes == [], notes  # 2.5e9 x 28 + 2 x 40e9 = 150 GB/s together, above 112 (Adam alone) and 100 (DMA alone)
# dos-bench host --state full compact: the compact form's row (its own rates and bytes) is not
# taken, whether it comes first or the full row says its state
both = bench(40e9)
both["runs"].insert(0, dict(both["runs"][2], state="compact", bytes_per_param=26.25, adam_alone_params_per_s=5e9))
both["runs"][3]["state"] = "full"
assert h.probe_rates(both, 15, run, cal) == (r, notes)
only_compact = bench(40e9)
only_compact["runs"][2]["state"] = "compact"
try:
    h.probe_rates(only_compact, 15, run, cal)
    raise SystemExit("FAIL: probe_rates took a compact-form row")
except ValueError as e:
    assert "full state" in str(e), e
# with state "compact" (runs with dos-train --master compact), the compact row and its own bytes:
# U_c 5e9 alone, 2.5e9 beside the DMA; link_share (0.8) / (2.5 / 5) = 1.6, under its cap U_c / U_c_dma = 2;
# 2.5e9 x 26.25 + 2 x 40e9 = 145.6 GB/s together, above 131.25 (Adam alone) and 100 (DMA alone): no note
rc, notes_c = h.probe_rates(both, 15, run, cal, "compact")
want_c = dict(want, U_c=5e9, link_share=1.6)
assert set(rc) == set(want_c) and all(abs(rc[k] - want_c[k]) <= 1e-12 * want_c[k] for k in want_c), rc
assert notes_c == [], notes_c
try:
    h.probe_rates(bench(40e9), 15, run, cal, "compact")
    raise SystemExit("FAIL: probe_rates took a full-form row for the compact form")
except ValueError as e:
    assert "compact state" in str(e), e
r, notes = h.probe_rates(bench(55e9), 15, run, cal)  # (1.1 / 0.625) capped at 1.6, and said
assert abs(r["link_share"] - 1.6) < 1e-12 and len(notes) == 1 and "outside what the model tells apart" in notes[0], notes
r, notes = h.probe_rates(bench(1e9), 15, run, cal)  # 0.032 raised to 1/16; 72 GB/s together, below 112 alone
assert abs(r["link_share"] - 1 / 16) < 1e-12, r
assert len(notes) == 2 and "lower than the probe's rates allow" in notes[1], notes
for b, t, why in ((bench(40e9), 7, "no row for a team of 7"), (bench(40e9, ring=1 << 20), 15, "no row for a team of 15"),
                  (bench(0.0), 15, "no positive dma_beside_adam_bytes_per_s_each_way"),
                  (bench(float("inf")), 15, "no positive dma_beside_adam_bytes_per_s_each_way"),
                  ({"runs": 5}, 15, "no list of rows"), ({"runs": [1]}, 15, "no list of rows"), ([], 15, "no list of rows")):
    try:
        h.probe_rates(b, t, run, cal)
        raise SystemExit(f"FAIL: probe_rates accepted a probe with {why}")
    except ValueError as e:
        assert why in str(e), e
try:
    h.probe_rates(bench(40e9), 15, {"U_g": 130e9}, cal)
    raise SystemExit("FAIL: probe_rates accepted a run without D_c")
except ValueError as e:
    assert "no positive D_c" in str(e), e
print("ok: the probe's rates, worked out by hand")
PY
# Then the whole path, with stand-ins: a dos-train whose reports give made-up model rates (a run on
# a machine without a GPU has none), a dos-bench that prints the row above for the team asked for.
# The bound must be the one dos-train --plan-only gives for those rates typed as numbers, and each
# run's percentage that bound over its median.
cat > "$out/rates-dos-train" <<SH
#!/usr/bin/env bash
"$dos_train" "\$@" || exit \$?
for ((i = 1; i < \$#; i++)); do
  if [ "\${!i}" = --report ]; then j=\$((i + 1)); rep=\${!j}; fi
done
[[ " \$* " == *" --plan-only "* ]] || python3 - "\$rep" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["rates"] = {"U_c": 3e9, "U_c_dma": 2e9, "U_g": 130e9, "D_c": 400e9, "B_h2d": 45e9, "B_d2h": 45e9, "link_share": 1.0}
d["calibrated_rates"] = dict(d["rates"], U_g=120e9, D_c=450e9)
json.dump(d, open(sys.argv[1], "w"))
PY
SH
cat > "$out/fake-bench" <<'SH'
#!/usr/bin/env bash
[ "$1" = host ] && [ "$2" = --threads ] || { echo "fake-bench: unexpected arguments $*" >&2; exit 9; }
echo "{\"runs\": [{\"threads\": $3, \"dma_ring_bytes\": 0, \"adam_alone_params_per_s\": 4e9,
  \"adam_beside_dma_params_per_s\": 2.5e9, \"dma_alone_bytes_per_s_each_way\": 50e9,
  \"dma_beside_adam_bytes_per_s_each_way\": 40e9}]}"
SH
chmod +x "$out/rates-dos-train" "$out/fake-bench"
ptiny=(--preset tiny --iterations 2 --subgroup-size 100000 --device host)
python3 "$compare" --dos-train "$out/rates-dos-train" --policies dos,cpu --host-bench "$out/fake-bench" \
  --resident-budgets 2.5MB --run "custom=--policy dos --gpu-update-budget 2MB" \
  --out "$out/probe" -- "${ptiny[@]}" > "$out/probe.txt" 2>&1 || {
  cat "$out/probe.txt"; echo "FAIL: dos-compare --host-bench exited with $?"; exit 1; }
for b in "" 2.5MB; do
  "$dos_train" --plan-only --policy dos --rates 4,2.5,130,450,50,50,1.28 --report "$out/probe-direct$b.json" \
    ${b:+--gpu-resident-budget $b} "${ptiny[@]}" > "$out/probe-direct.txt" 2>&1 || {
    cat "$out/probe-direct.txt"; echo "FAIL: dos-train --plan-only --rates ($b)"; exit 1; }
done
python3 - "$out/probe/compare.json" "$out/probe-direct.json" "$out/probe.txt" "$out/probe-direct2.5MB.json" <<'PY' || { cat "$out/probe.txt"; exit 1; }
import json, sys
d, direct, text = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), open(sys.argv[3]).read()
want = direct["lower_bound_seconds"]
want_b = json.load(open(sys.argv[4]))["lower_bound_seconds"]
assert want > 0 and d["probe"] and d["probe"]["from"] == "run dos", d["probe"]
got, got_b = d["probe"]["bounds"][""], d["probe"]["bounds"]["2.5MB"]
assert abs(got - want) <= 1e-9 * want, (got, want)
assert abs(got_b - want_b) <= 1e-9 * want_b and abs(want_b - want) > 1e-6 * want, (got_b, want_b, want)
for row in d["rows"]:
    if row["label"] == "custom":  # its own arguments: no share of the probe's bound
        assert "percent_of_probe_bound" not in row, row
        continue
    w = want_b if row["resident_budget"] == "2.5MB" else want
    assert abs(row["percent_of_probe_bound"] - 100 * w / row["update_seconds"]) < 1e-9, row
assert "lower bound at the rates dos-bench host measured here: " in text and "link_share 1.280" in text, text
rows = {r["label"]: r for r in d["rows"]}
ab = d["ratios_at_probe_bound"]["dos_vs_cpu"]
assert abs(ab - rows["cpu"]["update_seconds"] / want) <= 1e-9 * ab, (ab, rows["cpu"]["update_seconds"], want)
print(f"ok: --host-bench's bound ({got:.6f} s) is dos-train --plan-only's at the probe's rates")
PY
[ $? = 0 ] || exit 1
# A run whose phases are far apart (one slow phase on a loaded machine) is warned of: a stand-in
# dos-train whose reports say iterations 2..4 took 0.1, 0.1 and 0.5 s (median 0.1 s)
cat > "$out/unsteady-dos-train" <<SH
#!/usr/bin/env bash
"$dos_train" "\$@" || exit \$?
for ((i = 1; i < \$#; i++)); do
  if [ "\${!i}" = --report ]; then j=\$((i + 1)); rep=\${!j}; fi
done
python3 - "\$rep" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for it, sec in zip(d["iterations"], (0.2, 0.1, 0.1, 0.5)):
    it["update_seconds"] = sec
d["summary"]["update_seconds_median"] = 0.1
json.dump(d, open(sys.argv[1], "w"))
PY
SH
chmod +x "$out/unsteady-dos-train"
python3 "$compare" --dos-train "$out/unsteady-dos-train" --policies cpu --out "$out/unsteady" -- --preset tiny \
  --iterations 4 --device host > "$out/unsteady.txt" 2>&1 || {
  cat "$out/unsteady.txt"; echo "FAIL: dos-compare with unsteady phases exited with $?"; exit 1; }
grep -q "WARNING: cpu: its update phases ranged 0.1000..0.5000 s, more than 2x apart" "$out/unsteady.txt" || {
  cat "$out/unsteady.txt"; echo "FAIL: no warning for a run whose phases ranged 0.1..0.5 s"; exit 1; }
echo "ok: a run whose phases ranged 0.1..0.5 s is warned of"
# A probe that cannot run (here: no run has the model's rates, or the bench fails) is said, not hidden.
python3 "$compare" --dos-train "$dos_train" --policies cpu --host-bench "$out/fake-bench-missing" \
  --out "$out/probe-none" -- "${ptiny[@]}" > "$out/probe-none.txt" 2>&1 || {
  cat "$out/probe-none.txt"; echo "FAIL: dos-compare --host-bench without rates exited with $?"; exit 1; }
grep -q "WARNING: --host-bench: no run reported the model's rates" "$out/probe-none.txt" || {
  cat "$out/probe-none.txt"; echo "FAIL: no warning for a --host-bench without rates"; exit 1; }
python3 "$compare" --dos-train "$out/rates-dos-train" --policies dos --host-bench "$out/fake-bench-missing" \
  --out "$out/probe-fail" -- "${ptiny[@]}" > "$out/probe-fail.txt" 2>&1 || {
  cat "$out/probe-fail.txt"; echo "FAIL: dos-compare with a --host-bench that cannot run exited with $?"; exit 1; }
grep -q "WARNING: --host-bench: cannot run .*fake-bench-missing" "$out/probe-fail.txt" || {
  cat "$out/probe-fail.txt"; echo "FAIL: no warning for a --host-bench that cannot run"; exit 1; }
printf '#!/usr/bin/env bash\necho "stand-in: no usable GPU" >&2; exit 3\n' > "$out/fake-bench-fails"
chmod +x "$out/fake-bench-fails"
python3 "$compare" --dos-train "$out/rates-dos-train" --policies dos --host-bench "$out/fake-bench-fails" \
  --out "$out/probe-fail2" -- "${ptiny[@]}" > "$out/probe-fail2.txt" 2>&1 || {
  cat "$out/probe-fail2.txt"; echo "FAIL: dos-compare with a failing --host-bench exited with $?"; exit 1; }
grep -q "WARNING: --host-bench: dos-bench host failed (stand-in: no usable GPU" "$out/probe-fail2.txt" &&
  [ -s "$out/probe-fail2/compare.md" ] || {
  cat "$out/probe-fail2.txt"; echo "FAIL: no warning, or no table, with a failing --host-bench"; exit 1; }
echo "ok: a --host-bench without rates, without a bench or with a failing one: said, the table written"

# Bad arguments: exit status 2 and a message naming the problem, nothing run
refused() {  # refused 'expected message' ARGS...
  local want=$1; shift
  msg=$(python3 "$compare" --dos-train "$dos_train" "$@" --out "$out/bad" -- --preset tiny 2>&1)
  rc=$?
  [ $rc = 2 ] && [[ "$msg" == *"$want"* ]] || { echo "FAIL: $*: exit status $rc, message: $msg"; exit 1; }
  [ ! -e "$out/bad" ] || { echo "FAIL: $*: $out/bad was created"; exit 1; }
}
refused "--repeats must be at least 1" --repeats 0
refused "unknown variant(s) stride:0" --baselines stride:0
# twinflow:R's R is checked before any run, by the baselines' rule (a plain decimal in [0, 1])
refused "unknown variant(s) twinflow:2, twinflow:1e, twinflow:., twinflow:-1" \
  --policies cpu --baselines twinflow:2,twinflow:1e,twinflow:.,twinflow:-1,twinflow:0.5
refused "unknown variant(s) stride:²" --baselines stride:²
refused "expected a whole number written with the digits 0-9, got ' 2'" --repeats " 2"
refused "would share its files with another output" --run "dos.r2=--policy dos"
refused "would share its files with another output" --run "peers=--policy cpu"
refused "would write the same files" --run "a/b=--policy cpu" --run "a b=--policy dmda"
refused "give each option in one place" --run "x=--policy cpu --preset gpt2-124m"
refused "give such NAME=VALUE words first" --run "x=--policy cpu DOS_CPU_SCHEDULE=static"
refused "including --policy" --run "DOS_COPY_BY=auto --policy dos"
refused "including --policy" --run "A=B=--policy dos"
refused "do not split as a shell's would" --run "x=--policy cpu --seed '7"
refused "'0x10GB' is not a size" --resident-budgets 0x10GB
refused "'1e' is not a size" --resident-budgets 2MB,1e
refused "'1e-12GB' is less than one byte" --resident-budgets 1e-12GB
refused "'1e19' is beyond the largest size" --resident-budgets 1e19
echo "ok: bad arguments refused"

# NAME=VALUE words before a --run's arguments: that run's environment only (a measurement switch
# A/B in one comparison). A value the CPU kernel refuses, with a warning, shows where it reached.
python3 "$compare" --dos-train "$dos_train" --policies "" --run "env=DOS_CPU_SCHEDULE=bogus --policy cpu" \
  --run "plain=--policy cpu" --out "$out/env" -- --preset tiny --iterations 2 --device host > "$out/env.txt" 2>&1 || {
  cat "$out/env.txt"; echo "FAIL: dos-compare with an environment word in --run exited with $?"; exit 1; }
grep -q "DOS_CPU_SCHEDULE=bogus is not one of" "$out/env/env.log" && head -1 "$out/env/env.log" | grep -q '^\$ DOS_CPU_SCHEDULE=bogus ' || {
  head -5 "$out/env/env.log"; echo "FAIL: run env did not get DOS_CPU_SCHEDULE=bogus, or its log does not say so"; exit 1; }
! grep -q "DOS_CPU_SCHEDULE" "$out/env/plain.log" || { echo "FAIL: DOS_CPU_SCHEDULE reached run plain too"; exit 1; }
grep -q "^| env " "$out/env/compare.md" && grep -q "^| plain " "$out/env/compare.md" || {
  cat "$out/env/compare.md"; echo "FAIL: a row missing"; exit 1; }
echo "ok: a --run's NAME=VALUE words reach that run only"

# A plan that declares it needs a CUDA worker (as a build's own plan may), on a machine without one:
# skipped with its reason, like gpu, not a failed run. A stand-in dos-train answers for it as
# dos-train does.
cat > "$out/needs-gpu-dos-train" <<SH
#!/usr/bin/env bash
for t in "\$@"; do [ "\$t" = mine ] && { echo "dos-train: error: policy 'mine' needs a CUDA worker and there is none"; exit 1; }; done
exec "$dos_train" "\$@"
SH
chmod +x "$out/needs-gpu-dos-train"
python3 "$compare" --dos-train "$out/needs-gpu-dos-train" --policies cpu --run "mine=--policy mine" --out "$out/needs-gpu" \
  -- --preset tiny --iterations 2 --device host > "$out/needs-gpu.txt" 2>&1 || {
  cat "$out/needs-gpu.txt"; echo "FAIL: a plan needing a GPU failed the comparison"; exit 1; }
python3 - "$out/needs-gpu/compare.json" <<'PY' || { cat "$out/needs-gpu.txt"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["failed"] == [] and "needs a CUDA worker" in d["skipped"].get("mine", ""), (d["failed"], d["skipped"])
print("ok: a plan that needs a CUDA worker is skipped, saying why")
PY
# --timeline: recorded by a run of its own after the others, not one of the table's rows
python3 "$compare" --dos-train "$dos_train" --policies cpu,dos --timeline --out "$out/tl" \
  -- --preset tiny --iterations 2 --device host > "$out/tl.txt" 2>&1 || { cat "$out/tl.txt"; echo "FAIL: --timeline"; exit 1; }
python3 - "$out/tl" <<'PY' || { cat "$out/tl.txt"; exit 1; }
import json, os, sys
d = json.load(open(os.path.join(sys.argv[1], "compare.json")))
assert d["timeline"] and {r["label"] for r in d["rows"]} == {"cpu", "dos"}, (d["timeline"], [r["label"] for r in d["rows"]])
t = json.load(open(os.path.join(sys.argv[1], "timeline.json")))
assert "--timeline" in open(os.path.join(sys.argv[1], "timeline-run.log")).readline()
assert "--timeline" not in open(os.path.join(sys.argv[1], "dos.log")).readline()
print("ok: --timeline recorded by a run of its own, out of the table")
PY

# Rounds that go wrong: a dos-train that fails from its second call on, stand-ins for the peers (the
# second round exits 3 after one variant) and for a Python with torch (round 2 skips the variant,
# then, in a second invocation, crashes without writing its JSON while an earlier invocation's
# baselines.r2.json lies in --out). Every case: exit status 2 or the warning, the table written,
# nothing from another round or invocation taken for this one's.
cat > "$out/fail2-dos-train" <<SH
#!/usr/bin/env bash
calls="$out/fail2.calls"
k=\$(cat "\$calls" 2>/dev/null || echo 0); echo \$((k + 1)) > "\$calls"
[ \$k -ge 1 ] && { echo "stand-in: failing call \$((k + 1))"; exit 7; }
exec "$dos_train" "\$@"
SH
cat > "$out/peers2.py" <<'PY'
import os, sys
count = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers2.calls")
k = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(k + 1))
print(f"RESULT zero_offload {0.5 + k:.4f} s/phase")
if k:
    sys.exit(3)
print("RESULT dos_stride:2 0.4000 s/phase")
PY
cat > "$out/fakepy" <<'PY'
#!/usr/bin/env python3
import json, os, sys
args = sys.argv[2:]
count = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakepy.calls")
k = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(k + 1))
if os.environ.get("FAKE_MODE") == "crash" and k >= 1:
    raise RuntimeError("stand-in: a traceback in round 2")
res = [dict(variant="zero_offload", skipped="stand-in: skipped in round 2")] if k == 1 else \
      [dict(variant="zero_offload", seconds_median=1.0 + k, seconds_min=1.0 + k, seconds_max=1.0 + k,
            repeat_seconds=[1.0 + k], phase_seconds=[[2.0, 1.0 + k, 1.0 + k]], gparams_per_s=0.1,
            subgroups={"cpu": 1, "resident": 0, "streamed": 0}, adam_cpu="stand-in", adam_gpu="", params_mismatch=0)]
json.dump(dict(results=res), open(args[args.index("--json") + 1], "w"))
PY
chmod +x "$out/fail2-dos-train" "$out/fakepy"
tiny=(-- --preset tiny --iterations 3 --subgroup-size 100000 --device host)
python3 "$compare" --dos-train "$out/fail2-dos-train" --policies dos --repeats 2 --peers "$out/peers2.py" \
  --peer-variants zero_offload,dos_stride:2 --out "$out/rounds-fail" "${tiny[@]}" > "$out/rounds-fail.txt" 2>&1
rc=$?
python3 - "$out/rounds-fail" "$rc" <<'PY' || { cat "$out/rounds-fail.txt"; exit 1; }
import json, os, sys
d = json.load(open(os.path.join(sys.argv[1], "compare.json")))
assert sys.argv[2] == "2", f"exit status {sys.argv[2]}, not 2, with a run failed in round 2"
assert d["failed"] == ["dos"] and d["rows"] == [], d
assert any("run dos failed in round 2" in n for n in d["notes"]), d["notes"]
assert any("peers exited with status 3 in round 2" in n for n in d["notes"]), d["notes"]
assert any("peer dos_stride:2: 1 of 2 rounds" in n for n in d["notes"]), d["notes"]
assert d["peer_runs"] == {"zero_offload": [0.5, 1.5], "dos_stride:2": [0.4]}, d["peer_runs"]
assert os.path.exists(os.path.join(sys.argv[1], "compare.md"))
print("ok: a run failing in round 2, peers failing in round 2")
PY
[ $? = 0 ] || exit 1
rm -f "$out/fakepy.calls"
python3 "$compare" --dos-train "$dos_train" --policies dos --repeats 2 --baselines zero_offload \
  --baselines-python "$out/fakepy" --out "$out/rounds-skip" "${tiny[@]}" > "$out/rounds-skip.txt" 2>&1 || {
  cat "$out/rounds-skip.txt"; echo "FAIL: dos-compare with a baseline skipped in round 2 exited with $?"; exit 1; }
python3 - "$out/rounds-skip/compare.json" <<'PY' || { cat "$out/rounds-skip.txt"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
b = [x for x in d["baselines"] if x["variant"] == "zero_offload"]
assert len(b) == 1 and b[0]["repeats"] == 1 and b[0]["update_seconds"] == 1.0, d["baselines"]
assert any("baseline zero_offload skipped: stand-in: skipped in round 2" in n for n in d["notes"]), d["notes"]
assert any("baseline zero_offload: 1 of 2 rounds" in n for n in d["notes"]), d["notes"]
print("ok: a baseline skipped in round 2, said")
PY
[ $? = 0 ] || exit 1
rm -f "$out/fakepy.calls"
echo '{"results": [{"variant": "zero_offload", "seconds_median": 99.0, "seconds_min": 99.0, "seconds_max": 99.0,
  "repeat_seconds": [99.0], "phase_seconds": [[99.0]], "gparams_per_s": 0.1}]}' > "$out/rounds-skip/baselines.r2.json"
FAKE_MODE=crash python3 "$compare" --dos-train "$dos_train" --policies dos --repeats 2 --baselines zero_offload \
  --baselines-python "$out/fakepy" --out "$out/rounds-skip" "${tiny[@]}" > "$out/rounds-crash.txt" 2>&1
rc=$?
python3 - "$out/rounds-skip/compare.json" "$rc" <<'PY' || { cat "$out/rounds-crash.txt"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert sys.argv[2] == "2", f"exit status {sys.argv[2]}, not 2, with the baselines crashed in round 2"
b = [x for x in d["baselines"] if x["variant"] == "zero_offload"]
assert len(b) == 1 and b[0]["update_seconds"] == 1.0 and b[0]["repeats"] == 1, ("a stale file was read", d["baselines"])
print("ok: the baselines crashing in round 2 beside an earlier invocation's file: not read, exit status 2")
PY
[ $? = 0 ] || exit 1

# Peers that give their phases' spread, and a --run row's own speedups against them: the stand-in
# reads the alt run's report (written before the peers run in a round) and prints a zero_offload
# mean equal to alt's median with its phases from half to twice it (so alt against it is not a
# measured difference: warned), and a dos_stride:2 of ten times it without a spread.
cat > "$out/peers3.py" <<'PY'
import json, os
alt = json.load(open(os.path.join(os.environ["PEERS3_OUT"], "alt.json")))["summary"]["update_seconds_median"]
print(f"RESULT zero_offload {alt:.9f} s/phase (best {alt * 0.5:.9f} worst {alt * 2:.9f}; warm-up 1.0)")
print(f"RESULT dos_stride:2 {alt * 10:.9f} s/phase")
PY
PEERS3_OUT="$out/peer-spread" python3 "$compare" --dos-train "$dos_train" --policies dos \
  --run "alt=--policy dos --tail-subgroups 0" --peers "$out/peers3.py" --peer-variants zero_offload,dos_stride:2 \
  --out "$out/peer-spread" "${tiny[@]}" > "$out/peer-spread.txt" 2>&1 || {
  cat "$out/peer-spread.txt"; echo "FAIL: dos-compare with peers giving their spread exited with $?"; exit 1; }
python3 - "$out/peer-spread/compare.json" "$out/peer-spread/compare.md" <<'PY' || { cat "$out/peer-spread.txt"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
alt = next(r for r in d["rows"] if r["label"] == "alt")
m = alt["update_seconds"]
zo = d["peers"]["zero_offload"]
assert abs(zo - m) <= 1e-8 * max(1.0, m), (zo, m)
rr = d["run_ratios"]
assert abs(rr["alt_vs_peer_zero_offload"] - zo / m) < 1e-12, rr
assert abs(rr["alt_vs_peer_best_dos_stride"] - d["peers"]["dos_stride:2"] / m) < 1e-12, rr
assert "peer_best_dos_stride" not in rr and d["ratios"]["peer_best_dos_stride"] == "dos_stride:2", (rr, d["ratios"])
assert "dos_vs_peer_zero_offload" in d["ratios"] and not any(k.startswith("dos_") for k in rr), (d["ratios"], rr)
warned = [n for n in d["notes"] if n.startswith("WARNING: alt_vs_peer_zero_offload:")]
assert len(warned) == 1 and "not a measured difference" in warned[0], d["notes"]
# one round of a peer whose phases ranged 4x (its RESULT line's best and worst): warned of as such
unsteady = [n for n in d["notes"] if n.startswith("WARNING: peer zero_offload: its phases (its best and worst) ranged")]
assert len(unsteady) == 1 and "its mean per phase is not a steady figure" in unsteady[0] \
    and "more --peer-iters or --repeats" in unsteady[0], d["notes"]
assert not any(n.startswith("WARNING: alt_vs_peer_best_dos_stride") for n in d["notes"]), d["notes"]
import re
row = re.search(r"\| peer zero_offload \(external, PyTorch\) \| - \| - \| ([0-9.]+) \| - \| ([0-9.]+)\.\.([0-9.]+) \|", text)
assert row and [abs(float(x) - y) <= 1.5e-4 for x, y in zip(row.groups(), (zo, zo / 2, zo * 2))] == [True] * 3, text
assert f"| peer dos_stride:2 (external, PyTorch) | - | - | {d['peers']['dos_stride:2']:.4f} | - | - |" in text, text
assert "speedups of the --run rows (other's seconds / the row's seconds): alt_vs_peer_zero_offload" in text, text
print("ok: a peer's phases give its row's spread; a --run row's speedups against the peers, checked against it")
PY
[ $? = 0 ] || exit 1

# The peers' RESULT lines as run_peers reads them: exponents, a malformed worst (no spread, no
# crash), a later line for a variant replacing the earlier one whole, a best..worst that does not
# hold the mean (left out, warned), extra spaces.
cat > "$out/peers4.py" <<'PY'
print("RESULT zero_offload 1e-3 s/phase (best 9e-4 worst 2e-3)")
print("RESULT dos_stride:2 0.001 s/phase (best 0.0009 worst 0.00.2)")
print("RESULT dos_stride:3 0.05 s/phase (best 0.04 worst 0.06)")
print("RESULT dos_stride:3 0.07 s/phase")
print("RESULT dos_stride:4 0.001 s/phase (best 0.005 worst 0.009)")
print("RESULT twinflow:0.5  0.2  s/phase")
PY
mkdir -p "$out/peers4"
python3 - "$compare" "$out/peers4.py" "$out/peers4" <<'PY' || exit 1
import os, sys, types
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import compare_runs
a = types.SimpleNamespace(peers=sys.argv[2], peer_variants="zero_offload", runs=True, peer_iters=3, out=sys.argv[3])
notes, spread = [], {}
got = compare_runs.run_peers(a, 10, 5, [], notes, 0, spread)
want = {"zero_offload": 1e-3, "dos_stride:2": 0.001, "dos_stride:3": 0.07, "dos_stride:4": 0.001, "twinflow:0.5": 0.2}
assert got == want, got
assert spread == {"zero_offload": (9e-4, 2e-3)}, spread
assert len(notes) == 1 and "peer dos_stride:4" in notes[0] and "do not hold its mean" in notes[0], notes
print("ok: the peers' RESULT lines: exponents, malformed, repeated and inconsistent spreads")
PY

# A --run row labelled dos is dos's row (its speedups on dos's line only), and a --run row with a
# resident budget of its own gets no speedups against the peers (which keep nothing resident).
printf 'print("RESULT zero_offload 0.5 s/phase")\n' > "$out/peers5.py"
python3 "$compare" --dos-train "$dos_train" --policies "" --run "dos=--policy dos --tail-subgroups 0" \
  --run "rb=--policy dos --gpu-resident-budget 1MB" --peers "$out/peers5.py" --peer-variants zero_offload \
  --out "$out/run-rows" "${tiny[@]}" > "$out/run-rows.txt" 2>&1 || {
  cat "$out/run-rows.txt"; echo "FAIL: dos-compare with --run rows dos and rb exited with $?"; exit 1; }
python3 - "$out/run-rows/compare.json" <<'PY' || { cat "$out/run-rows.txt"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert {r["label"] for r in d["rows"]} == {"dos", "rb"}, d["rows"]
assert "dos_vs_peer_zero_offload" in d["ratios"] and d["run_ratios"] == {}, (d["ratios"], d["run_ratios"])
assert d["peer_spreads"] == {"zero_offload": [None, None]}, d["peer_spreads"]
print("ok: a --run row named dos counted once; one with its own resident budget gets no speedups")
PY
[ $? = 0 ] || exit 1
