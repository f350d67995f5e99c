"""Checkpoint I/O of the trainable parameters only (graph encoder, projector, LoRA), never the frozen LLM.

A checkpoint or adapter file carries the base model's id and revision and a hash of the settings that
shape the trainable parameters; loading into a module built differently is one clear error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from qgmem_train.errors import InputError

METADATA_KEY = "qgmem"
"""Key of the compatibility record in a Lightning checkpoint dict."""

ADAPTER_FILE = "graph_adapter.safetensors"


def config_hash(settings: Mapping[str, Any]) -> str:
    """Short stable hash of the settings that define the trainable parameters."""
    blob = json.dumps(dict(settings), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def trainable_state_dict(module: torch.nn.Module, frozen: str = "llm") -> dict[str, torch.Tensor]:
    """Parameters that require gradients, and the persistent buffers outside the frozen child ``frozen`` (state the graph
    path needs at inference, e.g. centering statistics), by their ``state_dict`` names, detached."""
    state = {name: param.detach() for name, param in module.named_parameters() if param.requires_grad}
    for child_name, child in module.named_children():
        if child_name != frozen:
            parameters = {name for name, _ in child.named_parameters()}
            state |= {f"{child_name}.{name}": value.detach() for name, value in child.state_dict().items() if name not in parameters}
    return state


def check_compatible(found: Mapping[str, Any] | None, expected: Mapping[str, Any], keys: set[str], expected_keys: set[str], where: str) -> None:
    """Refuse a checkpoint written for another base model, revision, backbone fingerprint, setting or parameter set."""
    if not found:
        raise InputError(where, "no qgmem metadata: not a checkpoint of this model (or a full-model checkpoint)")
    if found.get("backbone") != expected["backbone"]:
        raise InputError(
            where,
            f"made for a backbone with another config, tokenizer or chat template (fingerprint {found.get('backbone')!r}, "
            f"this one is {expected['backbone']!r}); use the exact base model it was trained on",
        )
    for field in ("base_model", "revision", "config_hash"):
        if found.get(field) != expected[field]:
            raise InputError(
                where, f"{field} is {found.get(field)!r} in the checkpoint but {expected[field]!r} in this configuration"
            )
    if keys != expected_keys:
        extra, missing = sorted(keys - expected_keys), sorted(expected_keys - keys)
        raise InputError(where, f"trainable parameters differ: unexpected {extra[:3]}, missing {missing[:3]}")


def save_adapter(state: Mapping[str, torch.Tensor], metadata: Mapping[str, Any], folder: str | os.PathLike) -> Path:
    """Write trainable parameters and metadata to ``folder/graph_adapter.safetensors`` atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / ADAPTER_FILE
    handle, staging = tempfile.mkstemp(prefix=f".{ADAPTER_FILE}.", dir=folder)
    os.close(handle)
    try:
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
        save_file(tensors, staging, metadata={METADATA_KEY: json.dumps(dict(metadata), default=str)})
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    return target


def load_adapter(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read an adapter file (or the folder holding one): tensors and metadata."""
    path = Path(path)
    if path.is_dir():
        path = path / ADAPTER_FILE
    if not path.exists():
        raise InputError(str(path), "adapter file not found")
    return load_adapter_bytes(path.read_bytes())


def load_adapter_bytes(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and metadata of the adapter file whose bytes are ``data`` (parsed from these bytes, not read again).

    Malformed bytes raise ``SafetensorError`` (tensors) or ``ValueError`` (the header's JSON).
    """
    from safetensors.torch import load

    tensors = load(data)  # checks the header's size and offsets before the JSON below is read
    header_size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_size])
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY) if isinstance(header, dict) else None
    return tensors, json.loads(raw) if raw else {}
