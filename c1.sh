#!/bin/bash
R=$OUT/r; mkdir -p $R
T0=$(date +%s)
step() { local name=$1 maxstart=$2 to=$3; shift 3; local now=$(( $(date +%s) - T0 )); if [ $now -gt $maxstart ]; then echo "$name skipped at $now" >> $R/times.txt; return; fi; local s=$(date +%s); timeout $to "$@" > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s start=$now" >> $R/times.txt; }
git log --oneline -1 > $R/git.txt; git status --short >> $R/git.txt
cat /sys/kernel/mm/transparent_hugepage/enabled > $R/sys.txt 2>&1; lscpu >> $R/sys.txt 2>&1; nvidia-smi >> $R/sys.txt 2>&1; free -g >> $R/sys.txt
step setup 100 300 scripts/setup.sh build
. .deps/env.sh
export STARPU_SILENT=1
S7="--preset llama2-7b --shard 0/16 --gpu-update-budget 400MB --policy dos -n 4"
export DOS_CACHE_DIR=/tmp/ca; rm -rf /tmp/ca /tmp/cb
step d1_cal_1e8 250 60 build/examples/dos-train $S7 --subgroup-size 1e8
step d2_cache_1e8 250 60 build/examples/dos-train $S7 --subgroup-size 1e8
export DOS_CACHE_DIR=/tmp/cb
step d3_cal_16m 250 60 build/examples/dos-train $S7 --subgroup-size 16777216
export DOS_CACHE_DIR=/tmp/cc; rm -rf /tmp/cc
step d4_cal_1e8_b 250 60 build/examples/dos-train $S7 --subgroup-size 1e8 --timeline $R/d4.json
cp -r /tmp/ca /tmp/cb /tmp/cc $R/ 2>/dev/null
step host 230 40 build/bench/dos-bench host --reps 3
step tests 270 320 bash -c 'meson test -C build --print-errorlogs $(meson test -C build --list | grep -E "cuda|train-|copy-stream" | grep -vE "mpi|nccl|shards|resume|bad-input|plan-only|integrity") refinement refinement-first-phases phase-sim tail-binding model plans kernels-static optimizer-dos-host-bf16-adam train-plan-only'
cp build/meson-logs/testlog.txt $R/ 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r
