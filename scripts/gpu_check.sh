#!/usr/bin/env bash
# GPU check of training on one CUDA GPU (bench/gpu_check.py): the CUDA-marked tests; training steps over a random
# Qwen3-8B-shaped backbone (4 layers, built once from config) with gradient checkpointing off vs on (bf16), bf16 vs NF4,
# NF4 without vs with LoRA, each pair alternated for 5 rounds (order reversed every other round) in
# one process with device time from CUDA events, a difference claimed only from paired round ratios past 5%; the prefix cache timed on a random Qwen3-8B-shaped decoder at 600
# tokens, batch 4 and 1 (off, explicit mask, bottom-right bias; fp32 logits check); and predict. Writes
# bench/results/gpu.md and gpu.json. Each part runs in its own process under its own limit (they add up to 7 minutes at
# most, about 5 expected: half the device's 15, so a rerun fits); a part over its limit is killed and recorded as timed out.
#
#   scripts/gpu_check.sh prepare        # here (network, .venv): what the GPU machine lacks, into .gpu_check/
#   scripts/gpu_check.sh [OPTION ...]   # on the GPU machine; options go to bench/gpu_check.py (--smoke: seconds)
#
# The GPU machine may reach no network, and a .venv does not travel to it (gigabytes, and built for this Python).
# Python there: $PYTHON, else .venv/bin/python when it runs there and sees CUDA (a checkout built in place), else
# python3 (the H200 image's, which holds torch, lightning, transformers, peft and torch_geometric). `prepare`
# downloads wheels of the other packages the checked code imports, as installed in .venv, for Python 3.12 on
# x86-64, into .gpu_check/wheels (installed there under $TMPDIR, first on PYTHONPATH), and keeps the configs and
# tokenizers of the bundled SmolLM2 and MiniLM in .gpu_check/models: their weights (about 90 MB each) do not
# travel, so random weights of the same architecture stand in (step time and memory do not depend on them).
# .gpu_check is about 40 MB; .gitignore lists it, so name it in the run's carry.
# Environment (defaults): PYTHON (see above), GPU_CHECK_DIR (.gpu_check), GPU_CUDA (13), LIMITS (seconds per part:
# GPU_LIMITS below, or SMOKE_LIMITS with --smoke). Exit 0 when every part passed or was skipped.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
STATE=${GPU_CHECK_DIR:-.gpu_check}
GPU_LIMITS="tests:50 bf16:80 prefix_cache:120 nf4:60 lora_nf4:60 predict:50"
SMOKE_LIMITS="tests:600 bf16:600 prefix_cache:600 nf4:600 lora_nf4:600 predict:600"  # --smoke: a shared CPU, no device budget
if [[ " $* " == *" --smoke "* ]]; then LIMITS=${LIMITS:-$SMOKE_LIMITS}; else LIMITS=${LIMITS:-$GPU_LIMITS}; fi
# Packages the checked code imports that the H200 image lacks (device KINDS.md's list), and the pinned ones it holds at
# other versions (transformers 5.17 there names the decoder's cache argument past_key_values, 5.24 cache), at .venv's
# versions. The bitsandbytes wheel keeps only its libraries for CUDA $GPU_CUDA (13: the H200 image's), so that the
# working tree and .gpu_check stay under the 64 MiB that travels.
WHEELS=(bitsandbytes datasets dill multiprocess pydantic pydantic-core annotated-types typing-inspection llguidance
  transformers peft torch-geometric)
PLATFORMS=(manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64
  manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

prepare() {
  local py=${PYTHON:-.venv/bin/python} package version platforms=()
  for platform in "${PLATFORMS[@]}"; do platforms+=(--platform "$platform"); done
  mkdir -p "$STATE/wheels"
  "$py" bench/gpu_check.py --export-models "$STATE/models" >/dev/null || exit 1
  for package in "${WHEELS[@]}"; do
    version=$("$py" -c "from importlib.metadata import version; print(version('$package'))") || exit 1
    if ! "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
      -d "$STATE/wheels" "$package==$version" 2>"$STATE/pip.log"; then
      echo "prepare: no wheel of $package==$version for Python 3.12 x86-64 ($(tail -n 1 "$STATE/pip.log"))" >&2
    fi
  done
  rm -f "$STATE/pip.log"
  for wheel in "$STATE"/wheels/bitsandbytes-*.whl; do
    [[ -f "$wheel" ]] && { "$py" bench/gpu_check.py --slim-wheel "$wheel" --cuda "${GPU_CUDA:-13}" || exit 1; }
  done
  echo "prepared $STATE ($(du -sh "$STATE" | cut -f1)): wheels of ${WHEELS[*]}; configs and tokenizers in $STATE/models"
}

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    echo "$PYTHON"
  elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo .venv/bin/python
  else
    echo python3
  fi
}

if [[ "${1:-}" == prepare ]]; then
  prepare
  exit 0
fi

PY=$(pick_python)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$PY" != .venv/bin/python ]] && compgen -G "$STATE/wheels/*.whl" >/dev/null; then
  site="${TMPDIR:-/tmp}/qgmem-gpu-check-site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$STATE"/wheels/*.whl || exit 1
  export PYTHONPATH="$ROOT:$site${PYTHONPATH#"$ROOT"}"
fi
models=()
[[ -d "$STATE/models" ]] && models=(--models "$STATE/models")
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch; set PYTHON to an interpreter with a CUDA torch" >&2
  exit 1
fi
echo "gpu_check: $PY ($("$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"))"

run_id=$(date +%s)-$$
status=0
for entry in $LIMITS; do
  part=${entry%%:*} limit=${entry#*:}
  timeout --kill-after=15 "$limit" "$PY" bench/gpu_check.py --part "$part" --run-id "$run_id" "${models[@]}" "$@"
  rc=$?
  case $rc in
    0) ;;
    1) status=1 ;;
    124 | 137) status=1; "$PY" bench/gpu_check.py --mark "$part" --timed-out --note "killed at its $limit s limit" --run-id "$run_id" "$@" ;;
    *) status=1; "$PY" bench/gpu_check.py --mark "$part" --note "exited with code $rc" --run-id "$run_id" "$@" ;;
  esac
done
exit $status
