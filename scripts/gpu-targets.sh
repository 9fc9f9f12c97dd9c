#!/usr/bin/env bash
# On the GPU machine: the runs behind the README's "At the final code" table, in three parts that
# each run in under 600 s on the GPU machine (PART, default tests); outputs go to $OUT. With
# .deps/cache (and .peers) present:
#   PART=tests scripts/gpu-targets.sh
#   PART=tests  the GPU tests (the README's list with refinement-first-phases; 200-260 s, about 360 s on
#               one H100 whose PyTorch tests ran slower: a limit of 480 s)
#   PART=20b    the 20B quarter side by side (dos, the plan untouched, the repository's zero_offload
#               and stride:2, the peers when .peers/torch_update_phase.py is there; -n 5, with
#               dos-bench host's bound), then with 31.5 GB resident (dos, static:0.4, the
#               repository's stride:2 and twinflow, the TwinFlow-ratio peer; -n 4); about 320 s (400 s
#               on a slower machine: the side by side may take up to 300 s); the resident runs here
#               and in PART=rest with the update budget of `scripts/update-budget.sh resident`
#   PART=compact the 20B quarter side by side with the compact master: dos and dos --master compact
#               (a --run row, with its own speedups against the baselines and peers in the same
#               round), the repository's zero_offload and stride:2 and the peers when there, with
#               dos-bench host's bound (dos's), then dos --master compact alone with the bound at the
#               probe's compact-form rates and bytes (skipped when the first step ends after 420 s);
#               -n 5 each; about 450 s
#   PART=copy   the copy rule on the 20B quarter, one comparison with a timeline: dos (the default,
#               adaptive), --copy-by memcpy-down and --copy-by auto, -n 5 each, with dos-bench host's
#               bound; compare.md notes a run whose adaptive rule turned, and each report gives its
#               phases' longest gradient download; about 420 s. On a machine whose downloads starve
#               (the CPU idle part of each phase) it measures what auto gains there
#   PART=rest   the resident sequence (calibrating -n 2, then -n 3 from its rates cache), the 13B
#               sweep, the 7B quarter, its 1/16 shard under 400 MB, the tiny preset (dos, cpu, gpu),
#               dos-bench overhead, the 1.01e9-parameter GPT's update phase (and, selected by ONLY, the
#               same with --compact-master: ONLY='^gpt' runs both); about 380 s
# .peers/torch_update_phase.py: an external PyTorch script with the command line dos_compare.py's
# --peers takes (git-ignored, not in a clone): when present, PART=20b runs it as the peers beside the
# repository's own baselines; otherwise only those. Host memory: PART=20b about 80 GB (the 20B
# quarter's state and staging), PART=rest about 60 GB (the 13B quarter); the GPU machine has 128 GB.
# Each step runs only if it can start early enough for the part to end in time (times.txt says when
# one was skipped). ONLY (an extended regular expression, default: every step) runs only the steps
# whose names match it, the set-up always: ONLY='^tiny|overhead|gpt' PART=rest runs those of
# PART=rest (a step that starts from an earlier step's rates, resident-from-cache, then calibrates
# when that step is left out: the cache is emptied at every start). A pattern that is not a
# regular expression, or selects no step, is refused. The rates cache is $OUT/cache, empty in a fresh $OUT: the part's first model run
# then calibrates, the later ones start from what the earlier ones refined.
# Outputs to $OUT (default ./gpu-targets-out): each step's log and report, times.txt (each step's exit
# status, seconds and start), summary.txt (each dos-train report's phases and prediction errors, the
# side by sides' tables, the sweep's table, the overhead's table and the GPT lines), and all.tgz, all
# of them in one archive (the GPU machine returns a limited number of files: with ARCHIVE_ONLY=1 only
# all.tgz, summary.txt and times.txt are left in $OUT).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-targets-out}
PART=${PART:-tests}
mkdir -p "$OUT"
T0=$(date +%s)
selected=0
if [ -n "${ONLY:-}" ]; then  # a pattern bash cannot read would select nothing, silently
  [[ x =~ $ONLY ]]; [ $? -eq 2 ] && { echo "ONLY='$ONLY' is not an extended regular expression" >&2; exit 2; }
fi
# step NAME LATEST_START TIMEOUT COMMAND...: runs COMMAND (stdout and stderr to $OUT/NAME.log) unless
# more than LATEST_START seconds have passed since the script began
step() {
  local name=$1 latest=$2 limit=$3; shift 3
  if [ "$name" != setup ] && [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return; fi
  [ "$name" != setup ] && selected=$((selected + 1))
  local now=$(( $(date +%s) - T0 ))
  if [ "$now" -gt "$latest" ]; then echo "$name: skipped (at $now s, after $latest s)" | tee -a "$OUT/times.txt"; return; fi
  local s=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - s )) s, started at $now s" | tee -a "$OUT/times.txt"
}
step setup 0 300 scripts/setup.sh build
. .deps/env.sh
export STARPU_SILENT=1 DOS_CACHE_DIR=$OUT/cache
rm -rf "$DOS_CACHE_DIR"
git log --oneline -1 > "$OUT/git.txt" 2>&1; git status --short >> "$OUT/git.txt" 2>&1
TRAIN=build/examples/dos-train
# the 20B quarter's GPU update budget: 40GB, 30GB on an 80 GB GPU, or UPDATE_BUDGET (update-budget.sh)
UPDATE_BUDGET=$(scripts/update-budget.sh 2>> "$OUT/times.txt")
B20=(--preset llama-20b --shard 1/4 --subgroup-size 1.24e8 --gpu-update-budget "$UPDATE_BUDGET" --emulate-compute --tokens 4096)
# the runs with 31.5 GB resident: 3GB on an 80 GB GPU (update-budget.sh resident)
B20R=(--preset llama-20b --shard 1/4 --subgroup-size 1.24e8 --emulate-compute --tokens 4096
      --gpu-update-budget "$(scripts/update-budget.sh resident 2>> "$OUT/times.txt")")
PEERS=()
[ -f .peers/torch_update_phase.py ] && PEERS=(--peers .peers/torch_update_phase.py)
case $PART in
  tests)
    step tests 150 480 bash -c 'meson test -C build --print-errorlogs $(meson test -C build --list |
      grep -E "cuda|train-|copy-stream" | grep -vE "mpi|nccl|shards|resume|bad-input|plan-only|integrity") \
      refinement refinement-first-phases phase-sim phase-sim-copies tail-binding model plans kernels-static \
      optimizer-dos-host-bf16-adam train-plan-only'
    cp build/meson-logs/testlog.txt "$OUT/" 2>/dev/null
    ;;
  20b)
    pv=(); [ ${#PEERS[@]} -gt 0 ] && pv=(--peer-variants zero_offload,dos_stride:2)
    step side-by-side 150 300 python3 examples/dos_compare.py --policies dos \
      --run "plan=--policy dos --tail-subgroups 0" --baselines zero_offload,stride:2 "${PEERS[@]}" "${pv[@]}" \
      --repeats 1 --host-bench --out "$OUT/side-by-side" -- "${B20[@]}" -n 5
    pv=(); [ ${#PEERS[@]} -gt 0 ] && pv=(--peer-variants dos_stride:2)
    step resident 380 200 python3 examples/dos_compare.py --policies "" --resident-budgets 31.5GB \
      --baselines stride:2 "${PEERS[@]}" "${pv[@]}" --repeats 1 --host-bench --out "$OUT/resident" -- "${B20R[@]}" -n 4
    ;;
  compact)
    pv=(); [ ${#PEERS[@]} -gt 0 ] && pv=(--peer-variants zero_offload,dos_stride:2)
    step compact-full 150 330 python3 examples/dos_compare.py --policies dos \
      --run "compact=--policy dos --master compact" --baselines zero_offload,stride:2 "${PEERS[@]}" "${pv[@]}" \
      --repeats 1 --host-bench --out "$OUT/compact-full" -- "${B20[@]}" -n 5
    step compact 420 170 python3 examples/dos_compare.py --policies dos --repeats 1 --host-bench \
      --out "$OUT/compact" -- "${B20[@]}" --master compact -n 5
    ;;
  copy)
    step copy-rule 150 420 python3 examples/dos_compare.py --policies dos \
      --run "memcpy-down=--policy dos --copy-by memcpy-down" --run "auto=--policy dos --copy-by auto" \
      --repeats 1 --host-bench --timeline --out "$OUT/copy-rule" -- "${B20[@]}" -n 5
    ;;
  rest)
    RES=("${B20R[@]}" --overlap off --policy dos --gpu-resident-budget 31.5GB)
    step resident-calibrating 120 90 "$TRAIN" "${RES[@]}" -n 2 --report "$OUT/resident-calibrating.json"
    step resident-from-cache 170 90 "$TRAIN" "${RES[@]}" -n 3 --report "$OUT/resident-from-cache.json"
    step 13b-sweep 250 120 "$TRAIN" --preset llama2-13b --shard 0/4 --iterations 4 --subgroup-size 1e8 --policy dos \
      --sweep 0,1/4,1/2,2/3,3/4,1,model --report "$OUT/13b-sweep.json"
    step 7b 370 60 "$TRAIN" --preset llama2-7b --shard 0/4 --subgroup-size 1e8 --policy dos -n 4 --report "$OUT/7b.json"
    step 7b-1of16-400MB 410 40 "$TRAIN" --preset llama2-7b --shard 0/16 --subgroup-size 1e8 --policy dos -n 4 \
      --gpu-update-budget 400MB --report "$OUT/7b-1of16-400MB.json"
    for p in dos cpu gpu; do
      step "tiny-$p" 440 30 "$TRAIN" --preset tiny --subgroup-size 10007 --policy "$p" -n 8 --report "$OUT/tiny-$p.json"
    done
    step overhead 450 40 build/bench/dos-bench overhead
    step gpt 460 120 env OUT="$OUT/gpt" TEST=0 BATCH=32 DOS_SECONDS=30 TRAIN_ARGS="--max-grad-norm 0" RUNS=dos \
      scripts/gpu-train.sh
    # the same with the compact master (run alone or beside gpt: ONLY='^gpt' PART=rest, about 240 s)
    step gpt-compact 470 120 env OUT="$OUT/gpt-compact" TEST=0 BATCH=32 DOS_SECONDS=30 \
      TRAIN_ARGS="--max-grad-norm 0 --compact-master" RUNS=dos scripts/gpu-train.sh
    ;;
  *) echo "PART must be tests, 20b, compact, copy or rest, not $PART" >&2; exit 2 ;;
esac
if [ -n "${ONLY:-}" ] && [ "$selected" -eq 0 ]; then
  echo "ONLY='$ONLY' selected no step of PART=$PART" | tee -a "$OUT/times.txt" >&2; exit 2
fi
reports=("$OUT"/*.json)
if [ -e "${reports[0]}" ]; then
  echo "dos-train reports: per phase update s (prediction error, CPU Adam per CPU worker)"
  python3 scripts/report_phases.py "${reports[@]}"
fi > "$OUT/summary.txt" 2>&1
python3 - "$OUT" <<'PY' >> "$OUT/summary.txt" 2>&1
import os, sys
out = sys.argv[1]
for name in ("side-by-side", "resident", "compact-full", "compact", "copy-rule"):
    md = os.path.join(out, name, "compare.md")
    if os.path.exists(md):
        print(f"\n{name} (compare.md):")
        print(open(md).read())
# each copy-rule run's phases: the longest gradient download (ms) and whether it dodged write-backs
import json
for label in ("dos", "memcpy-down", "auto"):
    rep = os.path.join(out, "copy-rule", label + ".json")
    if os.path.exists(rep):
        its = json.load(open(rep)).get("iterations", [])
        print(f"copy-rule {label}: longest download ms / dodged per phase: " + ", ".join(
            f"{1e3 * it.get('longest_download_seconds', 0):.1f}/{'y' if it.get('downloads_dodge_writebacks') else 'n'}"
            for it in its))
# the 13B sweep's table (from its "sweep (" line on) and model lines, the overhead table whole
for name, start in (("13b-sweep", "sweep ("), ("overhead", "dos-bench overhead")):
    log = os.path.join(out, name + ".log")
    if os.path.exists(log):
        print(f"\n{name}.log:")
        printing = False
        for line in open(log, errors="replace"):
            printing = printing or line.lstrip().startswith(start)
            if (printing or line.startswith("model:")) and not line.startswith("["):
                print("  " + line.rstrip())
for name in ("gpt", "gpt-compact"):
    gpt = os.path.join(out, name, "summary.md")
    if os.path.exists(gpt):
        print(f"\nGPT ({name}/summary.md):")
        print(open(gpt).read())
PY
cat "$OUT/times.txt" "$OUT/summary.txt"
# the GPU machine returns a limited number of files: everything in one archive beside the summary
scripts/archive-out.sh "$OUT" summary.txt times.txt
