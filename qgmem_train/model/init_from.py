"""Starting a fit from another run's graph path (``model.init_from``): an aligned checkpoint's encoder, readout and projector.

The source is a fit checkpoint (``.ckpt``), an export folder or its adapter file. Only the graph path's tensors are
taken (LoRA, precision and the text path may differ); the base model, its revision and files, and every setting that
shapes the graph path must match, else one :class:`InputError` (:func:`~qgmem_train.model.checkpoint.check_compatible`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from qgmem_train.errors import InputError
from qgmem_train.fileio import file_sha256
from qgmem_train.model.checkpoint import ADAPTER_FILE, METADATA_KEY, check_compatible, config_hash, load_adapter

GRAPH_PATH = ("encoder.", "readout.", "projector.")
"""State-dict prefixes of the graph path: what an init checkpoint gives the new fit."""

GRAPH_SHAPE_SETTINGS = (
    "feature_dim", "graph_tokens", "graph_readout", "graph_center", "gnn_hidden", "gnn_layers", "gnn_heads", "reverse_edges",
    "projector_hidden", "projector_norm",
)  # fmt: skip
"""Flat settings (:func:`~qgmem_train.model.settings.flat_settings`) that shape the graph path's tensors."""


def graph_only(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with its ``config_hash`` taken over the graph path's settings alone."""
    settings = metadata.get("settings") or {}
    return {**metadata, "config_hash": config_hash({key: settings.get(key) for key in GRAPH_SHAPE_SETTINGS})}


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any], Path]:
    """Tensors, qgmem metadata, the rest of a checkpoint's record, and the file read."""
    if path.is_dir() or path.suffix == ".safetensors":
        file = path / ADAPTER_FILE if path.is_dir() else path
        try:
            state, metadata = load_adapter(file)
        except (OSError, ValueError) as exc:
            raise InputError(str(file), f"not a readable graph adapter: {exc}") from None
        return state, metadata, {}, file
    if not path.is_file():
        raise InputError(str(path), "not found: give a fit checkpoint (.ckpt), an export folder or its graph adapter file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a file that is not a checkpoint
        raise InputError(str(path), f"not a readable fit checkpoint: {str(exc).splitlines()[0]}") from None
    if not isinstance(checkpoint, dict):
        raise InputError(str(path), "not a fit checkpoint")
    return checkpoint.get("state_dict") or {}, checkpoint.get(METADATA_KEY) or {}, checkpoint, path


def read_init_checkpoint(
    path: str | os.PathLike, expected: Mapping[str, Any], expected_keys: set[str]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The graph-path tensors of ``path`` checked against this module (``expected``: its checkpoint metadata; ``expected_keys``:
    its graph-path state names), and the record a new checkpoint keeps of where it started."""
    state, metadata, checkpoint, file = _read(Path(path))
    graph_state = {name: tensor for name, tensor in state.items() if name.startswith(GRAPH_PATH)}
    check_compatible(graph_only(metadata) if metadata else None, graph_only(expected), set(graph_state), expected_keys, f"model.init_from {path}")
    record = {
        "path": str(path),
        "sha256": file_sha256(file),
        "config_hash": metadata.get("config_hash"),
        "global_step": checkpoint.get("global_step"),
        "graph_reading": metadata.get("graph_reading"),
    }
    return graph_state, record
