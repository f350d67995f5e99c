#!/usr/bin/env bash
# Queue slurm/train.sbatch with its log folder made first: sbatch opens --output before the job's script runs, so a
# missing folder would lose the job's log (Slurm writes nowhere and says nothing).
#   slurm/submit_train.sh [SBATCH_OPTION=VALUE ...] CONFIG [LightningCLI overrides ...]
# Run it from the project root. Options before CONFIG go to sbatch (--partition=gpu --account=me --nodes=4, in the
# --name=value form); what follows CONFIG goes to the fit. Environment (defaults): LOG_DIR (logs), and RUN_DIR, RESUME,
# STRATEGY, PYTHON and the rest of train.sbatch's reach the job. Prints the job id.
set -euo pipefail

options=()
while [[ $# -gt 0 && "$1" == -* ]]; do
  options+=("$1")
  shift
done
[[ $# -ge 1 ]] || { sed -n '4,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ -f "$1" ]] || { echo "error: $1: no such config file" >&2; exit 2; }
mkdir -p "${LOG_DIR:=logs}"
job=$(sbatch --parsable --output="$LOG_DIR/%x-%j.out" ${options[@]+"${options[@]}"} "$(dirname "$0")/train.sbatch" "$@")
echo "${job%%;*}"
