"""The model card (README.md) of an export: what it is, how to use it, its data and licences, its metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qgmem_train.graph.shuffle_gap import graph_reading_line

LOCOMO_LICENCE = "CC BY-NC 4.0 (LoCoMo, Maharana et al., ACL 2024): non-commercial use, attribution required"
SOURCE_LICENCES = {
    "convomem": f"ConvoMem-format cases re-packed from LoCoMo: content {LOCOMO_LICENCE}; ConvoMem code Apache-2.0",
    "locomo": f"LoCoMo conversations: {LOCOMO_LICENCE}",
}
"""Licence notes by source-dataset prefix (the ``source_dataset`` column of the trajectories)."""


def source_licence(source: str) -> str | None:
    """The licence note of a training source, or ``None`` when the source is not one this project knows."""
    for prefix, note in SOURCE_LICENCES.items():
        if source.lower().startswith(prefix):
            return note
    return None


def card_licence(sources: Mapping[str, int] | None) -> str:
    """The card's ``license`` tag: non-commercial when any LoCoMo-derived source (or an unknown one) trained it."""
    if sources and all(source_licence(s) is None for s in sources):
        return "other"
    return "cc-by-nc-4.0"


def _yaml_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def reranker_source(reranker: Mapping[str, Any]) -> str:
    """Where the reranker comes from, as the card's table shows it: bundled files, a model id, or nothing."""
    if reranker.get("bundled"):
        return " (bundled: the `reranker.*` files, a sentence-transformers CrossEncoder)"
    return f" ({reranker['model']})" if reranker.get("model") else ""


def projector_output(module: Mapping[str, Any]) -> str:
    """What the projector does after its MLP: the shipped LayerNorm to the word-embedding norm, or nothing (paper Eq. 7)."""
    if module.get("projector_norm", True):
        return "layer-normalised to the norm of the LLM's word embeddings"
    return "no LayerNorm (the paper's Eq. 7)"


def graph_encoder(module: Mapping[str, Any]) -> str:
    """The card's description of the graph encoder: the TransformerConv stack, or none (frozen node features pooled)."""
    if module["gnn_layers"] == 0:
        return "none: the embedder's frozen node features, mean-pooled"
    return f"TransformerConv, {module['gnn_layers']} layers, hidden {module['gnn_hidden']}, {module['gnn_heads']} heads"


def started_from_lines(record: Mapping[str, Any] | None) -> list[str]:
    """The card's line on the checkpoint the graph path started from (an aligned one, ``model.init_from``), if any."""
    if not record:
        return []
    return [f"The graph encoder and projector started from `{record['name']}` (SHA-256 `{record['sha256']}`), an aligned checkpoint "
            "(docs/alignment.md): " + graph_reading_line(record.get("graph_reading")), ""]


def graph_reading_section(reading: Mapping[str, Any] | None) -> list[str]:
    """The card's lines on whether the model reads its graph tokens: the last validation's shuffle gap and token cosine."""
    lines = ["## Does it read its graphs?", "", graph_reading_line(reading), ""]
    if reading and "skipped" not in reading:
        cosine = reading.get("token_cosine")
        lines += [
            f"| measured at the validation of step {reading.get('step')} | value |",
            "|---|---|",
            f"| `val/graph_shuffle_gap`: loss with another question's graph minus with its own, nats a token (95% interval) "
            f"| {gap_cell(reading, 'shuffle_gap', '')} |",
        ]
        if reading.get("answer_shuffle_gap") is not None:
            lines.append(f"| `val/graph_shuffle_gap_answer`: the same on the answer's tokens alone | {gap_cell(reading, 'answer_shuffle_gap', 'answer_')} |")
        lines += [
            f"| `val/graph_token_cosine`: mean cosine between different questions' graph tokens, their mean over the questions "
            f"subtracted (near 0: they differ; 1: one shared prompt) | {'not measured' if cosine is None else f'{cosine:.4f}'} |",
            "",
        ]
    return lines + ["What these measure and how: `docs/graph-token.md` in the qgmem repository.", ""]


def gap_cell(reading: Mapping[str, Any], key: str, counts: str) -> str:
    """A shuffle gap of the reading with its interval and what it counts, for the card's table."""
    low, high = reading[f"{key}_low"], reading[f"{key}_high"]
    interval = f" [{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else ""
    return f"{reading[key]:+.4f}{interval} over {reading[f'{counts}examples']} examples"


def render_model_card(config: Mapping[str, Any], metrics: Mapping[str, Any] | None, repo_id: str | None) -> str:
    """Markdown with Hub front matter, from an export's ``config.json`` and an optional flat metrics dict."""
    base = config["base_model"]
    module = config["module"]
    pipeline = config["pipeline"]
    training = config["training"]
    sources = training.get("sources")
    ref = repo_id or "path/to/this/folder"
    lora = f"LoRA r={module['lora_r']}, alpha={module['lora_alpha']} (peft format)" if config["adapter"]["lora"] else "none (the LLM is frozen)"
    front = ["---", f"license: {card_licence(sources)}", "tags:", "- qgmem", "- long-term-memory", "- graph-augmented-generation", "- lightning"]
    if "/" in base["id"] and not base["id"].startswith(("pkg:", "/", ".", "~")):
        front.append(f"base_model: {_yaml_value(base['id'])}")
    front.append("---")
    lines = [
        *front,
        "",
        "# QGMem graph adapter",
        "",
        "A trained graph encoder and projector for QGMem (query-aware graph-augmented memory): an event-indexed",
        "memory store of a user's conversations, hybrid retrieval (BM25, dense, event attributes) fused by RRF and",
        "reranked, and a local graph of the activated memory units encoded into "
        f"{config['graph_tokens']} graph token(s) prepended to a frozen LLM's input.",
        "",
        "| | |",
        "|---|---|",
        f"| base LLM (frozen) | `{base['id']}` (revision `{base['revision'] or 'default'}`) |",
        f"| embedder (retrieval, graph features) | `{config['embedder']['id']}` ({config['feature_dim']}-d) |",
        f"| reranker | `{config['reranker']['kind']}`{reranker_source(config['reranker'])} |",
        f"| graph encoder | {graph_encoder(module)} |",
        f"| projector | {'one linear layer' if module['projector_hidden'] == 0 else 'MLP hidden ' + str(module['projector_hidden'])} → "
        f"{config['graph_tokens']} token(s), {projector_output(module)} |",
        f"| LoRA | {lora} |",
        f"| memory units | `{pipeline['construction']['units']}`; window {pipeline['construction']['window']}, overlap {pipeline['construction']['overlap']} |",
        f"| retrieval | channels {', '.join(pipeline['retrieval']['channels'])}; n={pipeline['retrieval']['n']}, κ={pipeline['retrieval']['kappa']}, k={pipeline['retrieval']['k']} |",
        f"| prompts | `{config['prompts_version']}` (all templates in `prompts.json`) |",
        "",
        "Every setting of the model and its pipeline is in `config.json`; how it runs (backend, server, API key,",
        "repository code) is the loader's choice, never the export's. `sha256sums.txt` lists the SHA-256 of every",
        "file and loading refuses a file that differs or is not listed. Weights are safetensors only; nothing is pickled.",
        "",
        "## How to use",
        "",
        "```python",
        "from qgmem_train.predictor import QGMemPredictor",
        "",
        f'predictor = QGMemPredictor.from_pretrained("{ref}")',
        'memory = predictor.memory("alice", "stores/alice")',
        'memory.add_session([{"speaker": "Alice", "text": "I adopted a puppy named Max today."}], time="2024-05-01")',
        'result = memory.ask("What is the name of Alice\'s dog?")',
        "print(result.answer, result.reasoning_path)",
        "for unit in result.cited:",
        "    print(unit.label, unit.fact_text, [turn.id for turn in unit.source_turns])",
        "```",
        "",
        f"or from the command line: `python -m qgmem_train ask --model {ref} --store stores/alice --namespace alice \"question\"`.",
        "Local backbones answer through the graph token(s); an API backbone, chosen by the caller with",
        '`from_pretrained(..., models={"backend": "openai", "base_url": "https://..."})`, answers through the text',
        "path, with the local graph written into the prompt as labelled facts.",
        "",
        "## Training data and licences",
        "",
        f"Trained for {training.get('global_step')} steps on trajectories of the frozen pipeline (`{training.get('data') or 'unknown'}`).",
        "",
        *started_from_lines(training.get("init_from")),
    ]
    if sources:
        lines += ["| source | examples | licence |", "|---|---|---|"]
        lines += [f"| `{name}` | {count} | {source_licence(name) or 'not known to this project: check the source before use'} |" for name, count in sources.items()]
    else:
        lines.append("The training folder was not readable at export time, so its sources are not listed here.")
    lines += [
        "",
        f"Data derived from LoCoMo is licensed {LOCOMO_LICENCE}; this adapter is released for non-commercial use",
        "accordingly. ConvoMem's code is Apache-2.0. A model trained on ConvoMem-format cases re-packed from LoCoMo",
        "must never be scored on LoCoMo. The base LLM and the embedder keep their own licences.",
        "",
        *graph_reading_section(config.get("graph_reading")),
        "## Metrics",
        "",
    ]
    if metrics:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {name} | {value:.4f} |" if isinstance(value, float) else f"| {name} | {value} |" for name, value in metrics.items()]
    else:
        lines.append("No evaluation report was given at export time.")
    lines.append("")
    return "\n".join(lines)
