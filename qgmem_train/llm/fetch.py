"""``python -m qgmem_train fetch CONFIG [--list] [LightningCLI overrides]``: put a training config's Hub models in the local cache.

``slurm/train.sbatch`` runs it once as a one-task step before the ranks start and then runs the ranks with
``HF_HUB_OFFLINE=1``: otherwise every rank (16 on 2 nodes × 8 GPUs) resolves each Hub snapshot itself at start. The
models are ``pipeline.models.llm`` (at ``llm_revision``) and ``pipeline.models.embedder``, as the config and its
``--pipeline.models.*`` overrides name them; bundled (``pkg:``) and local-path models are left alone. ``--list``
prints the Hub ids without fetching anything (nothing when there are none). The cache must be one every node reads
(``HF_HOME`` on a shared filesystem). A model that is not cached while the Hub does not answer within
:data:`PROBE_TIMEOUT_S` (a compute node without network) is refused in one line at once, not after the download's retries.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import yaml

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM
from qgmem_train.errors import InputError, ModelUnavailableError
from qgmem_train.llm.resolver import HUB_FILE_PATTERNS, looks_like_hub_repo_id, resolve_model_dir

PROBE_TIMEOUT_S = 10.0
"""Seconds the Hub's host has to accept a connection before the fetch is refused."""

FIELDS = {"llm": BUNDLED_LLM, "llm_revision": None, "embedder": BUNDLED_EMBEDDER, "cache_dir": None}
"""The ``pipeline.models`` settings that say which models a fit loads, with their defaults."""


def model_settings(config: str, overrides: list[str]) -> dict[str, str | None]:
    """The fit's ``pipeline.models`` settings of :data:`FIELDS`: the config's, then its command-line overrides."""
    path = Path(config)
    if not path.is_file():
        raise InputError(config, "no such config file")
    models = ((yaml.safe_load(path.read_text()) or {}).get("pipeline") or {}).get("models") or {}
    settings = {key: models.get(key, default) for key, default in FIELDS.items()}
    for i, arg in enumerate(overrides):
        for key in settings:
            flag = f"--pipeline.models.{key}"
            if arg.startswith(flag + "="):
                settings[key] = arg.split("=", 1)[1]
            elif arg == flag and i + 1 < len(overrides):
                settings[key] = overrides[i + 1]
    return {key: None if value in (None, "null") else str(value) for key, value in settings.items()}


def hub_models(settings: dict[str, str | None]) -> list[tuple[str, str | None]]:
    """``(repo id, revision)`` of each model that comes from the Hub (not bundled, not a path that exists here)."""
    refs = [(settings["llm"], settings["llm_revision"]), (settings["embedder"], None)]
    return [(ref, revision) for ref, revision in refs if ref and looks_like_hub_repo_id(ref) and not Path(ref).expanduser().exists()]


def is_cached(ref: str, revision: str | None) -> bool:
    """Whether the Hugging Face cache already holds ``ref`` at ``revision`` (no network)."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(ref, revision=revision, allow_patterns=HUB_FILE_PATTERNS, local_files_only=True)
    except Exception:  # not cached, in whatever words huggingface_hub says it
        return False
    return True


def refuse_unreachable_hub(models: list[tuple[str, str | None]]) -> None:
    """One line when a model is not cached and the Hub's host does not accept a connection within :data:`PROBE_TIMEOUT_S`."""
    from huggingface_hub import constants

    missing = [ref + (f"@{revision}" if revision else "") for ref, revision in models if not is_cached(ref, revision)]
    if not missing:
        return
    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ModelUnavailableError(
            f"{', '.join(missing)}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the Hub ({constants.ENDPOINT}) does not answer "
            f"from {socket.gethostname()} ({exc.strerror or type(exc).__name__}): download on a machine with network access "
            "(hf download ID) into a cache every node reads (HF_HOME) and submit with HF_HUB_OFFLINE=1"
        ) from None


def main(argv: list[str]) -> int:
    """Fetch (or with ``--list`` print) the Hub models of the config ``argv[0]`` under the overrides that follow it."""
    usage = "usage: python -m qgmem_train fetch CONFIG [--list] [LightningCLI overrides]"
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__}")
        return 0
    listing = "--list" in argv
    args = [arg for arg in argv if arg != "--list"]
    if not args:
        print(usage, file=sys.stderr)
        return 2
    settings = model_settings(args[0], args[1:])
    models = hub_models(settings)
    if not listing:
        refuse_unreachable_hub(models)
    for ref, revision in models:
        print(ref if listing else f"{ref}{'@' + revision if revision else ''}: {resolve_model_dir(ref, settings['cache_dir'], revision=revision)}")
    return 0

