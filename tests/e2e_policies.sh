#!/usr/bin/env bash
# dos-train end to end: the saved fp32 master parameters of the same model and seed must be
# bit-identical under the cpu policy and StarPU's dmda (both update on the CPU here), and, where a
# GPU exists, within a relative 1e-6 of each other under cpu and gpu (see README, "Tolerance").
#   e2e_policies.sh DOS_TRAIN ST_COMPARE cpu-dmda|cpu-gpu|cpu-dos|shards
set -u
train=$1 cmp=$2 mode=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--preset tiny --iterations 3 --subgroup-size 10007 --seed 7 --quiet)
run() { "$train" "${common[@]}" "$@" || { echo "dos-train $* failed"; exit 1; }; }
case "$mode" in
  cpu-dmda)
    # --device host: the dmda run must place every update on the CPU for a bit-identical result
    run --policy cpu --device host --save-params "$tmp/cpu.safetensors"
    run --policy dmda --device host --ncuda 0 --save-params "$tmp/dmda.safetensors"
    # and with the subgroups spread over two single-threaded CPU workers
    run --policy cpu --device host --cpu-workers 2 --cpu-threads 2 --save-params "$tmp/cpu2.safetensors"
    "$cmp" "$tmp/cpu.safetensors" "$tmp/dmda.safetensors" && "$cmp" "$tmp/cpu.safetensors" "$tmp/cpu2.safetensors" ;;
  shards)
    # three shards of the model, each run on its own, hold exactly their slices of the whole run
    run --policy cpu --save-params "$tmp/full.safetensors"
    for r in 0 1 2; do run --policy cpu --shard $r/3 --save-params "$tmp/s$r.safetensors"; done
    python3 "$(dirname "$0")/shard_check.py" "$tmp/full.safetensors" "$tmp"/s0.safetensors "$tmp"/s1.safetensors "$tmp"/s2.safetensors ;;
  cpu-dos)
    # on a machine without a GPU, dos and static:R say so and update everything on the CPU; with a
    # GPU their plans mix sides: within the same tolerance as cpu-gpu
    run --policy cpu --save-params "$tmp/cpu.safetensors"
    run --policy dos --save-params "$tmp/dos.safetensors"
    run --policy static:0.5 --save-params "$tmp/static.safetensors"
    "$cmp" "$tmp/cpu.safetensors" "$tmp/dos.safetensors" 1e-6 && "$cmp" "$tmp/cpu.safetensors" "$tmp/static.safetensors" 1e-6 ;;
  cpu-gpu)
    out=$("$train" "${common[@]}" --policy gpu --save-params "$tmp/gpu.safetensors" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
      if grep -q "needs a CUDA worker" <<<"$out"; then echo "skip: no CUDA worker"; exit 77; fi
      echo "$out"; exit 1
    fi
    echo "$out" | grep -E "^iter" | head -3
    run --policy cpu --save-params "$tmp/cpu.safetensors"
    "$cmp" "$tmp/cpu.safetensors" "$tmp/gpu.safetensors" 1e-6 ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
