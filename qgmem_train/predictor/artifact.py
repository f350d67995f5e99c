"""The trust boundary of an export: find it, prove each file is the one exported, read what it may decide.

An export (a folder, or a Hub repo anyone can write to, checksum file included) describes a model: its
base model, module hyperparameters, adapter files and pipeline settings. It never decides what code runs,
which server is called or which secret is sent: a config.json that sets :data:`CALLER_MODELS` or
:data:`CALLER_MODULE` to anything but the default is refused, and those settings come only from the
caller. The models it names are Hub repo ids or bundled ``pkg:`` models, never a path on the loading machine.
Every file of the folder must be listed by a plain file name of one of the exporter's file types in the
checksum file, be no link out of the folder, and match it. A trained cross-encoder travels as flat
``reranker.*`` files and is written to the cache from the bytes that were verified.

This module also defines the export format (file names, checksum file) that ``python -m export`` writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from qgmem_train.config import ModelsConfig, PipelineConfig, pipeline_from_dict, settings_from_dict
from qgmem_train.errors import InputError, ModelUnavailableError, first_line
from qgmem_train.fileio import checksums_digest, decode_text, file_sha256, parse_json, read_text
from qgmem_train.llm.prompts import PROMPTS_VERSION

EXPORT_FORMAT = "qgmem-export"
EXPORT_FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
PROMPTS_FILE = "prompts.json"
CARD_FILE = "README.md"
CHECKSUM_FILE = "sha256sums.txt"
"""SHA-256 of every other file, one ``<hex>  <name>`` line each (``sha256sum -c`` reads it)."""
LORA_WEIGHTS_FILE = "adapter_model.safetensors"
LORA_CONFIG_FILE = "adapter_config.json"
RERANKER_PREFIX = "reranker."
"""Name prefix of a bundled cross-encoder's files (``reranker.model.safetensors``...): the folder stays flat."""
RERANKER_REQUIRED = ("config.json", "model.safetensors")
TEXT_FILE_TYPES = (".md", ".txt")
EXPORT_FILE_TYPES = (".safetensors", ".json", *TEXT_FILE_TYPES)
"""Suffixes of the files the exporter writes (each one checked to read as its suffix says); a listed file has one of them."""
"""Files a bundled cross-encoder cannot load without (names inside its own folder)."""
HUB_PATTERNS = ["*.json", "*.safetensors", "*.md", CHECKSUM_FILE]
"""Files fetched when loading from the Hub: never anything pickled."""
MAX_JSON_BYTES = 16 << 20
"""Largest JSON file an export may list: its configs are kilobytes, a bundled reranker's tokenizer a few megabytes;
a larger one is refused before it is read (parsed JSON takes several times its size in memory)."""

CALLER_MODELS = ("backend", "base_url", "api_key_env", "trust_remote_code", "allow_insecure_http")
"""``pipeline.models`` settings that decide what runs, which server is called and which key it gets: the caller's alone."""
CALLER_MODULE = ("trust_remote_code",)
"""Module hyperparameters that decide what runs: the caller's alone."""
MACHINE_MODELS = ("device", "cache_dir", "template_budget_s")
"""``pipeline.models`` settings of the loading machine: the caller's arguments; an export's values are ignored."""
MACHINE_MODULE = ("cache_dir", "init_from")
"""Module hyperparameters of the loading machine: the caller's argument; an export's value is ignored."""
MODEL_REFERENCES = ("llm", "embedder", "reranker_model")
"""``pipeline.models`` settings that name a model to load; with ``module.llm``, each is checked by :func:`check_model_reference`."""
MODULE_AT_LEAST = {"feature_dim": 1, "graph_tokens": 0, "gnn_hidden": 1, "gnn_layers": 0, "gnn_heads": 1, "projector_hidden": 0, "lora_r": 0}
"""Smallest value of the module's count hyperparameters."""
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelsConfig)}
_HOW_TO_PASS = {
    "backend": "models={'backend': ...}",
    "base_url": "models={'base_url': ...}",
    "api_key_env": "models={'api_key_env': ...}",
    "trust_remote_code": "trust_remote_code=True",
    "allow_insecure_http": "allow_insecure_http=True",
}


@dataclass(frozen=True)
class Export:
    """A verified export: its folder and config.json, less every setting that is the caller's to decide."""

    folder: Path
    config: dict[str, Any]
    """config.json as read."""
    pipeline: PipelineConfig
    """The exported pipeline settings; caller and machine settings at their defaults."""
    module: dict[str, Any]
    """Module hyperparameters without caller and machine settings (typed by :func:`module_arguments`)."""
    graph_adapter: str
    """File name of the graph adapter."""
    lora_adapter: str | None
    """File name of the peft LoRA weights, ``None`` without LoRA."""
    reranker_files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    """The bundled cross-encoder's files (each name starts with :data:`RERANKER_PREFIX`), their bytes as verified; empty when none is bundled."""
    adapters: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    """The bytes of the graph adapter and LoRA files as verified, by file name: what the module loads."""


def is_plain_name(name: str) -> bool:
    """Whether ``name`` names a file directly inside a folder: no separator, not ``.`` or ``..``, not empty."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def portable_models(models: Mapping[str, Any]) -> dict[str, Any]:
    """``pipeline.models`` without the caller's and the machine's settings: what an export may carry."""
    return {k: v for k, v in models.items() if k not in CALLER_MODELS + MACHINE_MODELS}


def portable_module(module: Mapping[str, Any]) -> dict[str, Any]:
    """Module hyperparameters without the caller's and the machine's settings: what an export may carry."""
    return {k: v for k, v in module.items() if k not in CALLER_MODULE + MACHINE_MODULE}


def read_checksums(folder: Path) -> dict[str, str]:
    """``{file name: hex digest}`` from the folder's checksum file; a missing or malformed file is an error.

    Lines are read as ``sha256sum -c`` reads them: blank lines and ``#`` comments skipped, hex in either case,
    `` *name`` (binary mode) as ``  name``. Every name is a plain file name of one of :data:`EXPORT_FILE_TYPES`.
    """
    path = folder / CHECKSUM_FILE
    if not path.is_file():
        raise InputError(str(path), "checksum file missing: not a complete QGMem export")
    _refuse_outside_link(path, folder)
    sums: dict[str, str] = {}
    for number, line in enumerate(read_text(path, kind="checksum file").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, name = line[:64].lower(), line[66:] if line[64:66] in ("  ", " *") else ""
        where = f"{path}: line {number}"
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not name:
            raise InputError(where, "expected '<sha256>  <file name>'")
        if not is_plain_name(name):
            raise InputError(where, f"{name!r} is not a plain file name (no folders, no '..'): an export is one flat folder")
        _check_file_type(name, where)
        if name in sums:
            raise InputError(where, f"{name} is listed twice")
        sums[name] = digest
    return sums


def verify_checksums(folder: Path) -> dict[str, str]:
    """Check that the checksum file lists every file of the folder and that each matches; one error otherwise."""
    sums = _listed_files(folder)
    _verify_files(folder, sums, hold=lambda name: False)
    return sums


def _listed_files(folder: Path) -> dict[str, str]:
    """The checksum file's ``{name: digest}``, refusing an export that lacks a required file or holds one it does not list."""
    sums = read_checksums(folder)
    for required in (CONFIG_FILE, PROMPTS_FILE):
        if required not in sums:
            raise InputError(str(folder / CHECKSUM_FILE), f"{required} is not listed: not a complete QGMem export")
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if name != CHECKSUM_FILE and name not in sums and not (path.is_dir() and not path.is_symlink()):
            raise InputError(str(path), f"not listed in the checksum file: an export holds only the files {CHECKSUM_FILE} lists")
    return sums


def _verify_files(folder: Path, sums: Mapping[str, str], hold: Callable[[str], bool]) -> dict[str, bytes]:
    """Check each file of ``sums`` against its digest, read in blocks; return the bytes of those ``hold`` names, exactly as
    they were hashed. A JSON file past :data:`MAX_JSON_BYTES` is refused before it is read."""
    held: dict[str, bytes] = {}
    for name, expected in sums.items():
        path = folder / name
        if not path.is_file():
            raise InputError(str(path), "listed in the checksum file but missing")
        _refuse_outside_link(path, folder)
        if name.endswith(".json") and path.stat().st_size > MAX_JSON_BYTES:
            raise InputError(str(path), f"{path.stat().st_size} bytes, more than the {MAX_JSON_BYTES} a JSON file of an export may hold")
        kept = bytearray() if hold(name) else None
        if file_sha256(path, kept) != expected:
            raise InputError(str(path), "SHA-256 differs from the checksum file: the file changed after export; refusing to load it")
        if kept is not None:
            held[name] = bytes(kept)
    return held


def _check_file_type(name: str, where: str) -> None:
    """Refuse a listed name that is not one of the exporter's own file types (a bundled reranker's: ``reranker.<name>.<type>``)."""
    inner = name[len(RERANKER_PREFIX):] if name.startswith(RERANKER_PREFIX) else name
    if not inner or inner.startswith(".") or Path(inner).suffix not in EXPORT_FILE_TYPES:
        raise InputError(where, f"{name!r} is not a file the exporter writes: names end in {', '.join(EXPORT_FILE_TYPES)} (reranker files: reranker.<name>.<type>)")


def _refuse_outside_link(path: Path, folder: Path) -> None:
    """Refuse a listed file (or the checksum file) that is a symlink leading out of the folder, or a hard link, or a link
    to one; the Hub cache's snapshot links into its blobs pass."""
    if path.is_symlink():
        target, inside = path.resolve(), folder.resolve()
        snapshots = inside.parent
        hub_blob = snapshots.name == "snapshots" and snapshots.parent.name.startswith("models--") and target.parent == snapshots.parent / "blobs"
        if target.parent != inside and not hub_blob:
            raise InputError(str(path), f"a link to {target}, outside the export folder: an export holds its own files")
    if path.stat().st_nlink > 1:  # of the file a link leads to, too: a Hub blob may itself be a hard link
        raise InputError(str(path), "a hard link (the same file has another name elsewhere): an export holds its own files")


def locate_export(ref: str | Path, *, revision: str | None = None) -> Path:
    """The local folder of an export: ``ref`` itself when it is a folder, else a Hub snapshot of repo ``ref``.

    The Hub is asked only for a ``str`` of the form ``owner/name`` that is no path here; anything else that is
    not a folder is "no such folder" (or "not a folder").
    """
    from qgmem_train.llm.resolver import looks_like_hub_repo_id

    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    text = str(ref)
    if path.exists():
        raise InputError(text, "not a folder: an export is a folder (or a Hub repo id of the form owner/name)")
    if isinstance(ref, Path) or text.count("/") != 1 or not looks_like_hub_repo_id(text):
        raise InputError(text, "no such folder")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline mode, missing repo, network, auth: all end as one line for the user
        why = first_line(exc)
        raise ModelUnavailableError(f"no such folder {text!r}, and export {text!r}{'@' + revision if revision else ''} unavailable on the Hub: {why}") from None


def read_export(folder: Path) -> Export:
    """Verify the folder's checksums, then read and check its config.json; anything malformed is one :class:`InputError`.

    config.json is verified and parsed first, so only the files it names (adapters, a bundled reranker) are kept in
    memory while they are verified; every other listed file is only hashed, block by block."""
    listed = _listed_files(folder)
    held = _verify_files(folder, {CONFIG_FILE: listed[CONFIG_FILE]}, hold=lambda name: True)  # parsed from the bytes hashed
    path = folder / CONFIG_FILE
    config = parse_json(decode_text(held[CONFIG_FILE], str(path)), str(path))
    if not isinstance(config, dict) or config.get("format") != EXPORT_FORMAT:
        raise InputError(f"{path}: format", f"not a {EXPORT_FORMAT} config")
    if config.get("format_version") != EXPORT_FORMAT_VERSION:
        raise InputError(f"{path}: format_version", f"is {config.get('format_version')!r}, this code reads {EXPORT_FORMAT_VERSION}")
    if config.get("prompts_version") != PROMPTS_VERSION:
        raise InputError(f"{path}: prompts_version", f"exported with prompts {config.get('prompts_version')!r}, this code has {PROMPTS_VERSION!r}")
    module = _section(config, "module", path)
    pipeline = _section(config, "pipeline", path)
    models = _section(pipeline, "models", path, "pipeline.models") if "models" in pipeline else {}
    _refuse_caller_settings(module, CALLER_MODULE, f"{path}: module")
    _refuse_caller_settings(models, CALLER_MODELS, f"{path}: pipeline.models")
    for where, values, key in ((f"{path}: module", module, "llm"), *((f"{path}: pipeline.models", models, k) for k in MODEL_REFERENCES)):
        if values.get(key) is not None:
            check_model_reference(values[key], f"{where}.{key}")
    portable = pipeline_from_dict({**pipeline, "models": portable_models(models)}, f"{path}: pipeline")
    adapter = _section(config, "adapter", path)
    graph = _adapter_file(adapter.get("graph"), "graph", listed, path)
    lora = _adapter_file(adapter["lora"], "lora", listed, path) if adapter.get("lora") is not None else None
    reranker = config.get("reranker")
    bundled = isinstance(reranker, dict) and reranker.get("bundled") is True
    used = {graph, lora} | {name for name in listed if bundled and name.startswith(RERANKER_PREFIX)}
    rest = {name: digest for name, digest in listed.items() if name != CONFIG_FILE}
    held.update(_verify_files(folder, rest, hold=used.__contains__))  # what the loader uses, from the bytes hashed
    adapters = {name: held[name] for name in (graph, lora) if name is not None}
    return Export(folder, config, portable, portable_module(module), graph, lora, _bundled_reranker_files(config, held, path), adapters)


def bundled_reranker_folder(export: Export, cache_dir: str | Path | None = None) -> Path | None:
    """A CrossEncoder folder holding the export's bundled reranker, ``None`` when it bundles none.

    The ``reranker.*`` files are written once, under their own names, into ``<cache>/rerankers/<digest of
    their checksums>`` from the bytes that were verified (never read again from the export); a cached copy
    is used only while every file still matches those checksums and no one else can write it (it could be
    swapped after the check), else it is written again (atomically).
    """
    if not export.reranker_files:
        return None
    from qgmem_train.fileio import replace_folder, seal_folder, staging_beside, trusted_cache_entry
    from qgmem_train.llm.resolver import default_cache_dir

    sums = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(export.reranker_files.items())}
    wanted = {name[len(RERANKER_PREFIX):]: digest for name, digest in sums.items()}
    digest = checksums_digest(sums)
    final = default_cache_dir(cache_dir) / "rerankers" / digest
    if trusted_cache_entry(final) and final.is_dir() and {p.name for p in final.iterdir()} == set(wanted) and all(file_sha256(final / n) == d for n, d in wanted.items()):
        return final
    with staging_beside(final) as staging:
        for name, data in export.reranker_files.items():
            (staging / name[len(RERANKER_PREFIX):]).write_bytes(data)
        seal_folder(staging)
        replace_folder(staging, final)
    return final


def _bundled_reranker_files(config: Mapping[str, Any], files: Mapping[str, bytes], path: Path) -> dict[str, bytes]:
    """The verified ``reranker.*`` files among ``files``, when config.json says a cross-encoder is bundled; its required files must be there."""
    reranker = config.get("reranker")
    if not isinstance(reranker, dict) or reranker.get("bundled") is not True:
        return {}
    for name in RERANKER_REQUIRED:
        if RERANKER_PREFIX + name not in files:
            raise InputError(f"{path}: reranker", f"says a cross-encoder is bundled, but {RERANKER_PREFIX + name} is not in the export")
    return {name: data for name, data in files.items() if name.startswith(RERANKER_PREFIX)}


def is_public_reference(ref: str) -> bool:
    """Whether ``ref`` names a model the same way on every machine: a bundled ``pkg:`` model, or a Hub repo id that is no folder here."""
    from qgmem_train.llm.resolver import BUNDLED_PACKAGES, PACKAGE_PREFIX, looks_like_hub_repo_id

    if ref.startswith(PACKAGE_PREFIX):
        return ref[len(PACKAGE_PREFIX):] in BUNDLED_PACKAGES
    return looks_like_hub_repo_id(ref) and not Path(ref).exists()


def check_model_reference(ref: Any, where: str) -> None:
    """Refuse a model reference an export may not make: only a Hub repo id or a bundled-model ``pkg:`` name.

    A path (absolute, ``~``, relative, or a Hub-id-shaped name that is a folder here) would load whatever lies
    on the user's disk, and ``pkg:`` of another package would import it; those come only from the caller.
    """
    from qgmem_train.llm.resolver import BUNDLED_PACKAGES, PACKAGE_PREFIX

    if not isinstance(ref, str):
        raise InputError(where, f"is {ref!r}, not a model reference")
    if ref.startswith(PACKAGE_PREFIX) and not is_public_reference(ref):
        raise InputError(where, f"is {ref!r}, but an export may name only the bundled model packages ({', '.join(PACKAGE_PREFIX + p for p in BUNDLED_PACKAGES)})")
    if not is_public_reference(ref):
        raise InputError(
            where, f"is {ref!r}, but an export may name only a Hub repo id or a bundled pkg: model, never a path on this machine; "
            "a local model is the caller's to pass: QGMemPredictor.from_pretrained(..., models={...})",
        )  # fmt: skip


def _section(values: Mapping[str, Any], key: str, path: Path, name: str | None = None) -> dict[str, Any]:
    """``values[key]``, which must be a JSON object."""
    section = values.get(key)
    if not isinstance(section, dict):
        raise InputError(f"{path}: {name or key}", f"missing or not a mapping (got {type(section).__name__})")
    return section


def _refuse_caller_settings(values: Mapping[str, Any], keys: Collection[str], where: str) -> None:
    """Refuse an export that sets one of ``keys`` (the caller's to decide) to anything but the default."""
    for key in keys:
        if key in values and values[key] != _DEFAULTS[key]:
            raise InputError(
                f"{where}.{key}",
                f"is {values[key]!r}, but an export cannot decide what runs, which server is called or which key is sent; "
                f"the caller passes it: QGMemPredictor.from_pretrained(..., {_HOW_TO_PASS[key]})",
            )


def _adapter_file(name: Any, key: str, listed: Collection[str], path: Path) -> str:
    """The adapter file name config.json gives: a plain name of a file the checksum file lists."""
    where = f"{path}: adapter.{key}"
    if not isinstance(name, str) or not is_plain_name(name):
        raise InputError(where, f"{name!r} is not a plain file name of the export folder")
    if name not in listed:
        raise InputError(where, f"{name} is not a file of the export (the checksum file does not list it)")
    return name


def module_arguments(export: Export) -> dict[str, Any]:
    """The exported module hyperparameters, checked against :class:`GraphAugmentedLM`'s arguments (names, types, counts).

    The arguments become a settings dataclass so that the pipeline's own checker types them.
    """
    from qgmem_train.model.module import flat_parameters

    where = f"{export.folder / CONFIG_FILE}: module"
    fields = []
    for name, hint, default in flat_parameters():
        if name in CALLER_MODULE + MACHINE_MODULE:
            continue
        required = default is inspect.Parameter.empty
        if required and name not in export.module:
            raise InputError(f"{where}.{name}", "missing")
        fields.append((name, hint, dataclasses.field(default=None if required else default)))
    settings = dataclasses.make_dataclass("ModuleSettings", fields)
    settings_from_dict(settings, export.module, where, at_least=MODULE_AT_LEAST, unit_interval=frozenset())
    return dict(export.module)


def check_base_url(url: str | None, *, allow_insecure_http: bool) -> None:
    """Refuse an HTTP backend endpoint that is not http(s), or plain http to another machine without the caller's opt-in."""
    from qgmem_train.llm.http import is_loopback_host

    where = "models.base_url"
    if not url:
        raise InputError(where, "required with models.backend openai")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(where, f"not an http(s) URL with a host (scheme {parts.scheme!r})")
    if parts.scheme == "http" and not allow_insecure_http and not is_loopback_host(parts.hostname):
        raise InputError(
            where, f"plain http to {parts.hostname} would send the API key and your data unencrypted; use https, or pass allow_insecure_http=True"
        )
