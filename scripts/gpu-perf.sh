#!/usr/bin/env bash
# On the GPU machine: build from .deps/cache (offline), then the update phase's performance runs:
# GPU tests (TESTS: meson test names, "all" for the whole suite, "" for none), dos-bench overhead,
# the tiny preset's phase under several policies, timelines of the 20B quarter (dos and gpu), the
# Llama-2 13B quarter's sweep of the streamed fraction. Outputs go to $OUT (default
# ./gpu-perf-out). Used through the `device` tool:
#   run(command="scripts/gpu-perf.sh", carry=[".deps/cache"])
# DOS_BUILD_DIR: the build folder (default build). PARTS (default "tests overhead tiny timeline sweep") picks the parts; ITERS (default 4).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-perf-out}
BUILD=${DOS_BUILD_DIR:-$ROOT/build}
mkdir -p "$OUT"
PARTS=${PARTS:-tests overhead tiny timeline sweep}
ITERS=${ITERS:-4}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$ROOT/scripts/setup.sh" build > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. "$ROOT/.deps/env.sh"
export STARPU_SILENT=1
D=$BUILD/examples/dos-train
if has tests; then
  tests=${TESTS-kernels-cuda optimizer-bf16-cuda train-cpu-vs-gpu-tolerance train-cpu-vs-dos-static train-grad-staging train-emulated-iteration}
  [ "$tests" = all ] && tests=""
  meson test -C "$BUILD" --print-errorlogs $tests 2>&1 | grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Expected|Unexpected|Timeout):|FAIL|Error" | tail -60
  cp "$BUILD/meson-logs/testlog.txt" "$OUT/" 2>/dev/null
  echo "tests: $(( $(date +%s) - t0 )) s"
fi
if has overhead; then
  echo "== dos-bench overhead"
  "$BUILD/bench/dos-bench" overhead 2>&1 | grep -v "^\[starpu"
fi
if has tiny; then
  for p in cpu gpu dos dmda; do
    echo "== tiny, subgroups of 10007, --policy $p"
    "$D" --preset tiny --subgroup-size 10007 --policy "$p" -n 8 --report "$OUT/tiny-$p.json" 2>&1 | grep -E "^(summary|model)|error"
  done
fi
BIG=(--preset llama-20b --shard 1/4 --subgroup-size 1.24e8 -n "$ITERS" --gpu-update-budget 40GB)
if has timeline; then
  for p in ${TL_POLICIES:-dos gpu}; do
    echo "== 20B quarter, --policy $p, timeline"
    "$D" "${BIG[@]}" --policy "$p" --timeline "$OUT/tl20-$p.json" --report "$OUT/r20-$p.json" 2>&1 | grep -vE "^\[starpu" | tail -$((ITERS + 4))
  done
fi
if has sweep; then
  echo "== sweep: llama2-13b --shard 0/4 --subgroup-size 1e8"
  "$D" --preset llama2-13b --shard 0/4 --iterations "$ITERS" --subgroup-size 1e8 --policy dos \
     --sweep ${SWEEP:-0,1/4,1/3,1/2,2/3,3/4,1,model} --report "$OUT/sweep13.json" 2>&1 | grep -vE "^\[starpu" | tail -30
fi
echo "total: $(( $(date +%s) - t0 )) s"
