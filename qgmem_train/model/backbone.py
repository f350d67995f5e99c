"""The frozen backbone's identity without its weights: folder, tokenizer, hidden size and a fingerprint.

The module is built (and its graph projector sized) before Lightning knows the process's device, so
the weights load later, in ``configure_model``; what the projector and checkpoints need comes from the
config and tokenizer files here. The fingerprint hashes what decides the backbone's behaviour on our
prompts: its model config, its tokenizer (vocabulary, merges, added tokens, normalisation) and its chat
template; keys that only record the writing library's version are left out.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qgmem_train.llm.resolver import resolve_model_dir

VOLATILE_CONFIG_KEYS = frozenset({"transformers_version", "_name_or_path", "_commit_hash"})
"""Model-config keys that change with the library or the folder, not with the model."""


@dataclass
class BackboneInfo:
    """What is known of the backbone before its weights are loaded."""

    folder: Path
    tokenizer: Any
    hidden_size: int
    fingerprint: str


def describe_backbone(ref: str, revision: str | None, cache_dir: str | os.PathLike | None, trust_remote_code: bool) -> BackboneInfo:
    """Resolve ``ref`` to a folder and read its tokenizer, hidden size and fingerprint (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    from qgmem_train.errors import ModelUnavailableError

    folder = resolve_model_dir(ref, cache_dir, revision=revision)
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelUnavailableError(f"cannot read model {ref!r} from {folder}: {str(exc).splitlines()[0]}") from None
    hidden_size = int(config.get_text_config().hidden_size)
    return BackboneInfo(folder=folder, tokenizer=tokenizer, hidden_size=hidden_size, fingerprint=backbone_fingerprint(config.to_dict(), tokenizer))


def backbone_fingerprint(config: dict[str, Any], tokenizer: Any) -> str:
    """Short SHA-256 of the model config, the tokenizer's definition and the chat template."""
    digest = hashlib.sha256()
    for part in (canonical_config(config), tokenizer_definition(tokenizer), getattr(tokenizer, "chat_template", None) or ""):
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    """The model config without the keys in :data:`VOLATILE_CONFIG_KEYS`."""
    return {key: value for key, value in config.items() if key not in VOLATILE_CONFIG_KEYS}


def tokenizer_definition(tokenizer: Any) -> Any:
    """A fast tokenizer's full definition (model, added tokens, normaliser, pre-tokenizer), else its vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        return {key: definition.get(key) for key in ("model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor")}
    return sorted(tokenizer.get_vocab().items())
