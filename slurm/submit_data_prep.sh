#!/usr/bin/env bash
# Queue data prep on Slurm: an array of SHARDS tasks (one shard each), then the merge, afterok on the whole array.
#   slurm/submit_data_prep.sh CONFIG SHARDS [SBATCH_OPTION ...]
# Run it from the project root. The extra options go to both sbatch calls (e.g. --partition=cpu --account=me).
# Environment (defaults): LOG_DIR (logs) for one log per task and job; PYTHON and PUSH_TO_HUB reach the jobs.
# Prints the two job ids: ARRAY_JOB_ID MERGE_JOB_ID.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
CONFIG=$1
SHARDS=$2
shift 2
if ! [[ "$SHARDS" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: SHARDS must be a positive integer, got '$SHARDS'" >&2
  exit 2
fi
if [[ ! -f "$CONFIG" ]]; then
  echo "error: $CONFIG: no such config file" >&2
  exit 2
fi
LOG_DIR=${LOG_DIR:-logs}
mkdir -p "$LOG_DIR"
HERE=$(cd "$(dirname "$0")" && pwd)

array=$(sbatch --parsable --array="0-$((SHARDS - 1))" --output="$LOG_DIR/%x-%A_%a.out" "$@" "$HERE/data_prep_shard.sbatch" "$CONFIG")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes --output="$LOG_DIR/%x-%j.out" "$@" \
  "$HERE/data_prep_merge.sbatch" "$CONFIG")
merge=${merge%%;*}
echo "$array $merge"
