#!/usr/bin/env bash
# On the GPU machine (offline), from the repository root after `scripts/setup.sh build`: trains a
# GPT of 1.01e9 parameters (20 layers, hidden 2048, 16 heads, context 512, bf16 on the GPU,
# byte-level tokens of the Python standard library's sources) with examples/train_gpt.py three
# times, one process each:
#   1. --optimizer dos --policy dos      Deep Optimizer States (state in pinned host memory), up to
#                                        300 steps or DOS_SECONDS of training;
#   2. --optimizer adamw                 torch.optim.AdamW (fused) on fp32 master copies on the GPU;
#   3. --optimizer adamw-cpu-offload     ZeRO-Offload's recipe in PyTorch (fp32 state in pinned host
#                                        memory, torch's fused CPU AdamW, gradients down, bf16 up);
# and, when RUNS names them, 4. dos-overlap: --optimizer dos --overlap both (the update overlapped with
# backward and with the next forward; the same bits as run 1, which the summary checks step by step),
# 5. dos-overlap-urgent: the same with --urgent-writeback;
# then plots the loss curves and the optimizer step's seconds (PNG) and writes a summary table.
# Everything goes to $OUT (default ./gpu-train-out): *.log, *.json, train_gpt.png, summary.md.
# Total wall time about 5 minutes (each run is bounded by --time-limit and by `timeout`).
#
#   OUT=/some/dir scripts/gpu-train.sh
# Before them, tests/test_pytorch.py --device cuda --policy dos (the binding's test on the GPU; TEST=0
# skips it), log in $OUT/test-pytorch-cuda.log.
# Environment: RUNS (the runs, in order; default "dos adamw adamw-cpu-offload"; "dos dos-overlap" with
#   BATCH=32 measures the overlap), DOS_SECONDS (130), ADAMW_SECONDS (25), OFFLOAD_SECONDS (35),
#   OVERLAP_SECONDS (DOS_SECONDS): training seconds per run; TIMELINE_STEPS (10:12): the steps of which the
#   dos runs write a timeline ($OUT/NAME-timeline.json and .png: forward, backward, step() and the update
#   phase's tasks on one clock; those steps synchronise the GPU after forward to time it); TRAIN_ARGS: more train_gpt.py arguments for
#   every run (e.g. "--max-grad-norm 0 --deterministic");
#   STEPS (300), LAYERS (20), HIDDEN (2048), HEADS (16), SEQ (512), BATCH (8), SUBGROUP (5e7),
#   MODEL (builtin; auto uses Hugging Face transformers when installed), POLICY (dos), DEVICE (cuda;
#   cpu for a dry run of the script on a machine without a GPU, with small LAYERS/HIDDEN/SEQ),
#   DOS_C_LIBRARY (default build/libdos_c.so).
# Exit status: 0 when every run (and the binding's test, unless skipped) ended with status 0; 1
# otherwise (the summary and plot are still written), or before any run when no torch sees a GPU
# or DOS_C_LIBRARY names no file.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-train-out}
STEPS=${STEPS:-300} LAYERS=${LAYERS:-20} HIDDEN=${HIDDEN:-2048} HEADS=${HEADS:-16} SEQ=${SEQ:-512} BATCH=${BATCH:-8}
SUBGROUP=${SUBGROUP:-5e7} MODEL=${MODEL:-builtin} POLICY=${POLICY:-dos} DEVICE=${DEVICE:-cuda}
DOS_SECONDS=${DOS_SECONDS:-130} ADAMW_SECONDS=${ADAMW_SECONDS:-25} OFFLOAD_SECONDS=${OFFLOAD_SECONDS:-35}
OVERLAP_SECONDS=${OVERLAP_SECONDS:-$DOS_SECONDS} RUNS=${RUNS:-dos adamw adamw-cpu-offload}
TIMELINE_STEPS=${TIMELINE_STEPS:-10:12}
start=$(date +%s)
say() { printf '[gpu-train +%ds] %s\n' "$(( $(date +%s) - start ))" "$*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "cores: $(nproc), memory: $(free -g | awk '/^Mem:/{print $2 " GiB"}')"

if [ -n "${DOS_C_LIBRARY:-}" ] && [ ! -f "$DOS_C_LIBRARY" ]; then
  say "DOS_C_LIBRARY=$DOS_C_LIBRARY is not a file: give the path of a built libdos_c.so, or unset it"; exit 1
fi
LIB=${DOS_C_LIBRARY:-$ROOT/build/libdos_c.so}
if [ ! -f "$LIB" ] || [ ! -f .deps/env.sh ]; then
  say "$LIB missing: running scripts/setup.sh build"
  built=$(scripts/setup.sh build 2>&1) || { printf '%s\n' "$built" | tail -20; say "build failed"; exit 1; }
  printf '%s\n' "$built" | tail -5
fi
. .deps/env.sh
export DOS_C_LIBRARY=$LIB PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && DEVICE=$DEVICE "$p" -c 'import os, sys, torch
sys.exit(0 if os.environ["DEVICE"] == "cpu" or torch.cuda.is_available() else 1)' 2>/dev/null; then
    PY=$p; break
  fi
done
[ -n "$PY" ] || { say "no python3 here imports a torch that sees a GPU"; exit 1; }
mkdir -p "$OUT"
failed=0
say "python: $(command -v $PY), $($PY -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"

common=(--model "$MODEL" --n-layer "$LAYERS" --n-embd "$HIDDEN" --n-head "$HEADS" --seq-len "$SEQ"
        --batch-size "$BATCH" --steps "$STEPS" --dtype bf16 --device "$DEVICE" --lr 3e-4 --warmup 30 --schedule cosine
        --weight-decay 0.1 --max-grad-norm 1.0 --beta1 0.9 --beta2 0.95 --seed 1234 --print-every 10)
# TRAIN_ARGS: more arguments for every run, after these (a later one wins), e.g. "--max-grad-norm 0 --deterministic"
read -r -a extra_args <<< "${TRAIN_ARGS:-}"
common+=("${extra_args[@]}")

run() {  # name, seconds of training, extra arguments (the dos runs also write their timeline)
  local name=$1 secs=$2; shift 2
  case $name in dos*) set -- "$@" --timeline "$OUT/$name-timeline.json" --timeline-steps "$TIMELINE_STEPS" ;; esac
  say "== $name: examples/train_gpt.py ${common[*]} --time-limit $secs $*"
  timeout $(( secs + 90 )) "$PY" examples/train_gpt.py "${common[@]}" --time-limit "$secs" \
      --log-json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || failed=$((failed + 1))
  grep -vE '^\[starpu\]' "$OUT/$name.log" | grep -E '^(train_gpt|corpus|summary|time limit|\[dos\]|model|Traceback|[A-Za-z]*Error)|step +(1|10|50|100|150|200|250|300) ' | cut -c1-240
  say "$name finished (exit status $rc)"
}

if [ "${TEST:-1}" = 1 ] && [ "$DEVICE" = cuda ]; then
  # the binding's test on the GPU first (CUDA tensors, policy dos): losses against torch AdamW over 50
  # steps, state_dict round trip bit for bit, bad input; about 30 s
  say "== tests/test_pytorch.py --device cuda --policy dos"
  timeout 150 "$PY" tests/test_pytorch.py --device cuda --policy dos > "$OUT/test-pytorch-cuda.log" 2>&1
  rc=$?
  grep -E '^(losses|FAIL|[0-9]+ failure)' "$OUT/test-pytorch-cuda.log" | cut -c1-240
  say "test finished (exit status $rc; 77 = skipped)"
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || failed=$((failed + 1))
fi

for name in $RUNS; do
  case $name in
    dos) run dos "$DOS_SECONDS" --optimizer dos --policy "$POLICY" --subgroup-size "$SUBGROUP" --verbose ;;
    dos-overlap) run dos-overlap "$OVERLAP_SECONDS" --optimizer dos --policy "$POLICY" --subgroup-size "$SUBGROUP" \
                   --overlap both --verbose ;;
    dos-overlap-urgent) run dos-overlap-urgent "$OVERLAP_SECONDS" --optimizer dos --policy "$POLICY" \
                   --subgroup-size "$SUBGROUP" --overlap both --urgent-writeback --verbose ;;
    adamw) run adamw "$ADAMW_SECONDS" --optimizer adamw ;;
    adamw-cpu-offload) run adamw-cpu-offload "$OFFLOAD_SECONDS" --optimizer adamw-cpu-offload ;;
    *) say "RUNS: unknown run '$name' (dos, dos-overlap, dos-overlap-urgent, adamw, adamw-cpu-offload)"; exit 2 ;;
  esac
done

say "plotting"
OUT="$OUT" "$PY" - <<'EOF'
import json, os
out = os.environ["OUT"]
runs = {}
for name in ("dos", "dos-overlap", "dos-overlap-urgent", "adamw", "adamw-cpu-offload"):
    p = os.path.join(out, name + ".json")
    if os.path.exists(p):
        with open(p) as f:
            runs[name] = json.load(f)
rows = ["| optimizer | parameters | steps | loss first -> last | median forward+backward s | median optimizer step s "
        "| median update phase s | tokens/s | peak GPU GB (torch) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for name, r in runs.items():
    s = r["summary"]
    rows.append(f"| {name}{' (policy ' + s['policy'] + ')' if s.get('policy') else ''} | {s['params']:,} | {s['steps']} "
                f"| {s['first_loss']:.3f} -> {s['last_loss']:.3f} | {s.get('median_fwd_bwd_seconds', float('nan')):.3f} "
                f"| {s['median_opt_seconds']:.3f} | {s['median_phase_seconds']:.3f} | {s['median_tokens_per_s']:.0f} "
                f"| {s['max_gpu_memory_gb']:.1f} |")
text = "\n".join(rows)
for other in ("dos-overlap", "dos-overlap-urgent"):
    if "dos" not in runs or other not in runs:
        continue
    a, b = runs["dos"], runs[other]
    n = min(len(a["steps"]), len(b["steps"]))
    same = sum(1 for x, y in zip(a["steps"][:n], b["steps"][:n]) if x["loss"] == y["loss"])
    worst = max((abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a["steps"][:n], b["steps"][:n])), default=0)
    text += (f"\n\n{other} against dos: tokens/s {b['summary']['median_tokens_per_s'] / a['summary']['median_tokens_per_s']:.2f}x; "
             f"over their first {n} steps {same} losses equal bit for bit, largest relative difference {worst:.2e}; "
             f"{b['summary'].get('redone_steps', 0)} step(s) with speculative updates redone")
print(text)
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(text + "\n")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not importable: no PNG")
    raise SystemExit(0)
fig, ax = plt.subplots(1, 2, figsize=(13, 4.8))
colors = {"dos": "C0", "adamw": "C1", "adamw-cpu-offload": "C2", "dos-overlap": "C4", "dos-overlap-urgent": "C5"}
for name, r in runs.items():
    st = r["steps"]
    ax[0].plot([x["step"] for x in st], [x["loss"] for x in st], label=name, lw=1.2, color=colors[name])
    ax[1].plot([x["step"] for x in st], [x["opt_seconds"] for x in st], label=name + ": optimizer step", lw=1.2,
               color=colors[name])
    if name == "dos":
        ax[1].plot([x["step"] for x in st], [x["phase_seconds"] for x in st], label="dos: runtime's update phase",
                   lw=1, ls="--", color="C3")
p = next(iter(runs.values()))["summary"]["params"] if runs else 0
ax[0].set(xlabel="step", ylabel="loss (nats per byte)",
          title=f"GPT, {p / 1e9:.2f}e9 parameters, bf16, byte-level" if p >= 1e8 else f"GPT, {p:,} parameters")
ax[1].set(xlabel="step", ylabel="seconds", yscale="log", title="optimizer step (gradients ready -> parameters updated)")
for a in ax:
    a.grid(alpha=0.3)
    a.legend()
fig.tight_layout()
fig.savefig(os.path.join(out, "train_gpt.png"), dpi=110)
print("wrote", os.path.join(out, "train_gpt.png"))
EOF
say "done: $OUT"
[ $failed -eq 0 ] || { say "$failed run(s) failed: see their logs in $OUT"; exit 1; }
