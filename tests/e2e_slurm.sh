#!/usr/bin/env bash
# A real Slurm in the tests: starts a private single-node Slurm (munge, slurmctld,
# slurmd, a minimal slurm.conf for this machine, its own ports and folders), submits
# examples/slurm/dos-train.sbatch as a 2-rank CPU job with `sbatch --wait` (the script's GPU and
# partition lines removed, as on a CPU-only cluster), and checks that the job succeeded and that
# its ranks' checkpoint holds exactly the master parameters of a one-process run with
# --grad-parts 2. Then a job whose resume cannot work (a rank's checkpoint file missing) must fail,
# with the message in its output, and leave the checkpoint it resumes from as it was. The daemons are stopped at
# the end. Skips (77) when Slurm, munge or mpirun are not installed (scripts/setup.sh test installs
# them), or dos-train lacks MPI.
#   e2e_slurm.sh DOS_TRAIN SHARD_CHECK.py SBATCH_SCRIPT
set -u
train=$(realpath "$1") check=$2 script=$3
[ "$(id -u)" = 0 ] || { echo "skip: the private Slurm runs its daemons as root"; exit 77; }
[ "$(nproc)" -ge 2 ] || { echo "skip: a 2-task job needs 2 cores"; exit 77; }
for c in slurmctld slurmd sbatch munged mpirun; do
  command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || { echo "skip: $c is not installed (apt install slurm-wlm munge openmpi-bin)"; exit 77; }
done
ldd "$train" | grep -q libmpi || { echo "skip: dos-train was built without MPI"; exit 77; }
root=$(cd "$(dirname "$train")/../.." && pwd)   # the checkout that holds build/ and .deps/
tmp=$(mktemp -d /tmp/dos-slurm.XXXXXX)
chmod 755 "$tmp"
started_munge=""
cleanup() {
  if [ -f "$tmp/slurmctld.pid" ]; then  # no job may outlive the test: its slurmstepd would
    scancel --user="$(id -un)" 2>/dev/null
    for _ in $(seq 20); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 1; done
  fi
  [ -f "$tmp/slurmctld.pid" ] && kill "$(cat "$tmp/slurmctld.pid")" 2>/dev/null
  [ -f "$tmp/slurmd.pid" ] && kill "$(cat "$tmp/slurmd.pid")" 2>/dev/null
  [ -n "$started_munge" ] && kill "$started_munge" 2>/dev/null
  sleep 1
  rm -rf "$tmp"
}
trap cleanup EXIT
# munge: one per machine; start it when none runs
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null
  [ -f /etc/munge/munge.key ] || { echo "FAIL: /etc/munge/munge.key is missing (the munge package makes it)"; exit 1; }
  if command -v runuser >/dev/null; then runuser -u munge -- /usr/sbin/munged; else /usr/sbin/munged --force; fi ||
    { echo "FAIL: munged would not start"; exit 1; }
  started_munge=$(pgrep -x munged | head -1)
fi
host=$(hostname -s)
port=$(( 20000 + RANDOM % 20000 ))
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/out"
cat > "$tmp/slurm.conf" <<CONF
ClusterName=dostest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$(( port + 1 ))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
CONF
export SLURM_CONF=$tmp/slurm.conf
/usr/sbin/slurmctld -f "$SLURM_CONF" || { echo "FAIL: slurmctld would not start"; cat "$tmp/slurmctld.log"; exit 1; }
/usr/sbin/slurmd -f "$SLURM_CONF" || { echo "FAIL: slurmd would not start"; cat "$tmp/slurmd.log"; exit 1; }
for _ in $(seq 30); do sinfo -h -o %t 2>/dev/null | grep -qE "^idle" && break; sleep 1; done
sinfo -h -o "%P %t %c" | sed 's/^/slurm: /'
sed '/--gpus-per-task/d; /--partition/d' "$script" > "$tmp/job.sbatch"
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
common="--preset tiny --subgroup-size 10007 --seed 7 --quiet --policy cpu"
sub=(sbatch --wait --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --time=00:05:00)
DOS_ROOT=$root DOS_TRAIN=$train DOS_ARGS="$common --iterations 3" DOS_OUT=$tmp/out/a \
  timeout 240 "${sub[@]}" --output="$tmp/a.out" "$tmp/job.sbatch" >/dev/null
rc=$?
cat "$tmp/a.out" | grep -vE "^\s*$" | head -12
[ $rc -eq 0 ] || { echo "FAIL: the 2-rank job failed ($rc)"; exit 1; }
"$train" $common --iterations 3 --grad-parts 2 --save-params "$tmp/full.safetensors" >/dev/null || { echo "FAIL: one-process run"; exit 1; }
# the checkpoint's rank files hold master parameters: compare them with the one-process run's
python3 - "$tmp/full.safetensors" "$tmp/out/a/checkpoint" "$check" <<'PY' || exit 1
import importlib.util, json, os, struct, sys
full_path, ck, check_path = sys.argv[1:]
spec = importlib.util.spec_from_file_location("shard_check", check_path)
sc = importlib.util.module_from_spec(spec); spec.loader.exec_module(sc)
full, _ = sc.load(full_path)
flat = b"".join(full[name] for name in full)  # tensors in file order = flat parameter order
index = json.load(open(os.path.join(ck, "index.json")))
assert index["world"] == 2 and len(index["ranks"]) == 2, index
# the ranks' slices cover the whole parameter vector, in order, without overlap
spans = sorted((r["begin"], r["end"]) for r in index["ranks"])
assert spans[0][0] == 0 and spans[-1][1] * 4 == len(flat), (spans, len(flat) // 4)
assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
for r in index["ranks"]:
    t, _ = sc.load(os.path.join(ck, r["file"]))
    got = t["master"]
    want = flat[4 * r["begin"]:4 * r["end"]]
    assert got == want, f"rank {r['rank']}: master differs from the one-process run's slice"
print("ok: the Slurm job's checkpoint holds exactly the one-process run's parameters (2 ranks)")
PY
# a job that cannot resume (rank 1's file removed): it fails, says why, and the checkpoint is kept
rm "$tmp/out/a/checkpoint/rank-00001-of-00002.safetensors"
before=$(cd "$tmp/out/a/checkpoint" && md5sum *)
DOS_ROOT=$root DOS_TRAIN=$train DOS_ARGS="$common --iterations 1" DOS_OUT=$tmp/out/b DOS_RESUME=$tmp/out/a/checkpoint \
  timeout 240 "${sub[@]}" --output="$tmp/b.out" "$tmp/job.sbatch" >/dev/null
rc=$?
[ $rc -ne 0 ] || { echo "FAIL: a job resuming from an incomplete checkpoint succeeded"; exit 1; }
grep -q "rank-00001-of-00002" "$tmp/b.out" || { echo "FAIL: the job's output does not say what is missing:"; cat "$tmp/b.out"; exit 1; }
[ "$(cd "$tmp/out/a/checkpoint" && md5sum *)" = "$before" ] || { echo "FAIL: the checkpoint folder changed"; exit 1; }
echo "ok: the failing job ($rc): $(grep -m1 "rank-00001-of-00002" "$tmp/b.out")"
