#!/usr/bin/env bash
# dos-train --plan-only on any machine (no GPU, no StarPU update phase): the plan of each plan on
# given rates, its prediction and the lower bound; rates from a file (a file's links held to 1.25x its
# calibrated rates); a plan needing rates without
# them, a StarPU policy and bad --rates refused with a message; the per-subgroup plan and placement
# in the report of a real (CPU) run.
#   e2e_plan_only.sh DOS_TRAIN
set -u
train=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
# 124M parameters in 8 subgroups of 2^24; rates of the README's GPU machine (Gparams/s x4, GB/s x2)
rates=3.7,2.9,60,300,50,50
common=(--preset gpt2-124m --subgroup-size 16777216 --plan-only)

for policy in dos greedy static:0.5 cpu gpu; do
  out=$("$train" "${common[@]}" --policy "$policy" --rates $rates --report "$tmp/plan-$policy.json" 2>&1) ||
    { bad "--plan-only --policy $policy exited non-zero: $out"; continue; }
  echo "$out"
  plan=$(grep -E '^plan +0: ' <<<"$out" | awk '{print $3}')
  [[ "$plan" =~ ^[csr]{8}$ ]] || bad "$policy: no plan of 8 subgroups printed"
  grep -qE '^predicted [0-9.]+ s .*lower bound [0-9.]+ s' <<<"$out" || bad "$policy: no prediction and lower bound"
  grep -q '^iter' <<<"$out" && bad "$policy: --plan-only ran iterations"
  python3 - "$tmp/plan-$policy.json" "$plan" <<'PY' || bad "$policy: report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["plan"] == sys.argv[2] and r["subgroups"] == 8 and r["predicted_seconds"] > 0 and r["lower_bound_seconds"] > 0, r
# the bound counts the resident subgroups of the resident budget only, not those a plan keeps itself
if r["planned_resident"] == 0:
    assert r["predicted_seconds"] >= r["lower_bound_seconds"] * 0.999, r
PY
done
# the fixed plans, whatever the rates
grep -q '"plan": "cccccccc"' "$tmp/plan-cpu.json" || bad "cpu: not all on the CPU"
grep -q '"plan": "ssssssss"' "$tmp/plan-gpu.json" || bad "gpu: not all streamed"
grep -q '"plan": "ccccrrrr"' "$tmp/plan-static:0.5.json" || bad "static:0.5: not half on the CPU, half resident"
# the first iteration's resident subgroups bring their state up (12 B/param at B_h2d = 50 GB/s)
python3 - "$tmp/plan-static:0.5.json" <<'PY' || bad "static:0.5: the resident state's upload is not in the prediction"
import json, sys
r = json.load(open(sys.argv[1]))
up = 12 * sum(n for n, side in zip(r["subgroup_sizes"], r["plan"]) if side == "r") / 50e9
assert up > 0 and r["busy_seconds"]["h2d"] >= up * 0.999 and r["predicted_seconds"] >= up, (up, r)
PY
# a resident budget of two subgroups' state (12 B/param): the last two resident under gpu
out=$("$train" "${common[@]}" --policy gpu --gpu-resident-budget $((2 * 12 * 16777216)) 2>&1)
grep -q '^plan      0: ssssssrr$' <<<"$out" || bad "gpu with a resident budget: $out"
grep -q 'prediction: none' <<<"$out" || bad "gpu without rates: no word about the missing prediction"
# an update budget below one streamed subgroup's footprint: said, as a run says it, and nothing streamed
out=$("$train" "${common[@]}" --policy dos --rates 4,3,60,300,50,50 --gpu-update-budget 1000 2>&1)
grep -q "^note: the GPU update budget (1000 bytes) is below one streamed subgroup's" <<<"$out" &&
  grep -q '^plan      0: cccccccc$' <<<"$out" || bad "dos under a 1000-byte update budget: $out"
# --plan-phase later: the resident state is already on the GPU, so the static:0.5 plan's resident
# half brings nothing up (the H2D left is the CPU half's parameters, here with the state's upload
# 0.0160 s against 0.0027 s) and the phase is predicted faster than the first
later=$("$train" "${common[@]}" --policy static:0.5 --rates $rates --plan-phase later --report "$tmp/later.json" 2>&1) ||
  bad "--plan-phase later exited non-zero: $later"
python3 - "$tmp/plan-static:0.5.json" "$tmp/later.json" <<'PY' || bad "--plan-phase later: the resident state still comes up"
import json, sys
first, later = (json.load(open(p)) for p in sys.argv[1:])
assert later["plan"] == first["plan"] == "ccccrrrr", (first["plan"], later["plan"])
assert first["plan_phase"] == "first" and later["plan_phase"] == "later", (first["plan_phase"], later["plan_phase"])
up = 12 * sum(n for n, side in zip(first["subgroup_sizes"], first["plan"]) if side == "r") / 50e9
assert later["busy_seconds"]["h2d"] < first["busy_seconds"]["h2d"] - 0.9 * up, (first["busy_seconds"], later["busy_seconds"])
assert later["predicted_seconds"] < first["predicted_seconds"], (first["predicted_seconds"], later["predicted_seconds"])
PY
"$train" --preset tiny --plan-phase later >"$tmp/out" 2>&1 && bad "--plan-phase without --plan-only exited 0"
grep -q -- "--plan-phase requires --plan-only" "$tmp/out" || bad "--plan-phase without --plan-only: $(cat "$tmp/out")"
"$train" "${common[@]}" --policy dos --rates $rates --plan-phase warm >"$tmp/out" 2>&1 && bad "--plan-phase warm exited 0"
grep -q -- "--plan-phase: warm not in {first,later}" "$tmp/out" ||
  bad "--plan-phase warm: the message does not name the values: $(cat "$tmp/out")"

# rates from a file in the calibration cache's format (params/s, bytes/s): the same plan as on the command line
printf '{"U_c": 3.7e9, "U_c_dma": 2.9e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10}\n' > "$tmp/rates.json"
a=$("$train" "${common[@]}" --policy dos --rates "$tmp/rates.json" 2>&1 | grep -E '^(plan +0|predicted)')
b=$("$train" "${common[@]}" --policy dos --rates $rates 2>&1 | grep -E '^(plan +0|predicted)')
[ -n "$a" ] && [ "$a" = "$b" ] || bad "rates file and command line differ: '$a' vs '$b'"
# a rates file whose links were refined past 1.25x its calibrated rates (80 GB/s against 36.7): planned
# as the runtime starts from it, the links at 1.25 x 36.7 = 45.875 GB/s (models/refinement.h,
# cap_links), the plan of the file that says so; without calibrated rates of its own, the links as
# given (the command line's plan), another plan
cal='"calibrated": {"U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 3.67e10, "B_d2h": 3.67e10, "link_share": 1}'
printf '{"U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 8e10, "B_d2h": 8e10, "link_share": 0.8, %s}\n' "$cal" > "$tmp/over.json"
printf '{"U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 4.5875e10, "B_d2h": 4.5875e10, "link_share": 0.8, %s}\n' "$cal" > "$tmp/at-ceiling.json"
printf '{"U_c": 4e9, "U_c_dma": 3e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 8e10, "B_d2h": 8e10, "link_share": 0.8}\n' > "$tmp/own.json"
over=$("$train" "${common[@]}" --policy dos --rates "$tmp/over.json" 2>&1 | grep -E '^(plan +0|predicted)')
ceil=$("$train" "${common[@]}" --policy dos --rates "$tmp/at-ceiling.json" 2>&1 | grep -E '^(plan +0|predicted)')
own=$("$train" "${common[@]}" --policy dos --rates "$tmp/own.json" 2>&1 | grep -E '^(plan +0|predicted)')
given=$("$train" "${common[@]}" --policy dos --rates 4,3,60,300,80,80,0.8 2>&1 | grep -E '^(plan +0|predicted)')
[ -n "$over" ] && [ "$over" = "$ceil" ] || bad "links past the ceiling not planned at it: '$over' vs '$ceil'"
[ -n "$own" ] && [ "$own" = "$given" ] && [ "$own" != "$ceil" ] ||
  bad "a rates file without calibrated rates held, or the ceiling changed nothing: '$own' vs '$given' vs '$ceil'"
# link_share, a seventh number or the file's key: the same prediction from both, and a share of 0.5
# (the links slowed more than CPU Adam beside each other) predicts a mixed plan slower than 1 does
printf '{"U_c": 3.7e9, "U_c_dma": 2.9e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10, "link_share": 0.5}\n' \
  > "$tmp/rates-share.json"
# greedy's plan does not read link_share: the same mixed plan, predicted at both shares
one=$("$train" "${common[@]}" --policy greedy --rates $rates 2>&1)
half=$("$train" "${common[@]}" --policy greedy --rates $rates,0.5 2>&1)
p1=$(sed -nE 's/^predicted ([0-9.]+) s.*/\1/p' <<<"$one") p2=$(sed -nE 's/^predicted ([0-9.]+) s.*/\1/p' <<<"$half")
plan1=$(grep -E '^plan +0: ' <<<"$one" | awk '{print $3}') plan2=$(grep -E '^plan +0: ' <<<"$half" | awk '{print $3}')
{ [ "$plan1" = "$plan2" ] && [[ "$plan1" =~ c && "$plan1" =~ s ]] && [ -n "$p1" ] && [ -n "$p2" ] &&
  python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) else 1)" "$p1" "$p2"; } ||
  bad "link_share 0.5 should slow greedy's mixed plan ($plan1: $p1 s; $plan2: $p2 s)"
a=$("$train" "${common[@]}" --policy gpu --rates "$tmp/rates-share.json" 2>&1 | grep -E '^(predicted|rates)')
b=$("$train" "${common[@]}" --policy gpu --rates $rates,0.5 2>&1 | grep -E '^(predicted|rates)')
[ -n "$a" ] && [ "$a" = "$b" ] || bad "link_share from a file and from the command line differ: '$a' vs '$b'"
grep -qE "share beside CPU Adam 0\.5$" <<<"$b" || bad "the rates line does not print link_share 0.5: $b"

expect() {  # expect "substring of the message" dos-train-args...
  local want=$1; shift
  local out
  if out=$("$train" "${common[@]}" "$@" 2>&1); then bad "'$*' exited 0"; return; fi
  grep -qi -- "$want" <<<"$out" || { bad "'$*': message lacks '$want': $out"; return; }
  echo "ok: $* -> $(grep -i -- "$want" <<<"$out" | head -1)"
}
expect "needs the model's rates" --policy dos
expect "StarPU policy" --policy dmda --rates $rates
expect "unknown policy 'nosuch'" --policy nosuch --rates $rates
expect "cpu, gpu, dos, static:R, greedy" --policy nosuch --rates $rates
expect "not 6 or 7" --policy dos --rates 1,2,3
expect "is not a number" --policy dos --rates 1,2,x,4,5,6
expect "'0x10' is not a number" --policy dos --rates 4,3,0x10,300,50,50
expect "'inf' is not a number" --policy dos --rates 4,3,60,inf,50,50
expect "'1e400' is beyond what a double holds" --policy dos --rates 4,3,60,1e400,50,50
expect "must be a finite number > 0" --policy dos --rates 1,1,0,4,5,6
expect "B_d2h lies outside" --policy dos --rates 1,1,1,1,1,1e300  # finite, beyond range once in bytes/s
expect "B_d2h lies outside" --policy dos --rates 1,1,1,1,1,1e-300
printf '{ "U_c": 4.1, "U_c_dma": 2.9, "U_g": 60, "D_c": 300, "B_h2d": 50, "B_d2h": 50 }' > "$tmp/rates-gunits.json"
expect "a rates file is in params/s" --policy dos --rates "$tmp/rates-gunits.json"
expect "cannot exceed U_c" --policy dos --rates 1,2,3,4,5,6
expect "must be a finite number > 0" --policy dos --rates 1,1,3,4,5,6,0
expect "link_share cannot exceed" --policy dos --rates 3.7,2.9,60,300,50,50,3
expect "link_share cannot be below 1/16" --policy dos --rates 3.7,2.9,60,300,50,50,1e-300
expect "leave out one of the two" --policy dos --rates $rates --recalibrate
expect "empty: give six" --policy dos --rates ""
expect "'  ' is not a number" --policy dos --rates "3.7,2.9,60,300,50,  "
# blanks around a number are no part of it: the rates read are those given
if out=$("$train" "${common[@]}" --policy dos --rates " 3.7, 2.9,60 ,300,50,50 " 2>&1); then
  grep -q "rates: U_c 3.70 Gparams/s alone, 2.90 under DMA; U_g 60.0; D_c 300.0; B 50.0 GB/s H2D, 50.0 GB/s D2H" <<<"$out" ||
    bad "--rates with blanks around its numbers read other rates: $out"
else
  bad "--rates with blanks around its numbers refused: $out"
fi
printf '{"U_c": 3.7e9, "U_c_dma": 2.9e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10, "B_h2d": 1e7}\n' > "$tmp/twice.json"
expect "gives the key 'B_h2d' twice" --policy dos --rates "$tmp/twice.json"
printf '{"U_c": 1}' > "$tmp/short.json"
printf '{"U_c": 3.7e9, "U_c_dma": 2.9e9, "U_g": 6e10, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10, "link_share": 3}\n' \
  > "$tmp/share-above-cap.json"
expect "link_share cannot exceed" --policy dos --rates "$tmp/share-above-cap.json"
expect "not a rates file" --policy dos --rates "$tmp/short.json"
expect "leave out --k" --policy dos --rates $rates --k 2

# a real run on this machine: the per-subgroup plan and placement in each iteration of the report
"$train" --preset tiny --iterations 2 --quiet --policy greedy --report "$tmp/run.json" >/dev/null 2>&1 ||
  bad "dos-train --policy greedy failed"
python3 - "$tmp/run.json" <<'PY' || bad "the report's plan and placement"
import json, sys
r = json.load(open(sys.argv[1]))
for it in r["iterations"]:
    n = r["subgroups"]
    assert len(it["plan"]) == n and len(it["placement"]) == n, it
    assert set(it["placement"]) <= set("csr") and set(it["plan"]) <= set("csr"), it
    # the CPU's subgroups (all of them without a CUDA worker): their Adam tasks took some time
    assert it["cpu_adam_seconds"] > 0 if "c" in it["placement"] else it["cpu_adam_seconds"] == 0, it
PY
# scripts/report_phases.py on that report: one line, both iterations (a CPU Adam rate for each that
# ran subgroups on the CPU, as every one does without a CUDA worker)
phases=$(python3 "$(dirname "$0")/../scripts/report_phases.py" "$tmp/run.json" 2>&1)
want=$(python3 -c 'import json,sys; print(sum("c" in it["placement"] for it in json.load(open(sys.argv[1]))["iterations"]))' "$tmp/run.json")
[ "$(grep -c '^run: median' <<<"$phases")" = 1 ] && [ "$(grep -o 'CPU Adam [0-9.]* Gp/s' <<<"$phases" | wc -l)" = "$want" ] ||
  bad "report_phases.py ($want iterations with CPU subgroups): $phases"
# with the rates each phase's refinement left (a run with a CUDA worker): the streamed count and
# link_share after each phase, and the calibrated rates the first phase was planned at
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
for k, it in enumerate(r["iterations"]):
    it["placement"] = "s" + it["placement"][1:]; it["rates_after"] = {"U_c": 1e9, "link_share": 0.5 + 0.25 * k}
r["cuda_workers"] = 1
r["calibrated_rates"] = {"U_c": 4.49e9, "U_c_dma": 3.67e9, "U_g": 1e11, "D_c": 4e11, "B_h2d": 5e10, "B_d2h": 5e10,
                         "link_share": 0.8171}
json.dump(r, open(sys.argv[2], "w"))' "$tmp/run.json" "$tmp/with-rates.json"
phases=$(python3 "$(dirname "$0")/../scripts/report_phases.py" "$tmp/with-rates.json" 2>&1)
grep -q "1 streamed, link_share then 0.500).*1 streamed, link_share then 0.750)" <<<"$phases" &&
  grep -q "(iterations 2..); calibrated U_c 4.49, U_c_dma 3.67 Gp/s, link_share 0.817; each: " <<<"$phases" ||
  bad "report_phases.py with rates_after and calibrated rates: $phases"
# without a CUDA worker no calibrated rates are printed (the run made none), even where the report
# holds some: the same report with cuda_workers 0 (the real run has one on a GPU machine)
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["cuda_workers"] = 0
json.dump(r, open(sys.argv[2], "w"))' "$tmp/with-rates.json" "$tmp/no-cuda.json"
grep -q "calibrated" <<<"$(python3 "$(dirname "$0")/../scripts/report_phases.py" "$tmp/no-cuda.json" 2>&1)" &&
  bad "report_phases.py printed calibrated rates for a run without a CUDA worker"
# a report with a field of the wrong type is named, and the next file is still read
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["iterations"][0]["cpu_adam_seconds"]="1"; json.dump(r, open(sys.argv[2], "w"))' \
  "$tmp/run.json" "$tmp/a-bad.json"
phases=$(python3 "$(dirname "$0")/../scripts/report_phases.py" "$tmp/a-bad.json" "$tmp/run.json" 2>&1)
[ $? -eq 0 ] && grep -q "^a-bad: not a dos-train report's fields" <<<"$phases" && grep -q '^run: median' <<<"$phases" ||
  bad "report_phases.py on a report with a string for a number: $phases"
"$train" --preset tiny --iterations 1 --quiet --policy dmda --report "$tmp/dmda.json" >/dev/null 2>&1 &&
  python3 -c 'import json,sys; it=json.load(open(sys.argv[1]))["iterations"][0]; assert it["plan"] == "" and it["placement"], it' \
    "$tmp/dmda.json" || bad "dmda's report: an empty plan and a placement"
[ $fails -eq 0 ] && echo "all plan-only checks passed"
exit $((fails > 0))
