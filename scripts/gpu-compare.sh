#!/usr/bin/env bash
# On the GPU machine, the side by side: dos-compare on the 20B preset's shard 1/4 (subgroups
# of 1.24e8, update budget 40 GB, or 30 GB on an 80 GB GPU: scripts/update-budget.sh;
# forward/backward emulated with 4096 tokens) with PyTorch baselines in the same script: the
# repository's own (BASELINES=1) and, when an external PyTorch script with the command line
# dos_compare.py's --peers takes is kept at .peers/torch_update_phase.py (git-ignored, not part of
# this repository), that one as well. On the GPU machine, with
# .deps/cache (and .peers) present; outputs go to $OUT:
#   BASELINES=1 scripts/gpu-compare.sh
# Before the measured runs, dmda's and dmdas' perfmodels are trained afresh (MODEL_POLICIES, default
# "dmda dmdas"; CALIBRATION_ITERS, default 5) in $OUT/perfmodels, then frozen.
# PART=main: dos, cpu, dmda, dmdas, gpu, lws (+ RUNS, extra --run entries) and the peers zero_offload and
#            dos_stride:2..4
# PART=budgets: resident budgets 10GB, 20GB, 31.5GB (dos and static:R) and the twinflow peers
# COMMON: extra dos-train arguments for every run (e.g. --grad-transfer native)
# ITERS: iterations per run (default 4; medians over iterations 2..ITERS). A fresh process's first phases
#        run plans chosen at freshly calibrated rates, which the refinement moves over about five phases:
#        ITERS=8 measures closer to the steady state a training run sees (the repository's baselines
#        run as many phases; the external peers time dos_compare.py's --peer-iters phases, 3, either way).
# BASELINES=1: the repository's PyTorch baselines too (dos_compare.py --baselines: BASELINE_LIST, default
#            zero_offload and stride:2..4, in PART=main, twinflow:R per budget in PART=budgets); REPEATS=R: R
#            rounds of every run, the baselines and the peers; PEER_VARIANTS: the external peers' variants in PART=main (default zero_offload and
#            dos_stride:2..4); POLICIES: the policies of PART=main (default dos,cpu,dmda,dmdas,gpu,lws)
# HOST_BENCH=0: no second bound; by default dos_compare.py's --host-bench measures CPU Adam and DMA with
#            dos-bench host after the first round's runs and prints each run's % of the lower bound at
#            those rates beside its % of the model's own bound
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-compare-out}
PART=${PART:-main}
mkdir -p "$OUT"
t0=$(date +%s)
"$ROOT/scripts/setup.sh" build > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
. "$ROOT/.deps/env.sh"
PEERS=()
[ -f "$ROOT/.peers/torch_update_phase.py" ] && PEERS=(--peers "$ROOT/.peers/torch_update_phase.py")
PEERS+=(--repeats "${REPEATS:-1}" --peer-variants "${PEER_VARIANTS:-zero_offload,dos_stride:2,dos_stride:3,dos_stride:4}")
BASE=()
PROBE=(--host-bench)
[ "${HOST_BENCH:-1}" = 0 ] && PROBE=()
# the update budget: 40GB, 30GB on an 80 GB GPU, or UPDATE_BUDGET (update-budget.sh)
ARGS=(--preset llama-20b --shard 1/4 --subgroup-size 1.24e8 -n "${ITERS:-4}"
      --gpu-update-budget "$("$ROOT/scripts/update-budget.sh" 2>> "$OUT/setup.log")" --emulate-compute
      --tokens 4096 ${COMMON:-})
# StarPU's history perfmodels start empty (a fresh sampling folder, so that no time measured by an
# earlier build, e.g. one with StarPU's task profiling on, reaches dmda or dmdas), are trained by
# one run per built-in model policy with STARPU_CALIBRATE=1, then frozen (STARPU_CALIBRATE=0) for the
# measured runs: dmda and dmdas plan with task times measured on this machine, by this script.
export STARPU_PERF_MODEL_DIR=$OUT/perfmodels STARPU_HOSTNAME=dos-compare
rm -rf "$STARPU_PERF_MODEL_DIR"; mkdir -p "$STARPU_PERF_MODEL_DIR"
for p in ${MODEL_POLICIES-dmda dmdas}; do
  STARPU_CALIBRATE=1 "$ROOT/build/examples/dos-train" "${ARGS[@]}" --policy "$p" -n "${CALIBRATION_ITERS:-5}" \
    > "$OUT/calibrate-$p.log" 2>&1 || { echo "the $p calibration run failed: $OUT/calibrate-$p.log"; tail -5 "$OUT/calibrate-$p.log"; }
  echo "$p perfmodels calibrated: $(grep -h '^summary' "$OUT/calibrate-$p.log")"
done
export STARPU_CALIBRATE=0
if [ "$PART" = main ]; then
  [ -n "${BASELINES:-}" ] && BASE=(--baselines "${BASELINE_LIST:-zero_offload,stride:2,stride:3,stride:4}")
  extra=()
  [ -n "${RUNS:-}" ] && while IFS= read -r r; do [ -n "$r" ] && extra+=(--run "$r"); done <<<"$RUNS"
  python3 "$ROOT/examples/dos_compare.py" --policies "${POLICIES:-dos,cpu,dmda,dmdas,gpu,lws}" "${extra[@]}" \
    "${PEERS[@]}" "${BASE[@]}" "${PROBE[@]}" --timeline --out "$OUT/main" -- "${ARGS[@]}" 2>&1 | grep -v "^\[starpu"
else
  [ -n "${BASELINES:-}" ] && BASE=(--baselines "")  # only the twinflow:R of each budget
  python3 "$ROOT/examples/dos_compare.py" --policies "" --resident-budgets 10GB,20GB,31.5GB "${PEERS[@]}" "${BASE[@]}" "${PROBE[@]}" \
    --out "$OUT/budgets" -- "${ARGS[@]}" 2>&1 | grep -v "^\[starpu"
fi
# each run's rates, plans and summaries, and its phases one line each (seconds, sides, prediction
# and bound; the bytes and busy fractions left in the logs), so that the script's own output holds them
for f in "$OUT"/*/*.log; do
  grep -h -E "^(model|iter|summary)" "$f" | sed -E 's/  H2D .*$//' | cut -c1-200 | sed "s|^|$(basename "$f" .log): |"
done | grep -E "model:|summary|: iter " | head -120
rm -f "$OUT"/*/*.safetensors
echo "total: $(( $(date +%s) - t0 )) s"
