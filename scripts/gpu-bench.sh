#!/usr/bin/env bash
# On the GPU machine (kernels at the memory roofs): dos-bench beside PyTorch's fused CPU
# AdamW (the peers' cpu_adam_only), and the CPU side of the update phase with one CPU worker running
# an OpenMP team against many single-threaded CPU workers. Build first (scripts/setup.sh build), or
# bring a build/ made on a machine of the same kind. The torch row runs only when an external PyTorch
# script with the command line dos_compare.py's --peers takes is kept at .peers/torch_update_phase.py
# (git-ignored, not part of this repository). On the GPU machine, with .deps/cache and .peers present:
#   scripts/setup.sh build >/dev/null && scripts/gpu-bench.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-2.68e8}
[ -f "$ROOT/.deps/env.sh" ] && . "$ROOT/.deps/env.sh"
echo "== dos-bench kernels --n $N (all cores)"
"$ROOT/build/bench/dos-bench" kernels --n "$N" --reps 5
echo "== dos-bench kernels --n $N, CPU side with 15 threads bound to cores 1-15"
OMP_NUM_THREADS=15 OMP_PLACES="{1}:15" OMP_PROC_BIND=close "$ROOT/build/bench/dos-bench" kernels --n "$N" --reps 5 | grep -E "^cpu"
if [ -f "$ROOT/.peers/torch_update_phase.py" ]; then
  echo "== torch fused CPU AdamW (peers: cpu_adam_only), same N"
  python3 "$ROOT/.peers/torch_update_phase.py" --n "$N" --s "$N" --variants cpu_adam_only --iters 3 2>&1 | tail -4
fi
echo "== machine: NUMA and transparent huge pages"
lscpu 2>/dev/null | grep -iE "^NUMA|^Model name" ; cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null
run_cpu() {  # label, env..., then dos-train options
  local label=$1; shift
  echo "== dos-train --policy cpu $label (llama2-7b shard 0/4)"
  env "$@" "$ROOT/build/examples/dos-train" --preset llama2-7b --shard 0/4 --iterations 4 --subgroup-size 1e8 \
     --policy cpu --cpu-threads 15 ${EXTRA:-} 2>&1 | grep -E "^\[dos\]|^summary"
}
run_cpu "1 worker x 15 threads, bound (default)" DOS_X=1
run_cpu "1 worker x 15 threads, unbound (DOS_BIND=0)" DOS_BIND=0
EXTRA="--cpu-workers 15" run_cpu "15 workers x 1 thread, bound" DOS_X=1
EXTRA="--device host" run_cpu "1 worker x 15 threads, bound, model in host memory (no PCIe)" DOS_X=1
