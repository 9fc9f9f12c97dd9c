#!/usr/bin/env bash
# On the GPU machine (offline), from the repository root after `scripts/setup.sh build`: the Hugging
# Face Trainer's speed with the repository's optimizer against ZeRO-Offload's recipe, one process
# per run, with examples/hf_trainer.py: a LlamaForCausalLM of about 1.07e9 parameters (LAYERS 16, HIDDEN 2048,
# HEADS 16, SEQ 512; fp32 parameters, bf16 mixed precision, the Trainer's clipping at 1.0, cosine
# schedule), BATCH 8, STEPS 20 optimizer steps, each run's GPU memory bounded by TOTAL_GB (20) GB, in
# which AdamW's state does not fit beside the model (fp32 parameters, gradients and AdamW's two
# moments take 16 bytes per parameter, 17.2 GB, and the activations about 7 GB more). Runs (RUNS):
#   dos                --optimizer dos --policy POLICY (dos): torch capped at TOTAL_GB - UPDATE_GB,
#                      the runtime's update phase at UPDATE_GB (4) GB (--gpu-update-budget-gb)
#   dos-samecap        the same with torch capped at TOTAL_GB, as the recipe's, and the update phase's
#                      UPDATE_GB on top (dos keeps a gradient buffer of 4 bytes per fp32 parameter from
#                      construction on, where the recipe's gradients exist from backward to the step:
#                      under TOTAL_GB - UPDATE_GB the 1.07e9 model ran out of memory in forward)
#   dos-autograd-grads dos's caps with --no-flat-gradients (the gradients where autograd puts them:
#                      no gradient memory between steps, as the recipe)
#   adamw-cpu-offload  --optimizer adamw-cpu-offload: torch capped at TOTAL_GB
#   adamw              --optimizer adamw (on the GPU): torch capped at TOTAL_GB (expected: out of memory)
#   adamw-nocap        --optimizer adamw without a cap (the GPU's own speed)
# adamw-cpu-offload is ZeRO-Offload's recipe re-created in PyTorch (copies after backward, torch's CPU
# AdamW), not DeepSpeed itself. Each run's log and JSON go to $OUT (default ./gpu-trainer-speed-out); summary.md tabulates the
# Trainer's train_samples_per_second, the steady samples/s (median step after the first), the peak
# GPU memory torch allocated and the device memory in use at the end (all allocators: the runtime's
# buffers too) and how far that is from TOTAL_GB (the CUDA context's few hundred MB included), and the
# ratio of dos to the offload recipe.
#   OUT=/some/dir scripts/gpu-trainer-speed.sh
# Environment: RUNS, LAYERS, HIDDEN, HEADS, SEQ, BATCH, STEPS, TOTAL_GB, UPDATE_GB, POLICY, SUBGROUP (1e8),
# DOS_C_LIBRARY (default build/libdos_c.so), SECONDS_PER_RUN (240: each run's timeout).
# Exit status: 0 when every run ended as expected (status 0; for adamw, 0 or 3: out of GPU memory);
# 1 otherwise (summary.md is still written), or before any run when no python3 here imports torch
# (seeing a GPU) and transformers, or the library is missing.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-trainer-speed-out}
LAYERS=${LAYERS:-16} HIDDEN=${HIDDEN:-2048} HEADS=${HEADS:-16} SEQ=${SEQ:-512} BATCH=${BATCH:-8}
STEPS=${STEPS:-20} TOTAL_GB=${TOTAL_GB:-20} UPDATE_GB=${UPDATE_GB:-4} POLICY=${POLICY:-dos} SUBGROUP=${SUBGROUP:-1e8}
RUNS=${RUNS:-dos dos-autograd-grads dos-samecap adamw-cpu-offload adamw adamw-nocap} SECONDS_PER_RUN=${SECONDS_PER_RUN:-240}
[ -f .deps/env.sh ] && . .deps/env.sh
export DOS_C_LIBRARY=${DOS_C_LIBRARY:-$ROOT/build/libdos_c.so} PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 STARPU_SILENT=1
[ -f "$DOS_C_LIBRARY" ] || { echo "$DOS_C_LIBRARY is not a file: run scripts/setup.sh build, or give DOS_C_LIBRARY"; exit 1; }
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import sys, torch, transformers
sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PY=$p; break
  fi
done
[ -n "$PY" ] || { echo "no python3 here imports torch (seeing a GPU) and transformers: run this on the GPU machine"; exit 1; }
mkdir -p "$OUT"
failed=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
common=(--model llama --n-layer "$LAYERS" --hidden "$HIDDEN" --heads "$HEADS" --seq-len "$SEQ"
        --batch-size "$BATCH" --steps "$STEPS" --bf16 --device cuda --lr 3e-4 --warmup 5 --max-grad-norm 1.0
        --subgroup-size "$SUBGROUP" --policy "$POLICY" --output-dir "$OUT/trainer-out")
for name in $RUNS; do
  case $name in
    dos) extra=(--optimizer dos --gpu-memory-gb "$(python3 -c "print($TOTAL_GB - $UPDATE_GB)")"
                --gpu-update-budget-gb "$UPDATE_GB") ;;
    dos-autograd-grads) extra=(--optimizer dos --gpu-memory-gb "$(python3 -c "print($TOTAL_GB - $UPDATE_GB)")"
                               --gpu-update-budget-gb "$UPDATE_GB" --no-flat-gradients) ;;
    dos-samecap) extra=(--optimizer dos --gpu-memory-gb "$TOTAL_GB" --gpu-update-budget-gb "$UPDATE_GB") ;;
    adamw-cpu-offload) extra=(--optimizer adamw-cpu-offload --gpu-memory-gb "$TOTAL_GB") ;;
    adamw) extra=(--optimizer adamw --gpu-memory-gb "$TOTAL_GB") ;;
    adamw-nocap) extra=(--optimizer adamw) ;;
    *) echo "RUNS: unknown run '$name' (dos, dos-autograd-grads, dos-samecap, adamw-cpu-offload, adamw, adamw-nocap)"; exit 2 ;;
  esac
  echo "== $name: examples/hf_trainer.py ${common[*]} ${extra[*]}"
  rm -f "$OUT/$name.json"  # a run that dies leaves no figures of an earlier call behind
  timeout "$SECONDS_PER_RUN" "$PY" examples/hf_trainer.py "${common[@]}" "${extra[@]}" \
    --log-json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "exit status $rc (3: out of GPU memory)"
  [ $rc -eq 0 ] || { [ "$name" = adamw ] && [ $rc -eq 3 ]; } || failed=$((failed + 1))
  grep -E "^(hf_trainer|speed|summary)|Error" "$OUT/$name.log" | cut -c1-300
done
rm -rf "$OUT/trainer-out"  # the Trainer's output folder (no checkpoints are asked for)
OUT="$OUT" RUNS="$RUNS" TOTAL_GB="$TOTAL_GB" python3 - <<'EOF'
import json, os
out = os.environ["OUT"]
total = float(os.environ["TOTAL_GB"])
rows = ["| run | parameters | torch's GPU cap GB | result | Trainer samples/s | steady samples/s | s per step "
        f"| peak torch GPU GB | device in use GB | in use - {total:g} GB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
runs = {}
for name in os.environ["RUNS"].split():
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        rows.append(f"| {name} | - | - | no figures (see {name}.log) | - | - | - | - | - | - |")
        continue
    s = json.load(open(p))["summary"]
    runs[name] = s
    f = lambda x, fmt: "-" if x is None else format(x, fmt)
    res = "out of memory" if s.get("out_of_memory") else f"{s['steps']} steps"
    rows.append(f"| {name} | {s['params']:,} | {f(s.get('gpu_memory_cap_gb'), 'g')} | {res} "
                f"| {f(s.get('train_samples_per_second'), '.2f')} | {f(s.get('steady_samples_per_second'), '.2f')} "
                f"| {f(s.get('median_step_seconds'), '.4f')} | {f(s.get('max_gpu_memory_gb'), '.2f')} "
                f"| {f(s.get('device_memory_used_gb'), '.2f')} "
                f"| {f(None if s.get('device_memory_used_gb') is None else s['device_memory_used_gb'] - total, '+.2f')} |")
text = "\n".join(rows)
b = runs.get("adamw-cpu-offload")
keys = ("steady_samples_per_second", "train_samples_per_second")
for name in ("dos", "dos-autograd-grads", "dos-samecap"):
    a = runs.get(name)
    if a and b and all(a.get(k) and b.get(k) for k in keys):
        text += (f"\n\n{name} against adamw-cpu-offload: steady samples/s {a[keys[0]] / b[keys[0]]:.2f}x"
                 f", Trainer samples/s {a[keys[1]] / b[keys[1]]:.2f}x")
print(text)
open(os.path.join(out, "summary.md"), "w").write(text + "\n")
EOF
[ $failed -eq 0 ] || { echo "$failed run(s) ended otherwise than expected: see their logs in $OUT"; exit 1; }
