"""``python -m qgmem_train fetch CONFIG [--list] [LightningCLI overrides]``: put a training config's Hub models in the local cache.

``slurm/train.sbatch`` runs it once as a one-task step before the ranks start and then runs the ranks with
``HF_HUB_OFFLINE=1``: otherwise every rank (16 on 2 nodes × 8 GPUs) resolves each Hub snapshot itself at start. The
models are ``pipeline.models.llm`` (at ``llm_revision``) and ``pipeline.models.embedder``, as the config and its
``--pipeline.models.*`` overrides name them; bundled (``pkg:``) and local-path models are left alone. ``--list``
prints the Hub ids without fetching anything (nothing when there are none). The cache must be one every node reads
(``HF_HOME`` on a shared filesystem).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM
from qgmem_train.errors import InputError
from qgmem_train.llm.resolver import looks_like_hub_repo_id, resolve_model_dir

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
    for ref, revision in hub_models(settings):
        print(ref if listing else f"{ref}{'@' + revision if revision else ''}: {resolve_model_dir(ref, settings['cache_dir'], revision=revision)}")
    return 0

