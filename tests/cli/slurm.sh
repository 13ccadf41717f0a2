#!/usr/bin/env bash
# Usage: slurm.sh AMPIPE SBATCH_SCRIPT
# A real single-host SLURM (munged, slurmctld and slurmd from Debian's packages, started here as root with a private
# configuration, ports and state directory) runs the documented sbatch script (scripts/slurm/ampipe-train.sbatch):
# a 2-rank `ampipe train` inside the allocation. Passes when the job completes and its log shows both ranks trained
# (EP 2, AMPipe degree 2) and saved; skipped (77) where the SLURM or munge daemons are not installed or not root.
set -u
bin=$1
script=$2
for c in munged mungekey slurmctld slurmd sbatch sinfo; do
  command -v "$c" >/dev/null 2>&1 || { echo "SKIP: $c is not installed (apt-get install slurmd slurmctld slurm-client munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the test starts the SLURM daemons and needs root"; exit 77; }
dir=$(mktemp -d /tmp/ampipe-slurm.XXXXXX)
chmod 755 "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
logs() { for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; }
fail() { echo "FAIL: $*"; logs; exit 1; }
# The daemons not coming up is this machine's environment (no loopback name, a sandbox that forbids them), not
# ampipe: said, with their logs, and skipped. Everything after the node is idle is the test.
skip_env() { echo "SKIP: $* (the SLURM daemons could not run here)"; logs; exit 77; }

# munge: a fresh key and a private socket
mkdir -p "$dir/munge"
mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" --pid-file="$dir/munge/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" || skip_env "munged did not start"
pids+=("$(cat "$dir/munge/munged.pid")")

host=$(hostname -s)
cpus=$(nproc)
port=$((20000 + RANDOM % 20000))
cat >"$dir/slurm.conf" <<CONF
ClusterName=ampipe-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
mkdir -p "$dir/state" "$dir/spool"
export SLURM_CONF=$dir/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$dir/slurmd.out.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  state=$(sinfo -h -o %t 2>/dev/null | head -1)
  [ "$state" = "idle" ] && break
  sleep 0.5
done
[ "$state" = "idle" ] || skip_env "the node did not become idle (sinfo: ${state:-no answer})"

# The same launch line twice (Megatron's start-or-resume with --load DIR --save DIR): the first job starts the run
# and saves at iteration 4, the second resumes there and trains to 6.
# Each job is bounded (timeout) so that a job that never starts or never ends fails with the scheduler's view of it
# (squeue, scontrol, sinfo) and the daemons' logs, instead of being killed by CTest with nothing said.
job() {  # job ITERS OUT
  AMPIPE=$bin MPIRUN_FLAGS="--bind-to none --oversubscribe" timeout 150 sbatch --wait --chdir="$dir" --output="$2" --ntasks=2 \
    --time=5 "$script" --num-experts 4 --num-layers 1 --expert-model-parallel-size 2 --ampipe-degree 2 \
    --use-flash-attn --train-iters "$1" --log-interval 1 --eval-iters 0 --load "$dir/ckpt" --save "$dir/ckpt" \
    >"$dir/sbatch.log" 2>&1 || fail "sbatch --wait failed or ran past 150 s: $(cat "$dir/sbatch.log") $(tail -20 "$2" 2>&1)
$(squeue -a 2>&1) $(scontrol show job 2>&1 | head -40) $(sinfo -N -l 2>&1)"
}
job 4 "$dir/job1.out"
out=$dir/job1.out
grep -Eq "ranks=2 ep=2" "$out" || fail "the job did not run 2 ranks with EP 2: $(head -20 "$out")"
grep -q "no checkpoint there" "$out" || fail "the first job did not start fresh: $(head -20 "$out")"
grep -Eq "iteration +4/ +4" "$out" || fail "the job did not train 4 iterations: $(tail -20 "$out")"
grep -q "saved checkpoint at iteration 4" "$out" || fail "the job did not save: $(tail -20 "$out")"
job 6 "$dir/job2.out"
out=$dir/job2.out
grep -q "resumed from $dir/ckpt at iteration 4" "$out" || fail "the second job did not resume: $(head -20 "$out")"
grep -Eq "iteration +6/ +6" "$out" || fail "the second job did not train to 6: $(tail -20 "$out")"
! grep -Eq "iteration +[1-4]/" "$out" || fail "the second job trained again from the start"
echo "ok: sbatch ran a 2-rank ampipe train (EP 2, AMPipe degree 2) in a SLURM allocation, then resumed it in a second job"
