#!/usr/bin/env bash
# On the GPU machine: which of the calibration's link_share rules (DOS_CALIBRATE_LINK_SHARE: the
# estimate U_c_dma / U_c, the default; the placeholder 1; the measure on scratch phases; dma, the
# links' rate beside CPU-only phases against alone) predicts a
# calibrating run's first phases best? Builds, then runs each case below as one calibrating process
# (a fresh rates cache each) under each rule of RULES (default "placeholder estimate"), interleaved,
# ROUNDS times, and prints each phase's update time and prediction error:
#   20b-resident  the 20B quarter with 31.5 GB resident, update after backward, -n 2 (its first
#                 phase brings the resident state up, its second is the first that streams)
#   20b           the 20B quarter, nothing resident, -n 3 (the update overlapped with the emulated
#                 backward, dos-train's default there)
#   20b-alone     the same with --overlap off: the update after backward, no speculated state on
#                 the GPU beside the activations (on an 80 GB H100 every calibrating process of 20b
#                 ran out of GPU memory at its first iteration, at 30GB and at 20GB)
#   7b-16m        the 7B 1/16 shard in subgroups of 2^24 under a 400 MB update budget, -n 4
#   7b-seq        the 7B quarter (subgroups of 1e8, -n 4), then from its rates cache the 7B 1/16
#                 shard under a 400 MB update budget (all on the CPU, -n 4): U_c's first measure in
#                 the second process, which starts from the quarter's rates (the report of the
#                 second is the case's; the first's is <name>-first.json)
# Each process is named CASE-RULE-roundK. SCRATCH="8 32" (values of DOS_CALIBRATION_SUBGROUPS, the
# calibration's scratch subgroups, 3/4 of them streamed in its mixed phase) runs each case and rule
# once per value, interleaved, each named CASE-RULE-sN-roundK: whether longer mixed scratch phases
# predict the first phases better. Unset: DOS_CALIBRATION_SUBGROUPS as the caller's environment has it:
#   CASES=20b-alone RULES='estimate measure' SCRATCH='8 32' ROUNDS=2 ARCHIVE_ONLY=1 scripts/gpu-calibration.sh
# (eight 20B processes of about 45 s after the build: about 450 s)
# On the GPU machine, with .deps/cache present:
#   scripts/gpu-calibration.sh
#   TESTS=1 CASES='20b-resident 7b-seq' scripts/gpu-calibration.sh
# Outputs go to $OUT (default ./gpu-calibration-out): each process's log and report, summary.txt, and
# all.tgz holding them all (ARCHIVE_ONLY=1 leaves only it and summary.txt: the GPU machine returns a
# limited number of files).
# CASES picks cases (default all four), RULES the rules, ROUNDS the repetitions (default 1). TESTS=1
# runs the GPU tests first (the README's list with refinement-first-phases, 200-260 s). Each case
# runs once per rule; with two rules: 20b-resident about 70 s, 20b about 90 s, 7b-16m about 12 s,
# 7b-seq about 80 s; with the build (60-90 s) all four cases take about 350 s, so with TESTS=1 give
# two of them (as above) to stay under 600 s per run on the GPU machine. Needs about 80 GB of host memory (the 20B
# quarter's state and staging). On a machine without a GPU the runs fall back to the CPU and
# calibrate nothing: the script says so and its figures mean nothing.
# LOOP=S (whole seconds) runs, in place of the cases, the 7b-16m case's command with -n 2 as one
# calibrating process after another (a fresh rates cache each, each under LOOP_LIMIT seconds,
# default 20; about 5 s each on the GPU machine; each started while fewer than S whole seconds
# have passed, so the last may end up to LOOP_LIMIT s after S), and counts the processes that did
# not end in time: a calibration that waits for ever under StarPU's GPU memory limit
# (docs/status.md, "Calibration under a tight GPU memory limit"). A process that fails stops the
# loop. TRAIN names another dos-train (an older commit's, built beside) for the loop and the cases.
# OUT's earlier loop logs are removed first. The loop exits 1 when a process did not end in time,
# failed, or found no GPU (then nothing was calibrated):
#   LOOP=150 ARCHIVE_ONLY=1 scripts/gpu-calibration.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-calibration-out}
CASES=${CASES:-20b-resident 20b 7b-16m 7b-seq}
RULES=${RULES:-placeholder estimate}
ROUNDS=${ROUNDS:-1}
read -ra scratch <<<"${SCRATCH:-}"  # split on blanks, no file names expanded
seen=' '
for v in "${scratch[@]}"; do  # checked before the build (dos-train refuses other values at start)
  [[ $v =~ ^[1-9][0-9]?$ ]] && [ $((v % 4)) -eq 0 ] && [ "$v" -ge 8 ] && [ "$v" -le 32 ] ||
    { echo "SCRATCH takes multiples of 4 from 8 to 32 (DOS_CALIBRATION_SUBGROUPS), not '$v'" >&2; exit 2; }
  [[ $seen == *" $v "* ]] && { echo "SCRATCH gives $v twice (each value names its processes)" >&2; exit 2; }
  seen+="$v "
done
[ ${#scratch[@]} -gt 0 ] || scratch=(caller)
limit=${LOOP_LIMIT:-20}
if [ -n "${LOOP:-}" ]; then  # checked before the build
  [[ $LOOP =~ ^[1-9][0-9]{0,4}$ ]] || { echo "LOOP must be a whole number of seconds (1-99999), not '$LOOP'" >&2; exit 2; }
  [[ $limit =~ ^[1-9][0-9]{0,3}$ ]] || { echo "LOOP_LIMIT must be a whole number of seconds (1-9999), not '$limit'" >&2; exit 2; }
fi
mkdir -p "$OUT"
t0=$(date +%s)
"$ROOT/scripts/setup.sh" build > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. "$ROOT/.deps/env.sh"
export STARPU_SILENT=1
TRAIN=${TRAIN:-$ROOT/build/examples/dos-train}
[ -f "$TRAIN" ] && [ -x "$TRAIN" ] || { echo "TRAIN=$TRAIN is not an executable file (a dos-train)" >&2; exit 2; }
if [ "${TESTS:-0}" = 1 ]; then
  (cd "$ROOT" && timeout 330 meson test -C build --print-errorlogs $(meson test -C build --list |
     grep -E "cuda|train-|copy-stream" | grep -vE "mpi|nccl|shards|resume|bad-input|plan-only|integrity") \
     refinement refinement-first-phases phase-sim phase-sim-copies tail-binding model plans kernels-static \
     optimizer-dos-host-bf16-adam train-plan-only > "$OUT/tests.log" 2>&1)
  echo "GPU tests: exit $?; $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/tests.log" | tr -s ' ' | tr '\n' ' ')"
fi
# the 20B quarter's update budgets as scripts/gpu-targets.sh gives them (scripts/update-budget.sh:
# 30GB on an 80 GB GPU, where 40GB ran out of GPU memory at the second iteration; beside 31.5 GB
# resident 3GB there)
B20=(--preset llama-20b --shard 1/4 --subgroup-size 1.24e8 --emulate-compute --tokens 4096 --policy dos
     --gpu-update-budget)
UB=$("$ROOT/scripts/update-budget.sh" 2>/dev/null) UBR=$("$ROOT/scripts/update-budget.sh" resident 2>/dev/null)
args() {
  case $1 in
    20b-resident) echo "${B20[@]} $UBR --overlap off --gpu-resident-budget 31.5GB -n 2" ;;
    20b) echo "${B20[@]} $UB -n 3" ;;
    20b-alone) echo "${B20[@]} $UB --overlap off -n 3" ;;
    7b-16m) echo "--preset llama2-7b --shard 0/16 --subgroup-size 16777216 --gpu-update-budget 400MB --policy dos -n 4" ;;
    7b-seq) echo "--preset llama2-7b --shard 0/16 --subgroup-size 1e8 --gpu-update-budget 400MB --policy dos -n 4" ;;
    *) echo "unknown case $1" >&2; return 1 ;;
  esac
}
if [ -n "${LOOP:-}" ]; then
  a=$(args 7b-16m); a=${a% -n 4}
  n=0 late=0 failed=0 nogpu=0 start=$(date +%s) pid='' cache=''
  # an interrupt ends the process under way and removes its cache before the script exits
  stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; [ -n "$cache" ] && rm -rf "$cache"; exit "$1"; }
  trap 'stop 130' INT; trap 'stop 143' TERM
  rm -f "$OUT"/loop-*.log "$OUT/all.tgz"; : > "$OUT/summary.txt"
  while [ $(( $(date +%s) - start )) -lt "$LOOP" ]; do
    n=$((n + 1)); cache=$(mktemp -d); s=$(date +%s%N)
    # in the background, so that a signal to the script reaches it (wait returns at once)
    # shellcheck disable=SC2086
    DOS_CACHE_DIR=$cache timeout -k 5 "$limit" "$TRAIN" $a -n 2 > "$OUT/loop-$n.log" 2>&1 &
    pid=$!; wait "$pid"; rc=$?; pid=''
    rm -rf "$cache"; cache=''
    grep -q "no CUDA worker" "$OUT/loop-$n.log" && nogpu=$((nogpu + 1))
    echo "loop-$n: exit $rc, $(( ($(date +%s%N) - s) / 1000000 )) ms, $(grep -o 'scratch update budget [0-9.]* [A-Z]*' "$OUT/loop-$n.log" | head -1)" |
      tee -a "$OUT/summary.txt"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then late=$((late + 1))
    elif [ $rc -ne 0 ]; then  # a process that fails, not one that waits: the loop stops (its log says why)
      failed=1; tail -3 "$OUT/loop-$n.log" | tee -a "$OUT/summary.txt"; break
    fi
  done
  echo "$TRAIN: calibrating processes $n, not ended within ${limit} s $late, failed $failed" | tee -a "$OUT/summary.txt"
  [ $nogpu -gt 0 ] &&
    echo "no GPU here in $nogpu of them: nothing was calibrated there (run this on the GPU machine)" | tee -a "$OUT/summary.txt"
  "$ROOT/scripts/archive-out.sh" "$OUT" summary.txt
  [ $((late + failed + nogpu)) -eq 0 ]; exit
fi
# an interrupt removes the case's rates cache (after the process under way ends) before exiting
cache=''
trap '[ -n "$cache" ] && rm -rf "$cache"; exit 130' INT
trap '[ -n "$cache" ] && rm -rf "$cache"; exit 143' TERM
for round in $(seq 1 "$ROUNDS"); do
  for c in $CASES; do
    a=$(args "$c") || exit 2
    for rule in $RULES; do
      for sub in "${scratch[@]}"; do
        name="$c-$rule-round$round" env=()
        if [ "$sub" != caller ]; then name="$c-$rule-s$sub-round$round" env=(DOS_CALIBRATION_SUBGROUPS="$sub"); fi
        cache=$(mktemp -d)
        if [ "$c" = 7b-seq ]; then
          env "${env[@]}" DOS_CACHE_DIR="$cache" DOS_CALIBRATE_LINK_SHARE="$rule" timeout 120 "$TRAIN" --preset llama2-7b \
            --shard 0/4 --subgroup-size 1e8 --policy dos -n 4 --report "$OUT/$name-first.json" > "$OUT/$name-first.log" 2>&1
        fi
        # shellcheck disable=SC2086
        env "${env[@]}" DOS_CACHE_DIR="$cache" DOS_CALIBRATE_LINK_SHARE="$rule" timeout 120 "$TRAIN" $a \
          --report "$OUT/$name.json" > "$OUT/$name.log" 2>&1
        echo "$name: exit $?, $(grep -h "calibration's link_share" "$OUT/$name.log" | head -1)"
        grep -q "no CUDA worker" "$OUT/$name.log" &&
          echo "$name: no GPU here: nothing was calibrated nor predicted (run this on the GPU machine)"
        cp "$cache"/rates-*.json "$OUT/$name.rates.json" 2>/dev/null
        rm -rf "$cache"; cache=''
      done
    done
  done
done
{
  echo "case-rule[-sN]-roundK: per phase update s (prediction error, CPU Adam per CPU worker)"
  python3 "$ROOT/scripts/report_phases.py" $(ls "$OUT"/*-round*.json | grep -v '\.rates\.json$')
} | tee "$OUT/summary.txt"
# the GPU machine returns a limited number of files: everything in one archive beside the summary
"$ROOT/scripts/archive-out.sh" "$OUT" summary.txt
