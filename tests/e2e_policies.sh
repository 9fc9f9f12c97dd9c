#!/usr/bin/env bash
# dos-train end to end: the saved fp32 master parameters of the same model and seed must be
# bit-identical under every policy and schedule: cpu and StarPU's dmda (both update on the CPU
# here), cpu and gpu where a GPU exists (both kernels evaluate the same IEEE fp32 operations in the
# same order), the plans that mix the two sides, the tail binding, the gradients' staging
# (README, "Tests").
#   e2e_policies.sh DOS_TRAIN ST_COMPARE cpu-dmda|cpu-gpu|cpu-dos|starved|tail|shards|resume|staging|iteration|overlap|overlap-budget|calibration-budget
set -u
train=$1 cmp=$2 mode=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--preset tiny --iterations 3 --subgroup-size 10007 --seed 7 --quiet)  # a later --iterations wins
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
  resume)
    # 4 iterations in one go, and 2 + a resume from the checkpoint for 2 more: the same bits
    # (fp16 parameters, so that the caller's 16-bit copy restored from the master matters)
    run --policy cpu --dtype fp16 --iterations 4 --save-params "$tmp/once.safetensors"
    run --policy cpu --dtype fp16 --iterations 2 --save-state "$tmp/ckpt/"  # a trailing slash: the same folder
    want=$(printf '%o' $(( 0777 & ~$(umask) )))
    [ "$(stat -c %a "$tmp/ckpt")" = "$want" ] || { echo "the checkpoint folder's mode is $(stat -c %a "$tmp/ckpt"), not $want"; exit 1; }
    # a non-empty ckpt.old-PID left by a crashed run whose process id this one gets (containers
    # reuse them): the save still goes through (the previous checkpoint is set aside under a fresh name)
    (mkdir -p "$tmp/ckpt.old-$BASHPID/stale" && exec "$train" "${common[@]}" --policy cpu --dtype fp16 --iterations 1 \
      --resume "$tmp/ckpt" --save-state "$tmp/ckpt" >/dev/null) || { echo "a stale ckpt.old-PID folder blocked the save"; exit 1; }
    rm -rf "$tmp"/ckpt.old-*
    # a save killed between its steps can leave the complete checkpoint beside the name only: the
    # resume names it
    mv "$tmp/ckpt" "$tmp/ckpt.tmp-Ab3dE9"
    out=$("$train" "${common[@]}" --policy cpu --dtype fp16 --iterations 1 --resume "$tmp/ckpt" 2>&1)
    [ $? -ne 0 ] && grep -q "beside it, left by an interrupted save: $tmp/ckpt.tmp-Ab3dE9" <<<"$out" ||
      { echo "the resume does not name the interrupted save's folder: $out"; exit 1; }
    mv "$tmp/ckpt.tmp-Ab3dE9" "$tmp/ckpt"
    run --policy dmda --dtype fp16 --iterations 1 --resume "$tmp/ckpt" --save-params "$tmp/resumed.safetensors"
    ls "$tmp" | grep -qE "ckpt\.(tmp|old)" && { echo "a temporary checkpoint folder was left behind"; exit 1; }
    "$cmp" "$tmp/once.safetensors" "$tmp/resumed.safetensors" ;;
  cpu-dos)
    # on a machine without a GPU, dos and static:R say so and update everything on the CPU; with a
    # GPU their plans mix sides: the same bits all the same
    run --policy cpu --save-params "$tmp/cpu.safetensors"
    run --policy dos --save-params "$tmp/dos.safetensors"
    run --policy static:0.5 --save-params "$tmp/static.safetensors"
    # the plan-only example (greedy) and the registered StarPU policy written the StarPU way
    # (round-robin, scheduler/policies/round_robin.cpp) on the same task graph
    run --policy greedy --save-params "$tmp/greedy.safetensors"
    run --policy round-robin --save-params "$tmp/rr.safetensors"
    "$cmp" "$tmp/cpu.safetensors" "$tmp/dos.safetensors" && "$cmp" "$tmp/cpu.safetensors" "$tmp/static.safetensors" &&
      "$cmp" "$tmp/cpu.safetensors" "$tmp/greedy.safetensors" && "$cmp" "$tmp/cpu.safetensors" "$tmp/rr.safetensors" ;;
  starved)
    # DOS_STARVED_DOWNLOAD_MS=0 (set by the meson test): with a GPU every gradient download by the
    # copy engine counts as starved and the tiny phases leave the CPU mostly idle, so the second
    # phase (the first, which streams first, does not count) turns DOS_COPY_BY's default rule
    # (adaptive): the third phase's downloads dodge the state write-backs; the same bits as the
    # CPU's. Overlapped with backward, no phase turns it or dodges. Without a GPU nothing is
    # downloaded and nothing changes.
    [ "${DOS_STARVED_DOWNLOAD_MS:-}" = 0 ] || { echo "starved needs DOS_STARVED_DOWNLOAD_MS=0"; exit 1; }
    run --policy cpu --save-params "$tmp/cpu.safetensors"
    run --policy dos --gpu-fraction 1/2 --report "$tmp/r.json" --save-params "$tmp/dos.safetensors"
    "$cmp" "$tmp/cpu.safetensors" "$tmp/dos.safetensors" || exit 1
    python3 - "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
gpu = r["cuda_workers"] > 0
its = r["iterations"]
assert len(its) == 3, its
for k, it in enumerate(its):
    assert it["downloads_dodge_writebacks"] == (gpu and k > 1), (k, it)
    if k < 2:  # later downloads may all go by the kernel, which the copy engine's figures leave out
        assert (it["longest_download_bytes"] > 0) == (gpu and it["subgroups_cpu"] > 0), (k, it)
print("ok: downloads dodge write-backs %s, longest downloads %s s" %
      ([i["downloads_dodge_writebacks"] for i in its], [i["longest_download_seconds"] for i in its]))
PY
    [ $? -eq 0 ] || exit 1
    # with the update overlapped with backward the rule neither judges a phase nor dodges in one:
    # every download by the copy engine, the same bits
    ov=(--overlap on --emulate-compute --tokens 256 --max-grad-norm 1e30)
    run --policy cpu "${ov[@]}" --save-params "$tmp/cpu-ov.safetensors"
    run --policy dos --gpu-fraction 1/2 "${ov[@]}" --report "$tmp/r-ov.json" --save-params "$tmp/dos-ov.safetensors"
    "$cmp" "$tmp/cpu-ov.safetensors" "$tmp/dos-ov.safetensors" || exit 1
    python3 - "$tmp/r-ov.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
gpu = r["cuda_workers"] > 0
its = r["iterations"]
assert len(its) == 3 and all(it["overlapped"] for it in its), its
assert not any(it["downloads_dodge_writebacks"] for it in its), its
# on the GPU the CPU's gradients came down by the copy engine (starved, by DOS_STARVED_DOWNLOAD_MS=0)
assert any(it["longest_download_bytes"] > 0 for it in its) == gpu, its
print("ok: overlapped, downloads dodge write-backs %s, longest downloads %s s" %
      ([i["downloads_dodge_writebacks"] for i in its], [i["longest_download_seconds"] for i in its]))
PY
    ;;
  tail)
    # late binding of the plan's tail (--tail-subgroups): the same bits as the plan as made (a tail
    # subgroup may run on either side). With a CUDA worker every
    # iteration after the first binds the 4 last subgroups while the phase runs (the first, which
    # allocates the streamed state's GPU buffers, runs the plan as made); without one nothing is
    # bound and the run is the CPU's, bit for bit.
    run --policy cpu --save-params "$tmp/cpu.safetensors"
    run --policy dos --gpu-fraction 1/2 --save-params "$tmp/plan.safetensors"
    run --policy dos --gpu-fraction 1/2 --tail-subgroups 4 --report "$tmp/r.json" --save-params "$tmp/tail.safetensors"
    "$cmp" "$tmp/plan.safetensors" "$tmp/tail.safetensors" || exit 1
    python3 - "$tmp/r.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["tail_subgroups"] == 4, r["tail_subgroups"]
gpu = r["cuda_workers"] > 0
assert len(r["iterations"]) > 1, r["iterations"]
for k, it in enumerate(r["iterations"]):  # the optimizer's first phase (k 0) binds nothing
    assert it["tail_bound"] == (4 if gpu and k > 0 else 0), it
    assert 0 <= it["tail_moved"] <= it["tail_bound"], it
    # the plan's own sides stay in "plan"; where each tail subgroup ran is in "placement"
    moved = sum(p != q for p, q in zip(it["plan"][-4:], it["placement"][-4:]))
    assert moved == it["tail_moved"], (moved, it)
    # the model's rates after each phase's refinement (only with a model: a CUDA worker), the last
    # the report's own; when the last streamed state was home (0 without a streamed subgroup)
    if gpu:
        assert set(it["rates_after"]) == set(r["rates"]) and all(v > 0 for v in it["rates_after"].values()), it
        assert (it["stream_end_seconds"] > 0) == ("s" in it["placement"]), it
    else:
        assert "rates_after" not in it and it["stream_end_seconds"] == 0, it
    # the seconds before that end in which no CPU Adam ran: within [0, stream end], 0 without one
    idle = it["cpu_adam_idle_before_stream_end_seconds"]
    assert 0 <= idle <= it["stream_end_seconds"] and (idle == 0 or "s" in it["placement"]), it
if gpu:
    assert r["iterations"][-1]["rates_after"] == r["rates"], (r["iterations"][-1]["rates_after"], r["rates"])
print("ok: %d iterations, tail bound %s, moved %s" % (len(r["iterations"]), [i["tail_bound"] for i in r["iterations"]],
                                                   [i["tail_moved"] for i in r["iterations"]]))
PY
    [ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cuda_workers"])' "$tmp/r.json")" != 0 ] ||
      "$cmp" "$tmp/cpu.safetensors" "$tmp/tail.safetensors" || exit 1
    # --tail-subgroups auto (the default): 6 when the model chooses the split of policy dos (given by
    # --policy or, without it, by $STARPU_SCHED) and the update runs after backward, 0 with a split
    # given, another policy or the update overlapped
    tail_of() {  # tail_of [VAR=VALUE] dos-train-args...: the report's resolved tail_subgroups
      (export "${1:-_=}"; shift; run --iterations 1 --report "$tmp/auto.json" "$@" >/dev/null) || exit 1
      python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tail_subgroups"])' "$tmp/auto.json"
    }
    for want in "6||--policy dos" "6|STARPU_SCHED=dos|" "0||--policy dos --k 2" "0||--policy dos --gpu-fraction 1/2" \
                "0||--policy static:0.5" "0||--policy cpu" "0||--policy dos --overlap on" \
                "3||--policy dos --tail-subgroups 3"; do
      IFS='|' read -r n var args <<< "$want"
      # shellcheck disable=SC2086
      got=$(tail_of "$var" $args) || exit 1
      [ "$got" = "$n" ] || { echo "FAIL: ${var:+$var }dos-train $args: tail_subgroups $got, expected $n"; exit 1; }
      echo "ok: ${var:+$var }dos-train $args: tail_subgroups $got"
    done ;;
  compact)
    # --master compact (the compact master): the same bits as the full master under the CPU policy,
    # under dos (on a GPU: streamed subgroups through the direct path's segments, CPU ones with their
    # parameters brought down) and, where a GPU is, StarPU's gpu and dmda policies; checkpoints hold
    # fp32 masters, so a run resumes in either form from the other's; bad combinations refused
    run --policy cpu --iterations 4 --save-params "$tmp/full.safetensors"
    run --policy cpu --iterations 4 --master compact --save-params "$tmp/c-cpu.safetensors"
    run --policy dos --iterations 4 --master compact --save-params "$tmp/c-dos.safetensors"
    run --policy dos --iterations 4 --master compact --k 2 --save-params "$tmp/c-k2.safetensors"
    # fp32 gradient staging (P then comes down apart from the gradient) and the model in host memory
    # (with a GPU: the streamed subgroups take P up beside the gradient)
    run --policy dos --iterations 4 --master compact --k 2 --grad-transfer fp32 --save-params "$tmp/c-fp32g.safetensors"
    run --policy dos --iterations 4 --master compact --k 2 --device host --save-params "$tmp/c-host.safetensors"
    for f in c-cpu c-dos c-k2 c-fp32g c-host; do "$cmp" "$tmp/full.safetensors" "$tmp/$f.safetensors" || exit 1; done
    out=$("$train" "${common[@]}" --policy gpu --iterations 4 --master compact --save-params "$tmp/c-gpu.safetensors" 2>&1)
    if [ $? -eq 0 ]; then
      run --policy dmda --iterations 4 --master compact --save-params "$tmp/c-dmda.safetensors"
      "$cmp" "$tmp/full.safetensors" "$tmp/c-gpu.safetensors" && "$cmp" "$tmp/full.safetensors" "$tmp/c-dmda.safetensors" ||
        exit 1
    elif grep -q "needs a CUDA worker" <<<"$out"; then
      echo "no CUDA worker: the gpu and dmda runs of --master compact left out"
    else
      echo "$out"; echo "dos-train --policy gpu --master compact failed"; exit 1
    fi
    run --policy cpu --iterations 2 --master compact --save-state "$tmp/ck-compact"
    run --policy dos --iterations 2 --resume "$tmp/ck-compact" --save-params "$tmp/r-full.safetensors"
    run --policy cpu --iterations 2 --save-state "$tmp/ck-full"
    run --policy dos --iterations 2 --master compact --resume "$tmp/ck-full" --save-params "$tmp/r-compact.safetensors"
    "$cmp" "$tmp/full.safetensors" "$tmp/r-full.safetensors" && "$cmp" "$tmp/full.safetensors" "$tmp/r-compact.safetensors" ||
      exit 1
    for bad in "--dtype fp16"; do
      out=$("$train" "${common[@]}" --policy cpu --iterations 1 --master compact $bad 2>&1)
      [ $? -ne 0 ] && grep -q -- "--master compact" <<<"$out" || { echo "--master compact $bad was not refused: $out"; exit 1; }
    done ;;
  cpu-gpu)
    out=$("$train" "${common[@]}" --policy gpu --save-params "$tmp/gpu.safetensors" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
      if grep -q "needs a CUDA worker" <<<"$out"; then echo "skip: no CUDA worker"; exit 77; fi
      echo "$out"; exit 1
    fi
    echo "$out" | grep -E "^iter" | head -3
    run --policy cpu --save-params "$tmp/cpu.safetensors"
    "$cmp" "$tmp/cpu.safetensors" "$tmp/gpu.safetensors" ;;
  staging)
    # the gradients staged in fp32 or in the model's dtype (widened by the Adam kernel): the same
    # bits, under cpu and dos (on a GPU machine dos mixes sides: the same bits all the same)
    run --policy cpu --grad-transfer fp32 --save-params "$tmp/fp32.safetensors"
    run --policy cpu --grad-transfer native --save-params "$tmp/native.safetensors"
    run --policy dos --grad-transfer native --save-params "$tmp/dos-native.safetensors"
    run --policy dos --grad-transfer fp32 --save-params "$tmp/dos-fp32.safetensors"
    run --policy cpu --dtype fp16 --grad-transfer fp32 --save-params "$tmp/fp16-fp32.safetensors"
    run --policy cpu --dtype fp16 --grad-transfer native --save-params "$tmp/fp16-native.safetensors"
    run --policy dos --urgent-writeback --save-params "$tmp/dos-urgent.safetensors"  # write-backs pushed ahead
    "$cmp" "$tmp/fp32.safetensors" "$tmp/native.safetensors" && "$cmp" "$tmp/fp32.safetensors" "$tmp/dos-native.safetensors" &&
      "$cmp" "$tmp/dos-fp32.safetensors" "$tmp/dos-native.safetensors" &&
      "$cmp" "$tmp/dos-native.safetensors" "$tmp/dos-urgent.safetensors" &&
      "$cmp" "$tmp/fp16-fp32.safetensors" "$tmp/fp16-native.safetensors" ;;
  iteration)
    # the emulated forward/backward changes no result, the report carries its figures, and the
    # timeline has every task of the last phase (a gradient staging, an Adam and a parameter
    # write-back per subgroup) and its bus samples. Without a CUDA worker the stand-in runs on the
    # CPU with its tokens divided by --cpu-scale and every task runs on the CPU; with one, the
    # tokens are as given, and the gradient staging and the parameter write-back are the runtime's
    # own copies from and to the GPU (lanes d2h and h2d).
    run --policy cpu --save-params "$tmp/plain.safetensors"
    DOS_FIRST_LINK_SHARE=whole run --policy cpu --emulate-compute --overlap off --tokens 256 --cpu-scale 16 \
      --report "$tmp/r.json" --timeline "$tmp/t.json" --save-params "$tmp/emulated.safetensors" --copy-by kernel
    "$cmp" "$tmp/plain.safetensors" "$tmp/emulated.safetensors" || exit 1
    python3 - "$tmp/r.json" "$tmp/t.json" <<'PY'
import json, sys
r, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
s = r["summary"]
for k in ("iteration_seconds_median", "forward_seconds_median", "backward_seconds_median", "model_tflops_median"):
    assert s[k] > 0, (k, s)
assert s["iteration_seconds_median"] >= s["update_seconds_median"], s
gpu = r["cuda_workers"] > 0
assert s["peak_gpu_bytes_median"] > 0 and s["tokens_per_iteration"] == (256 if gpu else 16), s
for it in r["iterations"]:
    assert it["iteration_seconds"] >= it["forward_seconds"] + it["backward_seconds"] + it["update_seconds"] - 1e-9, it
assert t["iteration"] == 3 and t["policy"] == "cpu", t
assert r["copy_by"] == "kernel", r["copy_by"]  # --copy-by: the same bits (compared above)
assert r["link_share_measure"] == "beside", r["link_share_measure"]  # DOS_LINK_SHARE_MEASURE unset
assert r["first_link_share"] == "whole", r["first_link_share"]  # DOS_FIRST_LINK_SHARE=whole: the same bits
kinds = sorted((x["what"], x["subgroup"]) for x in t["tasks"])
n = r["subgroups"]
assert kinds == sorted([(w, i) for w in ("adam", "gather", "scatter") for i in range(n)]), kinds
for x in t["tasks"]:
    want = "cpu" if not gpu or x["what"] == "adam" else ("h2d" if x["what"] == "scatter" else "d2h")
    assert x["lane"] == want and 0 <= x["start"] <= x["end"], (want, x)
assert t["bus"] and all(len(b) == 3 for b in t["bus"]), t["bus"][:3]
print(f"ok: emulated iteration, {len(t['tasks'])} tasks in the timeline, {len(t['bus'])} bus samples")
PY
    [ $? -eq 0 ] || exit 1
    # With a CUDA worker, every subgroup streamed (--policy gpu): one state write-back per subgroup
    # in lane writeback, from its Adam's end on the GPU lane (or of zero length, where it ended
    # before the Adam's callback ran) to no earlier than that end
    if python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['cuda_workers'] > 0 else 1)" "$tmp/r.json"; then
      run --policy gpu --emulate-compute --overlap off --tokens 256 --timeline "$tmp/g.json"
      python3 - "$tmp/g.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
adam = {x["subgroup"]: x for x in t["tasks"] if x["what"] == "adam"}
wb = [x for x in t["tasks"] if x["lane"] == "writeback"]
assert adam and all(x["lane"] == "gpu" for x in adam.values()), sorted((x["lane"], x["subgroup"]) for x in adam.values())
assert sorted(x["subgroup"] for x in wb) == sorted(adam), (sorted(x["subgroup"] for x in wb), sorted(adam))
for x in wb:
    a = adam[x["subgroup"]]
    assert x["what"] == "state" and x["end"] >= a["end"] - 1e-6, (x, a)
    assert abs(x["start"] - a["end"]) < 1e-6 or x["start"] == x["end"], (x, a)
# zero length is allowed for a write-back that ended before its Adam's callback, not for all of them
# (that is what a write-back span would show if the Adam's end were never recorded)
timed = [x for x in wb if x["end"] > x["start"] and abs(x["start"] - adam[x["subgroup"]]["end"]) < 1e-6]
assert timed, "every write-back span has zero length"
print(f"ok: {len(wb)} state write-backs in the timeline, each from its Adam's end ({len(timed)} of non-zero length)")
PY
    fi
    ;;
  overlap)
    # The update overlapped with backward (--overlap on: every layer's gradients declared final as
    # its backward ends, the CPU's subgroups updated speculatively) and with the next forward (each
    # layer's forward waits for its parameters only) against the update after backward (off): the same bits with global-norm clipping active on some iterations and not on
    # others, a NaN gradient on one (skipped), under every policy, and with the compact master under
    # cpu and dos (the same bits as the full master). The clipping threshold is the
    # median of the gradient norms of a first run (no clipping), so that about half the
    # iterations clip.
    it=(--iterations 6 --emulate-compute --tokens 256 --cpu-scale 16 --seed 11)
    run "${it[@]}" --policy cpu --overlap off --max-grad-norm 1e30 --report "$tmp/norms.json" >/dev/null
    max=$(python3 -c "
import json, statistics, sys
r = json.load(open(sys.argv[1]))
print(repr(statistics.median(x['grad_norm'] for x in r['iterations'])))" "$tmp/norms.json") || exit 1
    policies=(cpu dmda dos)
    [ -n "${DOS_OVERLAP_POLICIES:-}" ] && read -r -a policies <<<"$DOS_OVERLAP_POLICIES"
    for p in "${policies[@]}"; do
      for o in on off; do
        run "${it[@]}" --policy "$p" --overlap $o --max-grad-norm "$max" --nan-gradient-at 4 \
          --report "$tmp/$p-$o.json" --save-params "$tmp/$p-$o.safetensors" >/dev/null
      done
      "$cmp" "$tmp/$p-on.safetensors" "$tmp/$p-off.safetensors" || { echo "policy $p: overlap on and off differ"; exit 1; }
    done
    # the compact master (--master compact): its subgroups updated speculatively too (out of place
    # into the shadow state, the new P in the staging; a streamed one on the GPU), the same bits as
    # the full master
    checked=("${policies[@]}")
    for p in cpu dos; do
      [ -e "$tmp/$p-off.safetensors" ] || continue
      for o in on off; do
        run "${it[@]}" --policy "$p" --master compact --overlap $o --max-grad-norm "$max" --nan-gradient-at 4 \
          --report "$tmp/$p-compact-$o.json" --save-params "$tmp/$p-compact-$o.safetensors" >/dev/null
        "$cmp" "$tmp/$p-off.safetensors" "$tmp/$p-compact-$o.safetensors" ||
          { echo "policy $p: --master compact, overlap $o, and the full master differ"; exit 1; }
      done
      checked+=("$p-compact")
    done
    # and with no clipping, so that every speculative update is kept (redone none) but the skipped
    # step's: P written by the kept ones, dropped with the skipped one
    run "${it[@]}" --policy cpu --overlap off --max-grad-norm 1e30 --nan-gradient-at 4 \
      --save-params "$tmp/keep-ref.safetensors" >/dev/null
    for p in cpu dos; do
      run "${it[@]}" --policy "$p" --master compact --overlap on --max-grad-norm 1e30 --nan-gradient-at 4 \
        --report "$tmp/$p-compact-keep.json" --save-params "$tmp/$p-compact-keep.safetensors" >/dev/null
      "$cmp" "$tmp/keep-ref.safetensors" "$tmp/$p-compact-keep.safetensors" ||
        { echo "policy $p: --master compact overlapped without clipping and the full master differ"; exit 1; }
    done
    python3 - "$tmp" <<'PY'
import json, sys
for p in ("cpu", "dos"):
    rows = json.load(open(f"{sys.argv[1]}/{p}-compact-keep.json"))["iterations"]
    for x in rows:
        assert x["overlapped"] and x["skipped"] == (x["iteration"] == 4) and x["redone"] == 0, (p, x)
        assert x["speculated"] > 0, (p, x)  # no clipping: every step speculates
    # where subgroups were streamed, some ran speculatively on the GPU: a step speculated more of
    # them than ran on the CPU
    done = [x for x in rows if not x["skipped"]]
    on_gpu = sum(x["subgroups_gpu"] for x in done)
    if on_gpu:
        assert any(x["speculated"] > x["subgroups_cpu"] for x in done), (p, [(x["speculated"], x["subgroups_cpu"]) for x in done])
    print(f"ok: {p} --master compact: every speculative update kept but the skipped step's,",
          sum(x["speculated"] for x in rows), "in all;", on_gpu, "subgroup updates on the GPU")
PY
    [ $? -eq 0 ] || exit 1
    python3 - "$tmp" "${checked[@]}" <<'PY'
import json, sys
tmp, policies = sys.argv[1], sys.argv[2:]
for p in policies:
    on, off = (json.load(open(f"{tmp}/{p}-{o}.json")) for o in ("on", "off"))
    rows_on, rows_off = on["iterations"], off["iterations"]
    clipped = [x["clip_coef"] < 1 for x in rows_off]
    assert any(clipped) and not all(c for i, c in enumerate(clipped) if i != 3), (p, clipped)
    for a, b in zip(rows_on, rows_off):
        assert a["grad_norm"] == b["grad_norm"] and a["clip_coef"] == b["clip_coef"], (p, a, b)
        assert a["skipped"] == b["skipped"] == (a["iteration"] == 4), (p, a["iteration"], a["skipped"], b["skipped"])
        assert a["overlapped"] and not b["overlapped"], (p, a, b)
        # the update overlaps the next forward too: what an iteration waited for its parameters
        # counts in its forward and in the previous iteration's exposed time
        assert a["iteration_seconds"] >= a["forward_seconds"] - a["forward_wait_seconds"] + a["backward_seconds"] - 1e-9, a
        assert 0 <= a["forward_wait_seconds"] <= a["forward_seconds"] and a["exposed_seconds"] >= 0, a
        assert b["iteration_seconds"] >= b["forward_seconds"] + b["backward_seconds"] + b["exposed_seconds"] - 1e-9, b
    speculated = sum(x["speculated"] for x in rows_on)
    redone = sum(x["redone"] for x in rows_on)
    # every plan speculates (the CPU's subgroups on the CPU, the streamed ones on the GPU)
    assert speculated > 0 and redone > 0, (p, speculated, redone)
    print(f"ok: {p}: overlap on and off the same bits; {speculated} speculative updates, {redone} redone, "
          f"clipped at {sum(clipped)} of {len(clipped)} iterations, iteration 4 skipped")
PY
    ;;
  overlap-budget)
    # The update overlapped with backward and the next forward under a tight --gpu-update-budget:
    # 400 KB (400000 bytes) holds three streamed subgroups of 10007 elements at once (120192 bytes
    # each: the fp32 state padded to 10016 elements; with the model on the GPU nothing else of a
    # streamed subgroup is charged), or a speculated one (its state and shadow state, 240384 bytes)
    # beside one streamed, so the admission window holds streamed subgroups back all phase long. dos with every subgroup streamed (--gpu-fraction 1)
    # and with half of them, overlap on and off, global-norm clipping on about half the iterations
    # and a NaN gradient (skipped) on one: the same bits as the cpu policy after backward. Without a
    # GPU every subgroup runs on the CPU: the same bits all the same.
    it=(--iterations 5 --emulate-compute --tokens 256 --cpu-scale 16 --seed 13)
    run "${it[@]}" --policy cpu --overlap off --max-grad-norm 1e30 --report "$tmp/norms.json" >/dev/null
    max=$(python3 -c "
import json, statistics, sys
r = json.load(open(sys.argv[1]))
print(repr(statistics.median(x['grad_norm'] for x in r['iterations'])))" "$tmp/norms.json") || exit 1
    clip=(--max-grad-norm "$max" --nan-gradient-at 3)
    run "${it[@]}" "${clip[@]}" --policy cpu --overlap off --save-params "$tmp/cpu.safetensors" >/dev/null
    for f in 1 1/2; do
      for o in on off; do
        tag="dos-${f/\//of}-$o"
        run "${it[@]}" "${clip[@]}" --policy dos --gpu-fraction "$f" --gpu-update-budget 400KB --overlap $o \
          --report "$tmp/$tag.json" --save-params "$tmp/$tag.safetensors" >/dev/null
        "$cmp" "$tmp/cpu.safetensors" "$tmp/$tag.safetensors" || { echo "$tag and cpu differ"; exit 1; }
      done
    done
    python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
for tag in ("dos-1-on", "dos-1-off", "dos-1of2-on", "dos-1of2-off"):
    r = json.load(open(f"{tmp}/{tag}.json"))
    assert r["gpu_update_budget"] == 400000, (tag, r["gpu_update_budget"])
    gpu = r["cuda_workers"] > 0
    clipped = [it["clip_coef"] < 1 for it in r["iterations"] if not it["skipped"]]
    assert any(clipped) and not all(clipped), (tag, clipped)
    if tag.endswith("-on"):
        assert sum(it["speculated"] for it in r["iterations"]) > 0, tag
    for it in r["iterations"]:
        assert it["overlapped"] == tag.endswith("-on"), (tag, it)
        assert it["skipped"] == (it["iteration"] == 3), (tag, it)
        if it["skipped"]:
            continue
        # with a GPU the plan's streamed subgroups ran there, through the window, under the budget
        assert (it["subgroups_gpu"] > 0) == gpu, (tag, it)
        if gpu:
            assert 0 < it["window_peak_bytes"] <= 400000, (tag, it["window_peak_bytes"])
        assert it["subgroups_cpu"] + it["subgroups_gpu"] == r["subgroups"], (tag, it)
    print(f"ok: {tag}: the same bits as cpu; subgroups on the GPU per phase",
          [it["subgroups_gpu"] for it in r["iterations"]])
PY
    ;;
  calibration-budget)
    # Calibrating under StarPU's GPU memory limit from a tight --gpu-update-budget, as on the H100
    # where about one such process in three hung (a 1/16 shard there; the limit and the calibration
    # do not depend on the model's size, so a smaller shard here): subgroups of 2^24 elements (the calibration's
    # scratch subgroups too: about 201 MB of state each streamed, the model on the GPU), whose
    # 400MB budget sets a limit of about 445 MiB, where the calibration's mixed phase once streamed
    # six at once. Each process calibrates (a cache of its own; 20 repetitions of the scratch
    # phases, so 20 mixed phases) and must finish within its timeout, three times, with the same
    # bits as cpu; with a CUDA worker its calibration line must give the scratch phases' update
    # budget. A fourth process calibrates on 32 scratch subgroups (DOS_CALIBRATION_SUBGROUPS, 3
    # repetitions), 24 of them streamed in its mixed phase under the same limit: the same checks,
    # and its line must name 32 subgroups. Without a GPU nothing calibrates: the same bits all the same.
    b=(--preset llama2-7b --shard 0/128 --subgroup-size 16777216 --iterations 2 --seed 5)
    "$train" "${b[@]}" --policy cpu --quiet --save-params "$tmp/cpu.safetensors" || { echo "cpu run failed"; exit 1; }
    for k in 1 2 3 4; do
      reps=20 subgroups=8
      [ $k -eq 4 ] && reps=3 subgroups=32
      DOS_CACHE_DIR="$tmp/cache$k" DOS_CALIBRATION_REPS=$reps DOS_CALIBRATION_SUBGROUPS=$subgroups timeout 150 \
        "$train" "${b[@]}" --policy dos --gpu-update-budget 400MB --save-params "$tmp/dos$k.safetensors" \
        > "$tmp/dos$k.log" 2>&1
      rc=$?
      [ $rc -eq 124 ] && { echo "calibrating process $k did not finish within 150 s"; tail -5 "$tmp/dos$k.log"; exit 1; }
      [ $rc -eq 0 ] || { echo "calibrating process $k failed (exit $rc)"; tail -5 "$tmp/dos$k.log"; exit 1; }
      "$cmp" "$tmp/cpu.safetensors" "$tmp/dos$k.safetensors" || { echo "process $k and cpu differ"; exit 1; }
      if grep -q "no CUDA worker" "$tmp/dos$k.log"; then
        echo "ok: process $k: no CUDA worker, nothing calibrated"
      else
        line=$(grep -m1 "calibrated (" "$tmp/dos$k.log")
        grep -qE "scratch update budget [0-9]" <<<"$line" || { echo "process $k: no scratch budget in '$line'"; exit 1; }
        grep -q "calibrated ($subgroups subgroups of 16777216)" <<<"$line" ||
          { echo "process $k: not $subgroups scratch subgroups of 16777216 in '$line'"; exit 1; }
        echo "ok: process $k: ${line##*; }"
      fi
    done
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
