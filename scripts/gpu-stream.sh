#!/usr/bin/env bash
# On the GPU machine (streaming at the PCIe rate, budgets, a realistic iteration):
# builds, runs the GPU tests of the update phase, `dos-bench stream` (the runtime's streaming
# variants against the duplex PCIe roof, same process), the 7B quarter under the old and the new
# streaming, and the 20B quarter with the update budget and the emulated forward/backward.
# On the GPU machine, with .deps/cache present:
#   scripts/gpu-stream.sh
# Outputs (reports, timelines) go to $OUT (default ./gpu-stream-out). PART selects pieces (default all):
#   PART="tests bench 7b 20b"
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-stream-out}
PART=${PART:-tests bench 7b 20b}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
t0=$(date +%s)
"$ROOT/scripts/setup.sh" build > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. "$ROOT/.deps/env.sh"
TRAIN="$ROOT/build/examples/dos-train"
has() { case " $PART " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
  echo "== GPU tests of the update phase"
  (cd "$ROOT/build" && timeout 240 meson test --no-rebuild kernels-cuda optimizer-gpu-cuda-bf16-adamw \
     optimizer-gpu-cuda-fp16-adam optimizer-dos-cuda-bf16-adamw optimizer-gpu-host-fp16-adamw \
     train-cpu-vs-gpu-bitwise train-cpu-vs-dos-static train-resume 2>&1 | grep -E "^ *[0-9]+/|^Ok|^Fail")
  cp "$ROOT/build/meson-logs/testlog.txt" "$OUT/" 2>/dev/null
fi
if has bench; then
  echo "== dos-bench stream (policy gpu, 1.6e9 bf16 parameters, subgroups of 2^26)"
  timeout 200 "$ROOT/build/bench/dos-bench" stream --n 1.6e9 --subgroup-size 67108864 --reps 3 \
     --variants 3:eager 0:eager 0:end 8:eager 2>&1 | grep -v "^\[starpu"
fi
train7b() {  # label, then options
  local label=$1; shift
  echo "== llama2-7b shard 0/4, $label"
  timeout 120 "$TRAIN" --preset llama2-7b --shard 0/4 --subgroup-size 1e8 -n 4 "$@" 2>&1 \
    | grep -E "^(iter|summary|model|\[dos\])" | grep -v "^\[dos\] policy"
}
if has 7b; then
  train7b "dos, lookahead 3, eager write-back (new default)" --policy dos --report "$OUT/7b-dos.json"
  train7b "gpu, lookahead 3, eager" --policy gpu --timeline "$OUT/7b-gpu-timeline.json"
  train7b "static:0.5 (half resident)" --policy static:0.5
  train7b "cpu" --policy cpu
fi
if has 20b; then
  echo "== llama-20b shard 1/4, update budget 40GB, emulated forward/backward (4096 tokens)"
  timeout 240 "$TRAIN" --preset llama-20b --shard 1/4 --subgroup-size 1.24e8 -n 4 --policy dos \
     --gpu-update-budget 40GB --emulate-compute --tokens 4096 --report "$OUT/20b-dos.json" \
     --timeline "$OUT/20b-dos-timeline.json" 2>&1 | grep -E "^(iter|summary|model|compute|dos-train|\[dos\])"
fi
echo "total: $(( $(date +%s) - t0 )) s"
