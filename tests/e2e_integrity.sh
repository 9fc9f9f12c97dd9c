#!/usr/bin/env bash
# dos-train's checkpoints prove themselves intact, and nothing is lost or left behind:
#  - damaged checkpoints are refused on --resume, naming the file, the tensor and the check: a
#    flipped bit in master, exp_avg_sq or step (checksums), NaN in master, a negative exp_avg_sq,
#    absurd or negative step counts (value checks), negative numbers in index.json (quoted as given);
#    the refused checkpoint is left as it was and no output file is written;
#  - a diverged run (every parameter inf) saves nothing and says so;
#  - SIGTERM and SIGINT during --save-state remove the temporary folder and file and end the process
#    with the signal's status; what a killed save left (DIR.tmp-XXXXXX, FILE.tmp.XXXXXX) is removed
#    by the next successful save, and a folder holding anything else is not.
#  - a checkpoint of several checksum blocks re-sharded on resume: each shard verifies only the
#    blocks it reads and holds exactly its slice of an uninterrupted run.
#   e2e_integrity.sh DOS_TRAIN ST_TAMPER_PY SHARD_CHECK_PY
set -u
train=$1
tamper=$2
shard_check=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
run() { "$train" --preset tiny --quiet "$@"; }

run -n 2 --save-state "$tmp/good" >/dev/null 2>&1 || bad "saving a good checkpoint"
if python3 - "$tmp/good" <<'PY'
import json, struct, sys
d = sys.argv[1]
ix = json.load(open(d + "/index.json"))
assert ix["architecture"].startswith("gpt2 layers 2 hidden 128"), ix
raw = open(d + "/rank-00000-of-00001.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert h["__metadata__"]["checksum"] == "xxh3-64", h["__metadata__"]
for t in ("master", "exp_avg", "exp_avg_sq"):
    assert h[t + ".xxh3"]["dtype"] == "U64", h
PY
then ok "the checkpoint records its architecture and a checksum per block of every state tensor"
else bad "the checkpoint lacks its architecture or checksums"; fi
out=$(run -n 1 --resume "$tmp/good" 2>&1) && ok "an intact checkpoint resumes" || bad "an intact checkpoint: $out"

# damaged NAME "message" st_tamper-operation...: a copy of the good checkpoint, damaged, must be
# refused with the message, stay as it was, and no output file appear
damaged() {
  local name=$1 want=$2
  shift 2
  rm -rf "$tmp/$name"
  cp -r "$tmp/good" "$tmp/$name"
  python3 "$tamper" "$tmp/$name/rank-00000-of-00001.safetensors" "$@" || { bad "$name: st_tamper failed"; return; }
  cp -r "$tmp/$name" "$tmp/$name.before"
  local out rc
  out=$(run -n 1 --resume "$tmp/$name" --save-state "$tmp/$name" --save-params "$tmp/p-$name.st" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then bad "$name: resumed (exit 0)"
  elif ! grep -qi -- "$want" <<<"$out"; then bad "$name: message lacks '$want': $out"
  elif ! diff -r "$tmp/$name" "$tmp/$name.before" >/dev/null; then bad "$name: the checkpoint changed"
  elif ls "$tmp/p-$name.st"* >/dev/null 2>&1; then bad "$name: an output file was written"
  else ok "$name -> $(grep -i -- "$want" <<<"$out" | head -1)"; fi
}
damaged flip-master "master', elements \[0, 541184) fail their checksum" flip master 1000
damaged flip-exp-avg-sq "exp_avg_sq', elements \[0, 541184) fail their checksum" flip exp_avg_sq 0
damaged flip-step "tensor 'step' fails its checksum" flip step 0
damaged nan-master "tensor 'master': element 5 is nan" set-f32 master 5 nan
damaged negative-exp-avg-sq "element 7 is -1 (exp_avg_sq must be finite and >= 0)" set-f32 exp_avg_sq 7 -1
damaged huge-steps "has taken 9223372036854775807 Adam step(s), outside \[0, 2\]" set-i64 step 9223372036854775807
damaged negative-steps "has taken -3 Adam step(s)" set-i64 step -3

# index.json's numbers checked and quoted as written
for field in subgroup_size grad_parts; do
  rm -rf "$tmp/ix"; cp -r "$tmp/good" "$tmp/ix"
  python3 -c "import json,sys; p=sys.argv[1]; j=json.load(open(p)); j[sys.argv[2]]=-100000; json.dump(j,open(p,'w'))" \
    "$tmp/ix/index.json" "$field"
  out=$(run -n 1 --resume "$tmp/ix" 2>&1)
  if [ $? -ne 0 ] && grep -q "field '$field' must be a whole number in \[1, [0-9]*\], got -100000" <<<"$out"; then
    ok "negative $field in index.json -> $(grep -o "field '$field'.*" <<<"$out" | head -1)"
  else bad "negative $field in index.json: $out"; fi
done

# a model of about 2.9 million parameters: 3 checksum blocks of 2^20 elements; shards of a third
# start and end inside blocks
printf '{ "model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "n_positions": 128, "vocab_size": 5000 }' > "$tmp/mid.json"
mid() { "$train" --config "$tmp/mid.json" --quiet --policy cpu "$@"; }
mid -n 2 --save-params "$tmp/mid-full.st" >/dev/null 2>&1 && mid -n 1 --save-state "$tmp/mid-ck" >/dev/null 2>&1 \
  || bad "the 2.9M-parameter runs"
resharded=yes
for r in 0 1 2; do
  mid -n 1 --shard $r/3 --resume "$tmp/mid-ck" --save-params "$tmp/mid-s$r.st" >/dev/null 2>&1 || resharded=no
done
if [ $resharded = yes ] && python3 "$shard_check" "$tmp/mid-full.st" "$tmp"/mid-s0.st "$tmp"/mid-s1.st "$tmp"/mid-s2.st >/dev/null
then ok "a 3-block checkpoint resumed as 3 shards: each holds exactly its slice of the uninterrupted run"
else bad "a 3-block checkpoint resumed as 3 shards"; fi
python3 "$tamper" "$tmp/mid-ck/rank-00000-of-00001.safetensors" flip exp_avg 2500000
if mid -n 1 --shard 0/3 --resume "$tmp/mid-ck" >/dev/null 2>&1; then ok "a flip in block 2: shard 0/3 (which does not read it) resumes"
else bad "a flip in block 2 refused shard 0/3, which does not read it"; fi
out=$(mid -n 1 --shard 2/3 --resume "$tmp/mid-ck" 2>&1)
if [ $? -ne 0 ] && grep -q "tensor 'exp_avg', elements \[2097152, [0-9]*) fail their checksum" <<<"$out"; then
  ok "a flip in block 2: shard 2/3 refused -> $(grep -o "tensor 'exp_avg'.*checksum" <<<"$out")"
else bad "a flip in block 2, shard 2/3: $out"; fi

# a diverged run saves nothing
out=$(run -n 3 --lr 1e30 --save-state "$tmp/diverged" --save-params "$tmp/diverged.st" 2>&1)
if [ $? -ne 0 ] && grep -q "diverged" <<<"$out" && [ ! -e "$tmp/diverged" ] && ! ls "$tmp"/diverged* >/dev/null 2>&1; then
  ok "a diverged run is reported and saves nothing -> $(grep diverged <<<"$out" | head -1)"
else bad "a diverged run: $out"; ls "$tmp"; fi
out=$(run -n 3 --lr 1e30 2>&1)
if [ $? -ne 0 ] && grep -q "master parameters are inf or NaN" <<<"$out"; then
  ok "a diverged run without outputs is reported too -> $(grep diverged <<<"$out" | head -1)"
else bad "a diverged run without outputs: $out"; fi

# what a killed save left is removed by the next successful one; a folder with other files is not,
# nor one holding a complete checkpoint (a copy the user named so, or a save killed before its swap)
mkdir "$tmp/good.tmp-AbC123" "$tmp/good.tmp-XyZ789"
: > "$tmp/good.tmp-AbC123/rank-00000-of-00001.safetensors"
: > "$tmp/good.tmp-XyZ789/notes.txt"
: > "$tmp/p.st.tmp.Q1w2E3"
cp -a "$tmp/good" "$tmp/good.tmp-backup"
touch -d '1 hour ago' "$tmp/good.tmp-AbC123" "$tmp/good.tmp-XyZ789" "$tmp/p.st.tmp.Q1w2E3" "$tmp/good.tmp-backup"
out=$(run -n 1 --resume "$tmp/good" --save-state "$tmp/good" --save-params "$tmp/p.st" 2>&1)
if [ $? -eq 0 ] && [ ! -e "$tmp/good.tmp-AbC123" ] && [ ! -e "$tmp/p.st.tmp.Q1w2E3" ] && [ -e "$tmp/good.tmp-XyZ789/notes.txt" ] \
   && [ -e "$tmp/good.tmp-backup/index.json" ] && grep -q "good.tmp-backup holds a complete checkpoint" <<<"$out" \
   && grep -q "removed .*good.tmp-AbC123" <<<"$out" && grep -q "removed .*p.st.tmp.Q1w2E3" <<<"$out"; then
  ok "a successful save removed what killed saves left, and named it; a folder holding other files, or a complete checkpoint, stays"
else bad "stale temporaries: $out"; ls -la "$tmp"; fi
rm -rf "$tmp/good.tmp-backup" "$tmp/good.tmp-XyZ789"
# a write-protected checkpoint folder is refused before the run (its old files could not be removed
# after the swap) and left as it was
mkdir -m 555 "$tmp/locked"
out=$(run -n 1 --save-state "$tmp/locked" 2>&1)
if [ $? -ne 0 ] && grep -q "write-protected" <<<"$out" && [ "$(stat -c %a "$tmp/locked")" = 555 ] \
   && ! compgen -G "$tmp/locked.tmp-*" >/dev/null; then ok "a write-protected checkpoint folder is refused: $(grep -m1 write-protected <<<"$out")"
else bad "a write-protected checkpoint folder: $out"; fi
chmod 755 "$tmp/locked"

# SIGTERM and SIGINT while the checkpoint is being written (gpt2-124m: 1.5 GB to write)
interrupt() {
  local sig=$1 code=$2 ck="$tmp/int-$1"
  set -m  # its own process group: a background job's SIGINT is not ignored
  "$train" --preset gpt2-124m -n 1 --quiet --policy cpu --save-state "$ck" --save-params "$tmp/int-$sig.st" \
    >/dev/null 2>&1 &
  local pid=$!
  set +m
  local seen=""
  for _ in $(seq 1 3000); do
    if ls -d "$ck".tmp-* >/dev/null 2>&1; then seen=yes; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.02
  done
  kill -"$sig" $pid 2>/dev/null
  wait $pid
  local rc=$?
  if [ -z "$seen" ]; then bad "SIG$sig: the save was not caught in progress (exit $rc)"
  elif [ $rc -ne "$code" ]; then bad "SIG$sig during the save: exit status $rc, not $code"
  elif compgen -G "$ck.tmp-*" >/dev/null || compgen -G "$tmp/int-$sig.st*" >/dev/null || [ -e "$ck" ]; then
    bad "SIG$sig left files: $(ls "$tmp")"
  else ok "SIG$sig during --save-state: exit $rc, no temporary folder or file left"; fi
}
interrupt TERM 143
interrupt INT 130

# a folder the user made for the checkpoint (setgid, a group of its own, mode 2750) keeps its mode
# and group through two saves (the first replaces it empty, the second replaces a checkpoint), and
# the files inside get that group
mkdir -m 2750 "$tmp/shared"
group=$(id -G | tr ' ' '\n' | grep -vx "$(id -g)" | head -1)
[ -z "$group" ] && [ "$(id -u)" = 0 ] && group=1
[ -n "$group" ] && chgrp "$group" "$tmp/shared" 2>/dev/null
want=$(stat -c '%a %g' "$tmp/shared")
run -n 1 --save-state "$tmp/shared" >/dev/null 2>&1 && run -n 1 --save-state "$tmp/shared" >/dev/null 2>&1 \
  || bad "saving into a folder made for it"
got=$(stat -c '%a %g' "$tmp/shared")
files=$(stat -c '%g' "$tmp/shared"/* | sort -u)
if [ "$got" = "$want" ] && [ "$files" = "${want#* }" ]; then ok "the checkpoint folder keeps its mode and group ($got), its files that group"
else bad "the checkpoint folder was $want, is $got; its files' groups: $files"; fi
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
