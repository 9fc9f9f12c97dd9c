#!/usr/bin/env bash
# On the GPU machine: build from .deps/cache (offline), then the update phase's performance runs:
# GPU tests (TESTS: meson test names, "all" for the whole suite, "" for none), dos-bench overhead,
# the tiny preset's phase under several policies, timelines of the 20B quarter (dos and gpu), the
# Llama-2 13B quarter's sweep of the streamed fraction. Outputs go to $OUT (default
# ./gpu-perf-out). On the GPU machine, with .deps/cache present:
#   scripts/gpu-perf.sh
# DOS_BUILD_DIR: the build folder (default build). PARTS (default "tests overhead tiny timeline sweep";
# also "frameworks", "trainer" and "train") picks the parts; ITERS (default 4). BIG_RUNS lines may name another
# --shard (the last one given wins), e.g. "q3on --shard 3/4 --policy dos --emulate-compute --overlap on".
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
  tests=${TESTS-kernels-cuda optimizer-gpu-cuda-bf16-adamw optimizer-dos-cuda-bf16-adamw optimizer-dmda-cuda-bf16-adamw train-cpu-vs-gpu-bitwise train-cpu-vs-dos-static train-grad-staging train-emulated-iteration}
  [ "$tests" = all ] && tests=""
  meson test -C "$BUILD" --print-errorlogs $tests > "$OUT/tests.log" 2>&1
  grep -E "^ *[0-9]+/[0-9]+ " "$OUT/tests.log" | sed 's/  */ /g'
  grep -E "^(Ok|Fail|Skipped|Timeout):" "$OUT/tests.log" | tr '\n' ' '; echo
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
# BIG_RUNS: one 20B quarter run per line, "LABEL ARGS..." (the timeline of each is kept)
if has timeline; then
  while read -r label args; do
    [ -n "$label" ] || continue
    echo "== 20B quarter, $label: $args"
    "$D" "${BIG[@]}" $args --timeline "$OUT/tl20-$label.json" --report "$OUT/r20-$label.json" 2>&1 \
      | grep -vE "^\[starpu" | grep -E "^(model|iter|summary)|rror" | tail -$((ITERS + 3))
  done <<<"${BIG_RUNS:-dos --policy dos
gpu --policy gpu}"
fi
# SWEEP_ORDERS: the 13B sweep once per submission order
if has sweep; then
  for order in ${SWEEP_ORDERS:-cpu-first}; do
    echo "== sweep: llama2-13b --shard 0/4 --subgroup-size 1e8 --submit-order $order"
    "$D" --preset llama2-13b --shard 0/4 --iterations "$ITERS" --subgroup-size 1e8 --policy dos --submit-order "$order" \
       --sweep ${SWEEP:-0,1/4,1/3,1/2,2/3,3/4,1,model} --report "$OUT/sweep13-$order.json" 2>&1 | grep -vE "^\[starpu" \
       | grep -E "^(model|sweep|  )|rror"
  done
fi
# The Hugging Face Trainer and Lightning examples against torch.optim.AdamW (tests/test_frameworks.py),
# FRAMEWORK_POLICIES (default dos) only, each framework within FRAMEWORK_SECONDS (default 150)
if has frameworks; then
  for fw in hf lightning; do
    echo "== tests/test_frameworks.py --framework $fw --policies ${FRAMEWORK_POLICIES:-dos}"
    DOS_C_LIBRARY=$BUILD/libdos_c.so PYTHONPATH=$ROOT/python timeout "${FRAMEWORK_SECONDS:-150}" \
      python3 "$ROOT/tests/test_frameworks.py" --framework "$fw" --policies "${FRAMEWORK_POLICIES:-dos}" \
      > "$OUT/frameworks-$fw.log" 2>&1
    grep -E "^(ok|FAIL|[0-9]+ failure)|rror|verdicts|largest" "$OUT/frameworks-$fw.log" | tail -30
  done
fi
# The Hugging Face Trainer's speed, dos against ZeRO-Offload's recipe (scripts/gpu-trainer-speed.sh;
# its environment passes through; TRAINER_RUNS, default the runs within one memory bound, picks its
# RUNS: its own default, six runs of up to SECONDS_PER_RUN each, would not fit in one 600 s run)
if has trainer; then
  echo "== scripts/gpu-trainer-speed.sh"
  OUT=$OUT/trainer DOS_C_LIBRARY=$BUILD/libdos_c.so SECONDS_PER_RUN=${SECONDS_PER_RUN:-110} \
    RUNS=${TRAINER_RUNS:-dos-autograd-grads dos-samecap adamw-cpu-offload} \
    "$ROOT/scripts/gpu-trainer-speed.sh" 2>&1 | grep -vE "^\[starpu"
  (cd "$OUT" && rm -rf trainer/trainer-out && tar czf trainer.tgz trainer && rm -rf trainer)
fi
# PyTorch: the 1.01e9-parameter GPT of scripts/gpu-train.sh, short runs (TRAIN_SECONDS each for dos;
# RUNS and BATCH pass through, e.g. RUNS="dos dos-overlap" BATCH=32 for the overlap)
if has train; then
  echo "== scripts/gpu-train.sh (short)"
  OUT=$OUT/train DOS_C_LIBRARY=$BUILD/libdos_c.so TEST=0 DOS_SECONDS=${TRAIN_SECONDS:-30} ADAMW_SECONDS=10 \
    OFFLOAD_SECONDS=15 timeout 240 "$ROOT/scripts/gpu-train.sh" 2>&1 | grep -vE "^\[starpu" | tail -25
  (cd "$OUT" && tar czf train.tgz train && rm -rf train)
fi
# the timelines and reports in one archive (fewer files to copy back from the GPU machine)
(cd "$OUT" && tar czf perf-json.tgz *.json 2>/dev/null && rm -f *.json)
echo "total: $(( $(date +%s) - t0 )) s"
