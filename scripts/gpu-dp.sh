#!/usr/bin/env bash
# On nvidia-h200-x2 (2 GPUs, 32 cores): the data-parallel runs. The same model on 1 rank
# (one GPU, all cores) and on 2 ranks (one GPU each, the cores split by dos-train near each GPU),
# with the collectives through NCCL (GPU buffers) and through MPI (host buffers). On that machine,
# with .deps/cache present; outputs go to $OUT:
#   scripts/gpu-dp.sh
# PART=check: build, the machine's topology, the test train-nccl-2ranks
# PART=scale: the model below on 1 rank (--ncuda 1), on 2 ranks with NCCL and on 2 ranks with MPI
#             (MPI_ITERATIONS iterations, default 5: its host collectives take seconds), and the table
# PART=all (default): both
# MODEL: the dos-train arguments (default: llama2-7b, subgroups of 1e8, 8 iterations, 40 GB update
# budget, policy dos). NVLink multicast stays off as the machine sets it (NCCL_NVLS_ENABLE=0 ...).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-dp-out}
PART=${PART:-all}
mkdir -p "$OUT"
t0=$(date +%s)
# NCCL: beside CUDA, or else the Python wheel's (nvidia-nccl-cu13), linked through .deps/nccl
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  d=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$d" ] && [ -f "$d/include/nccl.h" ]; then
    mkdir -p "$ROOT/.deps/nccl/lib"
    ln -sfn "$d/include" "$ROOT/.deps/nccl/include"
    ln -sf "$d"/lib/libnccl.so.* "$ROOT/.deps/nccl/lib/"
    ln -sf "$(ls "$d"/lib/libnccl.so.* | head -1)" "$ROOT/.deps/nccl/lib/libnccl.so"
    export MESON_OPTIONS="${MESON_OPTIONS:-} -Dnccl_dir=$ROOT/.deps/nccl"
    export LD_LIBRARY_PATH="$ROOT/.deps/nccl/lib:${LD_LIBRARY_PATH:-}"
    echo "NCCL from $d"
  fi
fi
export MESON_OPTIONS="${MESON_OPTIONS:-} -Dgpu_arch=90"
"$ROOT/scripts/setup.sh" build > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
grep -E "NCCL|MPI  |CUDA  " "$OUT/setup.log" | head -5
echo "build: $(( $(date +%s) - t0 )) s"
. "$ROOT/.deps/env.sh"
B=${DOS_BUILD_DIR:-$ROOT/build}
TRAIN=$B/examples/dos-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=()
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS LD_LIBRARY_PATH; do
  [ -n "${!v:-}" ] && pass+=(-x "$v")
done
read -r -a M <<<"${MODEL:---preset llama2-7b --subgroup-size 1e8 -n 8 --gpu-update-budget 40GB --policy dos}"
MPI=(mpirun -np 2 --bind-to none "${pass[@]}")
show() { grep -E "^(dos-train:|data parallel|  rank|model:|iter|summary)" "$1" | cut -c1-330; }

if [ "$PART" != scale ]; then
  env | grep -E "^(NCCL|NVSHMEM|TORCH_SYMM)" | sort
  nvidia-smi topo -m 2>&1 | head -8
  lscpu | grep -E "^(NUMA|Model name|CPU\(s\))"
  (cd "$B" && meson test ${TESTS:-train-nccl-2ranks} --print-errorlogs 2>&1 | grep -E "^ *[0-9]+/[0-9]+ |ok:|FAIL")
  grep -hE "ok:|FAIL|^(data parallel|  rank)|rror" "$B/meson-logs/testlog.txt" | head -30
fi
if [ "$PART" != check ]; then
  t1=$(date +%s)
  timeout 300 "$TRAIN" "${M[@]}" --ncuda 1 --report "$OUT/w1.json" > "$OUT/w1.log" 2>&1
  echo "1 rank: exit $? in $(( $(date +%s) - t1 )) s"; show "$OUT/w1.log"
  t1=$(date +%s)
  timeout 300 "${MPI[@]}" "$TRAIN" "${M[@]}" --comm nccl --report "$OUT/w2-nccl.json" > "$OUT/w2-nccl.log" 2>&1
  echo "2 ranks, NCCL: exit $? in $(( $(date +%s) - t1 )) s"; show "$OUT/w2-nccl.log"
  if [ "${MPI_ITERATIONS:-5}" -gt 0 ]; then
    t1=$(date +%s)
    timeout 300 "${MPI[@]}" "$TRAIN" "${M[@]}" -n "${MPI_ITERATIONS:-5}" --comm mpi --report "$OUT/w2-mpi.json" \
      > "$OUT/w2-mpi.log" 2>&1
    echo "2 ranks, MPI: exit $? in $(( $(date +%s) - t1 )) s"; show "$OUT/w2-mpi.log"
  fi
  if [ -n "${EMULATE:-}" ]; then  # the whole iteration: forward and backward emulated (cuBLAS), EMULATE tokens per rank
    t1=$(date +%s)
    timeout 300 "$TRAIN" "${M[@]}" --ncuda 1 --emulate-compute --tokens "$EMULATE" --report "$OUT/e1.json" > "$OUT/e1.log" 2>&1
    echo "1 rank, emulated iteration: exit $? in $(( $(date +%s) - t1 )) s"; show "$OUT/e1.log"
    t1=$(date +%s)
    timeout 300 "${MPI[@]}" "$TRAIN" "${M[@]}" --comm nccl --emulate-compute --tokens "$EMULATE" --report "$OUT/e2-nccl.json" \
      > "$OUT/e2-nccl.log" 2>&1
    echo "2 ranks, NCCL, emulated iteration: exit $? in $(( $(date +%s) - t1 )) s"; show "$OUT/e2-nccl.log"
  fi
  python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
def load(name):
    files = sorted(glob.glob(os.path.join(out, name + "*.json")))
    return [json.load(open(f)) for f in files]
def med(xs): return statistics.median(xs) if xs else float("nan")
rows = []
for name, label in [("w1", "1 rank"), ("w2-nccl", "2 ranks, NCCL"), ("w2-mpi", "2 ranks, MPI"),
                    ("e1", "1 rank, emulated iteration"), ("e2-nccl", "2 ranks, NCCL, emulated iteration")]:
    reps = load(name)
    if not reps: continue
    its = [r["iterations"][1:] or r["iterations"] for r in reps]   # iterations 2.. (the first warms up)
    upd = max(med([i["update_seconds"] for i in it]) for it in its)      # the slowest rank's median
    comm = max(med([i.get("comm_seconds", 0.0) for i in it]) for it in its)
    whole = max(med([i.get("iteration_seconds", 0.0) for i in it]) for it in its)
    rows.append((label, len(reps), sum(r["params"] for r in reps), upd, comm, whole))
print("| run | ranks | parameters | update s (slowest rank, median) | comm s | update + comm s | iteration s | scaling efficiency |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
base = {}
for label, w, n, upd, comm, whole in rows:
    kind = "emulated" if "emulated" in label else "update"
    # strong scaling of the update phase (+ comm); for the emulated iteration, tokens per second
    # (every rank runs its own tokens): efficiency = throughput(W) / (W x throughput(1))
    t = whole if kind == "emulated" else upd + comm
    if w == 1: base[kind] = t
    eff = (base[kind] / (w * t) if kind == "update" else base[kind] / t) if kind in base else float("nan")
    print(f"| {label} | {w} | {n} | {upd:.3f} | {comm:.3f} | {upd + comm:.3f} | {whole:.3f} | {eff:.2f} |")
PY
fi
echo "total: $(( $(date +%s) - t0 )) s"
