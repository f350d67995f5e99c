"""Package a training checkpoint as a self-contained export folder (safetensors only, checksummed).

The folder holds the graph adapter (encoder + projector) as safetensors, the LoRA adapter in peft's
format when one was trained, ``config.json`` (base model, module hyperparameters, every pipeline
setting an export may carry, prompts version), ``prompts.json``, a model card and ``sha256sums.txt``.
It holds nothing of this machine or of how the pipeline ran here: no training-data path, no server URL,
key variable, device or cache folder, no permission to run repository code (those are the loader's to
choose). It is written beside the target, fsync'd, and swapped in atomically
(:func:`qgmem_train.fileio.replace_folder`), so the target always holds the previous export or the new one.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import torch

from qgmem_train.config import PipelineConfig, load_pipeline_config, refuse_other_graph_settings
from qgmem_train.errors import InputError, first_line
from qgmem_train.fileio import OUTPUT_MARKER, refuse_foreign_folder, replace_folder
from qgmem_train.llm.prompts import ALL_PROMPTS, JSON_RETRY, PROMPTS_VERSION, RERANK
from qgmem_train.model.checkpoint import ADAPTER_FILE, METADATA_KEY, config_hash, save_adapter
from qgmem_train.predictor.artifact import (
    CARD_FILE,
    CHECKSUM_FILE,
    CONFIG_FILE,
    EXPORT_FORMAT,
    EXPORT_FORMAT_VERSION,
    LORA_CONFIG_FILE,
    LORA_WEIGHTS_FILE,
    PROMPTS_FILE,
    RERANKER_PREFIX,
    TEXT_FILE_TYPES,
    file_sha256,
    is_public_reference,
    portable_models,
    portable_module,
)
from qgmem_train.retrieval.rerank import build_command, names_missing_folder

log = logging.getLogger(__name__)
GRAPH_PREFIXES = ("encoder.", "projector.")
"""State-dict prefixes of the graph adapter; every other trainable parameter is LoRA inside ``llm.``."""
MACHINE_REPORT_KEYS = ("input", "store")
"""Fields of an eval report that name a file or database of the machine it ran on: never shown in a model card."""
LIBRARIES = ("qgmem", "torch", "lightning", "transformers", "peft", "torch_geometric", "sentence-transformers")


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A Lightning checkpoint of the module, read with ``weights_only=True``; a folder means its ``last.ckpt``."""
    path = Path(path)
    if path.is_dir():
        path = path / "last.ckpt"
    if not path.is_file():
        raise InputError(str(path), "checkpoint not found")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle errors of any kind: not a checkpoint we can read safely
        raise InputError(str(path), f"not a checkpoint readable with torch.load(weights_only=True): {first_line(exc)}") from None
    for key in ("state_dict", "hyper_parameters", METADATA_KEY):
        if key not in checkpoint:
            raise InputError(f"{path}: {key}", "missing: not a checkpoint of the graph-augmented LM")
    return checkpoint


def module_hyperparameters(checkpoint: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The module's settings from the checkpoint under their flat names, the export's record (LightningCLI bookkeeping
    dropped, no cache path); a checkpoint of before the grouping holds them flat already."""
    from qgmem_train.model.module import flat_parameters
    from qgmem_train.model.settings import flat_settings, grouped_hparams

    saved = flat_settings(grouped_hparams(checkpoint["hyper_parameters"]))
    missing = [name for name, _, default in flat_parameters() if name not in saved and default is inspect.Parameter.empty]
    if missing:
        raise InputError(f"{where}: hyper_parameters", f"missing {', '.join(missing)}")
    values = {name: saved.get(name, default) for name, _, default in flat_parameters()}
    values["cache_dir"] = None
    return values


def check_checkpoint(checkpoint: Mapping[str, Any], hparams: Mapping[str, Any], where: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split the trainable state into graph adapter and LoRA tensors after checking its metadata against ``hparams``."""
    meta = checkpoint[METADATA_KEY]
    settings = meta.get("settings", {})
    if config_hash(settings) != meta.get("config_hash"):
        raise InputError(f"{where}: {METADATA_KEY}.config_hash", "does not match the recorded settings")
    for key, value in settings.items():
        if hparams.get(key) != value:
            raise InputError(f"{where}: hyper_parameters.{key}", f"is {hparams.get(key)!r} but the trainable parameters were made with {value!r}")
    state = checkpoint["state_dict"]
    graph = {k: v for k, v in state.items() if k.startswith(GRAPH_PREFIXES)}
    lora = {k: v for k, v in state.items() if k not in graph}
    stray = [k for k in lora if not (k.startswith("llm.") and "lora_" in k)]
    if stray:
        raise InputError(f"{where}: state_dict", f"unexpected parameters {stray[:3]} (expected encoder., projector. or LoRA)")
    if bool(lora) != (hparams["lora_r"] > 0):
        raise InputError(f"{where}: state_dict", f"{len(lora)} LoRA tensors but lora_r is {hparams['lora_r']}")
    return graph, lora


def check_pipeline_matches(cfg: PipelineConfig, hparams: Mapping[str, Any], data_hparams: Mapping[str, Any], config_path: Path) -> None:
    """Refuse a fit config whose models or ``graph.*`` settings differ from the ones the checkpoint was trained with (a
    checkpoint that records no graph settings exports the config's)."""
    pairs = [("llm", hparams["llm"]), ("llm_revision", hparams["llm_revision"])]
    if "embedder" in data_hparams:
        pairs.append(("embedder", data_hparams["embedder"]))
    for name, trained in pairs:
        configured = getattr(cfg.models, name)
        if configured != trained:
            raise InputError(f"{config_path}: pipeline.models.{name}", f"is {configured!r} but the checkpoint was trained with {trained!r}")
    refuse_other_graph_settings(data_hparams.get("graph"), dataclasses.asdict(cfg.graph), f"{config_path}: pipeline.graph")


def save_lora(checkpoint: Mapping[str, Any], hparams: Mapping[str, Any], folder: Path) -> None:
    """Write ``adapter_model.safetensors`` + ``adapter_config.json`` in peft's format from the checkpoint alone.

    No backbone is loaded (an 8B one is 16 GB on the CPU): the LoRA tensors are the checkpoint's ``llm.*lora_*``
    entries under the keys peft's ``save_pretrained`` writes (no ``llm.`` prefix, no adapter name), and the config is
    the one the module wraps the LLM with, naming the base model by its reference and revision.
    """
    from safetensors.torch import save_file

    from qgmem_train.model.module import lora_config

    weights = {peft_key(k): v.contiguous() for k, v in checkpoint["state_dict"].items() if k.startswith("llm.") and "lora_" in k}
    config = lora_config(hparams["lora_r"], hparams["lora_alpha"], hparams["lora_target_modules"])
    config.base_model_name_or_path, config.revision, config.inference_mode = hparams["llm"], hparams["llm_revision"], True
    staging = Path(tempfile.mkdtemp(prefix=".peft.", dir=folder))
    try:
        save_file(weights, str(staging / LORA_WEIGHTS_FILE), metadata={"format": "pt"})
        config.save_pretrained(str(staging))
        for name in (LORA_WEIGHTS_FILE, LORA_CONFIG_FILE):
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def peft_key(name: str, adapter: str = "default") -> str:
    """peft's file key of a module state-dict entry: ``llm.`` and the adapter name dropped, as ``get_peft_model_state_dict`` does."""
    return name.removeprefix("llm.").replace(f".{adapter}", "")


def training_sources(data_path: str | None) -> dict[str, int] | None:
    """Examples per ``source_dataset`` of the training folder, or ``None`` when it is not readable here."""
    if not data_path or not Path(data_path).exists():
        return None
    import datasets

    try:
        loaded = datasets.load_from_disk(str(data_path))
    except (FileNotFoundError, ValueError):
        return None
    parts = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
    counts: Counter[str] = Counter()
    for part in parts:
        if "source_dataset" in part.column_names:
            counts.update(part["source_dataset"])
    return dict(sorted(counts.items()))


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the export."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            continue
    return versions


def export_config(
    cfg: PipelineConfig, hparams: Mapping[str, Any], checkpoint: Mapping[str, Any], has_lora: bool, sources: dict[str, int] | None, reranker: dict[str, Any]
) -> dict[str, Any]:
    """The ``config.json`` of an export: what rebuilds the model and its retrieval stack, nothing of this machine.

    The caller's and the machine's settings (backend, server URL, key variable, repository code, device,
    cache) are left out; the training data is named by its folder's name only. ``reranker`` is what
    :func:`bundle_reranker` returned; the pipeline's reranker settings follow it.
    """
    pipeline = cfg.to_dict()
    pipeline["models"] = {**portable_models(pipeline["models"]), "reranker": reranker["kind"], "reranker_model": reranker["model"]}
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    meta = checkpoint[METADATA_KEY]
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "base_model": {"id": hparams["llm"], "revision": hparams["llm_revision"]},
        "embedder": {"id": cfg.models.embedder, "revision": data.get("embedder_revision"), "dim": hparams["feature_dim"]},
        "reranker": reranker,
        "feature_dim": hparams["feature_dim"],
        "graph_tokens": hparams["graph_tokens"],
        "prompts_version": PROMPTS_VERSION,
        "module": portable_module(hparams),
        "adapter": {"graph": ADAPTER_FILE, "lora": LORA_WEIGHTS_FILE if has_lora else None, "config_hash": meta["config_hash"]},
        "graph_reading": meta.get("graph_reading"),
        "pipeline": pipeline,
        "training": {
            "global_step": checkpoint.get("global_step"),
            "epoch": checkpoint.get("epoch"),
            "data": Path(data["path"]).name if data.get("path") else None,
            "sources": sources,
            "init_from": meta.get("init_from"),
        },
        "libraries": library_versions(),
    }


def started_from(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The checkpoint the graph path started from (``model.init_from``), named by its file name only, with its SHA-256."""
    if not record:
        return None
    return {"name": Path(record["path"]).name, "sha256": record["sha256"], "graph_reading": record.get("graph_reading")}


def bundle_reranker(cfg: PipelineConfig, staging: Path) -> dict[str, Any]:
    """Copy a local cross-encoder folder into the export as flat ``reranker.*`` files; return config.json's reranker record.

    A hub id is recorded by name. A local folder that has not been built yet is left out with one warning
    line: the export then has no reranker, as the pipeline that names it runs without one.
    """
    kind, ref = cfg.models.reranker, cfg.models.reranker_model
    if kind != "cross" or not ref:
        return {"kind": kind, "model": ref, "bundled": False}
    if names_missing_folder(ref):
        log.warning("warning: cross-encoder folder %s not found (build it with `%s`); the export has no reranker", ref, build_command(ref))
        return {"kind": "none", "model": None, "bundled": False}
    folder = Path(ref).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InputError(ref, "a file, not a cross-encoder folder: an export bundles a folder or names a Hub id, never a path of this machine")
    if not folder.is_dir():
        return {"kind": kind, "model": ref, "bundled": False}
    entries = sorted(folder.iterdir())
    nested = [p.name for p in entries if not p.is_file()]
    if nested:
        raise InputError(str(folder), f"a cross-encoder folder to bundle must be flat; it holds {nested}")
    for path in (p for p in entries if p.name != OUTPUT_MARKER):
        shutil.copyfile(path, staging / f"{RERANKER_PREFIX}{path.name}")
    return {"kind": kind, "model": None, "bundled": True}


def prompts_record() -> dict[str, Any]:
    """Every prompt template the pipeline renders, with the prompts version."""
    templates = {**ALL_PROMPTS, RERANK.name: RERANK, JSON_RETRY.name: JSON_RETRY}
    return {"version": PROMPTS_VERSION, "templates": {name: {"system": t.system, "user": t.user} for name, t in templates.items()}}


def write_json(path: Path, value: Any) -> None:
    """Indented UTF-8 JSON with a final newline."""
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_checksums(folder: Path) -> None:
    """``sha256sums.txt`` over every other file of the (flat) folder, sorted by name."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
    lines = [f"{file_sha256(folder / name)}  {name}" for name in names]
    (folder / CHECKSUM_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


def unsafe_files(folder: Path) -> list[str]:
    """Entries that are not plainly safe to load: anything but readable safetensors, JSON, Markdown or text files.

    An allow-list rather than a pickle detector: no pickled weights, archives, code or subfolders can slip in.
    """
    return [str(p.relative_to(folder)) for p in sorted(folder.rglob("*")) if p.is_symlink() or not p.is_file() or not _reads_as_named(p)]


def _reads_as_named(path: Path) -> bool:
    """Whether the file parses as its suffix says: safetensors, JSON, or UTF-8 Markdown/text."""
    from safetensors import safe_open

    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt"):
                return True
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
            return True
        if path.suffix in TEXT_FILE_TYPES:
            path.read_text(encoding="utf-8")
            return True
    except Exception:  # safetensors raises its own error type; any failure means the file is not what it claims
        return False
    return False


def public_models(cfg: PipelineConfig, hparams: Mapping[str, Any], names: Mapping[str, str], config_path: Path) -> dict[str, str]:
    """``{"llm": ..., "embedder": ...}`` as the export records them: the Hub id or ``pkg:`` reference, never a local path.

    A model known here only by a local path needs its public name in ``names`` (``--llm-id``, ``--embedder-id``);
    the loader checks that the model it finds under that name is the trained one (backbone fingerprint).
    """
    public = {}
    for role, ref in (("llm", hparams["llm"]), ("embedder", cfg.models.embedder)):
        name = names.get(role) or ref
        if not is_public_reference(name):
            where = f"--{role}-id" if names.get(role) else f"{config_path}: pipeline.models.{role}"
            raise InputError(where, f"{name!r} is a local path (or no public model name): an export names a Hub repo id or a bundled pkg: model; pass its public name with --{role}-id")
        public[role] = name
    return public


def rename_base_model(metadata: Mapping[str, Any], llm: str) -> dict[str, Any]:
    """The adapter metadata with the base model recorded under its public name ``llm`` (its config hash recomputed)."""
    settings = {**metadata.get("settings", {}), "llm": llm}
    return {**metadata, "base_model": llm, "settings": settings, "config_hash": config_hash(settings)}


def name_lora_base_model(folder: Path, llm: str) -> None:
    """Record the base model's public name in peft's ``adapter_config.json``."""
    path = folder / LORA_CONFIG_FILE
    write_json(path, {**json.loads(path.read_text(encoding="utf-8")), "base_model_name_or_path": llm})


def read_eval_report(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """Flat scalar metrics from an evaluation's ``metrics.json`` (nested values are left out, and so are the
    :data:`MACHINE_REPORT_KEYS`)."""
    if path is None:
        return None
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), "eval report not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"not valid JSON: {exc}") from None
    if not isinstance(report, dict):
        raise InputError(str(path), "expected a JSON object of metrics")
    return {k: v for k, v in report.items() if k not in MACHINE_REPORT_KEYS and (isinstance(v, (int, float, str, bool)) or v is None)}


def publish_export(staging: Path, out: Path) -> None:
    """Swap the finished ``staging`` folder in as ``out``; an existing export (or empty folder) there is replaced, anything else refused."""
    check_export_target(out)
    replace_folder(staging, out)


def check_export_target(out: Path) -> None:
    """Refuse ``out`` unless it is missing, empty or an earlier export: anything else is the user's."""
    refuse_foreign_folder(out, is_export_folder, "a QGMem export")


def is_export_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an export's config.json: a folder ``export`` may replace."""
    config = folder / CONFIG_FILE
    return config.is_file() and EXPORT_FORMAT in config.read_text(encoding="utf-8", errors="replace")


def export_model(
    checkpoint_path: str | os.PathLike,
    config_path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    eval_report: str | os.PathLike | None = None,
    repo_id: str | None = None,
    names: Mapping[str, str] | None = None,
) -> Path:
    """Write the export folder ``out`` from a checkpoint and the fit YAML it was trained with; return ``out``.

    ``names`` gives the public name (Hub id or ``pkg:``) of a base model or embedder (``llm``, ``embedder``)
    known here only by a local path; see :func:`public_models`.
    """
    from export.model_card import render_model_card

    config_path, out = Path(config_path), Path(out).expanduser().resolve()
    check_export_target(out)
    checkpoint = read_checkpoint(checkpoint_path)
    where = str(checkpoint_path)  # a folder stands for its last.ckpt
    hparams = module_hyperparameters(checkpoint, where)
    cfg = load_pipeline_config(config_path)
    check_pipeline_matches(cfg, hparams, checkpoint.get("datamodule_hyper_parameters") or {}, config_path)
    graph_state, lora_state = check_checkpoint(checkpoint, hparams, where)
    metrics = read_eval_report(eval_report)
    public = public_models(cfg, hparams, names or {}, config_path)
    public_hparams = {**hparams, "llm": public["llm"]}
    public_meta = {**rename_base_model(checkpoint[METADATA_KEY], public["llm"]), "init_from": started_from(checkpoint[METADATA_KEY].get("init_from"))}
    public_checkpoint = {**checkpoint, METADATA_KEY: public_meta}
    public_cfg = dataclasses.replace(cfg, models=dataclasses.replace(cfg.models, **public))

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_adapter(graph_state, public_checkpoint[METADATA_KEY], staging)
        if lora_state:
            save_lora(checkpoint, hparams, staging)
            name_lora_base_model(staging, public["llm"])
        sources = training_sources((checkpoint.get("datamodule_hyper_parameters") or {}).get("path"))
        reranker = bundle_reranker(cfg, staging)
        config = export_config(public_cfg, public_hparams, public_checkpoint, bool(lora_state), sources, reranker)
        write_json(staging / CONFIG_FILE, config)
        write_json(staging / PROMPTS_FILE, prompts_record())
        (staging / CARD_FILE).write_text(render_model_card(config, metrics, repo_id), encoding="utf-8")
        unsafe = unsafe_files(staging)
        if unsafe:
            raise InputError(str(out), f"refusing to export files that are not safetensors, JSON or text: {unsafe}")
        for path in staging.iterdir():
            path.chmod(0o644)
        write_checksums(staging)
        os.chmod(staging, 0o755)
        publish_export(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
