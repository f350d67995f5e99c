#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, every file under one folder (tests and CI use it).
#
#   scripts/slurm_local.sh install          # apt-get install slurm-wlm munge when missing (root, Debian/Ubuntu)
#   scripts/slurm_local.sh start DIR        # install if needed, start munged, slurmctld and slurmd; print the env line
#   scripts/slurm_local.sh stop DIR         # cancel its jobs, then stop the daemons this folder started, by their PIDs
#   eval "$(scripts/slurm_local.sh env DIR)" # then sbatch/srun/squeue talk to this cluster
#
# Environment (defaults): SLURM_LOCAL_CTLD_PORT (6817), SLURM_LOCAL_SLURMD_PORT (6818),
# SLURM_LOCAL_KILL_WAIT (5: seconds between SIGTERM and SIGKILL when a job ends or is requeued).
# Exit codes: 0 done, 1 a daemon failed (its log is printed), 3 Slurm cannot be installed or run here (no root, no apt-get).
set -euo pipefail

SLURM_BINARIES=(sbatch srun scontrol sinfo squeue scancel slurmctld slurmd munge unmunge munged)

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

missing_binaries() {
  local name
  for name in "${SLURM_BINARIES[@]}"; do
    command -v "$name" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$name" >/dev/null 2>&1 || echo "$name"
  done
}

install_slurm() {
  local log=$1
  export PATH="$PATH:/usr/sbin:/sbin"
  [[ -z "$(missing_binaries)" ]] && return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "slurm_local: Slurm is not installed and installing it needs root (missing: $(missing_binaries | xargs))" >&2
    exit 3
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm_local: Slurm is not installed and there is no apt-get to install it (missing: $(missing_binaries | xargs))" >&2
    exit 3
  fi
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; } >"$log" 2>&1; then
    echo "slurm_local: apt-get install slurm-wlm munge failed: $(tail -n 1 "$log")" >&2
    exit 3
  fi
}

munge_works() {
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

start_munge() {
  local dir=$1
  munge_works && return 0
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  su -s /bin/sh munge -c munged
  local _
  for _ in $(seq 50); do
    if munge_works; then
      cp /run/munge/munged.pid "$dir/munged.pid"
      return 0
    fi
    sleep 0.1
  done
  echo "slurm_local: munged did not start: $(tail -n 3 /var/log/munge/munged.log 2>/dev/null)" >&2
  exit 1
}

write_config() {
  local dir=$1 host cpus memory
  host=$(hostname -s)
  cpus=$(nproc --all)  # the machine's, not OMP_NUM_THREADS (which plain nproc honours)
  memory=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  mkdir -p "$dir/state" "$dir/spool"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${SLURM_LOCAL_CTLD_PORT:-6817}
SlurmdPort=${SLURM_LOCAL_SLURMD_PORT:-6818}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
KillWait=${SLURM_LOCAL_KILL_WAIT:-5}
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

wait_for_node() {
  local dir=$1 _
  for _ in $(seq 120); do
    if sinfo -h -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; then
      return 0
    fi
    sleep 0.5
  done
  echo "slurm_local: the node did not come up; slurmctld.log and slurmd.log say:" >&2
  tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
}

start_cluster() {
  local dir
  mkdir -p "$1"
  dir=$(cd "$1" && pwd)
  install_slurm "$dir/apt-get.log"
  export PATH="$PATH:/usr/sbin:/sbin"
  if [[ $(id -u) -ne 0 ]]; then
    echo "slurm_local: a local slurmd must run as root (it starts jobs as their user)" >&2
    exit 3
  fi
  stop_cluster "$dir" 2>/dev/null || true
  start_munge "$dir"
  write_config "$dir"
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" || { tail -n 5 "$dir/slurmctld.log" >&2; exit 1; }
  slurmd -f "$SLURM_CONF" || { tail -n 5 "$dir/slurmd.log" >&2; exit 1; }
  wait_for_node "$dir"
  print_env "$dir"
}

stop_pid_file() {
  local file=$1 pid _
  [[ -f "$file" ]] || return 0
  pid=$(cat "$file")
  if [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

cancel_jobs() {
  # A job's steps outlive slurmd: cancel every job of this cluster and wait (KillWait, then SIGKILL) until none is left.
  local dir=$1 _
  [[ -f "$dir/slurmctld.pid" ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null || return 0
  export SLURM_CONF=$dir/slurm.conf
  local ids
  ids=$(squeue -h -o "%A" 2>/dev/null | sort -u | xargs) || return 0
  [[ -n "$ids" ]] || return 0
  # shellcheck disable=SC2086
  scancel $ids 2>/dev/null || true
  for _ in $(seq 150); do
    [[ -z "$(squeue -h -o '%A' 2>/dev/null)" ]] && return 0
    sleep 0.2
  done
  echo "slurm_local: jobs still listed after scancel: $(squeue -h -o '%A %T' 2>/dev/null | xargs)" >&2
}

stop_cluster() {
  local dir=$1
  cancel_jobs "$dir"
  stop_pid_file "$dir/slurmd.pid"
  stop_pid_file "$dir/slurmctld.pid"
  stop_pid_file "$dir/munged.pid"
}

print_env() {
  local dir
  dir=$(cd "$1" && pwd)
  echo "export SLURM_CONF=$dir/slurm.conf"
}

command=${1:-}
case "$command" in
  install) install_slurm "$(mktemp)" ;;
  start) [[ $# -eq 2 ]] || usage; start_cluster "$2" ;;
  stop) [[ $# -eq 2 ]] || usage; stop_cluster "$2" ;;
  env) [[ $# -eq 2 ]] || usage; print_env "$2" ;;
  *) usage ;;
esac
