#!/usr/bin/env bash
# On the GPU machine: set up and build from .deps/cache (offline), run the test suite (GPU tests
# included), then dos-train on a Llama-2 7B shard under cpu, gpu and dmda. Reports go to $OUT (or
# ./gpu-check-out). On the GPU machine, with .deps/cache present:  scripts/gpu-check.sh
#   SHARD (default 0/4), ITERS (default 4), SUBGROUP (default 1e8), SWEEP=0 skips the Llama-2 13B sweep,
#   HOSTRUN=1 adds a cpu run with the model's buffers in host memory
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
SHARD=${SHARD:-0/4} ITERS=${ITERS:-4} SUBGROUP=${SUBGROUP:-1e8}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
nproc | sed 's/^/cores: /'
start=$(date +%s)
"$ROOT/scripts/setup.sh" test 2>&1 | tee "$OUT/setup-test.log" | grep -vE "^\s*$" | tail -40
echo "setup+build+tests: $(( $(date +%s) - start )) s"
. "$ROOT/.deps/env.sh"
cp "$ROOT/build/meson-logs/testlog.txt" "$OUT/" 2>/dev/null
for policy in cpu gpu dmda dos static:0.5; do
  echo "== dos-train --preset llama2-7b --shard $SHARD --policy $policy"
  "$ROOT/build/examples/dos-train" --preset llama2-7b --shard "$SHARD" --iterations "$ITERS" \
     --subgroup-size "$SUBGROUP" --policy "$policy" --report "$OUT/llama2-7b-${policy/:/-}.json" 2>&1 \
     | grep -vE "^\[starpu\]" | tail -$((ITERS + 5))
done
if [ "${HOSTRUN:-0}" = 1 ]; then
  echo "== dos-train --preset llama2-7b --shard $SHARD --policy cpu --device host (model buffers in host memory: no PCIe)"
  "$ROOT/build/examples/dos-train" --preset llama2-7b --shard "$SHARD" --iterations "$ITERS" --device host \
     --subgroup-size "$SUBGROUP" --policy cpu --report "$OUT/llama2-7b-cpu-host.json" 2>&1 | tail -$((ITERS + 3))
fi
if [ "${SWEEP:-1}" = 1 ]; then
  echo "== sweep: dos-train --preset llama2-13b --shard 0/4 --policy dos --sweep ..."
  "$ROOT/build/examples/dos-train" --preset llama2-13b --shard 0/4 --iterations "$ITERS" --subgroup-size "$SUBGROUP" \
     --policy dos --sweep 0,1/4,1/3,1/2,2/3,3/4,0.85,1,model --report "$OUT/llama2-13b-sweep.json" 2>&1 \
     | grep -vE "^\[starpu\]" | grep -E "^(model|sweep|  |dos-train|\[dos\])|\[model\]|\[1/2\]"
fi
