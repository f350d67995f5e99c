"""The bundled predictor: load an exported QGMem model, keep a user's memory, answer with cited evidence.

``QGMemPredictor.from_pretrained(folder_or_repo_id)`` verifies the export's checksums, rebuilds the
graph-augmented LM from its saved hyperparameters (the frozen base LLM through the resolver) and loads
exactly the exported adapter parameters. ``predictor.memory(namespace, store_dir)`` is a handle over a
persistent :class:`~qgmem_train.memory.store.MemoryStore`: ``add_session`` extends it incrementally,
``ask`` activates the working memory and answers. Local backbones answer through graph tokens; API
backbones (``models.backend: openai``) through the text path, with the local graph written as facts.

This module also defines the export format (file names, checksum file) that ``python -m export`` writes.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qgmem_train.config import PipelineConfig, pipeline_from_dict
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.llm.prompts import PROMPTS_VERSION
from qgmem_train.memory.types import Conversation, Session, Turn

if TYPE_CHECKING:
    from qgmem_train.graph.local_graph import LocalGraph
    from qgmem_train.llm.base import ChatLLM
    from qgmem_train.llm.embedder import Embedder
    from qgmem_train.llm.schemas import AnswerOutput
    from qgmem_train.memory.construct import BuildReport
    from qgmem_train.memory.store import MemoryStore, NamespaceMemory
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.retrieval.activation import ActivationIndex
    from qgmem_train.retrieval.rerank import Reranker

EXPORT_FORMAT = "qgmem-export"
EXPORT_FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
PROMPTS_FILE = "prompts.json"
CARD_FILE = "README.md"
CHECKSUM_FILE = "sha256sums.txt"
"""SHA-256 of every other file, one ``<hex>  <name>`` line each (``sha256sum -c`` reads it)."""
LORA_WEIGHTS_FILE = "adapter_model.safetensors"
LORA_CONFIG_FILE = "adapter_config.json"
HUB_PATTERNS = ["*.json", "*.safetensors", "*.md", CHECKSUM_FILE]
"""Files fetched when loading from the Hub: never anything pickled."""

IntentMode = Literal["llm", "rules"]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_checksums(folder: Path) -> dict[str, str]:
    """``{file name: hex digest}`` from the folder's checksum file; a missing or malformed file is an error."""
    path = folder / CHECKSUM_FILE
    if not path.is_file():
        raise InputError(str(path), "checksum file missing: not a complete QGMem export")
    sums: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise InputError(f"{path}: line {number}", "expected '<sha256>  <relative file name>'")
        sums[name] = digest
    return sums


def verify_checksums(folder: Path) -> dict[str, str]:
    """Check every listed file against its SHA-256; a missing or changed file is refused with one error."""
    sums = read_checksums(folder)
    for required in (CONFIG_FILE, PROMPTS_FILE):
        if required not in sums:
            raise InputError(str(folder / CHECKSUM_FILE), f"{required} is not listed: not a complete QGMem export")
    for name, expected in sums.items():
        path = folder / name
        if not path.is_file():
            raise InputError(str(path), "listed in the checksum file but missing")
        if file_sha256(path) != expected:
            raise InputError(str(path), "SHA-256 differs from the checksum file: the file changed after export; refusing to load it")
    return sums


def locate_export(ref: str | Path, *, revision: str | None = None) -> Path:
    """The local folder of an export: ``ref`` itself when it is a folder, else a Hub snapshot of repo ``ref``."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    text = str(ref)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise InputError(text, "not an export folder (and not a Hub repo id of the form owner/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline mode, missing repo, network, auth: all end as one line for the user
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelUnavailableError(f"export {text!r}{'@' + revision if revision else ''} unavailable: {why}") from None


def read_export_config(folder: Path) -> dict[str, Any]:
    """The export's ``config.json``, checked for format and prompts version."""
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(str(path), f"unreadable: {exc}") from None
    if not isinstance(config, dict) or config.get("format") != EXPORT_FORMAT:
        raise InputError(f"{path}: format", f"not a {EXPORT_FORMAT} config")
    if config.get("format_version") != EXPORT_FORMAT_VERSION:
        raise InputError(f"{path}: format_version", f"is {config.get('format_version')!r}, this code reads {EXPORT_FORMAT_VERSION}")
    if config.get("prompts_version") != PROMPTS_VERSION:
        raise InputError(f"{path}: prompts_version", f"exported with prompts {config.get('prompts_version')!r}, this code has {PROMPTS_VERSION!r}")
    return config


def load_exported_module(folder: Path, config: Mapping[str, Any], *, cache_dir: str | None = None, device: str = "auto") -> GraphAugmentedLM:
    """Build the module on ``device`` from the exported hyperparameters and load exactly its adapter (and LoRA) parameters."""
    from qgmem_train.model.checkpoint import check_compatible, load_adapter, trainable_state_dict
    from qgmem_train.model.module import GraphAugmentedLM

    model = GraphAugmentedLM(**{**config["module"], "cache_dir": cache_dir})
    model.load_backbone(None if device == "auto" else device)
    expected = trainable_state_dict(model)
    adapter_where = str(folder / config["adapter"]["graph"])
    state, metadata = load_adapter(folder / config["adapter"]["graph"])
    graph_keys = {k for k in expected if not k.startswith("llm.")}
    check_compatible(metadata, model.checkpoint_metadata(), set(state), graph_keys, adapter_where)
    model.load_state_dict(state, strict=False)
    lora_file = config["adapter"].get("lora")
    lora_expected = {k for k in expected if k.startswith("llm.")}
    if bool(lora_file) != bool(lora_expected):
        raise InputError(f"{folder / CONFIG_FILE}: adapter.lora", f"is {lora_file!r} but the module has {len(lora_expected)} LoRA parameters")
    if lora_file:
        _load_lora(model, folder / lora_file)
    model.eval()
    return model


def _load_lora(model: GraphAugmentedLM, path: Path) -> None:
    """Load peft-format LoRA weights into the module's LoRA-wrapped LLM; any missing or extra tensor is refused."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model.llm, load_file(str(path)))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise InputError(str(path), f"LoRA parameters differ: unexpected {sorted(result.unexpected_keys)[:3]}, missing {sorted(missing)[:3]}")


@dataclass
class SourceTurn:
    """A dialogue turn a memory unit came from."""

    id: str
    speaker: str | None
    text: str | None
    time: str | None


@dataclass
class EvidenceUnit:
    """One working-memory unit: its label in the prompt, its fact, score, and source turns."""

    id: str
    label: str
    fact_text: str
    score: float
    cited: bool
    source_turns: list[SourceTurn]


@dataclass
class AskResult:
    """The answer to one question, the evidence behind it, token counts and seconds per stage."""

    question: str
    question_time: str | None
    answer: str | None
    """``None`` when the model's output was not a valid answer JSON."""
    reasoning_path: str | None
    generated: str
    """The model's raw output."""
    path: Literal["graph", "text"]
    """Graph tokens (local backbone) or text path (API backbone)."""
    units: list[EvidenceUnit]
    """The working memory, best first; ``cited`` marks units the reasoning path names."""
    tokens: dict[str, int] = field(default_factory=dict)
    """``context`` (serialized memory), ``prompt`` (what the LLM read, graph tokens included), ``generated``."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds per stage: memory load, activation steps, serialization, graph, generation, total."""

    @property
    def cited(self) -> list[EvidenceUnit]:
        """The units the reasoning path cites, in working-memory order."""
        return [u for u in self.units if u.cited]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return asdict(self)

    def render(self) -> str:
        """Answer, reasoning and evidence (the cited units, else the whole working memory) with source turns."""
        lines = [f"answer: {self.answer}" if self.answer is not None else "answer: (the model gave no valid answer)"]
        if self.reasoning_path is not None:
            lines.append(f"reasoning: {self.reasoning_path}")
        evidence = self.cited or self.units
        kind = "cited units" if self.cited else "working memory (nothing cited)"
        lines.append(f"\n{kind} ({len(evidence)} of {len(self.units)} units, {self.tokens.get('context', 0)} context tokens, {self.path} path):")
        for unit in evidence:
            lines.append(f"[{unit.label}] {unit.fact_text}")
            for turn in unit.source_turns:
                text = f"{turn.speaker}: {turn.text}" if turn.text is not None else "(turn not in store)"
                lines.append(f"    {turn.id} ({turn.time or 'time unknown'}) {text}")
        return "\n".join(lines)


class QGMemPredictor:
    """An exported (or in-memory) QGMem model with its frozen retrieval stack, ready to build memory and answer."""

    def __init__(
        self,
        model: GraphAugmentedLM | None,
        pipeline: PipelineConfig,
        *,
        llm: ChatLLM,
        embedder: Embedder,
        reranker: Reranker | None,
        intent: IntentMode = "llm",
    ) -> None:
        """Prefer :meth:`from_pretrained` or :meth:`from_module`; ``model`` is ``None`` on the text path."""
        if intent not in ("llm", "rules"):
            raise InputError("intent", f"unknown intent parser {intent!r} (llm, rules)")
        self.model = model
        self.pipeline = pipeline
        self.llm = llm
        self.embedder = embedder
        self.reranker = reranker
        self.intent = intent

    @property
    def path(self) -> Literal["graph", "text"]:
        """``graph`` when a local module answers, ``text`` for an API backbone."""
        return "graph" if self.model is not None else "text"

    @classmethod
    def from_pretrained(
        cls,
        dir_or_repo_id: str | Path,
        *,
        revision: str | None = None,
        cache_dir: str | None = None,
        device: str = "auto",
        models: Mapping[str, Any] | None = None,
        intent: IntentMode = "llm",
        max_new_tokens: int | None = None,
    ) -> QGMemPredictor:
        """Load an export folder or Hub repo after verifying its checksums.

        Args:
            dir_or_repo_id: export folder, or ``owner/name`` on the Hugging Face Hub.
            revision: Hub revision (branch, tag or commit) of a repo id.
            cache_dir: cache of converted bundled models.
            device: torch device of local models (auto: cuda when available).
            models: overrides of the exported ``pipeline.models`` settings, e.g. ``{"backend": "openai",
                "base_url": ...}`` to answer through an API backbone on the text path.
            intent: query-intent parser: the paper's LLM prompt, or rules without an LLM.
            max_new_tokens: graph-path answer budget (default: the exported module's; the text path uses
                ``generation.max_new_tokens``).
        """
        folder = locate_export(dir_or_repo_id, revision=revision)
        verify_checksums(folder)
        config = read_export_config(folder)
        values = copy.deepcopy(config["pipeline"])
        values["models"].update({"device": device, "cache_dir": cache_dir, **(models or {})})
        pipeline = pipeline_from_dict(values, f"{folder / CONFIG_FILE}: pipeline")
        if pipeline.models.backend == "openai":
            from qgmem_train.llm.factory import build_embedder, build_llm
            from qgmem_train.retrieval.rerank import build_reranker

            llm = build_llm(pipeline)
            embedder = build_embedder(pipeline)
            reranker = build_reranker(pipeline, llm=llm if not pipeline.models.reranker_model else None)
            return cls(None, pipeline, llm=llm, embedder=embedder, reranker=reranker, intent=intent)
        model = load_exported_module(folder, config, cache_dir=cache_dir, device=device)
        if max_new_tokens is not None:
            model.hparams.max_new_tokens = max_new_tokens
        return cls.from_module(model, pipeline, intent=intent)

    @classmethod
    def from_module(cls, model: GraphAugmentedLM, pipeline: PipelineConfig, *, intent: IntentMode = "llm") -> QGMemPredictor:
        """A predictor around a module in memory; its LLM (adapters off) also serves intents, reranking and construction."""
        from qgmem_train.llm.factory import build_embedder
        from qgmem_train.llm.local import TransformersLLM
        from qgmem_train.retrieval.rerank import build_reranker

        g = pipeline.generation
        llm = TransformersLLM(
            model.hparams.llm, revision=model.hparams.llm_revision, loaded=(model.llm, model.tokenizer),
            max_new_tokens=g.max_new_tokens, batch_size=g.batch_size, temperature=g.temperature, constrained=g.constrained,
        )  # fmt: skip
        embedder = build_embedder(pipeline)
        if embedder.dim != model.hparams.feature_dim:
            raise InputError("pipeline.models.embedder", f"{embedder.model_id} is {embedder.dim}-d; the model's graph features are {model.hparams.feature_dim}-d")
        model.eval()
        reranker = build_reranker(pipeline, llm=llm if not pipeline.models.reranker_model else None)
        return cls(model, pipeline, llm=llm, embedder=embedder, reranker=reranker, intent=intent)

    @contextlib.contextmanager
    def frozen_pipeline(self) -> Iterator[None]:
        """LoRA adapters off while the shared LLM parses intents, reranks or builds memory (the pipeline is frozen)."""
        disable = getattr(self.model.llm, "disable_adapter", None) if self.model is not None else None
        with disable() if disable is not None else contextlib.nullcontext():
            yield

    def memory(self, namespace: str, store_dir: str | Path) -> PredictorMemory:
        """A handle on ``namespace`` of the persistent store in ``store_dir`` (created when missing)."""
        from qgmem_train.memory.store import MemoryStore

        if not namespace or not namespace.strip():
            raise InputError("namespace", "empty namespace")
        return PredictorMemory(self, namespace, MemoryStore.open(store_dir, create=True))


class PredictorMemory:
    """One user's (or conversation's) memory: add sessions as they happen, ask questions at any time."""

    def __init__(self, predictor: QGMemPredictor, namespace: str, store: MemoryStore) -> None:
        self.predictor = predictor
        self.namespace = namespace
        self.store = store
        self._loaded: tuple[tuple[int, int], NamespaceMemory, ActivationIndex] | None = None

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def __enter__(self) -> PredictorMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _session_count(self) -> int:
        return len({session for session, _ in self.store.done_windows(self.namespace)})

    def add_session(self, turns: Sequence[Turn | Mapping[str, Any]], time: str | None = None, session_id: str | None = None) -> BuildReport:
        """Add one session and build its units (and update traces); rerunning a killed call resumes it.

        ``turns`` are :class:`Turn` objects or dicts ``{id?, speaker, text}``; a missing id becomes
        ``<session_id>:<n>``. ``session_id`` defaults to ``S<n>`` after the sessions stored so far;
        ``time`` is the session's date (ISO or a recognised date format).
        """
        from qgmem_train.memory.construct import build_conversation
        from qgmem_train.memory.loaders import session_time

        session_id = session_id or f"S{self._session_count() + 1}"
        where = f"namespace {self.namespace}, session {session_id}"
        if not turns:
            raise InputError(where, "no turns")
        session = Session(session_id, session_time(time, f"{where}: time"), [_turn(t, session_id, n, where) for n, t in enumerate(turns, start=1)])
        predictor = self.predictor
        cfg = predictor.pipeline
        llm = predictor.llm if cfg.construction.units == "llm" or cfg.construction.traces else None
        with predictor.frozen_pipeline():
            report = build_conversation(self.store, Conversation(self.namespace, [session]), cfg, predictor.embedder, namespace=self.namespace, llm=llm)
        self._loaded = None
        return report

    def _activation_state(self) -> tuple[NamespaceMemory, ActivationIndex]:
        """The namespace and its search index, reloaded only when the store's content changed."""
        from qgmem_train.retrieval.activation import ActivationIndex

        version = (self.store.count_units(self.namespace), self.store.count_traces(self.namespace))
        if self._loaded is None or self._loaded[0] != version:
            memory = self.store.load_namespace(self.namespace, embedder_id=self.predictor.embedder.model_id)
            self._loaded = (version, memory, ActivationIndex(memory, self.predictor.pipeline.retrieval, self.predictor.embedder))
        return self._loaded[1], self._loaded[2]

    def ask(self, question: str, question_time: str | None = None) -> AskResult:
        """Activate the working memory for ``question`` and answer it with the model, citing units and turns."""
        from qgmem_train.graph.local_graph import local_graph_from_units
        from qgmem_train.retrieval.activation import activate
        from qgmem_train.retrieval.serialization import cited_unit_ids, serialize_working_memory

        if not question.strip():
            raise InputError("question", "empty question")
        predictor = self.predictor
        cfg = predictor.pipeline
        started = time.perf_counter()
        memory, index = self._activation_state()
        seconds = {"memory": time.perf_counter() - started}
        with predictor.frozen_pipeline():
            wm = activate(
                question, question_time, memory, cfg=cfg.retrieval, llm=predictor.llm if predictor.intent == "llm" else None,
                embedder=predictor.embedder, reranker=predictor.reranker, index=index,
            )  # fmt: skip
            seconds.update(wm.timings)
            start = time.perf_counter()
            context = serialize_working_memory(wm.units, memory, predictor.llm)
            graph = local_graph_from_units(wm.units, max_edges=cfg.retrieval.k)
            seconds["serialize"] = time.perf_counter() - start
        generate = self._generate_graph if predictor.model is not None else self._generate_text
        generated, parsed, prompt_tokens, generated_tokens = generate(question, question_time, context.text, graph, seconds)
        cited = set(cited_unit_ids(parsed.reasoning_path, context.labels)) if parsed else set()
        label_of = {uid: label for label, uid in context.labels.items()}
        units = [
            EvidenceUnit(u.id, label_of.get(u.id, ""), u.fact_text, score, u.id in cited, [self._source_turn(memory, t) for t in u.source_turn_ids])
            for u, score in zip(wm.units, wm.scores)
        ]
        seconds["total"] = time.perf_counter() - started
        return AskResult(
            question=question, question_time=question_time, answer=parsed.answer if parsed else None,
            reasoning_path=parsed.reasoning_path if parsed else None, generated=generated, path=predictor.path, units=units,
            tokens={"context": context.n_tokens, "prompt": prompt_tokens, "generated": generated_tokens}, seconds=seconds,
        )  # fmt: skip

    def _generate_graph(self, question: str, question_time: str | None, context: str, graph: LocalGraph, seconds: dict[str, float]) -> tuple[str, AnswerOutput | None, int, int]:
        """Graph-token path: embed the local graph, generate with the module, parse strictly."""
        from torch_geometric.data import Batch

        from qgmem_train.graph.local_graph import graph_to_data
        from qgmem_train.model.answers import parse_answer
        from qgmem_train.model.trajectory import TrajectoryExample

        model, embedder = self.predictor.model, self.predictor.embedder
        start = time.perf_counter()
        example = TrajectoryExample(
            case_id=self.namespace, question_id="", source_dataset="", namespace=self.namespace, question=question,
            question_time=question_time or "", context=context, answer="", reasoning_path="", graph=graph,
        )  # fmt: skip
        batch = Batch.from_data_list([graph_to_data(graph, embedder.encode, embedder.dim)])
        seconds["graph"] = time.perf_counter() - start
        start = time.perf_counter()
        generated = model.generate([example], batch)[0]
        seconds["generate"] = time.perf_counter() - start
        prompt_tokens = len(model.prompt_ids(example).ids) + model.hparams.graph_tokens
        return generated, parse_answer(generated), prompt_tokens, self.predictor.llm.count_tokens(generated)

    def _generate_text(self, question: str, question_time: str | None, context: str, graph: LocalGraph, seconds: dict[str, float]) -> tuple[str, AnswerOutput | None, int, int]:
        """Text path (API backbones): the local graph as labelled facts in the prompt, a schema-checked answer."""
        from qgmem_train.llm.schemas import AnswerOutput
        from qgmem_train.llm.structured import generate_structured
        from qgmem_train.model.prompt import final_answer_chat

        llm = self.predictor.llm
        chat = final_answer_chat(question, question_time, context, graph, text_path=True)
        start = time.perf_counter()
        parsed = generate_structured(llm, [chat], AnswerOutput, max_new_tokens=self.predictor.pipeline.generation.max_new_tokens)[0]
        seconds["generate"] = time.perf_counter() - start
        generated = parsed.model_dump_json() if parsed is not None else ""
        prompt_tokens = sum(llm.count_tokens(message["content"]) for message in chat)
        return generated, parsed, prompt_tokens, llm.count_tokens(generated) if generated else 0

    @staticmethod
    def _source_turn(memory: NamespaceMemory, turn_id: str) -> SourceTurn:
        turn = memory.turns.get(turn_id)
        return SourceTurn(turn_id, turn.speaker if turn else None, turn.text if turn else None, memory.turn_time.get(turn_id))


def _turn(value: Turn | Mapping[str, Any], session_id: str, number: int, where: str) -> Turn:
    """A :class:`Turn` from a Turn or a ``{id?, speaker, text}`` dict; a missing or mistyped field is an error."""
    if isinstance(value, Turn):
        return value
    twhere = f"{where}, turn {number}"
    if not isinstance(value, Mapping):
        raise InputError(twhere, f"expected a Turn or a dict with speaker and text, got {type(value).__name__}")
    for key in ("speaker", "text"):
        if not isinstance(value.get(key), str) or not value[key].strip():
            raise InputError(f"{twhere}.{key}", "missing or not a non-empty string")
    return Turn(str(value.get("id") or f"{session_id}:{number}"), value["speaker"], value["text"])


def ask_with_model(
    model_dir: str | Path,
    store_dir: str | Path,
    namespace: str,
    question: str,
    question_time: str | None = None,
    *,
    device: str = "auto",
    intent: IntentMode = "llm",
) -> AskResult:
    """Load the exported model and answer one question over ``namespace`` of the store (``qgmem_train ask --model``)."""
    predictor = QGMemPredictor.from_pretrained(model_dir, device=device, intent=intent)
    with predictor.memory(namespace, store_dir) as memory:
        return memory.ask(question, question_time)
