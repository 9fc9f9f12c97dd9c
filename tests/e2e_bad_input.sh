#!/usr/bin/env bash
# dos-train on bad input: each case must exit non-zero, print a message naming the problem, and
# leave no output file (neither --report nor --save-params) behind. Then a good run's report
# must be valid JSON with one entry per iteration.
#   e2e_bad_input.sh DOS_TRAIN
set -u
train=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '{ "num_hidden_layers": 2, "hidden_size": ' > "$tmp/malformed.json"
printf '{ "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100 }' > "$tmp/missing.json"
printf '{ "model_type": "llama", "num_hidden_layers": 4000, "hidden_size": 16384, "intermediate_size": 65536, "num_attention_heads": 128, "vocab_size": 32000 }' > "$tmp/huge.json"
printf '{ "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 100, "intermediate_size": 64, "num_attention_heads": 3, "vocab_size": 50 }' > "$tmp/heads.json"
printf '{ "model_type": "gpt2", "n_layer": 2, "n_embd": 4611686018427387904, "n_inner": 5, "n_head": 1, "n_positions": 2, "vocab_size": 4 }' > "$tmp/overflow.json"
printf '{ "model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100 }' > "$tmp/bert.json"
printf '{ "n_layer": 2, "n_embd": 64, "num_attention_heads": 4, "vocab_size": 100, "n_positions": 64 }' > "$tmp/mixed.json"
mkfifo "$tmp/fifo"
fails=0
expect() {  # expect "substring of the message" dos-train-args... (PLAN=1: no --save-params, as --plan-only)
  local want=$1; shift
  local out rc outs=(--report "$tmp/r.json" --save-params "$tmp/p.safetensors")
  [ "${PLAN:-0}" = 1 ] && outs=(--report "$tmp/r.json")
  out=$("$train" --preset tiny --iterations 1 --quiet "${outs[@]}" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then echo "FAIL: '$*' exited 0"; fails=$((fails+1)); return; fi
  if ! grep -qi -- "$want" <<<"$out"; then echo "FAIL: '$*': message lacks '$want': $out"; fails=$((fails+1)); return; fi
  if compgen -G "$tmp/r.json*" >/dev/null || compgen -G "$tmp/p.safetensors*" >/dev/null; then
    echo "FAIL: '$*' left an output file: $(cd "$tmp" && ls -d r.json* p.safetensors* 2>/dev/null)"; fails=$((fails+1))
    rm -f "$tmp"/r.json* "$tmp"/p.safetensors*; return
  fi
  echo "ok: $* -> $(grep -i -- "$want" <<<"$out" | head -1)"
}
expect "unknown policy" --policy nosuch
expect "--policy needs a value, got an empty one" --policy ""
expect "unknown preset" --preset nosuch
# the calibration's link_share rule: refused wherever a model policy runs, a machine without a GPU
# (which never calibrates) included; a policy without a model does not read it
DOS_CALIBRATE_LINK_SHARE=bogus expect "DOS_CALIBRATE_LINK_SHARE is 'bogus'" --policy dos
if DOS_CALIBRATE_LINK_SHARE=bogus "$train" --preset tiny --iterations 1 --quiet --policy cpu >/dev/null 2>&1; then
  echo "ok: DOS_CALIBRATE_LINK_SHARE=bogus --policy cpu runs (no model, no calibration)"
else
  echo "FAIL: DOS_CALIBRATE_LINK_SHARE=bogus --policy cpu failed"; fails=$((fails+1))
fi
# a calibration switch that takes a number: each bad value refused under --policy dos (no output
# file left), each good one run, and a bad one not read under --policy cpu (no model, no calibration)
number_switch() {  # number_switch NAME "bad values" "good values" (values split on |)
  local name=$1 v bad good err
  IFS='|' read -ra bad <<<"$2"; IFS='|' read -ra good <<<"$3"
  # local -x: the variable exported to expect's run, the caller's own value back on return
  for v in "${bad[@]}"; do local -x "$name=$v"; expect "$name is '$v'" --policy dos; done
  for v in "${good[@]}"; do
    if err=$(env "$name=$v" "$train" --preset tiny --iterations 1 --quiet --policy dos 2>&1 >/dev/null); then
      echo "ok: $name=$v --policy dos runs"
    else echo "FAIL: $name=$v --policy dos failed: $err"; fails=$((fails+1)); fi
  done
  if err=$(env "$name=bogus" "$train" --preset tiny --iterations 1 --quiet --policy cpu 2>&1 >/dev/null); then
    echo "ok: $name=bogus --policy cpu runs (no model, no calibration)"
  else echo "FAIL: $name=bogus --policy cpu failed: $err"; fails=$((fails+1)); fi
}
# the calibration's repetitions: a whole number from 1 to 99, refused otherwise, as the rule is
number_switch DOS_CALIBRATION_REPS "0|100|7x|-3| 5|+5|1e1|99999999999999999999" "1|99|007"
# the calibration's scratch subgroups: a multiple of 4 from 8 to 32, refused otherwise
number_switch DOS_CALIBRATION_SUBGROUPS "0|4|6|9|30|36|8x|-8| 8|+8|1e1|99999999999999999999" "8|32|012"
# measurement switches with a value they do not know: named in a warning, the run goes on as without them
# (DOS_LINK_SHARE_MEASURE is read at the first phase that refines, or by the report: here the report)
out=$(DOS_CPU_SCHEDULE=statc DOS_NT_STORES=junk DOS_BIND=x DOS_HOST_ALLOC=junk DOS_LINK_SHARE_MEASURE=besides \
  DOS_FIRST_LINK_SHARE=half "$train" --preset tiny --iterations 1 --policy cpu --report "$tmp/switches.json" 2>&1)
for w in "DOS_CPU_SCHEDULE=statc is not one of static, dynamic" "DOS_NT_STORES=junk is not one of 0, avx" \
         "DOS_BIND=x is not one of 0, 1" "DOS_HOST_ALLOC=junk is not starpu" \
         "DOS_LINK_SHARE_MEASURE=besides is not one of beside, simulated" \
         "DOS_FIRST_LINK_SHARE=half is not one of lower, whole"; do
  if grep -qF -- "$w" <<<"$out"; then echo "ok: warned: $w"; else echo "FAIL: no warning '$w': $out"; fails=$((fails+1)); fi
done
if grep -q '"link_share_measure": "beside"' "$tmp/switches.json"; then echo "ok: the report says beside, the default used"
else echo "FAIL: the report's link_share_measure is not beside"; fails=$((fails+1)); fi
if grep -q '"first_link_share": "lower"' "$tmp/switches.json"; then echo "ok: the report says lower, the default used"
else echo "FAIL: the report's first_link_share is not lower"; fails=$((fails+1)); fi
DOS_LINK_SHARE_MEASURE=simulated "$train" --preset tiny --iterations 1 --quiet --policy cpu --report "$tmp/switches.json" >/dev/null 2>&1
if grep -q '"link_share_measure": "simulated"' "$tmp/switches.json"; then echo "ok: the report says simulated when asked"
else echo "FAIL: the report's link_share_measure is not simulated"; fails=$((fails+1)); fi
rm -f "$tmp/switches.json"
expect "at least 1 element" --subgroup-size 0
expect "rounds to 0 in fp32" --eps 1e-50
expect "with --eps 0 a parameter" --eps 0 --optimizer adam --lr 0
expect "at least 1 element" --subgroup-size -5
expect "must be a number" --subgroup-size abc
expect "whole number" --subgroup-size 2.5
expect "must be a number" --subgroup-size 0x100
expect "must be a number" --subgroup-size " 1e4"
expect "is not a decimal number" --lr 0x1p-10
expect "is not a decimal number" --iterations " 2"
expect "is not a decimal number" --max-grad-norm inf
expect "must look like R/W" --shard " 0/2"
expect "must look like R/W" --shard "+0/2"
expect "must be a size in bytes" --gpu-resident-budget 0x10GB
expect "must be a size in bytes" --gpu-update-budget " 1GB"
expect "not valid JSON" --config "$tmp/malformed.json"
expect "missing field 'num_hidden_layers'" --config "$tmp/missing.json"
expect "cannot read the configuration file .*No such file" --config "$tmp/nonexistent.json"
expect "fields of both GPT-2" --config "$tmp/mixed.json"
expect "must divide" --config "$tmp/heads.json"
expect "host memory" --config "$tmp/huge.json"
expect "CUDA workers were asked for" --ncuda 64
STARPU_NCPU=abc expect "STARPU_NCPU=abc is not a worker count"
if [ -d /proc/self ] && [ -w /proc ]; then  # access() calls /proc writable for root; nothing can be created there
  expect "no file can be created" --save-params /proc/x.safetensors
  expect "no file can be created" --timeline /proc/t.json
  expect "no file can be created" --save-state /proc/ck
fi
expect "would never fire" --nan-gradient-at 5
expect "leave out --k and --gpu-fraction" --policy dos --sweep 0.5 --k 2
expect "leave out --k and --gpu-fraction" --policy dos --sweep 0.5 --gpu-fraction 0.25
out=$("$train" --preset tiny --iterations 1 --policy cpu --gpu-resident-budget 1GB 2>&1)
if grep -qF -- "--policy cpu updates every subgroup on the CPU: --gpu-resident-budget changes nothing" <<<"$out"; then
  echo "ok: --policy cpu with a GPU budget warned"
else echo "FAIL: no warning for --policy cpu with --gpu-resident-budget: $out"; fails=$((fails+1)); fi
# StarPU's folder for its performance models cannot be made (a read-only home on a cluster): an
# error saying what to set, before StarPU would abort the process
echo not-a-folder > "$tmp/afile"
STARPU_PERF_MODEL_DIR="$tmp/afile" expect "Set STARPU_PERF_MODEL_DIR to a writable folder" --policy cpu
mkdir -p "$tmp/pm"; echo not-a-folder > "$tmp/pm/codelets"  # its codelets/45 cannot be made
STARPU_PERF_MODEL_DIR="$tmp/pm" expect "cannot create $tmp/pm/codelets/45" --policy cpu
# XDG_CACHE_HOME wins over STARPU_HOME in StarPU 1.3.10's order
if [ -z "${STARPU_PERF_MODEL_DIR+x}" ]; then
  XDG_CACHE_HOME="$tmp/afile" STARPU_HOME="$tmp" expect "(from XDG_CACHE_HOME)" --policy cpu
fi
# OpenMP's own binding: the team spans OpenMP's places (libgomp narrows the initial thread to the
# first), master binding keeps it on the master's place, OMP_PROC_BIND=false is no binding
team() { "$train" --preset tiny --iterations 1 --policy cpu 2>&1 | grep -o "x [0-9]* OpenMP threads"; }
bindline() { "$train" --preset tiny --iterations 1 --policy cpu 2>&1 | grep -o "binding: [^;]*"; }
plain=$(team)
for check in "close:$(OMP_PROC_BIND=close OMP_PLACES=cores team):$plain" \
             "master:$(OMP_PROC_BIND=master team):x 1 OpenMP threads"; do
  IFS=: read -r what got want <<<"$check"
  if [ "$got" = "$want" ]; then echo "ok: OMP_PROC_BIND=$what: $got"; else echo "FAIL: OMP_PROC_BIND=$what: '$got', want '$want'"; fails=$((fails+1)); fi
done
got=$(OMP_PROC_BIND=false OMP_PLACES=cores bindline)
if [ "$got" = "$(bindline)" ]; then echo "ok: OMP_PROC_BIND=false is no OpenMP binding ($got)"
else echo "FAIL: OMP_PROC_BIND=false OMP_PLACES=cores: '$got'"; fails=$((fails+1)); fi
expect "CPU workers and StarPU started" --cpu-workers 4099
STARPU_NCPU=4099 expect "STARPU_NCPU=4099 asks for 4099 CPU workers" --policy cpu
STARPU_NCPU=4099 expect "STARPU_NCPU=4099 asks for 4099 CPU workers" --policy cpu --cpu-workers 1
out=$(STARPU_NCPU=1 "$train" --preset tiny --iterations 1 --policy cpu --cpu-workers 2 2>&1)
if grep -qF "STARPU_NCPU=1 overrides cpu_workers 2" <<<"$out"; then echo "ok: STARPU_NCPU over --cpu-workers warned"
else echo "FAIL: no warning for STARPU_NCPU=1 over --cpu-workers 2: $out"; fails=$((fails+1)); fi
STARPU_NCUDA=-1 expect "STARPU_NCUDA=-1 is not a worker count"
expect "out of range" --shard 3/2
expect "R/W" --shard 3
expect "nothing" --shard 0/999999999
expect "fp32, fp16 or bf16" --dtype fp8
expect "at least 1" --iterations 0
expect "learning rate" --lr -1
expect "in \[0, 1\]" --policy static:1.5
expect "need --policy dos" --policy cpu --gpu-fraction 0.5
expect "is not a fraction like 1/3" --policy dos --gpu-fraction " 1/2"
expect "is not a number" --policy dos --gpu-fraction 0x1p-1
expect "beyond what a double holds" --policy dos --gpu-fraction 1e-400
expect "not both" --policy dos --k 2 --gpu-fraction 0.5
expect "'inf' is not a number" --policy dos --k inf
expect "in \[0, 1\]" --policy dos --sweep 0.5,2
expect "an empty entry" --policy dos --sweep 0.1,,0.3
expect "an empty entry" --policy dos --sweep 0.1,
expect "an empty entry" --policy dos --sweep ""
expect "out of range" --config "$tmp/overflow.json"
expect "more than 1048576 subgroups" --preset gpt2-124m --subgroup-size 1
expect "not supported" --config "$tmp/bert.json"
expect "empty" --config ""
expect "same file" --report "$tmp/same" --save-params "$tmp/same"
expect "not a regular file" --report "$tmp/fifo"
expect "cpu-threads" --cpu-threads -2
expect "index.json: No such file" --resume "$tmp/no-such-checkpoint"
expect "not a folder" --save-state "$tmp/bert.json"
"$train" --preset tiny --iterations 1 --quiet --save-state "$tmp/ck" >/dev/null 2>&1
expect "resume with the same model" --preset gpt2-124m --resume "$tmp/ck"
# said before the host memory is counted: the 13B's state (208 GB) fits no test machine
expect "model tiny there, llama2-13b here" --preset llama2-13b --resume "$tmp/ck"
expect "resume with the same model" --resume "$tmp/ck" --seed 5
expect "differs from this run in: seed 0 there, 5 here" --resume "$tmp/ck" --seed 5
rm -rf "$tmp/ck"
expect "beta1" --beta1 1.5
expect "size in bytes" --gpu-update-budget 4XB
expect "size in bytes" --gpu-resident-budget -1GB
expect "more than 0 bytes" --gpu-update-budget 0
expect "not a whole number of bytes" --gpu-update-budget 1.5
expect "not a whole number of bytes" --gpu-resident-budget 0.4
expect "not a whole number of bytes" --gpu-update-budget 1.5B
expect "beyond what a double holds" --gpu-update-budget 1e400
expect "beyond what a double holds" --gpu-update-budget 1e-400GB
expect "size in bytes" --gpu-update-budget "4 GB"
expect "less than one byte" --gpu-resident-budget 1e-310GB
expect "(negative)" --gpu-resident-budget -1e-400GB
expect "less than one byte" --gpu-update-budget 0.0004KB
expect "it is a folder" --config "$tmp"
expect "beyond the largest size taken" --gpu-resident-budget 1e99
expect "beyond the largest size taken" --gpu-update-budget 1e19
expect "needs --writeback eager" --gpu-update-budget 1GB --writeback end
expect "eager or end" --writeback later
expect "fp32 or native" --grad-transfer fp8
expect "adaptive, memcpy-down, auto, kernel, memcpy or memcpy-up" --copy-by memcopy
expect "stream-lookahead" --stream-lookahead -1
expect "tail-subgroups must be auto or a whole number in" --tail-subgroups -1
expect "tail-subgroups must be auto or a whole number in" --tail-subgroups 6x
expect "tail-subgroups must be auto or a whole number in" --tail-subgroups 1000001
expect "tail-subgroups must be auto or a whole number in" --tail-subgroups ""
expect "tail-subgroups must be auto or a whole number in" --tail-subgroups 18446744073709551616
expect "needs --policy dos or static:R" --policy cpu --tail-subgroups 2
expect "nothing would be bound" --policy dos --overlap on --tail-subgroups 2
expect "grad-parts" --grad-parts -1
expect "grad-parts" --grad-parts 5000
expect "must be auto, mpi or nccl" --comm nccI
expect "collectives of an MPI job" --comm nccl
expect "tokens" --emulate-compute --tokens 0
expect "cpu-scale" --emulate-compute --cpu-scale 0
expect "not a regular file" --timeline "$tmp/fifo"
expect "same file as --report" --timeline "$tmp/same2" --report "$tmp/same2"
expect "needs a path" --timeline ""
expect "needs a path" --report ""
# an empty value that would read as the option left out is refused, not dropped
expect "--gpu-resident-budget needs a value, got an empty one" --gpu-resident-budget ""
expect "--gpu-update-budget needs a value, got an empty one" --gpu-update-budget ""
expect "--speculation-budget needs a value, got an empty one" --speculation-budget ""
expect "--k needs a value, got an empty one" --k ""
expect "--gpu-fraction needs a value, got an empty one" --gpu-fraction ""
expect "--copy-by needs a value, got an empty one" --copy-by ""
# CLI11 reads "--k=" as a value left out, or takes the next argument: the same message as --k ""
expect "--k needs a value, got an empty one" --k=
expect "--save-state needs a path, got an empty one" --save-state=
# and every other option that takes a value: CLI11 would take the next argument for it
expect "--policy needs a value, got an empty one" --policy= --plan-only
expect "--iterations needs a value, got an empty one" --iterations=
# even before --help, which CLI11 would take for its value; the value of an option is skipped as CLI11 takes it
expect "--k needs a value, got an empty one" --k= --help
# an option given without '=' whose next argument is an option of dos-train: CLI11 would take that
# for its value (a report named "--help", "--timeline" or "-n"); a value beginning with '-' that
# names no option passes (--seed -1 below reaches the seed's own check)
expect "--report takes a value, and the argument after it, '--timeline', is an option of dos-train" --report --timeline --timeline=
expect "--report takes a value, and the argument after it, '--help', is an option of dos-train" --report --help
if [ -e ./--help ]; then echo "FAIL: '--report --help' wrote a file named --help"; fails=$((fails+1)); rm -f ./--help; fi
expect "--timeline takes a value, and the argument after it, '-n', is an option of dos-train" --timeline -n 2
# short options grouped or with their value attached, as CLI11 reads them ("-n2" is -n 2, "-qn1" -q -n 1)
expect "--timeline takes a value, and the argument after it, '-n2', is an option of dos-train" --timeline -n2
expect "--report takes a value, and the argument after it, '-qn1', is an option" --report -qn1
# anything that begins with "--": the end of options, or an option misspelt, would name the file
expect "the argument after it, '--', begins with '--', as an option does" --report --
expect "the argument after it, '--quite', begins with '--', as an option does (none of dos-train's)" --report --quite
# the advice names the option's long form, which CLI11 reads with '=' (it does not read -n=VALUE)
expect "give -n VALUE (a value that begins with '-' as --iterations=VALUE)" -n --report x.json
expect "--config needs a path, got an empty one" --config=
# sizes and numbers: a parameter count that overflows 64 bits, numbers printed as given
printf '{ "model_type": "llama", "num_hidden_layers": 32768, "hidden_size": 16777216, "intermediate_size": 11184809, "num_attention_heads": 1, "vocab_size": 98304 }' > "$tmp/wrap.json"
expect "more than dos-train handles" --config "$tmp/wrap.json"
expect "at most 9e15 elements, got 1e20" --subgroup-size 1e20
expect "got '-1'" --seed -1
expect "got '18446744073709551616'" --seed 18446744073709551616
expect "cores this process may use" --cpu-threads 100000
# values that make every parameter inf or NaN at the first step
expect "overflows fp32" --lr 1e300
expect "overflows fp32" --weight-decay 1e300
expect "overflows fp32" --lr 1e20 --weight-decay 1e20
expect "first step's step size" --lr 1e38
# output paths: two names for one file, an output inside the checkpoint folder, a folder that is
# not a checkpoint, the current folder
expect "name the same file" --save-params "$tmp/./x.out" --report "$tmp/x.out"
expect "name the same file" --save-params "$tmp/sub/../x.out" --report "$tmp/x.out" --timeline "$tmp/t.json"
touch "$tmp/hard1"; ln "$tmp/hard1" "$tmp/hard2"
expect "name the same file" --report "$tmp/hard1" --save-params "$tmp/hard2"
rm -f "$tmp/hard1" "$tmp/hard2"
expect "lies in the checkpoint folder" --save-state "$tmp/ck2" --save-params "$tmp/ck2/p.safetensors"
# outputs over the run's inputs: a part of the checkpoint --resume reads, the --config file, a
# --rates file; each left as it was
"$train" --preset tiny --iterations 1 --quiet --save-state "$tmp/ck1" >/dev/null 2>&1
cp "$tmp/ck1/index.json" "$tmp/index.keep"
printf '{ "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100 }' > "$tmp/good-config.json"
cp "$tmp/good-config.json" "$tmp/config.keep"
printf '{ "U_c": 4e9, "U_c_dma": 3e9, "U_g": 1e11, "D_c": 3e11, "B_h2d": 5e10, "B_d2h": 5e10 }' > "$tmp/rates-in.json"
cp "$tmp/rates-in.json" "$tmp/rates.keep"
expect "that --resume reads" --resume "$tmp/ck1" --report "$tmp/ck1/index.json"
# a checkpoint resumed with another optimizer or betas than its moments were made with is refused;
# another learning rate goes on from it, with a note
expect "was trained with adamw beta1=" --resume "$tmp/ck1" --beta2 0.95
expect "this run asks for adam beta1=" --resume "$tmp/ck1" --optimizer adam
# iterations are numbered across resumes: ck1 holds iteration 1, so this run's is 2
expect "is not one of this run's iterations (2 to 2)" --resume "$tmp/ck1" --nan-gradient-at 1
out=$("$train" --preset tiny --iterations 1 --quiet --resume "$tmp/ck1" --lr 0.5 2>&1)
if [ $? -eq 0 ] && grep -q "this run goes on from it with lr=0.5" <<<"$out"; then echo "ok: another --lr resumes, with a note"
else echo "FAIL: another --lr on resume: $out"; fails=$((fails+1)); fi
expect "is the file --config reads" --config "$tmp/good-config.json" --timeline "$tmp/./good-config.json"
expect "is the file --rates reads" --policy dos --rates "$tmp/rates-in.json" --save-params "$tmp/rates-in.json"
PLAN=1 expect "is the file --rates reads" --policy dos --plan-only --rates "$tmp/rates-in.json" --report "$tmp/rates-in.json"
if cmp -s "$tmp/ck1/index.json" "$tmp/index.keep" && cmp -s "$tmp/good-config.json" "$tmp/config.keep" \
   && cmp -s "$tmp/rates-in.json" "$tmp/rates.keep"; then echo "ok: the inputs are untouched"
else echo "FAIL: an input was overwritten"; fails=$((fails+1)); fi
expect "runs no update phase" --policy dos --plan-only --rates "$tmp/rates-in.json" --save-state "$tmp/ck3"
PLAN=1 expect "runs no update phase" --policy dos --plan-only --rates "$tmp/rates-in.json" --timeline "$tmp/t3.json"
PLAN=1 expect "--rates '$tmp/nope.json': no such file" --policy dos --plan-only --rates "$tmp/nope.json"
mkdir "$tmp/scratch"; ln -s "$tmp/scratch" "$tmp/link"
expect "is a symbolic link" --save-state "$tmp/link"
[ -L "$tmp/link" ] && echo "ok: the link is kept" || { echo "FAIL: the link was replaced"; fails=$((fails+1)); }
expect "beyond 2^63 - 1" --shard 0/18446744073709551617
expect "folder of its own" --save-state .
expect "folder of its own" --save-state "$tmp/.."
mkdir "$tmp/precious"; echo precious > "$tmp/precious/precious.txt"
expect "not part of a checkpoint" --save-state "$tmp/precious"
if [ "$(cat "$tmp/precious/precious.txt")" = precious ]; then echo "ok: the user's folder is untouched"
else echo "FAIL: the user's folder lost its file"; fails=$((fails+1)); fi
out=$("$train" --preset tiny --iterations 1 --quiet --save-params /nonexistent-dir/p.safetensors 2>&1)
if [ $? -ne 0 ] && grep -q "does not exist" <<<"$out"; then echo "ok: unwritable --save-params -> $out"
else echo "FAIL: unwritable --save-params: $out"; fails=$((fails+1)); fi
# a write-protected output is refused and kept, not replaced by the rename
echo keep > "$tmp/ro.json"; chmod a-w "$tmp/ro.json"
out=$("$train" --preset tiny --iterations 1 --quiet --report "$tmp/ro.json" 2>&1)
if [ $? -ne 0 ] && grep -q "write-protected" <<<"$out" && [ "$(cat "$tmp/ro.json")" = keep ]; then echo "ok: write-protected --report -> $out"
else echo "FAIL: write-protected --report: $out"; fails=$((fails+1)); fi
chmod u+w "$tmp/ro.json"
# a good run: valid JSON report, one entry per iteration, safetensors file present
if "$train" --preset tiny --iterations 2 --quiet --report "$tmp/good.json" --save-params "$tmp/good.safetensors" >/dev/null 2>&1 \
   && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r['iterations'])==2, r; assert r['params']>0" "$tmp/good.json" \
   && [ -s "$tmp/good.safetensors" ]; then echo "ok: good run wrote a valid report"
else echo "FAIL: good run"; fails=$((fails+1)); fi
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
