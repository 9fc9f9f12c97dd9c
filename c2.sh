#!/bin/bash
R=$OUT/r; mkdir -p $R
T0=$(date +%s)
step() { local name=$1 maxstart=$2 to=$3; shift 3; local now=$(( $(date +%s) - T0 )); if [ $now -gt $maxstart ]; then echo "$name skipped at $now" >> $R/times.txt; return; fi; local s=$(date +%s); timeout $to "$@" > $R/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s start=$now" >> $R/times.txt; }
git log --oneline -1 > $R/git.txt; git status --short >> $R/git.txt
step setup 100 300 scripts/setup.sh build
. .deps/env.sh
export STARPU_SILENT=1
B20="--preset llama-20b --shard 1/4 --subgroup-size 1.24e8 --gpu-update-budget 40GB --emulate-compute --tokens 4096"
export DOS_CACHE_DIR=/tmp/cb; rm -rf /tmp/cb
step d3_cal_16m 150 40 build/examples/dos-train --preset llama2-7b --shard 0/16 --gpu-update-budget 400MB --policy dos -n 4 --subgroup-size 16777216
export DOS_CACHE_DIR=/tmp/cr; rm -rf /tmp/cr
step res_cal_n2 160 60 build/examples/dos-train $B20 --overlap off --policy dos --gpu-resident-budget 31.5GB -n 2
cp -r /tmp/cr $R/cr_after_cal
step res_cache_n3 220 60 build/examples/dos-train $B20 --overlap off --policy dos --gpu-resident-budget 31.5GB -n 3
cp -r /tmp/cr $R/cr_after_n3
export DOS_CACHE_DIR=/tmp/cs; rm -rf /tmp/cs
step sbs 290 200 python3 examples/dos_compare.py --policies dos --run "plan=--policy dos --tail-subgroups 0" --baselines zero_offload,stride:2 --peers .peers/torch_update_phase.py --peer-variants zero_offload,dos_stride:2 --repeats 1 --host-bench --out $R/sbs -- $B20 -n 5
rm -f $R/sbs/*.png
step tests 330 240 bash -c 'meson test -C build --print-errorlogs $(meson test -C build --list | grep -E "cuda|train-|copy-stream" | grep -vE "mpi|nccl|shards|resume|bad-input|plan-only|integrity") refinement refinement-first-phases phase-sim tail-binding model plans kernels-static optimizer-dos-host-bf16-adam train-plan-only'
cp build/meson-logs/testlog.txt $R/ 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r
