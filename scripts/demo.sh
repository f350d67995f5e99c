#!/usr/bin/env bash
# The whole pipeline on small slices of the bundled data with the bundled CPU models (make demo).
# Every stage runs for real: build (turn units and LLM units), activate + ask, retrieval eval,
# data prep, fit, export, and ask through the exported model. Outputs go to $DEMO_OUT. Each command prints
# its own progress bars and summary lines; QGMEM_LOG_LEVEL=INFO make demo also shows the libraries' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${DEMO_OUT:-out/demo}
CONFIG=configs/demo-cpu.yaml
rm -rf "$OUT" checkpoints/demo-cpu out/data_prep/demo-cpu
mkdir -p "$OUT"
step() { printf '\n== %s\n' "$*"; }
started=$SECONDS

step "1/9 models: resolve both bundled models, one schema-valid JSON record, a few embeddings, which reranker"
$PY -m qgmem_train doctor --config $CONFIG

step "2/9 build: LoCoMo sample, one unit per turn (no LLM)"
$PY -m qgmem_train build --dataset locomo --input samples/locomo_sample.json --store "$OUT/locomo" --units turns --config $CONFIG

step "3/9 build: a user's own chat (first session) with the paper's two-stage LLM extraction"
$PY -m qgmem_train build --dataset jsonl --input samples/plain_chat.jsonl --store "$OUT/alex" --units llm --limit-sessions 1 --config $CONFIG

step "4/9 activate + answer: working memory over the LLM-built store"
$PY -m qgmem_train ask --store "$OUT/alex" --config $CONFIG --time 2024-05-01 "Where does Alex walk Biscuit?"

step "5/9 retrieval evaluation on the LoCoMo sample (rule intent, RRF order)"
$PY -m qgmem_train eval retrieval --dataset locomo --input samples/locomo_sample.json --store "$OUT/locomo" \
  --out "$OUT/eval" --config $CONFIG --intent rules
cat "$OUT/eval/metrics.json"

step "6/9 data prep: ConvoMem-format cases through the frozen pipeline"
$PY -m data_prep --config configs/data_prep/demo-cpu.yaml

step "7/9 fit: graph encoder + projector against the frozen SmolLM2 on the data-prep output"
$PY -m qgmem_train fit --config $CONFIG --data.path out/data_prep/demo-cpu/dataset --trainer.max_steps 6 --trainer.val_check_interval 3

step "8/9 export: adapter, config, prompts, model card, checksums"
$PY -m export --checkpoint checkpoints/demo-cpu/ckpt/last.ckpt --config $CONFIG --out "$OUT/export" --dry-run

step "9/9 ask through the exported model (graph token path)"
$PY -m qgmem_train ask --model "$OUT/export" --store "$OUT/alex" --time 2024-05-01 "Where does Alex walk Biscuit?"

printf '\ndemo finished in %ss; outputs in %s\n' "$((SECONDS - started))" "$OUT"
