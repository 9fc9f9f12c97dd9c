#!/usr/bin/env bash
# dos-train as a 2-rank job whose collectives go through NCCL on the GPUs' buffers: one
# GPU per rank; the ranks' saved shards must be exactly their slices of a one-process run with
# --grad-parts 2, as with MPI through host memory (both are checked); --comm nccl where the buffers
# are on the host is refused with a message. Skips (77) without mpirun, without MPI or NCCL in
# dos-train, or with fewer than 2 GPUs.
#   e2e_nccl.sh DOS_TRAIN SHARD_CHECK.py
set -u
train=$1 check=$2
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
ldd "$train" | grep -q libmpi || { echo "skip: dos-train was built without MPI"; exit 77; }
ldd "$train" | grep -q libnccl || { echo "skip: dos-train was built without NCCL"; exit 77; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
[ "$gpus" -ge 2 ] || { echo "skip: $gpus GPU(s), 2 needed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NVLink multicast stays as the machine sets it (off on the lent GPU machines); passed on explicitly
pass=()
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do [ -n "${!v:-}" ] && pass+=(-x "$v"); done
mpi=(mpirun --oversubscribe -np 2 --bind-to none "${pass[@]}")
common=(--preset tiny --iterations 3 --subgroup-size 10007 --seed 7 --quiet --policy cpu)
out=$("$train" "${common[@]}" --ncuda 1 --grad-parts 2 --save-params "$tmp/full.safetensors" 2>&1) ||
  { echo "FAIL: one-process run:"; echo "$out" | tail -20; exit 1; }
for comm in nccl mpi; do
  out=$(timeout 180 "${mpi[@]}" "$train" "${common[@]}" --comm $comm --save-params "$tmp/$comm.safetensors" \
        --report "$tmp/$comm.json" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: the 2-rank --comm $comm job exited $rc:"; echo "$out" | tail -20; exit 1; }
  echo "$out" | grep -E "^(data parallel|  rank)"
  python3 "$check" "$tmp/full.safetensors" "$tmp/$comm.rank-00000-of-00002.safetensors" \
    "$tmp/$comm.rank-00001-of-00002.safetensors" || { echo "FAIL: --comm $comm shards differ"; exit 1; }
  python3 - "$comm" "$tmp/$comm.rank-00000-of-00002.json" <<'PY' || exit 1
import json, sys
want = {"nccl": "NCCL", "mpi": "MPI"}[sys.argv[1]]
r = json.load(open(sys.argv[2]))
got = {it["comm_backend"].split()[0].rstrip(":") for it in r["iterations"]}
assert got == {want}, (got, want)
print(f"ok: --comm {sys.argv[1]}: the report names {want}; comm seconds", [round(it["comm_seconds"], 4) for it in r["iterations"]])
PY
  echo "ok: --comm $comm: 2 ranks on 2 GPUs hold exactly the one-process run's slices"
done
out=$(timeout 120 "${mpi[@]}" "$train" "${common[@]}" --comm nccl --device host 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "comm nccl: the model's buffers are not on a GPU" <<<"$out" ||
  { echo "FAIL: --comm nccl with --device host ($rc): $out"; exit 1; }
echo "ok: $(grep -m1 "comm nccl:" <<<"$out")"
