#!/usr/bin/env bash
# dos-compare end to end on the CPU: three policies on the tiny model in one run; every policy must
# produce a row, and its final parameters must be bit-identical to the cpu run's (0 elements differ).
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
