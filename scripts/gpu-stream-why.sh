#!/usr/bin/env bash
# On the GPU machine: why the runtime streams below the PCIe rate. Runs a standalone StarPU streaming
# probe when one is placed in .peers/probe (stream.c, stream_cuda.cu; git-ignored, not part of this
# repository; skipped otherwise) beside `dos-bench stream`
# under measurement switches (DOS_HOST_ALLOC=starpu, DOS_WONT_USE=0, DOS_BIND=0,
# STARPU_CUDA_PIPELINE=4), and a 7B `gpu`-policy run with a timeline.
# On the GPU machine, with .deps/cache (and .peers/probe) present; outputs go to $OUT:
#   scripts/gpu-stream-why.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-stream-out}
mkdir -p "$OUT"
t0=$(date +%s)
"$ROOT/scripts/setup.sh" build > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. "$ROOT/.deps/env.sh"
SP=$(ls -d "$ROOT"/.deps/starpu-1.3.10*/ | head -1)
if [ -f "$ROOT/.peers/probe/stream.c" ]; then
  nvcc -O3 -arch=sm_90 -c "$ROOT/.peers/probe/stream_cuda.cu" -I"$SP/include/starpu/1.3" -o /tmp/sc.o &&
  gcc -O3 -march=native -fopenmp "$ROOT/.peers/probe/stream.c" /tmp/sc.o -I"$SP/include/starpu/1.3" \
      -I/usr/local/cuda/include -L"$SP/lib" -lstarpu-1.3 -L/usr/local/cuda/lib64 -lcudart -lstdc++ -lm -o /tmp/stream &&
  for wb in 2 3; do
    echo "== probe: stream 24 67108864 0 $wb 2 3"
    STARPU_NCPU=1 OMP_NUM_THREADS=14 OMP_PROC_BIND=close OMP_PLACES=cores STARPU_WORKERS_NOBIND=1 \
      timeout 60 /tmp/stream 24 67108864 0 $wb 2 3 2>&1 | grep -E "^iter|^mode"
  done
fi
B="$ROOT/build/bench/dos-bench stream --n 1.6e9 --subgroup-size 67108864 --reps 2 --variants 3:eager"
bench() { echo "== dos-bench stream, $1"; shift; env "$@" timeout 90 $B 2>&1 | grep -vE "^\[starpu|^dos-bench stream:|^lookahead" ; }
bench "as is" DOS_X=1
bench "DOS_HOST_ALLOC=starpu" DOS_HOST_ALLOC=starpu
bench "DOS_WONT_USE=0" DOS_WONT_USE=0
bench "DOS_BIND=0" DOS_BIND=0
bench "STARPU_CUDA_PIPELINE=4" STARPU_CUDA_PIPELINE=4
bench "DOS_HOST_ALLOC=starpu DOS_WONT_USE=0" DOS_HOST_ALLOC=starpu DOS_WONT_USE=0
echo "== llama2-7b shard 0/4 policy gpu, timeline"
timeout 90 "$ROOT/build/examples/dos-train" --preset llama2-7b --shard 0/4 --subgroup-size 67108864 -n 3 --policy gpu \
  --timeline "$OUT/7b-gpu-timeline.json" 2>&1 | grep -E "^(iter|summary)"
echo "total: $(( $(date +%s) - t0 )) s"
