"""Build a :class:`QGMemPredictor` from a verified export (or a module in memory) and the caller's settings.

What runs and where (backend, server, API key variable, repository code, device, cache) comes from the
caller's arguments; the export contributes its base model, hyperparameters, adapters and pipeline
settings (:mod:`qgmem_train.predictor.artifact` refuses anything else).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qgmem_train.config import PipelineConfig, pipeline_from_dict
from qgmem_train.errors import InputError, first_line
from qgmem_train.pipeline.models import PipelineModels
from qgmem_train.predictor.artifact import (
    CONFIG_FILE,
    Export,
    bundled_reranker_folder,
    check_base_url,
    locate_export,
    module_arguments,
    read_export,
)
from qgmem_train.predictor.base import MAX_QUESTION_CHARS, IntentMode, Predictor
from qgmem_train.predictor.memory import PredictorMemory, checked_text

if TYPE_CHECKING:
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.pipeline.results import AskResult

def _not_an_adapter(path: Path, exc: Exception) -> InputError:
    """The one-line error for an adapter file that safetensors (or its metadata's JSON) cannot read."""
    why = first_line(exc)
    return InputError(str(path), f"not a safetensors adapter: {why}")


def read_adapter(data: bytes, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors and qgmem metadata of the safetensors adapter ``path`` whose verified bytes are ``data``; bytes that are
    not one are an :class:`InputError`."""
    from safetensors import SafetensorError

    from qgmem_train.model.checkpoint import load_adapter_bytes

    try:
        state, metadata = load_adapter_bytes(data)
    except (SafetensorError, UnicodeDecodeError, ValueError) as exc:
        raise _not_an_adapter(path, exc) from None
    except RecursionError:
        raise InputError(str(path), "its qgmem metadata is not readable JSON: nested too deeply") from None
    if not isinstance(metadata, dict):
        raise InputError(str(path), "its qgmem metadata is not a JSON object")
    return state, metadata


def load_exported_module(
    export: Export, *, cache_dir: str | None = None, device: str = "auto", trust_remote_code: bool = False, base_model: Mapping[str, Any] | None = None
) -> GraphAugmentedLM:
    """Build the module on ``device`` from the exported hyperparameters and load exactly its adapter (and LoRA) parameters.

    ``base_model`` (``llm``, ``llm_revision``) is the caller's naming of the base model over the exported one;
    the adapter's metadata check still refuses any other backbone than the one it was trained on.
    """
    from qgmem_train.model.checkpoint import check_compatible, trainable_state_dict
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.model.settings import grouped_hparams

    arguments = {**module_arguments(export), **(base_model or {})}
    adapter = export.folder / export.graph_adapter
    state, metadata = read_adapter(export.adapters[export.graph_adapter], adapter)
    _check_sizes(export, arguments, state, cache_dir)
    model = GraphAugmentedLM(**grouped_hparams(arguments), cache_dir=cache_dir, trust_remote_code=trust_remote_code)
    model.load_backbone(None if device == "auto" else device)
    expected = trainable_state_dict(model)
    graph_keys = {k for k in expected if not k.startswith("llm.")}
    check_compatible(metadata, model.checkpoint_metadata(), set(state), graph_keys, str(adapter))
    check_shapes(state, expected, adapter)
    model.load_state_dict(state, strict=False)
    lora_expected = {k for k in expected if k.startswith("llm.")}
    if bool(export.lora_adapter) != bool(lora_expected):
        where = f"{export.folder / CONFIG_FILE}: adapter.lora"
        raise InputError(where, f"is {export.lora_adapter!r} but the module has {len(lora_expected)} LoRA parameters")
    if export.lora_adapter:
        _load_lora(model, export.adapters[export.lora_adapter], export.folder / export.lora_adapter)
    model.eval()
    return model


def _check_sizes(export: Export, arguments: Mapping[str, Any], state: Mapping[str, Any], cache_dir: str | None) -> None:
    """Refuse module settings whose parameters differ from the adapters' tensors before any parameter is allocated
    (config.json's sizes could ask for terabytes): the graph path is built on the meta device and compared, and
    ``lora_r`` is compared with the LoRA adapter's rank. The base model's folder is resolved first, on the real device:
    a bundled model converted into the cache then, or its cache entry refused, is reported as that, not as sizes."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load

    from qgmem_train.llm.resolver import resolve_model_dir
    from qgmem_train.model.checkpoint import trainable_state_dict
    from qgmem_train.model.module import GraphAugmentedLM
    from qgmem_train.model.settings import grouped_hparams

    if export.lora_adapter:
        path = export.folder / export.lora_adapter
        try:
            ranks = sorted({int(t.shape[0]) for name, t in load(export.adapters[export.lora_adapter]).items() if "lora_A" in name})
        except SafetensorError as exc:
            raise _not_an_adapter(path, exc) from None
        if arguments.get("lora_r") not in ranks:
            raise InputError(f"{export.folder / CONFIG_FILE}: module.lora_r", f"is {arguments.get('lora_r')}, but the LoRA adapter's rank is {', '.join(map(str, ranks))}")
    if isinstance(arguments.get("llm"), str):
        resolve_model_dir(arguments["llm"], cache_dir, revision=arguments.get("llm_revision"))
    try:
        with torch.device("meta"):
            shell = GraphAugmentedLM(**grouped_hparams(arguments), cache_dir=cache_dir)
    except (RuntimeError, ValueError, OverflowError) as exc:
        why = first_line(exc)
        raise InputError(f"{export.folder / CONFIG_FILE}: module", f"its sizes make a module no adapter fits ({why})") from None
    for name, shape in ((n, tuple(t.shape)) for n, t in trainable_state_dict(shell).items()):
        if name in state and tuple(state[name].shape) != shape:
            raise InputError(f"{export.folder / export.graph_adapter}: {name}", f"has shape {list(state[name].shape)}, but config.json's module settings make it {list(shape)}")


def check_shapes(found: Mapping[str, Any], expected: Mapping[str, Any], path: Path) -> None:
    """Refuse an adapter tensor whose shape differs from the module's parameter of the same name."""
    for name, tensor in found.items():
        if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
            raise InputError(f"{path}: {name}", f"has shape {list(tensor.shape)}, but the module's parameter is {list(expected[name].shape)}")


def _load_lora(model: GraphAugmentedLM, data: bytes, path: Path) -> None:
    """Load peft-format LoRA weights (the verified bytes ``data`` of ``path``) into the module's LoRA-wrapped LLM; any
    missing, extra or misshapen tensor is refused."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        weights = load(data)
    except SafetensorError as exc:
        raise _not_an_adapter(path, exc) from None
    check_shapes(weights, get_peft_model_state_dict(model.llm), path)
    result = set_peft_model_state_dict(model.llm, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise InputError(str(path), f"LoRA parameters differ: unexpected {sorted(result.unexpected_keys)[:3]}, missing {sorted(missing)[:3]}")


class QGMemPredictor(Predictor):
    """An exported (or in-memory) QGMem model with its frozen retrieval stack: load one, then open memories on it."""

    @classmethod
    def from_pretrained(
        cls,
        dir_or_repo_id: str | Path,
        *,
        revision: str | None = None,
        cache_dir: str | None = None,
        device: str = "auto",
        models: Mapping[str, Any] | None = None,
        trust_remote_code: bool = False,
        allow_insecure_http: bool = False,
        intent: IntentMode = "llm",
        max_new_tokens: int | None = None,
        max_question_chars: int = MAX_QUESTION_CHARS,
    ) -> QGMemPredictor:
        """Load an export folder or Hub repo after verifying its checksums and config.

        The export describes the model; the caller decides how it runs. An export whose config.json sets
        ``pipeline.models.backend``, ``base_url``, ``api_key_env`` or ``trust_remote_code`` (module or
        pipeline) to anything but the default is refused, not silently overridden: such a repo tries to
        run code or reach a server its user did not choose. Its ``device`` and ``cache_dir`` are ignored.

        Args:
            dir_or_repo_id: export folder, or ``owner/name`` on the Hugging Face Hub.
            revision: Hub revision (branch, tag or commit) of a repo id.
            cache_dir: cache of converted bundled models.
            device: torch device of local models (auto: cuda when available).
            models: the caller's ``pipeline.models`` settings over the exported ones, e.g. ``{"backend": "openai",
                "base_url": ..., "api_key_env": ...}`` to answer through an API backbone on the text path. Only here
                may a model be a local path. ``llm`` (and ``llm_revision``) name the module's base model too: it must be
                the backbone the adapter was trained on, and naming it lets ``trust_remote_code`` reach it.
            trust_remote_code: let the models the caller names in ``models`` (``llm``, ``embedder``, ``reranker_model``)
                run their repositories' own Python code; it never extends to a model the export names.
            allow_insecure_http: allow a plain-http ``base_url`` to a host other than this machine (the API key
                would travel unencrypted).
            intent: query-intent parser: the paper's LLM prompt, or rules without an LLM.
            max_new_tokens: graph-path answer budget (default: the exported module's; the text path uses
                ``generation.max_new_tokens``).
            max_question_chars: longest question ``ask`` takes (characters); a longer one is refused.
        """
        export = read_export(locate_export(dir_or_repo_id, revision=revision))
        caller = dict(models or {})
        trusted = bool(trust_remote_code or caller.pop("trust_remote_code", False))
        values = export.pipeline.to_dict()
        reranker_dir = bundled_reranker_folder(export, cache_dir)
        if reranker_dir is not None:
            values["models"]["reranker_model"] = str(reranker_dir)
        values["models"].update({"device": device, "cache_dir": cache_dir, "allow_insecure_http": allow_insecure_http, **caller})
        exported_reranker = values["models"]["reranker_model"] and reranker_dir is None and "reranker_model" not in caller
        values["models"]["trust_remote_code"] = trusted and "embedder" in caller and not exported_reranker
        pipeline = pipeline_from_dict(values, "from_pretrained: pipeline")
        if pipeline.models.backend == "openai":
            check_base_url(pipeline.models.base_url, allow_insecure_http=allow_insecure_http)
            return cls(None, PipelineModels(pipeline, intent=intent).build_all(), max_question_chars=max_question_chars)
        # A base model the caller names is taken at the caller's revision only (None: its default branch): the
        # caller's trust never reaches a branch or pull request of that repo the export picked.
        base = {"llm": caller["llm"], "llm_revision": caller.get("llm_revision")} if "llm" in caller else {}
        model = load_exported_module(export, cache_dir=cache_dir, device=device, trust_remote_code=trusted and "llm" in caller, base_model=base)
        if max_new_tokens is not None:
            model.generation_args = replace(model.generation_args, max_new_tokens=max_new_tokens)
        return cls.from_module(model, pipeline, intent=intent, max_question_chars=max_question_chars)

    @classmethod
    def from_module(
        cls, model: GraphAugmentedLM, pipeline: PipelineConfig, *, intent: IntentMode = "llm", max_question_chars: int = MAX_QUESTION_CHARS
    ) -> QGMemPredictor:
        """A predictor around a module in memory; its LLM (adapters off) also serves intents, reranking and construction."""
        from qgmem_train.llm.local import TransformersLLM

        g, budget = pipeline.generation, pipeline.models.template_budget_s
        llm = TransformersLLM(
            model.hparams.llm, revision=model.hparams.llm_revision, loaded=(model.llm, model.tokenizer),
            max_new_tokens=g.max_new_tokens, batch_size=g.batch_size, temperature=g.temperature, constrained=g.constrained, template_budget_s=budget,
        )  # fmt: skip
        model.prompt_tokens = dataclasses.replace(model.prompt_tokens, template_budget_s=budget)
        models = PipelineModels(pipeline, intent=intent, llm=llm)
        embedder = models.embedder
        if embedder.dim != model.hparams.feature_dim:
            raise InputError("pipeline.models.embedder", f"{embedder.model_id} is {embedder.dim}-d; the model's graph features are {model.hparams.feature_dim}-d")
        model.eval()
        return cls(model, models.build_all(), max_question_chars=max_question_chars)

    @classmethod
    def from_config(
        cls, config: str | Path | None = None, *, reranker: str | None = None, intent: IntentMode = "llm", max_question_chars: int = MAX_QUESTION_CHARS
    ) -> QGMemPredictor:
        """A predictor answering with the configured LLM on the text path (no exported model): the YAML ``config``'s
        ``pipeline:`` section (default: the bundled CPU models), ``reranker`` a kind over the configured one."""
        from qgmem_train.config import load_pipeline_config

        models = PipelineModels(load_pipeline_config(config), reranker=reranker, intent=intent)
        return cls(None, models.build_all(), max_question_chars=max_question_chars)

    def memory(self, namespace: str, store_dir: str | Path) -> PredictorMemory:
        """A handle on ``namespace`` of the persistent store in ``store_dir`` (created when missing)."""
        from qgmem_train.memory.store import MemoryStore

        return PredictorMemory(self, checked_text(namespace, "namespace"), MemoryStore.open(store_dir, create=True))


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
