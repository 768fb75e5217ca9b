#!/usr/bin/env bash
# SlurmDeployTest: deploy/slurm/trainyard.sbatch on a real single-host Slurm (Debian's
# slurm-wlm and munge). The test writes a slurm.conf in its own temp directory, starts munged,
# slurmctld and slurmd on free loopback ports, installs the build into a prefix, and
#   1. sbatches the tiny example and requires the Slurm job to succeed with exit code 0;
#   2. sbatches a longer job that checkpoints, sends the preemption signal mid-run
#      (scancel --signal=USR1 --batch), and requires the script to drain and requeue itself and
#      the requeued run to resume from the drain's checkpoint and succeed;
#   3. kills every process of a running job with SIGKILL and requeues it (as when a node
#      fails) and requires the requeued coordinator to carry on with the same job, resumed from
#      its newest checkpoint;
#   4. cancels a running job with scancel (SIGTERM to the script and every step) and requires the
#      job to drain at a checkpoint before Slurm ends it.
# Every daemon is stopped by its pid at the end, also on failure. Skips (77) without root or
# without the Slurm and munge programs.
#
# Usage: slurm_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail

SRC=$1
BUILD=$2
skip() { echo "SKIPPED: $*"; exit 77; }
fail() {
  echo "FAILED: $*" >&2
  for f in "$T"/out-*.txt "$T"/slurmctld.log "$T"/slurmd.log "$T"/state-*/server.log \
    "$T"/state-*/agents.log; do
    [[ -f "$f" ]] && { echo "----- $f" >&2; tail -n 40 "$f" >&2; }
  done
  exit 1
}

[[ $(id -u) -eq 0 ]] || skip "slurmd and munged need root here"
for p in munged mungekey slurmctld slurmd sbatch squeue scontrol scancel srun; do
  command -v "$p" >/dev/null || skip "$p is not installed (tools/setup.sh installs slurm-wlm and munge)"
done

T=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-slurm.XXXXXX")
chmod 755 "$T"
pids=()
cleanup() {
  # Jobs first (their steps run under slurmd), then the daemons, newest first.
  if [[ -f "$T/slurm.conf" ]]; then
    SLURM_CONF="$T/slurm.conf" timeout 10 scancel --full --quiet --partition=debug 2>/dev/null
    for _ in $(seq 1 50); do
      [[ -z "$(SLURM_CONF="$T/slurm.conf" timeout 5 squeue -h 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$T"
}
trap cleanup EXIT

free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
}

# ---- munge and Slurm ----------------------------------------------------------------------------
mungekey --create --keyfile="$T/munge.key" >/dev/null 2>&1 || fail "mungekey"
chmod 600 "$T/munge.key"
munged --foreground --force --socket="$T/munge.sock" --key-file="$T/munge.key" \
  --pid-file="$T/munged.pid" --log-file="$T/munged.log" --seed-file="$T/munged.seed" \
  >"$T/munged.out" 2>&1 &
pids+=($!)

HOST=$(hostname -s)
read -r CTLD_PORT SLURMD_PORT < <(free_ports 2)
mkdir -p "$T/slurm-state" "$T/slurm-spool"
cat >"$T/slurm.conf" <<EOF
ClusterName=trainyardtest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
StateSaveLocation=$T/slurm-state
SlurmdSpoolDir=$T/slurm-spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
PlugStackConfig=/dev/null
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$T/slurm.conf"
for _ in $(seq 1 50); do [[ -S "$T/munge.sock" ]] && break; sleep 0.1; done
[[ -S "$T/munge.sock" ]] || fail "munged did not start: $(cat "$T/munged.out")"
slurmctld -D -i -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %T 2>/dev/null | grep -q idle || fail "the Slurm node did not come up: $(sinfo 2>&1)"

# ---- the project, installed -----------------------------------------------------------------------
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null || fail "cmake --install"
export TRAINYARD_BIN_DIR="$T/prefix/bin"
export TRAINYARD_AGENT_ARGS="--memory-tier-mb 0"
SBATCH="$SRC/deploy/slurm/trainyard.sbatch"

# sbatch_job NAME SPEC [SBATCH FLAGS...]: submits and prints the Slurm job id.
sbatch_job() {
  local name=$1 spec=$2
  shift 2
  TRAINYARD_STATE_DIR="$T/state-$name" sbatch --parsable --chdir="$T" \
    --output="$T/out-$name.txt" "$@" "$SBATCH" "$spec"
}
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
wait_state() {  # JOB STATE SECONDS
  for _ in $(seq 1 $(($3 * 5))); do
    [[ "$(job_field "$1" JobState)" == "$2" ]] && return 0
    sleep 0.2
  done
  fail "Slurm job $1 is $(job_field "$1" JobState), not $2, after $3 s"
}
wait_checkpoint() {  # DIR: a committed checkpoint appears there within 60 s
  for _ in $(seq 1 600); do
    compgen -G "$1/step-*/manifest.json" >/dev/null && return 0
    sleep 0.1
  done
  fail "no checkpoint in $1 within 60 s"
}
# Slurm holds a requeued job until its begin time (about two minutes later): release it, and
# require it to run to the end with exit code 0. slurmd revoked the first run's credential at the
# requeue and refuses a credential created in the same whole second ("Job credential revoked",
# and the job ends FAILED), so the release waits two seconds first.
release_and_finish() {  # JOB
  wait_state "$1" PENDING 120
  sleep 2
  scontrol update JobId="$1" StartTime=now || fail "scontrol update StartTime"
  wait_state "$1" COMPLETED 180
  [[ "$(job_field "$1" ExitCode)" == 0:0 ]] || fail "job $1: exit code $(job_field "$1" ExitCode)"
}

# ---- 1: the tiny example runs to the end ----------------------------------------------------------
echo "== tiny example"
id=$(sbatch_job tiny "$SRC/config/examples/tiny.yaml" --wait) || fail "sbatch --wait of the tiny example exited $?"
[[ "$(job_field "$id" JobState)" == COMPLETED ]] || fail "tiny: Slurm says $(job_field "$id" JobState)"
[[ "$(job_field "$id" ExitCode)" == 0:0 ]] || fail "tiny: exit code $(job_field "$id" ExitCode)"
grep -q "SUCCEEDED" "$T/out-tiny.txt" || fail "tiny: no SUCCEEDED in the script's output"
echo "ok: Slurm job $id COMPLETED, exit 0"

# ---- 2: preempted mid-run, requeued, resumed from the drain's checkpoint --------------------------
echo "== preemption"
cat >"$T/long.yaml" <<EOF
name: long
model: {preset: gpt2-debug}
data:
  source: markov
  markov: {order: 1, vocab: 32, concentration: 0.05, train_tokens: 1000000, val_tokens: 65536, seed: 7}
training: {steps: 4000, batch: 16, seq_len: 32, seed: 1, lr: 3.0e-3, log_every: 100}
checkpoint: {dir: $T/ckpt, every_steps: 500, keep: 2}
EOF
id=$(sbatch_job long "$T/long.yaml") || fail "sbatch of the long job"
wait_checkpoint "$T/ckpt"
scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1"
# The script drains and requeues itself.
release_and_finish "$id"
[[ "$(job_field "$id" Restarts)" == 1 ]] || fail "long: $(job_field "$id" Restarts) restarts, not 1"
out="$T/out-long.txt"
grep -q "DRAINED" "$out" || fail "the first run did not drain"
grep -q "requeueing Slurm job $id" "$out" || fail "the first run did not requeue itself"
resumed=$(grep -o "resumed from step [0-9]*" "$out" | tail -n 1 | grep -o "[0-9]*$")
[[ -n "$resumed" && "$resumed" -gt 0 ]] || fail "the requeued run did not resume from a checkpoint"
grep -q "SUCCEEDED" "$out" || fail "the requeued run did not succeed"
echo "ok: drained, requeued, resumed from step $resumed, COMPLETED with exit 0"

# ---- 3: requeued by Slurm mid-run (as after a node failure): the coordinator carries on -----------
echo "== requeue"
sed "s#$T/ckpt#$T/ckpt-requeue#; s/^name: long/name: requeued/" "$T/long.yaml" >"$T/requeued.yaml"
id=$(sbatch_job requeued "$T/requeued.yaml") || fail "sbatch of the requeued job"
wait_checkpoint "$T/ckpt-requeue"
# The coordinator may not have recorded that checkpoint yet (it does when rank 0's report of it
# arrives, which the kill below can prevent): the job resumes from it either way.
recorded="recorded"
grep -q "checkpoint of step [0-9]* committed" "$T/state-requeued/server.log" 2>/dev/null ||
  recorded="not yet recorded"
# A node failure: everything on the node dies at once, and nothing drains (an administrator's
# `scontrol requeue`, like scancel even with --signal=KILL, sends SIGTERM first, and the job
# would drain). So SIGKILL every process Slurm counts as the job's, and let Slurm queue the job
# again, as it does a job whose node failed.
job_pids=$(scontrol listpids "$id" 2>/dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ {print $1}')
[[ -n "$job_pids" ]] || fail "scontrol listpids $id lists no process"
# shellcheck disable=SC2086  # one pid per word
kill -KILL $job_pids 2>/dev/null
for _ in $(seq 1 300); do
  [[ "$(job_field "$id" JobState)" =~ ^(RUNNING|COMPLETING)$ ]] || break
  sleep 0.2
done
scontrol requeue "$id" || fail "scontrol requeue (Slurm says $(job_field "$id" JobState))"
release_and_finish "$id"
out="$T/out-requeued.txt"
grep -q "carrying on with j-000001" "$out" || fail "the requeued run did not carry on with the job"
resumed=$(grep -o "resumed from step [0-9]*" "$out" | tail -n 1 | grep -o "[0-9]*$")
[[ -n "$resumed" && "$resumed" -gt 0 ]] || fail "the job did not resume from a checkpoint after the requeue"
grep -q "SUCCEEDED" "$out" || fail "the requeued job did not succeed"
echo "ok: killed and requeued by Slurm (the checkpoint $recorded by the coordinator), the same job resumed from step $resumed, COMPLETED with exit 0"

# ---- 4: cancelled mid-run (scancel: SIGTERM to the script and every process of every step) ------
# The ranks ask the coordinator, which drains the job and outlives the drain, as the agents do:
# the job ends DRAINED at a checkpoint of the step its ranks agreed on, within Slurm's KillWait.
echo "== scancel"
sed "s#$T/ckpt#$T/ckpt-cancel#; s/^name: long/name: cancelled/" "$T/long.yaml" >"$T/cancelled.yaml"
id=$(sbatch_job cancelled "$T/cancelled.yaml") || fail "sbatch of the cancelled job"
wait_checkpoint "$T/ckpt-cancel"
scancel "$id" || fail "scancel"
wait_state "$id" CANCELLED 60
out="$T/out-cancelled.txt"
# The watch's outcome line: "JOB cancelled DRAINED after ... | drained at step N: checkpoint ...".
grep -q " cancelled DRAINED " "$out" || fail "the cancelled job did not end DRAINED: $(tail -n 5 "$out")"
drained=$(grep -o "drained at step [0-9]*" "$out" | tail -n 1 | grep -o "[0-9]*$")
[[ -n "$drained" ]] || fail "the cancelled job's outcome names no drain checkpoint"
compgen -G "$T/ckpt-cancel/step-$(printf %08d "$drained")-*" >/dev/null ||
  fail "no checkpoint of step $drained in $T/ckpt-cancel"
grep -q "drain_requested .*received" "$T/state-cancelled/server.log" ||
  fail "the coordinator's log names no signal as the drain's cause"
echo "ok: cancelled by Slurm, drained at step $drained with its checkpoint"
