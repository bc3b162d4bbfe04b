#!/usr/bin/env bash
# audit --slurm (issue 42, lib/kvasir/audit/slurm.hpp) on a real Slurm cluster of one machine:
# munged, slurmctld and slurmd (Debian's slurm-wlm and munge, installed by scripts/setup.sh)
# started here on private ports with their state in a temporary folder. The fixture audit runs
# as a job array of node captures and a dependent compare job; its report equals the local
# audit's (every node's verdict and criteria, every step's figures) and the compare job's exit
# status is the local audit's. Also: the jobs are written without submitting (nothing runs, no
# node is started), a folder holding another audit's jobs is refused (exit 2, one line).
# Usage: test_slurm.sh PATH/TO/kvasir-equiv   (run from the repo root; root, as the daemons need)
set -u
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
for d in munged slurmctld slurmd sbatch squeue; do
  if ! command -v $d >/dev/null; then echo "FAIL: $d missing (scripts/setup.sh installs slurm-wlm and munge)"; echo "1 failed"; exit 1; fi
done
if [ "$(id -u)" -ne 0 ]; then echo "FAIL: the Slurm daemons of this test need root"; echo "1 failed"; exit 1; fi
tmp=$(mktemp -d)
sl="$tmp/slurm"
mkdir -p "$sl/state" "$sl/spool" "$sl/log" "$sl/munge"
cleanup() {
  [ -f "$sl/slurmd.pid" ] && kill "$(cat "$sl/slurmd.pid")" 2>/dev/null
  [ -f "$sl/slurmctld.pid" ] && kill "$(cat "$sl/slurmctld.pid")" 2>/dev/null
  [ -f "$sl/munge/pid" ] && kill "$(cat "$sl/munge/pid")" 2>/dev/null
  sleep 1
  rm -rf "$tmp"
}
trap cleanup EXIT
host=$(hostname -s)
port=$((20000 + RANDOM % 20000))
dd if=/dev/urandom of="$sl/munge/munge.key" bs=1024 count=1 2>/dev/null && chmod 400 "$sl/munge/munge.key"
munged --force -S "$sl/munge/sock" --key-file="$sl/munge/munge.key" --log-file="$sl/munge/log" \
  --pid-file="$sl/munge/pid" --seed-file="$sl/munge/seed"
cat >"$sl/slurm.conf" <<CONF
ClusterName=kvasirtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sl/munge/sock
CredType=cred/munge
StateSaveLocation=$sl/state
SlurmdSpoolDir=$sl/spool
SlurmctldPidFile=$sl/slurmctld.pid
SlurmdPidFile=$sl/slurmd.pid
SlurmctldLogFile=$sl/log/slurmctld.log
SlurmdLogFile=$sl/log/slurmd.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$host CPUs=$(nproc) RealMemory=2000 State=UNKNOWN
PartitionName=kvasir Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$sl/slurm.conf"
slurmctld -f "$SLURM_CONF" && slurmd -f "$SLURM_CONF"
up=0
for _ in $(seq 1 60); do sinfo -h -o %t 2>/dev/null | grep -q idle && { up=1; break; }; sleep 0.5; done
check "a one-machine Slurm cluster is up (slurmctld + slurmd, munge auth)" test $up -eq 1

nodes=cpu-ref,cpu,opencl:0,cpu:acc=f16
"$bin" audit -b $nodes -o "$tmp/local.json" >/dev/null 2>&1; local_rc=$?

# Written, not submitted: nothing runs, the files say what would.
"$bin" audit -b $nodes --slurm "$tmp/jobs0" >"$tmp/w.out" 2>&1; rc=$?
check "audit --slurm without --slurm-submit → exit 0, jobs written, nothing captured" \
  bash -c "[ $rc -eq 0 ] && [ -x '$tmp/jobs0/submit.sh' ] && grep -q 'array=0-3' '$tmp/jobs0/captures-cpu.sbatch' && [ ! -e '$tmp/jobs0/node-0.safetensors' ]"
expect_usage_error "holds another audit's jobs" audit -b $nodes --slurm "$tmp/jobs0"

"$bin" audit -b $nodes --slurm "$tmp/jobs" --slurm-submit >"$tmp/s.out" 2>&1; rc=$?
check "audit --slurm --slurm-submit → exit 0: $(tail -1 "$tmp/s.out")" test $rc -eq 0
done_=0
[ $rc -eq 0 ] && for _ in $(seq 1 600); do [ -s "$tmp/jobs/exit_status" ] && { done_=1; break; }; sleep 1; done
check "the compare job ran after the capture array" test $done_ -eq 1
check "the Slurm audit's exit status is the local audit's ($local_rc)" test "$(cat "$tmp/jobs/exit_status" 2>/dev/null)" = "$local_rc"
check "the Slurm audit's report equals the local audit's (verdicts, criteria, every step's figures)" \
  python3 - "$tmp/local.json" "$tmp/jobs/report.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["nodes"] == b["nodes"], "nodes differ"
skip = {"captures", "isolation"}
for step in sorted(set(a["steps"]) | set(b["steps"])):
    if step in skip:
        continue
    assert a["steps"].get(step) == b["steps"].get(step), step
assert a["pairs"] == b["pairs"] and a["drift"] == b["drift"] and a["exit_code"] == b["exit_code"]
print("  %d nodes: %s" % (len(a["nodes"]), ", ".join(n["node"] + "=" + n["verdict"] for n in a["nodes"])))
PY
if [ $failures -ne 0 ]; then tail -5 "$sl/log/slurmctld.log" "$sl/log/slurmd.log" "$tmp"/jobs/*.log 2>/dev/null; fi
echo "$failures failed"
[ "$failures" -eq 0 ]
